package e2e

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/net/http2"

	"github.com/weftmesh/weft/test/echo"
)

// waypointMetrics reads the waypoint's Prometheus metrics.
func (m *mesh) waypointMetrics(ctx context.Context, t *testing.T) string {
	t.Helper()
	pods, err := m.c.WaitPods(ctx, appNS, "gateway.networking.k8s.io/gateway-name=waypoint", 1)
	if err != nil {
		t.Fatal(err)
	}
	// Where the pod's scrape annotations say, as Prometheus would.
	a := pods[0].Annotations
	if a["prometheus.io/scrape"] != "true" {
		t.Fatalf("waypoint pod annotations %v: not prometheus.io/scrape", a)
	}
	text, err := m.c.HTTPGet(ctx, appNS, pods[0].Name, "http://127.0.0.1:"+a["prometheus.io/port"]+a["prometheus.io/path"])
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// wsDial opens a WebSocket session from the client pod to path on the echo
// Service: through the pod's ztunnel and the waypoint.
func (m *mesh) wsDial(ctx context.Context, t *testing.T, path string) (*websocket.Conn, *http.Response, error) {
	return m.wsDialFrom(ctx, t, m.client.Name, path)
}

// targetAddr is the echo Service's host:port.
func (m *mesh) targetAddr() string {
	return strings.TrimSuffix(strings.TrimPrefix(m.target, "http://"), "/")
}

// wsDialFrom opens a WebSocket session from pod to path on the echo
// Service.
func (m *mesh) wsDialFrom(ctx context.Context, t *testing.T, pod, path string) (*websocket.Conn, *http.Response, error) {
	addr := m.targetAddr()
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return m.dialFrom(t, pod, addr) }}
	t.Cleanup(tr.CloseIdleConnections)
	c, resp, err := websocket.Dial(ctx, "ws://"+addr+path, &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if c != nil {
		c.SetReadLimit(1 << 20)
	}
	return c, resp, err
}

// TestWebSocket: a WebSocket session from a pod to a Service through its
// waypoint carries messages both ways and is counted with code 101; an
// upgrade on a denied path is refused like any request.
func TestWebSocket(t *testing.T) {
	m := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, resp, err := m.wsDial(ctx, t, "/ws")
	if err != nil {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Fatalf("WebSocket handshake: status %d: %v", code, err)
	}
	for _, msg := range []string{"hello", strings.Repeat("y", 64<<10), "bye"} {
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatalf("writing a %d-byte message: %v", len(msg), err)
		}
		_, got, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("reading the answer to a %d-byte message: %v", len(msg), err)
		}
		if s := string(got); !strings.HasPrefix(s, "echo-v") || !strings.HasSuffix(s, ": "+msg) {
			t.Fatalf("answer to a %d-byte message: %.60q", len(msg), s)
		}
	}
	if err := c.Close(websocket.StatusNormalClosure, "done"); err != nil {
		t.Fatalf("closing: %v", err)
	}
	err = m.c.WaitFor(ctx, "the waypoint counting the session with code 101", func(ctx context.Context) (bool, error) {
		for _, l := range strings.Split(m.waypointMetrics(ctx, t), "\n") {
			if strings.HasPrefix(l, "istio_requests_total{") && strings.Contains(l, `response_code="101"`) &&
				strings.Contains(l, `destination_service="echo.`+appNS+`.svc.cluster.local"`) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Error(err)
	}
	if _, resp, err := m.wsDial(ctx, t, "/admin/ws"); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("upgrade on a denied path: %v, want 403", err)
	}
}

// privateWS lets only the client's identity open sessions under /private.
const privateWS = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: private-ws
  namespace: ` + appNS + `
spec:
  targetRefs:
  - {group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}
  action: DENY
  rules:
  - from:
    - source: {notPrincipals: ["cluster.local/ns/` + appNS + `/sa/client"]}
    to:
    - operation: {paths: ["/private/*"]}
`

// TestWebSocketByPrincipal: an L7 policy on the caller's identity decides
// who may open a WebSocket session: the client's is allowed under
// /private, another workload of the namespace is refused there and allowed
// elsewhere.
func TestWebSocketByPrincipal(t *testing.T) {
	m := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	others, err := m.c.WaitPods(ctx, appNS, "app=echo-v1", 1)
	if err != nil {
		t.Fatal(err)
	}
	other := others[0].Name
	if err := m.c.Apply(ctx, privateWS); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.c.Delete(context.Background(), privateWS) })
	status := func(pod, path string) int {
		c, resp, err := m.wsDialFrom(ctx, t, pod, path)
		if err != nil {
			if resp != nil {
				return resp.StatusCode
			}
			return 0
		}
		defer c.CloseNow()
		if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
			return 0
		}
		if _, got, err := c.Read(ctx); err != nil || !strings.HasSuffix(string(got), ": hi") {
			return 0
		}
		c.Close(websocket.StatusNormalClosure, "")
		return http.StatusSwitchingProtocols
	}
	err = m.c.WaitFor(ctx, "the waypoint refusing "+other+" under /private", func(context.Context) (bool, error) {
		return status(other, "/private/ws") == http.StatusForbidden, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := status(m.client.Name, "/private/ws"); got != http.StatusSwitchingProtocols {
		t.Errorf("the client's session under /private: %d, want an open session", got)
	}
	if got := status(other, "/ws"); got != http.StatusSwitchingProtocols {
		t.Errorf("%s's session outside /private: %d, want an open session", other, got)
	}
}

// TestWebSocketOverHTTP2: an HTTP/2 client opens a WebSocket session with
// an extended CONNECT (RFC 8441) through the waypoint, which the deployer
// started able to take it, to the echo server's HTTP/1.1 WebSocket.
func TestWebSocketOverHTTP2(t *testing.T) {
	m := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := m.dialFromPod(t, m.targetAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	//lint:ignore SA1019 a client on one given connection
	cc, err := (&http2.Transport{AllowHTTP: true}).NewClientConn(c)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	s, _, err := echo.DialWebSocketH2(ctx, cc, "http://"+m.targetAddr()+"/ws")
	if err != nil {
		t.Fatalf("WebSocket over HTTP/2 through the waypoint: %v", err)
	}
	for _, msg := range []string{"hello", strings.Repeat("z", 64<<10)} {
		if err := s.Send(msg); err != nil {
			t.Fatalf("sending a %d-byte message: %v", len(msg), err)
		}
		got, err := s.Receive()
		if err != nil || !strings.HasPrefix(got, "echo-v") || !strings.HasSuffix(got, ": "+msg) {
			t.Fatalf("answer to a %d-byte message: %.60q, %v", len(msg), got, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Errorf("closing: %v", err)
	}
}

const dryRunDeny = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: deny-dryrun
  namespace: ` + appNS + `
  annotations: {istio.io/dry-run: "true"}
spec:
  targetRefs:
  - {group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}
  action: DENY
  rules:
  - to:
    - operation: {paths: ["/dryrun"]}
`

// TestDryRunDeny: a DENY AuthorizationPolicy in dry-run lets requests
// through the waypoint and counts them as would-be denied.
func TestDryRunDeny(t *testing.T) {
	m := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := m.c.Apply(ctx, dryRunDeny); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.c.Delete(context.Background(), dryRunDeny) })
	const series = `weft_waypoint_rbac_shadow_total{action="deny",result="denied"}`
	err := m.c.WaitFor(ctx, "the waypoint evaluating the dry-run policy", func(ctx context.Context) (bool, error) {
		rs := m.send(t, "/dryrun", 1)
		if rs[0].Status != 200 {
			t.Fatalf("/dryrun under a dry-run DENY: got %d %s, want 200", rs[0].Status, rs[0].Error)
		}
		return strings.Contains(m.waypointMetrics(ctx, t), series), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if rs := m.send(t, "/dryrun", 1); rs[0].Status != 200 {
			t.Errorf("/dryrun under a dry-run DENY: got %d, want 200", rs[0].Status)
		}
	}
}
