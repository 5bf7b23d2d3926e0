package waypointxds

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/internal/apinames"
)

// GatewayKey is the xDS key of an ingress Gateway: the caller identity of
// its proxy, "<namespace>/<gateway>-istio" (its ServiceAccount).
func GatewayKey(namespace, name string) string {
	return namespace + "/" + name + apinames.GatewaySuffix
}

// Ingress reports whether gw is an ingress gateway this control plane
// configures: of class apinames.GatewayClass, whose GatewayClass (class;
// nil when there is none) exists and names apinames.GatewayController, as
// the deployer requires. Without the class (the chart installs it unless
// told not to) a Gateway of that name may be another controller's.
func Ingress(gw *gwv1.Gateway, class *gwv1.GatewayClass) bool {
	if gw == nil || class == nil || string(gw.Spec.GatewayClassName) != apinames.GatewayClass {
		return false
	}
	return string(class.Spec.ControllerName) == apinames.GatewayController
}

// GatewayReport is what building an ingress Gateway found besides its
// resources: the routes' reports (for Outcomes) and the status of each of
// its listeners.
type GatewayReport struct {
	Report
	// Listeners are the Gateway's status.listeners, in the order of its
	// spec: supportedKinds, attachedRoutes and the conditions Accepted,
	// ResolvedRefs, Conflicted and Programmed, with ObservedGeneration set
	// and LastTransitionTime left to the writer.
	Listeners []gwv1.ListenerStatus
}

// lcond is one listener condition being computed.
type lcond struct {
	ok      bool
	reason  gwv1.ListenerConditionReason
	message string
}

func yes(reason gwv1.ListenerConditionReason, format string, args ...any) lcond {
	return lcond{true, reason, fmt.Sprintf(format, args...)}
}

func no(reason gwv1.ListenerConditionReason, format string, args ...any) lcond {
	return lcond{false, reason, fmt.Sprintf(format, args...)}
}

// gwListener is one listener of the Gateway as the translation sees it.
type gwListener struct {
	spec gwv1.Listener
	// hostname is the listener's, lower-case; "" takes any.
	hostname string
	kinds    []gwv1.RouteGroupKind
	// accepted and resolved are the Accepted and ResolvedRefs conditions;
	// conflicted.ok is Conflicted True.
	accepted, resolved, conflicted lcond
	// attachment is the namespaces its allowedRoutes admit.
	attachment ambient.Attachment
	certs      []*tlsv3.TlsCertificate
	// routes attached, in the order found, each once.
	routes []attachedRoute
}

// attachedRoute is a route attached to a listener, with the hostnames it
// serves there (the intersection of the listener's and the route's).
type attachedRoute struct {
	src   *source
	hosts []string
	// parents are the indexes of the parentRefs that attached it.
	parents []int
}

// usable reports whether routes attach to the listener.
func (l *gwListener) usable() bool { return l.accepted.ok && !l.conflicted.ok }

// served reports whether the listener gets a filter chain: a listener
// that ends TLS only with a usable certificate.
func (l *gwListener) served() bool {
	return l.usable() && (!l.terminates() || len(l.certs) > 0)
}

// terminates reports whether the listener ends TLS: HTTPS, or TLS in mode
// Terminate (Gateway API's default mode).
func (l *gwListener) terminates() bool {
	switch l.spec.Protocol {
	case gwv1.HTTPSProtocolType:
		return true
	case gwv1.TLSProtocolType:
		return tlsMode(l.spec.TLS) == gwv1.TLSModeTerminate
	}
	return false
}

// tlsMode is a listener's tls.mode, Terminate when it names none (the
// API's default).
func tlsMode(t *gwv1.ListenerTLSConfig) gwv1.TLSModeType {
	if t == nil || t.Mode == nil {
		return gwv1.TLSModeTerminate
	}
	return *t.Mode
}

// tlsClass reports whether the listener is one of a port's TLS listeners
// (HTTPS or TLS), whose chains the ClientHello's server name selects.
func (l *gwListener) tlsClass() bool {
	return l.spec.Protocol == gwv1.HTTPSProtocolType || l.spec.Protocol == gwv1.TLSProtocolType
}

func (l *gwListener) admits(kind, ns, home string, nsLabels map[string]string) bool {
	if !kindIn(l.kinds, kind) {
		return false
	}
	return l.attachment.Allows(home, ns, nsLabels)
}

func kindIn(kinds []gwv1.RouteGroupKind, kind string) bool {
	for _, k := range kinds {
		if string(k.Kind) == kind {
			return true // every kind listed is of group gateway.networking.k8s.io
		}
	}
	return false
}

// gatewayBuild holds one ingress Gateway's translation.
type gatewayBuild struct {
	b         *builder
	gw        *gwv1.Gateway
	listeners []*gwListener
	// named are the routes with a parentRef to the Gateway; translated
	// those whose rules went into a RouteConfiguration.
	named      []*source
	translated map[RouteKey]bool
}

// BuildGateway computes the resources of an ingress Gateway (package doc,
// "Ingress gateways"): one Listener per port of its HTTP, HTTPS, TLS and
// TCP listeners, their RouteConfigurations from the HTTPRoutes and
// GRPCRoutes attached to them (tcp_proxy for TCPRoutes and TLSRoutes),
// the Clusters and ClusterLoadAssignments of their backends and the RBAC
// filters of the AuthorizationPolicies that target the Gateway. It
// reports the listeners' status and what became of the routes that name
// the Gateway (see Outcomes).
func BuildGateway(mesh Mesh, gw *gwv1.Gateway, st Stores) (Resources, GatewayReport) {
	b := &builder{mesh: mesh.withDefaults(), st: st, res: Resources{}, clusters: map[string]clusterRef{},
		wp: &ambient.Waypoint{Namespace: gw.Namespace, Name: gw.Name}, ingress: true}
	g := &gatewayBuild{b: b, gw: gw, translated: map[RouteKey]bool{}}
	if gw.Spec.TLS != nil && gw.Spec.TLS.Backend != nil {
		b.note("Gateway %s/%s: spec.tls.backend (a client certificate for backends) is not supported; backends are reached in plain TCP or over HBONE", gw.Namespace, gw.Name)
	}
	for _, l := range gw.Spec.Listeners {
		g.listeners = append(g.listeners, g.listener(l))
	}
	g.conflicts()
	g.attachRoutes()
	g.tcpRoutes()
	g.tlsRoutes()
	g.emit(b.policies())
	for _, src := range g.named {
		if !g.translated[src.id()] {
			b.report(src).merge(translateRules(mesh, st, src))
		}
	}
	for _, name := range sortedKeys(b.clusters) {
		b.cluster(name, b.clusters[name])
	}
	if b.needBlackHole {
		b.blackHoleCluster()
	}
	return b.res, GatewayReport{Report: Report{Notes: b.notes, routes: b.routes}, Listeners: g.status()}
}

// listener checks one listener's protocol, route kinds, namespaces and
// certificates.
func (g *gatewayBuild) listener(l gwv1.Listener) *gwListener {
	gl := &gwListener{spec: l, kinds: []gwv1.RouteGroupKind{},
		accepted: yes(gwv1.ListenerReasonAccepted, "listener accepted"),
		resolved: yes(gwv1.ListenerReasonResolvedRefs, "all references resolved")}
	if l.Hostname != nil {
		gl.hostname = strings.ToLower(string(*l.Hostname))
	}
	supported := []gwv1.Kind{kindHTTPRoute, kindGRPCRoute}
	switch l.Protocol {
	case gwv1.HTTPProtocolType, gwv1.HTTPSProtocolType:
	case gwv1.TCPProtocolType:
		supported, gl.hostname = []gwv1.Kind{kindTCPRoute}, "" // a TCP listener's hostname is ignored
	case gwv1.TLSProtocolType:
		// A mode not served takes no kind (Gateway API's conformance
		// suite expects supportedKinds empty then).
		if tlsListenerMode(gl); !gl.accepted.ok {
			return gl
		}
		supported = []gwv1.Kind{kindTLSRoute}
	default:
		gl.accepted = no(gwv1.ListenerReasonUnsupportedProtocol, "protocol %s is not supported: ingress gateways serve HTTP, HTTPS, TLS and TCP listeners", l.Protocol)
		return gl
	}
	gl.kinds, gl.resolved = routeKinds(l, supported)
	var ok bool
	if gl.attachment, ok = ambient.ListenerAttachment(l); !ok {
		gl.accepted = no(gwv1.ListenerReasonUnsupportedValue, "allowedRoutes.namespaces.selector is missing or invalid: it selects no namespace")
	}
	switch {
	case l.Protocol == gwv1.HTTPProtocolType && l.TLS != nil:
		gl.accepted = no(gwv1.ListenerReasonUnsupportedValue, "an HTTP listener takes no tls: use protocol HTTPS")
	case l.Protocol == gwv1.HTTPSProtocolType && tlsMode(l.TLS) != gwv1.TLSModeTerminate:
		gl.accepted = no(gwv1.ListenerReasonUnsupportedValue, "tls.mode %s: an HTTPS listener terminates TLS (use protocol TLS for Passthrough)", tlsMode(l.TLS))
	case gl.terminates():
		g.tls(gl)
	}
	return gl
}

var routeGroup = gwv1.Group(gwv1.GroupName)

// routeKinds is the kinds of route a listener takes of those its protocol
// supports, and its ResolvedRefs condition (InvalidRouteKinds when it
// lists another kind).
func routeKinds(l gwv1.Listener, supported []gwv1.Kind) ([]gwv1.RouteGroupKind, lcond) {
	ok := yes(gwv1.ListenerReasonResolvedRefs, "all references resolved")
	out := []gwv1.RouteGroupKind{}
	if l.AllowedRoutes == nil || len(l.AllowedRoutes.Kinds) == 0 {
		for _, k := range supported {
			out = append(out, gwv1.RouteGroupKind{Group: &routeGroup, Kind: k})
		}
		return out, ok
	}
	var bad []string
	for _, k := range l.AllowedRoutes.Kinds {
		group := gwv1.GroupName
		if k.Group != nil {
			group = string(*k.Group)
		}
		switch {
		case group != gwv1.GroupName || !slices.Contains(supported, k.Kind):
			bad = append(bad, group+"/"+string(k.Kind))
		case !kindIn(out, string(k.Kind)):
			out = append(out, gwv1.RouteGroupKind{Group: &routeGroup, Kind: k.Kind})
		}
	}
	if len(bad) > 0 {
		names := make([]string, len(supported))
		for i, k := range supported {
			names[i] = string(k)
		}
		return out, no(gwv1.ListenerReasonInvalidRouteKinds, "route kinds %s are not supported on a %s listener (%s are)",
			strings.Join(bad, ", "), l.Protocol, strings.Join(names, ", "))
	}
	return out, ok
}

// tls checks the TLS settings of a listener that ends TLS (HTTPS, or TLS
// in mode Terminate) and resolves its certificates.
func (g *gatewayBuild) tls(gl *gwListener) {
	t := gl.spec.TLS
	switch {
	case t != nil && len(t.Options) > 0:
		gl.accepted = no(gwv1.ListenerReasonUnsupportedValue, "tls.options are not supported (%s)", optionNames(t.Options))
		return
	case g.gw.Spec.TLS != nil && g.gw.Spec.TLS.Frontend != nil:
		gl.accepted = no(gwv1.ListenerReasonUnsupportedValue, "the Gateway's spec.tls.frontend (client certificate validation) is not supported")
		return
	case t == nil || len(t.CertificateRefs) == 0:
		gl.resolved = no(gwv1.ListenerReasonInvalidCertificateRef, "a %s listener that terminates TLS needs tls.certificateRefs", gl.spec.Protocol)
		return
	}
	for _, ref := range t.CertificateRefs {
		c, bad := g.certificate(ref)
		if bad != nil {
			gl.resolved, gl.certs = *bad, nil
			return
		}
		gl.certs = append(gl.certs, c)
	}
}

func optionNames(m map[gwv1.AnnotationKey]gwv1.AnnotationValue) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, string(k))
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// conflicts marks the listeners that clash with an earlier one of the same
// port: the first listener of a port sets its protocol (HTTPS and TLS go
// together), and a later one of the same kind with the same hostname (or
// none, twice) is a hostname conflict. The first keeps the port.
func (g *gatewayBuild) conflicts() {
	type port struct {
		class string
		hosts map[string]string // hostname → listener name
	}
	ports := map[gwv1.PortNumber]*port{}
	for _, gl := range g.listeners {
		class := string(gl.spec.Protocol)
		if gl.spec.Protocol == gwv1.HTTPSProtocolType {
			class = string(gwv1.TLSProtocolType)
		}
		p := ports[gl.spec.Port]
		if p == nil {
			p = &port{class: class, hosts: map[string]string{}}
			ports[gl.spec.Port] = p
		}
		if p.class != class {
			gl.conflicted = yes(gwv1.ListenerReasonProtocolConflict, "port %d is taken by an earlier listener of protocol %s", gl.spec.Port, p.class)
			continue
		}
		if other, ok := p.hosts[gl.hostname]; ok {
			gl.conflicted = yes(gwv1.ListenerReasonHostnameConflict, "listener %s has the same port %d and hostname %q", other, gl.spec.Port, gl.hostname)
			continue
		}
		p.hosts[gl.hostname] = string(gl.spec.Name)
	}
	for _, gl := range g.listeners {
		if !gl.conflicted.ok {
			gl.conflicted = no(gwv1.ListenerReasonNoConflicts, "no conflicts")
		}
	}
}

// namesGateway reports whether a route's parentRef names the Gateway (group
// and kind default to Gateway's, namespace to the route's).
func (g *gatewayBuild) namesGateway(routeNS string, ref gwv1.ParentReference) bool {
	if (ref.Group != nil && string(*ref.Group) != gwv1.GroupName) || (ref.Kind != nil && *ref.Kind != "Gateway") {
		return false
	}
	ns := routeNS
	if ref.Namespace != nil {
		ns = string(*ref.Namespace)
	}
	return ns == g.gw.Namespace && string(ref.Name) == g.gw.Name
}

// attachRoutes attaches every route that names the Gateway to the
// listeners that take it, and records each parentRef's standing.
func (g *gatewayBuild) attachRoutes() {
	var srcs []*source
	var refs [][]gwv1.ParentReference
	for _, o := range list(g.b.st.HTTPRoutes) {
		r := o.(*gwv1.HTTPRoute)
		srcs, refs = append(srcs, httpSource(r)), append(refs, r.Spec.ParentRefs)
	}
	for _, o := range list(g.b.st.GRPCRoutes) {
		r := o.(*gwv1.GRPCRoute)
		srcs, refs = append(srcs, grpcSource(r)), append(refs, r.Spec.ParentRefs)
	}
	for _, o := range list(g.b.st.TCPRoutes) {
		r := o.(*gwv1.TCPRoute)
		srcs, refs = append(srcs, tcpSource(r)), append(refs, r.Spec.ParentRefs)
	}
	for _, o := range list(g.b.st.TLSRoutes) {
		r := o.(*gwv1.TLSRoute)
		srcs, refs = append(srcs, tlsSource(r)), append(refs, r.Spec.ParentRefs)
	}
	order := make([]int, len(srcs))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(i, j int) bool { return srcs[order[i]].id().String() < srcs[order[j]].id().String() })
	for _, i := range order {
		g.attach(srcs[i], refs[i])
	}
}

func (g *gatewayBuild) attach(src *source, refs []gwv1.ParentReference) {
	named := false
	for i, ref := range refs {
		if !g.namesGateway(src.ns, ref) {
			continue
		}
		named = true
		rep := g.b.report(src)
		rep.markIngress(i)
		matched, p := g.match(src, ref)
		if p != nil {
			rep.reject(i, *p)
			continue
		}
		for _, m := range matched {
			m.l.add(src, i, m.hosts)
		}
		rep.attach(i, g.gw.Namespace+"/"+g.gw.Name)
	}
	if named {
		g.named = append(g.named, src)
	}
}

func (l *gwListener) add(src *source, parent int, hosts []string) {
	for i := range l.routes {
		if ar := &l.routes[i]; ar.src.id() == src.id() {
			for _, h := range hosts {
				if !slices.Contains(ar.hosts, h) {
					ar.hosts = append(ar.hosts, h)
				}
			}
			ar.parents = append(ar.parents, parent)
			return
		}
	}
	l.routes = append(l.routes, attachedRoute{src: src, hosts: hosts, parents: []int{parent}})
}

type listenerMatch struct {
	l     *gwListener
	hosts []string
}

// match finds the listeners a parentRef attaches the route to, in Gateway
// API's order: the listeners it names (sectionName, port), then those that
// take the route's kind from its namespace, then those whose hostname
// intersects the route's. The first step that leaves none says why.
func (g *gatewayBuild) match(src *source, ref gwv1.ParentReference) ([]listenerMatch, *problem) {
	gwName := g.gw.Namespace + "/" + g.gw.Name
	var named []*gwListener
	for _, gl := range g.listeners {
		if (ref.SectionName == nil || *ref.SectionName == gl.spec.Name) && (ref.Port == nil || *ref.Port == gl.spec.Port) {
			named = append(named, gl)
		}
	}
	if len(named) == 0 {
		return nil, &problem{gwv1.RouteReasonNoMatchingParent, fmt.Sprintf("Gateway %s has no listener%s", gwName, describeRef(ref))}
	}
	nsl := nsLabels(g.b.st.Namespaces, src.ns)
	var allowed []*gwListener
	for _, gl := range named {
		if gl.usable() && gl.admits(src.kind, src.ns, g.gw.Namespace, nsl) {
			allowed = append(allowed, gl)
		}
	}
	if len(allowed) == 0 {
		return nil, &problem{gwv1.RouteReasonNotAllowedByListeners,
			fmt.Sprintf("no listener of Gateway %s that the parentRef names takes %ss from namespace %s (allowedRoutes, protocol, or the listener is not accepted or conflicted)", gwName, src.kind, src.ns)}
	}
	var out []listenerMatch
	for _, gl := range allowed {
		if hosts := intersectHostnames(gl.hostname, src.hostnames); len(hosts) > 0 {
			out = append(out, listenerMatch{gl, hosts})
		}
	}
	if len(out) == 0 {
		return nil, &problem{gwv1.RouteReasonNoMatchingListenerHostname,
			fmt.Sprintf("no hostname of the route intersects the hostname of a listener of Gateway %s that takes it", gwName)}
	}
	return out, nil
}

func describeRef(ref gwv1.ParentReference) string {
	var parts []string
	if ref.SectionName != nil {
		parts = append(parts, "named "+string(*ref.SectionName))
	}
	if ref.Port != nil {
		parts = append(parts, "on port "+strconv.Itoa(int(*ref.Port)))
	}
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, " ")
}

// intersectHostnames is what Gateway API serves of a route's hostnames on a
// listener: all of them under a listener without hostname, the listener's
// when the route has none ("*" for any when neither has), else each route
// hostname that equals the listener's or that its wildcard covers, and the
// listener's hostname when a route wildcard covers it. Nil: none. A bare
// "*" is no hostname (the API refuses it on both): it serves nothing rather
// than every host.
func intersectHostnames(listener string, route []gwv1.Hostname) []string {
	if listener == "*" {
		return nil
	}
	if len(route) == 0 {
		if listener == "" {
			return []string{"*"}
		}
		return []string{listener}
	}
	var out []string
	for _, rh := range route {
		h := strings.ToLower(string(rh))
		var got string
		switch {
		case h == "*":
			continue
		case listener == "" || h == listener || wildcardCovers(listener, h):
			got = h
		case wildcardCovers(h, listener):
			got = listener
		default:
			continue
		}
		if !slices.Contains(out, got) {
			out = append(out, got)
		}
	}
	return out
}

// wildcardCovers reports whether the wildcard hostname p ("*.example.com")
// covers h: a name with at least one more label before p's suffix, or a
// narrower wildcard. A wildcard never covers its own suffix.
func wildcardCovers(p, h string) bool {
	if !strings.HasPrefix(p, "*.") {
		return false
	}
	suffix := p[1:] // ".example.com"
	if strings.HasPrefix(h, "*.") {
		return len(h) > len(p) && strings.HasSuffix(h, suffix)
	}
	return len(h) > len(suffix) && strings.HasSuffix(h, suffix) && !strings.HasPrefix(h, ".")
}

// tcpRoutes keeps, of the TCPRoutes attached to each TCP listener, the one
// that applies: a stream has nothing that tells routes or rules apart, so
// of those with exactly one rule the oldest (then the first by
// namespace/name). The others are detached from that listener, and a
// parentRef left attached to no listener is Accepted=False (Conflicted or
// UnsupportedValue).
func (g *gatewayBuild) tcpRoutes() {
	d := detachments{}
	for _, gl := range g.listeners {
		if gl.spec.Protocol != gwv1.TCPProtocolType || len(gl.routes) == 0 {
			continue
		}
		sort.SliceStable(gl.routes, func(i, j int) bool { return older(gl.routes[i].src, gl.routes[j].src) })
		var win *attachedRoute
		for i := range gl.routes {
			ar := &gl.routes[i]
			switch {
			case len(ar.src.rules) != 1:
				d.lose(ar, oneRule(ar.src))
			case win != nil:
				d.lose(ar, problem{ReasonConflicted, fmt.Sprintf("TCPRoute %s applies to listener %s of Gateway %s/%s: of the TCPRoutes of a listener the oldest applies (then the first by namespace/name)",
					win.src.key, gl.spec.Name, g.gw.Namespace, g.gw.Name)})
			default:
				win = ar
				d.keep(ar)
			}
		}
		if win == nil {
			gl.routes = nil
		} else {
			gl.routes = []attachedRoute{*win}
		}
	}
	g.settle(d)
}

// oneRule is the problem of a stream route (TCPRoute, TLSRoute) without
// exactly one rule, which the schema asks for.
func oneRule(src *source) problem {
	return problem{gwv1.RouteReasonUnsupportedValue, fmt.Sprintf(
		"a %s has %d rules here; a stream has nothing that tells rules apart, so a %s must have exactly one", src.kind, len(src.rules), src.kind)}
}

// detachments are the parentRefs of stream routes that listeners dropped
// (with why) and those some listener kept.
type detachments struct {
	lost map[*source]map[int]problem
	kept map[RouteKey]map[int]bool
}

func (d *detachments) keep(ar *attachedRoute) {
	if d.kept == nil {
		d.kept = map[RouteKey]map[int]bool{}
	}
	if d.kept[ar.src.id()] == nil {
		d.kept[ar.src.id()] = map[int]bool{}
	}
	for _, i := range ar.parents {
		d.kept[ar.src.id()][i] = true
	}
}

func (d *detachments) lose(ar *attachedRoute, p problem) {
	if d.lost == nil {
		d.lost = map[*source]map[int]problem{}
	}
	if d.lost[ar.src] == nil {
		d.lost[ar.src] = map[int]problem{}
	}
	for _, i := range ar.parents {
		if _, ok := d.lost[ar.src][i]; !ok {
			d.lost[ar.src][i] = p
		}
	}
}

// settle takes back the attachment of every parentRef that no listener
// kept, and rejects it with why it was dropped.
func (g *gatewayBuild) settle(d detachments) {
	// In a fixed order: the notes (and their log line) must not change
	// from one build to the next.
	srcs := slices.Collect(maps.Keys(d.lost))
	sort.Slice(srcs, func(i, j int) bool { return srcs[i].id().String() < srcs[j].id().String() })
	for _, src := range srcs {
		ps := d.lost[src]
		rep := g.b.report(src)
		for _, i := range slices.Sorted(maps.Keys(ps)) {
			p := ps[i]
			if !d.kept[src.id()][i] {
				rep.unattach(i)
				rep.reject(i, p)
				g.b.note("%s %s: %s", src.kind, src.key, p.message)
			}
		}
	}
}

// gatewayPort is one port's listeners that get a filter chain.
type gatewayPort struct {
	port                  gwv1.PortNumber
	http, https, tcp, tls []*gwListener
	// held are the port's HTTPS and TLS listeners that take routes but
	// are not served (no usable certificate), whose hostname a chain
	// keeps (holdChain).
	held []*gwListener
}

// emit adds a Listener per port with served listeners: one HTTP chain for
// a port's HTTP listeners together, one TLS chain per HTTPS listener, one
// chain per TLSRoute of a TLS listener (ending TLS in Terminate mode).
func (g *gatewayBuild) emit(policies []*securityv1.AuthorizationPolicy) {
	ports := map[gwv1.PortNumber]*gatewayPort{}
	for _, gl := range g.listeners {
		if !gl.served() {
			continue
		}
		p := ports[gl.spec.Port]
		if p == nil {
			p = &gatewayPort{port: gl.spec.Port}
			ports[gl.spec.Port] = p
		}
		switch gl.spec.Protocol {
		case gwv1.HTTPSProtocolType:
			p.https = append(p.https, gl)
		case gwv1.TCPProtocolType:
			p.tcp = append(p.tcp, gl)
		case gwv1.TLSProtocolType:
			p.tls = append(p.tls, gl)
		default:
			p.http = append(p.http, gl)
		}
	}
	for _, gl := range g.listeners {
		if p := ports[gl.spec.Port]; p != nil && gl.usable() && gl.tlsClass() && !gl.served() && gl.hostname != "" {
			p.held = append(p.held, gl)
		}
	}
	nums := make([]int, 0, len(ports))
	for n := range ports {
		nums = append(nums, int(n))
	}
	sort.Ints(nums)
	filters := g.b.rbacFilters(policies, nil)
	for _, n := range nums {
		p := ports[gwv1.PortNumber(n)]
		port := strconv.Itoa(n)
		var chains []*listenerv3.FilterChain
		if len(p.http) > 0 {
			rds := "http." + port
			g.b.res.add(resource.RouteType, rds, g.routeConfig(rds, port, p.http))
			chains = append(chains, &listenerv3.FilterChain{Name: "http/" + port, Filters: []*listenerv3.Filter{g.b.gatewayManager(rds, filters)}})
		}
		for _, gl := range p.tcp { // one: a second is a hostname conflict
			chains = append(chains, tcpChain("tcp/"+port, nil, g.b.netRBACFilters(policies, nil), g.tcpProxy(port, gl)))
		}
		for _, gl := range p.https {
			rds := "https." + port + "." + string(gl.spec.Name)
			g.b.res.add(resource.RouteType, rds, g.routeConfig(rds, port, []*gwListener{gl}))
			chains = append(chains, g.httpsChain(port, gl, g.b.gatewayManager(rds, filters)))
		}
		for _, gl := range p.tls {
			chains = append(chains, g.tlsChains(port, gl, policies)...)
		}
		for _, gl := range p.held {
			chains = append(chains, g.holdChain(port, gl, policies))
		}
		if len(chains) == 0 {
			// TLS listeners without routes: the port is served, and every
			// connection closed, as on a TCP listener without a route.
			chains = append(chains, tcpChain("tls/"+port, nil, g.b.netRBACFilters(policies, nil), tcpProxy(g.b.blackHole())))
		}
		name := "0.0.0.0_" + port
		l := &listenerv3.Listener{Name: name, FilterChains: chains, Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "0.0.0.0", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(n)}},
		}}}
		if len(p.https)+len(p.tls) > 0 {
			l.ListenerFilters = []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector",
				ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspector.TlsInspector{})}}}
		}
		g.b.res.add(resource.ListenerType, name, l)
	}
}

// tcpProxy is a TCP listener's tcp_proxy: to its TCPRoute's backends, or
// to BlackHoleCluster (every connection closed) when it has none.
func (g *gatewayBuild) tcpProxy(port string, gl *gwListener) *listenerv3.Filter {
	if len(gl.routes) == 0 {
		return tcpProxy(g.b.blackHole())
	}
	src := gl.routes[0].src
	g.translated[src.id()] = true
	return g.b.tcpBackends(src, "tcp."+port)
}

// holdChain keeps the hostname of an HTTPS or TLS listener that no chain
// of its own lists (no route of it names it, or it has no usable
// certificate): a chain "tls/<port>/<listener>" to BlackHoleCluster
// without a transport socket, so that the connection is closed before any
// certificate is shown. Without it, a name of the listener (or one its
// wildcard covers) would fall to the wildcard chain of a less specific
// listener of the port, of the other mode perhaps: terminated with that
// listener's certificate and relayed to its backends (Gateway API's
// listener isolation).
func (g *gatewayBuild) holdChain(port string, gl *gwListener, policies []*securityv1.AuthorizationPolicy) *listenerv3.FilterChain {
	m := &listenerv3.FilterChainMatch{ServerNames: []string{gl.hostname}}
	return tcpChain("tls/"+port+"/"+string(gl.spec.Name), m, g.b.netRBACFilters(policies, nil), tcpProxy(g.b.blackHole()))
}

// httpsChain is an HTTPS listener's chain: selected by SNI (any when the
// listener has no hostname), terminating TLS with its certificates.
func (g *gatewayBuild) httpsChain(port string, gl *gwListener, hcm *listenerv3.Filter) *listenerv3.FilterChain {
	fc := &listenerv3.FilterChain{Name: "https/" + port + "/" + string(gl.spec.Name), Filters: []*listenerv3.Filter{hcm}}
	if gl.hostname != "" {
		fc.FilterChainMatch = &listenerv3.FilterChainMatch{ServerNames: []string{gl.hostname}}
	}
	fc.TransportSocket = downstreamTLS(gl.certs, []string{"h2", "http/1.1"})
	return fc
}

// downstreamTLS is the transport socket of a chain that ends TLS with
// certs, offering the ALPN protocols alpn (none: no ALPN).
func downstreamTLS(certs []*tlsv3.TlsCertificate, alpn []string) *corev3.TransportSocket {
	return &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{
		TypedConfig: mustAny(&tlsv3.DownstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsCertificates: certs, AlpnProtocols: alpn,
		}}),
	}}
}

// gatewayManager is an ingress chain's http_connection_manager: the
// waypoint's, taking the client's address from the connection. It leaves
// the Host as the client sent it, port included (Gateway API forwards it
// so): the RouteConfiguration ignores the port in choosing a virtual host.
func (b *builder) gatewayManager(rds string, filters []*hcmv3.HttpFilter) *listenerv3.Filter {
	return b.hcmFilter(&hcmv3.HttpConnectionManager{
		StatPrefix:       rds,
		CodecType:        hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier:   &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: rds}},
		HttpFilters:      append(append([]*hcmv3.HttpFilter(nil), filters...), corsFilter(), router()),
		UseRemoteAddress: wrapperspb.Bool(true),
	})
}

// routeConfig builds the RouteConfiguration of listeners: a virtual host
// per hostname their routes serve and per listener hostname (which answers
// 404 without routes), holding those routes' rules sorted by Gateway API
// precedence; a hostname a more specific listener claims is left to it
// (claimedElsewhere).
func (g *gatewayBuild) routeConfig(name, port string, ls []*gwListener) *routev3.RouteConfiguration {
	byHost := map[string][]*entry{}
	seen := map[string]bool{}
	for _, gl := range ls {
		if gl.hostname != "" {
			byHost[gl.hostname] = nil // the listener's own, even without routes
		}
		for _, ar := range gl.routes {
			for _, h := range ar.hosts {
				k := h + " " + ar.src.id().String()
				if seen[k] || claimedElsewhere(h, gl, ls) {
					continue
				}
				seen[k] = true
				byHost[h] = append(byHost[h], g.entries(ar.src)...)
			}
		}
	}
	// A Host with a port ("example.com:8080") selects the virtual host of
	// its name: the listener's port is the connection's, not the Host's.
	rc := &routev3.RouteConfiguration{Name: name, IgnorePortInHostMatching: true}
	for _, h := range sortedKeys(byHost) {
		es := byHost[h]
		sort.SliceStable(es, func(i, j int) bool { return less(es[i], es[j]) })
		vh := &routev3.VirtualHost{Name: h + ":" + port, Domains: []string{h}}
		for _, e := range es {
			vh.Routes = append(vh.Routes, e.route)
		}
		rc.VirtualHosts = append(rc.VirtualHosts, vh)
	}
	return rc
}

// claimedElsewhere reports whether hostname h, which a route attached to
// listener l serves, belongs to another listener of the same
// RouteConfiguration whose hostname is more specific than l's and equals
// or covers h: Gateway API's listener isolation, so that a request for
// abc.foo.example.com never reaches the routes of a "*.example.com" (or
// hostname-less) listener while an "abc.foo.example.com" or
// "*.foo.example.com" listener shares the port.
func claimedElsewhere(h string, l *gwListener, ls []*gwListener) bool {
	for _, o := range ls {
		m := o.hostname
		if o == l || m == "" || m == l.hostname {
			continue
		}
		within := l.hostname == "" || wildcardCovers(l.hostname, m)
		if within && (m == h || wildcardCovers(m, h)) {
			return true
		}
	}
	return false
}

// entries are a route's Envoy routes, one per match of each rule.
func (g *gatewayBuild) entries(src *source) []*entry {
	g.translated[src.id()] = true
	var out []*entry
	for i := range src.rules {
		ru := &src.rules[i]
		for j, m := range ru.matchesOrAll() {
			r := g.b.envoyRoute(src, ru, m)
			r.Name = src.key + "." + itoa(i) + "." + itoa(j)
			out = append(out, &entry{m: m, src: src, rule: i, ordinal: j, route: r})
		}
	}
	return out
}

// status is the listeners' status.
func (g *gatewayBuild) status() []gwv1.ListenerStatus {
	gen := g.gw.Generation
	out := make([]gwv1.ListenerStatus, 0, len(g.listeners))
	for _, gl := range g.listeners {
		programmed := yes(gwv1.ListenerReasonProgrammed, "served on port %d", gl.spec.Port)
		if !gl.served() {
			programmed = no(gwv1.ListenerReasonInvalid, "not served: %s", whyNotServed(gl))
		}
		conds := []metav1.Condition{
			condition(gwv1.ListenerConditionAccepted, gl.accepted, gen),
			condition(gwv1.ListenerConditionResolvedRefs, gl.resolved, gen),
			condition(gwv1.ListenerConditionConflicted, gl.conflicted, gen),
			condition(gwv1.ListenerConditionProgrammed, programmed, gen),
		}
		out = append(out, gwv1.ListenerStatus{Name: gl.spec.Name, SupportedKinds: gl.kinds, AttachedRoutes: int32(len(gl.routes)), Conditions: conds})
	}
	return out
}

func whyNotServed(gl *gwListener) string {
	switch {
	case !gl.accepted.ok:
		return gl.accepted.message
	case gl.conflicted.ok:
		return gl.conflicted.message
	}
	return gl.resolved.message
}

func condition(t gwv1.ListenerConditionType, c lcond, gen int64) metav1.Condition {
	s := metav1.ConditionFalse
	if c.ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: string(t), Status: s, Reason: string(c.reason), Message: c.message, ObservedGeneration: gen}
}
