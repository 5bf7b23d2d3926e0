package state

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// Conn is what L4 authorization sees of a connection arriving at a workload.
type Conn struct {
	// Source is the peer's identity; zero for plaintext.
	Source spiffe.Identity
	Src    netip.AddrPort
	Dst    netip.AddrPort
}

// Decision is the outcome of Authorize.
type Decision struct {
	Allowed bool
	// Policy names the deciding policy ("namespace/name"), if one decided.
	Policy string
	// Reason explains the decision for logs and access logs.
	Reason string
}

// Authorize applies Istio's L4 authorization to conn arriving at dst:
// if any DENY policy matches, deny; if there is no ALLOW policy, allow;
// if any ALLOW policy matches, allow; otherwise deny. The policies that
// apply are the global ones (root namespace), those of dst's namespace and
// the workload-selector ones the control plane listed on dst. Dry-run
// policies are evaluated for the reason only.
//
// A policy dst names that has not been received (or was refused as
// invalid) denies every connection: it may be an ALLOW or a DENY, so
// skipping it, as Istio's ztunnel does, could let in what it forbids.
// This fails closed for the moment between a workload update and the
// policy it names.
func (s *Store) Authorize(dst *Workload, conn Conn) Decision {
	s.mu.RLock()
	var allow, deny []*Policy
	var missing string
	seen := map[string]bool{}
	add := func(key string) {
		p := s.policies[key]
		if p == nil || seen[key] {
			return
		}
		seen[key] = true
		if p.DryRun {
			return
		}
		if p.Deny {
			deny = append(deny, p)
		} else {
			allow = append(allow, p)
		}
	}
	for _, k := range sortedKeys(s.byNS[""]) {
		add(k)
	}
	for _, k := range sortedKeys(s.byNS[dst.Namespace]) {
		add(k)
	}
	for _, k := range dst.Policies {
		if s.policies[k] == nil && missing == "" {
			missing = k
		}
		add(k)
	}
	s.mu.RUnlock()

	for _, p := range deny {
		if p.matches(conn) {
			return Decision{Policy: p.Key, Reason: "denied by policy " + p.Key}
		}
	}
	if missing != "" {
		return Decision{Policy: missing, Reason: "the workload names policy " + missing + ", which has not been received: denied until it is"}
	}
	if len(allow) == 0 {
		return Decision{Allowed: true, Reason: "no allow policy applies"}
	}
	for _, p := range allow {
		if p.matches(conn) {
			return Decision{Allowed: true, Policy: p.Key, Reason: "allowed by policy " + p.Key}
		}
	}
	return Decision{Reason: fmt.Sprintf("no allow policy matched (%d apply)", len(allow))}
}

// matches reports whether any rule matches; a policy without rules matches
// nothing. A rule matches when all its clauses do, a clause when any of its
// non-empty match groups does; a clause without groups matches.
func (p *Policy) matches(c Conn) bool {
	for _, rule := range p.Rules {
		ok := true
		for _, clause := range rule {
			if len(clause) == 0 {
				continue
			}
			any := false
			for _, m := range clause {
				if !m.empty() && m.matches(c) {
					any = true
					break
				}
			}
			if !any {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// matches applies one match group: every field that is set must match (any
// of its values), and no negated value may match.
func (m *Match) matches(c Conn) bool {
	principal := ""
	if !c.Source.IsZero() {
		// Istio's principals omit the spiffe:// scheme.
		principal = strings.TrimPrefix(c.Source.String(), "spiffe://")
	}
	return both(m.DestinationIPs, m.NotDestinationIPs, func(p netip.Prefix) bool { return p.Contains(c.Dst.Addr().Unmap()) }) &&
		both(m.SourceIPs, m.NotSourceIPs, func(p netip.Prefix) bool { return p.Contains(c.Src.Addr().Unmap()) }) &&
		both(m.Ports, m.NotPorts, func(p uint32) bool { return p == uint32(c.Dst.Port()) }) &&
		both(m.ServiceAccounts, m.NotSAs, func(sa *securitypb.ServiceAccountMatch) bool {
			return !c.Source.IsZero() && sa.GetNamespace() == c.Source.Namespace && sa.GetServiceAccount() == c.Source.ServiceAccount
		}) &&
		both(m.Principals, m.NotPrincipals, func(sm *securitypb.StringMatch) bool {
			return principal != "" && stringMatch(sm, principal)
		}) &&
		both(m.Namespaces, m.NotNamespaces, func(sm *securitypb.StringMatch) bool {
			return stringMatch(sm, c.Source.Namespace)
		})
}

func both[T any](pos, neg []T, pred func(T) bool) bool {
	if len(pos) > 0 {
		hit := false
		for _, v := range pos {
			if pred(v) {
				hit = true
				break
			}
		}
		if !hit {
			return false
		}
	}
	for _, v := range neg {
		if pred(v) {
			return false
		}
	}
	return true
}

// stringMatch compares literally: names never act as patterns.
func stringMatch(sm *securitypb.StringMatch, s string) bool {
	switch t := sm.GetMatchType().(type) {
	case *securitypb.StringMatch_Exact:
		return s == t.Exact
	case *securitypb.StringMatch_Prefix:
		return strings.HasPrefix(s, t.Prefix)
	case *securitypb.StringMatch_Suffix:
		return strings.HasSuffix(s, t.Suffix)
	case *securitypb.StringMatch_Presence:
		return s != ""
	}
	return false
}
