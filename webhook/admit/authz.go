package admit

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	securitybeta "istio.io/api/security/v1beta1"
	typebeta "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// valueKind is how the strings of one policy attribute are checked.
type valueKind int

const (
	plainValue    valueKind = iota
	wildcardValue           // "*" only as the whole value, a prefix or a suffix
	ipValue                 // an IP address or CIDR
	portValue               // a port number
)

// attribute is one string list of a source, operation or condition.
type attribute struct {
	name   string
	values []string
	kind   valueKind
	// http marks attributes only an HTTP-aware proxy (a waypoint) can match.
	http bool
}

func sourceAttributes(s *securitybeta.Source) []attribute {
	return []attribute{
		{"principals", s.GetPrincipals(), wildcardValue, false},
		{"notPrincipals", s.GetNotPrincipals(), wildcardValue, false},
		{"requestPrincipals", s.GetRequestPrincipals(), wildcardValue, true},
		{"notRequestPrincipals", s.GetNotRequestPrincipals(), wildcardValue, true},
		{"namespaces", s.GetNamespaces(), wildcardValue, false},
		{"notNamespaces", s.GetNotNamespaces(), wildcardValue, false},
		{"serviceAccounts", s.GetServiceAccounts(), plainValue, false},
		{"notServiceAccounts", s.GetNotServiceAccounts(), plainValue, false},
		{"ipBlocks", s.GetIpBlocks(), ipValue, false},
		{"notIpBlocks", s.GetNotIpBlocks(), ipValue, false},
		{"remoteIpBlocks", s.GetRemoteIpBlocks(), ipValue, true},
		{"notRemoteIpBlocks", s.GetNotRemoteIpBlocks(), ipValue, true},
		{"trustDomains", s.GetTrustDomains(), wildcardValue, false},
		{"notTrustDomains", s.GetNotTrustDomains(), wildcardValue, false},
	}
}

func operationAttributes(o *securitybeta.Operation) []attribute {
	return []attribute{
		{"hosts", o.GetHosts(), wildcardValue, true},
		{"notHosts", o.GetNotHosts(), wildcardValue, true},
		{"ports", o.GetPorts(), portValue, false},
		{"notPorts", o.GetNotPorts(), portValue, false},
		{"methods", o.GetMethods(), plainValue, true},
		{"notMethods", o.GetNotMethods(), plainValue, true},
		{"paths", o.GetPaths(), plainValue, true},
		{"notPaths", o.GetNotPaths(), plainValue, true},
	}
}

// conditionKeys are the when.key values Istio defines, with how their
// values are checked and whether they need HTTP. Keys with a bracketed or
// dotted suffix are in conditionPrefixes.
var conditionKeys = map[string]struct {
	kind valueKind
	http bool
}{
	"source.ip":              {ipValue, false},
	"source.namespace":       {wildcardValue, false},
	"source.principal":       {wildcardValue, false},
	"source.serviceAccount":  {plainValue, false},
	"destination.ip":         {ipValue, false},
	"destination.port":       {portValue, false},
	"remote.ip":              {ipValue, true},
	"connection.sni":         {wildcardValue, true},
	"request.auth.principal": {wildcardValue, true},
	"request.auth.audiences": {wildcardValue, true},
	"request.auth.presenter": {wildcardValue, true},
}

var conditionPrefixes = []string{"request.headers[", "request.auth.claims[", "experimental.envoy.filters."}

// validateAuthorizationPolicy checks an AuthorizationPolicy's structure,
// its targets, and warns about HTTP rules on a policy only ztunnel enforces.
func (a *Admitter) validateAuthorizationPolicy(rv *review) {
	var ap securityv1.AuthorizationPolicy
	if !rv.decodeObject(&ap, nil) {
		return
	}
	rep := &rv.rep
	spec := &ap.Spec
	home := rv.req.Namespace
	if home == "" {
		home = ap.Namespace
	}

	targeted := spec.GetTargetRef() != nil || len(spec.GetTargetRefs()) > 0
	if spec.GetTargetRef() != nil && len(spec.GetTargetRefs()) > 0 {
		rep.deny("authz-target-refs", "spec.targetRef", "set targetRef or targetRefs, not both; move it into targetRefs")
	}
	if spec.GetSelector() != nil && targeted {
		rep.deny("authz-selector", "spec.selector", "a policy has a selector or targetRefs, not both; remove one")
	}
	checkSelector(rep, "authz-selector", spec.GetSelector())
	if ref := spec.GetTargetRef(); ref != nil {
		a.checkTargetRef(rep, "spec.targetRef", ref, home)
	}
	for i, ref := range spec.GetTargetRefs() {
		a.checkTargetRef(rep, fmt.Sprintf("spec.targetRefs[%d]", i), ref, home)
	}

	action := spec.GetAction()
	provider := spec.GetProvider()
	switch {
	case action == securitybeta.AuthorizationPolicy_CUSTOM && provider.GetName() == "":
		rep.deny("authz-provider", "spec.provider.name", "action CUSTOM needs a provider; name an extension provider of the mesh config")
	case action != securitybeta.AuthorizationPolicy_CUSTOM && provider != nil:
		rep.deny("authz-provider", "spec.provider", "only action CUSTOM takes a provider; remove it or set action: CUSTOM")
	case provider != nil:
		checkValue(rep, "authz-provider", "spec.provider.name", provider.GetName())
	}

	firstHTTP, httpRule := "", -1
	for i, rule := range spec.GetRules() {
		if attr := checkRule(rep, fmt.Sprintf("spec.rules[%d]", i), rule); attr != "" && firstHTTP == "" {
			firstHTTP, httpRule = attr, i
		}
	}
	if targeted {
		return
	}
	// No targetRefs: ztunnel enforces the policy, and it sees no HTTP.
	field := fmt.Sprintf("spec.rules[%d]", httpRule)
	switch {
	case action == securitybeta.AuthorizationPolicy_CUSTOM:
		rep.warn("authz-l7-on-ztunnel", "spec.action", "ztunnel does not run CUSTOM policies; bind this one to a waypoint with targetRefs")
	case firstHTTP == "":
	case action == securitybeta.AuthorizationPolicy_ALLOW:
		rep.warn("authz-l7-on-ztunnel", field, "ztunnel can't match HTTP (%s): this ALLOW rule becomes deny-all; use targetRefs", firstHTTP)
	default:
		rep.warn("authz-l7-on-ztunnel", field, "ztunnel can't match HTTP (%s): this %s rule has no effect; use targetRefs", firstHTTP, action)
	}
}

// checkTargetRef allows the kinds Istio allows: Gateway, GatewayClass (root
// namespace only), Service and ServiceEntry, in the policy's namespace.
func (a *Admitter) checkTargetRef(rep *report, field string, ref *typebeta.PolicyTargetReference, home string) {
	group, kind := ref.GetGroup(), ref.GetKind()
	switch {
	case group == gwv1.GroupName && kind == "Gateway":
	case group == gwv1.GroupName && kind == "GatewayClass":
		if home != a.cfg.RootNamespace {
			rep.deny("authz-target-refs", field+".kind", "a GatewayClass is targeted only from the root namespace %s; move the policy or target a Gateway",
				a.cfg.RootNamespace)
		}
	case (group == "" || group == "core") && kind == "Service":
	case group == "networking.istio.io" && kind == "ServiceEntry":
	default:
		target := kind
		if group != "" {
			target = group + "/" + kind
		}
		rep.deny("authz-target-refs", field+".kind",
			"Unsupported target %s: use Gateway or GatewayClass (group gateway.networking.k8s.io), Service (group \"\") or ServiceEntry (group networking.istio.io)",
			q(target))
	}
	name := ref.GetName()
	switch {
	case name == "":
		rep.deny("authz-target-refs", field+".name", "name the target")
	case !checkValue(rep, "authz-target-refs", field+".name", name):
	default:
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			rep.deny("authz-target-refs", field+".name", "%s is not an object name (%s); fix it", q(name), errs[0])
		}
	}
	if ns := ref.GetNamespace(); ns != "" && ns != home {
		rep.deny("authz-target-refs", field+".namespace", "a policy targets objects in its own namespace %s; remove namespace or move the policy", home)
	}
}

// checkRule checks one rule and returns the path of its first HTTP-only
// attribute (relative to the rule), or "".
func checkRule(rep *report, base string, rule *securitybeta.Rule) string {
	firstHTTP := ""
	note := func(path string) {
		if firstHTTP == "" {
			firstHTTP = path
		}
	}
	for j, f := range rule.GetFrom() {
		rel := fmt.Sprintf("from[%d].source", j)
		src := f.GetSource()
		attrs := sourceAttributes(src)
		if src == nil || allEmpty(attrs) {
			rep.deny("authz-rule", base+"."+rel, "an empty source; give at least one field (principals, namespaces, ...) or remove it")
			continue
		}
		checkAttributes(rep, base, rel, attrs, note)
	}
	for j, t := range rule.GetTo() {
		rel := fmt.Sprintf("to[%d].operation", j)
		op := t.GetOperation()
		attrs := operationAttributes(op)
		if op == nil || allEmpty(attrs) {
			rep.deny("authz-rule", base+"."+rel, "an empty operation; give at least one field (ports, paths, ...) or remove it")
			continue
		}
		checkAttributes(rep, base, rel, attrs, note)
	}
	for j, c := range rule.GetWhen() {
		rel := fmt.Sprintf("when[%d]", j)
		field := base + "." + rel
		key := c.GetKey()
		if key == "" {
			rep.deny("authz-rule", field+".key", "a condition needs a key, such as source.ip or request.headers[x-user]")
			continue
		}
		if !checkValue(rep, "authz-rule", field+".key", key) {
			continue
		}
		kind, http, ok := conditionKey(key)
		if !ok {
			rep.deny("authz-rule", field+".key", "unknown key %s; see Istio's authorization policy conditions", q(key))
			continue
		}
		if len(c.GetValues()) == 0 && len(c.GetNotValues()) == 0 {
			rep.deny("authz-rule", field, "a condition needs values or notValues")
			continue
		}
		if http {
			note(rel + " " + key)
		}
		checkAttributes(rep, base, rel, []attribute{
			{"values", c.GetValues(), kind, false},
			{"notValues", c.GetNotValues(), kind, false},
		}, note)
	}
	return firstHTTP
}

func conditionKey(key string) (valueKind, bool, bool) {
	if k, ok := conditionKeys[key]; ok {
		return k.kind, k.http, true
	}
	for _, p := range conditionPrefixes {
		if rest, ok := strings.CutPrefix(key, p); ok && rest != "" {
			if strings.HasSuffix(p, "[") && (!strings.HasSuffix(rest, "]") || rest == "]") {
				return 0, false, false
			}
			return plainValue, true, true
		}
	}
	return 0, false, false
}

func allEmpty(attrs []attribute) bool {
	for _, a := range attrs {
		if len(a.values) > 0 {
			return false
		}
	}
	return true
}

// checkAttributes checks each value of attrs and calls note with the path
// of each non-empty HTTP attribute.
func checkAttributes(rep *report, base, rel string, attrs []attribute, note func(string)) {
	for _, at := range attrs {
		if len(at.values) == 0 {
			continue
		}
		if at.http {
			note(rel + "." + at.name)
		}
		for k, v := range at.values {
			field := fmt.Sprintf("%s.%s.%s[%d]", base, rel, at.name, k)
			if v == "" {
				rep.deny("authz-rule", field, "an empty value matches nothing; remove it")
				continue
			}
			if !checkValue(rep, "authz-rule", field, v) {
				continue
			}
			if msg := valueProblem(at.kind, v); msg != "" {
				rep.deny("authz-rule", field, "%s %s; fix it", q(v), msg)
			}
		}
	}
}

func valueProblem(kind valueKind, v string) string {
	switch kind {
	case wildcardValue:
		if i := strings.IndexByte(v, '*'); i >= 0 && v != "*" {
			if strings.Count(v, "*") > 1 || (i != 0 && i != len(v)-1) {
				return "has a * that is not the whole value, a prefix or a suffix"
			}
		}
	case ipValue:
		if _, err := netip.ParsePrefix(v); err == nil {
			return ""
		}
		if _, err := netip.ParseAddr(v); err != nil {
			return "is not an IP address or CIDR block"
		}
	case portValue:
		if p, err := strconv.Atoi(v); err != nil || p < 1 || p > 65535 {
			return "is not a port number (1-65535)"
		}
	}
	return ""
}
