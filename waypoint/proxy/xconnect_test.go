package proxy

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weftmesh/weft/test/echo"
)

// net/http's HTTP/2 (the waypoint's) and x/net/http2 (the tests' client)
// read GODEBUG once, as the process starts: the tests of
// WebSocket over HTTP/2 run in a process of their own with extended
// CONNECT on, as the deployer starts every waypoint.

const xconnectOn = "http2xconnect=1"

// inXConnectProcess reports whether extended CONNECT is on in this
// process; when it is not, it runs the calling test again in a process
// where it is, and passes on its outcome.
func inXConnectProcess(t *testing.T) bool {
	t.Helper()
	godebug := os.Getenv("GODEBUG")
	if strings.Contains(godebug, xconnectOn) {
		return true
	}
	if godebug != "" {
		godebug += ","
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "GODEBUG="+godebug+xconnectOn)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("%s with %s: %v\n%s", t.Name(), xconnectOn, err, out)
	}
	t.Logf("with %s:\n%s", xconnectOn, out)
	return false
}

// wsH2 opens a WebSocket session over HTTP/2 to path through the waypoint.
func (m *mesh) wsH2(ctx context.Context, path string) (*echo.WebSocketH2, *http.Response, error) {
	return echo.DialWebSocketH2(ctx, m.h2client(vip), "http://"+svcHost+path)
}

// TestWebSocketOverHTTP2: an HTTP/2 client's extended CONNECT (RFC 8441)
// reaches an HTTP/1.1 WebSocket server as its upgrade, authorized as the
// GET it stands for; the session carries messages both ways and the
// server's end of it ends the stream. Other protocols, and upstreams that
// do not open the session they were asked for, are refused.
func TestWebSocketOverHTTP2(t *testing.T) {
	if !inXConnectProcess(t) {
		return
	}
	m := newMesh(t)
	var conns atomic.Int32
	m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {wsEcho(t, &conns)}}, denyPath(t, "/admin"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	s, resp, err := m.wsH2(ctx, "/chat")
	if err != nil {
		t.Fatalf("WebSocket over HTTP/2: %v", err)
	}
	if v := resp.Header.Get("Sec-WebSocket-Accept"); v != "" {
		t.Errorf("the client got the upstream's Sec-WebSocket-Accept %q", v)
	}
	for _, msg := range []string{"hello", strings.Repeat("x", 100<<10), "bye"} {
		if err := s.Send(msg); err != nil {
			t.Fatalf("sending a %d-byte message: %v", len(msg), err)
		}
		got, err := s.Receive()
		if err != nil || got != "echo "+msg {
			t.Fatalf("echo of a %d-byte message: %d bytes, %v", len(msg), len(got), err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("closing: %v", err)
	}
	waitCounted(t, m, "200", 1)

	// Authorized as the GET it becomes: a DENY on the path holds, and no
	// upstream connection is made.
	before := conns.Load()
	if _, resp, err := m.wsH2(ctx, "/admin/socket"); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("WebSocket over HTTP/2 on a denied path: %v, want 403", err)
	}
	for _, proto := range []string{"connect-udp", "h2c", "websocket2"} {
		pr, pw := io.Pipe()
		defer pw.Close()
		req, _ := http.NewRequestWithContext(ctx, http.MethodConnect, "http://"+svcHost+"/chat", pr)
		req.Header.Set(":protocol", proto)
		resp, err := m.h2client(vip).RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf(":protocol %s: %v %v, want 403", proto, resp, err)
		}
	}
	if n := conns.Load(); n != before {
		t.Errorf("refused sessions made %d upstream connections", n-before)
	}
}

// TestWebSocketOverHTTP2Upstreams: what the waypoint sends for an HTTP/2
// WebSocket, and what it makes of upstreams that do not open the session.
func TestWebSocketOverHTTP2Upstreams(t *testing.T) {
	if !inXConnectProcess(t) {
		return
	}
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name   string
		answer func(key string) string // the upstream's response head
		want   int
	}{
		{"accepted", func(key string) string {
			return "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: " + rfc6455Accept(key) + "\r\n\r\n"
		}, http.StatusOK},
		{"wrong accept", func(key string) string {
			return "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: " + rfc6455Accept(key+"x") + "\r\n\r\n"
		}, http.StatusBadGateway},
		{"other protocol", func(key string) string {
			return "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nSec-WebSocket-Accept: " + rfc6455Accept(key) + "\r\n\r\n"
		}, http.StatusBadGateway},
		{"not switched", func(string) string {
			return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		}, http.StatusBadGateway},
		{"refused", func(string) string {
			return "HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n"
		}, http.StatusUpgradeRequired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(chan *http.Request, 1)
			up := rawUpstream(t, func(c net.Conn) {
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				seen <- req
				io.WriteString(c, tc.answer(req.Header.Get("Sec-WebSocket-Key")))
				io.Copy(c, br) // the session's bytes back, to the client's end
			})
			m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {up}})
			s, resp, err := m.wsH2(ctx, "/chat?room=1")
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			if code != tc.want {
				t.Fatalf("status %d (%v), want %d", code, err, tc.want)
			}
			req := <-seen
			if req.Method != "GET" || req.RequestURI != "/chat?room=1" || req.Proto != "HTTP/1.1" ||
				req.Header.Get("Upgrade") != "websocket" || req.Header.Get("Connection") != "Upgrade" ||
				req.Header.Get("Sec-WebSocket-Version") != "13" || len(req.Header.Get("Sec-WebSocket-Key")) != 24 ||
				req.Header.Get(":protocol") != "" || req.ContentLength != 0 {
				t.Errorf("the upstream got %s %s %s %v (length %d)", req.Method, req.RequestURI, req.Proto, req.Header, req.ContentLength)
			}
			if s == nil {
				return
			}
			// The raw upstream returns the frame as it is: a masked client
			// frame the client reads back as a frame all the same.
			if err := s.Send("ping"); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil && err != io.EOF {
				t.Logf("close: %v", err)
			}
		})
	}
}

// TestWebSocketOverHTTP2UpstreamEnds: the upstream closing the session's
// connection ends the client's stream, while the client has not ended it;
// the upstream resetting it resets the client's stream.
func TestWebSocketOverHTTP2UpstreamEnds(t *testing.T) {
	if !inXConnectProcess(t) {
		return
	}
	for _, reset := range []bool{false, true} {
		m := newMesh(t)
		up := rawUpstream(t, func(c net.Conn) {
			req, err := http.ReadRequest(bufio.NewReader(c))
			if err != nil {
				return
			}
			fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: %s\r\n\r\n", rfc6455Accept(req.Header.Get("Sec-WebSocket-Key")))
			io.WriteString(c, "\x81\x03bye") // one text frame, then the end
			if reset {
				time.Sleep(50 * time.Millisecond)
				c.(*net.TCPConn).SetLinger(0)
			}
		})
		m.apply(wsRoutes(), map[string][]netip.AddrPort{"ws": {up}})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, _, err := m.wsH2(ctx, "/chat")
		if err != nil {
			t.Fatal(err)
		}
		if msg, err := s.Receive(); err != nil || msg != "bye" {
			t.Fatalf("got %q, %v", msg, err)
		}
		done := make(chan error, 1)
		go func() { _, err := s.Receive(); done <- err }()
		select {
		case err := <-done:
			switch {
			case err == nil:
				t.Error("a message after the upstream's end")
			case reset && (errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "stream error")):
				// The client reads a failure, not an end it could take
				// for the session's whole.
				t.Errorf("after the upstream's reset the client read %v, want its stream reset", err)
			}
		case <-ctx.Done():
			t.Fatal("the stream outlived the upstream's connection")
		}
	}
}

// rawUpstream serves each connection with serve.
func rawUpstream(t *testing.T, serve func(net.Conn)) netip.AddrPort {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				serve(c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// rfc6455Accept is RFC 6455's answer to key, computed here independently of the
// waypoint's.
func rfc6455Accept(key string) string {
	h := sha1.New()
	io.WriteString(h, key)
	io.WriteString(h, "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// waitCounted waits until istio_requests_total counts n requests with code.
func waitCounted(t *testing.T, m *mesh, code string, n float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for m.requests(t, code) != n {
		if time.Now().After(deadline) {
			t.Fatalf("istio_requests_total{response_code=%s} = %v, want %v", code, m.requests(t, code), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
