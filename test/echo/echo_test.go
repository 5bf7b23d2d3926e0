package echo

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/weftmesh/weft/internal/testpki"
)

func startServer(t *testing.T) *Server {
	t.Helper()
	s := NewServer(ServerConfig{
		HTTPPorts: []int{0}, GRPCPorts: []int{0}, TCPPorts: []int{0}, Addr: "127.0.0.1",
		Identity: Identity{Pod: "echo-0", Namespace: "ns1", ServiceAccount: "sa1", Node: "n1", IP: "127.0.0.1"},
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	return s
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestProtocols(t *testing.T) {
	s := startServer(t)
	port := func(proto string) int { return s.Addrs(proto)[0].(*net.TCPAddr).Port }
	for _, tc := range []struct {
		target, proto string
		headers       bool
	}{
		{fmt.Sprintf("http://127.0.0.1:%d/a?b=c", port("http")), ProtoHTTP1, true},
		{fmt.Sprintf("h2c://127.0.0.1:%d/a?b=c", port("http")), ProtoH2C, true},
		{fmt.Sprintf("grpc://127.0.0.1:%d", port("grpc")), ProtoGRPC, true},
		{fmt.Sprintf("tcp://127.0.0.1:%d", port("tcp")), ProtoTCP, false},
	} {
		t.Run(tc.proto, func(t *testing.T) {
			c, err := NewClient(ClientConfig{Target: tc.target, Count: 3, Headers: http.Header{"X-Test": {"yes"}}})
			if err != nil {
				t.Fatal(err)
			}
			results := c.Send(context.Background())
			if got := Summary(results); got != "3/3 ok; answered: echo-0=3" {
				t.Fatalf("Summary = %q", got)
			}
			r := results[0].Response
			want := Identity{Pod: "echo-0", Namespace: "ns1", ServiceAccount: "sa1", Node: "n1", IP: "127.0.0.1"}
			if diff := cmp.Diff(want, r.Identity); diff != "" {
				t.Errorf("identity (-want +got):\n%s", diff)
			}
			if r.Protocol != tc.proto {
				t.Errorf("protocol = %q, want %q", r.Protocol, tc.proto)
			}
			if !strings.HasPrefix(r.Peer, "127.0.0.1:") {
				t.Errorf("peer = %q, want 127.0.0.1:<port>", r.Peer)
			}
			if tc.headers {
				got := r.Headers["X-Test"]
				if got == nil {
					got = r.Headers["x-test"]
				}
				if diff := cmp.Diff([]string{"yes"}, got); diff != "" {
					t.Errorf("X-Test header (-want +got):\n%s\nall: %v", diff, r.Headers)
				}
			}
			if tc.proto == ProtoHTTP1 && r.Path != "/a?b=c" {
				t.Errorf("path = %q", r.Path)
			}
			// Each request opens its own connection: distinct peer ports.
			if results[0].Response.Peer == results[1].Response.Peer {
				t.Errorf("two requests share a connection (peer %s)", results[0].Response.Peer)
			}
		})
	}
}

func TestTCPEchoesAfterResponse(t *testing.T) {
	s := startServer(t)
	c, err := net.Dial("tcp", s.Addrs("tcp")[0].String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil || !strings.Contains(string(buf[:n]), `"pod":"echo-0"`) {
		t.Fatalf("first line %q, %v", buf[:n], err)
	}
	fmt.Fprintf(c, "ping\n")
	n, err = c.Read(buf)
	if err != nil || string(buf[:n]) != "ping\n" {
		t.Fatalf("echo %q, %v", buf[:n], err)
	}
}

func TestClientErrors(t *testing.T) {
	for _, target := range []string{"", "ftp://a:1", "tcp://nohost", "grpc://nohost", "tcp://:"} {
		if _, err := NewClient(ClientConfig{Target: target}); err == nil {
			t.Errorf("NewClient(%q) succeeded", target)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c, err := NewClient(ClientConfig{Target: "http://" + addr, Count: 2, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := Summary(c.Send(context.Background()))
	if !strings.HasPrefix(got, "0/2 ok; answered:; first error:") {
		t.Fatalf("Summary = %q", got)
	}
}

func TestServerConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  ServerConfig
		want string
	}{
		{ServerConfig{HTTPPorts: []int{}, GRPCPorts: []int{}, TCPPorts: []int{}}, "no ports"},
		{ServerConfig{HTTPPorts: []int{80}, GRPCPorts: []int{80}}, "twice"},
		{ServerConfig{HTTPPorts: []int{70000}}, "out of range"},
		{ServerConfig{TLSPorts: []int{8443}}, "certificate and key"},
		{ServerConfig{HTTPPorts: []int{8443}, TLSPorts: []int{8443}, TLSCertFile: "c", TLSKeyFile: "k"}, "twice"},
	} {
		tc.cfg.SetDefaults()
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestSteeringHeaders(t *testing.T) {
	s := startServer(t)
	target := "http://" + s.Addrs("http")[0].String() + "/"
	send := func(n int, headers ...string) []Result {
		t.Helper()
		h := http.Header{}
		for i := 0; i < len(headers); i += 2 {
			h.Set(headers[i], headers[i+1])
		}
		c, err := NewClient(ClientConfig{Target: target, Count: n, Headers: h, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return c.Send(context.Background())
	}
	statuses := func(rs []Result) []int {
		var out []int
		for _, r := range rs {
			out = append(out, r.Status)
		}
		return out
	}
	if got := statuses(send(1, HeaderStatus, "418")); !slices.Equal(got, []int{418}) {
		t.Errorf("%s: 418 answered %v", HeaderStatus, got)
	}
	if got := statuses(send(3, HeaderFailOnce, "k1")); !slices.Equal(got, []int{503, 200, 200}) {
		t.Errorf("%s: answered %v, want 503 then 200s", HeaderFailOnce, got)
	}
	if got := statuses(send(1, HeaderFailOnce, "k2")); !slices.Equal(got, []int{503}) {
		t.Errorf("%s with a new key answered %v, want 503", HeaderFailOnce, got)
	}
	rs := send(1, HeaderDelay, "150ms")
	if rs[0].Status != 200 || rs[0].Duration < 150*time.Millisecond {
		t.Errorf("%s: 150ms answered %d after %v", HeaderDelay, rs[0].Status, rs[0].Duration)
	}
	for _, bad := range [][]string{{HeaderStatus, "99"}, {HeaderStatus, "x"}, {HeaderDelay, "2h"}, {HeaderDelay, "soon"}} {
		rs := send(1, bad...)
		if rs[0].Status != 400 || !strings.Contains(rs[0].Error, bad[0]) {
			t.Errorf("%s: %s answered %d %q, want 400 naming the header", bad[0], bad[1], rs[0].Status, rs[0].Error)
		}
	}
}

func TestPacedAndKeepAlive(t *testing.T) {
	s := startServer(t)
	target := "http://" + s.Addrs("http")[0].String() + "/"
	for _, tc := range []struct {
		name      string
		keepAlive bool
		conns     int
	}{
		{"new connection each", false, 10},
		{"one kept-alive connection", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(ClientConfig{Target: target, Every: 10 * time.Millisecond, For: 100 * time.Millisecond, KeepAlive: tc.keepAlive})
			if err != nil {
				t.Fatal(err)
			}
			rs := c.Send(context.Background())
			if len(rs) != 10 {
				t.Fatalf("%d results, want 10: %s", len(rs), Summary(rs))
			}
			for i, r := range rs {
				if r.Response == nil || r.Conn == "" || r.Start.IsZero() {
					t.Errorf("result %d: %+v", i, r)
				}
				if i > 0 && r.Start.Before(rs[i-1].Start) {
					t.Errorf("result %d started before result %d", i, i-1)
				}
			}
			if got := len(Connections(rs)); got != tc.conns {
				t.Errorf("%d connections carried the requests, want %d: %v", got, tc.conns, Connections(rs))
			}
		})
	}
	for _, cfg := range []ClientConfig{
		{Target: target, Every: time.Millisecond},
		{Target: target, For: time.Second},
		{Target: target, Every: -time.Millisecond, For: time.Second},
		{Target: "tcp://" + s.Addrs("tcp")[0].String(), KeepAlive: true},
	} {
		if _, err := NewClient(cfg); err == nil {
			t.Errorf("NewClient(%+v) succeeded", cfg)
		}
	}
}

// A TLS port ends TLS with its certificate and answers over HTTP/1.1 with
// the server name the client sent.
func TestTLSPort(t *testing.T) {
	root, err := testpki.NewRoot("echo test root")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := root.Server("echo.example.com", []string{"echo.example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := ServerConfig{HTTPPorts: []int{}, GRPCPorts: []int{}, TCPPorts: []int{}, TLSPorts: []int{0}, Addr: "127.0.0.1",
		TLSCertFile: filepath.Join(dir, "tls.crt"), TLSKeyFile: filepath.Join(dir, "tls.key"), Identity: Identity{Pod: "echo-0"}}
	if err := leaf.WriteFiles(cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
		t.Fatal(err)
	}
	s := NewServer(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-s.Ready()
	roots := x509.NewCertPool()
	roots.AddCert(root.Cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "echo.example.com"}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + s.Addrs("tls")[0].String() + "/x")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r Response
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if r.Pod != "echo-0" || r.TLSServerName != "echo.example.com" || r.Path != "/x" {
		t.Errorf("response %+v", r)
	}
}
