package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weftmesh/weft/waypoint/config"
)

// A client's Connection header names fields hop-by-hop for its own hop
// only: it cannot make the gateway drop the forwarding fields, request id
// and trace context the gateway itself sets, whatever the names' case, spacing or empty items, while
// the fields it names of its own are still removed.
func TestGatewayConnectionCannotDropForwarded(t *testing.T) {
	g := newGatewayFixture(t)
	port := freePort(t)
	g.apply([]*listenerv3.Listener{httpListener(t, port)}, map[string][]*routev3.VirtualHost{
		"http." + strconv.Itoa(int(port)): {toBackend("foo.example.com")},
	})
	for _, conn := range []string{
		"X-Forwarded-For, X-Forwarded-Proto, X-Request-Id, Traceparent",
		"x-forwarded-for,x-FORWARDED-proto,x-request-id,TRACEPARENT",
		" , x-forwarded-for ,, X-Forwarded-Proto , keep-alive,x-request-id , traceparent",
	} {
		resp := gwGet(t, plainClient(t), "http", port, "foo.example.com", http.Header{
			"Connection": {conn}, "X-Forwarded-For": {"203.0.113.9"}, "X-Forwarded-Proto": {"https"},
			"X-Request-Id": {"client-id"}, "Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}})
		if resp.StatusCode != 200 {
			t.Fatalf("Connection %q: status %d %q", conn, resp.StatusCode, resp.body)
		}
		if got := strings.Join(resp.Header.Values("Seen-X-Forwarded-For"), "|"); got != "127.0.0.1" {
			t.Errorf("Connection %q: X-Forwarded-For upstream %q, want the peer alone", conn, got)
		}
		if got := strings.Join(resp.Header.Values("Seen-X-Forwarded-Proto"), "|"); got != "http" {
			t.Errorf("Connection %q: X-Forwarded-Proto upstream %q, want http", conn, got)
		}
		// The client's own id and trace were for its hop: the gateway's
		// new ones go upstream.
		if got := resp.Header.Values("Seen-X-Request-Id"); len(got) != 1 || got[0] == "" || got[0] == "client-id" {
			t.Errorf("Connection %q: X-Request-Id upstream %q, want the gateway's", conn, got)
		}
		if got := resp.Header.Values("Seen-Traceparent"); len(got) != 1 || strings.Contains(got[0], "0af7651916cd43dd8448eb211c80319c") {
			t.Errorf("Connection %q: Traceparent upstream %q, want a new trace", conn, got)
		}
	}
}

// A client that leaves while its response's body streams is recorded as
// gone (DC), not as an upstream reset, whether the request's context is
// the server's own (no timeout) or a timeout's child of it, which ends a
// moment after its parent (h1server's request context ends children in a
// goroutine of their own).
func TestGatewayClientLeavesMidBody(t *testing.T) {
	g := newGatewayFixture(t)
	g.backend = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}), nil)
	port := freePort(t)
	vh := func(name string, timeout time.Duration) *routev3.VirtualHost {
		return &routev3.VirtualHost{Name: name, Domains: []string{name}, Routes: []*routev3.Route{{Name: name,
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: backendCluster},
				Timeout: durationpb.New(timeout)}}}}}
	}
	g.apply([]*listenerv3.Listener{httpListener(t, port)}, map[string][]*routev3.VirtualHost{
		"http." + strconv.Itoa(int(port)): {vh("none", 0), vh("timeout", time.Minute)},
	})
	const rounds = 20
	for i := range rounds {
		for _, host := range []string{"none", "timeout"} {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: %s\r\n\r\n", i, host)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("%s: %v %v", host, resp, err)
			}
			b := make([]byte, 5)
			if _, err := io.ReadFull(resp.Body, b); err != nil || string(b) != "first" {
				t.Fatalf("%s: body %q %v", host, b, err)
			}
			c.Close()
		}
	}
	waitFor(t, "every request recorded", func() bool { return sumWhere(t, g.reg, "istio_requests_total", "", "") == 2*rounds })
	if dc := sumWhere(t, g.reg, "istio_requests_total", "response_flags", "DC"); dc != 2*rounds {
		t.Errorf("%v of %d requests recorded as DC; UR %v", dc, 2*rounds, sumWhere(t, g.reg, "istio_requests_total", "response_flags", "UR"))
	}
}

// The peer's address as X-Forwarded-For gives it, made once per
// connection: an IPv4-mapped IPv6 peer is its IPv4 address, an IPv6 peer
// has no brackets or port, and several X-Forwarded-For fields from the
// client are joined before it.
func TestForwardedPeer(t *testing.T) {
	hc := &config.HTTP{UseRemoteAddress: true}
	for _, c := range []struct {
		peer string
		xff  []string
		want string
	}{
		{"[::ffff:10.1.2.3]:4567", nil, "10.1.2.3"},
		{"[2001:db8::1]:4567", nil, "2001:db8::1"},
		{"192.0.2.7:1", []string{"203.0.113.1", "203.0.113.2, 203.0.113.3"}, "203.0.113.1, 203.0.113.2, 203.0.113.3, 192.0.2.7"},
		{"", []string{"203.0.113.1"}, "203.0.113.1"}, // no peer known: the client's, untouched
	} {
		var s session
		if c.peer != "" {
			s.setRemote(netip.MustParseAddrPort(c.peer))
		}
		r := &http.Request{Header: http.Header{}}
		if c.xff != nil {
			r.Header["X-Forwarded-For"] = c.xff
		}
		forwarded(r, hc, s.remoteIP, "https")
		if got := strings.Join(r.Header["X-Forwarded-For"], "|"); got != c.want {
			t.Errorf("peer %q, X-Forwarded-For %q: %q, want %q", c.peer, c.xff, got, c.want)
		}
		if got := r.Header.Get("X-Forwarded-Proto"); got != "https" {
			t.Errorf("peer %q: X-Forwarded-Proto %q", c.peer, got)
		}
		if c.peer != "" && s.remote.Addr().Is4In6() {
			t.Errorf("peer %q: remote %v kept its IPv4 mapping", c.peer, s.remote)
		}
	}
}

// The response takes the upstream's header as its own (h1server's
// AdoptHeader): on a kept-alive connection, over HTTP/1.1 and h2c alike,
// a second response carries none of the first's fields, the upstream's
// hop-by-hop fields stay behind, and trailers, announced or not, arrive
// as trailers.
func TestGatewayResponseHeaderPerRequest(t *testing.T) {
	g := newGatewayFixture(t)
	g.backend = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/first" {
			w.Header().Set("X-First", "1")
			w.Header().Set("Connection", "X-Hop")
			w.Header().Set("X-Hop", "1")
		}
		w.Header().Set("Trailer", "X-Announced")
		w.Header().Set("X-Path", r.URL.Path)
		io.WriteString(w, "body ")
		w.(http.Flusher).Flush()
		io.WriteString(w, r.URL.Path)
		w.Header().Set("X-Announced", "a"+r.URL.Path)
		w.Header().Set(http.TrailerPrefix+"X-Unannounced", "u"+r.URL.Path)
	}), nil)
	port := freePort(t)
	g.apply([]*listenerv3.Listener{httpListener(t, port)}, map[string][]*routev3.VirtualHost{
		"http." + strconv.Itoa(int(port)): {toBackend("*")},
	})
	for name, c := range map[string]*http.Client{"HTTP/1.1": plainClient(t), "h2c": h2cClient(t)} {
		for _, path := range []string{"/first", "/second", "/first", "/second"} {
			resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "body "+path || resp.Header.Get("X-Path") != path {
				t.Fatalf("%s %s: %d %q %v", name, path, resp.StatusCode, b, resp.Header)
			}
			if got, want := resp.Header.Get("X-First"), map[bool]string{true: "1"}[path == "/first"]; got != want {
				t.Errorf("%s %s: X-First %q, want %q", name, path, got, want)
			}
			if resp.Header.Get("X-Hop") != "" {
				t.Errorf("%s %s: the upstream's hop-by-hop X-Hop came through", name, path)
			}
			if got := resp.Trailer.Get("X-Announced"); got != "a"+path {
				t.Errorf("%s %s: trailer X-Announced %q; trailers %v", name, path, got, resp.Trailer)
			}
			if got := resp.Trailer.Get("X-Unannounced"); got != "u"+path {
				t.Errorf("%s %s: trailer X-Unannounced %q; trailers %v", name, path, got, resp.Trailer)
			}
			if resp.Header.Get("X-Announced") != "" || resp.Header.Get("X-Unannounced") != "" {
				t.Errorf("%s %s: a trailer in the header: %v", name, path, resp.Header)
			}
		}
	}
}

// Bodyless answers (HEAD, 204, 304) keep the upstream's header, its
// Content-Length included, and leave a kept-alive connection usable.
func TestGatewayBodylessKeepAlive(t *testing.T) {
	g := newGatewayFixture(t)
	g.backend = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Path", r.URL.Path)
		switch r.URL.Path {
		case "/204":
			w.WriteHeader(204)
		case "/304":
			w.Header().Set("Etag", `"e"`)
			w.WriteHeader(304)
		default:
			w.Header().Set("Content-Length", "10")
			if r.Method != "HEAD" {
				io.WriteString(w, "0123456789")
			}
		}
	}), nil)
	port := freePort(t)
	g.apply([]*listenerv3.Listener{httpListener(t, port)}, map[string][]*routev3.VirtualHost{
		"http." + strconv.Itoa(int(port)): {toBackend("*")},
	})
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for _, q := range []struct{ method, path, body string }{
		{"HEAD", "/h", ""}, {"GET", "/204", ""}, {"GET", "/304", ""}, {"GET", "/g", "0123456789"},
	} {
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\n\r\n", q.method, q.path)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(br, &http.Request{Method: q.method})
		if err != nil {
			t.Fatalf("%s %s: %v", q.method, q.path, err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != q.body || resp.Header.Get("X-Path") != q.path {
			t.Fatalf("%s %s: %d %q %v %v", q.method, q.path, resp.StatusCode, b, err, resp.Header)
		}
		if q.method == "HEAD" && resp.ContentLength != 10 {
			t.Errorf("HEAD: Content-Length %d, want the upstream's 10", resp.ContentLength)
		}
		if q.path == "/304" && resp.Header.Get("Etag") != `"e"` {
			t.Errorf("304: Etag %q", resp.Header.Get("Etag"))
		}
	}
}

// A client that leaves before the upstream answers is recorded as gone
// (DC), not as an upstream timeout or failure, over HTTP/1.1 and HTTP/2,
// with or without a retry policy (whose loop must not retry for a client
// that left) and a route timeout.
func TestGatewayClientLeavesBeforeResponse(t *testing.T) {
	g := newGatewayFixture(t)
	var calls, active atomic.Int32
	g.backend = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		active.Add(1)
		defer active.Add(-1)
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	}), nil)
	port := freePort(t)
	vh := func(name string, timeout time.Duration, retry *routev3.RetryPolicy) *routev3.VirtualHost {
		return &routev3.VirtualHost{Name: name, Domains: []string{name}, Routes: []*routev3.Route{{Name: name,
			Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
			Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: backendCluster},
				Timeout: durationpb.New(timeout), RetryPolicy: retry}}}}}
	}
	retry := &routev3.RetryPolicy{RetryOn: "5xx,reset,connect-failure", NumRetries: wrapperspb.UInt32(3)}
	g.apply([]*listenerv3.Listener{httpListener(t, port)}, map[string][]*routev3.VirtualHost{
		"http." + strconv.Itoa(int(port)): {vh("none", 0, nil), vh("timeout", time.Minute, nil), vh("retry", time.Minute, retry), vh("retry-none", 0, retry)},
	})
	hosts := []string{"none", "timeout", "retry", "retry-none"}
	for _, host := range hosts {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		before := calls.Load()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		waitFor(t, "the request upstream", func() bool { return calls.Load() > before })
		c.Close()
	}
	// An HTTP/2 client's stream reset is its leaving too.
	hosts = append(hosts, "none")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	req.Host = "none"
	before := calls.Load()
	h2done := make(chan struct{})
	go func() {
		defer close(h2done)
		if resp, err := h2cClient(t).Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("h2c: an answer for a canceled request: %d", resp.StatusCode)
		}
	}()
	waitFor(t, "the h2c request upstream", func() bool { return calls.Load() > before })
	cancel()
	<-h2done
	waitFor(t, "every request recorded", func() bool {
		return sumWhere(t, g.reg, "istio_requests_total", "", "") == float64(len(hosts))
	})
	if dc := sumWhere(t, g.reg, "istio_requests_total", "response_flags", "DC"); dc != float64(len(hosts)) {
		t.Errorf("%v of %d requests recorded as DC; UT %v, UF %v, URX %v", dc, len(hosts),
			sumWhere(t, g.reg, "istio_requests_total", "response_flags", "UT"),
			sumWhere(t, g.reg, "istio_requests_total", "response_flags", "UF"),
			sumWhere(t, g.reg, "istio_requests_total", "response_flags", "URX"))
	}
	waitFor(t, "every upstream request canceled", func() bool { return active.Load() == 0 })
	if n := calls.Load(); n != int32(len(hosts)) {
		t.Errorf("%d upstream calls for %d requests: a retry for a client that left", n, len(hosts))
	}
}

// A request without a body, over HTTP/2 (END_STREAM on its HEADERS) as
// over HTTP/1.1, goes to an HTTP/1.1 upstream without one either: no
// empty chunked body, which a backend reads as a body it must consume
// before it can notice its client leave, and some refuse on a GET.
func TestGatewayBodilessRequestUpstream(t *testing.T) {
	g := newGatewayFixture(t)
	g.backend = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Seen-Te", strings.Join(r.TransferEncoding, ","))
		w.Header().Set("Seen-Cl", strconv.FormatInt(r.ContentLength, 10))
	}), nil)
	port := freePort(t)
	g.apply([]*listenerv3.Listener{httpListener(t, port)}, map[string][]*routev3.VirtualHost{
		"http." + strconv.Itoa(int(port)): {toBackend("*")},
	})
	for name, c := range map[string]*http.Client{"HTTP/1.1": plainClient(t), "h2c": h2cClient(t)} {
		resp := gwGet(t, c, "http", port, "x", nil)
		if te, cl := resp.Header.Get("Seen-Te"), resp.Header.Get("Seen-Cl"); te != "" || cl != "0" {
			t.Errorf("%s: GET upstream with Transfer-Encoding %q, Content-Length %s", name, te, cl)
		}
	}
}
