package waypointxds

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"istio.io/api/annotation"
	securityv1beta1 "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/weftmesh/weft/controlplane/authpolicy"
	"github.com/weftmesh/weft/internal/apinames"
)

const gatewayGroup = "gateway.networking.k8s.io"

// policies lists the AuthorizationPolicies that target the waypoint or a
// Service (those are filtered per Service later), sorted by key.
func (b *builder) policies() []*securityv1.AuthorizationPolicy {
	if b.st.Policies == nil {
		return nil
	}
	var out []*securityv1.AuthorizationPolicy
	for _, o := range b.st.Policies.List() {
		p := o.(*securityv1.AuthorizationPolicy)
		if len(targets(p)) > 0 {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return keyOf(out[i]) < keyOf(out[j]) })
	return out
}

func targets(p *securityv1.AuthorizationPolicy) []*struct{ group, kind, name string } {
	var out []*struct{ group, kind, name string }
	add := func(group, kind, name string) {
		out = append(out, &struct{ group, kind, name string }{group, kind, name})
	}
	if t := p.Spec.GetTargetRef(); t != nil {
		add(t.GetGroup(), t.GetKind(), t.GetName())
	}
	for _, t := range p.Spec.GetTargetRefs() {
		add(t.GetGroup(), t.GetKind(), t.GetName())
	}
	return out
}

// appliesTo reports whether a policy targets the waypoint or, when svc is
// set, that Service (or the ServiceEntry it stands for).
func (b *builder) appliesTo(p *securityv1.AuthorizationPolicy, svc *corev1.Service) bool {
	_, entry := b.entries[svc]
	for _, t := range targets(p) {
		switch {
		case t.group == gatewayGroup && t.kind == "Gateway" && p.Namespace == b.wp.Namespace && t.name == b.wp.Name:
			return true
		case t.group == gatewayGroup && t.kind == "GatewayClass" && p.Namespace == b.mesh.RootNamespace && t.name == b.className():
			return true
		case svc != nil && !entry && (t.group == "" || t.group == "core") && t.kind == "Service" && p.Namespace == svc.Namespace && t.name == svc.Name:
			return true
		case svc != nil && entry && t.group == entryGroup && t.kind == entryKind && p.Namespace == svc.Namespace && t.name == svc.Name:
			return true
		}
	}
	return false
}

// className is the GatewayClass of the Gateway being built.
func (b *builder) className() string {
	if b.ingress {
		return apinames.GatewayClass
	}
	return apinames.WaypointClass
}

// rbacSet is one RBAC filter's rules: those enforced and those of
// dry-run policies (istio.io/dry-run: "true"), which Envoy evaluates as
// shadow rules without enforcing them. Either may be nil.
type rbacSet struct {
	rules, shadow *rbacv3.RBAC
}

// shadowPrefix is the shadow_rules_stat_prefix Istio gives a filter's
// shadow rules.
func (r rbacSet) shadowPrefix() string {
	if r.shadow == nil {
		return ""
	}
	if r.shadow.GetAction() == rbacv3.RBAC_ALLOW {
		return "istio_dry_run_allow_"
	}
	return "istio_dry_run_deny_"
}

// dryRun reports whether a policy is to be observed, not enforced. A value
// that is not a boolean enforces it (fail closed), as at ztunnel.
func dryRun(p *securityv1.AuthorizationPolicy) bool {
	v, err := strconv.ParseBool(p.Annotations[annotation.IoIstioDryRun.Name])
	return err == nil && v
}

// rbacRules builds the RBAC rules of a chain, one filter per action in the
// order LOG (AUDIT), DENY (and CUSTOM, which fails closed), ALLOW; each
// present only when a policy of that action applies. Dry-run policies go
// to the filter's shadow rules: an action whose policies are all dry-run
// enforces nothing. For a TCP chain (tcp) the rules keep their L4 part as
// Istio's do: an ALLOW rule with an HTTP-only field never matches, a DENY
// or AUDIT rule loses those fields and so matches more.
func (b *builder) rbacRules(all []*securityv1.AuthorizationPolicy, svc *corev1.Service, tcp bool) []rbacSet {
	type key struct {
		action rbacv3.RBAC_Action
		shadow bool
	}
	byAction := map[key]map[string]*rbacv3.Policy{}
	for _, p := range all {
		if !b.appliesTo(p, svc) {
			continue
		}
		action := rbacv3.RBAC_ALLOW
		switch p.Spec.GetAction() {
		case securityv1beta1.AuthorizationPolicy_DENY:
			action = rbacv3.RBAC_DENY
		case securityv1beta1.AuthorizationPolicy_AUDIT:
			action = rbacv3.RBAC_LOG
		case securityv1beta1.AuthorizationPolicy_CUSTOM:
			if !tcp {
				b.note("AuthorizationPolicy %s: action CUSTOM is not supported; its rules deny", keyOf(p))
			}
			action = rbacv3.RBAC_DENY
		}
		k := key{action, dryRun(p)}
		if byAction[k] == nil {
			byAction[k] = map[string]*rbacv3.Policy{}
		}
		t := &policyTranslator{b: b, policy: keyOf(p), deny: action != rbacv3.RBAC_ALLOW, tcp: tcp}
		for i, r := range p.Spec.GetRules() {
			if pol := t.rule(r, i); pol != nil {
				byAction[k][fmt.Sprintf("ns[%s]-policy[%s]-rule[%d]", p.Namespace, p.Name, i)] = pol
			}
		}
	}
	var out []rbacSet
	for _, a := range []rbacv3.RBAC_Action{rbacv3.RBAC_LOG, rbacv3.RBAC_DENY, rbacv3.RBAC_ALLOW} {
		var set rbacSet
		if pols, ok := byAction[key{a, false}]; ok {
			set.rules = &rbacv3.RBAC{Action: a, Policies: pols}
		}
		if pols, ok := byAction[key{a, true}]; ok {
			set.shadow = &rbacv3.RBAC{Action: a, Policies: pols}
		}
		if set.rules != nil || set.shadow != nil {
			out = append(out, set)
		}
	}
	return out
}

// rbacFilters builds the RBAC http filters of an HTTP chain.
func (b *builder) rbacFilters(all []*securityv1.AuthorizationPolicy, svc *corev1.Service) []*hcmv3.HttpFilter {
	var out []*hcmv3.HttpFilter
	for _, r := range b.rbacRules(all, svc, false) {
		out = append(out, &hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{
			TypedConfig: mustAny(&rbacfilter.RBAC{Rules: r.rules, ShadowRules: r.shadow, ShadowRulesStatPrefix: r.shadowPrefix()}),
		}})
	}
	return out
}

// netRBACFilters builds the network RBAC filters of a TCP chain, which
// precede its tcp_proxy.
func (b *builder) netRBACFilters(all []*securityv1.AuthorizationPolicy, svc *corev1.Service) []*listenerv3.Filter {
	var out []*listenerv3.Filter
	for _, r := range b.rbacRules(all, svc, true) {
		out = append(out, &listenerv3.Filter{Name: "envoy.filters.network.rbac", ConfigType: &listenerv3.Filter_TypedConfig{
			TypedConfig: mustAny(&netrbac.RBAC{StatPrefix: "tcp.", Rules: r.rules, ShadowRules: r.shadow, ShadowRulesStatPrefix: r.shadowPrefix()}),
		}})
	}
	return out
}

type policyTranslator struct {
	b      *builder
	policy string
	deny   bool
	tcp    bool // for a TCP chain: HTTP-only fields are left out
	// per rule:
	unsupported, invalid, httpOnly []string
}

// rule translates one rule; nil when an ALLOW rule allows nothing.
func (t *policyTranslator) rule(r *securityv1beta1.Rule, idx int) *rbacv3.Policy {
	t.unsupported, t.invalid, t.httpOnly = nil, nil, nil
	var perms []*rbacv3.Permission
	var ids []*rbacv3.Principal
	if len(r.GetTo()) > 0 {
		var ors []*rbacv3.Permission
		for _, to := range r.GetTo() {
			ors = append(ors, andPerm(t.operation(to.GetOperation())))
		}
		perms = append(perms, orPerm(ors))
	}
	if len(r.GetFrom()) > 0 {
		var ors []*rbacv3.Principal
		for _, from := range r.GetFrom() {
			ors = append(ors, andIDs(t.source(from.GetSource())))
		}
		ids = append(ids, orIDs(ors))
	}
	for _, w := range r.GetWhen() {
		p, id := t.condition(w)
		perms = append(perms, p...)
		ids = append(ids, id...)
	}
	where := fmt.Sprintf("AuthorizationPolicy %s rule %d", t.policy, idx)
	switch {
	case len(t.invalid) > 0 && t.deny:
		t.b.note("%s: %s; the rule denies every request", where, strings.Join(t.invalid, "; "))
		return &rbacv3.Policy{Permissions: []*rbacv3.Permission{anyPerm()}, Principals: []*rbacv3.Principal{anyID()}}
	case len(t.invalid) > 0:
		t.b.note("%s: %s; the rule allows nothing", where, strings.Join(t.invalid, "; "))
		return nil
	case len(t.httpOnly) > 0 && !t.deny:
		t.b.note("%s: %s only apply to HTTP; on TCP ports the rule allows nothing", where, strings.Join(t.httpOnly, ", "))
		return nil
	case len(t.unsupported) > 0 && !t.deny:
		t.b.note("%s: %s not supported; the rule allows nothing", where, strings.Join(t.unsupported, ", "))
		return nil
	case len(t.unsupported) > 0:
		t.b.note("%s: %s not supported and ignored; the rule denies more", where, strings.Join(t.unsupported, ", "))
	}
	if len(t.httpOnly) > 0 {
		t.b.note("%s: %s only apply to HTTP and are left out on TCP ports; the rule matches more there", where, strings.Join(t.httpOnly, ", "))
	}
	return &rbacv3.Policy{Permissions: []*rbacv3.Permission{andPerm(perms)}, Principals: []*rbacv3.Principal{andIDs(ids)}}
}

func anyPerm() *rbacv3.Permission { return &rbacv3.Permission{Rule: &rbacv3.Permission_Any{Any: true}} }
func anyID() *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_Any{Any: true}}
}

func andPerm(ps []*rbacv3.Permission) *rbacv3.Permission {
	if len(ps) == 0 {
		return anyPerm()
	}
	if len(ps) == 1 {
		return ps[0]
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_AndRules{AndRules: &rbacv3.Permission_Set{Rules: ps}}}
}

func orPerm(ps []*rbacv3.Permission) *rbacv3.Permission {
	if len(ps) == 1 {
		return ps[0]
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_OrRules{OrRules: &rbacv3.Permission_Set{Rules: ps}}}
}

func notPerm(p *rbacv3.Permission) *rbacv3.Permission {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_NotRule{NotRule: p}}
}

func andIDs(ids []*rbacv3.Principal) *rbacv3.Principal {
	if len(ids) == 0 {
		return anyID()
	}
	if len(ids) == 1 {
		return ids[0]
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_AndIds{AndIds: &rbacv3.Principal_Set{Ids: ids}}}
}

func orIDs(ids []*rbacv3.Principal) *rbacv3.Principal {
	if len(ids) == 1 {
		return ids[0]
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_OrIds{OrIds: &rbacv3.Principal_Set{Ids: ids}}}
}

func notID(p *rbacv3.Principal) *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_NotId{NotId: p}}
}

// literal compiles an Istio name ("*", "*suffix", "prefix*", exact) to a
// string matcher of prefix+name.
func literal(prefix, v string) (*matcherv3.StringMatcher, error) {
	if err := authpolicy.CheckValue(v); err != nil {
		return nil, err
	}
	switch {
	case v == "*":
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: prefix}}, nil
	case strings.Count(v, "*") > 1 || (strings.Contains(v, "*") && !strings.HasPrefix(v, "*") && !strings.HasSuffix(v, "*")):
		return nil, fmt.Errorf("has a '*' that is not the whole value, its first or its last character")
	case strings.HasPrefix(v, "*"):
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: v[1:]}}, nil
	case strings.HasSuffix(v, "*"):
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: prefix + v[:len(v)-1]}}, nil
	}
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: prefix + v}}, nil
}

// values compiles each value with conv, recording invalid ones.
func values[T any](t *policyTranslator, field string, vals []string, conv func(string) (T, error)) []T {
	var out []T
	for _, v := range vals {
		x, err := conv(v)
		if err != nil {
			t.invalid = append(t.invalid, fmt.Sprintf("%s value %q %v", field, v, err))
			continue
		}
		out = append(out, x)
	}
	return out
}

func principalID(v string) (*rbacv3.Principal, error) {
	m, err := literal("spiffe://", v)
	if err != nil {
		return nil, err
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{PrincipalName: m}}}, nil
}

// namespaceID matches the principals of a namespace; the name is quoted, so
// it is never a pattern.
func namespaceID(v string) (*rbacv3.Principal, error) {
	if err := authpolicy.CheckValue(v); err != nil {
		return nil, err
	}
	var ns string
	switch {
	case v == "*":
		ns = `[^/]+`
	case strings.Count(v, "*") > 1 || (strings.Contains(v, "*") && !strings.HasPrefix(v, "*") && !strings.HasSuffix(v, "*")):
		return nil, fmt.Errorf("has a '*' that is not the whole value, its first or its last character")
	case strings.HasPrefix(v, "*"):
		ns = `[^/]*` + regexp.QuoteMeta(v[1:])
	case strings.HasSuffix(v, "*"):
		ns = regexp.QuoteMeta(v[:len(v)-1]) + `[^/]*`
	default:
		ns = regexp.QuoteMeta(v)
	}
	m := &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: `spiffe://[^/]+/ns/` + ns + `/sa/[^/]+`}}}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{PrincipalName: m}}}, nil
}

func serviceAccountID(policyNS string) func(string) (*rbacv3.Principal, error) {
	return func(v string) (*rbacv3.Principal, error) {
		ns, sa, ok := strings.Cut(v, "/")
		if !ok {
			ns, sa = policyNS, v
		}
		if err := authpolicy.CheckValue(v); err != nil {
			return nil, err
		}
		if ns == "" || sa == "" || strings.ContainsAny(sa, "/*") || strings.Contains(ns, "*") {
			return nil, fmt.Errorf("is not <service-account> or <namespace>/<service-account>")
		}
		m := &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: "/ns/" + ns + "/sa/" + sa}}
		return &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{PrincipalName: m}}}, nil
	}
}

func ipID(direct bool) func(string) (*rbacv3.Principal, error) {
	return func(v string) (*rbacv3.Principal, error) {
		p, err := authpolicy.ParseBlock(v)
		if err != nil {
			return nil, err
		}
		c := &corev3.CidrRange{AddressPrefix: p.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(p.Bits()))}
		if direct {
			return &rbacv3.Principal{Identifier: &rbacv3.Principal_DirectRemoteIp{DirectRemoteIp: c}}, nil
		}
		return &rbacv3.Principal{Identifier: &rbacv3.Principal_RemoteIp{RemoteIp: c}}, nil
	}
}

func headerPerm(name string) func(string) (*rbacv3.Permission, error) {
	return func(v string) (*rbacv3.Permission, error) {
		m, err := literal("", v)
		if err != nil {
			return nil, err
		}
		if v == "*" {
			return &rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: &routev3.HeaderMatcher{Name: name,
				HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}}}, nil
		}
		if name == ":authority" {
			m.IgnoreCase = true
		}
		return &rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: &routev3.HeaderMatcher{Name: name,
			HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: m}}}}, nil
	}
}

func pathPerm(v string) (*rbacv3.Permission, error) {
	m, err := literal("", v)
	if err != nil {
		return nil, err
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{
		Rule: &matcherv3.PathMatcher_Path{Path: m}}}}, nil
}

func portPerm(v string) (*rbacv3.Permission, error) {
	n, err := strconv.ParseUint(v, 10, 16)
	if err != nil || n == 0 {
		return nil, fmt.Errorf("is not a port number")
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: uint32(n)}}, nil
}

// include adds an OR of the values' permissions, and a NOT of the OR of the
// not-values'.
func include[T any](out []T, in, notIn []T, or func([]T) T, not func(T) T) []T {
	if len(in) > 0 {
		out = append(out, or(in))
	}
	if len(notIn) > 0 {
		out = append(out, not(or(notIn)))
	}
	return out
}

func (t *policyTranslator) permField(out []*rbacv3.Permission, field string, vals, notVals []string, conv func(string) (*rbacv3.Permission, error)) []*rbacv3.Permission {
	in := values(t, field, vals, conv)
	notIn := values(t, "not"+strings.ToUpper(field[:1])+field[1:], notVals, conv)
	return include(out, in, notIn, orPerm, notPerm)
}

func (t *policyTranslator) idField(out []*rbacv3.Principal, field string, vals, notVals []string, conv func(string) (*rbacv3.Principal, error)) []*rbacv3.Principal {
	in := values(t, field, vals, conv)
	notIn := values(t, "not"+strings.ToUpper(field[:1])+field[1:], notVals, conv)
	return include(out, in, notIn, orIDs, notID)
}

// http reports whether an HTTP-only field with values is left out (on a
// TCP chain), noting it.
func (t *policyTranslator) http(field string, vals, notVals []string) bool {
	if !t.tcp || len(vals)+len(notVals) == 0 {
		return false
	}
	t.httpOnly = append(t.httpOnly, field)
	return true
}

func (t *policyTranslator) operation(op *securityv1beta1.Operation) []*rbacv3.Permission {
	var out []*rbacv3.Permission
	if !t.http("hosts", op.GetHosts(), op.GetNotHosts()) {
		out = t.permField(out, "hosts", op.GetHosts(), op.GetNotHosts(), headerPerm(":authority"))
	}
	out = t.permField(out, "ports", op.GetPorts(), op.GetNotPorts(), portPerm)
	if !t.http("methods", op.GetMethods(), op.GetNotMethods()) {
		out = t.permField(out, "methods", op.GetMethods(), op.GetNotMethods(), headerPerm(":method"))
	}
	if !t.http("paths", op.GetPaths(), op.GetNotPaths()) {
		out = t.permField(out, "paths", op.GetPaths(), op.GetNotPaths(), pathPerm)
	}
	return out
}

func (t *policyTranslator) source(s *securityv1beta1.Source) []*rbacv3.Principal {
	var out []*rbacv3.Principal
	out = t.idField(out, "principals", s.GetPrincipals(), s.GetNotPrincipals(), principalID)
	out = t.idField(out, "namespaces", s.GetNamespaces(), s.GetNotNamespaces(), namespaceID)
	ns, _, _ := strings.Cut(t.policy, "/")
	out = t.idField(out, "serviceAccounts", s.GetServiceAccounts(), s.GetNotServiceAccounts(), serviceAccountID(ns))
	out = t.idField(out, "ipBlocks", s.GetIpBlocks(), s.GetNotIpBlocks(), ipID(true))
	out = t.idField(out, "remoteIpBlocks", s.GetRemoteIpBlocks(), s.GetNotRemoteIpBlocks(), ipID(false))
	if !t.http("requestPrincipals", s.GetRequestPrincipals(), s.GetNotRequestPrincipals()) && len(s.GetRequestPrincipals())+len(s.GetNotRequestPrincipals()) > 0 {
		t.unsupported = append(t.unsupported, "requestPrincipals")
	}
	if len(s.GetTrustDomains())+len(s.GetNotTrustDomains()) > 0 {
		t.unsupported = append(t.unsupported, "trustDomains")
	}
	return out
}

// condition translates a when condition into a permission or principal.
func (t *policyTranslator) condition(w *securityv1beta1.Condition) ([]*rbacv3.Permission, []*rbacv3.Principal) {
	key := w.GetKey()
	field := "when " + key
	if strings.HasPrefix(key, "request.") && t.http(field, w.GetValues(), w.GetNotValues()) {
		return nil, nil // request.headers, request.auth.*: HTTP only
	}
	if name, ok := strings.CutPrefix(key, "request.headers["); ok && strings.HasSuffix(name, "]") && len(name) > 1 {
		name = strings.ToLower(strings.TrimSuffix(name, "]"))
		return t.permField(nil, field, w.GetValues(), w.GetNotValues(), headerPerm(name)), nil
	}
	switch key {
	case "source.ip":
		return nil, t.idField(nil, field, w.GetValues(), w.GetNotValues(), ipID(true))
	case "remote.ip":
		return nil, t.idField(nil, field, w.GetValues(), w.GetNotValues(), ipID(false))
	case "source.namespace":
		return nil, t.idField(nil, field, w.GetValues(), w.GetNotValues(), namespaceID)
	case "source.principal":
		return nil, t.idField(nil, field, w.GetValues(), w.GetNotValues(), principalID)
	case "destination.port":
		return t.permField(nil, field, w.GetValues(), w.GetNotValues(), portPerm), nil
	}
	t.unsupported = append(t.unsupported, field)
	return nil, nil
}
