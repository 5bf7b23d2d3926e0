package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// readAheadFixture is a gateway with a plain HTTP listener and a TLS one
// (server name slow.example.com), both routed to a backend that answers
// "<path> <body length> <body crc32>", sleeping first on /slow, and
// before it reads the body on /late. Requests to /hang wait for their
// cancel, which canceled receives.
type readAheadFixture struct {
	*gatewayFixture
	plain, secure uint16
	canceled      chan string
}

func newReadAheadFixture(t *testing.T, streamIdle time.Duration) *readAheadFixture {
	f := &readAheadFixture{gatewayFixture: newGatewayFixture(t), canceled: make(chan string, 16)}
	f.backend = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow", "/late":
			time.Sleep(3 * watchAfter)
		case "/hang":
			io.Copy(io.Discard, r.Body) // net/http notices a client gone once the body is read
			select {
			case <-r.Context().Done():
				f.canceled <- r.Host
			case <-time.After(10 * time.Second):
			}
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %d %08x", r.URL.Path, len(b), crc32.ChecksumIEEE(b))
	}), nil)
	f.plain, f.secure = freePort(t), freePort(t)
	idle := func(l *listenerv3.Listener) *listenerv3.Listener {
		if streamIdle == 0 {
			return l
		}
		for _, fc := range l.FilterChains {
			var h hcmv3.HttpConnectionManager
			if err := fc.Filters[0].GetTypedConfig().UnmarshalTo(&h); err != nil {
				t.Fatal(err)
			}
			h.StreamIdleTimeout = durationpb.New(streamIdle)
			fc.Filters[0].ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, &h)}
		}
		return l
	}
	f.apply([]*listenerv3.Listener{idle(httpListener(t, f.plain)),
		idle(tlsListener(t, f.secure, f.tlsChain("https/slow", []string{"slow.example.com"}, []string{"slow.example.com"}, "https.slow")))},
		map[string][]*routev3.VirtualHost{"http." + strconv.Itoa(int(f.plain)): {toBackend("*")}, "https.slow": {toBackend("*")}})
	return f
}

// dialers are the fixture's two ways in: plain TCP, and TLS whose bytes
// under goes through (nil: as they are).
func (f *readAheadFixture) dialers(under func(net.Conn) net.Conn) map[string]func(t *testing.T) (net.Conn, *net.TCPConn) {
	return map[string]func(t *testing.T) (net.Conn, *net.TCPConn){
		"TCP": func(t *testing.T) (net.Conn, *net.TCPConn) {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", f.plain))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c, c.(*net.TCPConn)
		},
		"TLS": func(t *testing.T) (net.Conn, *net.TCPConn) {
			raw, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", f.secure))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { raw.Close() })
			nc := raw
			if under != nil {
				nc = under(raw)
			}
			c := tls.Client(nc, &tls.Config{ServerName: "slow.example.com", RootCAs: f.roots, NextProtos: []string{"http/1.1"}})
			if err := c.Handshake(); err != nil {
				t.Fatal(err)
			}
			return c, raw.(*net.TCPConn)
		},
	}
}

// wantResponse reads one response from br and checks its body.
func wantResponse(t *testing.T, br *bufio.Reader, want string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: %v", want, err)
	}
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(got) != want {
		t.Fatalf("%d %q, want %q", resp.StatusCode, got, want)
	}
}

// sum is what the fixture's backend answers for path and body.
func sum(path string, body []byte) string {
	return fmt.Sprintf("%s %d %08x", path, len(body), crc32.ChecksumIEEE(body))
}

// A client that ends its sending side (a TCP FIN, a TLS close_notify)
// while its request runs upstream has left: the request is canceled, as
// one over HBONE whose stream's END_STREAM arrives is, and as Envoy resets
// a stream whose HTTP/1 client half-closes (downstream_remote_disconnect).
func TestGatewayClientHalfCloses(t *testing.T) {
	f := newReadAheadFixture(t, 0)
	for name, dial := range f.dialers(nil) {
		t.Run(name, func(t *testing.T) {
			c, _ := dial(t)
			io.WriteString(c, "POST /hang HTTP/1.1\r\nHost: "+name+"\r\nContent-Length: 2\r\n\r\nhi")
			c.(interface{ CloseWrite() error }).CloseWrite()
			select {
			case host := <-f.canceled:
				if host != name {
					t.Errorf("canceled the request of %s", host)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream request ran on after its client ended its side")
			}
			// The connection ends: nothing more can come from the client.
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil {
				t.Errorf("the connection did not end: %v", err)
			}
		})
	}
}

// A client whose connection resets while its request runs has left too.
func TestGatewayClientResets(t *testing.T) {
	f := newReadAheadFixture(t, 0)
	for name, dial := range f.dialers(nil) {
		t.Run(name, func(t *testing.T) {
			c, raw := dial(t)
			io.WriteString(c, "POST /hang HTTP/1.1\r\nHost: "+name+"\r\nContent-Length: 2\r\n\r\nhi")
			time.Sleep(3 * watchAfter) // the reader runs
			raw.SetLinger(0)
			raw.Close()
			select {
			case <-f.canceled:
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream request ran on after its client's connection reset")
			}
		})
	}
}

// A client that pipelines its next request while a slow one runs, then
// leaves, has left: the reader that read the next request on (which the
// server has not taken) still sees the end.
func TestGatewayClientLeavesAfterPipelining(t *testing.T) {
	f := newReadAheadFixture(t, 0)
	for name, dial := range f.dialers(nil) {
		for _, reset := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/reset=%v", name, reset), func(t *testing.T) {
				c, raw := dial(t)
				io.WriteString(c, "POST /hang HTTP/1.1\r\nHost: "+name+"\r\nContent-Length: 2\r\n\r\nhi")
				time.Sleep(3 * watchAfter) // the request is upstream, the reader runs
				io.WriteString(c, "GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
				time.Sleep(watchAfter)
				if reset {
					raw.SetLinger(0)
					raw.Close()
				} else {
					c.(interface{ CloseWrite() error }).CloseWrite()
				}
				select {
				case <-f.canceled:
				case <-time.After(5 * time.Second):
					t.Fatal("the upstream request ran on after its client left")
				}
			})
		}
	}
}

// splitConn writes what it is given in small pieces, apart in time, so
// that TLS records arrive split across the server's reads and the
// reader's.
type splitConn struct {
	net.Conn
	piece int
}

func (c splitConn) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(c.piece, len(p))
		m, err := c.Conn.Write(p[:k])
		n += m
		if err != nil {
			return n, err
		}
		p = p[k:]
		time.Sleep(time.Millisecond)
	}
	return n, nil
}

// Requests pipelined behind slow ones, with bodies larger than the
// reader's chunk, sized and chunked, arrive whole and in order, over TCP
// and over TLS whose records are split across reads, while the reader
// starts and stops.
func TestGatewayReadAheadBodies(t *testing.T) {
	f := newReadAheadFixture(t, 0)
	big := make([]byte, 3*readAheadChunk+123)
	for i := range big {
		big[i] = byte(i*31 + i>>8)
	}
	var chunked strings.Builder
	for rest := big; len(rest) > 0; {
		k := min(5000, len(rest))
		fmt.Fprintf(&chunked, "%x\r\n%s\r\n", k, rest[:k])
		rest = rest[k:]
	}
	chunked.WriteString("0\r\n\r\n")
	for name, dial := range f.dialers(func(c net.Conn) net.Conn { return splitConn{c, 1000} }) {
		t.Run(name, func(t *testing.T) {
			c, _ := dial(t)
			br := bufio.NewReader(c)
			for round := range 2 {
				go io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n"+
					"POST /sized HTTP/1.1\r\nHost: a\r\nContent-Length: "+strconv.Itoa(len(big))+"\r\n\r\n"+string(big)+
					"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n"+
					"POST /chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked.String()+
					"GET /fast HTTP/1.1\r\nHost: a\r\n\r\n")
				for _, want := range []string{sum("/slow", nil), sum("/sized", big), sum("/slow", nil), sum("/chunked", big), sum("/fast", nil)} {
					wantResponse(t, br, want)
				}
				if t.Failed() {
					t.Fatalf("round %d", round)
				}
			}
		})
	}
}

// A body that waits for 100 Continue, to an upstream slow to read it,
// comes through whole: the reader that started while nothing came stops
// when the body is read.
func TestGatewayReadAheadExpectContinue(t *testing.T) {
	f := newReadAheadFixture(t, 0)
	body := []byte(strings.Repeat("e", 2*readAheadChunk+7))
	for name, dial := range f.dialers(nil) {
		t.Run(name, func(t *testing.T) {
			c, _ := dial(t)
			br := bufio.NewReader(c)
			for range 2 {
				io.WriteString(c, "POST /late HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n")
				line, err := br.ReadString('\n')
				if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
					t.Fatalf("before the body: %q %v, want 100 Continue", line, err)
				}
				if rest, _ := br.ReadString('\n'); rest != "\r\n" {
					t.Fatalf("100 Continue followed by %q", rest)
				}
				c.Write(body)
				wantResponse(t, br, sum("/late", body))
			}
		})
	}
}

// A client trickling its next request a byte at a time while a slow one
// runs (slowloris) gets both answered in order; the trickle is neither
// lost nor duplicated across the reader's starts and stops.
func TestGatewayReadAheadTrickle(t *testing.T) {
	f := newReadAheadFixture(t, 0)
	for name, dial := range f.dialers(nil) {
		t.Run(name, func(t *testing.T) {
			c, _ := dial(t)
			br := bufio.NewReader(c)
			io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
			next := "POST /trickled HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
			go func() {
				for i := range len(next) {
					c.Write([]byte{next[i]})
					time.Sleep(watchAfter / 8)
				}
			}()
			wantResponse(t, br, sum("/slow", nil))
			wantResponse(t, br, sum("/trickled", []byte("hello")))
		})
	}
}

// The stream idle timeout still ends a connection left idle after a
// request during which the reader started and stopped.
func TestGatewayReadAheadIdleTimeout(t *testing.T) {
	f := newReadAheadFixture(t, 150*time.Millisecond)
	for name, dial := range f.dialers(nil) {
		t.Run(name, func(t *testing.T) {
			c, _ := dial(t)
			br := bufio.NewReader(c)
			for range 2 {
				io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
				wantResponse(t, br, sum("/slow", nil))
			}
			start := time.Now()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.Copy(io.Discard, br); err != nil {
				t.Fatalf("an idle connection was not ended: %v", err)
			}
			if d := time.Since(start); d < 100*time.Millisecond {
				t.Errorf("ended after %v, before the idle timeout", d)
			}
		})
	}
}

// Many connections whose reader runs, ended every way while it runs or
// as it starts, leave no goroutine behind.
func TestGatewayReadAheadNoLeak(t *testing.T) {
	f := newReadAheadFixture(t, 0)
	dials := f.dialers(nil)
	run := func() {
		for i := range 20 {
			for name, dial := range dials {
				t.Run(name, func(t *testing.T) {
					c, raw := dial(t)
					br := bufio.NewReader(c)
					io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
					switch i % 4 {
					case 0: // answered, then closed
						wantResponse(t, br, sum("/slow", nil))
						c.Close()
					case 1: // reset as the reader starts
						time.Sleep(watchAfter)
						raw.SetLinger(0)
						raw.Close()
					case 2: // half-closed while the request runs
						time.Sleep(2 * watchAfter)
						c.(interface{ CloseWrite() error }).CloseWrite()
						io.Copy(io.Discard, br)
					case 3: // closed right away
						c.Close()
					}
				})
			}
		}
	}
	run() // the backend's and the gateway's pools warm up
	time.Sleep(200 * time.Millisecond)
	before := runtime.NumGoroutine()
	run()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close racing the reader's start, and a Read racing Close, leave no
// reader behind.
func TestReadAheadConnCloseRace(t *testing.T) {
	before := runtime.NumGoroutine()
	for i := range 200 {
		a, b := net.Pipe()
		rc := newReadAheadConn(a)
		stop := rc.AfterPeerEnd(func() {})
		go func() { b.Write([]byte("x")); io.Copy(io.Discard, b) }()
		rc.Read(make([]byte, 1))
		time.Sleep(watchAfter - 2*time.Millisecond + time.Duration(i%5)*time.Millisecond)
		done := make(chan struct{})
		go func() { rc.Read(make([]byte, 1)); close(done) }()
		rc.Close()
		<-done
		stop()
		b.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A gateway's tcp_proxy chains pass resets both ways and keep clean ends
// clean, on a plain TCP listener, a TLS chain that ends TLS and relays
// what it carried, and a passthrough chain: a backend's reset reaches the
// client as a reset (in its handshake, through passthrough), a client's
// reaches the backend, and a backend that closes after its answer gives
// the client that answer and an end.
func TestGatewayTCPChainsPassResets(t *testing.T) {
	g := newGatewayFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mode atomic.Value // of the next connection: "reset", "client", "clean"
	got := make(chan struct{}, 1)
	backendRead := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			c := nc.(*net.TCPConn)
			if _, err := c.Read(make([]byte, 1)); err != nil {
				c.Close()
				continue
			}
			switch mode.Load() {
			case "reset":
				c.SetLinger(0)
			case "client":
				got <- struct{}{}
				_, err := io.Copy(io.Discard, c)
				backendRead <- err
			case "clean":
				io.Copy(io.Discard, c)
				c.Write([]byte("bye"))
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	g.backend = ln.Addr().(*net.TCPAddr).AddrPort()
	tlsPort, tcpPort := freePort(t), freePort(t)
	tcpProxy := &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, &tcpv3.TcpProxy{
		StatPrefix: "tcp", ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: backendCluster}})}}
	term := g.tlsChain("tls/term", []string{"term.example.com"}, []string{"term.example.com"}, "unused")
	term.Filters = []*listenerv3.Filter{tcpProxy}
	g.apply([]*listenerv3.Listener{
		tlsListener(t, tlsPort, term, passChain(t, "tls/pass", backendCluster, "pass.example.com")),
		{Name: "0.0.0.0_tcp", Address: gatewayAddr(tcpPort), FilterChains: []*listenerv3.FilterChain{{Name: "tcp", Filters: []*listenerv3.Filter{tcpProxy}}}},
	}, nil)

	// dial connects through a chain; its first bytes (a request, or the
	// ClientHello through passthrough) are on their way when it returns.
	type conn struct {
		c   net.Conn // what the client reads and writes
		raw *net.TCPConn
		hs  chan error // passthrough: the handshake's end
	}
	dials := map[string]func(t *testing.T) conn{
		"TCP": func(t *testing.T) conn {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", tcpPort))
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte("hi"))
			return conn{c, c.(*net.TCPConn), nil}
		},
		"TLS terminated": func(t *testing.T) conn {
			raw, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", tlsPort))
			if err != nil {
				t.Fatal(err)
			}
			c := tls.Client(raw, &tls.Config{ServerName: "term.example.com", RootCAs: g.roots})
			if err := c.Handshake(); err != nil {
				t.Fatal(err)
			}
			c.Write([]byte("hi"))
			return conn{c, raw.(*net.TCPConn), nil}
		},
		"passthrough": func(t *testing.T) conn {
			raw, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", tlsPort))
			if err != nil {
				t.Fatal(err)
			}
			c := tls.Client(raw, &tls.Config{ServerName: "pass.example.com", RootCAs: g.roots})
			hs := make(chan error, 1)
			go func() { hs <- c.Handshake() }()
			return conn{c, raw.(*net.TCPConn), hs}
		},
	}
	for name, dial := range dials {
		t.Run(name, func(t *testing.T) {
			mode.Store("reset")
			c := dial(t)
			defer c.c.Close()
			c.raw.SetDeadline(time.Now().Add(10 * time.Second))
			var err error
			if c.hs != nil {
				err = <-c.hs
			} else {
				_, err = io.ReadAll(c.c)
			}
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("after the backend's reset the client saw %v, want a reset", err)
			}

			mode.Store("client")
			c = dial(t)
			<-got
			c.raw.SetLinger(0)
			c.raw.Close()
			select {
			case err := <-backendRead:
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("after the client's reset the backend read %v, want a reset", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the backend's read did not end after the client's reset")
			}

			if c.hs != nil {
				return // a clean end needs TLS with the backend
			}
			mode.Store("clean")
			c = dial(t)
			defer c.c.Close()
			c.raw.SetDeadline(time.Now().Add(10 * time.Second))
			c.c.(interface{ CloseWrite() error }).CloseWrite()
			if b, err := io.ReadAll(c.c); err != nil || string(b) != "bye" {
				t.Errorf("after the backend's close the client read %q and %v, want bye and an end", b, err)
			}
		})
	}
}

// TestGatewayUpgradeResetPassedOn: an upstream that resets a switched
// session resets the gateway client's connection, over TCP and over TLS,
// where no close_notify may come first: the client reads a failure, not
// an end.
func TestGatewayUpgradeResetPassedOn(t *testing.T) {
	g := newGatewayFixture(t)
	g.backend = resettingSwitch(t)
	plain, secure := freePort(t), freePort(t)
	g.apply([]*listenerv3.Listener{httpListener(t, plain),
		tlsListener(t, secure, g.tlsChain("https/ws", []string{"ws.example.com"}, []string{"ws.example.com"}, "https.ws"))},
		map[string][]*routev3.VirtualHost{"http." + strconv.Itoa(int(plain)): {toBackend("*")}, "https.ws": {toBackend("*")}})
	for name, dial := range map[string]func() (net.Conn, error){
		"TCP": func() (net.Conn, error) { return net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", plain)) },
		"TLS": func() (net.Conn, error) {
			return tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", secure), &tls.Config{ServerName: "ws.example.com", RootCAs: g.roots, NextProtos: []string{"http/1.1"}})
		},
	} {
		c, err := dial()
		if err != nil {
			t.Fatal(err)
		}
		got, err := readSwitched(t, c, "ws.example.com")
		if got != "partial" || !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("%s: the client read %q and %v, want partial and a reset", name, got, err)
		}
		c.Close()
	}
}
