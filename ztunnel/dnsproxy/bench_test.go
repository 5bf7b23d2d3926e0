package dnsproxy

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkDNSProxy measures the proxy's answer for a mesh name against a
// direct query to a nameserver on loopback (a miekg/dns server answering
// the same name), in the same run, and the proxy's throughput.
//
//	bench: dns_proxy_p99_us           p99 of a mesh-name answer (UDP, one at a time)
//	bench: dns_upstream_p99_us        p99 of the same question asked of the nameserver directly
//	bench: dns_proxy_qps_per_core     mesh-name answers per CPU second of the process
//	                                  (clients included: a lower bound)
func BenchmarkDNSProxy(b *testing.B) {
	up := startUpstream(b)
	p := startProxy(b, testStore(b), []netip.AddrPort{up.addr}, time.Second)
	q, err := new(dns.Msg).SetQuestion("echo.demo.svc.cluster.local.", dns.TypeA).Pack()
	if err != nil {
		b.Fatal(err)
	}
	const n = 5000
	for range b.N {
		proxyLat := latencies(b, p.srv.UDPAddr().String(), q, n)
		upLat := latencies(b, up.addr.String(), q, n)
		qps := perCPUSecond(b, p.srv.UDPAddr().String(), q, 2*time.Second)
		fmt.Printf("bench: dns_proxy_p99_us %.0f\n", quantileUS(proxyLat, 0.99))
		fmt.Printf("bench: dns_proxy_p50_us %.0f\n", quantileUS(proxyLat, 0.50))
		fmt.Printf("bench: dns_upstream_p99_us %.0f\n", quantileUS(upLat, 0.99))
		fmt.Printf("bench: dns_upstream_p50_us %.0f\n", quantileUS(upLat, 0.50))
		fmt.Printf("bench: dns_proxy_qps_per_core %.0f\n", qps)
		b.ReportMetric(quantileUS(proxyLat, 0.99), "p99-us")
		b.ReportMetric(qps, "qps/core")
	}
}

// latencies times n queries sent one at a time to addr over UDP.
func latencies(b *testing.B, addr string, q []byte, n int) []time.Duration {
	c, err := net.Dial("udp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1500)
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if _, err := c.Write(q); err != nil {
			b.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(buf); err != nil {
			b.Fatal(err)
		}
		out = append(out, time.Since(start))
	}
	return out
}

// perCPUSecond runs 8 clients for d, each keeping one query in flight, and
// returns the answers per CPU second the process used.
func perCPUSecond(b *testing.B, addr string, q []byte, d time.Duration) float64 {
	var answered atomic.Int64
	cpu0 := cpuTime(b)
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("udp", addr)
			if err != nil {
				b.Error(err)
				return
			}
			defer c.Close()
			buf := make([]byte, 1500)
			for time.Now().Before(deadline) {
				c.Write(q)
				c.SetReadDeadline(time.Now().Add(time.Second))
				if _, err := c.Read(buf); err == nil {
					answered.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(answered.Load()) / (cpuTime(b) - cpu0).Seconds()
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func quantileUS(lat []time.Duration, q float64) float64 {
	s := slices.Clone(lat)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))]) / float64(time.Microsecond)
}
