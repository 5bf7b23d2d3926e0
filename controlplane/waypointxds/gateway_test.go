package waypointxds

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/weftmesh/weft/internal/apinames"
)

// ingressClass is the chart's GatewayClass istio.
var ingressClass = &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: apinames.GatewayClass},
	Spec: gwv1.GatewayClassSpec{ControllerName: apinames.GatewayController}}

// ingressGateways are a fixture's ingress Gateways: all but its waypoints.
func ingressGateways(t *testing.T, f *fixture) []*gwv1.Gateway {
	t.Helper()
	var out []*gwv1.Gateway
	for _, gw := range f.gateways {
		switch {
		case gw.Spec.GatewayClassName == apinames.WaypointClass:
		case !Ingress(gw, ingressClass):
			t.Fatalf("fixture Gateway %s/%s is not an ingress gateway", gw.Namespace, gw.Name)
		default:
			out = append(out, gw)
		}
	}
	return out
}

// buildGateways builds every ingress Gateway of a fixture, and the routes'
// outcomes from their reports.
func buildGateways(t *testing.T, f *fixture) ([]Resources, []GatewayReport, []RouteOutcome) {
	t.Helper()
	var res []Resources
	var reps []GatewayReport
	var reports []Report
	for _, gw := range ingressGateways(t, f) {
		r, rep := BuildGateway(testMesh, gw, f.st)
		res, reps, reports = append(res, r), append(reps, rep), append(reports, rep.Report)
	}
	return res, reps, Outcomes(testMesh, f.st, nil, reports)
}

// TestGoldenGateway translates every testdata/gateway/*.yaml and compares
// the resources, the listeners' status and the routes' outcomes with the
// .golden file (go test -update rewrites them). As TestGolden, it
// compiles every resource with the proxy's own compiler, which takes them
// in gateway mode: the two sides cannot drift apart unnoticed.
func TestGoldenGateway(t *testing.T) {
	inputs, _ := filepath.Glob("testdata/gateway/*.yaml")
	if len(inputs) == 0 {
		t.Fatal("no inputs in testdata/gateway")
	}
	for _, in := range inputs {
		t.Run(filepath.Base(in), func(t *testing.T) {
			f := load(t, in)
			res, reps, outs := buildGateways(t, f)
			var out []byte
			for i, gw := range ingressGateways(t, f) {
				compiled(t, res[i]) // the proxy in gateway mode takes every resource
				out = append(out, dump(t, res[i], reps[i].Notes)...)
				ls, err := sigsyaml.Marshal(reps[i].Listeners)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, fmt.Sprintf("# listeners of %s/%s\n%s", gw.Namespace, gw.Name, ls)...)
			}
			for _, o := range outs {
				if len(o.Parents) == 0 {
					continue
				}
				ps, err := sigsyaml.Marshal(o.Parents)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, fmt.Sprintf("# parents of %s\n%s", o.Key, ps)...)
			}
			checkGolden(t, strings.TrimSuffix(in, ".yaml")+".golden", out)
		})
	}
}

func ingressFixture(t *testing.T) (*fixture, Resources, GatewayReport, []RouteOutcome) {
	t.Helper()
	f := load(t, "testdata/gateway/ingress.yaml")
	res, reps, outs := buildGateways(t, f)
	return f, res[0], reps[0], outs
}

// TestGatewayListenerStatus checks each listener's conditions against
// what Gateway API (and its conformance tests) ask.
func TestGatewayListenerStatus(t *testing.T) {
	_, _, rep, _ := ingressFixture(t)
	type want struct {
		accepted, resolved, conflicted string // reasons
		programmed                     bool
		attached                       int32
		kinds                          []string
	}
	http := []string{"HTTPRoute", "GRPCRoute"}
	cases := map[string]want{
		"http":              {"Accepted", "ResolvedRefs", "NoConflicts", true, 2, http},
		"http-foo":          {"Accepted", "ResolvedRefs", "NoConflicts", true, 1, http},
		"http-foo-again":    {"Accepted", "ResolvedRefs", "HostnameConflict", false, 0, http},
		"tcp-80":            {"Accepted", "ResolvedRefs", "ProtocolConflict", false, 0, []string{"TCPRoute"}},
		"https":             {"Accepted", "ResolvedRefs", "NoConflicts", true, 3, http},
		"https-shared":      {"Accepted", "ResolvedRefs", "NoConflicts", true, 1, http},
		"https-ungranted":   {"Accepted", "RefNotPermitted", "NoConflicts", false, 0, http},
		"https-wrong-grant": {"Accepted", "RefNotPermitted", "NoConflicts", false, 0, http},
		"https-opaque":      {"Accepted", "InvalidCertificateRef", "NoConflicts", false, 0, http},
		"https-mismatch":    {"Accepted", "InvalidCertificateRef", "NoConflicts", false, 1, http},
		"https-garbage":     {"Accepted", "InvalidCertificateRef", "NoConflicts", false, 0, http},
		"https-configmap":   {"Accepted", "InvalidCertificateRef", "NoConflicts", false, 0, http},
		"https-any":         {"Accepted", "ResolvedRefs", "NoConflicts", true, 1, http},
		"tls":               {"Accepted", "ResolvedRefs", "NoConflicts", true, 0, []string{"TLSRoute"}},
		"udp":               {"UnsupportedProtocol", "ResolvedRefs", "NoConflicts", false, 0, nil},
		"kinds":             {"Accepted", "InvalidRouteKinds", "NoConflicts", true, 1, []string{"HTTPRoute"}},
	}
	if len(rep.Listeners) != len(cases) {
		t.Fatalf("%d listener statuses, want %d", len(rep.Listeners), len(cases))
	}
	for _, ls := range rep.Listeners {
		w, ok := cases[string(ls.Name)]
		if !ok {
			t.Errorf("unexpected listener %s", ls.Name)
			continue
		}
		reason := func(typ gwv1.ListenerConditionType) (string, bool) {
			c := meta.FindStatusCondition(ls.Conditions, string(typ))
			if c == nil {
				t.Errorf("listener %s: no %s condition", ls.Name, typ)
				return "", false
			}
			if c.ObservedGeneration != 3 {
				t.Errorf("listener %s: %s observedGeneration %d, want 3", ls.Name, typ, c.ObservedGeneration)
			}
			return c.Reason, c.Status == metav1.ConditionTrue
		}
		if r, ok := reason(gwv1.ListenerConditionAccepted); r != w.accepted || ok != (w.accepted == "Accepted") {
			t.Errorf("listener %s: Accepted %v %s, want %s", ls.Name, ok, r, w.accepted)
		}
		if r, ok := reason(gwv1.ListenerConditionResolvedRefs); r != w.resolved || ok != (w.resolved == "ResolvedRefs") {
			t.Errorf("listener %s: ResolvedRefs %v %s, want %s", ls.Name, ok, r, w.resolved)
		}
		if r, ok := reason(gwv1.ListenerConditionConflicted); r != w.conflicted || ok != (w.conflicted != "NoConflicts") {
			t.Errorf("listener %s: Conflicted %v %s, want %s", ls.Name, ok, r, w.conflicted)
		}
		if _, ok := reason(gwv1.ListenerConditionProgrammed); ok != w.programmed {
			t.Errorf("listener %s: Programmed %v, want %v", ls.Name, ok, w.programmed)
		}
		if ls.AttachedRoutes != w.attached {
			t.Errorf("listener %s: attachedRoutes %d, want %d", ls.Name, ls.AttachedRoutes, w.attached)
		}
		var kinds []string
		for _, k := range ls.SupportedKinds {
			if k.Group == nil || *k.Group != gwv1.GroupName {
				t.Errorf("listener %s: supported kind %s without group %s", ls.Name, k.Kind, gwv1.GroupName)
			}
			kinds = append(kinds, string(k.Kind))
		}
		if ls.SupportedKinds == nil || !slices.Equal(kinds, w.kinds) {
			t.Errorf("listener %s: supportedKinds %v, want %v (never nil)", ls.Name, kinds, w.kinds)
		}
	}
}

// TestGatewayRouteParents checks each route parent's Accepted and
// ResolvedRefs against Gateway API's reasons, under the ingress
// controller's name.
func TestGatewayRouteParents(t *testing.T) {
	_, _, _, outs := ingressFixture(t)
	byKey := map[string]RouteOutcome{}
	for _, o := range outs {
		byKey[o.Key.String()] = o
	}
	cases := []struct {
		route              string
		parent             int
		accepted, resolved string
	}{
		{"HTTPRoute apps/echo", 0, "Accepted", "ResolvedRefs"},
		{"HTTPRoute apps/echo-wild", 0, "Accepted", "ResolvedRefs"},
		{"HTTPRoute denied/nope", 0, "NotAllowedByListeners", "BackendNotFound"},
		{"HTTPRoute gw-demo/other-host", 0, "NoMatchingListenerHostname", "ResolvedRefs"},
		{"HTTPRoute gw-demo/no-section", 0, "NoMatchingParent", "ResolvedRefs"},
		{"HTTPRoute gw-demo/no-port", 0, "NoMatchingParent", "ResolvedRefs"},
		{"HTTPRoute gw-demo/narrower", 0, "Accepted", "ResolvedRefs"},
		{"HTTPRoute gw-demo/bare", 0, "NoMatchingListenerHostname", "ResolvedRefs"},
		{"HTTPRoute gw-demo/wider", 0, "Accepted", "BackendNotFound"},
		// Attached to a listener without a chain: its backend is still
		// checked.
		{"HTTPRoute gw-demo/to-invalid-cert", 0, "Accepted", "BackendNotFound"},
		{"HTTPRoute gw-demo/shared", 0, "Accepted", "ResolvedRefs"},
		{"HTTPRoute gw-demo/shared", 1, "Accepted", "ResolvedRefs"},
		{"HTTPRoute gw-demo/shared", 2, "Accepted", "ResolvedRefs"},
		{"GRPCRoute gw-demo/grpc", 0, "Accepted", "ResolvedRefs"},
		{"GRPCRoute gw-demo/grpc", 1, "NotAllowedByListeners", "ResolvedRefs"},
		{"TCPRoute gw-demo/tcp", 0, "NotAllowedByListeners", "ResolvedRefs"},
	}
	for _, c := range cases {
		o, ok := byKey[c.route]
		if !ok || c.parent >= len(o.Parents) {
			t.Errorf("%s: no outcome for parent %d: %+v", c.route, c.parent, o)
			continue
		}
		p := o.Parents[c.parent]
		if p.Controller != apinames.GatewayController {
			t.Errorf("%s parent %d: controller %q, want %q", c.route, c.parent, p.Controller, apinames.GatewayController)
		}
		acc := meta.FindStatusCondition(p.Conditions, string(gwv1.RouteConditionAccepted))
		res := meta.FindStatusCondition(p.Conditions, string(gwv1.RouteConditionResolvedRefs))
		if acc == nil || acc.Reason != c.accepted || (acc.Status == metav1.ConditionTrue) != (c.accepted == "Accepted") {
			t.Errorf("%s parent %d: Accepted %+v, want reason %s", c.route, c.parent, acc, c.accepted)
		}
		if res == nil || res.Reason != c.resolved || (res.Status == metav1.ConditionTrue) != (c.resolved == "ResolvedRefs") {
			t.Errorf("%s parent %d: ResolvedRefs %+v, want reason %s", c.route, c.parent, res, c.resolved)
		}
	}
}

func hcmOf(t *testing.T, fc *listenerv3.FilterChain) *hcmv3.HttpConnectionManager {
	t.Helper()
	f := fc.Filters[len(fc.Filters)-1]
	m := &hcmv3.HttpConnectionManager{}
	if err := f.GetTypedConfig().UnmarshalTo(m); err != nil {
		t.Fatalf("chain %s: %v", fc.Name, err)
	}
	return m
}

// TestGatewayResources checks the Listeners, chains and virtual hosts of
// the contract: one Listener per port with served listeners, an HTTP
// chain per port, a TLS chain per HTTPS listener selected by SNI.
func TestGatewayResources(t *testing.T) {
	_, res, _, _ := ingressFixture(t)
	if got := sortedKeys(res[resource.ListenerType]); !slices.Equal(got, []string{"0.0.0.0_443", "0.0.0.0_80", "0.0.0.0_8080", "0.0.0.0_8443", "0.0.0.0_9443"}) {
		t.Fatalf("listeners %v", got)
	}
	l443 := res[resource.ListenerType]["0.0.0.0_443"].(*listenerv3.Listener)
	if a := l443.GetAddress().GetSocketAddress(); a.GetAddress() != "0.0.0.0" || a.GetPortValue() != 443 {
		t.Errorf("443's address: %v", a)
	}
	if len(l443.ListenerFilters) != 1 || l443.ListenerFilters[0].Name != "envoy.filters.listener.tls_inspector" {
		t.Errorf("443's listener filters: %v", l443.ListenerFilters)
	}
	var names, held []string
	for _, fc := range l443.FilterChains {
		if strings.HasPrefix(fc.Name, "tls/") {
			// The name of a listener without a usable certificate is
			// kept, every connection closed before any certificate.
			held = append(held, fc.Name+" "+strings.Join(fc.FilterChainMatch.GetServerNames(), ","))
			var tcp tcpv3.TcpProxy
			if fc.TransportSocket != nil || fc.Filters[len(fc.Filters)-1].GetTypedConfig().UnmarshalTo(&tcp) != nil || tcp.GetCluster() != BlackHoleCluster {
				t.Errorf("chain %s: %v", fc.Name, fc)
			}
			continue
		}
		names = append(names, fc.Name)
		ctx := &tlsv3.DownstreamTlsContext{}
		if fc.TransportSocket.GetName() != "envoy.transport_sockets.tls" || fc.TransportSocket.GetTypedConfig().UnmarshalTo(ctx) != nil {
			t.Fatalf("chain %s: transport socket %v", fc.Name, fc.TransportSocket)
		}
		if len(ctx.CommonTlsContext.TlsCertificates) != 1 || !slices.Equal(ctx.CommonTlsContext.AlpnProtocols, []string{"h2", "http/1.1"}) {
			t.Errorf("chain %s: tls context %v", fc.Name, ctx)
		}
		m := hcmOf(t, fc)
		// The Host reaches the backend as the client sent it, port
		// included: no strip_any_host_port (the RouteConfiguration ignores
		// the port instead).
		if !m.GetUseRemoteAddress().GetValue() || m.GetStripAnyHostPort() {
			t.Errorf("chain %s: use_remote_address %v strip_any_host_port %v", fc.Name, m.GetUseRemoteAddress(), m.GetStripAnyHostPort())
		}
		if len(m.HttpFilters) != 3 || m.HttpFilters[0].Name != "envoy.filters.http.rbac" {
			t.Errorf("chain %s: http filters %v, want the Gateway's one DENY, cors, router", fc.Name, m.HttpFilters)
		}
	}
	// Every RouteConfiguration picks the virtual host by the Host's name
	// whatever its port.
	for name, r := range res[resource.RouteType] {
		if !r.(*routev3.RouteConfiguration).GetIgnorePortInHostMatching() {
			t.Errorf("route %s: ignore_port_in_host_matching unset", name)
		}
	}
	if !slices.Equal(names, []string{"https/443/https", "https/443/https-shared"}) {
		t.Errorf("443's chains %v: the listeners with unusable certificates have none", names)
	}
	if want := []string{"tls/443/https-ungranted a.example.org", "tls/443/https-wrong-grant b.example.org", "tls/443/https-opaque c.example.org",
		"tls/443/https-mismatch d.example.org", "tls/443/https-garbage e.example.org", "tls/443/https-configmap f.example.org"}; !slices.Equal(held, want) {
		t.Errorf("443's held names %v, want %v", held, want)
	}
	if sn := l443.FilterChains[0].FilterChainMatch.GetServerNames(); !slices.Equal(sn, []string{"*.example.com"}) {
		t.Errorf("server names %v", sn)
	}
	any := res[resource.ListenerType]["0.0.0.0_8443"].(*listenerv3.Listener).FilterChains[0]
	if any.FilterChainMatch != nil {
		t.Errorf("a listener without hostname takes any SNI: %v", any.FilterChainMatch)
	}
	l80 := res[resource.ListenerType]["0.0.0.0_80"].(*listenerv3.Listener)
	if len(l80.FilterChains) != 1 || l80.FilterChains[0].Name != "http/80" || l80.FilterChains[0].TransportSocket != nil || len(l80.ListenerFilters) != 0 {
		t.Fatalf("80: %v", l80)
	}
	if rds := hcmOf(t, l80.FilterChains[0]).GetRds().GetRouteConfigName(); rds != "http.80" {
		t.Errorf("80's rds %q", rds)
	}
	vhosts := func(name string) []string {
		rc, ok := res[resource.RouteType][name].(*routev3.RouteConfiguration)
		if !ok {
			t.Fatalf("no RouteConfiguration %s", name)
		}
		var out []string
		for _, vh := range rc.VirtualHosts {
			out = append(out, vh.Name+"="+strings.Join(vh.Domains, ","))
		}
		return out
	}
	if got := vhosts("http.80"); !slices.Equal(got, []string{"*.example.com:80=*.example.com", "echo.example.com:80=echo.example.com",
		"echo2.example.com:80=echo2.example.com", "foo.example.com:80=foo.example.com"}) {
		t.Errorf("http.80 virtual hosts %v", got)
	}
	if got := vhosts("https.443.https"); !slices.Equal(got, []string{"*.example.com:443=*.example.com", "*.foo.example.com:443=*.foo.example.com",
		"grpc.example.com:443=grpc.example.com"}) {
		t.Errorf("https.443.https virtual hosts %v", got)
	}
	if got := vhosts("https.443.https-shared"); !slices.Equal(got, []string{"shared.example.org:443=shared.example.org"}) {
		t.Errorf("https.443.https-shared virtual hosts %v", got)
	}
	if got := vhosts("https.8443.https-any"); !slices.Equal(got, []string{"*:8443=*"}) {
		t.Errorf("https.8443.https-any virtual hosts %v", got)
	}
	// Routes of a virtual host in precedence order: the Exact match first.
	rc := res[resource.RouteType]["http.80"].(*routev3.RouteConfiguration)
	for _, vh := range rc.VirtualHosts {
		if vh.Name == "echo.example.com:80" {
			var rs []string
			for _, r := range vh.Routes {
				rs = append(rs, r.Name)
			}
			if !slices.Equal(rs, []string{"apps/echo.0.0", "apps/echo.1.0"}) {
				t.Errorf("echo.example.com routes %v", rs)
			}
		}
	}
	if _, ok := res[resource.EndpointType]["outbound|80||echo.apps.svc.cluster.local"]; !ok {
		t.Error("no endpoints for the echo backend")
	}
}

func TestIntersectHostnames(t *testing.T) {
	h := func(s ...string) []gwv1.Hostname {
		var out []gwv1.Hostname
		for _, v := range s {
			out = append(out, gwv1.Hostname(v))
		}
		return out
	}
	cases := []struct {
		listener string
		route    []gwv1.Hostname
		want     []string
	}{
		{"", nil, []string{"*"}},
		{"foo.example.com", nil, []string{"foo.example.com"}},
		{"", h("a.example.com", "*.b.example.com"), []string{"a.example.com", "*.b.example.com"}},
		{"foo.example.com", h("foo.example.com"), []string{"foo.example.com"}},
		{"foo.example.com", h("FOO.Example.com"), []string{"foo.example.com"}},
		{"foo.example.com", h("bar.example.com"), nil},
		{"*.example.com", h("foo.example.com", "a.b.example.com"), []string{"foo.example.com", "a.b.example.com"}},
		{"*.example.com", h("example.com"), nil},
		{"*.example.com", h("fooexample.com"), nil},
		{"*.example.com", h("foo.example.com.evil.org"), nil},
		{"*.example.com", h("*.example.com"), []string{"*.example.com"}},
		{"*.example.com", h("*.foo.example.com"), []string{"*.foo.example.com"}},
		{"*.foo.example.com", h("*.example.com"), []string{"*.foo.example.com"}},
		{"*.example.com", h("*.com"), []string{"*.example.com"}},
		{"*.example.com", h("*.org"), nil},
		{"foo.example.com", h("*.example.com"), []string{"foo.example.com"}},
		{"example.com", h("*.example.com"), nil},
		{"foo.example.com", h("*.example.com", "foo.example.com"), []string{"foo.example.com"}},
	}
	for _, c := range cases {
		if got := intersectHostnames(c.listener, c.route); !slices.Equal(got, c.want) {
			t.Errorf("listener %q, route %v: %v, want %v", c.listener, c.route, got, c.want)
		}
	}
}

func TestIngress(t *testing.T) {
	gw := &gwv1.Gateway{Spec: gwv1.GatewaySpec{GatewayClassName: apinames.GatewayClass}}
	class := func(c string) *gwv1.GatewayClass {
		return &gwv1.GatewayClass{Spec: gwv1.GatewayClassSpec{ControllerName: gwv1.GatewayController(c)}}
	}
	if !Ingress(gw, class(apinames.GatewayController)) {
		t.Error("an istio Gateway of our class is ours")
	}
	if Ingress(gw, nil) {
		t.Error("an istio Gateway without a GatewayClass object is nobody's yet")
	}
	if Ingress(gw, class("example.com/other")) {
		t.Error("an istio class of another controller is not ours")
	}
	if Ingress(&gwv1.Gateway{Spec: gwv1.GatewaySpec{GatewayClassName: apinames.WaypointClass}}, nil) {
		t.Error("a waypoint is not an ingress gateway")
	}
	if got := GatewayKey("ns", "gw"); got != "ns/gw-istio" {
		t.Errorf("GatewayKey %q", got)
	}
}

// TestGatewayListenerIsolation: on a port shared by listeners of nested
// hostnames, each virtual host holds only the routes of the most specific
// listener for it (Gateway API's listener isolation), and a listener
// without routes still has its virtual host, which answers 404.
func TestGatewayListenerIsolation(t *testing.T) {
	f := load(t, "testdata/gateway/isolation.yaml")
	res, _, _ := buildGateways(t, f)
	rc := res[0][resource.RouteType]["http.80"].(*routev3.RouteConfiguration)
	got := map[string][]string{}
	for _, vh := range rc.VirtualHosts {
		got[vh.Name] = []string{}
		for _, r := range vh.Routes {
			got[vh.Name] = append(got[vh.Name], r.Name)
		}
	}
	want := map[string][]string{
		"bar.com:80":             {"iso/empty.0.0"},
		"*.example.com:80":       {"iso/wildcard.0.0"},
		"*.foo.example.com:80":   {"iso/wildcard-foo.0.0"},
		"abc.foo.example.com:80": {"iso/abc.0.0"},
		"quiet.example.com:80":   {},
	}
	if len(got) != len(want) {
		t.Errorf("virtual hosts %v, want %v", got, want)
	}
	for vh, rs := range want {
		if !slices.Equal(got[vh], rs) {
			t.Errorf("virtual host %s: routes %v, want %v", vh, got[vh], rs)
		}
	}
}

// FuzzIntersectHostnames: whatever the names, every hostname served is
// one both the listener and some route hostname admit, never wider.
func FuzzIntersectHostnames(f *testing.F) {
	f.Add("*.example.com", "foo.example.com,*.foo.example.com,example.com")
	f.Add("", "*.com")
	f.Add("foo.example.com", "*.example.com,FOO.example.com")
	f.Add("*.", "*..")
	f.Fuzz(func(t *testing.T, listener, routes string) {
		listener = strings.ToLower(listener)
		var rs []gwv1.Hostname
		if routes != "" {
			for _, r := range strings.Split(routes, ",") {
				rs = append(rs, gwv1.Hostname(r))
			}
		}
		for _, h := range intersectHostnames(listener, rs) {
			if h == "*" && (listener != "" || len(rs) > 0) {
				t.Fatalf("listener %q, routes %q: any host served", listener, routes)
			}
			if listener != "" && h != listener && !wildcardCovers(listener, h) {
				t.Fatalf("listener %q, routes %q: %q is outside the listener", listener, routes, h)
			}
			if len(rs) > 0 && !slices.ContainsFunc(rs, func(r gwv1.Hostname) bool {
				l := strings.ToLower(string(r))
				return l == h || wildcardCovers(l, h)
			}) {
				t.Fatalf("listener %q, routes %q: %q is outside every route hostname", listener, routes, h)
			}
		}
	})
}

// TestGatewayCertificateServes serves the certificate and key an HTTPS
// chain carries with crypto/tls on loopback: a net/http client that trusts
// the certificate reaches it for a name the certificate holds, and fails
// verification for another, as the proxy's TLS stack will.
func TestGatewayCertificateServes(t *testing.T) {
	_, res, _, _ := ingressFixture(t)
	fc := res[resource.ListenerType]["0.0.0.0_443"].(*listenerv3.Listener).FilterChains[0]
	ctx := &tlsv3.DownstreamTlsContext{}
	if err := fc.TransportSocket.GetTypedConfig().UnmarshalTo(ctx); err != nil {
		t.Fatal(err)
	}
	tc := ctx.CommonTlsContext.TlsCertificates[0]
	pair, err := tls.X509KeyPair(tc.CertificateChain.GetInlineBytes(), tc.PrivateKey.GetInlineBytes())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, NextProtos: ctx.CommonTlsContext.AlpnProtocols}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are expected
	srv.StartTLS()
	defer srv.Close()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(tc.CertificateChain.GetInlineBytes()) {
		t.Fatal("no certificate in the chain")
	}
	get := func(serverName string) (*http.Response, error) {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: serverName}, ForceAttemptHTTP2: true}}
		defer c.CloseIdleConnections()
		return c.Get(srv.URL)
	}
	resp, err := get("www.example.com")
	if err != nil {
		t.Fatalf("a name the certificate holds: %v", err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Errorf("ALPN h2 not negotiated: %s", resp.Proto)
	}
	for _, name := range []string{"www.example.org", "a.b.example.com", "example.com.evil.org"} {
		if resp, err := get(name); err == nil {
			resp.Body.Close()
			t.Errorf("%s: verified against a certificate for example.com and *.example.com", name)
		}
	}
}

// TestGatewayTCP: a TCP listener's chain relays to its TCPRoute's
// backends after the Gateway's network RBAC; of two TCPRoutes the older
// applies and the other is Conflicted; a TCPRoute of more rules is not
// applied; a listener without a route closes every connection; an
// HTTPRoute is not admitted there.
func TestGatewayTCP(t *testing.T) {
	f := load(t, "testdata/gateway/tcp.yaml")
	res, reps, outs := buildGateways(t, f)
	l := res[0][resource.ListenerType]["0.0.0.0_5432"].(*listenerv3.Listener)
	if len(l.FilterChains) != 1 || l.FilterChains[0].Name != "tcp/5432" || len(l.ListenerFilters) != 0 {
		t.Fatalf("5432: %v", l)
	}
	fs := l.FilterChains[0].Filters
	if len(fs) != 2 || fs[0].Name != "envoy.filters.network.rbac" || fs[1].Name != "envoy.filters.network.tcp_proxy" {
		t.Fatalf("5432's filters: %v", fs)
	}
	proxy := &tcpv3.TcpProxy{}
	if err := fs[1].GetTypedConfig().UnmarshalTo(proxy); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, cw := range proxy.GetWeightedClusters().GetClusters() {
		got = append(got, fmt.Sprintf("%s=%d", cw.Name, cw.Weight))
	}
	if !slices.Equal(got, []string{"outbound|5432||db.tcp.svc.cluster.local=3", "BlackHoleCluster=1"}) {
		t.Errorf("5432's tcp_proxy: %v", got)
	}
	for _, port := range []string{"6379", "7000"} {
		l := res[0][resource.ListenerType]["0.0.0.0_"+port].(*listenerv3.Listener)
		proxy := &tcpv3.TcpProxy{}
		if err := l.FilterChains[0].Filters[len(l.FilterChains[0].Filters)-1].GetTypedConfig().UnmarshalTo(proxy); err != nil {
			t.Fatal(err)
		}
		if proxy.GetCluster() != BlackHoleCluster {
			t.Errorf("%s's tcp_proxy goes to %q, want %s", port, proxy.GetCluster(), BlackHoleCluster)
		}
	}
	attached := map[string]int32{}
	for _, ls := range reps[0].Listeners {
		attached[string(ls.Name)] = ls.AttachedRoutes
	}
	if attached["db"] != 1 || attached["cache"] != 0 || attached["idle"] != 0 {
		t.Errorf("attachedRoutes %v", attached)
	}
	reasons := map[string]string{}
	for _, o := range outs {
		for i, p := range o.Parents {
			reasons[fmt.Sprintf("%s/%d", o.Key, i)] = meta.FindStatusCondition(p.Conditions, "Accepted").Reason
		}
	}
	want := map[string]string{
		"TCPRoute tcp/db-old/0":     "Accepted",
		"TCPRoute tcp/db-new/0":     string(ReasonConflicted),
		"TCPRoute tcp/two-rules/0":  "UnsupportedValue",
		"TCPRoute elsewhere/far/0":  "NotAllowedByListeners",
		"HTTPRoute tcp/web-on-db/0": "NotAllowedByListeners",
	}
	for k, w := range want {
		if reasons[k] != w {
			t.Errorf("%s: Accepted reason %q, want %q", k, reasons[k], w)
		}
	}
}
