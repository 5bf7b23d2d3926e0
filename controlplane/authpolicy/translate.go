package authpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/emptypb"
	"istio.io/api/annotation"
	securityv1beta1 "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/weftmesh/weft/internal/pb/securitypb"
)

// Status condition vocabulary, as Istio writes it on AuthorizationPolicy.
const (
	// ConditionType is the condition that says whether ztunnel enforces a
	// policy.
	ConditionType = "ZtunnelAccepted"
	// WaypointConditionType is the condition that says whether a policy
	// with targetRefs is bound to a waypoint.
	WaypointConditionType = "WaypointAccepted"
	// ReasonAccepted: the policy is enforced by ztunnel as written.
	ReasonAccepted = "Accepted"
	// ReasonUnsupportedValue: part of the policy cannot be enforced at L4.
	ReasonUnsupportedValue = "UnsupportedValue"
	// ReasonInvalid: a value could not be parsed; the rule holding it fails
	// closed.
	ReasonInvalid = "Invalid"
	// ReasonPartiallyInvalid: some targetRefs bind to a waypoint, others
	// do not (WaypointAccepted).
	ReasonPartiallyInvalid = "PartiallyInvalid"
	// ReasonTargetNotFound: the targetRef names no waypoint, Service or
	// GatewayClass that exists (WaypointAccepted).
	ReasonTargetNotFound = "TargetNotFound"
	// ReasonAncestorNotBound: the targeted Service is bound to no waypoint
	// (WaypointAccepted).
	ReasonAncestorNotBound = "AncestorNotBound"
)

// l4WhenKeys are the condition keys ztunnel can evaluate on a connection.
var l4WhenKeys = []string{"destination.ip", "destination.port", "source.ip", "source.namespace", "source.principal"}

// Condition is a status condition of a policy: ZtunnelAccepted or
// WaypointAccepted.
type Condition struct {
	// Status is true when ztunnel enforces the policy, possibly with
	// unsupported parts omitted as the message explains.
	Status  bool   `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Result is the translation of one AuthorizationPolicy.
type Result struct {
	// Authorization is the resource to send to ztunnel, or nil when nothing
	// is sent (a waypoint policy, an unsupported action, a DENY with nothing
	// ztunnel can enforce).
	Authorization *securitypb.Authorization
	// Selector is the policy's match labels when its scope is
	// WORKLOAD_SELECTOR (possibly empty: every pod of the scope), nil
	// otherwise.
	Selector map[string]string
	// Condition is the status to write, or nil when the control plane does
	// not own the policy's status (a policy bound to a waypoint).
	Condition *Condition
}

// ResourceName is the xDS name of the Authorization for a policy, and the
// name workloads list in authorization_policies: "<namespace>/<name>".
func ResourceName(namespace, name string) string { return namespace + "/" + name }

// Translate converts a policy. rootNamespace is the mesh's root namespace,
// whose selector-less policies apply mesh-wide. Translate never fails: what
// it cannot translate it reports in Result.Condition.
func Translate(rootNamespace string, p *securityv1.AuthorizationPolicy) Result {
	spec := &p.Spec
	if spec.GetTargetRef() != nil || len(spec.GetTargetRefs()) > 0 {
		return Result{}
	}
	var action securitypb.Action
	switch spec.GetAction() {
	case securityv1beta1.AuthorizationPolicy_ALLOW:
		action = securitypb.Action_ALLOW
	case securityv1beta1.AuthorizationPolicy_DENY:
		action = securitypb.Action_DENY
	default:
		return Result{Condition: &Condition{
			Reason: ReasonUnsupportedValue,
			Message: fmt.Sprintf("ztunnel enforces only ALLOW and DENY policies, not %s; bind this policy to a waypoint with targetRefs",
				spec.GetAction()),
		}}
	}

	t := translator{action: action, policyNS: p.Namespace}
	var problems []string
	dryRun, dryRunProblem := parseDryRun(p.Annotations[annotation.IoIstioDryRun.Name])
	if dryRunProblem != "" {
		problems = append(problems, dryRunProblem)
	}

	out := &securitypb.Authorization{
		Name:      p.Name,
		Namespace: p.Namespace,
		Action:    action,
		DryRun:    dryRun,
	}
	var selector map[string]string
	switch {
	case spec.GetSelector() != nil:
		out.Scope = securitypb.Scope_WORKLOAD_SELECTOR
		selector = map[string]string{}
		for k, v := range spec.GetSelector().GetMatchLabels() {
			selector[k] = v
		}
	case p.Namespace == rootNamespace:
		out.Scope = securitypb.Scope_GLOBAL
	default:
		out.Scope = securitypb.Scope_NAMESPACE
	}

	var l7 []string
	var omitted, dropped, narrowed, failedClosed []int
	for i, rule := range spec.GetRules() {
		r := t.rule(rule)
		l7 = append(l7, r.l7...)
		for _, e := range r.invalid {
			problems = append(problems, fmt.Sprintf("rule %d: %s", i, e))
		}
		switch {
		case len(r.invalid) > 0:
			failedClosed = append(failedClosed, i)
			if action == securitypb.Action_DENY {
				// Deny every connection rather than guess what was meant.
				out.Rules = append(out.Rules, &securitypb.Rule{})
			}
		case len(r.l7) > 0 && action == securitypb.Action_ALLOW:
			omitted = append(omitted, i)
		case len(r.l7) > 0 && !effective(r.rule):
			dropped = append(dropped, i)
		case len(r.l7) > 0:
			narrowed = append(narrowed, i)
			out.Rules = append(out.Rules, r.rule)
		default:
			out.Rules = append(out.Rules, r.rule)
		}
	}

	res := Result{Authorization: out, Selector: selector, Condition: &Condition{Status: true, Reason: ReasonAccepted}}
	var msg []string
	if len(l7) > 0 {
		slices.Sort(l7)
		l7 = slices.Compact(l7)
		msg = append(msg, fmt.Sprintf("ztunnel enforces L4 attributes only and this policy uses HTTP attributes (%s); use a waypoint with targetRefs to enforce them.",
			strings.Join(l7, ", ")))
		res.Condition.Reason = ReasonUnsupportedValue
	}
	switch {
	case action == securitypb.Action_ALLOW && len(omitted) > 0 && len(out.Rules) == 0 && len(failedClosed) == 0:
		msg = append(msg, "Every rule uses them, so ztunnel allows no connection to the selected workloads (more restrictive than requested).")
	case action == securitypb.Action_ALLOW && len(omitted) > 0:
		msg = append(msg, ruleList(omitted, "is omitted and allows nothing", "are omitted and allow nothing")+" (more restrictive than requested).")
	}
	if action == securitypb.Action_DENY && len(l7) > 0 {
		if len(narrowed) > 0 {
			msg = append(msg, ruleList(narrowed, "denies on its L4 conditions only", "deny on their L4 conditions only")+" (broader than requested).")
		}
		if len(dropped) > 0 {
			msg = append(msg, ruleList(dropped, "has no condition ztunnel can match and is not applied.", "have no condition ztunnel can match and are not applied."))
		}
	}
	if len(problems) > 0 {
		res.Condition.Status = false
		res.Condition.Reason = ReasonInvalid
		msg = append(msg, "Invalid: "+strings.Join(problems, "; ")+".")
		if len(failedClosed) > 0 {
			if action == securitypb.Action_ALLOW {
				msg = append(msg, ruleList(failedClosed, "allows nothing until fixed.", "allow nothing until fixed."))
			} else {
				msg = append(msg, ruleList(failedClosed, "denies every connection until fixed.", "deny every connection until fixed."))
			}
		}
	}
	if action == securitypb.Action_DENY && len(out.Rules) == 0 && len(dropped) > 0 {
		// Nothing ztunnel could enforce is left: do not send the policy.
		res.Authorization = nil
		res.Selector = nil
		res.Condition.Status = false
		msg = append(msg, "Nothing in this DENY policy can be enforced by ztunnel, so ztunnel does not apply it.")
	}
	if len(msg) == 0 {
		if dryRun {
			msg = append(msg, "attached to ztunnel in dry-run mode")
		} else {
			msg = append(msg, "attached to ztunnel")
		}
	}
	res.Condition.Message = strings.Join(msg, " ")
	return res
}

// ruleList names rules by index for a status message, with the verb phrase
// in its singular or plural form: "Rule 0 allows ...", "Rules 0 and 2 allow ...".
func ruleList(idx []int, one, many string) string {
	s := make([]string, len(idx))
	for i, v := range idx {
		s[i] = strconv.Itoa(v)
	}
	if len(s) == 1 {
		return "Rule " + s[0] + " " + one
	}
	return "Rules " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1] + " " + many
}

// parseDryRun reads the istio.io/dry-run annotation. A value that is not a
// boolean enforces the policy (fail closed) and is reported.
func parseDryRun(v string) (bool, string) {
	if v == "" {
		return false, ""
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Sprintf("annotation %s=%q is not a boolean, so the policy is enforced", annotation.IoIstioDryRun.Name, v)
	}
	return b, ""
}

// effective reports whether a rule can ever match at ztunnel: every clause has
// no matches (matches all) or at least one non-empty match.
func effective(r *securitypb.Rule) bool {
	for _, c := range r.GetClauses() {
		if len(c.GetMatches()) == 0 {
			continue
		}
		ok := false
		for _, m := range c.GetMatches() {
			if !emptyMatch(m) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func emptyMatch(m *securitypb.Match) bool {
	return len(m.GetNamespaces())+len(m.GetNotNamespaces())+len(m.GetPrincipals())+len(m.GetNotPrincipals())+
		len(m.GetSourceIps())+len(m.GetNotSourceIps())+len(m.GetDestinationIps())+len(m.GetNotDestinationIps())+
		len(m.GetDestinationPorts())+len(m.GetNotDestinationPorts())+len(m.GetServiceAccounts())+len(m.GetNotServiceAccounts()) == 0
}

type translator struct {
	action   securitypb.Action
	policyNS string
}

type ruleResult struct {
	rule    *securitypb.Rule
	l7      []string // HTTP attributes found
	invalid []string // values that could not be parsed
}

func (t *translator) rule(r *securityv1beta1.Rule) ruleResult {
	var res ruleResult
	out := &securitypb.Rule{}
	if len(r.GetTo()) > 0 {
		c := &securitypb.Clause{}
		for _, to := range r.GetTo() {
			op := to.GetOperation()
			res.l7 = append(res.l7, httpOperation(op)...)
			m := &securitypb.Match{}
			m.DestinationPorts = t.ports(op.GetPorts(), "ports", &res)
			m.NotDestinationPorts = t.ports(op.GetNotPorts(), "notPorts", &res)
			c.Matches = append(c.Matches, m)
		}
		out.Clauses = append(out.Clauses, c)
	}
	if len(r.GetFrom()) > 0 {
		c := &securitypb.Clause{}
		for _, from := range r.GetFrom() {
			src := from.GetSource()
			res.l7 = append(res.l7, httpSource(src)...)
			m := &securitypb.Match{
				Principals:         t.strings(src.GetPrincipals(), "principals", &res),
				NotPrincipals:      t.strings(src.GetNotPrincipals(), "notPrincipals", &res),
				Namespaces:         t.strings(src.GetNamespaces(), "namespaces", &res),
				NotNamespaces:      t.strings(src.GetNotNamespaces(), "notNamespaces", &res),
				ServiceAccounts:    t.serviceAccounts(src.GetServiceAccounts(), "serviceAccounts", &res),
				NotServiceAccounts: t.serviceAccounts(src.GetNotServiceAccounts(), "notServiceAccounts", &res),
				SourceIps:          t.addresses(src.GetIpBlocks(), "ipBlocks", &res),
				NotSourceIps:       t.addresses(src.GetNotIpBlocks(), "notIpBlocks", &res),
			}
			c.Matches = append(c.Matches, m)
		}
		out.Clauses = append(out.Clauses, c)
	}
	for _, w := range r.GetWhen() {
		key := w.GetKey()
		if !slices.Contains(l4WhenKeys, key) {
			res.l7 = append(res.l7, key)
			// An empty match: ztunnel never matches it.
			out.Clauses = append(out.Clauses, &securitypb.Clause{Matches: []*securitypb.Match{{}}})
			continue
		}
		m := &securitypb.Match{}
		field := "when " + key
		switch key {
		case "source.ip":
			m.SourceIps = t.addresses(w.GetValues(), field, &res)
			m.NotSourceIps = t.addresses(w.GetNotValues(), field, &res)
		case "source.namespace":
			m.Namespaces = t.strings(w.GetValues(), field, &res)
			m.NotNamespaces = t.strings(w.GetNotValues(), field, &res)
		case "source.principal":
			m.Principals = t.strings(w.GetValues(), field, &res)
			m.NotPrincipals = t.strings(w.GetNotValues(), field, &res)
		case "destination.ip":
			m.DestinationIps = t.addresses(w.GetValues(), field, &res)
			m.NotDestinationIps = t.addresses(w.GetNotValues(), field, &res)
		case "destination.port":
			m.DestinationPorts = t.ports(w.GetValues(), field, &res)
			m.NotDestinationPorts = t.ports(w.GetNotValues(), field, &res)
		}
		out.Clauses = append(out.Clauses, &securitypb.Clause{Matches: []*securitypb.Match{m}})
	}
	res.rule = out
	return res
}

func httpOperation(op *securityv1beta1.Operation) []string {
	var found []string
	add := func(name string, v []string) {
		if len(v) > 0 {
			found = append(found, name)
		}
	}
	add("hosts", op.GetHosts())
	add("notHosts", op.GetNotHosts())
	add("methods", op.GetMethods())
	add("notMethods", op.GetNotMethods())
	add("paths", op.GetPaths())
	add("notPaths", op.GetNotPaths())
	return found
}

func httpSource(s *securityv1beta1.Source) []string {
	var found []string
	add := func(name string, v []string) {
		if len(v) > 0 {
			found = append(found, name)
		}
	}
	add("requestPrincipals", s.GetRequestPrincipals())
	add("notRequestPrincipals", s.GetNotRequestPrincipals())
	add("remoteIpBlocks", s.GetRemoteIpBlocks())
	add("notRemoteIpBlocks", s.GetNotRemoteIpBlocks())
	// A Match has no trust-domain field, and folding trust domains into
	// principals would widen the source, so they are not L4 here.
	add("trustDomains", s.GetTrustDomains())
	add("notTrustDomains", s.GetNotTrustDomains())
	return found
}

// maxValueLen bounds one value; longer values are refused (Istio's
// validation caps free-form fields at 1024 characters too).
const maxValueLen = 1024

// strings compiles names to literal matches.
func (t *translator) strings(vals []string, field string, res *ruleResult) []*securitypb.StringMatch {
	if len(vals) == 0 {
		return nil
	}
	out := make([]*securitypb.StringMatch, 0, len(vals))
	for _, v := range vals {
		m, err := stringMatch(v)
		if err != nil {
			res.invalid = append(res.invalid, fmt.Sprintf("%s value %s %v", field, quote(v), err))
			continue
		}
		out = append(out, m)
	}
	return out
}

// stringMatch compiles one value: "*" is presence, "*x" a suffix, "x*" a
// prefix, anything else exact. The result is always literal.
func stringMatch(v string) (*securitypb.StringMatch, error) {
	if err := CheckValue(v); err != nil {
		return nil, err
	}
	switch {
	case v == "*":
		return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Presence{Presence: &emptypb.Empty{}}}, nil
	case strings.Count(v, "*") > 1 || (strings.Contains(v, "*") && !strings.HasPrefix(v, "*") && !strings.HasSuffix(v, "*")):
		return nil, fmt.Errorf("has a '*' that is not the whole value, its first or its last character")
	case strings.HasPrefix(v, "*"):
		return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Suffix{Suffix: v[1:]}}, nil
	case strings.HasSuffix(v, "*"):
		return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Prefix{Prefix: v[:len(v)-1]}}, nil
	default:
		return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Exact{Exact: v}}, nil
	}
}

// CheckValue refuses empty, overlong and control-character values.
func CheckValue(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("is empty")
	case len(v) > maxValueLen:
		return fmt.Errorf("is longer than %d bytes", maxValueLen)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return fmt.Errorf("has control character %q at offset %d", c, i)
		}
	}
	return nil
}

// serviceAccounts compiles "namespace/name" or "name" (in the policy's
// namespace) to exact service-account matches.
func (t *translator) serviceAccounts(vals []string, field string, res *ruleResult) []*securitypb.ServiceAccountMatch {
	if len(vals) == 0 {
		return nil
	}
	out := make([]*securitypb.ServiceAccountMatch, 0, len(vals))
	for _, v := range vals {
		ns, sa, ok := strings.Cut(v, "/")
		if !ok {
			ns, sa = t.policyNS, v
		}
		err := CheckValue(v)
		if err == nil && (ns == "" || sa == "" || strings.ContainsAny(sa, "/*") || strings.Contains(ns, "*")) {
			err = fmt.Errorf("is not <service-account> or <namespace>/<service-account>")
		}
		if err != nil {
			res.invalid = append(res.invalid, fmt.Sprintf("%s value %s %v", field, quote(v), err))
			continue
		}
		out = append(out, &securitypb.ServiceAccountMatch{Namespace: ns, ServiceAccount: sa})
	}
	return out
}

// addresses parses IPs and CIDR blocks.
func (t *translator) addresses(vals []string, field string, res *ruleResult) []*securitypb.Address {
	if len(vals) == 0 {
		return nil
	}
	out := make([]*securitypb.Address, 0, len(vals))
	for _, v := range vals {
		p, err := ParseBlock(v)
		if err != nil {
			res.invalid = append(res.invalid, fmt.Sprintf("%s value %s %v", field, quote(v), err))
			continue
		}
		out = append(out, &securitypb.Address{Address: p.Addr().AsSlice(), Length: uint32(p.Bits())})
	}
	return out
}

// ParseBlock parses an IP address or CIDR block, unmapping IPv4-in-IPv6.
func ParseBlock(v string) (netip.Prefix, error) {
	if strings.Contains(v, "/") {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("is not an IP address or CIDR block")
		}
		if p.Addr().Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("has an IPv6 zone")
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("is not an IP address or CIDR block")
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// ports parses port numbers 1-65535.
func (t *translator) ports(vals []string, field string, res *ruleResult) []uint32 {
	if len(vals) == 0 {
		return nil
	}
	out := make([]uint32, 0, len(vals))
	for _, v := range vals {
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil || n == 0 {
			res.invalid = append(res.invalid, fmt.Sprintf("%s value %s is not a port number (1-65535)", field, quote(v)))
			continue
		}
		out = append(out, uint32(n))
	}
	return out
}

func quote(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "..."
	}
	return strconv.Quote(s)
}
