package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"golang.org/x/net/http2"
)

// BenchmarkHTTP1 is test/bench's waypoint_rps_vs_nginx load in one
// process: 16 HTTP/1.1 keep-alive connections, each a CONNECT stream on one
// HBONE connection, sending GETs back to back to a plain HTTP/1.1 upstream
// answering 1 KiB. cpu-us/op is the whole process's CPU (client, waypoint
// and upstream) per request; compare runs of it, and profile with
// -cpuprofile for the waypoint's share.
func BenchmarkHTTP1(b *testing.B) {
	const conns = 16
	m := newMesh(b)
	up := kibBackend(b)
	m.apply([]*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("up")}}, map[string][]netip.AddrPort{"up": {up}})
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := m.dial(vip)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	req := []byte("GET / HTTP/1.1\r\nHost: " + svcHost + "\r\n\r\n")
	exchange := func(c net.Conn, br *bufio.Reader) error {
		if _, err := c.Write(req); err != nil {
			return err
		}
		return readKiB(http.ReadResponse(br, nil))
	}
	brs := make([]*bufio.Reader, conns)
	for i, c := range cs { // warm up every connection
		brs[i] = bufio.NewReader(c)
		if err := exchange(c, brs[i]); err != nil {
			b.Fatal(err)
		}
	}
	benchParallel(b, conns, func(i int) error { return exchange(cs[i], brs[i]) })
}

// BenchmarkHTTP2 is BenchmarkHTTP1's load over HTTP/2: h2c prior knowledge
// downstream, each connection a CONNECT stream on one HBONE connection, to
// an h2c upstream cluster answering 1 KiB. streams: 4 connections carrying
// 4 concurrent streams each, back to back. conns: a new connection for
// each request, so that the cost of serving a connection shows.
func BenchmarkHTTP2(b *testing.B) {
	m := newMesh(b)
	up := kibBackend(b)
	m.applyClusters([]*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("up")}},
		map[string]clusterSpec{"up": {eps: []endpointSpec{{addr: up}}, http2: true}})
	exchange := func(rt http.RoundTripper) error { return readKiB(rt.RoundTrip(get("/"))) }
	b.Run("streams", func(b *testing.B) {
		const conns, streams = 4, 4
		ccs := make([]http.RoundTripper, conns)
		for i := range ccs {
			ccs[i] = m.h2client(vip)
			if err := exchange(ccs[i]); err != nil { // warm up
				b.Fatal(err)
			}
		}
		benchParallel(b, conns*streams, func(i int) error { return exchange(ccs[i%conns]) })
	})
	b.Run("conns", func(b *testing.B) {
		const conns = 4
		benchParallel(b, conns, func(int) error {
			c, err := m.dial(vip)
			if err != nil {
				return err
			}
			defer c.Close()
			//lint:ignore SA1019 x/net's client, independent of the waypoint's (net/http's)
			cc, err := (&http2.Transport{AllowHTTP: true}).NewClientConn(c)
			if err != nil {
				return err
			}
			defer cc.Close()
			return exchange(cc)
		})
	})
}

// kibBackend is an upstream answering every request with 1 KiB.
func kibBackend(b *testing.B) netip.AddrPort {
	payload := bytes.Repeat([]byte("w"), 1024)
	return backend(b, "up", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write(payload)
	})
}

// readKiB reads to its end a response that should be kibBackend's.
func readKiB(resp *http.Response, err error) error {
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && (resp.StatusCode != 200 || n != 1024) {
		err = fmt.Errorf("response %d with %d bytes", resp.StatusCode, n)
	}
	return err
}

// benchParallel runs b.N calls of op spread over n goroutines (op's
// argument says which) and reports the process's CPU and write calls per
// call.
func benchParallel(b *testing.B, n int, op func(int) error) {
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, w0 := cpuTime(), writeCalls()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		k := b.N / n
		if i < b.N%n {
			k++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range k {
				if err := op(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/op")
	b.ReportMetric(float64(writeCalls()-w0)/float64(b.N), "writes/op")
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// writeCalls is how many write(2)-like calls the process made so far
// (syscw in /proc/self/io), 0 where that is not available.
func writeCalls() int64 {
	raw, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(raw)) {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGatewayHTTPS is test/bench's gateway_rps_vs_nginx load in one
// process: 16 TLS 1.3 connections to a gateway HTTPS listener, each sending
// HTTP/1.1 GETs back to back, to a plain HTTP/1.1 upstream answering
// 1 KiB. cpu-us/op is the whole process's CPU per request, as in
// BenchmarkHTTP1.
func BenchmarkGatewayHTTPS(b *testing.B) {
	const conns = 16
	g := newGatewayFixture(b)
	g.backend = kibBackend(b)
	port := freePort(b)
	g.apply([]*listenerv3.Listener{tlsListener(b, port, g.tlsChain("https/bench", []string{"bench.example.com"}, []string{"bench.example.com"}, "https.bench"))},
		map[string][]*routev3.VirtualHost{"https.bench": {toBackend("*")}})
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{ServerName: "bench.example.com", RootCAs: g.roots,
			NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS13})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	req := []byte("GET / HTTP/1.1\r\nHost: bench.example.com\r\n\r\n")
	exchange := func(c net.Conn, br *bufio.Reader) error {
		if _, err := c.Write(req); err != nil {
			return err
		}
		return readKiB(http.ReadResponse(br, nil))
	}
	brs := make([]*bufio.Reader, conns)
	for i, c := range cs {
		brs[i] = bufio.NewReader(c)
		if err := exchange(c, brs[i]); err != nil {
			b.Fatal(err)
		}
	}
	benchParallel(b, conns, func(i int) error { return exchange(cs[i], brs[i]) })
}
