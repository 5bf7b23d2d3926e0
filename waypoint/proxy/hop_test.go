package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
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
