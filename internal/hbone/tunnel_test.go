package hbone

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/weftmesh/weft/internal/relay"
	"github.com/weftmesh/weft/internal/spiffe"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// pki issues workload certificates for tests from one in-process CA.
type pki struct {
	t  testing.TB
	ca *spiffe.CA
}

func newPKI(t testing.TB, td string) *pki {
	t.Helper()
	ca, err := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffeid.RequireTrustDomainFromString(td)})
	if err != nil {
		t.Fatal(err)
	}
	return &pki{t: t, ca: ca}
}

func (p *pki) identity(ns, sa string) spiffe.Identity {
	id, err := spiffe.NewIdentity(p.ca.TrustDomain(), ns, sa)
	if err != nil {
		p.t.Fatal(err)
	}
	return id
}

func (p *pki) cert(id spiffe.Identity) func() (*tls.Certificate, error) {
	svid, err := p.ca.IssueSVID(id, time.Hour)
	if err != nil {
		p.t.Fatal(err)
	}
	return spiffe.StaticCertificate(svid)
}

// quietLogger keeps expected protocol errors out of the test output.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testServer is an HBONE server on a loopback port.
type testServer struct {
	addr   netip.AddrPort
	id     spiffe.Identity
	srv    *Server
	cancel context.CancelFunc
	done   chan error
	accept atomic.Int64 // TCP connections accepted
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// streamServer starts a server that accepts every stream and hands it
// out on streams, its handler kept (and so the stream) until the test
// closes the stream.
func streamServer(t testing.TB, p *pki, id spiffe.Identity) (*testServer, <-chan *Stream) {
	streams := make(chan *Stream, 1)
	ts := startServer(t, p, id, HandlerFunc(func(r *Request) {
		st, err := r.Accept(nil)
		if err != nil {
			return
		}
		streams <- st
		<-r.Context().Done()
	}))
	return ts, streams
}

// relayToAuthority is a node proxy's inbound as an HBONE handler: it
// connects to the request's authority over TCP, accepts the stream and
// relays the two; done, when not nil, gets what the relay reported.
func relayToAuthority(done func(ab, ba int64, err error)) Handler {
	return HandlerFunc(func(r *Request) {
		up, err := net.Dial("tcp", r.Authority.String())
		if err != nil {
			r.Reject(http.StatusServiceUnavailable)
			return
		}
		st, err := r.Accept(nil)
		if err != nil {
			up.Close()
			return
		}
		// As ztunnel does: the handler returns and the relay goes on.
		end := r.Detach()
		relay.Start(up, st, 0, func(ab, ba int64, err error) {
			if done != nil {
				done(ab, ba, err)
			}
			end()
		})
	})
}

func startServer(t testing.TB, p *pki, id spiffe.Identity, h Handler, tweak ...func(*ServerConfig)) *testServer {
	t.Helper()
	cfg := ServerConfig{
		TLS:     spiffe.ServerConfig(p.cert(id), p.ca.Roots(), p.ca.TrustDomain()),
		Handler: h,
		Logger:  quietLogger(),
	}
	for _, f := range tweak {
		f(&cfg)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{addr: ln.Addr().(*net.TCPAddr).AddrPort(), id: id, srv: srv, cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- srv.Serve(ctx, countingListener{ln, &ts.accept}) }()
	t.Cleanup(ts.stop)
	return ts
}

// awaitStopped fails t unless Serve returns within d (the test has
// cancelled it); what says what held it.
func (ts *testServer) awaitStopped(t testing.TB, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ts.done:
		ts.cancel = nil
	case <-time.After(d):
		t.Fatal(what)
	}
}

// awaitAccepted waits until the server has accepted n TCP connections.
func (ts *testServer) awaitAccepted(n int64) {
	for ts.accept.Load() < n {
		time.Sleep(time.Millisecond)
	}
}

func (ts *testServer) stop() {
	if ts.cancel == nil {
		return
	}
	ts.cancel()
	<-ts.done
	ts.cancel = nil
}

func newDialer(t testing.TB, p *pki, tweak ...func(*DialerConfig)) *Dialer {
	t.Helper()
	certs := map[spiffeid.ID]func() (*tls.Certificate, error){}
	var mu sync.Mutex
	cfg := DialerConfig{
		TLS: func(src spiffeid.ID, peers []spiffeid.ID) (*tls.Config, error) {
			mu.Lock()
			defer mu.Unlock()
			c, ok := certs[src]
			if !ok {
				id, err := spiffe.IdentityFromID(src)
				if err != nil {
					return nil, err
				}
				c = p.cert(id)
				certs[src] = c
			}
			return spiffe.ClientConfig(c, p.ca.Roots(), peers), nil
		},
		Logger: quietLogger(),
	}
	for _, f := range tweak {
		f(&cfg)
	}
	d, err := NewDialer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func (ts *testServer) target(src spiffe.Identity, authority string) Target {
	return Target{Source: src.ID(), Peers: []spiffeid.ID{ts.id.ID()}, Addr: ts.addr, Authority: authority}
}

// echoHandler accepts every CONNECT and echoes the stream until EOF, then
// half-closes, like a TCP echo server behind the tunnel.
var echoHandler = HandlerFunc(func(r *Request) {
	st, err := r.Accept(nil)
	if err != nil {
		return
	}
	if _, err := io.Copy(st, st); err != nil {
		return
	}
	st.CloseWrite()
	io.Copy(io.Discard, st)
})

func TestTunnelEchoAndHalfClose(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("ns1", "server"), p.identity("ns2", "client")
	var got *Request
	var mu sync.Mutex
	ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		mu.Lock()
		got = r
		mu.Unlock()
		st, err := r.Accept(http.Header{"Baggage": {"k8s.namespace.name=ns1"}})
		if err != nil {
			return
		}
		data, err := io.ReadAll(st) // until the client's CloseWrite
		if err != nil {
			t.Errorf("server read: %v", err)
			return
		}
		fmt.Fprintf(st, "got %d bytes: %s", len(data), data)
		st.CloseWrite()
	}))
	d := newDialer(t, p)
	tgt := ts.target(cliID, "10.1.2.3:8080")
	tgt.Header = http.Header{
		"Forwarded":   {`for="10.0.0.9:5555";host=echo.ns1.svc.cluster.local`},
		"Baggage":     {"k8s.cluster.name=Kubernetes"},
		"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		"Connection":  {"close"}, // hop-by-hop: must not travel
	}
	st, err := d.Dial(context.Background(), tgt)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	reply, err := io.ReadAll(st)
	if err != nil {
		t.Fatal(err)
	}
	if want := "got 5 bytes: hello"; string(reply) != want {
		t.Errorf("reply %q, want %q", reply, want)
	}
	if b := st.ResponseHeader().Get("Baggage"); b != "k8s.namespace.name=ns1" {
		t.Errorf("response baggage %q", b)
	}
	mu.Lock()
	defer mu.Unlock()
	if got.Peer != cliID.ID() {
		t.Errorf("server saw peer %s, want %s", got.Peer, cliID.ID())
	}
	if got.Authority.String() != "10.1.2.3:8080" {
		t.Errorf("authority %s", got.Authority)
	}
	for _, k := range []string{"Forwarded", "Baggage", "Traceparent"} {
		if got.Header.Get(k) != tgt.Header.Get(k) {
			t.Errorf("header %s = %q, want %q", k, got.Header.Get(k), tgt.Header.Get(k))
		}
	}
	if got.Header.Get("Connection") != "" {
		t.Errorf("hop-by-hop Connection header was forwarded")
	}
}

func TestLargeTransferBothWays(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ts := startServer(t, p, srvID, echoHandler)
	d := newDialer(t, p)
	const size = 48 << 20
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ { // two streams at once share the connection
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := d.Dial(context.Background(), ts.target(cliID, "127.0.0.1:9"))
			if err != nil {
				t.Error(err)
				return
			}
			defer st.Close()
			sent := sha256.New()
			go func() {
				_, err := io.Copy(st, io.TeeReader(io.LimitReader(rand.Reader, size), sent))
				if err != nil {
					t.Error(err)
				}
				st.CloseWrite()
			}()
			recv := sha256.New()
			n, err := io.Copy(recv, st) // exercises WriteTo
			if err != nil || n != size {
				t.Errorf("received %d bytes, err %v; want %d", n, err, size)
				return
			}
			if !bytes.Equal(sent.Sum(nil), recv.Sum(nil)) {
				t.Error("echoed data differs from what was sent")
			}
		}()
	}
	wg.Wait()
	if conns, _ := d.Stats(); conns != 1 {
		t.Errorf("pooled connections = %d, want 1", conns)
	}
}

func TestManyConcurrentStreamsAndPoolLimit(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ts := startServer(t, p, srvID, echoHandler)
	d := newDialer(t, p)
	const n = 250
	streams := make([]*Stream, n)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := d.Dial(context.Background(), ts.target(cliID, "127.0.0.1:80"))
			if err != nil {
				t.Error(err)
				return
			}
			streams[i] = st
			msg := fmt.Sprintf("stream %d", i)
			st.Write([]byte(msg))
			buf := make([]byte, len(msg))
			if _, err := io.ReadFull(st, buf); err != nil || string(buf) != msg {
				t.Errorf("stream %d echoed %q, %v", i, buf, err)
			}
		}()
	}
	wg.Wait()
	conns, open := d.Stats()
	if conns != 3 || open != n {
		t.Errorf("pool holds %d connections with %d streams; want 3 (100 streams each at most) with %d", conns, open, n)
	}
	if got := ts.accept.Load(); got != 3 {
		t.Errorf("server accepted %d connections, want 3", got)
	}
	for _, st := range streams {
		if st != nil {
			st.Close()
		}
	}
}

func TestPoolKeysAndReuse(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID := p.identity("a", "server")
	alice, bob := p.identity("b", "alice"), p.identity("b", "bob")
	ts := startServer(t, p, srvID, echoHandler)
	d := newDialer(t, p, func(c *DialerConfig) { c.IdleTimeout = 200 * time.Millisecond })
	roundTrip := func(src spiffe.Identity) {
		st, err := d.Dial(context.Background(), ts.target(src, "127.0.0.1:80"))
		if err != nil {
			t.Fatal(err)
		}
		st.Write([]byte("x"))
		st.CloseWrite()
		io.ReadAll(st)
		st.Close()
	}
	for i := 0; i < 5; i++ {
		roundTrip(alice)
	}
	if got := ts.accept.Load(); got != 1 {
		t.Errorf("5 sequential tunnels from one identity used %d connections, want 1", got)
	}
	roundTrip(bob)
	if got := ts.accept.Load(); got != 2 {
		t.Errorf("a second source identity must get its own connection: %d connections", got)
	}
	// Idle connections are released after IdleTimeout.
	waitFor(t, 10*time.Second, func() bool { c, _ := d.Stats(); return c == 0 })
	roundTrip(alice)
	if got := ts.accept.Load(); got != 3 {
		t.Errorf("after release a new connection is made: %d connections, want 3", got)
	}
}

func TestConcurrentDialsShareOneHandshake(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ts := startServer(t, p, srvID, echoHandler)
	d := newDialer(t, p)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			st, err := d.Dial(context.Background(), ts.target(cliID, "127.0.0.1:80"))
			if err != nil {
				t.Error(err)
				return
			}
			st.Close()
		}()
	}
	close(start)
	wg.Wait()
	if got := ts.accept.Load(); got != 1 {
		t.Errorf("50 concurrent dials made %d connections, want 1", got)
	}
}

func TestIdentityChecks(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ts := startServer(t, p, srvID, echoHandler)

	t.Run("unexpected server identity", func(t *testing.T) {
		d := newDialer(t, p)
		tgt := ts.target(cliID, "127.0.0.1:80")
		tgt.Peers = []spiffeid.ID{p.identity("a", "someone-else").ID()}
		_, err := d.Dial(context.Background(), tgt)
		if err == nil || !strings.Contains(err.Error(), "spiffe://cluster.local/ns/a/sa/server") {
			t.Errorf("dial to an unexpected identity: err = %v, want it refused naming the identity", err)
		}
	})
	t.Run("client from another trust domain", func(t *testing.T) {
		other := newPKI(t, "other.example")
		d := newDialer(t, other, func(c *DialerConfig) {
			inner := c.TLS
			c.TLS = func(src spiffeid.ID, peers []spiffeid.ID) (*tls.Config, error) {
				cfg, err := inner(src, peers)
				if err == nil {
					cfg.RootCAs = p.ca.Roots() // trusts the server, but is not trusted by it
					cfg.VerifyConnection = nil
					cfg.VerifyPeerCertificate = nil
				}
				return cfg, err
			}
		})
		tgt := ts.target(other.identity("b", "client"), "127.0.0.1:80")
		st, err := d.Dial(context.Background(), tgt)
		if err == nil {
			st.Close()
			t.Fatal("a client of a foreign trust domain got a tunnel")
		}
	})
	t.Run("client without certificate", func(t *testing.T) {
		raw, err := tls.Dial("tcp", ts.addr.String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
		if err == nil {
			// TLS 1.3 reports the client certificate refusal on the first read.
			_, err = raw.Read(make([]byte, 1))
			raw.Close()
		}
		if err == nil {
			t.Fatal("a client without a certificate was served")
		}
	})
}

func TestHandlerStatus(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		switch r.Authority.Port {
		case 401:
			r.Reject(http.StatusUnauthorized)
		case 503:
			r.Reject(http.StatusServiceUnavailable)
		case 1:
			// no answer: the server answers 503
		default:
			st, _ := r.Accept(nil)
			st.Close()
		}
	}))
	d := newDialer(t, p)
	for _, tt := range []struct {
		port int
		want int
	}{{401, 401}, {503, 503}, {1, 503}} {
		_, err := d.Dial(context.Background(), ts.target(cliID, fmt.Sprintf("10.0.0.1:%d", tt.port)))
		var se *StatusError
		if !errors.As(err, &se) || se.Code != tt.want {
			t.Errorf("port %d: err = %v, want status %d", tt.port, err, tt.want)
		}
	}
	st, err := d.Dial(context.Background(), ts.target(cliID, "10.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(st); err != nil {
		t.Errorf("a stream the server closed cleanly reads EOF, got %v", err)
	}
	st.Close()
	// The connection is still good for more streams after refusals.
	if got := ts.accept.Load(); got != 1 {
		t.Errorf("refusals cost connections: %d", got)
	}
}

func TestNetConn(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ts, streams := streamServer(t, p, srvID)
	d := newDialer(t, p)
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		cs, err := d.Dial(context.Background(), ts.target(cliID, "127.0.0.1:80"))
		if err != nil {
			return nil, nil, nil, err
		}
		ss := <-streams
		return cs, ss, func() { cs.Close(); ss.Close() }, nil
	})
}

func waitFor(t *testing.T, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", limit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
