// Package rbac evaluates the subset of Envoy's RBAC filter configuration
// that Weft's control plane emits for L7 authorization policy: ALLOW, DENY
// and LOG (audit) actions over principals and permissions.
package rbac

import (
	"fmt"
	"net/netip"
	"sort"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	"github.com/weftmesh/weft/waypoint/internal/pbcheck"
	"github.com/weftmesh/weft/waypoint/route"
)

// Action of a filter.
type Action int

// Actions.
const (
	Allow Action = iota
	Deny
	Log
)

// Request is what the rules look at.
type Request struct {
	HTTP      *route.Request // nil for network RBAC
	Principal string         // downstream SPIFFE URI, "" when unauthenticated
	RemoteIP  netip.Addr
	DirectIP  netip.Addr
	DstPort   uint32
}

// Policy is a compiled named policy.
type Policy struct {
	Name        string
	Permissions []*Matcher
	Principals  []*Matcher
}

// Filter is one compiled RBAC filter.
type Filter struct {
	Action   Action
	Policies []*Policy
}

// Result of evaluating a filter.
type Result struct {
	Denied bool
	// Policy is the name of the policy that matched, if any.
	Policy string
}

// Evaluate applies the filter with Envoy's semantics.
func (f *Filter) Evaluate(r *Request) Result {
	var matched string
	found := false
	for _, p := range f.Policies {
		if anyMatch(p.Permissions, r) && anyMatch(p.Principals, r) {
			matched, found = p.Name, true
			break
		}
	}
	switch f.Action {
	case Deny:
		return Result{Denied: found, Policy: matched}
	case Allow:
		return Result{Denied: !found, Policy: matched}
	}
	return Result{Policy: matched}
}

func anyMatch(ms []*Matcher, r *Request) bool {
	for _, m := range ms {
		if m.Match(r) {
			return true
		}
	}
	return false
}

// Matcher is a compiled permission or principal.
type Matcher struct {
	kind     int
	children []*Matcher
	str      *route.StringMatcher
	header   *route.HeaderMatcher
	port     uint32
	prefix   netip.Prefix
}

const (
	kAny = iota
	kAnd
	kOr
	kNot
	kPath
	kHeader
	kPort
	kPrincipal
	kRemoteIP
	kDirectIP
)

// Match evaluates m against r.
func (m *Matcher) Match(r *Request) bool {
	switch m.kind {
	case kAny:
		return true
	case kAnd:
		for _, c := range m.children {
			if !c.Match(r) {
				return false
			}
		}
		return true
	case kOr:
		return anyMatch(m.children, r)
	case kNot:
		return !m.children[0].Match(r)
	case kPath:
		if r.HTTP == nil {
			return false
		}
		p := r.HTTP.Path
		for i := 0; i < len(p); i++ {
			if p[i] == '?' {
				p = p[:i]
				break
			}
		}
		return m.str.Match(p)
	case kHeader:
		if r.HTTP == nil {
			return false
		}
		return m.header.Match(r.HTTP)
	case kPort:
		return r.DstPort == m.port
	case kPrincipal:
		return r.Principal != "" && m.str.Match(r.Principal)
	case kRemoteIP:
		return r.RemoteIP.IsValid() && m.prefix.Contains(r.RemoteIP)
	case kDirectIP:
		return r.DirectIP.IsValid() && m.prefix.Contains(r.DirectIP)
	}
	return false
}

// The fields the filter supports in each message; Fields checks the names
// against the descriptors when the package loads.
var (
	rulesFields         = pbcheck.Fields[*rbacv3.RBAC]("action", "policies")
	policyFields        = pbcheck.Fields[*rbacv3.Policy]("permissions", "principals")
	urlPathFields       = pbcheck.Fields[*matcherv3.PathMatcher]("path")
	authenticatedFields = pbcheck.Fields[*rbacv3.Principal_Authenticated]("principal_name")
)

// Compile compiles rules; network is true for the network filter (no
// path or header permissions or principals: a network filter that cannot
// be evaluated is refused, never half applied). where names the filter in errors.
func Compile(rules *rbacv3.RBAC, network bool, where string) (*Filter, error) {
	if rules == nil {
		return nil, fmt.Errorf("%s.rules is required", where)
	}
	if err := rulesFields.Check(rules, where+".rules"); err != nil {
		return nil, err
	}
	f := &Filter{}
	switch rules.GetAction() {
	case rbacv3.RBAC_ALLOW:
		f.Action = Allow
	case rbacv3.RBAC_DENY:
		f.Action = Deny
	case rbacv3.RBAC_LOG:
		f.Action = Log
	default:
		return nil, fmt.Errorf("%s.rules.action %v is not supported", where, rules.GetAction())
	}
	names := make([]string, 0, len(rules.GetPolicies()))
	for n := range rules.GetPolicies() {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := rules.GetPolicies()[n]
		pw := fmt.Sprintf("%s.rules.policies[%q]", where, n)
		if err := policyFields.Check(p, pw); err != nil {
			return nil, err
		}
		cp := &Policy{Name: n}
		for i, perm := range p.GetPermissions() {
			m, err := compilePermission(perm, network, fmt.Sprintf("%s.permissions[%d]", pw, i))
			if err != nil {
				return nil, err
			}
			cp.Permissions = append(cp.Permissions, m)
		}
		for i, pr := range p.GetPrincipals() {
			m, err := compilePrincipal(pr, network, fmt.Sprintf("%s.principals[%d]", pw, i))
			if err != nil {
				return nil, err
			}
			cp.Principals = append(cp.Principals, m)
		}
		f.Policies = append(f.Policies, cp)
	}
	return f, nil
}

func compilePermission(p *rbacv3.Permission, network bool, where string) (*Matcher, error) {
	switch r := p.GetRule().(type) {
	case *rbacv3.Permission_Any:
		return &Matcher{kind: kAny}, nil
	case *rbacv3.Permission_AndRules:
		return compileSet(kAnd, r.AndRules.GetRules(), network, where+".and_rules")
	case *rbacv3.Permission_OrRules:
		return compileSet(kOr, r.OrRules.GetRules(), network, where+".or_rules")
	case *rbacv3.Permission_NotRule:
		c, err := compilePermission(r.NotRule, network, where+".not_rule")
		if err != nil {
			return nil, err
		}
		return &Matcher{kind: kNot, children: []*Matcher{c}}, nil
	case *rbacv3.Permission_UrlPath:
		if network {
			return nil, fmt.Errorf("%s.url_path is not supported in network RBAC", where)
		}
		if err := urlPathFields.Check(r.UrlPath, where+".url_path"); err != nil {
			return nil, err
		}
		s, err := route.CompileString(r.UrlPath.GetPath(), where+".url_path.path")
		if err != nil {
			return nil, err
		}
		return &Matcher{kind: kPath, str: s}, nil
	case *rbacv3.Permission_Header:
		if network {
			return nil, fmt.Errorf("%s.header is not supported in network RBAC", where)
		}
		h, err := route.CompileHeader(r.Header, where+".header")
		if err != nil {
			return nil, err
		}
		return &Matcher{kind: kHeader, header: h}, nil
	case *rbacv3.Permission_DestinationPort:
		if r.DestinationPort > 65535 {
			return nil, fmt.Errorf("%s.destination_port %d is not a port", where, r.DestinationPort)
		}
		return &Matcher{kind: kPort, port: r.DestinationPort}, nil
	case nil:
		return nil, fmt.Errorf("%s has no rule", where)
	default:
		return nil, fmt.Errorf("%s: permission %T is not supported", where, r)
	}
}

func compileSet(kind int, rules []*rbacv3.Permission, network bool, where string) (*Matcher, error) {
	m := &Matcher{kind: kind}
	for i, r := range rules {
		c, err := compilePermission(r, network, fmt.Sprintf("%s[%d]", where, i))
		if err != nil {
			return nil, err
		}
		m.children = append(m.children, c)
	}
	return m, nil
}

func compilePrincipal(p *rbacv3.Principal, network bool, where string) (*Matcher, error) {
	switch r := p.GetIdentifier().(type) {
	case *rbacv3.Principal_Any:
		return &Matcher{kind: kAny}, nil
	case *rbacv3.Principal_AndIds:
		return compileIDs(kAnd, r.AndIds.GetIds(), network, where+".and_ids")
	case *rbacv3.Principal_OrIds:
		return compileIDs(kOr, r.OrIds.GetIds(), network, where+".or_ids")
	case *rbacv3.Principal_NotId:
		c, err := compilePrincipal(r.NotId, network, where+".not_id")
		if err != nil {
			return nil, err
		}
		return &Matcher{kind: kNot, children: []*Matcher{c}}, nil
	case *rbacv3.Principal_Authenticated_:
		if err := authenticatedFields.Check(r.Authenticated, where+".authenticated"); err != nil {
			return nil, err
		}
		if r.Authenticated.GetPrincipalName() == nil {
			return &Matcher{kind: kPrincipal, str: &route.StringMatcher{Regex: anyPrincipal}}, nil
		}
		s, err := route.CompileString(r.Authenticated.GetPrincipalName(), where+".authenticated.principal_name")
		if err != nil {
			return nil, err
		}
		return &Matcher{kind: kPrincipal, str: s}, nil
	case *rbacv3.Principal_Header:
		if network {
			// A stream has no headers: Envoy's network filter would never
			// match it, and under a not_id it would match everything.
			return nil, fmt.Errorf("%s.header is not supported in network RBAC", where)
		}
		h, err := route.CompileHeader(r.Header, where+".header")
		if err != nil {
			return nil, err
		}
		return &Matcher{kind: kHeader, header: h}, nil
	case *rbacv3.Principal_RemoteIp:
		pr, err := cidr(r.RemoteIp.GetAddressPrefix(), r.RemoteIp.GetPrefixLen().GetValue(), r.RemoteIp.GetPrefixLen() != nil, where+".remote_ip")
		return &Matcher{kind: kRemoteIP, prefix: pr}, err
	case *rbacv3.Principal_DirectRemoteIp:
		pr, err := cidr(r.DirectRemoteIp.GetAddressPrefix(), r.DirectRemoteIp.GetPrefixLen().GetValue(), r.DirectRemoteIp.GetPrefixLen() != nil, where+".direct_remote_ip")
		return &Matcher{kind: kDirectIP, prefix: pr}, err
	case nil:
		return nil, fmt.Errorf("%s has no identifier", where)
	default:
		return nil, fmt.Errorf("%s: principal %T is not supported", where, r)
	}
}

func compileIDs(kind int, ids []*rbacv3.Principal, network bool, where string) (*Matcher, error) {
	m := &Matcher{kind: kind}
	for i, id := range ids {
		c, err := compilePrincipal(id, network, fmt.Sprintf("%s[%d]", where, i))
		if err != nil {
			return nil, err
		}
		m.children = append(m.children, c)
	}
	return m, nil
}

func cidr(addr string, bits uint32, set bool, where string) (netip.Prefix, error) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s.address_prefix %q: %v", where, addr, err)
	}
	if !set {
		bits = uint32(a.BitLen())
	}
	if int(bits) > a.BitLen() {
		return netip.Prefix{}, fmt.Errorf("%s.prefix_len %d is longer than the address", where, bits)
	}
	return netip.PrefixFrom(a.Unmap(), int(bits)).Masked(), nil
}

var anyPrincipal = mustRegexp(".+")
