package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/weftmesh/weft/internal/hbone"
)

// wsEcho is a WebSocket server echoing each message with a prefix; conns
// counts the connections it accepted.
func wsEcho(t *testing.T, conns *atomic.Int32) netip.AddrPort {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, append([]byte("echo "), msg...)); err != nil {
				return
			}
		}
	})
	return serveHTTP(t, h, func(s *http.Server) {
		s.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew && conns != nil {
				conns.Add(1)
			}
		}
	})
}

// wsDial opens a WebSocket session to path through the waypoint.
func (m *mesh) wsDial(ctx context.Context, path string) (*websocket.Conn, *http.Response, error) {
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return m.dial(vip) }}
	m.t.Cleanup(tr.CloseIdleConnections)
	c, resp, err := websocket.Dial(ctx, "ws://"+svcHost+path, &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if c != nil {
		c.SetReadLimit(1 << 20)
	}
	return c, resp, err
}

func wsRoundTrip(ctx context.Context, t *testing.T, c *websocket.Conn, msg string) {
	t.Helper()
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		t.Fatalf("writing a %d-byte message: %v", len(msg), err)
	}
	_, got, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("reading the echo of a %d-byte message: %v", len(msg), err)
	}
	if string(got) != "echo "+msg {
		t.Fatalf("echo of a %d-byte message: got %d bytes", len(msg), len(got))
	}
}

func wsRoutes() []*routev3.Route {
	return []*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("ws")}}
}

// TestWebSocket: a WebSocket session through the waypoint carries
// messages both ways and closes cleanly; it counts as one request with
// response code 101.
func TestWebSocket(t *testing.T) {
	m := newMesh(t)
	m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {wsEcho(t, nil)}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := m.wsDial(ctx, "/chat")
	if err != nil {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Fatalf("WebSocket handshake through the waypoint: status %d: %v", code, err)
	}
	for _, msg := range []string{"hello", strings.Repeat("x", 100<<10), "bye"} {
		wsRoundTrip(ctx, t, c, msg)
	}
	if err := c.Close(websocket.StatusNormalClosure, "done"); err != nil {
		t.Fatalf("closing: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for m.requests(t, "101") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("istio_requests_total{response_code=101} = %v, want 1", m.requests(t, "101"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWebSocketSurvivesConfigPush: a session open across a configuration
// push (a new route and policy) goes on.
func TestWebSocketSurvivesConfigPush(t *testing.T) {
	m := newMesh(t)
	backends := map[string][]netip.AddrPort{"ws": {wsEcho(t, nil)}}
	m.apply(wsRoutes(), backends)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := m.wsDial(ctx, "/chat")
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	wsRoundTrip(ctx, t, c, "before")
	routes := append([]*routev3.Route{{Name: "other", Match: prefix("/other"), Action: toCluster("ws")}}, wsRoutes()...)
	m.apply(routes, backends, denyPath(t, "/other"))
	wsRoundTrip(ctx, t, c, "after")
	m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {wsEcho(t, nil)}})
	wsRoundTrip(ctx, t, c, "after the endpoint changed")
}

func denyPath(t *testing.T, path string) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rbacfilter.RBAC{
		Rules: &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{"deny": pathPolicy(path)}}})}}
}

// TestUpgradeDenied: an upgrade request is authorized like any other: an
// L7 DENY answers 403 and no upstream connection is made.
func TestUpgradeDenied(t *testing.T) {
	m := newMesh(t)
	var conns atomic.Int32
	m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {wsEcho(t, &conns)}}, denyPath(t, "/admin"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, resp, err := m.wsDial(ctx, "/admin/socket")
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Fatalf("denied upgrade: status %d, err %v; want 403", code, err)
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("the upstream got %d connections, want none", n)
	}
}

// rawUpgrade sends an upgrade request with the given Upgrade value on a new
// connection through the waypoint and returns the response head.
func (m *mesh) rawUpgrade(t *testing.T, path string, hdr ...string) (*http.Response, *bufio.Reader, net.Conn) {
	t.Helper()
	c, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET " + path + " HTTP/1.1\r\nHost: " + svcHost + "\r\n" + strings.Join(hdr, "\r\n") + "\r\n\r\n"
	if strings.Contains(req, "Content-Length: 3") {
		req += "abc"
	}
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	return resp, br, c
}

// TestUpgradeNotSwitched: an upstream that answers an upgrade request
// with 200 gives an ordinary response, and the connection serves the next
// request.
func TestUpgradeNotSwitched(t *testing.T) {
	m := newMesh(t)
	var got atomic.Value
	b := backend(t, "plain", func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Upgrade") + "|" + r.Header.Get("Connection"))
		io.WriteString(w, "plain "+r.URL.Path)
	})
	m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {b}})
	resp, br, c := m.rawUpgrade(t, "/x", "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
	if resp.StatusCode != 200 || body(resp) != "plain /x" {
		t.Fatalf("got %d, want the upstream's 200", resp.StatusCode)
	}
	if v := got.Load(); v != "websocket|Upgrade" {
		t.Errorf("the upstream saw Upgrade|Connection %q, want %q", v, "websocket|Upgrade")
	}
	io.WriteString(c, "GET /next HTTP/1.1\r\nHost: "+svcHost+"\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 || body(resp) != "plain /next" {
		t.Fatalf("next request on the connection: %v", err)
	}
}

// TestUpgradeNotPassed: upgrades other than WebSocket (h2c, a list, a
// request with a body, HTTP/1.0, Upgrade without Connection: upgrade) go
// upstream as ordinary requests without their Upgrade header.
func TestUpgradeNotPassed(t *testing.T) {
	m := newMesh(t)
	var got atomic.Value
	b := backend(t, "plain", func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Upgrade") + "|" + r.Header.Get("Connection"))
		io.WriteString(w, "plain")
	})
	m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {b}})
	for _, hdr := range [][]string{
		{"Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA"},
		{"Connection: Upgrade", "Upgrade: h2c, websocket"},
		{"Connection: Upgrade", "Upgrade: websocket", "Content-Length: 3"},
		{"Upgrade: websocket"},
		{"Connection: keep-alive", "Upgrade: websocket"},
	} {
		got.Store("none")
		resp, _, _ := m.rawUpgrade(t, "/x", hdr...)
		if resp.StatusCode != 200 {
			t.Errorf("%q: status %d, want 200", hdr, resp.StatusCode)
		}
		if v := got.Load(); v != "|" {
			t.Errorf("%q: the upstream saw Upgrade|Connection %q, want none", hdr, v)
		}
	}
}

// TestUnaskedSwitch: a 101 to a request that did not ask for an upgrade
// the waypoint passes is a protocol error, not a tunnel.
func TestUnaskedSwitch(t *testing.T) {
	m := newMesh(t)
	up := rawUpstream(t, func(c net.Conn) {
		http.ReadRequest(bufio.NewReader(c))
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\nraw bytes")
		io.Copy(io.Discard, c) // until the waypoint closes it
	})
	m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {up}})
	for _, hdr := range [][]string{
		{"Connection: Upgrade", "Upgrade: h2c"},
		{"Connection: Upgrade", "Upgrade: websocket"}, // the upstream switched to another protocol
		{"X-Plain: 1"},
	} {
		resp, _, _ := m.rawUpgrade(t, "/x", hdr...)
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("%q: status %d, want 502", hdr, resp.StatusCode)
		}
	}
}

// TestUpgradeHalfClose: after the 101 the bytes are relayed as they are,
// and each side's end of sending reaches the other as a half-close, while
// the other direction goes on.
func TestUpgradeHalfClose(t *testing.T) {
	m := newMesh(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nhello ")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(br) // to the client's half-close
		got <- string(b)
		io.WriteString(c, "after your end")
	}()
	m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {ln.Addr().(*net.TCPAddr).AddrPort()}})
	c, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /raw HTTP/1.1\r\nHost: "+svcHost+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x00raw\xffbytes")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 || resp.Header.Get("Upgrade") != "websocket" {
		t.Fatalf("switch: %v %v", resp, err)
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "\x00raw\xffbytes" {
		t.Errorf("the upstream got %q", s)
	}
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "hello after your end" {
		t.Errorf("the client got %q, %v", rest, err)
	}
}

// resettingSwitch is an upstream that switches protocols for one request,
// sends "partial" and resets its connection: a session that broke.
func resettingSwitch(t *testing.T) netip.AddrPort {
	return rawUpstream(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\npartial")
		time.Sleep(50 * time.Millisecond)
		c.(*net.TCPConn).SetLinger(0) // rawUpstream closes it
	})
}

// readSwitched sends an upgrade request on c, reads the switch and the
// session's bytes to their end, and returns them and the error that ended
// them.
func readSwitched(t *testing.T, c net.Conn, host string) (string, error) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: "+host+"\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("switch: %v %v", resp, err)
	}
	b, err := io.ReadAll(br)
	return string(b), err
}

// TestUpgradeResetPassedOn: an upstream that resets a switched session
// resets the client's stream, so that the client does not take what it
// got for the session's whole.
func TestUpgradeResetPassedOn(t *testing.T) {
	m := newMesh(t)
	m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {resettingSwitch(t)}})
	c, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := readSwitched(t, c, svcHost)
	var re *hbone.ResetError
	if got != "partial" || !errors.As(err, &re) {
		t.Errorf("the client read %q and %v, want partial and its stream reset", got, err)
	}
}
