package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
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
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/internal/testpki"
	"github.com/weftmesh/weft/waypoint/config"
)

// gatewayFixture is a proxy in gateway mode on 127.0.0.1, with a test CA
// for the listeners' certificates and a plain HTTP backend echoing what it
// received.
type gatewayFixture struct {
	t       testing.TB
	store   *config.Store
	p       *Proxy
	reg     *prometheus.Registry
	root    *testpki.Cert
	roots   *x509.CertPool
	backend netip.AddrPort
	// ignorePort sets ignore_port_in_host_matching on the route
	// configurations apply pushes.
	ignorePort bool
}

func newGatewayFixture(t testing.TB) *gatewayFixture {
	ca, err := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "web-istio")
	svid, err := ca.IssueSVID(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	g := &gatewayFixture{t: t, store: config.NewStore(), reg: prometheus.NewRegistry()}
	g.p, err = New(Config{Identity: id.ID(), Certificate: spiffe.StaticCertificate(svid), Roots: ca.Roots(), Store: g.store,
		Metrics: NewMetrics(g.reg), Logger: slog.New(slog.DiscardHandler), Gateway: true, GatewayHost: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if g.root, err = testpki.NewRoot("gateway test root"); err != nil {
		t.Fatal(err)
	}
	g.roots = x509.NewCertPool()
	g.roots.AddCert(g.root.Cert)
	g.backend = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Envoy-Original-Path", "X-Envoy-Internal", "X-Request-Id", "Traceparent"} {
			w.Header()["Seen-"+h] = r.Header.Values(h)
		}
		w.Header().Set("Seen-Host", r.Host)
		w.Header().Set("Seen-Proto", r.Proto)
		fmt.Fprintf(w, "backend %s", r.URL.Path)
	}), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.p.ServeGateway(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return g
}

// freePort returns a loopback port nothing listens on just now.
func freePort(t testing.TB) uint16 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).AddrPort().Port()
}

const backendCluster = "outbound|80||backend.demo.svc.cluster.local"

// gatewayHCM is the http_connection_manager the control plane gives
// ingress gateway chains, with rbac filters before the router.
func gatewayHCM(t testing.TB, rds string, filters ...*hcmv3.HttpFilter) *listenerv3.Filter {
	filters = append(filters, &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &routerv3.Router{})}})
	h := &hcmv3.HttpConnectionManager{StatPrefix: rds,
		RouteSpecifier:   &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: rds}},
		UseRemoteAddress: wrapperspb.Bool(true),
		StripPortMode:    &hcmv3.HttpConnectionManager_StripAnyHostPort{StripAnyHostPort: true},
		NormalizePath:    wrapperspb.Bool(true),
		HttpFilters:      filters,
	}
	return &listenerv3.Filter{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, h)}}
}

func gatewayAddr(port uint16) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: "0.0.0.0", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}}}}
}

func httpListener(t testing.TB, port uint16, filters ...*hcmv3.HttpFilter) *listenerv3.Listener {
	return &listenerv3.Listener{Name: "0.0.0.0_" + strconv.Itoa(int(port)), Address: gatewayAddr(port),
		FilterChains: []*listenerv3.FilterChain{{Name: "http/" + strconv.Itoa(int(port)), Filters: []*listenerv3.Filter{gatewayHCM(t, "http."+strconv.Itoa(int(port)), filters...)}}}}
}

// tlsChain is an HTTPS chain for server names, with a certificate for
// certNames, routed by rds.
func (g *gatewayFixture) tlsChain(name string, serverNames, certNames []string, rds string) *listenerv3.FilterChain {
	fc := &listenerv3.FilterChain{Name: name, Filters: []*listenerv3.Filter{gatewayHCM(g.t, rds)},
		TransportSocket: g.downstreamTLS(certNames, "h2", "http/1.1")}
	if len(serverNames) > 0 {
		fc.FilterChainMatch = &listenerv3.FilterChainMatch{ServerNames: serverNames}
	}
	return fc
}

// downstreamTLS is a TLS transport socket with a certificate for
// certNames, offering alpn.
func (g *gatewayFixture) downstreamTLS(certNames []string, alpn ...string) *corev3.TransportSocket {
	t := g.t
	c, err := g.root.Server(certNames[0], certNames, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := c.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	ctx := &tlsv3.DownstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsCertificates: []*tlsv3.TlsCertificate{{
			CertificateChain: &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: c.CertPEM()}},
			PrivateKey:       &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: key}},
		}},
		AlpnProtocols: alpn,
	}}
	return &corev3.TransportSocket{Name: config.TransportSocketTLS, ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: mustAny(t, ctx)}}
}

func tlsListener(t testing.TB, port uint16, chains ...*listenerv3.FilterChain) *listenerv3.Listener {
	return &listenerv3.Listener{Name: "0.0.0.0_" + strconv.Itoa(int(port)), Address: gatewayAddr(port),
		ListenerFilters: []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector",
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(t, &tlsinspector.TlsInspector{})}}},
		FilterChains: chains}
}

// direct is a virtual host answering every request with body.
func direct(domain, body string) *routev3.VirtualHost {
	return &routev3.VirtualHost{Name: domain, Domains: []string{domain}, Routes: []*routev3.Route{{Name: body,
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 200, Body: &corev3.DataSource{Specifier: &corev3.DataSource_InlineString{InlineString: body}}}}}}}
}

// toBackend is a virtual host sending every request to the backend.
func toBackend(domains ...string) *routev3.VirtualHost {
	return &routev3.VirtualHost{Name: domains[0], Domains: domains, Routes: []*routev3.Route{{Name: "backend",
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: backendCluster}}}}}}
}

// schemeVH is a virtual host answering https to requests whose :scheme is
// https, else http.
func schemeVH(domain string) *routev3.VirtualHost {
	vh := direct(domain, "http")
	https := direct(domain, "https").Routes[0]
	https.Match.Headers = []*routev3.HeaderMatcher{{Name: ":scheme", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
		StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "https"}}}}}
	vh.Routes = append([]*routev3.Route{https}, vh.Routes...)
	return vh
}

// passthroughVH is a virtual host sending every request to the
// passthrough cluster.
func passthroughVH(domain string) *routev3.VirtualHost {
	vh := toBackend(domain)
	vh.Routes[0].Action = &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: config.PassthroughCluster}}}
	return vh
}

// apply pushes listeners, route configurations and the backend's cluster.
func (g *gatewayFixture) apply(listeners []*listenerv3.Listener, routes map[string][]*routev3.VirtualHost) {
	t := g.t
	rs := map[string]*anypb.Any{}
	for name, vhs := range routes {
		rs[name] = mustAny(t, &routev3.RouteConfiguration{Name: name, VirtualHosts: vhs, IgnorePortInHostMatching: g.ignorePort})
	}
	if err := g.store.ApplyRoutes(rs, nil); err != nil {
		t.Fatal(err)
	}
	c := &clusterv3.Cluster{Name: backendCluster, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{}, ConnectTimeout: durationpb.New(time.Second)}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: backendCluster, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: g.backend.Addr().String(), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(g.backend.Port())}}}}}},
	}}}}}
	pt := &clusterv3.Cluster{Name: config.PassthroughCluster, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		LbPolicy: clusterv3.Cluster_CLUSTER_PROVIDED, ConnectTimeout: durationpb.New(time.Second)}
	if err := g.store.ApplyClusters(map[string]*anypb.Any{c.Name: mustAny(t, c), pt.Name: mustAny(t, pt)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := g.store.ApplyEndpoints(map[string]*anypb.Any{c.Name: mustAny(t, cla)}, nil); err != nil {
		t.Fatal(err)
	}
	ls := map[string]*anypb.Any{}
	for _, l := range listeners {
		ls[l.Name] = mustAny(t, l)
	}
	if err := g.store.ApplyListeners(ls, nil); err != nil {
		t.Fatal(err)
	}
	g.waitReady()
}

// waitReady waits until every listener is bound.
func (g *gatewayFixture) waitReady() {
	g.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for g.p.GatewayReady() != nil {
		if time.Now().After(deadline) {
			g.t.Fatalf("not ready: %v", g.p.GatewayReady())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gwGet sends an HTTP/1.1 request for host to 127.0.0.1:port through c.
func gwGet(t *testing.T, c *http.Client, scheme string, port uint16, host string, h http.Header) gwResp {
	t.Helper()
	req, err := http.NewRequest("GET", fmt.Sprintf("%s://127.0.0.1:%d/x/../p", scheme, port), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, vs := range h {
		req.Header[k] = vs
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", host, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return gwResp{resp, string(b)}
}

// gwResp is a response with its body read.
type gwResp struct {
	*http.Response
	body string
}

func plainClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// h2cClient is x/net's HTTP/2 client with prior knowledge: a peer
// independent of the proxy's net/http server.
func h2cClient(t *testing.T) *http.Client {
	//lint:ignore SA1019 x/net's client, independent of the waypoint's (net/http's)
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	//lint:ignore SA1019 x/net's client, as above
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func TestGatewayHTTP(t *testing.T) {
	g := newGatewayFixture(t)
	port := freePort(t)
	g.apply([]*listenerv3.Listener{httpListener(t, port)}, map[string][]*routev3.VirtualHost{
		"http." + strconv.Itoa(int(port)): {toBackend("foo.example.com"), direct("*.wild.example.com", "wild"), passthroughVH("loop.example.com")},
	})
	for name, c := range map[string]*http.Client{"HTTP/1.1": plainClient(t), "h2c": h2cClient(t)} {
		t.Run(name, func(t *testing.T) {
			// The client's forwarding headers: its X-Forwarded-For is kept with
			// the peer appended, its X-Forwarded-Proto replaced, its x-envoy-*
			// removed.
			resp := gwGet(t, c, "http", port, "foo.example.com", http.Header{"X-Forwarded-For": {"203.0.113.9"}, "X-Forwarded-Proto": {"https"},
				"X-Envoy-Original-Path": {"/admin"}, "X-Envoy-Internal": {"true"}})
			if resp.StatusCode != 200 || resp.body != "backend /p" {
				t.Fatalf("status %d %q", resp.StatusCode, resp.body)
			}
			if got := strings.Join(resp.Header.Values("Seen-X-Forwarded-For"), "|"); got != "203.0.113.9, 127.0.0.1" {
				t.Errorf("X-Forwarded-For upstream %q, want the client's then the peer", got)
			}
			if got := strings.Join(resp.Header.Values("Seen-X-Forwarded-Proto"), "|"); got != "http" {
				t.Errorf("X-Forwarded-Proto upstream %q, want http", got)
			}
			if v := resp.Header.Values("Seen-X-Envoy-Original-Path"); len(v) > 0 || len(resp.Header.Values("Seen-X-Envoy-Internal")) > 0 {
				t.Errorf("x-envoy-* reached the backend: %v", resp.Header)
			}
			// A client without X-Forwarded-For gets the peer alone.
			if got := gwGet(t, c, "http", port, "foo.example.com", nil).Header.Get("Seen-X-Forwarded-For"); got != "127.0.0.1" {
				t.Errorf("X-Forwarded-For %q, want 127.0.0.1", got)
			}
			for host, want := range map[string]string{
				"foo.example.com:8080":             "backend /p", // strip_any_host_port
				"FOO.Example.COM":                  "backend /p",
				"a.wild.example.com":               "wild",
				"a.b.wild.example.com":             "wild",
				"wild.example.com":                 "",
				"bar.example.com":                  "",
				"foo.example.com.":                 "",
				"foo.example.com:":                 "", // not a port: not stripped
				"127.0.0.1":                        "",
				"[::1]:" + strconv.Itoa(int(port)): "",
			} {
				resp := gwGet(t, c, "http", port, host, nil)
				switch {
				case want == "" && resp.StatusCode != 404:
					t.Errorf("Host %q: %d %q, want 404 (no virtual host)", host, resp.StatusCode, resp.body)
				case want != "" && (resp.StatusCode != 200 || resp.body != want):
					t.Errorf("Host %q: %d %q, want %q", host, resp.StatusCode, resp.body, want)
				}
			}
			// A passthrough cluster has no original destination to go to:
			// the gateway's own address would be a loop.
			if resp := gwGet(t, c, "http", port, "loop.example.com", nil); resp.StatusCode != 503 {
				t.Errorf("passthrough from a gateway: %d %q, want 503", resp.StatusCode, resp.body)
			}
			// The port is gone upstream too.
			if got := gwGet(t, c, "http", port, "foo.example.com:8080", nil).Header.Get("Seen-Host"); got != "foo.example.com" {
				t.Errorf("upstream Host %q, want foo.example.com", got)
			}
		})
	}
	// Istio's gateways report as the source.
	n, err := testutil.GatherAndCount(g.reg, "istio_requests_total")
	if err != nil || n == 0 {
		t.Fatalf("istio_requests_total: %d series, %v", n, err)
	}
	mfs, _ := g.reg.Gather()
	backendSeries := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["reporter"] != "source" || labels["source_principal"] != "unknown" || labels["connection_security_policy"] != "unknown" {
				t.Errorf("%s %v, want reporter=source, no principal or policy", mf.GetName(), labels)
			}
			if labels["destination_service"] == "backend.demo.svc.cluster.local" {
				backendSeries++
				if labels["destination_service_name"] != "backend" || labels["destination_service_namespace"] != "demo" {
					t.Errorf("%s %v: destination service name and namespace", mf.GetName(), labels)
				}
			}
		}
	}
	if backendSeries == 0 {
		t.Error("no series names the backend's service (from its cluster)")
	}
}

// Headers past the limit are refused as on the HBONE side, and bytes that
// are not HTTP (a TLS client on a plain port) are answered 400 and never
// relayed.
func TestGatewayAbuse(t *testing.T) {
	g := newGatewayFixture(t)
	port := freePort(t)
	g.apply([]*listenerv3.Listener{httpListener(t, port)}, map[string][]*routev3.VirtualHost{"http." + strconv.Itoa(int(port)): {toBackend("*")}})
	resp := gwGet(t, plainClient(t), "http", port, "foo", http.Header{"X-Big": {strings.Repeat("a", 70<<10)}})
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("oversized head: %d, want 431", resp.StatusCode)
	}
	// HTTP/2: 68 KiB in many fields is refused too, by the client that
	// read the server's SETTINGS_MAX_HEADER_LIST_SIZE or by the server.
	req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	for i := range 17 {
		req.Header.Set(fmt.Sprintf("X-Big-%d", i), strings.Repeat("a", 4<<10))
	}
	if r, err := h2cClient(t).Do(req); err == nil {
		r.Body.Close()
		if r.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("oversized h2c head: %d, want 431", r.StatusCode)
		}
	}
	c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{ServerName: "foo.example.com", RootCAs: g.roots})
	if err == nil {
		c.Close()
		t.Fatal("a TLS handshake succeeded on a plain port")
	}
	raw, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write([]byte("\x16\x03\x01\x00\x05hello"))
	hr, err := http.ReadResponse(bufio.NewReader(raw), nil)
	if err != nil || hr.StatusCode != 400 {
		t.Fatalf("not HTTP: %v %v, want 400", hr, err)
	}
}

// RBAC's remote_ip is the TCP peer: a client cannot claim another address
// in X-Forwarded-For.
func TestGatewayRemoteIPIgnoresXFF(t *testing.T) {
	g := newGatewayFixture(t)
	port := freePort(t)
	cidr := func(p string) *rbacv3.Principal {
		pf := netip.MustParsePrefix(p)
		return &rbacv3.Principal{Identifier: &rbacv3.Principal_RemoteIp{RemoteIp: &corev3.CidrRange{AddressPrefix: pf.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(pf.Bits()))}}}
	}
	allow := &hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rbacfilter.RBAC{Rules: &rbacv3.RBAC{
		Action: rbacv3.RBAC_ALLOW, Policies: map[string]*rbacv3.Policy{"ns-demo-allow-internal": {
			Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}},
			Principals:  []*rbacv3.Principal{cidr("10.0.0.0/8")},
		}}}})}}
	g.apply([]*listenerv3.Listener{httpListener(t, port, allow)}, map[string][]*routev3.VirtualHost{"http." + strconv.Itoa(int(port)): {toBackend("*")}})
	for _, xff := range []string{"", "10.1.2.3", "10.1.2.3, 10.4.5.6", "127.0.0.1, 10.1.2.3"} {
		h := http.Header{"X-Real-Ip": {"10.1.2.3"}, "Forwarded": {"for=10.1.2.3"}}
		if xff != "" {
			h.Set("X-Forwarded-For", xff)
		}
		if resp := gwGet(t, plainClient(t), "http", port, "foo", h); resp.StatusCode != 403 {
			t.Errorf("X-Forwarded-For %q: %d, want 403 (the peer is 127.0.0.1)", xff, resp.StatusCode)
		}
	}
	// The same policy admits the peer's own network.
	g.apply([]*listenerv3.Listener{httpListener(t, port, &hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rbacfilter.RBAC{Rules: &rbacv3.RBAC{
		Action: rbacv3.RBAC_ALLOW, Policies: map[string]*rbacv3.Policy{"loopback": {
			Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}},
			Principals:  []*rbacv3.Principal{cidr("127.0.0.0/8")},
		}}}})}})}, map[string][]*routev3.VirtualHost{"http." + strconv.Itoa(int(port)): {toBackend("*")}})
	if resp := gwGet(t, plainClient(t), "http", port, "foo", http.Header{"X-Forwarded-For": {"192.0.2.1"}}); resp.StatusCode != 200 {
		t.Errorf("loopback peer: %d, want 200", resp.StatusCode)
	}
}

// tlsClient speaks HTTP/1.1, or HTTP/2 when h2, over TLS with sni.
func (g *gatewayFixture) tlsClient(sni string, h2 bool) (*http.Client, *[]*x509.Certificate) {
	var peer []*x509.Certificate
	conf := &tls.Config{ServerName: sni, RootCAs: g.roots, NextProtos: []string{"http/1.1"},
		VerifyConnection: func(cs tls.ConnectionState) error { peer = cs.PeerCertificates; return nil }}
	if h2 {
		conf.NextProtos = []string{"h2"}
	}
	if sni == "" {
		// No SNI: verify the chain alone.
		conf.InsecureSkipVerify = true
	}
	tr := &http.Transport{TLSClientConfig: conf, ForceAttemptHTTP2: h2}
	g.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, &peer
}

func TestGatewayTLS(t *testing.T) {
	g := newGatewayFixture(t)
	port, strict := freePort(t), freePort(t)
	p, sp := strconv.Itoa(int(port)), strconv.Itoa(int(strict))
	g.apply([]*listenerv3.Listener{
		tlsListener(t, port,
			g.tlsChain("https/"+p+"/exact", []string{"a.example.com"}, []string{"a.example.com"}, "https."+p+".exact"),
			g.tlsChain("https/"+p+"/wild", []string{"*.example.com"}, []string{"*.example.com", "x.y.example.com"}, "https."+p+".wild"),
			g.tlsChain("https/"+p+"/deep", []string{"*.b.example.com"}, []string{"*.b.example.com"}, "https."+p+".deep"),
			g.tlsChain("https/"+p+"/default", nil, []string{"default.example.net", "example.com"}, "https."+p+".default")),
		tlsListener(t, strict, g.tlsChain("https/"+sp+"/only", []string{"only.example.com"}, []string{"only.example.com"}, "https."+sp+".only")),
	}, map[string][]*routev3.VirtualHost{
		"https." + p + ".exact":   {direct("a.example.com", "exact")},
		"https." + p + ".wild":    {direct("*.example.com", "wild"), toBackend("xfp.example.com"), schemeVH("scheme.example.com")},
		"https." + p + ".deep":    {direct("*.b.example.com", "deep")},
		"https." + p + ".default": {direct("*", "default")},
		"https." + sp + ".only":   {direct("only.example.com", "only")},
	})
	for _, h2 := range []bool{false, true} {
		proto := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]
		t.Run(proto, func(t *testing.T) {
			for _, tc := range []struct{ sni, host, want, cert string }{
				{"a.example.com", "a.example.com", "exact", "a.example.com"},
				{"A.EXAMPLE.COM", "a.example.com", "exact", "a.example.com"},
				{"c.example.com", "c.example.com", "wild", "*.example.com"},
				{"x.y.example.com", "x.y.example.com", "wild", "*.example.com"},
				{"x.b.example.com", "x.b.example.com", "deep", "*.b.example.com"},
				{"", "anything", "default", "default.example.net"},
				{"example.com", "example.com", "default", "default.example.net"},
				// A Host that another chain's server names take is
				// misdirected (421); one the connection's own chain takes is
				// routed by its route configuration alone.
				{"a.example.com", "c.example.com", "421", "a.example.com"},
				{"c.example.com", "a.example.com", "421", "*.example.com"},
				{"c.example.com", "x.b.example.com", "421", "*.example.com"},
				{"c.example.com", "d.example.com", "wild", "*.example.com"},
				{"", "a.example.com", "421", "default.example.net"},
				{"a.example.com", "a.example.com:" + p, "exact", "a.example.com"},
			} {
				c, peer := g.tlsClient(tc.sni, h2)
				resp := gwGet(t, c, "https", port, tc.host, nil)
				if resp.Proto != proto {
					t.Errorf("SNI %q: protocol %s, want %s", tc.sni, resp.Proto, proto)
				}
				if len(*peer) == 0 || (*peer)[0].DNSNames[0] != tc.cert {
					t.Errorf("SNI %q: certificate %v, want %s's", tc.sni, *peer, tc.cert)
				}
				switch {
				case tc.want == "421" && resp.StatusCode != 421:
					t.Errorf("SNI %q Host %q: %d %q, want 421", tc.sni, tc.host, resp.StatusCode, resp.body)
				case tc.want == "421":
				case tc.want == "" && resp.StatusCode != 404:
					t.Errorf("SNI %q Host %q: %d %q, want 404", tc.sni, tc.host, resp.StatusCode, resp.body)
				case tc.want != "" && resp.body != tc.want:
					t.Errorf("SNI %q Host %q: %d %q, want %q", tc.sni, tc.host, resp.StatusCode, resp.body, tc.want)
				}
			}
			c, _ := g.tlsClient("c.example.com", h2)
			if resp := gwGet(t, c, "https", port, "scheme.example.com", nil); resp.body != "https" {
				t.Errorf(":scheme matched %q, want https", resp.body)
			}
			resp := gwGet(t, c, "https", port, "xfp.example.com", http.Header{"X-Forwarded-Proto": {"http"}})
			if got := resp.Header.Get("Seen-X-Forwarded-Proto"); got != "https" {
				t.Errorf("X-Forwarded-Proto upstream %q, want https", got)
			}
		})
	}
	// Without a chain for the name, no certificate: the handshake fails.
	for _, sni := range []string{"other.example.com", "", "x.only.example.com"} {
		conf := &tls.Config{ServerName: sni, RootCAs: g.roots, InsecureSkipVerify: sni == ""}
		if c, err := tls.Dial("tcp", "127.0.0.1:"+sp, conf); err == nil {
			c.Close()
			t.Errorf("SNI %q: handshake succeeded on a listener without a default chain", sni)
		}
	}
	if c, err := tls.Dial("tcp", "127.0.0.1:"+sp, &tls.Config{ServerName: "only.example.com", RootCAs: g.roots}); err != nil {
		t.Errorf("only.example.com: %v", err)
	} else {
		c.Close()
	}
	// A client that does not speak TLS gets no HTTP answer.
	raw, err := net.Dial("tcp", "127.0.0.1:"+p)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	io.WriteString(raw, "GET / HTTP/1.1\r\nHost: a.example.com\r\n\r\n")
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(raw), nil); err == nil {
		t.Errorf("plain HTTP on a TLS port answered %d", resp.StatusCode)
	}
}

// Listeners follow the configuration: a removed one stops accepting while
// its open connections are served until they end; a port change rebinds;
// a port taken by another process keeps the gateway unready until it can
// bind it.
func TestGatewayListenerLifecycle(t *testing.T) {
	g := newGatewayFixture(t)
	port := freePort(t)
	routes := map[string][]*routev3.VirtualHost{"http." + strconv.Itoa(int(port)): {toBackend("*")}}
	g.apply([]*listenerv3.Listener{httpListener(t, port)}, routes)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	open, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	br := bufio.NewReader(open)
	roundTrip := func() int {
		t.Helper()
		io.WriteString(open, "GET / HTTP/1.1\r\nHost: foo\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if code := roundTrip(); code != 200 {
		t.Fatalf("first request: %d", code)
	}
	name := "0.0.0.0_" + strconv.Itoa(int(port))
	if err := g.store.ApplyListeners(nil, []string{name}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the listener to close", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if code := roundTrip(); code != 200 {
		t.Errorf("request on a drained listener's connection: %d, want 200", code)
	}
	if err := g.p.GatewayReady(); err != nil {
		t.Errorf("ready with no listeners: %v", err)
	}

	// Another process holds the new port: not ready until it is freed.
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	heldPort := held.Addr().(*net.TCPAddr).AddrPort().Port()
	l := httpListener(t, heldPort)
	l.Name = name
	if err := g.store.ApplyListeners(map[string]*anypb.Any{name: mustAny(t, l)}, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := g.p.GatewayReady(); err == nil || !strings.Contains(err.Error(), name) {
		t.Errorf("ready with port %d taken: %v", heldPort, err)
	}
	held.Close()
	g.apply([]*listenerv3.Listener{l}, map[string][]*routev3.VirtualHost{"http." + strconv.Itoa(int(heldPort)): {toBackend("*")}})
	if resp := gwGet(t, plainClient(t), "http", heldPort, "foo", nil); resp.StatusCode != 200 {
		t.Errorf("after rebinding: %d", resp.StatusCode)
	}

	// The same listener moves to another port: the old one closes.
	moved := freePort(t)
	l2 := httpListener(t, moved)
	l2.Name = name
	g.apply([]*listenerv3.Listener{l2}, map[string][]*routev3.VirtualHost{"http." + strconv.Itoa(int(moved)): {toBackend("*")}})
	waitFor(t, "the old port to close", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", heldPort))
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if resp := gwGet(t, plainClient(t), "http", moved, "foo", nil); resp.StatusCode != 200 {
		t.Errorf("on the new port: %d", resp.StatusCode)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A TLS chain without a certificate passes the connection through to its
// cluster, ClientHello and all, so the backend's own certificate answers;
// a plain listener's tcp_proxy chain relays whatever comes.
func TestGatewayPassthroughAndTCP(t *testing.T) {
	g := newGatewayFixture(t)
	// The backend ends TLS itself, for pass.example.com.
	cert, err := g.root.Server("pass.example.com", []string{"pass.example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	bln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*cert.TLS()}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "passed through "+r.Host) })}
	done := make(chan struct{})
	go func() { srv.Serve(bln); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	g.backend = bln.Addr().(*net.TCPAddr).AddrPort()

	tlsPort, tcpPort := freePort(t), freePort(t)
	tcpProxy := &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, &tcpv3.TcpProxy{
		StatPrefix: "tcp", ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: backendCluster}})}}
	pass := tlsListener(t, tlsPort,
		&listenerv3.FilterChain{Name: "tls/pass", FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{"pass.example.com"}}, Filters: []*listenerv3.Filter{tcpProxy}},
		g.tlsChain("https/local", []string{"local.example.com"}, []string{"local.example.com"}, "https.local"))
	tcp := &listenerv3.Listener{Name: "0.0.0.0_tcp", Address: gatewayAddr(tcpPort), FilterChains: []*listenerv3.FilterChain{{Name: "tcp", Filters: []*listenerv3.Filter{tcpProxy}}}}
	g.apply([]*listenerv3.Listener{pass, tcp}, map[string][]*routev3.VirtualHost{"https.local": {direct("*", "terminated here")}})

	for _, tc := range []struct {
		port      uint16
		sni, want string
	}{
		{tlsPort, "pass.example.com", "passed through pass.example.com"},
		{tlsPort, "local.example.com", "terminated here"},
		{tcpPort, "pass.example.com", "passed through pass.example.com"},
	} {
		for _, h2 := range []bool{false, true} {
			c, peer := g.tlsClient(tc.sni, h2)
			resp := gwGet(t, c, "https", tc.port, tc.sni, nil)
			if resp.body != tc.want || len(*peer) == 0 || (*peer)[0].DNSNames[0] != tc.sni {
				t.Errorf("port %d SNI %s h2 %v: %q from %v, want %q", tc.port, tc.sni, h2, resp.body, *peer, tc.want)
			}
		}
	}

	// A chain with a certificate and tcp_proxy ends TLS and relays what it
	// carried, here to a plain echo server.
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		c, err := echo.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	t.Cleanup(func() { echo.Close(); <-echoDone })
	g.backend = echo.Addr().(*net.TCPAddr).AddrPort()
	term := g.tlsChain("tls-term", []string{"term.example.com"}, []string{"term.example.com"}, "unused")
	term.Filters = []*listenerv3.Filter{tcpProxy}
	g.apply([]*listenerv3.Listener{tlsListener(t, tlsPort, term)}, nil)
	c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", tlsPort), &tls.Config{ServerName: "term.example.com", RootCAs: g.roots})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "ping over TLS")
	c.CloseWrite()
	if b, _ := io.ReadAll(c); string(b) != "ping over TLS" {
		t.Errorf("through a terminating TCP chain: %q", b)
	}
}

// A client that leaves while its request runs cancels it upstream, over
// plain TCP and TLS alike, as an HBONE client's does.
func TestGatewayClientLeaves(t *testing.T) {
	g := newGatewayFixture(t)
	canceled := make(chan struct{}, 4)
	g.backend = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body) // net/http notices a client gone once the body is read
		select {
		case <-r.Context().Done():
			canceled <- struct{}{}
		case <-time.After(10 * time.Second):
		}
	}), nil)
	plain, secure := freePort(t), freePort(t)
	g.apply([]*listenerv3.Listener{httpListener(t, plain),
		tlsListener(t, secure, g.tlsChain("https/slow", []string{"slow.example.com"}, []string{"slow.example.com"}, "https.slow"))},
		map[string][]*routev3.VirtualHost{"http." + strconv.Itoa(int(plain)): {toBackend("*")}, "https.slow": {toBackend("*")}})
	dial := map[string]func() (net.Conn, error){
		"TCP": func() (net.Conn, error) { return net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", plain)) },
		"TLS": func() (net.Conn, error) {
			return tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", secure), &tls.Config{ServerName: "slow.example.com", RootCAs: g.roots, NextProtos: []string{"http/1.1"}})
		},
	}
	for name, d := range dial {
		c, err := d()
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "POST /slow HTTP/1.1\r\nHost: slow\r\nContent-Length: 2\r\n\r\nhi")
		time.Sleep(100 * time.Millisecond) // the request is upstream
		c.Close()
		select {
		case <-canceled:
		case <-time.After(5 * time.Second):
			t.Errorf("%s: the upstream request ran on after its client left", name)
		}
	}
}

// Requests pipelined behind a slow one on a TLS connection are answered
// in order, each whole, however often the connection's reader starts
// (the slow request) and stops (the server reads the next).
func TestGatewaySlowPipelined(t *testing.T) {
	g := newGatewayFixture(t)
	g.backend = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(3 * watchAfter)
		}
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "backend %s", r.URL.Path)
	}), nil)
	port := freePort(t)
	g.apply([]*listenerv3.Listener{tlsListener(t, port, g.tlsChain("https/slow", []string{"slow.example.com"}, []string{"slow.example.com"}, "https.slow"))},
		map[string][]*routev3.VirtualHost{"https.slow": {toBackend("*")}})
	c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{ServerName: "slow.example.com", RootCAs: g.roots, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	body := strings.Repeat("b", 3*readAheadChunk)
	for round := range 3 {
		io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: slow\r\n\r\n"+
			"POST /big HTTP/1.1\r\nHost: slow\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body+
			"GET /fast HTTP/1.1\r\nHost: slow\r\n\r\n")
		for _, want := range []string{"backend /slow", "backend /big", "backend /fast"} {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("round %d: %s: %v", round, want, err)
			}
			got, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || string(got) != want {
				t.Fatalf("round %d: %d %q, want %q", round, resp.StatusCode, got, want)
			}
		}
	}
}

// A read deadline moved while a Read waits takes effect at once, and data
// comes through in order, then the end.
func TestReadAheadConn(t *testing.T) {
	a, b := net.Pipe()
	rc := newReadAheadConn(a)
	defer rc.Close()
	left := make(chan struct{})
	stop := rc.AfterPeerEnd(func() { close(left) })
	defer stop()
	rc.SetReadDeadline(time.Now().Add(time.Hour))
	got := make(chan error, 1)
	go func() {
		_, err := rc.Read(make([]byte, 1))
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	rc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	select {
	case err := <-got:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("Read: %v, want a deadline error", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a deadline moved earlier did not end the waiting Read")
	}
	rc.SetReadDeadline(time.Time{})
	go func() { b.Write([]byte("hello")); b.Close() }()
	data, err := io.ReadAll(rc)
	if string(data) != "hello" || err != nil {
		t.Errorf("ReadAll: %q %v", data, err)
	}
	select {
	case <-left:
	case <-time.After(2 * time.Second):
		t.Error("AfterPeerEnd did not call after the end")
	}
}

// A server that stops reading (a request runs) still learns that the
// client left; what it reads after the reader started, and after its own
// read stopped the reader, follows what it read itself before, in order;
// its deadlines still hold then.
func TestReadAheadConnWatches(t *testing.T) {
	a, b := net.Pipe()
	rc := newReadAheadConn(a)
	defer rc.Close()
	left := make(chan struct{})
	defer rc.AfterPeerEnd(func() { close(left) })()
	go b.Write([]byte("first"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(rc, buf); err != nil || string(buf) != "first" {
		t.Fatalf("read %q %v, want first", buf, err)
	}
	// More than two of the reader's chunks arrive while the server reads
	// nothing; then it reads them all.
	data := make([]byte, 3*readAheadChunk+100)
	for i := range data {
		data[i] = byte(i * 7)
	}
	waitAhead(t, rc)
	go b.Write(data)
	time.Sleep(3 * watchAfter)
	got := make([]byte, len(data))
	if _, err := io.ReadFull(rc, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes (%v), not what was sent", len(got), err)
	}
	rc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := rc.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline: %v, want a deadline error", err)
	}
	rc.SetReadDeadline(time.Time{})
	waitAhead(t, rc)
	b.Close()
	select {
	case <-left:
	case <-time.After(2 * time.Second):
		t.Fatal("the client's end was not seen while the server read nothing")
	}
	if n, err := rc.Read(buf); n != 0 || err != io.EOF {
		t.Errorf("Read after the end: %d %v, want EOF", n, err)
	}
}

// waitAhead waits until rc's reader runs: the server has not read for
// watchAfter.
func waitAhead(t *testing.T, rc *readAheadConn) {
	t.Helper()
	for start := time.Now(); time.Since(start) < 2*time.Second; time.Sleep(time.Millisecond) {
		rc.mu.Lock()
		ahead := rc.ahead
		rc.mu.Unlock()
		if ahead {
			return
		}
	}
	t.Fatal("no reader started while the server read nothing")
}

// TestGatewayHostPortKept checks ignore_port_in_host_matching without
// strip_any_host_port, as the control plane configures gateways: a Host
// with a port selects the virtual host of its name and reaches the backend
// as the client sent it, port included; what is not a port is not
// stripped.
func TestGatewayHostPortKept(t *testing.T) {
	g := newGatewayFixture(t)
	g.ignorePort = true
	port := freePort(t)
	l := httpListener(t, port)
	h := &hcmv3.HttpConnectionManager{}
	if err := l.FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(h); err != nil {
		t.Fatal(err)
	}
	h.StripPortMode = nil
	l.FilterChains[0].Filters[0].ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, h)}
	g.apply([]*listenerv3.Listener{l}, map[string][]*routev3.VirtualHost{
		"http." + strconv.Itoa(int(port)): {toBackend("foo.example.com"), direct("*.wild.example.com", "wild")},
	})
	c := plainClient(t)
	for _, host := range []string{"foo.example.com", "foo.example.com:1234", "FOO.example.com:80"} {
		resp := gwGet(t, c, "http", port, host, nil)
		if resp.StatusCode != 200 || resp.body != "backend /p" {
			t.Errorf("Host %q: %d %q, want the backend", host, resp.StatusCode, resp.body)
			continue
		}
		if got := resp.Header.Get("Seen-Host"); got != host {
			t.Errorf("Host %q reached the backend as %q, want it unchanged", host, got)
		}
	}
	for host, want := range map[string]string{
		"a.wild.example.com:8443": "wild",
		"foo.example.com:":        "", // not a port: the host is compared whole
		"foo.example.com:http":    "",
		"foo.example.com:123456":  "",
		"bar.example.com:1234":    "",
		"wild.example.com:80":     "",
	} {
		resp := gwGet(t, c, "http", port, host, nil)
		switch {
		case want == "" && resp.StatusCode != 404:
			t.Errorf("Host %q: %d %q, want 404 (no virtual host)", host, resp.StatusCode, resp.body)
		case want != "" && (resp.StatusCode != 200 || resp.body != want):
			t.Errorf("Host %q: %d %q, want %q", host, resp.StatusCode, resp.body, want)
		}
	}
}

// tlsEcho is a backend that ends TLS itself with its own certificate and
// echoes every byte it receives, after a line naming itself and the
// server name the client sent.
type tlsEcho struct {
	name    string
	cert    *tls.Certificate
	addr    netip.AddrPort
	accepts atomic.Int32
}

func newTLSEcho(t *testing.T, g *gatewayFixture, name string, dns ...string) *tlsEcho {
	c, err := g.root.Server(dns[0], dns, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &tlsEcho{name: name, cert: c.TLS()}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*e.cert}})
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().(*net.TCPAddr).AddrPort()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepts.Add(1)
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				if tc.Handshake() != nil {
					return
				}
				fmt.Fprintf(tc, "%s %s\n", e.name, tc.ConnectionState().ServerName)
				io.Copy(tc, tc)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return e
}

// endpointCluster pushes EDS clusters to loopback endpoints, with the
// passthrough cluster, replacing the fixture's.
func (g *gatewayFixture) endpointClusters(eps map[string]netip.AddrPort) {
	t := g.t
	cs := map[string]*anypb.Any{}
	las := map[string]*anypb.Any{}
	for name, ep := range eps {
		cs[name] = mustAny(t, &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{}, ConnectTimeout: durationpb.New(time.Second)})
		las[name] = mustAny(t, &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: ep.Addr().String(), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(ep.Port())}}}}}},
		}}}}})
	}
	if err := g.store.ApplyClusters(cs, nil); err != nil {
		t.Fatal(err)
	}
	if err := g.store.ApplyEndpoints(las, nil); err != nil {
		t.Fatal(err)
	}
}

// passChain is a TLS passthrough chain: server names, no transport socket,
// a tcp_proxy to cluster.
func passChain(t *testing.T, name, cluster string, serverNames ...string) *listenerv3.FilterChain {
	proxy := &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, &tcpv3.TcpProxy{
		StatPrefix: name, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}})}}
	return &listenerv3.FilterChain{Name: name, FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: serverNames}, Filters: []*listenerv3.Filter{proxy}}
}

// TLS passthrough with several chains of several server names each, as the
// control plane writes a TLS listener's TLSRoutes: the ClientHello's
// server name picks the chain (exact before the longest wildcard, in any
// case), the backend's own certificate answers, which the client verifies
// through the gateway, and the bytes arrive and return unchanged. A server
// name no chain lists, a wildcard's own suffix and a ClientHello without
// SNI are refused, and no backend sees them.
func TestGatewayPassthroughSNI(t *testing.T) {
	g := newGatewayFixture(t)
	a := newTLSEcho(t, g, "A", "a.example.com", "*.a.example.com")
	b := newTLSEcho(t, g, "B", "b.example.com", "*.example.com", "z.a.example.com")
	port := freePort(t)
	g.apply([]*listenerv3.Listener{tlsListener(t, port,
		passChain(t, "tls/a", "outbound|443||a", "a.example.com", "*.a.example.com"),
		passChain(t, "tls/b", "outbound|443||b", "b.example.com", "*.example.com", "z.a.example.com"),
		g.tlsChain("https/c", []string{"c.example.com"}, []string{"c.example.com"}, "https.c"),
	)}, map[string][]*routev3.VirtualHost{"https.c": {direct("*", "terminated here")}})
	g.endpointClusters(map[string]netip.AddrPort{"outbound|443||a": a.addr, "outbound|443||b": b.addr})

	payload := make([]byte, 256<<10)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		sni  string
		want *tlsEcho
	}{
		{"a.example.com", a},
		{"A.Example.COM", a},
		{"x.a.example.com", a}, // *.a.example.com, longer than *.example.com
		{"z.a.example.com", b}, // exact before a wildcard
		{"b.example.com", b},
		{"other.example.com", b}, // *.example.com
	} {
		t.Run(tc.sni, func(t *testing.T) {
			c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{ServerName: tc.sni, RootCAs: g.roots})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if leaf := c.ConnectionState().PeerCertificates[0]; !leaf.Equal(tc.want.cert.Leaf) {
				t.Fatalf("certificate %v, want backend %s's", leaf.DNSNames, tc.want.name)
			}
			go func() { c.Write(payload); c.CloseWrite() }()
			br := bufio.NewReader(c)
			line, err := br.ReadString('\n')
			// The backend sees the ClientHello as the client sent it, SNI
			// case and all.
			if want := tc.want.name + " " + tc.sni + "\n"; err != nil || line != want {
				t.Fatalf("backend says %q (%v), want %q", line, err, want)
			}
			got, err := io.ReadAll(br)
			if err != nil || !bytes.Equal(got, payload) {
				t.Errorf("echo: %d bytes (%v), want the %d sent unchanged", len(got), err, len(payload))
			}
		})
	}
	// The HTTPS chain's name is ended at the gateway, with its certificate.
	c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{ServerName: "c.example.com", RootCAs: g.roots})
	if err != nil {
		t.Fatal(err)
	}
	if leaf := c.ConnectionState().PeerCertificates[0]; leaf.Equal(a.cert.Leaf) || leaf.Equal(b.cert.Leaf) || leaf.DNSNames[0] != "c.example.com" {
		t.Errorf("c.example.com: certificate %v, want the gateway's", leaf.DNSNames)
	}
	c.Close()

	before := a.accepts.Load() + b.accepts.Load()
	for _, sni := range []string{"example.com", "a.example.org", "c.example.org", ""} {
		conf := &tls.Config{ServerName: sni, RootCAs: g.roots}
		if sni == "" {
			conf.InsecureSkipVerify = true // no SNI: nothing to verify the name against
		}
		c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), conf)
		switch {
		case err == nil:
			c.Close()
			t.Errorf("SNI %q: handshake succeeded, want it refused", sni)
		case !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET):
			// Closed, as Envoy closes a connection no chain takes: no
			// alert that would tell the client more.
			t.Errorf("SNI %q: %v, want the connection closed without an alert", sni, err)
		}
	}
	if after := a.accepts.Load() + b.accepts.Load(); after != before {
		t.Errorf("refused connections reached a backend (%d connections)", after-before)
	}
}

// A gateway's client picks HTTP/2 with the gateway (ALPN h2, or h2c to a
// plain port), which says nothing of the backend: the request goes
// upstream over HTTP/1.1 unless it is gRPC (or the cluster asks for
// HTTP/2), so an HTTP/1.1-only backend serves HTTP/2 clients.
func TestGatewayUpstreamProtocol(t *testing.T) {
	g := newGatewayFixture(t)
	tlsPort, plainPort := freePort(t), freePort(t)
	p := strconv.Itoa(int(tlsPort))
	g.apply([]*listenerv3.Listener{
		tlsListener(t, tlsPort, g.tlsChain("https/"+p+"/any", nil, []string{"app.example.com"}, "https."+p+".any")),
		httpListener(t, plainPort),
	}, map[string][]*routev3.VirtualHost{
		"https." + p + ".any":                  {toBackend("*")},
		"http." + strconv.Itoa(int(plainPort)): {toBackend("*")},
	})
	h2TLS, _ := g.tlsClient("app.example.com", true)
	h1TLS, _ := g.tlsClient("app.example.com", false)
	grpc := http.Header{"Content-Type": {"application/grpc"}}
	for _, tc := range []struct {
		name   string
		c      *http.Client
		scheme string
		port   uint16
		h      http.Header
		down   string
		up     string
	}{
		{"h2 over TLS", h2TLS, "https", tlsPort, nil, "HTTP/2.0", "HTTP/1.1"},
		{"HTTP/1.1 over TLS", h1TLS, "https", tlsPort, nil, "HTTP/1.1", "HTTP/1.1"},
		{"h2c", h2cClient(t), "http", plainPort, nil, "HTTP/2.0", "HTTP/1.1"},
		{"gRPC over h2", h2TLS, "https", tlsPort, grpc, "HTTP/2.0", "HTTP/2.0"},
		{"gRPC over h2c", h2cClient(t), "http", plainPort, grpc, "HTTP/2.0", "HTTP/2.0"},
		{"gRPC's type over HTTP/1.1", h1TLS, "https", tlsPort, grpc, "HTTP/1.1", "HTTP/1.1"},
	} {
		resp := gwGet(t, tc.c, tc.scheme, tc.port, "app.example.com", tc.h)
		if resp.Proto != tc.down || resp.Header.Get("Seen-Proto") != tc.up {
			t.Errorf("%s: %d, client %s, backend saw %q; want %s, %s", tc.name, resp.StatusCode, resp.Proto, resp.Header.Get("Seen-Proto"), tc.down, tc.up)
		}
	}
}

// plainEcho is a plain TCP backend that says its name, then echoes.
type plainEcho struct {
	name    string
	addr    netip.AddrPort
	accepts atomic.Int32
}

func newPlainEcho(t *testing.T, name string) *plainEcho {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &plainEcho{name: name, addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepts.Add(1)
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%s\n", e.name)
				io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return e
}

// TLS listeners in Terminate and Passthrough mode on one port, as the
// control plane writes TLSRoutes of both modes beside each other: the
// server name picks the chain whatever its mode (exact, then the longest
// wildcard, in any case). A Terminate chain answers with the gateway's
// certificate for its listener, offers no ALPN (an h2 client gets none, so
// nothing takes the bytes for HTTP) and relays the decrypted bytes, which
// reach the plain backend unchanged; a Passthrough name gets the backend's
// own certificate, never the gateway's; a name no chain lists, a
// wildcard's suffix, a ClientHello without SNI and a client that does not
// speak TLS reach no backend.
func TestGatewayTerminateSNI(t *testing.T) {
	g := newGatewayFixture(t)
	pass := newTLSEcho(t, g, "P", "pass.example.com", "*.wild.example.com")
	exact, wild := newPlainEcho(t, "E"), newPlainEcho(t, "W")
	port := freePort(t)
	term := func(name, cluster string, serverNames, certNames []string) *listenerv3.FilterChain {
		fc := passChain(t, name, cluster, serverNames...)
		fc.TransportSocket = g.downstreamTLS(certNames)
		return fc
	}
	g.apply([]*listenerv3.Listener{tlsListener(t, port,
		passChain(t, "tls/pass", "outbound|443||pass", "pass.example.com", "*.wild.example.com"),
		term("tls/term", "outbound|9000||exact", []string{"term.example.com"}, []string{"term.example.com"}),
		term("tls/term-wild", "outbound|9000||wild", []string{"*.example.com"}, []string{"*.example.com"}),
		g.tlsChain("https/www", []string{"www.example.com"}, []string{"www.example.com"}, "https.www"),
	)}, map[string][]*routev3.VirtualHost{"https.www": {direct("*", "terminated here")}})
	g.endpointClusters(map[string]netip.AddrPort{"outbound|443||pass": pass.addr, "outbound|9000||exact": exact.addr, "outbound|9000||wild": wild.addr})

	payload := make([]byte, 256<<10)
	for i := range payload {
		payload[i] = byte(i * 13)
	}
	for _, tc := range []struct {
		sni, backend, cert string // cert: the gateway's leaf name; "" for the backend's own
	}{
		{"pass.example.com", "P", ""}, // exact Passthrough before the Terminate wildcard
		{"PASS.Example.com", "P", ""},
		{"x.wild.example.com", "P", ""}, // the longer wildcard, Passthrough
		{"term.example.com", "E", "term.example.com"},
		{"Term.EXAMPLE.com", "E", "term.example.com"},
		{"x.example.com", "W", "*.example.com"},
		{"xpass.example.com", "W", "*.example.com"},
		{"wild.example.com", "W", "*.example.com"}, // *.wild.example.com does not cover its suffix
	} {
		t.Run(tc.sni, func(t *testing.T) {
			c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{ServerName: tc.sni, RootCAs: g.roots, NextProtos: []string{"h2", "http/1.1"}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cs := c.ConnectionState()
			leaf := cs.PeerCertificates[0]
			switch {
			case tc.cert == "" && !leaf.Equal(pass.cert.Leaf):
				t.Fatalf("certificate %v, want the backend's own", leaf.DNSNames)
			case tc.cert != "" && (leaf.Equal(pass.cert.Leaf) || leaf.DNSNames[0] != tc.cert):
				t.Fatalf("certificate %v, want the gateway's for %s", leaf.DNSNames, tc.cert)
			case tc.cert != "" && cs.NegotiatedProtocol != "":
				t.Errorf("ALPN %q on a Terminate chain, want none", cs.NegotiatedProtocol)
			}
			go func() { c.Write(payload); c.CloseWrite() }()
			br := bufio.NewReader(c)
			line, err := br.ReadString('\n')
			want := tc.backend + "\n"
			if tc.cert == "" {
				want = tc.backend + " " + tc.sni + "\n" // the ClientHello as the client sent it
			}
			if err != nil || line != want {
				t.Fatalf("backend says %q (%v), want %q", line, err, want)
			}
			got, err := io.ReadAll(br)
			if err != nil || !bytes.Equal(got, payload) {
				t.Errorf("echo: %d bytes (%v), want the %d sent unchanged", len(got), err, len(payload))
			}
		})
	}
	// The HTTPS chain is still HTTP.
	c, _ := g.tlsClient("www.example.com", false)
	if resp := gwGet(t, c, "https", port, "www.example.com", nil); resp.body != "terminated here" {
		t.Errorf("www.example.com: %d %q", resp.StatusCode, resp.body)
	}

	before := pass.accepts.Load() + exact.accepts.Load() + wild.accepts.Load()
	for _, sni := range []string{"example.com", "other.org", ""} {
		conf := &tls.Config{ServerName: sni, RootCAs: g.roots, InsecureSkipVerify: sni == ""}
		c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), conf)
		switch {
		case err == nil:
			c.Close()
			t.Errorf("SNI %q: handshake succeeded, want it refused", sni)
		case !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET):
			t.Errorf("SNI %q: %v, want the connection closed without an alert", sni, err)
		}
	}
	raw, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(raw, "plain bytes, no ClientHello\r\n\r\n")
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, _ := raw.Read(make([]byte, 64)); n > 0 {
		t.Errorf("a client without TLS got %d bytes back", n)
	}
	raw.Close()
	if after := pass.accepts.Load() + exact.accepts.Load() + wild.accepts.Load(); after != before {
		t.Errorf("refused connections reached a backend (%d connections)", after-before)
	}
}
