package waypointxds

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/rbac"
	"github.com/weftmesh/weft/waypoint/route"
	"github.com/weftmesh/weft/waypoint/urlpath"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// fixture is a set of objects loaded from a multi-document YAML file.
type fixture struct {
	st       Stores
	gateways []*gwv1.Gateway
}

func newIndexer() cache.Indexer {
	return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

func load(t *testing.T, path string) *fixture {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	slicesIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{
		cache.NamespaceIndex: cache.MetaNamespaceIndexFunc, ambient.IndexServiceName: ambient.SliceServiceIndex})
	f := &fixture{st: Stores{Services: newIndexer(), EndpointSlices: slicesIdx, Pods: newIndexer(), Namespaces: newIndexer(),
		HTTPRoutes: newIndexer(), GRPCRoutes: newIndexer(), TCPRoutes: newIndexer(), TLSRoutes: newIndexer(), Policies: newIndexer(), ReferenceGrants: newIndexer(), ServiceEntries: newIndexer(), WorkloadEntries: newIndexer(),
		Secrets: newIndexer(), Gateways: newIndexer()}}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if raw == nil {
			continue
		}
		b, _ := json.Marshal(raw)
		add := func(s cache.Indexer, obj any) {
			if err := sigsyaml.Unmarshal(b, obj); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			if s != nil {
				if err := s.Add(obj); err != nil {
					t.Fatal(err)
				}
			}
		}
		switch raw["kind"] {
		case "Namespace":
			add(f.st.Namespaces, &corev1.Namespace{})
		case "Service":
			add(f.st.Services, &corev1.Service{})
		case "Pod":
			add(f.st.Pods, &corev1.Pod{})
		case "EndpointSlice":
			add(f.st.EndpointSlices, &discoveryv1.EndpointSlice{})
		case "HTTPRoute":
			add(f.st.HTTPRoutes, &gwv1.HTTPRoute{})
		case "GRPCRoute":
			add(f.st.GRPCRoutes, &gwv1.GRPCRoute{})
		case "TCPRoute":
			add(f.st.TCPRoutes, &gwv1.TCPRoute{})
		case "TLSRoute":
			add(f.st.TLSRoutes, &gwv1.TLSRoute{})
		case "ReferenceGrant":
			add(f.st.ReferenceGrants, &gwv1.ReferenceGrant{})
		case "ServiceEntry":
			add(f.st.ServiceEntries, &networkingv1.ServiceEntry{})
		case "WorkloadEntry":
			add(f.st.WorkloadEntries, &networkingv1.WorkloadEntry{})
		case "Secret":
			add(f.st.Secrets, &corev1.Secret{})
		case "AuthorizationPolicy":
			add(f.st.Policies, &securityv1.AuthorizationPolicy{})
		case "Gateway":
			gw := &gwv1.Gateway{}
			add(f.st.Gateways, gw)
			f.gateways = append(f.gateways, gw)
		default:
			t.Fatalf("%s: kind %v not handled", path, raw["kind"])
		}
	}
	return f
}

var testMesh = Mesh{RootNamespace: "weft-system"}

// dump renders resources as stable JSON, one resource per type and name.
func dump(t *testing.T, res Resources, notes []string) []byte {
	t.Helper()
	var sb strings.Builder
	for _, typ := range TypeURLs {
		names := sortedKeys(res[typ])
		for _, n := range names {
			b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(res[typ][n])
			if err != nil {
				t.Fatal(err)
			}
			var v any
			_ = json.Unmarshal(b, &v)
			stable, _ := json.MarshalIndent(v, "", "  ")
			fmt.Fprintf(&sb, "# %s %s\n%s\n", typ[strings.LastIndex(typ, ".")+1:], n, stable)
		}
	}
	for _, n := range notes {
		fmt.Fprintf(&sb, "# note: %s\n", n)
	}
	return []byte(sb.String())
}

// TestGolden translates every testdata/*.yaml, checks that the waypoint
// compiles every resource, and compares with the .golden file (go test
// -update rewrites them).
func TestGolden(t *testing.T) {
	inputs, _ := filepath.Glob("testdata/*.yaml")
	if len(inputs) == 0 {
		t.Fatal("no inputs in testdata")
	}
	for _, in := range inputs {
		t.Run(filepath.Base(in), func(t *testing.T) {
			f := load(t, in)
			var out []byte
			for _, gw := range f.gateways {
				res, rep := Build(testMesh, ambient.NewWaypoint(gw, ""), f.st)
				compiled(t, res) // the waypoint takes every resource
				out = append(out, dump(t, res, rep.Notes)...)
			}
			checkGolden(t, strings.TrimSuffix(in, ".yaml")+".golden", out)
		})
	}
}

// checkGolden compares out with the golden file, or rewrites it with
// -update, and names the first line that differs.
func checkGolden(t *testing.T, golden string, out []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("reading golden file (run go test -update to create it): %v", err)
	}
	if !bytes.Equal(out, want) {
		gl, wl := strings.Split(string(out), "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("%s differs at line %d:\n got: %s\nwant: %s\n(go test -update rewrites it)", golden, i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("%s differs in length: got %d lines, want %d", golden, len(gl), len(wl))
	}
}

// compiled runs the resources through the waypoint's own compiler: what
// the control plane sends must never be NACKed.
func compiled(t *testing.T, res Resources) *config.Snapshot {
	t.Helper()
	snap := &config.Snapshot{Listeners: map[string]*config.Listener{}, Routes: map[string]*route.Table{}, Clusters: map[string]*config.Cluster{}, Assignments: map[string]*config.Assignment{}}
	for n, m := range res[resource.ListenerType] {
		l, err := config.CompileListener(m.(*listenerv3.Listener))
		if err != nil {
			t.Fatalf("listener %s: %v", n, err)
		}
		snap.Listeners[n] = l
		if n == ListenerName {
			snap.Listener = l
		}
	}
	for n, m := range res[resource.RouteType] {
		rt, err := route.Compile(m.(*routev3.RouteConfiguration))
		if err != nil {
			t.Fatalf("route %s: %v", n, err)
		}
		snap.Routes[n] = rt
	}
	for n, m := range res[resource.ClusterType] {
		c, err := config.CompileCluster(m.(*clusterv3.Cluster))
		if err != nil {
			t.Fatalf("cluster %s: %v", n, err)
		}
		snap.Clusters[n] = c
	}
	for n, m := range res[resource.EndpointType] {
		a, err := config.CompileAssignment(m.(*endpointv3.ClusterLoadAssignment))
		if err != nil {
			t.Fatalf("endpoints %s: %v", n, err)
		}
		snap.Assignments[n] = a
	}
	return snap
}

func basic(t *testing.T) (*config.Snapshot, []string) {
	f := load(t, "testdata/basic.yaml")
	res, rep := Build(testMesh, ambient.NewWaypoint(f.gateways[0], ""), f.st)
	return compiled(t, res), rep.Notes
}

func TestBasicCompilesAndRoutes(t *testing.T) {
	snap, notes := basic(t)
	const echo = "echo.wp-demo.svc.cluster.local"
	ch := snap.Chain(netip.MustParseAddrPort("10.96.0.10:80"))
	if ch == nil || ch.Name != echo+":80" || ch.HTTP == nil {
		t.Fatalf("chain for the echo VIP: %+v", ch)
	}
	if got := len(ch.HTTP.RBAC); got != 1 {
		t.Fatalf("echo chain has %d RBAC filters, want 1 (the Gateway's DENY)", got)
	}
	if snap.Chain(netip.MustParseAddrPort("10.96.0.12:80")) != nil {
		t.Error("echo-v2 opted out with use-waypoint=none but has a chain")
	}
	if snap.Chain(netip.MustParseAddrPort("10.96.0.20:15008")) != nil {
		t.Error("the waypoint's own Service has a chain")
	}
	if c := snap.Chain(netip.MustParseAddrPort("10.96.0.11:9000")); c == nil || c.TCPCluster != "outbound|9000||echo-v1.wp-demo.svc.cluster.local" {
		t.Errorf("tcp- port chain: %+v", c)
	}
	v1 := snap.Chain(netip.MustParseAddrPort("10.96.0.11:80"))
	if v1 == nil || len(v1.HTTP.RBAC) != 2 {
		t.Fatalf("echo-v1 chain should carry the Gateway's DENY and its own ALLOW: %+v", v1)
	}
	tb := snap.RouteTable(ch.HTTP)
	cases := []struct {
		method, path string
		hdr          http.Header
		want         string // first cluster, or "direct:<status>" or "redirect"
		weights      []uint32
	}{
		{"GET", "/", http.Header{"X-Canary": {"yes"}}, "outbound|80||echo-v2.wp-demo.svc.cluster.local", nil},
		{"GET", "/", nil, "outbound|80||echo-v1.wp-demo.svc.cluster.local", []uint32{90, 10}},
		{"GET", "/retry/x", nil, "outbound|80||echo-v1.wp-demo.svc.cluster.local", nil},
		{"GET", "/retryx", nil, "outbound|80||echo-v1.wp-demo.svc.cluster.local", []uint32{90, 10}},
		{"GET", "/old", nil, "redirect", nil},
		{"POST", "/api/items", nil, "outbound|80||echo-v1.wp-demo.svc.cluster.local", nil},
		{"GET", "/api/items", nil, "outbound|80||echo-v1.wp-demo.svc.cluster.local", []uint32{90, 10}},
		{"GET", "/missing", nil, "direct:500", nil},
	}
	for _, c := range cases {
		r := tb.Match(&route.Request{Method: c.method, Path: c.path, Header: c.hdr})
		if r == nil {
			t.Fatalf("%s %s: no route", c.method, c.path)
		}
		var got string
		switch {
		case r.Redirect != nil:
			got = "redirect"
		case r.Direct:
			got = fmt.Sprintf("direct:%d", r.DirectCode)
		default:
			got = r.Clusters[0].Name
		}
		if got != c.want {
			t.Errorf("%s %s %v: routed to %s, want %s", c.method, c.path, c.hdr, got, c.want)
		}
		if c.weights != nil {
			var w []uint32
			for _, wc := range r.Clusters {
				w = append(w, wc.Weight)
			}
			if !slices.Equal(w, c.weights) {
				t.Errorf("%s %s: weights %v, want %v", c.method, c.path, w, c.weights)
			}
		}
	}
	if r := tb.Match(&route.Request{Method: "GET", Path: "/retry"}); r.Retry == nil || r.Retry.NumRetries != 2 || !slices.Equal(r.Retry.StatusCodes, []int{503}) {
		t.Errorf("retry route: %+v", r.Retry)
	}
	if r := tb.Match(&route.Request{Method: "GET", Path: "/slow"}); r.Timeout.Milliseconds() != 500 {
		t.Errorf("timeout route: %v", r.Timeout)
	}
	if r := tb.Match(&route.Request{Method: "POST", Path: "/api/items"}); r.RewritePath("/api/items") != "/v2/items" {
		t.Errorf("rewrite: %q", r.RewritePath("/api/items"))
	}
	if a := snap.Assignments["outbound|80||echo.wp-demo.svc.cluster.local"]; a == nil || len(a.Endpoints) != 2 ||
		!a.Endpoints[0].HBONE || a.Endpoints[0].Identity != "spiffe://cluster.local/ns/wp-demo/sa/echo" ||
		a.Endpoints[0].WorkloadName != "echo-v1" || a.Endpoints[1].HBONE || a.Endpoints[1].Healthy {
		t.Errorf("echo endpoints: %+v", a)
	}
	if c := snap.Clusters["outbound|9090||echo-v1.wp-demo.svc.cluster.local"]; c == nil || !c.HTTP2 {
		t.Errorf("grpc cluster should speak HTTP/2: %+v", c)
	}
	if !slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "backend Service wp-demo/nowhere not found") }) ||
		!slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "requestPrincipals not supported") }) {
		t.Errorf("notes: %q", notes)
	}
}

func TestBasicPolicy(t *testing.T) {
	snap, _ := basic(t)
	echo := snap.Chain(netip.MustParseAddrPort("10.96.0.10:80"))
	v1 := snap.Chain(netip.MustParseAddrPort("10.96.0.11:80"))
	req := func(method, path, principal string, hdr http.Header) *rbac.Request {
		if hdr == nil {
			hdr = http.Header{}
		}
		return &rbac.Request{HTTP: &route.Request{Method: method, Path: path, Header: hdr}, Principal: principal, DstPort: 80}
	}
	allowed := func(fs []*rbac.Filter, r *rbac.Request) bool {
		for _, f := range fs {
			if f.Evaluate(r).Denied {
				return false
			}
		}
		return true
	}
	sameNS := "spiffe://cluster.local/ns/wp-demo/sa/client"
	for _, c := range []struct {
		chain *config.Chain
		r     *rbac.Request
		want  bool
	}{
		{echo, req("GET", "/", sameNS, nil), true},
		{echo, req("GET", "/admin", sameNS, nil), false},
		{echo, req("GET", "/admin/users", sameNS, nil), false},
		{echo, req("GET", "/administrator", sameNS, nil), true},
		{v1, req("GET", "/x", sameNS, http.Header{"X-Team": {"blue"}}), true},
		{v1, req("GET", "/x", "spiffe://cluster.local/ns/other/sa/any", http.Header{"X-Team": {"blue"}}), true},
		{v1, req("GET", "/x", "spiffe://cluster.local/ns/third/sa/any", http.Header{"X-Team": {"blue"}}), false},
		{v1, req("GET", "/x", sameNS, nil), false},
		{v1, req("POST", "/x", sameNS, http.Header{"X-Team": {"blue"}}), false},
		{v1, req("GET", "/private/1", sameNS, http.Header{"X-Team": {"blue"}}), false},
		{v1, req("GET", "/admin", sameNS, http.Header{"X-Team": {"blue"}}), false},
		// A namespace name is never a pattern.
		{v1, req("GET", "/x", "spiffe://cluster.local/ns/wpxdemo/sa/a", http.Header{"X-Team": {"blue"}}), false},
	} {
		if got := allowed(c.chain.HTTP.RBAC, c.r); got != c.want {
			t.Errorf("%s %s from %s %v on %s: allowed %v, want %v", c.r.HTTP.Method, c.r.HTTP.Path, c.r.Principal, c.r.HTTP.Header, c.chain.Name, got, c.want)
		}
	}
}

func TestPrecedence(t *testing.T) {
	m := func(kind int, path, method string, headers, query int) *entry {
		e := &entry{m: match{pathKind: kind, path: path, method: method}, src: &source{key: "ns/r"}}
		for range headers {
			e.m.headers = append(e.m.headers, kv{})
		}
		for range query {
			e.m.query = append(e.m.query, kv{})
		}
		return e
	}
	ordered := []*entry{
		m(pathExact, "/a/b", "", 0, 0),
		m(pathExact, "/a", "", 0, 0),
		m(pathRegex, "/a/.*", "", 0, 0),
		m(pathPrefix, "/a/b", "", 0, 0),
		m(pathPrefix, "/a", "GET", 0, 0),
		m(pathPrefix, "/a", "", 2, 0),
		m(pathPrefix, "/a", "", 1, 1),
		m(pathPrefix, "/a", "", 1, 0),
		m(pathPrefix, "/", "", 0, 0),
	}
	for i := range ordered {
		for j := range ordered {
			if got := less(ordered[i], ordered[j]); got != (i < j) {
				t.Errorf("less(%d, %d) = %v", i, j, got)
			}
		}
	}
}

// FuzzBuild feeds arbitrary HTTPRoutes through the translation and the
// waypoint's compiler: no panic, and nothing the control plane sends is
// refused by the proxy.
func FuzzBuild(f *testing.F) {
	f.Add(`{"spec":{"parentRefs":[{"kind":"Service","group":"","name":"echo"}],"rules":[{"matches":[{"path":{"type":"PathPrefix","value":"/a/"}}],"backendRefs":[{"name":"echo","port":80}]}]}}`)
	f.Add(`{"spec":{"parentRefs":[{"kind":"Service","name":"echo"}],"rules":[{"filters":[{"type":"RequestHeaderModifier","requestHeaderModifier":{"set":[{"name":"X","value":"1"}]}}],"backendRefs":[{"name":"echo","port":80,"weight":0}]}]}}`)
	f.Fuzz(func(t *testing.T, spec string) {
		var r gwv1.HTTPRoute
		if json.Unmarshal([]byte(spec), &r) != nil {
			return
		}
		fx := load(t, "testdata/basic.yaml")
		r.Namespace, r.Name = "wp-demo", "fuzz"
		_ = fx.st.HTTPRoutes.Add(&r)
		res, _ := Build(testMesh, ambient.NewWaypoint(fx.gateways[0], ""), fx.st)
		for _, m := range res[resource.RouteType] {
			if _, err := route.Compile(m.(*routev3.RouteConfiguration)); err != nil && validRoute(&r) {
				t.Fatalf("a route the API server accepts was refused by the proxy: %v", err)
			}
		}
	})
}

// validRoute approximates the API server's validation of the fields the
// fuzzer varies: paths start with '/', header names are tokens.
func validRoute(r *gwv1.HTTPRoute) bool {
	for _, ru := range r.Spec.Rules {
		for _, m := range ru.Matches {
			if m.Path != nil && m.Path.Value != nil && !strings.HasPrefix(*m.Path.Value, "/") {
				return false
			}
			if m.Path != nil && m.Path.Value != nil && strings.ContainsAny(*m.Path.Value, "?#") {
				return false
			}
			if m.Path != nil && m.Path.Type != nil && *m.Path.Type == gwv1.PathMatchRegularExpression {
				return false
			}
			for _, h := range m.Headers {
				if h.Type != nil && *h.Type == gwv1.HeaderMatchRegularExpression {
					return false
				}
				if !isToken(string(h.Name)) {
					return false
				}
			}
			for _, q := range m.QueryParams {
				if q.Type != nil && *q.Type == gwv1.QueryParamMatchRegularExpression {
					return false
				}
			}
		}
		for _, fl := range ru.Filters {
			for _, hf := range []*gwv1.HTTPHeaderFilter{fl.RequestHeaderModifier, fl.ResponseHeaderModifier} {
				if hf == nil {
					continue
				}
				for _, h := range append(slices.Clone(hf.Set), hf.Add...) {
					if !isToken(string(h.Name)) || strings.ContainsAny(h.Value, "\r\n\x00") {
						return false
					}
				}
			}
		}
	}
	return true
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) {
			return false
		}
	}
	return true
}

// TestTCPPolicy: the L4 part of the AuthorizationPolicies guards the TCP
// chains, with Istio's rule for HTTP-only fields: an ALLOW rule that has
// any never matches, a DENY or AUDIT rule loses them (and so matches more).
func TestTCPPolicy(t *testing.T) {
	f := load(t, "testdata/tcp-policy.yaml")
	res, _ := Build(testMesh, ambient.NewWaypoint(f.gateways[0], ""), f.st)
	snap := compiled(t, res)
	const (
		api     = "spiffe://cluster.local/ns/shop/sa/api"
		batch   = "spiffe://cluster.local/ns/batch/sa/job"
		web     = "spiffe://cluster.local/ns/web/sa/front"
		outside = "spiffe://cluster.local/ns/other/sa/x"
	)
	type req struct {
		target    string
		principal string
		remote    string
	}
	allowed := func(r req) (bool, string) {
		target := netip.MustParseAddrPort(r.target)
		ch := snap.Chain(target)
		if ch == nil || ch.TCPCluster == "" {
			return false, "no TCP chain"
		}
		rr := &rbac.Request{Principal: r.principal, DstPort: uint32(target.Port())}
		if r.remote != "" {
			rr.RemoteIP = netip.MustParseAddr(r.remote)
			rr.DirectIP = rr.RemoteIP
		}
		for _, f := range ch.NetRBAC {
			if res := f.Evaluate(rr); res.Denied {
				return false, "denied by " + res.Policy
			}
		}
		return true, ""
	}
	// The chains each kind of port gets.
	for _, c := range []struct {
		target, proto string
		want          string // "http", "tcp" or "" for none
	}{
		{"10.96.1.10:5432", "", "tcp"},
		{"10.96.1.10:5432", config.ProtoHTTP11, "tcp"}, // TCP port: never parsed
		{"10.96.1.10:443", config.ProtoH2C, "tcp"},     // TLS port: relayed
		{"10.96.1.11:7000", "", "tcp"},                 // unknown: detected
		{"10.96.1.11:7000", config.ProtoHTTP11, "http"},
		{"10.96.1.11:7000", config.ProtoH2C, "http"},
		{"10.96.1.11:8080", "", "http"}, // HTTP port: anything else gets 400
		{"10.0.3.4:1234", "", "tcp"},    // a workload's ports are unknown
		{"10.0.3.4:1234", config.ProtoHTTP11, "http"},
	} {
		target := netip.MustParseAddrPort(c.target)
		got := ""
		switch ch := snap.Select(target, c.proto); {
		case ch == nil:
		case ch.HTTP != nil:
			got = "http"
		default:
			got = "tcp"
		}
		if got != c.want {
			t.Errorf("%s detected as %q: chain %q, want %q", c.target, c.proto, got, c.want)
		}
		if d := config.Detects(snap.Chains(target)); d != (c.target == "10.96.1.11:7000" || c.target == "10.0.3.4:1234") {
			t.Errorf("%s: detects %v", c.target, d)
		}
	}
	for _, c := range []struct {
		name string
		r    req
		want bool
	}{
		{"allowed principal on its port", req{"10.96.1.10:5432", api, ""}, true},
		{"allowed principal on another port", req{"10.96.1.10:443", api, ""}, false},
		{"principal of no rule", req{"10.96.1.10:5432", outside, ""}, false},
		{"ALLOW rule with a method: never on TCP", req{"10.96.1.10:5432", web, ""}, false},
		{"when source.ip and destination.port", req{"10.96.1.10:443", outside, "192.168.7.9"}, true},
		{"when source.ip on the wrong port", req{"10.96.1.10:5432", outside, "192.168.7.9"}, false},
		{"DENY with a path denies the namespace on TCP", req{"10.96.1.10:5432", batch, ""}, false},
		{"DENY with a header condition denies its L4 part", req{"10.96.1.10:5432", api, "10.9.1.1"}, true},
		{"DENY with a header condition, outsider", req{"10.96.1.10:443", outside, "10.9.1.1"}, false},
		{"Gateway DENY on remoteIpBlocks", req{"10.96.1.10:5432", api, "203.0.113.5"}, false},
		{"Gateway DENY with requestPrincipals denies the namespace", req{"10.96.1.10:5432", "spiffe://cluster.local/ns/quarantine/sa/a", ""}, false},
		{"ALLOW with only HTTP fields allows nobody on TCP", req{"10.96.1.11:7000", api, ""}, false},
		{"workload chain: Gateway DENY applies", req{"10.0.3.4:5432", api, "203.0.113.5"}, false},
		{"workload chain: no ALLOW applies", req{"10.0.3.4:5432", outside, ""}, true},
	} {
		got, why := allowed(c.r)
		if got != c.want {
			t.Errorf("%s: allowed %v (%s), want %v", c.name, got, why, c.want)
		}
	}
}

// TestPathNormalization: every HTTP chain (Service and workload) carries
// the mesh's setting as Istio writes it, and the waypoint compiles it to
// the normalization it names.
func TestPathNormalization(t *testing.T) {
	f := load(t, "testdata/basic.yaml")
	for in, want := range map[string]urlpath.Options{
		"":                         {RFC3986: true},
		"DEFAULT":                  {RFC3986: true},
		"NONE":                     {},
		"BASE":                     {RFC3986: true},
		"merge_slashes":            {RFC3986: true, MergeSlashes: true},
		"DECODE_AND_MERGE_SLASHES": {RFC3986: true, MergeSlashes: true, EscapedSlashes: urlpath.UnescapeAndForward},
	} {
		p, err := ParsePathNormalization(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		mesh := testMesh
		mesh.PathNormalization = p
		wp := ambient.NewWaypoint(f.gateways[0], "")
		wp.For = "all"
		res, _ := Build(mesh, wp, f.st)
		snap := compiled(t, res)
		n := 0
		for _, ch := range snap.Listener.Chains {
			if ch.HTTP == nil {
				continue
			}
			n++
			if ch.HTTP.Path != want {
				t.Errorf("%q: chain %s normalizes %+v, want %+v", in, ch.Name, ch.HTTP.Path, want)
			}
		}
		if n == 0 {
			t.Fatalf("%q: no HTTP chain", in)
		}
	}
	for _, bad := range []string{"MERGE", "base64", "NONE,BASE"} {
		if _, err := ParsePathNormalization(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

// TestHTTPRouteHugeWeights: an HTTPRoute's weights are held to Gateway
// API's bounds as a TCPRoute's are. Without that, weights past the schema's
// (an API server without it) add up past 2^32, and the split either wraps
// (one backend takes nearly everything) or is refused by the waypoint,
// freezing every Service on it.
func TestHTTPRouteHugeWeights(t *testing.T) {
	for _, copies := range []int{2, 2500} {
		f := load(t, "testdata/basic.yaml")
		o, _, _ := f.st.HTTPRoutes.GetByKey("wp-demo/echo")
		r := o.(*gwv1.HTTPRoute).DeepCopy()
		last := &r.Spec.Rules[len(r.Spec.Rules)-1]
		huge := int32(math.MaxInt32)
		two := last.BackendRefs
		last.BackendRefs = nil
		for range copies {
			for _, br := range two {
				br.Weight = &huge
				last.BackendRefs = append(last.BackendRefs, br)
			}
		}
		if err := f.st.HTTPRoutes.Update(r); err != nil {
			t.Fatal(err)
		}
		res, _ := Build(testMesh, ambient.NewWaypoint(f.gateways[0], ""), f.st)
		snap := compiled(t, res)
		var split int
		for _, tbl := range snap.Routes {
			for _, rt := range tbl.Routes {
				if len(rt.Clusters) < 2 {
					continue
				}
				split++
				var sum uint64
				for _, c := range rt.Clusters {
					sum += uint64(c.Weight)
					if c.Weight != rt.Clusters[0].Weight {
						t.Errorf("%d backendRefs: weights %+v, want them equal", 2*copies, rt.Clusters)
					}
				}
				if sum != uint64(rt.TotalWeight) {
					t.Errorf("%d backendRefs: weights add up to %d, the route's total is %d", 2*copies, sum, rt.TotalWeight)
				}
			}
		}
		if split == 0 {
			t.Fatalf("%d backendRefs: no weighted route compiled", 2*copies)
		}
	}
}
