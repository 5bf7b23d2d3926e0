package hbone

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/weftmesh/weft/internal/relay"
	"github.com/weftmesh/weft/internal/spiffe"
)

// BenchmarkHBONE measures the HBONE figures against baselines taken in the
// same run on loopback and prints them as `bench: <name> <value>` lines:
//
//   - hbone_throughput_vs_tcp: TCP client -> Dialer -> Server -> TCP sink, one
//     stream, divided by direct TCP;
//   - hbone_throughput_vs_mtls: the same divided by a plain mTLS tunnel pair
//     (two relays, TLS between them, no HTTP/2);
//   - hbone_rtt_added_p50_us, hbone_rtt_added_p99_us: 1 KiB ping-pong through
//     a warm tunnel minus direct TCP;
//   - hbone_idle_stream_kib: heap + stack per idle open tunnel, both ends, each
//     end with one goroutine blocked reading it;
//   - hbone_new_stream_added_p50_us: opening a stream on a warm pooled
//     connection minus a direct TCP connect.
//
// Run it with `make bench` (one iteration; it runs its own rounds).
func BenchmarkHBONE(b *testing.B) {
	env := newBenchEnv(b)
	for _, part := range []struct {
		name string
		run  func(*testing.B)
	}{{"throughput", env.throughput}, {"rtt", env.rtt}, {"new_stream", env.newStream}, {"idle_memory", env.idleMemory}} {
		b.Run(part.name, func(b *testing.B) {
			for range b.N {
				part.run(b)
			}
		})
	}
}

type benchEnv struct {
	p          *pki
	sink, echo net.Listener // TCP servers: discard and echo
	ts         *testServer  // HBONE server relaying to its :authority
	d          *Dialer
	client     spiffe.Identity
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	p := newPKI(b, "cluster.local")
	e := &benchEnv{p: p, client: p.identity("bench", "client")}
	e.sink = listenTCP(b, func(c net.Conn) { io.Copy(io.Discard, c); c.Close() })
	e.echo = listenTCP(b, func(c net.Conn) { io.Copy(c, c); c.Close() })

	// HBONE server: connect to the authority, answer 200, relay.
	e.ts = startServer(b, p, p.identity("bench", "server"), relayToAuthority(nil), func(c *ServerConfig) { c.KeepAlive = -1 })
	e.d = newDialer(b, p, func(c *DialerConfig) { c.KeepAlive = -1 })
	return e
}

// listenTCP serves each accepted connection with h on loopback.
func listenTCP(b *testing.B, h func(net.Conn)) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go h(c)
		}
	}()
	return ln
}

// hboneRelay is a client-side node proxy: each TCP connection accepted is
// carried to target through an HBONE tunnel.
func (e *benchEnv) hboneRelay(b *testing.B, target net.Addr) net.Listener {
	tgt := e.ts.target(e.client, target.String())
	return listenTCP(b, func(c net.Conn) {
		st, err := e.d.Dial(context.Background(), tgt)
		if err != nil {
			b.Error(err)
			c.Close()
			return
		}
		relay.Join(c, st, 0)
	})
}

// mtlsPair is the baseline: relay A -> mutual TLS -> relay B -> target.
func (e *benchEnv) mtlsPair(b *testing.B, target net.Addr) net.Listener {
	srvID := e.p.identity("bench", "server")
	serverCfg := spiffe.ServerConfig(e.p.cert(srvID), e.p.ca.Roots(), e.p.ca.TrustDomain())
	back, err := tls.Listen("tcp", "127.0.0.1:0", serverCfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { back.Close() })
	go func() {
		for {
			c, err := back.Accept()
			if err != nil {
				return
			}
			go func() {
				up, err := net.Dial("tcp", target.String())
				if err != nil {
					c.Close()
					return
				}
				relay.Join(c, up, 0)
			}()
		}
	}()
	clientCfg := spiffe.ClientConfig(e.p.cert(e.client), e.p.ca.Roots(), []spiffeid.ID{srvID.ID()})
	return listenTCP(b, func(c net.Conn) {
		raw, err := net.Dial("tcp", back.Addr().String())
		if err != nil {
			c.Close()
			return
		}
		tc := tls.Client(raw, clientCfg)
		relay.Join(c, tc, 0)
	})
}

// measureThroughput sends bytes to addr for about d and returns bytes/s.
func measureThroughput(b *testing.B, addr net.Addr, d time.Duration) float64 {
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 128<<10)
	// Warm up windows and buffers.
	for range 64 {
		c.Write(buf)
	}
	var sent int64
	start := time.Now()
	for time.Since(start) < d {
		n, err := c.Write(buf)
		if err != nil {
			b.Fatal(err)
		}
		sent += int64(n)
	}
	// Wait for the sink to have it all: half-close and wait for its close.
	c.(*net.TCPConn).CloseWrite()
	io.Copy(io.Discard, c)
	return float64(sent) / time.Since(start).Seconds()
}

func (e *benchEnv) throughput(b *testing.B) {
	hb := e.hboneRelay(b, e.sink.Addr())
	mt := e.mtlsPair(b, e.sink.Addr())
	const rounds = 5
	var direct, hbone, mtls []float64
	for range rounds {
		direct = append(direct, measureThroughput(b, e.sink.Addr(), 500*time.Millisecond))
		hbone = append(hbone, measureThroughput(b, hb.Addr(), time.Second))
		mtls = append(mtls, measureThroughput(b, mt.Addr(), time.Second))
	}
	d, h, m := median(direct), median(hbone), median(mtls)
	gbps := func(v float64) float64 { return v * 8 / 1e9 }
	fmt.Printf("bench: hbone_throughput_gbps %.2f\n", gbps(h))
	fmt.Printf("bench: direct_tcp_throughput_gbps %.2f\n", gbps(d))
	fmt.Printf("bench: mtls_pair_throughput_gbps %.2f\n", gbps(m))
	fmt.Printf("bench: hbone_throughput_vs_tcp %.3f\n", h/d)
	fmt.Printf("bench: hbone_throughput_vs_mtls %.3f\n", h/m)
}

// pingPong returns the round-trip times of n 1 KiB exchanges through addr.
func pingPong(b *testing.B, addr net.Addr, n int) []time.Duration {
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	msg, reply := make([]byte, 1024), make([]byte, 1024)
	rtts := make([]time.Duration, 0, n)
	for i := range n + 500 {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, reply); err != nil {
			b.Fatal(err)
		}
		if i >= 500 { // warm-up excluded
			rtts = append(rtts, time.Since(start))
		}
	}
	return rtts
}

func (e *benchEnv) rtt(b *testing.B) {
	hb := e.hboneRelay(b, e.echo.Addr())
	mt := e.mtlsPair(b, e.echo.Addr())
	const n = 20000
	var direct, hbone, mtls []time.Duration
	for range 2 { // alternate to share any drift
		direct = append(direct, pingPong(b, e.echo.Addr(), n/2)...)
		hbone = append(hbone, pingPong(b, hb.Addr(), n/2)...)
		mtls = append(mtls, pingPong(b, mt.Addr(), n/2)...)
	}
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	dp50, dp99 := percentile(direct, 0.50), percentile(direct, 0.99)
	hp50, hp99 := percentile(hbone, 0.50), percentile(hbone, 0.99)
	fmt.Printf("bench: direct_rtt_p50_us %.1f\n", us(dp50))
	fmt.Printf("bench: hbone_rtt_p50_us %.1f\n", us(hp50))
	fmt.Printf("bench: mtls_pair_rtt_added_p50_us %.1f\n", us(percentile(mtls, 0.5)-dp50))
	fmt.Printf("bench: mtls_pair_rtt_added_p99_us %.1f\n", us(percentile(mtls, 0.99)-dp99))
	fmt.Printf("bench: hbone_rtt_added_p50_us %.1f\n", us(hp50-dp50))
	fmt.Printf("bench: hbone_rtt_added_p99_us %.1f\n", us(hp99-dp99))
}

func (e *benchEnv) newStream(b *testing.B) {
	// A server whose handler answers at once, so only the stream open is timed.
	ts := startServer(b, e.p, e.p.identity("bench", "opener"), HandlerFunc(func(r *Request) {
		st, err := r.Accept(nil)
		if err == nil {
			io.Copy(io.Discard, st)
		}
	}), func(c *ServerConfig) { c.KeepAlive = -1 })
	tgt := ts.target(e.client, "127.0.0.1:80")
	warm, err := e.d.Dial(context.Background(), tgt) // keeps the connection pooled
	if err != nil {
		b.Fatal(err)
	}
	defer warm.Close()
	const n = 3000
	var hb, tcp []time.Duration
	for i := range 2 * n {
		start := time.Now()
		st, err := e.d.Dial(context.Background(), tgt)
		if err != nil {
			b.Fatal(err)
		}
		el := time.Since(start)
		st.Close()
		if i >= n/2 {
			hb = append(hb, el)
		}
		start = time.Now()
		c, err := net.Dial("tcp", e.sink.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		el = time.Since(start)
		c.Close()
		if i >= n/2 {
			tcp = append(tcp, el)
		}
	}
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	fmt.Printf("bench: hbone_new_stream_p50_us %.1f\n", us(percentile(hb, 0.5)))
	fmt.Printf("bench: tcp_connect_p50_us %.1f\n", us(percentile(tcp, 0.5)))
	fmt.Printf("bench: hbone_new_stream_added_p50_us %.1f\n", us(percentile(hb, 0.5)-percentile(tcp, 0.5)))
}

func (e *benchEnv) idleMemory(b *testing.B) {
	const n = 2000
	served := make(chan struct{}, n)
	release := make(chan struct{})
	ts := startServer(b, e.p, e.p.identity("bench", "idle"), HandlerFunc(func(r *Request) {
		st, err := r.Accept(nil)
		if err != nil {
			return
		}
		served <- struct{}{}
		go func() { <-release; st.Close() }()
		st.Read(make([]byte, 1)) // the server end's reader, blocked until the tunnel closes
	}), func(c *ServerConfig) { c.KeepAlive = -1; c.MaxConcurrentStreams = 1000 })
	tgt := ts.target(e.client, "127.0.0.1:80")
	d := newDialer(b, e.p, func(c *DialerConfig) { c.KeepAlive = -1 })
	// Warm the pool so connection setup is not counted.
	st, err := d.Dial(context.Background(), tgt)
	if err != nil {
		b.Fatal(err)
	}
	<-served
	st.Close()

	before := memInUse()
	streams := make([]*Stream, n)
	var readers sync.WaitGroup
	for i := range streams {
		st, err := d.Dial(context.Background(), tgt)
		if err != nil {
			b.Fatal(err)
		}
		<-served
		streams[i] = st
		readers.Add(1)
		go func() { // the client end's reader
			defer readers.Done()
			st.Read(make([]byte, 1))
		}()
	}
	after := memInUse()
	fmt.Printf("bench: hbone_idle_stream_kib %.1f\n", float64(after-before)/n/1024)
	close(release)
	for _, st := range streams {
		st.Close()
	}
	readers.Wait()
}

// memInUse returns heap and stack in use after a full collection.
func memInUse() uint64 {
	var ms runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func percentile(v []time.Duration, q float64) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}
