package waypointxds

import (
	"fmt"
	"sort"
	"strings"

	"istio.io/api/label"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/internal/apinames"
)

// Kinds of route.
const (
	kindHTTPRoute = "HTTPRoute"
	kindGRPCRoute = "GRPCRoute"
	kindTCPRoute  = "TCPRoute"
	kindTLSRoute  = "TLSRoute"
)

// RouteKey names a route.
type RouteKey struct {
	// Kind is "HTTPRoute", "GRPCRoute", "TCPRoute" or "TLSRoute".
	Kind, Namespace, Name string
}

func (k RouteKey) String() string { return k.Kind + " " + k.Namespace + "/" + k.Name }

// RouteOutcome is what the mesh makes of one route: its standing with each
// parentRef the waypoint controller answers for (a Service of the route's
// namespace, GAMMA's producer route, or a waypoint Gateway), in the order
// of the route's parentRefs. Parents is empty for a route with none.
type RouteOutcome struct {
	Key        RouteKey
	Generation int64
	Parents    []ParentOutcome
}

// ParentOutcome is a route's standing with one parentRef: the conditions
// Accepted and ResolvedRefs, with Gateway API's reasons, and
// ObservedGeneration set (LastTransitionTime is the status writer's).
type ParentOutcome struct {
	Ref gwv1.ParentReference
	// Controller is the controllerName of the entry: empty for the
	// status writer's own (the waypoint controller's), or
	// apinames.GatewayController for an ingress Gateway parent.
	Controller gwv1.GatewayController
	Conditions []metav1.Condition
}

// Report is what building one waypoint found besides its resources.
type Report struct {
	// Notes are the problems found, one line each, for the log.
	Notes []string
	// routes are the routes the build translated.
	routes map[RouteKey]*routeReport
}

// routeReport is what translating a route found.
type routeReport struct {
	// attached maps the index of each parentRef that attached the route to
	// a port of a bound Service to the waypoint that serves it.
	attached map[int]string
	// refs are the problems with the route's references (ResolvedRefs),
	// unsupported the values the mesh does not implement (Accepted); each
	// problem once, in the order found.
	refs, unsupported []problem
	// rejected maps the index of a parentRef that would attach a TCPRoute
	// but does not (another TCPRoute applies, or the route's rules cannot
	// be applied) to why, for its Accepted condition.
	rejected map[int]problem
	// ingress are the indexes of the parentRefs that name an ingress
	// Gateway: attached or rejected there by Gateway API's rules.
	ingress map[int]bool
}

func (r *routeReport) markIngress(parent int) {
	if r.ingress == nil {
		r.ingress = map[int]bool{}
	}
	r.ingress[parent] = true
}

func (r *routeReport) ingressAt(i int) bool { return r != nil && r.ingress[i] }

type problem struct {
	reason  gwv1.RouteConditionReason
	message string
}

func (r *routeReport) attach(parent int, waypoint string) {
	if r.attached == nil {
		r.attached = map[int]string{}
	}
	r.attached[parent] = waypoint
}

// unattach takes back an attachment (a TCPRoute another shadows).
func (r *routeReport) unattach(parent int) { delete(r.attached, parent) }

func (r *routeReport) reject(parent int, p problem) {
	if r.rejected == nil {
		r.rejected = map[int]problem{}
	}
	if _, ok := r.rejected[parent]; !ok {
		r.rejected[parent] = p
	}
}

func addProblem(ps []problem, p problem) []problem {
	for _, q := range ps {
		if q == p {
			return ps
		}
	}
	return append(ps, p)
}

// merge adds what another waypoint's build found about the same route.
func (r *routeReport) merge(o *routeReport) {
	for i, wp := range o.attached {
		r.attach(i, wp)
	}
	for _, p := range o.refs {
		r.refs = addProblem(r.refs, p)
	}
	for _, p := range o.unsupported {
		r.unsupported = addProblem(r.unsupported, p)
	}
	for i, p := range o.rejected {
		r.reject(i, p)
	}
	for i := range o.ingress {
		r.markIngress(i)
	}
}

func (s *source) id() RouteKey { return RouteKey{Kind: s.kind, Namespace: s.ns, Name: s.name} }

// report is the route's report in this build.
func (b *builder) report(src *source) *routeReport {
	if b.routes == nil {
		b.routes = map[RouteKey]*routeReport{}
	}
	r := b.routes[src.id()]
	if r == nil {
		r = &routeReport{}
		b.routes[src.id()] = r
	}
	return r
}

// refProblem records a reference of the route that cannot be used, for its
// ResolvedRefs condition and the log.
func (b *builder) refProblem(src *source, reason gwv1.RouteConditionReason, format string, args ...any) {
	p := problem{reason, fmt.Sprintf(format, args...)}
	r := b.report(src)
	r.refs = addProblem(r.refs, p)
	b.note("%s %s: %s", src.kind, src.key, p.message)
}

// unsupported records a value of the route the mesh does not implement, for
// its Accepted condition (Gateway API's UnsupportedValue) and the log.
func (b *builder) unsupported(src *source, format string, args ...any) {
	p := problem{gwv1.RouteReasonUnsupportedValue, fmt.Sprintf(format, args...)}
	r := b.report(src)
	r.unsupported = addProblem(r.unsupported, p)
	b.note("%s %s: %s", src.kind, src.key, p.message)
}

// translateRules runs a route's rules through the translation without a
// waypoint, for what it finds: the problems of a route no waypoint serves.
func translateRules(mesh Mesh, st Stores, src *source) *routeReport {
	b := &builder{mesh: mesh.withDefaults(), st: st, clusters: map[string]clusterRef{}}
	for i := range src.rules {
		ru := &src.rules[i]
		for _, m := range ru.matchesOrAll() {
			b.envoyRoute(src, ru, m)
		}
	}
	return b.report(src)
}

// Outcomes computes every route's outcome from the reports of the
// waypoints' builds: a parentRef that attached the route to a waypoint is
// Accepted (unless the route uses a value the mesh does not implement), one
// that did not says why not; ResolvedRefs says which backends cannot be
// used. waypoints are the waypoints by key ("<namespace>/<name>").
func Outcomes(mesh Mesh, st Stores, waypoints map[string]*ambient.Waypoint, reports []Report) []RouteOutcome {
	merged := map[RouteKey]*routeReport{}
	for _, rep := range reports {
		for k, r := range rep.routes {
			if merged[k] == nil {
				merged[k] = &routeReport{}
			}
			merged[k].merge(r)
		}
	}
	o := outcomes{mesh: mesh, st: st, waypoints: waypoints, reports: merged}
	var out []RouteOutcome
	for _, obj := range list(st.HTTPRoutes) {
		r := obj.(*gwv1.HTTPRoute)
		out = append(out, o.route(httpSource(r), r.Generation, r.Spec.ParentRefs))
	}
	for _, obj := range list(st.GRPCRoutes) {
		r := obj.(*gwv1.GRPCRoute)
		out = append(out, o.route(grpcSource(r), r.Generation, r.Spec.ParentRefs))
	}
	for _, obj := range list(st.TCPRoutes) {
		r := obj.(*gwv1.TCPRoute)
		out = append(out, o.route(tcpSource(r), r.Generation, r.Spec.ParentRefs))
	}
	for _, obj := range list(st.TLSRoutes) {
		r := obj.(*gwv1.TLSRoute)
		out = append(out, o.route(tlsSource(r), r.Generation, r.Spec.ParentRefs))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out
}

func list(s interface{ List() []any }) []any {
	if s == nil {
		return nil
	}
	return s.List()
}

type outcomes struct {
	mesh      Mesh
	st        Stores
	waypoints map[string]*ambient.Waypoint
	reports   map[RouteKey]*routeReport
}

func (o *outcomes) route(src *source, gen int64, refs []gwv1.ParentReference) RouteOutcome {
	out := RouteOutcome{Key: src.id(), Generation: gen}
	rep := o.reports[src.id()]
	for i, ref := range refs {
		var accepted *metav1.Condition
		var controller gwv1.GatewayController
		switch {
		case rep.ingressAt(i):
			accepted, controller = ingressParent(rep, i), apinames.GatewayController
		case src.kind == kindTLSRoute && (serviceParent(ref) || entryParent(ref)):
			accepted = &metav1.Condition{Status: metav1.ConditionFalse, Reason: string(gwv1.RouteReasonUnsupportedValue),
				Message: "waypoints do not apply TLSRoutes: a TLSRoute attaches to an ingress Gateway's TLS listener; route a Service's TLS with a TCPRoute"}
		case serviceParent(ref):
			accepted = o.serviceParent(src, rep, i, ref)
		case entryParent(ref):
			accepted = o.entryParent(src, rep, i, ref)
		case o.waypointParent(src, ref):
			accepted = &metav1.Condition{Status: metav1.ConditionFalse, Reason: string(gwv1.RouteReasonNotAllowedByListeners),
				Message: "a waypoint's HBONE listener takes no routes: attach the route to a Service (parentRef group \"\", kind Service)"}
		default:
			continue // another controller's parent
		}
		if rep == nil {
			rep = translateRules(o.mesh, o.st, src)
		}
		accepted.Type, accepted.ObservedGeneration = string(gwv1.RouteConditionAccepted), gen
		out.Parents = append(out.Parents, ParentOutcome{Ref: ref, Controller: controller, Conditions: []metav1.Condition{*accepted, resolvedRefs(rep, gen)}})
	}
	return out
}

// ingressParent is the Accepted condition of a parentRef to an ingress
// Gateway: attached to some of its listeners, or why not.
func ingressParent(rep *routeReport, i int) *metav1.Condition {
	if gw, ok := rep.attachedTo(i); ok {
		if len(rep.unsupported) > 0 {
			return &metav1.Condition{Status: metav1.ConditionFalse, Reason: string(gwv1.RouteReasonUnsupportedValue), Message: joinProblems(rep.unsupported)}
		}
		return &metav1.Condition{Status: metav1.ConditionTrue, Reason: string(gwv1.RouteReasonAccepted), Message: "attached to Gateway " + gw}
	}
	p, _ := rep.rejectedAt(i)
	return &metav1.Condition{Status: metav1.ConditionFalse, Reason: string(p.reason), Message: p.message}
}

// resolvedRefs is the ResolvedRefs condition of a route's report: the
// first problem's reason, every problem's message.
func resolvedRefs(rep *routeReport, gen int64) metav1.Condition {
	c := metav1.Condition{Type: string(gwv1.RouteConditionResolvedRefs), ObservedGeneration: gen, Status: metav1.ConditionTrue,
		Reason: string(gwv1.RouteReasonResolvedRefs), Message: "all references resolved"}
	if len(rep.refs) > 0 {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(rep.refs[0].reason), joinProblems(rep.refs)
	}
	return c
}

func joinProblems(ps []problem) string {
	msgs := make([]string, len(ps))
	for i, p := range ps {
		msgs[i] = p.message
	}
	return strings.Join(msgs, "; ")
}

// waypointParent reports whether ref names a waypoint Gateway.
func (o *outcomes) waypointParent(src *source, ref gwv1.ParentReference) bool {
	if (ref.Group != nil && string(*ref.Group) != gwv1.GroupName) || (ref.Kind != nil && *ref.Kind != "Gateway") {
		return false
	}
	ns := src.ns
	if ref.Namespace != nil {
		ns = string(*ref.Namespace)
	}
	return o.waypoints[ns+"/"+string(ref.Name)] != nil
}

// serviceParent is the Accepted condition of a Service parentRef.
func (o *outcomes) serviceParent(src *source, rep *routeReport, i int, ref gwv1.ParentReference) *metav1.Condition {
	ns := src.ns
	if ref.Namespace != nil {
		ns = string(*ref.Namespace)
	}
	no := func(reason gwv1.RouteConditionReason, format string, args ...any) *metav1.Condition {
		return &metav1.Condition{Status: metav1.ConditionFalse, Reason: string(reason), Message: fmt.Sprintf(format, args...)}
	}
	if ns != src.ns {
		return no(gwv1.RouteReasonUnsupportedValue,
			"parent Service %s/%s is in another namespace: routes for another namespace's Service (consumer routes) are not supported", ns, ref.Name)
	}
	svc := get[corev1.Service](o.st.Services, ns+"/"+string(ref.Name))
	if svc == nil {
		return no(gwv1.RouteReasonNoMatchingParent, "parent Service %s/%s not found", ns, ref.Name)
	}
	if wp, ok := rep.attachedTo(i); ok {
		if rep != nil && len(rep.unsupported) > 0 {
			return no(gwv1.RouteReasonUnsupportedValue, "%s", joinProblems(rep.unsupported))
		}
		return &metav1.Condition{Status: metav1.ConditionTrue, Reason: string(gwv1.RouteReasonAccepted),
			Message: fmt.Sprintf("routes traffic to Service %s/%s through waypoint %s", ns, ref.Name, wp)}
	}
	if p, ok := rep.rejectedAt(i); ok {
		return no(p.reason, "%s", p.message)
	}
	reason, msg := o.whyNotServed(src.kind, svc, ref)
	return no(reason, "%s", msg)
}

func (r *routeReport) rejectedAt(i int) (problem, bool) {
	if r == nil {
		return problem{}, false
	}
	p, ok := r.rejected[i]
	return p, ok
}

func (r *routeReport) attachedTo(i int) (string, bool) {
	if r == nil {
		return "", false
	}
	wp, ok := r.attached[i]
	return wp, ok
}

// whyNotServed says why no waypoint took a route for a Service port: the
// rules of boundServices and service, in their order. A waypoint whose
// owner does not admit the Service's namespace is NotAllowedByListeners,
// every other case NoMatchingParent.
func (o *outcomes) whyNotServed(kind string, svc *corev1.Service, ref gwv1.ParentReference) (gwv1.RouteConditionReason, string) {
	name := svc.Namespace + "/" + svc.Name
	nsl := nsLabels(o.st.Namespaces, svc.Namespace)
	bind := ambient.BindingFor(svc.Namespace, svc.Labels, nsl)
	// fits: a port of the kind the route applies to (an HTTP chain for
	// HTTP and gRPC routes, a TCP chain for TCP routes).
	var fits, matched bool
	for _, p := range svc.Spec.Ports {
		if (ref.Port == nil || int32(*ref.Port) == p.Port) && (ref.SectionName == nil || string(*ref.SectionName) == p.Name) {
			matched = true
			stream := p.Protocol == "" || p.Protocol == corev1.ProtocolTCP
			if kind == kindTCPRoute {
				fits = fits || (stream && portKind(p) != portHTTP)
			} else {
				fits = fits || (stream && portKind(p) != portTCP)
			}
		}
	}
	none := gwv1.RouteReasonNoMatchingParent
	switch {
	case !matched:
		return none, fmt.Sprintf("Service %s has no port that the parentRef names", name)
	case svc.Spec.Type == corev1.ServiceTypeExternalName || svc.Labels[label.IoK8sNetworkingGatewayGatewayName.Name] != "":
		return none, fmt.Sprintf("Service %s is an ExternalName or a gateway's own Service: no waypoint serves it", name)
	case bind.Key == "":
		return none, fmt.Sprintf("Service %s uses no waypoint: label it, or its namespace, %s=<waypoint name>", name, label.IoIstioUseWaypoint.Name)
	}
	if r := ambient.Check(bind, o.waypoints[bind.Key], apinames.WaypointForService, svc.Namespace, nsl); r != nil {
		if r.Reason == ambient.ReasonAttachmentDenied {
			none = gwv1.RouteReasonNotAllowedByListeners
		}
		return none, "Service " + name + " is not bound to its waypoint: " + r.Message
	}
	switch {
	case len(serviceIPs(svc)) == 0:
		return none, fmt.Sprintf("Service %s is headless: its pods are reached directly, not through the waypoint", name)
	case !fits && kind == kindTCPRoute:
		return none, fmt.Sprintf("the parentRef names only HTTP ports of Service %s (by appProtocol or port name), which the waypoint parses as HTTP: the TCPRoute is not applied; route them with an HTTPRoute or GRPCRoute", name)
	case !fits:
		return none, fmt.Sprintf("the parentRef names only TCP ports of Service %s (by appProtocol or port name): HTTP and gRPC routes apply to HTTP ports", name)
	}
	return none, fmt.Sprintf("waypoint %s has not taken Service %s yet", bind.Key, name)
}
