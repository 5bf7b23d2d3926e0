package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/durationpb"
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
