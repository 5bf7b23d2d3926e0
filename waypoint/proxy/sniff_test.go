package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	httpinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Protocol confusion: whatever a client sends on a CONNECT stream is either
// served as HTTP, with the chain's HTTP policy, or relayed as TCP only when
// the chain's L4 policy allows it; bytes never reach a backend past a
// policy by not looking like the HTTP the sniffer expected.

// recorder is a backend that notes every connection and request it sees.
type recorder struct {
	addr  netip.AddrPort
	conns atomic.Int32
	mu    sync.Mutex
	reqs  []string // guarded by mu: "<method> <request-uri>"
}

func newRecorder(t *testing.T) *recorder {
	r := &recorder{}
	r.addr = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.reqs = append(r.reqs, req.Method+" "+req.RequestURI+" upgrade="+req.Header.Get("Upgrade"))
		r.mu.Unlock()
		io.WriteString(w, "backend "+req.Method+" "+req.URL.Path)
	}), countConns(&r.conns))
	return r
}

func (r *recorder) seen() (int32, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns.Load(), append([]string(nil), r.reqs...)
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = nil
	r.conns.Store(0)
}

func denyFilter(t testing.TB, rules *rbacv3.RBAC) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rbacfilter.RBAC{Rules: rules})}}
}

func pathPrefixPerm(p string) *rbacv3.Permission {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{
		Path: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: p}}}}}}
}

func methodPerm(m string) *rbacv3.Permission {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: &routev3.HeaderMatcher{Name: ":method",
		HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: m}}}}}}
}

var anyPrincipal = []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}}

// exchange sends raw bytes on a new stream to target and returns the
// status code of the first response ("none" if the stream ended without
// one) and the response's head and body.
func (m *mesh) exchange(t *testing.T, target netip.AddrPort, raw string) (string, string) {
	t.Helper()
	c, err := m.dial(target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "none", err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	return strconv.Itoa(resp.StatusCode), resp.Status + " " + string(b)
}

// TestProtocolConfusionHTTPPort: on a port known to speak HTTP, request
// lines the old sniffer did not take for HTTP (a lower-case or mixed-case
// method, a method with a hyphen, leading empty lines) are served as HTTP
// and meet the DENY on /admin; what is not HTTP at all gets a 400. None of
// it reaches the backend.
func TestProtocolConfusionHTTPPort(t *testing.T) {
	m := newMesh(t)
	rec := newRecorder(t)
	cluster := "outbound|80||" + svcHost
	deny := &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{
		"deny-admin": {Permissions: []*rbacv3.Permission{pathPrefixPerm("/admin")}, Principals: anyPrincipal},
	}}
	m.apply([]*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster(cluster)}},
		map[string][]netip.AddrPort{cluster: {rec.addr}}, denyFilter(t, deny))
	const h = "Host: " + svcHost + "\r\n"
	for _, tc := range []struct {
		name, raw, want string
	}{
		{"lower-case method", "get /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"mixed-case method", "Get /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"extension method", "PURGE /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"hyphenated method", "M-SEARCH /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"token characters", "x!#$%&'*+.^_`|~1 /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"leading CRLF", "\r\nGET /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"leading CRLFs and LF", "\r\n\r\n\nget /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"bare LF", "get /admin HTTP/1.1\n" + h[:len(h)-2] + "\n\n", "403"},
		{"HTTP/1.0", "get /admin HTTP/1.0\r\n\r\n", "403"},
		{"absolute form", "get http://" + svcHost + "/admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"h2c upgrade", "get /admin HTTP/1.1\r\n" + h + "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n", "403"},
		{"many empty lines", strings.Repeat("\r\n", 100) + "get /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"long method", strings.Repeat("X", 5000) + " /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"no version", "get /admin\r\n\r\n", "400"},
		{"HTTP/2.0 request line", "get /admin HTTP/2.0\r\n" + h + "\r\n", "505"},
		{"tab after the method", "GET\t/admin HTTP/1.1\r\n" + h + "\r\n", "400"},
		{"two spaces", "GET  /admin HTTP/1.1\r\n" + h + "\r\n", "400"},
		{"vertical tab", "GET\v/admin HTTP/1.1\r\n" + h + "\r\n", "400"},
		{"lone CR", "\rGET /admin HTTP/1.1\r\n" + h + "\r\n", "400"},
		{"non-ASCII method", "G\xc9T /admin HTTP/1.1\r\n" + h + "\r\n", "400"},
		{"space first", " GET /admin HTTP/1.1\r\n" + h + "\r\n", "400"},
		{"TLS", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 GET /admin HTTP/1.1\r\n\r\n", "400"},
		{"preface then garbage", "PRI * HTTP/2.0\r\n\r\nXX\r\n\r\nGET /admin HTTP/1.1\r\n" + h + "\r\n", "505"},
		{"CONNECT", "CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\nGET /admin HTTP/1.1\r\n" + h + "\r\n", "404"},
		{"CONNECT path", "CONNECT /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"CONNECT lower-case", "connect 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\n", "400"}, // not CONNECT: a bad target
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec.reset()
			got, resp := m.exchange(t, vip, tc.raw)
			if got != tc.want {
				t.Errorf("answered %s (%.80q), want %s", got, resp, tc.want)
			}
			if n, reqs := rec.seen(); n != 0 || len(reqs) != 0 {
				t.Errorf("the backend saw %d connections and requests %q", n, reqs)
			}
		})
	}

	// The same methods reach the backend unchanged where no policy stops
	// them; a method is matched with its case, as Envoy does: a DENY on
	// GET does not deny get.
	m.apply([]*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster(cluster)}},
		map[string][]netip.AddrPort{cluster: {rec.addr}}, denyFilter(t, &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{
			"deny-get": {Permissions: []*rbacv3.Permission{methodPerm("GET")}, Principals: anyPrincipal},
		}}))
	for _, tc := range []struct{ raw, want, seen string }{
		{"GET /x HTTP/1.1\r\n" + h + "\r\n", "403", ""},
		{"get /x HTTP/1.1\r\n" + h + "\r\n", "200", "get /x upgrade="},
		{"\r\nM-SEARCH /x HTTP/1.1\r\n" + h + "\r\n", "200", "M-SEARCH /x upgrade="},
		{"OPTIONS * HTTP/1.1\r\n" + h + "\r\n", "404", ""}, // no route matches the path *
		{"get /x HTTP/1.1\r\n" + h + "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n", "200", "get /x upgrade="},
	} {
		rec.reset()
		got, resp := m.exchange(t, vip, tc.raw)
		if got != tc.want {
			t.Errorf("%q answered %s (%.80q), want %s", tc.raw, got, resp, tc.want)
		}
		_, reqs := rec.seen()
		if want := []string{tc.seen}; tc.seen == "" && len(reqs) != 0 || tc.seen != "" && (len(reqs) != 1 || reqs[0] != want[0]) {
			t.Errorf("%q: the backend saw %q, want %q", tc.raw, reqs, tc.seen)
		}
	}
}

// echoServer is a TCP echo backend that counts its connections.
func echoServer(t *testing.T) (netip.AddrPort, *atomic.Int32) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort(), &n
}

func netRBACFilter(t testing.TB, rules *rbacv3.RBAC) *listenerv3.Filter {
	return &listenerv3.Filter{Name: "envoy.filters.network.rbac", ConfigType: &listenerv3.Filter_TypedConfig{
		TypedConfig: mustAny(t, &netrbac.RBAC{StatPrefix: "tcp.", Rules: rules})}}
}

func tcpProxyFilter(t testing.TB, cluster string) *listenerv3.Filter {
	return &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{
		TypedConfig: mustAny(t, &tcpv3.TcpProxy{StatPrefix: cluster, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}})}}
}

// applyListener replaces the listener with one holding chains.
func (m *mesh) applyListener(chains ...*listenerv3.FilterChain) {
	m.t.Helper()
	l := &listenerv3.Listener{Name: "waypoint", FilterChains: chains}
	if err := m.store.ApplyListeners(map[string]*anypb.Any{"waypoint": mustAny(m.t, l)}, nil); err != nil {
		m.t.Fatal(err)
	}
}

func vipMatch() *listenerv3.FilterChainMatch {
	return &listenerv3.FilterChainMatch{
		PrefixRanges:    []*corev3.CidrRange{{AddressPrefix: vip.Addr().String(), PrefixLen: wrapperspb.UInt32(32)}},
		DestinationPort: wrapperspb.UInt32(uint32(vip.Port())),
	}
}

func principalExact(id string) *rbacv3.Principal {
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{
		PrincipalName: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: id}}}}}
}

var anyPermission = []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}}

// tcpRelays reports whether bytes sent on a stream to vip come back from
// the echo backend.
func (m *mesh) tcpRelays(t *testing.T) bool {
	t.Helper()
	c, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const msg = "\x00\x01binary, not HTTP"
	io.WriteString(c, msg)
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, len(msg))
	_, err = io.ReadFull(c, buf)
	return err == nil && string(buf) == msg
}

// TestTCPChainPolicy: a tcp_proxy chain evaluates its network RBAC filters
// before it dials the cluster: a stream the policy does not allow is
// closed without an upstream connection.
func TestTCPChainPolicy(t *testing.T) {
	m := newMesh(t)
	echo, conns := echoServer(t)
	const cluster = "outbound|80||tcp"
	m.applyClusters(nil, map[string]clusterSpec{cluster: {eps: []endpointSpec{{addr: echo}}}})
	other := "spiffe://cluster.local/ns/other/sa/x"
	for _, tc := range []struct {
		name    string
		filters []*rbacv3.RBAC
		relays  bool
	}{
		{"no policy", nil, true},
		{"ALLOW of another principal", []*rbacv3.RBAC{{Action: rbacv3.RBAC_ALLOW, Policies: map[string]*rbacv3.Policy{
			"allow-other": {Permissions: anyPermission, Principals: []*rbacv3.Principal{principalExact(other)}}}}}, false},
		{"ALLOW of the client", []*rbacv3.RBAC{{Action: rbacv3.RBAC_ALLOW, Policies: map[string]*rbacv3.Policy{
			"allow-client": {Permissions: anyPermission, Principals: []*rbacv3.Principal{principalExact(m.src.String())}}}}}, true},
		// An ALLOW policy whose rules all had HTTP fields: no rule is left.
		{"ALLOW without rules", []*rbacv3.RBAC{{Action: rbacv3.RBAC_ALLOW}}, false},
		// A DENY rule on a path and the client's principal: on TCP its L4 part.
		{"DENY of the client", []*rbacv3.RBAC{{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{
			"deny-client": {Permissions: anyPermission, Principals: []*rbacv3.Principal{principalExact(m.src.String())}}}}}, false},
		{"DENY of another principal", []*rbacv3.RBAC{{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{
			"deny-other": {Permissions: anyPermission, Principals: []*rbacv3.Principal{principalExact(other)}}}}}, true},
		{"DENY on another port", []*rbacv3.RBAC{{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{
			"deny-81": {Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: 81}}}, Principals: anyPrincipal}}}}, true},
		{"AUDIT only", []*rbacv3.RBAC{{Action: rbacv3.RBAC_LOG, Policies: map[string]*rbacv3.Policy{
			"audit": {Permissions: anyPermission, Principals: anyPrincipal}}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fs []*listenerv3.Filter
			for _, r := range tc.filters {
				fs = append(fs, netRBACFilter(t, r))
			}
			m.applyListener(&listenerv3.FilterChain{Name: "tcp", FilterChainMatch: vipMatch(), Filters: append(fs, tcpProxyFilter(t, cluster))})
			before := conns.Load()
			if got := m.tcpRelays(t); got != tc.relays {
				t.Errorf("relayed %v, want %v", got, tc.relays)
			}
			if !tc.relays && conns.Load() != before {
				t.Errorf("the backend got %d connections", conns.Load()-before)
			}
		})
	}
}

// applySniffed replaces the listener with the pair of chains a port of
// unknown protocol gets: an HTTP chain for streams detected as HTTP, with
// httpFilters, and a TCP chain to cluster for the rest, with the network
// RBAC filters of tcpRules.
func (m *mesh) applySniffed(httpFilters []*hcmv3.HttpFilter, tcpRules []*rbacv3.RBAC, cluster string) {
	t := m.t
	httpMatch := vipMatch()
	httpMatch.ApplicationProtocols = []string{"http/1.0", "http/1.1", "h2c"}
	var fs []*listenerv3.Filter
	for _, r := range tcpRules {
		fs = append(fs, netRBACFilter(t, r))
	}
	l := &listenerv3.Listener{Name: "waypoint",
		ListenerFilters: []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.http_inspector",
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(t, &httpinspector.HttpInspector{})}}},
		FilterChains: []*listenerv3.FilterChain{
			{Name: svcHost + ":80", FilterChainMatch: httpMatch, Filters: []*listenerv3.Filter{{Name: "envoy.filters.network.http_connection_manager",
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm(t, nil, httpFilters...)}}}},
			{Name: svcHost + ":80/tcp", FilterChainMatch: vipMatch(), Filters: append(fs, tcpProxyFilter(t, cluster))},
		}}
	if err := m.store.ApplyListeners(map[string]*anypb.Any{"waypoint": mustAny(t, l)}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestProtocolConfusionSniffedPort: on a port whose protocol is detected,
// HTTP meets the HTTP policy and the rest meets the L4 part of the same
// policy on the TCP chain: a DENY on a path denies every TCP stream (the
// translation drops the path from the DENY rule), so bytes that do not
// look like HTTP gain nothing.
func TestProtocolConfusionSniffedPort(t *testing.T) {
	m := newMesh(t)
	rec := newRecorder(t)
	cluster := "outbound|80||" + svcHost
	m.apply([]*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster(cluster)}}, map[string][]netip.AddrPort{cluster: {rec.addr}})
	httpDeny := denyFilter(t, &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{
		"deny-admin": {Permissions: []*rbacv3.Permission{pathPrefixPerm("/admin")}, Principals: anyPrincipal}}})
	tcpDeny := &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{
		"deny-admin": {Permissions: anyPermission, Principals: anyPrincipal}}}
	m.applySniffed([]*hcmv3.HttpFilter{httpDeny}, []*rbacv3.RBAC{tcpDeny}, cluster)
	const h = "Host: " + svcHost + "\r\n"
	for _, tc := range []struct{ name, raw, want string }{
		{"lower-case method", "get /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"leading CRLF", "\r\nGET /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"hyphenated method", "M-SEARCH /admin HTTP/1.1\r\n" + h + "\r\n", "403"},
		{"tab: TCP, denied", "GET\t/admin HTTP/1.1\r\n" + h + "\r\n", "none"},
		{"lone CR: TCP, denied", "\rGET /admin HTTP/1.1\r\n" + h + "\r\n", "none"},
		{"TLS: TCP, denied", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec.reset()
			if got, resp := m.exchange(t, vip, tc.raw); got != tc.want {
				t.Errorf("answered %s (%.80q), want %s", got, resp, tc.want)
			}
			if n, reqs := rec.seen(); n != 0 || len(reqs) != 0 {
				t.Errorf("the backend saw %d connections and requests %q", n, reqs)
			}
		})
	}
	// An ALLOW of the client on both chains lets both kinds through.
	allow := &rbacv3.RBAC{Action: rbacv3.RBAC_ALLOW, Policies: map[string]*rbacv3.Policy{
		"allow-client": {Permissions: anyPermission, Principals: []*rbacv3.Principal{principalExact(m.src.String())}}}}
	m.applySniffed([]*hcmv3.HttpFilter{denyFilter(t, allow)}, []*rbacv3.RBAC{allow}, cluster)
	rec.reset()
	if got, resp := m.exchange(t, vip, "get /x HTTP/1.1\r\n"+h+"\r\n"); got != "200" {
		t.Errorf("allowed HTTP: %s %q", got, resp)
	}
	// Bytes the backend's HTTP server answers, relayed as they are.
	if got, resp := m.exchange(t, vip, "GET\t/x HTTP/1.1\r\n"+h+"\r\n"); got != "400" || !strings.Contains(resp, "400 Bad Request") {
		t.Errorf("allowed TCP: %s %q", got, resp)
	}
	if n, reqs := rec.seen(); n != 2 || len(reqs) != 1 {
		t.Errorf("the backend saw %d connections and requests %q, want 2 and the HTTP one", n, reqs)
	}
	// h2c takes the HTTP chain too, with its policy.
	m.applySniffed([]*hcmv3.HttpFilter{httpDeny}, []*rbacv3.RBAC{tcpDeny}, cluster)
	cc := m.h2client(vip)
	for path, want := range map[string]int{"/admin": 403, "/x": 200} {
		resp, err := cc.RoundTrip(get(path))
		if err != nil {
			t.Fatalf("h2c %s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("h2c %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
}
