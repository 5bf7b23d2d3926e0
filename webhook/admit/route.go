package admit

import (
	"fmt"
	"strconv"
	"strings"

	"istio.io/api/label"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/internal/apinames"
)

// validateRoute checks the Service parents of an HTTPRoute or GRPCRoute:
// the mesh (GAMMA) attachment a waypoint applies.
func (a *Admitter) validateRoute(rv *review) {
	var parents []gwv1.ParentReference
	var ns string
	if rv.req.Kind.Kind == "GRPCRoute" {
		var r gwv1.GRPCRoute
		if !rv.decodeObject(&r, nil) {
			return
		}
		parents, ns = r.Spec.ParentRefs, r.Namespace
	} else {
		var r gwv1.HTTPRoute
		if !rv.decodeObject(&r, nil) {
			return
		}
		parents, ns = r.Spec.ParentRefs, r.Namespace
	}
	if !a.checkServiceParents(rv, parents, ns) {
		rv.rep.skip()
	}
}

// checkServiceParents checks every Service parent of a route in namespace
// ns (the request's, when it names one) and reports whether there was any:
// a route without is not the mesh's and is left alone.
func (a *Admitter) checkServiceParents(rv *review, parents []gwv1.ParentReference, ns string) bool {
	if rv.req.Namespace != "" {
		ns = rv.req.Namespace
	}
	any := false
	for i, p := range parents {
		if p.Kind == nil || *p.Kind != "Service" {
			continue
		}
		any = true
		a.checkServiceParent(rv, fmt.Sprintf("spec.parentRefs[%d]", i), p, ns)
	}
	return any
}

func (a *Admitter) checkServiceParent(rv *review, field string, p gwv1.ParentReference, home string) {
	rep := &rv.rep
	if p.Group == nil || (*p.Group != "" && *p.Group != "core") {
		g := gwv1.GroupName
		if p.Group != nil {
			g = string(*p.Group)
		}
		rep.deny("route-service-parent", field+".group", "a Service parent has group \"\" (core), not %s; set group: \"\"", q(g))
		return
	}
	ns := home
	if p.Namespace != nil && *p.Namespace != "" {
		ns = string(*p.Namespace)
	}
	name := string(p.Name)
	if ns != home {
		rep.warn("route-consumer", field+".namespace", "a Service parent in another namespace is a consumer route, which waypoints don't apply")
		return
	}
	svc, err := a.cfg.Services.Service(ns, name)
	switch {
	case apierrors.IsNotFound(err):
		rep.warn("route-service-missing", field+".name", "Service %s/%s does not exist yet; the route applies once it does", ns, name)
		return
	case err != nil:
		rep.fail("service-lookup-failed", "looking up Service %s/%s: %v; retry", ns, name, err)
		return
	}
	if p.Port != nil && !hasPort(svc, func(sp corev1.ServicePort) bool { return sp.Port == int32(*p.Port) }) {
		rep.deny("route-service-port", field+".port", "Service %s/%s has no port %d (it has %s); use one of those or remove port",
			ns, name, *p.Port, portList(svc, false))
	}
	if p.SectionName != nil && !hasPort(svc, func(sp corev1.ServicePort) bool { return sp.Name == string(*p.SectionName) }) {
		rep.deny("route-service-port", field+".sectionName", "Service %s/%s has no port named %s (it has %s); use one of those or remove sectionName",
			ns, name, q(string(*p.SectionName)), portList(svc, true))
	}
	bound, ok := svc.Labels[label.IoIstioUseWaypoint.Name]
	if !ok {
		if n, err := a.cfg.Namespaces.Namespace(ns); err == nil {
			bound = n.Labels[label.IoIstioUseWaypoint.Name]
		}
	}
	switch bound {
	case "":
		rep.warn("route-no-waypoint", field, "Service %s/%s uses no waypoint, so nothing applies this route; label it istio.io/use-waypoint", ns, name)
	case apinames.WaypointNone:
		rep.warn("route-no-waypoint", field, "Service %s/%s opts out of waypoints (use-waypoint=none), so nothing applies this route", ns, name)
	}
}

func hasPort(svc *corev1.Service, match func(corev1.ServicePort) bool) bool {
	for _, sp := range svc.Spec.Ports {
		if match(sp) {
			return true
		}
	}
	return false
}

func portList(svc *corev1.Service, names bool) string {
	if len(svc.Spec.Ports) == 0 {
		return "none"
	}
	var parts []string
	for _, sp := range svc.Spec.Ports {
		if names {
			if sp.Name != "" {
				parts = append(parts, strconv.Quote(sp.Name))
			}
		} else {
			parts = append(parts, strconv.Itoa(int(sp.Port)))
		}
	}
	if len(parts) == 0 {
		return "no named ports"
	}
	return clip(strings.Join(parts, ", "), 200)
}

// routeParents is the part of any Gateway API route that names its
// parents.
type routeParents struct {
	Spec struct {
		ParentRefs []gwv1.ParentReference `json:"parentRefs"`
	} `json:"spec"`
}

// validateTCPRoute checks a TCPRoute with Service parents, which the
// waypoint applies to the Service's TCP ports: its parents as an
// HTTPRoute's, and its one rule's backends, which must be Services with a
// port.
func (a *Admitter) validateTCPRoute(rv *review) {
	var r gwv1.TCPRoute
	if !rv.decodeObject(&r, nil) {
		return
	}
	ns := r.Namespace
	if rv.req.Namespace != "" {
		ns = rv.req.Namespace
	}
	if !a.checkServiceParents(rv, r.Spec.ParentRefs, ns) {
		rv.rep.skip()
		return
	}
	if len(r.Spec.Rules) != 1 {
		rv.rep.deny("route-tcp-rules", "spec.rules", "a TCPRoute of a Service has exactly one rule (it has %d): a stream has nothing that tells rules apart; put every backend in one rule", len(r.Spec.Rules))
		return
	}
	weighted := false
	for i, br := range r.Spec.Rules[0].BackendRefs {
		checkTCPBackend(rv, fmt.Sprintf("spec.rules[0].backendRefs[%d]", i), br.BackendObjectReference, ns)
		weighted = weighted || br.Weight == nil || *br.Weight > 0
	}
	if !weighted {
		rv.rep.warn("route-tcp-no-weight", "spec.rules[0].backendRefs", "no backend has a weight above 0, so the waypoint refuses every connection to the Service")
	}
}

// checkTCPBackend checks one backendRef of a TCPRoute: a Service with a
// port. One in another namespace is used only while a ReferenceGrant there
// allows it, which the route's status tells (the grant may come later).
func checkTCPBackend(rv *review, field string, ref gwv1.BackendObjectReference, home string) {
	rep := &rv.rep
	g, k := "", "Service"
	if ref.Group != nil {
		g = string(*ref.Group)
	}
	if ref.Kind != nil {
		k = string(*ref.Kind)
	}
	switch {
	case (g != "" && g != "core") || k != "Service":
		rep.deny("route-backend-kind", field+".kind", "a waypoint sends TCP only to Services: %s (group %s) is not supported; use kind Service, group \"\"", q(k), q(g))
	case ref.Port == nil:
		rep.deny("route-backend-port", field+".port", "a Service backend needs a port; set port to one of Service %s's ports", q(string(ref.Name)))
	case ref.Namespace != nil && string(*ref.Namespace) != home:
		rep.warn("route-backend-namespace", field+".namespace",
			"backend %s/%s is used only while a ReferenceGrant in %s allows it", *ref.Namespace, ref.Name, *ref.Namespace)
	}
}

// refuseMeshRoute refuses a route kind waypoints do not apply yet (TLSRoute,
// UDPRoute) when it names a Service parent, the mesh attachment: accepted,
// it would be dropped without a word. Routes of those kinds under a
// Gateway are another controller's business.
func (a *Admitter) refuseMeshRoute(rv *review) {
	var r routeParents // the rest of the route is not looked at
	if !rv.decodeObject(&r, nil) {
		return
	}
	any := false
	for i, p := range r.Spec.ParentRefs {
		if p.Kind == nil || *p.Kind != "Service" {
			continue
		}
		any = true
		rv.rep.deny("route-kind-unsupported", fmt.Sprintf("spec.parentRefs[%d]", i),
			"waypoints do not apply %ss yet, so this route would do nothing; route HTTP and gRPC with an HTTPRoute or GRPCRoute, TCP with a TCPRoute, and leave other traffic to the Service", rv.req.Kind.Kind)
	}
	if !any {
		rv.rep.skip()
	}
}
