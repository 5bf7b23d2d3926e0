package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpopts "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/waypoint/config"
)

const svcHost = "echo.demo.svc.cluster.local"

var vip = netip.MustParseAddrPort("10.96.0.10:80")

type mesh struct {
	t      testing.TB
	ca     *spiffe.CA
	store  *config.Store
	client *hbone.Dialer
	wpAddr netip.AddrPort
	src    spiffeid.ID
	wpID   spiffeid.ID
	reg    *prometheus.Registry
	p      *Proxy
	// hcm adjusts the listener's http_connection_manager, when set.
	hcm func(*hcmv3.HttpConnectionManager)
}

func mustAny(t testing.TB, m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// newMesh starts a waypoint on loopback; opts adjust its Config.
func newMesh(t testing.TB, opts ...func(*Config)) *mesh {
	ca, err := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	if err != nil {
		t.Fatal(err)
	}
	wp, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "waypoint")
	svid, err := ca.IssueSVID(wp, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	m := &mesh{t: t, ca: ca, store: config.NewStore(), wpID: wp.ID(), reg: prometheus.NewRegistry()}
	cfg := Config{Identity: wp.ID(), Certificate: spiffe.StaticCertificate(svid), Roots: ca.Roots(), Store: m.store,
		Metrics: NewMetrics(m.reg), Logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.p = p
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.wpAddr = ln.Addr().(*net.TCPAddr).AddrPort()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Serve(ctx, ln); close(done) }()
	src, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "client", "sleep")
	m.src = src.ID()
	csvid, err := ca.IssueSVID(src, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	m.client, err = hbone.NewDialer(hbone.DialerConfig{TLS: func(_ spiffeid.ID, peers []spiffeid.ID) (*tls.Config, error) {
		return spiffe.ClientConfig(spiffe.StaticCertificate(csvid), ca.Roots(), peers), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.client.Close(); cancel(); <-done })
	return m
}

// backend is a plain HTTP server on loopback answering with its name.
func backend(t testing.TB, name string, h http.HandlerFunc) netip.AddrPort {
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("x-backend", name)
			fmt.Fprintf(w, "%s %s %s", name, r.URL.Path, r.Header.Get("traceparent"))
		}
	}
	return serveHTTP(t, h, nil)
}

// serveHTTP serves h over HTTP/1.1 and h2c on loopback; tweak adjusts the
// server before it starts.
func serveHTTP(t testing.TB, h http.Handler, tweak func(*http.Server)) netip.AddrPort {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	if tweak != nil {
		tweak(srv)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func hcm(t testing.TB, tweak func(*hcmv3.HttpConnectionManager), filters ...*hcmv3.HttpFilter) *anypb.Any {
	filters = append(filters, &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &routerv3.Router{})}})
	m := &hcmv3.HttpConnectionManager{
		StatPrefix:     "x",
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: svcHost + ":80"}},
		HttpFilters:    filters,
	}
	if tweak != nil {
		tweak(m)
	}
	return mustAny(t, m)
}

func (m *mesh) apply(routes []*routev3.Route, backends map[string][]netip.AddrPort, filters ...*hcmv3.HttpFilter) {
	clusters := map[string]clusterSpec{}
	for name, addrs := range backends {
		var cs clusterSpec
		for _, a := range addrs {
			cs.eps = append(cs.eps, endpointSpec{addr: a})
		}
		clusters[name] = cs
	}
	m.applyClusters(routes, clusters, filters...)
}

// clusterSpec is a test cluster.
type clusterSpec struct {
	eps    []endpointSpec
	http2  bool                                  // explicit HTTP/2 (h2c) upstream
	limits *clusterv3.CircuitBreakers_Thresholds // circuit_breakers.thresholds[0]
}

// endpointSpec is a test endpoint.
type endpointSpec struct {
	addr netip.AddrPort
	// identity, when set, makes the endpoint an HBONE one that must present
	// this SPIFFE ID.
	identity string
	// authority, when set, makes the HBONE endpoint a relay asked for it.
	authority netip.AddrPort
}

// applyClusters pushes the listener, the route table and clusters with
// their endpoints.
func (m *mesh) applyClusters(routes []*routev3.Route, clusters map[string]clusterSpec, filters ...*hcmv3.HttpFilter) {
	t := m.t
	l := &listenerv3.Listener{Name: "waypoint", FilterChains: []*listenerv3.FilterChain{{
		Name: svcHost + ":80",
		FilterChainMatch: &listenerv3.FilterChainMatch{
			PrefixRanges:    []*corev3.CidrRange{{AddressPrefix: vip.Addr().String(), PrefixLen: wrapperspb.UInt32(32)}},
			DestinationPort: wrapperspb.UInt32(80),
		},
		Filters: []*listenerv3.Filter{{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm(t, m.hcm, filters...)}}},
	}}}
	if err := m.store.ApplyListeners(map[string]*anypb.Any{"waypoint": mustAny(t, l)}, nil); err != nil {
		t.Fatal(err)
	}
	rc := &routev3.RouteConfiguration{Name: svcHost + ":80", VirtualHosts: []*routev3.VirtualHost{{Name: svcHost + ":80", Domains: []string{"*"}, Routes: routes}}}
	if err := m.store.ApplyRoutes(map[string]*anypb.Any{rc.Name: mustAny(t, rc)}, nil); err != nil {
		t.Fatal(err)
	}
	cl, cla := map[string]*anypb.Any{}, map[string]*anypb.Any{}
	for name, cs := range clusters {
		c := &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{}, ConnectTimeout: durationpb.New(time.Second)}
		if cs.limits != nil {
			c.CircuitBreakers = &clusterv3.CircuitBreakers{Thresholds: []*clusterv3.CircuitBreakers_Thresholds{cs.limits}}
		}
		if cs.http2 {
			c.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(t, &httpopts.HttpProtocolOptions{
				UpstreamProtocolOptions: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}})}
		}
		cl[name] = mustAny(t, c)
		var les []*endpointv3.LbEndpoint
		for _, ep := range cs.eps {
			fields := map[string]any{"tunnel": "", "workload": name, "namespace": "demo", "workload_name": name}
			if ep.identity != "" {
				fields["tunnel"], fields["identity"] = "HBONE", ep.identity
			}
			if ep.authority.IsValid() {
				fields["authority"] = ep.authority.String()
			}
			md, err := structpb.NewStruct(fields)
			if err != nil {
				t.Fatal(err)
			}
			les = append(les, &endpointv3.LbEndpoint{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: ep.addr.Addr().String(), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(ep.addr.Port())}}}}}},
				HealthStatus: corev3.HealthStatus_HEALTHY,
				Metadata:     &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"weft": md}},
			})
		}
		cla[name] = mustAny(t, &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: les}}})
	}
	if err := m.store.ApplyClusters(cl, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.store.ApplyEndpoints(cla, nil); err != nil {
		t.Fatal(err)
	}
}

// dial opens a CONNECT to target through the waypoint.
func (m *mesh) dial(target netip.AddrPort) (net.Conn, error) {
	return m.client.Dial(context.Background(), hbone.Target{Source: m.src, Peers: []spiffeid.ID{m.wpID}, Addr: m.wpAddr, Authority: target.String(),
		Header: http.Header{"Baggage": {"k8s.namespace.name=client,k8s.deployment.name=sleep"}}})
}

func (m *mesh) do(req *http.Request) *http.Response {
	m.t.Helper()
	c, err := m.dial(vip)
	if err != nil {
		m.t.Fatal(err)
	}
	if err := req.Write(c); err != nil {
		m.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		m.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	c.Close()
	return resp
}

// downstream is one HTTP/1.1 connection through the waypoint, for
// requests in sequence.
type downstream struct {
	t  testing.TB
	c  net.Conn
	br *bufio.Reader
}

// h1 opens a CONNECT to target for HTTP/1.1 requests; closed at the end of
// the test.
func (m *mesh) h1(target netip.AddrPort) *downstream {
	m.t.Helper()
	c, err := m.dial(target)
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { c.Close() })
	return &downstream{t: m.t, c: c, br: bufio.NewReader(c)}
}

// do sends req and returns its response with the body read.
func (d *downstream) do(req *http.Request) *http.Response {
	d.t.Helper()
	d.c.SetDeadline(time.Now().Add(10 * time.Second))
	defer d.c.SetDeadline(time.Time{})
	if err := req.Write(d.c); err != nil {
		d.t.Fatal(err)
	}
	resp, err := http.ReadResponse(d.br, req)
	if err != nil {
		d.t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatalf("reading the body of %s %s: %v", req.Method, req.URL.Path, err)
	}
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp
}

func get(path string, hdr ...string) *http.Request {
	r, _ := http.NewRequest("GET", "http://"+svcHost+path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	return r
}

func body(r *http.Response) string { b, _ := io.ReadAll(r.Body); return string(b) }

func toCluster(name string) *routev3.Route_Route {
	return &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name}}}
}

func prefix(p string) *routev3.RouteMatch {
	return &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: p}}
}

func TestRoutingWeightsAndMetrics(t *testing.T) {
	m := newMesh(t)
	v1, v2 := backend(t, "v1", nil), backend(t, "v2", nil)
	m.apply([]*routev3.Route{
		{Name: "canary", Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: []*routev3.HeaderMatcher{{Name: "x-canary",
			HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "yes"}}}}}},
			Action: toCluster("outbound|80||v2")},
		{Name: "split", Match: prefix("/"), Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{
			Clusters: []*routev3.WeightedCluster_ClusterWeight{{Name: "outbound|80||v1", Weight: wrapperspb.UInt32(90)}, {Name: "outbound|80||v2", Weight: wrapperspb.UInt32(10)}}}}}}},
	}, map[string][]netip.AddrPort{"outbound|80||v1": {v1}, "outbound|80||v2": {v2}})

	if r := m.do(get("/a", "x-canary", "yes")); !strings.HasPrefix(body(r), "v2 /a") {
		t.Fatalf("canary went elsewhere: %d", r.StatusCode)
	}
	r := m.do(get("/a", "traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
	if b := body(r); !strings.Contains(b, "0af7651916cd43dd8448eb211c80319c") || strings.Contains(b, "b7ad6b7169203331") {
		t.Fatalf("traceparent not propagated with a new span: %q", b)
	}
	const n = 1000
	var c2 int
	for range n {
		if strings.HasPrefix(body(m.do(get("/"))), "v2") {
			c2++
		}
	}
	// Binomial(1000, 0.1): mean 100, sd 9.5; 6 sd either side.
	if c2 < 43 || c2 > 157 {
		t.Fatalf("v2 got %d of %d, want about 100", c2, n)
	}
	// The last request may be recorded just after its response is read.
	if got := m.requests(t, "200"); got < n+1 {
		t.Fatalf("istio_requests_total{response_code=200} = %v, want %d", got, n+2)
	}
}

// requests counts istio_requests_total with response_code code.
func (m *mesh) requests(t *testing.T, code string) float64 {
	return m.counted(t, "response_code", code)
}

// counted sums istio_requests_total over the series whose label is value.
func (m *mesh) counted(t *testing.T, label, value string) float64 {
	return m.sumWhere(t, "istio_requests_total", label, value)
}

// sum adds up a counter over all its series.
func (m *mesh) sum(t *testing.T, name string) float64 { return m.sumWhere(t, name, "", "") }

// sumWhere adds up counter name over its series whose label has value
// (every series when label is "").
func (m *mesh) sumWhere(t *testing.T, name, label, value string) float64 {
	return sumWhere(t, m.reg, name, label, value)
}

// sumWhere is mesh.sumWhere over reg.
func sumWhere(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if label == "" {
				sum += mt.GetCounter().GetValue()
				continue
			}
			for _, l := range mt.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					sum += mt.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func TestFaults(t *testing.T) {
	m := newMesh(t)
	var calls atomic.Int32
	flaky := backend(t, "flaky", func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(503)
			return
		}
		io.WriteString(w, "ok")
	})
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	slow := backend(t, "slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	})
	ok := backend(t, "ok", nil)
	// A listener that resets every connection.
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Close() })
	go func() {
		for {
			c, err := rl.Accept()
			if err != nil {
				return
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Read(make([]byte, 1))
			c.Close()
		}
	}()
	reset := rl.Addr().(*net.TCPAddr).AddrPort()
	deny := &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{"ns-demo-deny": {
		Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "/admin"}}}}}}},
		Principals:  []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}},
	}}}
	m.apply([]*routev3.Route{
		{Name: "retry", Match: prefix("/retry"), Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "flaky"},
			RetryPolicy: &routev3.RetryPolicy{RetryOn: "5xx", NumRetries: wrapperspb.UInt32(2), RetryBackOff: &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(time.Millisecond)}}}}},
		{Name: "timeout", Match: prefix("/slow"), Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "slow"}, Timeout: durationpb.New(200 * time.Millisecond)}}},
		{Name: "reset", Match: prefix("/reset"), Action: toCluster("reset")},
		{Name: "missing", Match: prefix("/missing"), Action: toCluster("nope")},
		{Name: "default", Match: prefix("/"), Action: toCluster("ok")},
	}, map[string][]netip.AddrPort{"flaky": {flaky}, "slow": {slow}, "ok": {ok}, "reset": {reset}},
		&hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rbacfilter.RBAC{Rules: deny})}})

	for _, tc := range []struct {
		path string
		code int
		body string
	}{
		{"/retry", 200, "ok"},
		{"/slow", 504, "upstream request timeout"},
		{"/reset", 503, ""},
		{"/missing", 503, "no healthy upstream"},
		{"/admin/x", 403, "RBAC: access denied"},
		{"/other", 200, "ok /other"},
	} {
		r := m.do(get(tc.path))
		if b := body(r); r.StatusCode != tc.code || !strings.Contains(b, tc.body) {
			t.Errorf("%s: %d %q, want %d %q", tc.path, r.StatusCode, b, tc.code, tc.body)
		}
	}
	if got := m.requests(t, "403"); got != 1 {
		t.Errorf("403s counted %v, want 1", got)
	}
	if got := m.requests(t, "504"); got != 1 {
		t.Errorf("504s counted %v, want 1", got)
	}

	// Unknown target: 404 on the CONNECT.
	_, err = m.dial(netip.MustParseAddrPort("10.96.0.99:80"))
	if se, ok := err.(*hbone.StatusError); !ok || se.Code != 404 {
		t.Errorf("unknown target: %v, want a 404", err)
	}

	// Malformed HTTP: 400.
	c, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET /x HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n")
	line, _ := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if !strings.Contains(line, "400") {
		t.Errorf("malformed request answered %q", line)
	}

	// h2c prior knowledge.
	c, err = m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 x/net's client, independent of the waypoint's (net/http's)
	cc, err := (&http2.Transport{AllowHTTP: true}).NewClientConn(c)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cc.RoundTrip(get("/h2"))
	if err != nil {
		t.Fatal(err)
	}
	if b := body(r); r.StatusCode != 200 || !strings.HasPrefix(b, "ok /h2") {
		t.Errorf("h2c: %d %q", r.StatusCode, b)
	}
	cc.Close()
	c.Close()
}

// TestTCPFallback: on a port whose protocol is detected, bytes that are not
// HTTP go to the TCP chain.
func TestTCPFallback(t *testing.T) {
	m := newMesh(t)
	echo, _ := echoServer(t)
	m.apply([]*routev3.Route{{Match: prefix("/"), Action: toCluster("outbound|80||" + svcHost)}},
		map[string][]netip.AddrPort{"outbound|80||" + svcHost: {echo}})
	m.applySniffed(nil, nil, "outbound|80||"+svcHost)
	c, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := "\x16\x03\x01 not http at all, long enough to be sure"
	io.WriteString(c, msg)
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo: %q %v", buf, err)
	}
}

// TestTCPRelayPassesResets: a TCP chain's relay passes a reset on either
// way, as the peer that reset would have been seen directly: an upstream
// that resets its connection resets the client's stream (the client does
// not read an end it could take for a complete answer), and a client that
// resets its stream resets the upstream's connection.
func TestTCPRelayPassesResets(t *testing.T) {
	m := newMesh(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	upstreamRead := make(chan error, 1)
	go func() {
		for first := true; ; first = false {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 5)
			io.ReadFull(c, buf)
			if first { // the upstream resets
				c.Write([]byte("partial"))
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
				continue
			}
			c.Write([]byte("ok")) // the client resets
			_, err = c.Read(buf)
			upstreamRead <- err
			c.Close()
		}
	}()
	up := ln.Addr().(*net.TCPAddr).AddrPort()
	m.apply([]*routev3.Route{{Match: prefix("/"), Action: toCluster("outbound|80||" + svcHost)}},
		map[string][]netip.AddrPort{"outbound|80||" + svcHost: {up}})
	m.applySniffed(nil, nil, "outbound|80||"+svcHost)

	c, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "\x16\x03\x01xx")
	got, err := io.ReadAll(c)
	var re *hbone.ResetError
	if !errors.As(err, &re) || !re.Remote {
		t.Errorf("after the upstream's reset the client read %q and %v, want its stream reset", got, err)
	}

	c2, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c2, "\x16\x03\x01xx")
	if _, err := io.ReadFull(c2, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	c2.(*hbone.Stream).SetLinger(0)
	c2.Close()
	select {
	case err := <-upstreamRead:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("after the client's reset the upstream read %v, want a reset", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's read did not end after the client's reset")
	}
}

// TestPolicyUpdateOpenConnection: an AuthorizationPolicy's RBAC filter
// added or removed while a client holds a keep-alive connection applies to
// that connection's next request, not only to new connections.
func TestPolicyUpdateOpenConnection(t *testing.T) {
	m := newMesh(t)
	ok := backend(t, "ok", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok "+r.URL.Path) })
	routes := []*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("ok")}}
	backends := map[string][]netip.AddrPort{"ok": {ok}}
	deny := &hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rbacfilter.RBAC{Rules: &rbacv3.RBAC{
		Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{"deny-admin": {
			Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "/admin"}}}}}}},
			Principals:  []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}},
		}}}})}}
	m.apply(routes, backends)
	c := m.h1(vip)
	expect := func(when, path string, code int) {
		t.Helper()
		if r := c.do(get(path)); r.StatusCode != code {
			t.Errorf("%s: %s answered %d %q, want %d", when, path, r.StatusCode, body(r), code)
		}
	}
	expect("before the policy", "/admin", 200)
	m.apply(routes, backends, deny)
	expect("with the policy", "/admin", 403)
	expect("with the policy", "/other", 200)
	m.apply(routes, backends)
	expect("after the policy", "/admin", 200)
}
