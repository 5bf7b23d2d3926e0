package waypointxds

import (
	"slices"
	"sort"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/ambient"
)

// Path kinds in precedence order.
const (
	pathExact = iota
	pathRegex
	pathPrefix
)

// match is one Gateway API match, from an HTTPRoute or a GRPCRoute.
type match struct {
	pathKind int
	path     string
	method   string
	headers  []kv
	query    []kv
}

type kv struct {
	name, value string
	regex       bool
}

type backend struct {
	ref     gwv1.BackendObjectReference
	weight  int32
	filters []gwv1.HTTPRouteFilter
}

// rule is one route rule of either kind.
type rule struct {
	matches  []match
	filters  []gwv1.HTTPRouteFilter
	backends []backend
	timeouts *gwv1.HTTPRouteTimeouts
	retry    *gwv1.HTTPRouteRetry
}

// matchesOrAll is the rule's matches; a rule without any matches every
// request.
func (ru *rule) matchesOrAll() []match {
	if len(ru.matches) == 0 {
		return []match{{pathKind: pathPrefix, path: "/"}}
	}
	return ru.matches
}

// source is one attached route.
type source struct {
	key     string // "<namespace>/<name>"
	kind    string // kindHTTPRoute or kindGRPCRoute
	ns      string
	name    string
	created metav1.Time
	rules   []rule
	// hostnames are an HTTPRoute's or GRPCRoute's, for a Gateway's
	// listeners (a Service parent ignores them).
	hostnames []gwv1.Hostname
}

// entry is one Envoy route with what sorts it.
type entry struct {
	m             match
	src           *source
	rule, ordinal int
	route         *routev3.Route
}

// parentMatches reports whether a route's parentRef attaches it to a port
// of svc (producer routes only: the route lives in the Service's
// namespace), or of the ServiceEntry host svc stands for.
func (b *builder) parentMatches(routeNS string, r gwv1.ParentReference, svc *corev1.Service, port corev1.ServicePort) bool {
	_, entry := b.entries[svc]
	switch {
	case routeNS != svc.Namespace || string(r.Name) != svc.Name:
		return false
	case entry && !entryParent(r), !entry && !serviceParent(r):
		return false
	case r.Namespace != nil && string(*r.Namespace) != svc.Namespace:
		return false
	case r.Port != nil && int32(*r.Port) != port.Port:
		return false
	case r.SectionName != nil && string(*r.SectionName) != port.Name:
		return false
	}
	return true
}

// serviceParent reports whether a parentRef names a Service. Unlike a
// backendRef's, a parentRef's group and kind default to Gateway's.
func serviceParent(r gwv1.ParentReference) bool {
	return r.Group != nil && r.Kind != nil && serviceKind(r.Group, r.Kind)
}

// attached lists the routes attached to a Service port, and records which
// of their parentRefs attached them.
func (b *builder) attached(svc *corev1.Service, port corev1.ServicePort) []*source {
	var out []*source
	take := func(src *source, refs []gwv1.ParentReference) {
		matched := false
		for i, ref := range refs {
			if b.parentMatches(src.ns, ref, svc, port) {
				b.report(src).attach(i, b.wp.Key())
				matched = true
			}
		}
		if matched {
			out = append(out, src)
		}
	}
	for _, o := range byNamespace(b.st.HTTPRoutes, svc.Namespace) {
		r := o.(*gwv1.HTTPRoute)
		take(httpSource(r), r.Spec.ParentRefs)
	}
	for _, o := range byNamespace(b.st.GRPCRoutes, svc.Namespace) {
		r := o.(*gwv1.GRPCRoute)
		take(grpcSource(r), r.Spec.ParentRefs)
	}
	// A stable order, so that the problems are found (and noted) in one.
	sort.SliceStable(out, func(i, j int) bool { return out[i].id().String() < out[j].id().String() })
	return out
}

func httpSource(r *gwv1.HTTPRoute) *source {
	s := &source{key: r.Namespace + "/" + r.Name, kind: kindHTTPRoute, ns: r.Namespace, name: r.Name, created: r.CreationTimestamp, hostnames: r.Spec.Hostnames}
	for _, rr := range r.Spec.Rules {
		ru := rule{filters: rr.Filters, timeouts: rr.Timeouts, retry: rr.Retry}
		for _, m := range rr.Matches {
			ru.matches = append(ru.matches, httpMatch(m))
		}
		for _, br := range rr.BackendRefs {
			ru.backends = append(ru.backends, backend{ref: br.BackendObjectReference, weight: weightOf(br.Weight), filters: br.Filters})
		}
		s.rules = append(s.rules, ru)
	}
	return s
}

func weightOf(w *int32) int32 {
	if w == nil {
		return 1
	}
	return *w
}

func httpMatch(m gwv1.HTTPRouteMatch) match {
	out := match{pathKind: pathPrefix, path: "/"}
	if p := m.Path; p != nil {
		if p.Value != nil {
			out.path = *p.Value
		}
		if p.Type != nil {
			switch *p.Type {
			case gwv1.PathMatchExact:
				out.pathKind = pathExact
			case gwv1.PathMatchRegularExpression:
				out.pathKind = pathRegex
			}
		}
	}
	if m.Method != nil {
		out.method = string(*m.Method)
	}
	for _, h := range m.Headers {
		out.headers = append(out.headers, kv{name: strings.ToLower(string(h.Name)), value: h.Value,
			regex: h.Type != nil && *h.Type == gwv1.HeaderMatchRegularExpression})
	}
	for _, q := range m.QueryParams {
		out.query = append(out.query, kv{name: string(q.Name), value: q.Value,
			regex: q.Type != nil && *q.Type == gwv1.QueryParamMatchRegularExpression})
	}
	return out
}

func grpcSource(r *gwv1.GRPCRoute) *source {
	s := &source{key: r.Namespace + "/" + r.Name, kind: kindGRPCRoute, ns: r.Namespace, name: r.Name, created: r.CreationTimestamp, hostnames: r.Spec.Hostnames}
	for _, rr := range r.Spec.Rules {
		var ru rule
		for _, f := range rr.Filters {
			ru.filters = append(ru.filters, grpcFilter(f))
		}
		for _, m := range rr.Matches {
			ru.matches = append(ru.matches, grpcMatch(m))
		}
		for _, br := range rr.BackendRefs {
			be := backend{ref: br.BackendObjectReference, weight: weightOf(br.Weight)}
			for _, f := range br.Filters {
				be.filters = append(be.filters, grpcFilter(f))
			}
			ru.backends = append(ru.backends, be)
		}
		s.rules = append(s.rules, ru)
	}
	return s
}

func grpcFilter(f gwv1.GRPCRouteFilter) gwv1.HTTPRouteFilter {
	return gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterType(f.Type), RequestHeaderModifier: f.RequestHeaderModifier,
		ResponseHeaderModifier: f.ResponseHeaderModifier, RequestMirror: f.RequestMirror, ExtensionRef: f.ExtensionRef}
}

// grpcMatch maps a gRPC method match to a path: /service/method exactly, a
// /service/ prefix, or a pattern for a method of any service.
func grpcMatch(m gwv1.GRPCRouteMatch) match {
	out := match{pathKind: pathPrefix, path: "/"}
	if mm := m.Method; mm != nil {
		svc, meth := "", ""
		if mm.Service != nil {
			svc = *mm.Service
		}
		if mm.Method != nil {
			meth = *mm.Method
		}
		regex := mm.Type != nil && *mm.Type == gwv1.GRPCMethodMatchRegularExpression
		switch {
		case regex:
			out.pathKind = pathRegex
			out.path = "/" + orAll(svc, "[^/]+") + "/" + orAll(meth, "[^/]+")
		case svc != "" && meth != "":
			out.pathKind, out.path = pathExact, "/"+svc+"/"+meth
		case svc != "":
			out.path = "/" + svc
		case meth != "":
			out.pathKind, out.path = pathRegex, "/[^/]+/"+quoteRE(meth)
		}
	}
	for _, h := range m.Headers {
		out.headers = append(out.headers, kv{name: strings.ToLower(string(h.Name)), value: h.Value,
			regex: h.Type != nil && *h.Type == gwv1.GRPCHeaderMatchRegularExpression})
	}
	return out
}

func orAll(v, all string) string {
	if v == "" {
		return all
	}
	return v
}

// quoteRE quotes a literal for RE2.
func quoteRE(s string) string {
	var sb strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$`, r) {
			sb.WriteByte('\\')
		}
		sb.WriteRune(r)
	}
	return sb.String()
}

// less orders entries by Gateway API precedence.
func less(a, b *entry) bool {
	if a.m.pathKind != b.m.pathKind {
		return a.m.pathKind < b.m.pathKind
	}
	if len(a.m.path) != len(b.m.path) {
		return len(a.m.path) > len(b.m.path)
	}
	if (a.m.method != "") != (b.m.method != "") {
		return a.m.method != ""
	}
	if len(a.m.headers) != len(b.m.headers) {
		return len(a.m.headers) > len(b.m.headers)
	}
	if len(a.m.query) != len(b.m.query) {
		return len(a.m.query) > len(b.m.query)
	}
	if !a.src.created.Equal(&b.src.created) {
		return a.src.created.Before(&b.src.created)
	}
	if a.src.key != b.src.key {
		return a.src.key < b.src.key
	}
	if a.rule != b.rule {
		return a.rule < b.rule
	}
	return a.ordinal < b.ordinal
}

// routeConfig builds the RouteConfiguration of a Service port.
func (b *builder) routeConfig(name string, svc *corev1.Service, port corev1.ServicePort, self string) *routev3.RouteConfiguration {
	var entries []*entry
	for _, src := range b.attached(svc, port) {
		for i := range src.rules {
			ru := &src.rules[i]
			for j, m := range ru.matchesOrAll() {
				r := b.envoyRoute(src, ru, m)
				r.Name = src.key + "." + itoa(i) + "." + itoa(j)
				entries = append(entries, &entry{m: m, src: src, rule: i, ordinal: j, route: r})
			}
		}
	}
	sort.SliceStable(entries, func(i, j int) bool { return less(entries[i], entries[j]) })
	vh := &routev3.VirtualHost{Name: name, Domains: []string{"*"}}
	for _, e := range entries {
		vh.Routes = append(vh.Routes, e.route)
	}
	if len(entries) == 0 {
		vh.Routes = append(vh.Routes, &routev3.Route{
			Name:   "default",
			Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: defaultAction(self)},
		})
	}
	return &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{vh}}
}

// defaultRetry is what a route without a retry policy gets: connections that
// fail before a response are retried twice (Istio's default spirit, without
// retrying answered requests).
func defaultRetry() *routev3.RetryPolicy {
	return &routev3.RetryPolicy{RetryOn: "connect-failure,reset", NumRetries: wrapperspb.UInt32(2)}
}

func defaultAction(cluster string) *routev3.RouteAction {
	return &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}, RetryPolicy: defaultRetry()}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

func stringMatch(v string, regex bool) *matcherv3.StringMatcher {
	if regex {
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: v}}}
	}
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v}}
}

func routeMatch(m match) *routev3.RouteMatch {
	rm := &routev3.RouteMatch{}
	switch m.pathKind {
	case pathExact:
		rm.PathSpecifier = &routev3.RouteMatch_Path{Path: m.path}
	case pathRegex:
		rm.PathSpecifier = &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: m.path}}
	default:
		p := strings.TrimRight(m.path, "/")
		if p == "" {
			rm.PathSpecifier = &routev3.RouteMatch_Prefix{Prefix: "/"}
		} else {
			rm.PathSpecifier = &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: p}
		}
	}
	if m.method != "" {
		rm.Headers = append(rm.Headers, &routev3.HeaderMatcher{Name: ":method",
			HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: stringMatch(m.method, false)}})
	}
	for _, h := range m.headers {
		rm.Headers = append(rm.Headers, &routev3.HeaderMatcher{Name: h.name,
			HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: stringMatch(h.value, h.regex)}})
	}
	for _, q := range m.query {
		rm.QueryParameters = append(rm.QueryParameters, &routev3.QueryParameterMatcher{Name: q.name,
			QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: stringMatch(q.value, q.regex)}})
	}
	return rm
}

// headerOps converts a Gateway API header filter.
func headerOps(f *gwv1.HTTPHeaderFilter) ([]*corev3.HeaderValueOption, []string) {
	if f == nil {
		return nil, nil
	}
	var add []*corev3.HeaderValueOption
	for _, h := range f.Set {
		add = append(add, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: strings.ToLower(string(h.Name)), Value: h.Value},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	for _, h := range f.Add {
		add = append(add, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: strings.ToLower(string(h.Name)), Value: h.Value},
			AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD})
	}
	var rm []string
	for _, h := range f.Remove {
		rm = append(rm, strings.ToLower(h))
	}
	return add, rm
}

func parseDuration(d *gwv1.Duration) (time.Duration, bool) {
	if d == nil {
		return 0, false
	}
	v, err := time.ParseDuration(string(*d))
	return v, err == nil
}

// backendCluster resolves a backend reference to a cluster name, recording
// the cluster to emit. ok is false when the reference cannot be used; the
// route's report says why.
func (b *builder) backendCluster(src *source, ref gwv1.BackendObjectReference) (string, bool) {
	if ref.Group != nil && string(*ref.Group) == entryGroup && ref.Kind != nil && (*ref.Kind == hostnameKind || *ref.Kind == entryKind) {
		return b.entryBackend(src, ref)
	}
	if !serviceKind(ref.Group, ref.Kind) {
		b.refProblem(src, gwv1.RouteReasonInvalidKind, "backend %s is not a Service (nor a ServiceEntry, or a Hostname of group networking.istio.io)", ref.Name)
		return "", false
	}
	ns := src.ns
	if ref.Namespace != nil && string(*ref.Namespace) != src.ns {
		ns = string(*ref.Namespace)
		if !b.granted(src, ns, string(ref.Name)) {
			b.refProblem(src, gwv1.RouteReasonRefNotPermitted,
				"backend %s/%s is in another namespace, and no ReferenceGrant in %s lets %ss of namespace %s refer to Service %s", ns, ref.Name, ns, src.kind, src.ns, ref.Name)
			return "", false
		}
	}
	svc := get[corev1.Service](b.st.Services, ns+"/"+string(ref.Name))
	if svc == nil {
		b.refProblem(src, gwv1.RouteReasonBackendNotFound, "backend Service %s/%s not found", ns, ref.Name)
		return "", false
	}
	if ref.Port == nil {
		b.refProblem(src, gwv1.RouteReasonBackendNotFound, "backend %s has no port", ref.Name)
		return "", false
	}
	for _, p := range svc.Spec.Ports {
		if p.Port == int32(*ref.Port) {
			name := ClusterName(ambient.Hostname(svc.Name, svc.Namespace, b.mesh.ClusterDomain), p.Port)
			b.clusters[name] = clusterRef{svc, p}
			return name, true
		}
	}
	b.refProblem(src, gwv1.RouteReasonBackendNotFound, "backend Service %s/%s has no port %d", ns, ref.Name, *ref.Port)
	return "", false
}

func directResponse(status uint32) *routev3.Route_DirectResponse {
	return &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: status}}
}

// envoyRoute builds the Envoy route of one match of a rule.
func (b *builder) envoyRoute(src *source, ru *rule, m match) *routev3.Route {
	r := &routev3.Route{Match: routeMatch(m)}
	var redirect *gwv1.HTTPRequestRedirectFilter
	var rewrite *gwv1.HTTPURLRewriteFilter
	var mirrors []*gwv1.HTTPRequestMirrorFilter
	for _, f := range ru.filters {
		switch f.Type {
		case gwv1.HTTPRouteFilterRequestHeaderModifier:
			add, rm := headerOps(f.RequestHeaderModifier)
			r.RequestHeadersToAdd = append(r.RequestHeadersToAdd, add...)
			r.RequestHeadersToRemove = append(r.RequestHeadersToRemove, rm...)
		case gwv1.HTTPRouteFilterResponseHeaderModifier:
			add, rm := headerOps(f.ResponseHeaderModifier)
			r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, add...)
			r.ResponseHeadersToRemove = append(r.ResponseHeadersToRemove, rm...)
		case gwv1.HTTPRouteFilterRequestRedirect:
			redirect = f.RequestRedirect
		case gwv1.HTTPRouteFilterURLRewrite:
			rewrite = f.URLRewrite
		case gwv1.HTTPRouteFilterRequestMirror:
			if f.RequestMirror != nil {
				mirrors = append(mirrors, f.RequestMirror)
			}
		case gwv1.HTTPRouteFilterCORS:
			if f.CORS != nil {
				r.TypedPerFilterConfig = corsConfig(f.CORS)
			}
		default:
			// An unsupported filter must not be skipped silently: Gateway
			// API asks for a 500 so that the route is never half-applied.
			b.unsupported(src, "filter %s is not supported; its rule answers 500", f.Type)
			r.Action = directResponse(500)
			return r
		}
	}
	if redirect != nil {
		r.Action = &routev3.Route_Redirect{Redirect: redirectAction(redirect, m)}
		return r
	}
	a := &routev3.RouteAction{}
	var wcs []*routev3.WeightedCluster_ClusterWeight
	invalid := false
	backends := ru.backends
	if len(backends) > maxBackends {
		b.unsupported(src, "a rule has %d backendRefs, more than Gateway API's %d; only the first %d are used", len(backends), maxBackends, maxBackends)
		backends = backends[:maxBackends]
	}
	for _, be := range backends {
		if be.weight <= 0 {
			continue
		}
		be.weight = min(be.weight, maxWeight)
		name, ok := b.backendCluster(src, be.ref)
		if !ok {
			invalid = true
			continue
		}
		wc := &routev3.WeightedCluster_ClusterWeight{Name: name, Weight: wrapperspb.UInt32(uint32(be.weight))}
		for _, f := range be.filters {
			switch f.Type {
			case gwv1.HTTPRouteFilterRequestHeaderModifier:
				wc.RequestHeadersToAdd, wc.RequestHeadersToRemove = headerOps(f.RequestHeaderModifier)
			case gwv1.HTTPRouteFilterResponseHeaderModifier:
				wc.ResponseHeadersToAdd, wc.ResponseHeadersToRemove = headerOps(f.ResponseHeaderModifier)
			default:
				b.unsupported(src, "backend %s: filter %s is not supported on a backend and is not applied", be.ref.Name, f.Type)
			}
		}
		wcs = append(wcs, wc)
	}
	switch {
	case len(wcs) == 0:
		r.Action = directResponse(500)
		return r
	case len(wcs) == 1 && !changesHeaders(wcs[0]) && !invalid:
		a.ClusterSpecifier = &routev3.RouteAction_Cluster{Cluster: wcs[0].Name}
	default:
		a.ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{Clusters: wcs}}
	}
	for _, mf := range mirrors {
		name, ok := b.backendCluster(src, mf.BackendRef)
		if !ok {
			continue
		}
		mp := &routev3.RouteAction_RequestMirrorPolicy{Cluster: name}
		if pct, ok := mirrorPercent(mf); ok {
			mp.RuntimeFraction = &corev3.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{
				Numerator: pct, Denominator: typev3.FractionalPercent_MILLION}}
		}
		a.RequestMirrorPolicies = append(a.RequestMirrorPolicies, mp)
	}
	if rewrite != nil {
		if rewrite.Hostname != nil {
			a.HostRewriteSpecifier = &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: string(*rewrite.Hostname)}
		}
		if p := rewrite.Path; p != nil {
			switch {
			case p.Type == gwv1.FullPathHTTPPathModifier && p.ReplaceFullPath != nil:
				a.RegexRewrite = &matcherv3.RegexMatchAndSubstitute{Pattern: &matcherv3.RegexMatcher{Regex: "^.*$"}, Substitution: *p.ReplaceFullPath}
			case p.Type == gwv1.PrefixMatchHTTPPathModifier && p.ReplacePrefixMatch != nil && m.pathKind == pathPrefix:
				a.PrefixRewrite = *p.ReplacePrefixMatch
			}
		}
	}
	request, hasRequest := parseDuration(nil)
	backendReq, hasBackend := parseDuration(nil)
	if t := ru.timeouts; t != nil {
		request, hasRequest = parseDuration(t.Request)
		backendReq, hasBackend = parseDuration(t.BackendRequest)
	}
	if hasRequest {
		a.Timeout = durationpb.New(request)
	} else if hasBackend {
		a.Timeout = durationpb.New(backendReq)
	}
	a.RetryPolicy = defaultRetry()
	if rt := ru.retry; rt != nil {
		rp := &routev3.RetryPolicy{RetryOn: "connect-failure,reset", NumRetries: wrapperspb.UInt32(2)}
		if rt.Attempts != nil {
			rp.NumRetries = wrapperspb.UInt32(uint32(max(*rt.Attempts, 0)))
		}
		if len(rt.Codes) > 0 {
			rp.RetryOn += ",retriable-status-codes"
			for _, c := range rt.Codes {
				rp.RetriableStatusCodes = append(rp.RetriableStatusCodes, uint32(c))
			}
		}
		if d, ok := parseDuration(rt.Backoff); ok && d > 0 {
			rp.RetryBackOff = &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(d)}
		}
		a.RetryPolicy = rp
	}
	if hasBackend && a.RetryPolicy != nil {
		a.RetryPolicy.PerTryTimeout = durationpb.New(backendReq)
	}
	r.Action = &routev3.Route_Route{Route: a}
	return r
}

// changesHeaders reports whether a backend changes headers, which keeps
// its weighted cluster even when it is the only one.
func changesHeaders(wc *routev3.WeightedCluster_ClusterWeight) bool {
	return len(wc.RequestHeadersToAdd)+len(wc.RequestHeadersToRemove)+len(wc.ResponseHeadersToAdd)+len(wc.ResponseHeadersToRemove) > 0
}

func mirrorPercent(f *gwv1.HTTPRequestMirrorFilter) (uint32, bool) {
	switch {
	case f.Percent != nil:
		return uint32(max(min(*f.Percent, 100), 0)) * 10000, true
	case f.Fraction != nil:
		den := int32(100)
		if f.Fraction.Denominator != nil && *f.Fraction.Denominator > 0 {
			den = *f.Fraction.Denominator
		}
		return uint32(int64(max(f.Fraction.Numerator, 0)) * 1000000 / int64(den)), true
	}
	return 0, false
}

func redirectAction(f *gwv1.HTTPRequestRedirectFilter, m match) *routev3.RedirectAction {
	rd := &routev3.RedirectAction{ResponseCode: routev3.RedirectAction_FOUND}
	if f.Scheme != nil {
		rd.SchemeRewriteSpecifier = &routev3.RedirectAction_SchemeRedirect{SchemeRedirect: *f.Scheme}
	}
	if f.Hostname != nil {
		rd.HostRedirect = string(*f.Hostname)
	}
	if f.Port != nil {
		rd.PortRedirect = uint32(*f.Port)
	}
	if f.StatusCode != nil {
		switch *f.StatusCode {
		case 301:
			rd.ResponseCode = routev3.RedirectAction_MOVED_PERMANENTLY
		case 303:
			rd.ResponseCode = routev3.RedirectAction_SEE_OTHER
		case 307:
			rd.ResponseCode = routev3.RedirectAction_TEMPORARY_REDIRECT
		case 308:
			rd.ResponseCode = routev3.RedirectAction_PERMANENT_REDIRECT
		}
	}
	if p := f.Path; p != nil {
		switch {
		case p.Type == gwv1.FullPathHTTPPathModifier && p.ReplaceFullPath != nil:
			rd.PathRewriteSpecifier = &routev3.RedirectAction_PathRedirect{PathRedirect: *p.ReplaceFullPath}
		case p.Type == gwv1.PrefixMatchHTTPPathModifier && p.ReplacePrefixMatch != nil && m.pathKind == pathPrefix:
			rd.PathRewriteSpecifier = &routev3.RedirectAction_PrefixRewrite{PrefixRewrite: *p.ReplacePrefixMatch}
		}
	}
	return rd
}

// granted reports whether a ReferenceGrant in namespace ns lets the route
// src refer to Service name there: one whose from names the route's kind
// (group gateway.networking.k8s.io) and namespace, and whose to names
// Services (group "") with that name or no name. A grant lives in the
// namespace it opens; one anywhere else grants nothing.
func (b *builder) granted(src *source, ns, name string) bool {
	for _, o := range byNamespace(b.st.ReferenceGrants, ns) {
		g, ok := o.(*gwv1.ReferenceGrant)
		if !ok || g.Namespace != ns {
			continue
		}
		from := slices.ContainsFunc(g.Spec.From, func(f gwv1.ReferenceGrantFrom) bool {
			return f.Group == gwv1.GroupName && string(f.Kind) == src.kind && string(f.Namespace) == src.ns
		})
		to := slices.ContainsFunc(g.Spec.To, func(t gwv1.ReferenceGrantTo) bool {
			return serviceKind(&t.Group, &t.Kind) && (t.Name == nil || *t.Name == "" || string(*t.Name) == name)
		})
		if from && to {
			return true
		}
	}
	return false
}
