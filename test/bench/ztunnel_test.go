package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/weftmesh/weft/cni/redirect"
	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/ztunnel/inpod"
	"github.com/weftmesh/weft/ztunnel/proxy"
	"github.com/weftmesh/weft/ztunnel/state"
)

// The ztunnel benchmark: two pods in their own network namespaces joined by
// a veth pair, each with Istio's in-pod redirection rules, and a process
// (this test binary re-executed) running ztunnel's proxy for both pods. The
// client app in pod A talks to the server app in pod B through A's ztunnel,
// HBONE, and B's ztunnel; the baseline is the same pods with the rules
// removed. Every figure is measured in the same run.
const (
	podA = "10.250.0.1"
	podB = "10.250.0.2"
	// childEnv makes the re-executed test binary run the proxies.
	childEnv = "WEFT_BENCH_ZTUNNEL_CHILD"
)

// BenchmarkZtunnel prints:
//
//	ztunnel_throughput_vs_direct  bulk TCP pod A -> pod B through two ztunnels ÷ direct
//	ztunnel_added_p90_ms          1 KiB HTTP request/response at 1000 req/s, p90 minus direct
//	ztunnel_added_p99_ms          the same, p99
//	ztunnel_rss_mb                RSS of the process holding both pods' proxies, under that load
//	ztunnel_cpu_per_1000rps       CPU cores per 1000 req/s, per ztunnel (the process serves both ends)
//	ztunnel_idle_conn_kib         heap + stack per idle proxied connection, per end
func BenchmarkZtunnel(b *testing.B) {
	if why := cluster.SkipReason(); why != "" {
		b.Skip(why)
	}
	env := newPodPair(b)
	for range b.N {
		env.throughput(b)
		env.latency(b)
		env.idle(b)
	}
}

// TestZtunnelChild is the child process of BenchmarkZtunnel, not a test.
func TestZtunnelChild(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		t.Skip("runs only as BenchmarkZtunnel's child process")
	}
	if err := runChild(spec); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

type podPair struct {
	a, b      *netns.NS
	names     []string
	child     *exec.Cmd
	childIn   io.WriteCloser
	childOut  *bufio.Reader
	redirects bool
}

func newPodPair(b *testing.B) *podPair {
	b.Helper()
	p := &podPair{}
	b.Cleanup(p.close)
	for _, side := range []string{"a", "b"} {
		name := fmt.Sprintf("weft-bench-%d-%s", os.Getpid(), side)
		ns, err := netns.Create(name)
		if err != nil {
			b.Fatal(err)
		}
		p.names = append(p.names, name)
		if side == "a" {
			p.a = ns
		} else {
			p.b = ns
		}
	}
	ha, err := p.a.Netlink()
	if err != nil {
		b.Fatal(err)
	}
	defer ha.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(p.b.Fd())}
	if err := ha.LinkAdd(veth); err != nil {
		b.Fatal(err)
	}
	for _, side := range []struct {
		ns   *netns.NS
		addr string
	}{{p.a, podA}, {p.b, podB}} {
		h, err := side.ns.Netlink()
		if err != nil {
			b.Fatal(err)
		}
		for _, ifname := range []string{"lo", "eth0"} {
			l, err := h.LinkByName(ifname)
			if err == nil && ifname == "eth0" {
				err = h.AddrAdd(l, &netlink.Addr{IPNet: ipnet(side.addr + "/24")})
			}
			if err == nil {
				err = h.LinkSetUp(l)
			}
			if err != nil {
				h.Close()
				b.Fatalf("%s in %s: %v", ifname, side.ns.Path(), err)
			}
		}
		h.Close()
	}
	p.serveApps(b)
	p.startChild(b)
	return p
}

func ipnet(s string) *net.IPNet {
	pfx := netip.MustParsePrefix(s)
	return &net.IPNet{IP: pfx.Addr().AsSlice(), Mask: net.CIDRMask(pfx.Bits(), 32)}
}

// serveApps runs the server apps inside pod B: HTTP on 8080 answering 1 KiB,
// a TCP sink on 9000.
func (p *podPair) serveApps(b *testing.B) {
	var httpLn, sinkLn net.Listener
	err := p.b.Do(func() error {
		var err error
		if httpLn, err = net.Listen("tcp", ":8080"); err != nil {
			return err
		}
		sinkLn, err = net.Listen("tcp", ":9000")
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	body := bytes.Repeat([]byte("w"), 1024)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write(body)
	})}
	go srv.Serve(httpLn)
	go func() {
		for {
			c, err := sinkLn.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	b.Cleanup(func() { srv.Close(); sinkLn.Close() })
}

// setRedirect installs or removes the in-pod rules in both pods.
func (p *podPair) setRedirect(b *testing.B, on bool) {
	for _, ns := range []*netns.NS{p.a, p.b} {
		err := ns.Do(func() error {
			if on {
				return redirect.ApplyPod(redirect.Options{})
			}
			return redirect.RemovePod()
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	p.redirects = on
}

func (p *podPair) startChild(b *testing.B) {
	p.child = exec.Command(os.Args[0], "-test.run", "^TestZtunnelChild$", "-test.v")
	p.child.Env = append(os.Environ(), childEnv+"="+p.a.Path()+","+p.b.Path())
	p.child.Stderr = os.Stderr
	in, _ := p.child.StdinPipe()
	out, _ := p.child.StdoutPipe()
	p.childIn, p.childOut = in, bufio.NewReader(out)
	if err := p.child.Start(); err != nil {
		b.Fatal(err)
	}
	if line := p.childLine(b, ""); line != "ready" {
		b.Fatalf("ztunnel child: %s", line)
	}
}

// childLine sends a command (if any) and returns the child's next answer.
func (p *podPair) childLine(b *testing.B, cmd string) string {
	if cmd != "" {
		fmt.Fprintln(p.childIn, cmd)
	}
	for {
		line, err := p.childOut.ReadString('\n')
		if err != nil {
			b.Fatalf("ztunnel child: %v", err)
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "=== RUN") || line == "" {
			continue // go test's own output
		}
		return line
	}
}

func (p *podPair) close() {
	if p.child != nil && p.child.Process != nil {
		p.childIn.Close()
		done := make(chan struct{})
		go func() { p.child.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			p.child.Process.Kill()
			<-done
		}
	}
	for _, ns := range []*netns.NS{p.a, p.b} {
		if ns != nil {
			ns.Close()
		}
	}
	for _, name := range p.names {
		netns.Delete(name)
	}
}

// dialFromA opens a connection from the client app in pod A.
func (p *podPair) dialFromA(addr string) (net.Conn, error) {
	var c net.Conn
	err := p.a.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	return c, err
}

func (p *podPair) bulk(b *testing.B, d time.Duration) float64 {
	c, err := p.dialFromA(podB + ":9000")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 128<<10)
	for range 32 {
		c.Write(buf)
	}
	var n int64
	start := time.Now()
	for time.Since(start) < d {
		m, err := c.Write(buf)
		if err != nil {
			b.Fatal(err)
		}
		n += int64(m)
	}
	c.(*net.TCPConn).CloseWrite()
	io.Copy(io.Discard, c)
	return float64(n) / time.Since(start).Seconds()
}

func (p *podPair) throughput(b *testing.B) {
	var direct, mesh []float64
	for range 3 {
		p.setRedirect(b, false)
		direct = append(direct, p.bulk(b, time.Second))
		p.setRedirect(b, true)
		mesh = append(mesh, p.bulk(b, 2*time.Second))
	}
	d, m := median(direct), median(mesh)
	fmt.Printf("bench: ztunnel_throughput_gbps %.2f\n", m*8/1e9)
	fmt.Printf("bench: direct_pod_throughput_gbps %.2f\n", d*8/1e9)
	fmt.Printf("bench: ztunnel_throughput_vs_direct %.3f\n", m/d)
}

// openLoop sends 1 KiB POSTs at a fixed rate for d over conns keep-alive
// connections (a schedule that does not wait for responses, like fortio's
// uniform mode) and returns each request's latency from when it was sent.
func (p *podPair) openLoop(b *testing.B, rate int, d time.Duration, conns int) []time.Duration {
	tr := &http.Transport{
		MaxConnsPerHost: conns, MaxIdleConnsPerHost: conns,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return p.dialFromA(addr) },
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	body := bytes.Repeat([]byte("q"), 1024)
	n := int(d.Seconds() * float64(rate))
	due := make(chan time.Time, n)
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	var failed int
	var wg sync.WaitGroup
	for range conns * 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range due {
				t0 := time.Now()
				resp, err := client.Post("http://"+podB+":8080/", "application/octet-stream", bytes.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				el := time.Since(t0)
				mu.Lock()
				if err != nil {
					failed++
				} else {
					lat = append(lat, el)
				}
				mu.Unlock()
			}
		}()
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		t0 := start.Add(time.Duration(i) * interval)
		if w := time.Until(t0); w > 0 {
			time.Sleep(w)
		}
		due <- t0
	}
	close(due)
	wg.Wait()
	if failed > 0 {
		b.Fatalf("%d of %d requests failed", failed, n)
	}
	return lat
}

func (p *podPair) latency(b *testing.B) {
	const rate, conns = 1000, 8
	p.setRedirect(b, false)
	p.openLoop(b, rate, time.Second, conns) // warm-up
	direct := p.openLoop(b, rate, 10*time.Second, conns)
	p.setRedirect(b, true)
	p.openLoop(b, rate, time.Second, conns)
	cpu0 := procCPU(b, p.child.Process.Pid)
	t0 := time.Now()
	mesh := p.openLoop(b, rate, 10*time.Second, conns)
	cpu := procCPU(b, p.child.Process.Pid) - cpu0
	el := time.Since(t0)
	rss := procRSS(b, p.child.Process.Pid)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	fmt.Printf("bench: direct_p90_ms %.3f\n", ms(pct(direct, 0.90)))
	fmt.Printf("bench: ztunnel_p90_ms %.3f\n", ms(pct(mesh, 0.90)))
	fmt.Printf("bench: ztunnel_added_p90_ms %.3f\n", ms(pct(mesh, 0.90)-pct(direct, 0.90)))
	fmt.Printf("bench: ztunnel_added_p99_ms %.3f\n", ms(pct(mesh, 0.99)-pct(direct, 0.99)))
	fmt.Printf("bench: ztunnel_rss_mb %.1f\n", float64(rss)/(1<<20))
	// The process serves both ends, so each ztunnel's share is half.
	fmt.Printf("bench: ztunnel_cpu_per_1000rps %.3f\n", cpu.Seconds()/el.Seconds()/(rate/1000.0)/2)
}

func (p *podPair) idle(b *testing.B) {
	const n = 1000
	p.setRedirect(b, true)
	before, _ := strconv.ParseFloat(p.childLine(b, "mem"), 64)
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := p.dialFromA(podB + ":9000")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Write([]byte("x")); err != nil { // make sure the tunnel is up
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	time.Sleep(500 * time.Millisecond) // let every tunnel settle on both ends
	after, _ := strconv.ParseFloat(p.childLine(b, "mem"), 64)
	for _, c := range conns {
		c.Close()
	}
	fmt.Printf("bench: ztunnel_idle_conn_kib %.1f\n", (after-before)/n/2/1024)
}

func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func procRSS(b *testing.B, pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func pct(v []time.Duration, q float64) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// runChild runs ztunnel's proxies for both pods until stdin closes; "mem"
// on stdin answers heap + stack in use after a collection.
func runChild(spec string) error {
	paths := strings.Split(spec, ",")
	ca, err := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	if err != nil {
		return err
	}
	store := state.NewStore()
	pods := []struct{ path, name, ip string }{{paths[0], "client", podA}, {paths[1], "server", podB}}
	addrs := map[string]*workloadpb.Address{}
	for _, p := range pods {
		uid := "Kubernetes//Pod/bench/" + p.name
		addrs[uid] = &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
			Uid: uid, Name: p.name, Namespace: "bench", ServiceAccount: p.name, Node: "node",
			Addresses: [][]byte{netip.MustParseAddr(p.ip).AsSlice()}, TunnelProtocol: workloadpb.TunnelProtocol_HBONE,
		}}}
	}
	if err := store.ApplyAddresses(addrs, nil); err != nil {
		return err
	}
	metrics := proxy.NewMetrics(prometheus.NewRegistry())
	quiet := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, p := range pods {
		ns, err := netns.Open(p.path)
		if err != nil {
			return err
		}
		id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "bench", p.name)
		svid, err := ca.IssueSVID(id, time.Hour)
		if err != nil {
			return err
		}
		px, err := proxy.NewPod(proxy.PodConfig{
			Namespace: "bench", Name: p.name, ServiceAccount: p.name, Node: "node", Store: store,
			Sockets: inpod.Sockets{NS: ns}, OrigDst: inpod.OrigDst,
			Credentials: staticCreds{spiffe.StaticCertificate(svid), ca.Roots()},
			Metrics:     metrics, Logger: quiet, AccessLog: quiet,
		})
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); px.Run(ctx) }()
		<-px.Ready()
	}
	if path := os.Getenv("WEFT_BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "mem" {
			var ms runtime.MemStats
			runtime.GC()
			runtime.GC()
			runtime.ReadMemStats(&ms)
			fmt.Println(ms.HeapInuse + ms.StackInuse)
		}
	}
	return nil
}

type staticCreds struct {
	cert  func() (*tls.Certificate, error)
	roots *x509.CertPool
}

func (c staticCreds) Certificate() (*tls.Certificate, error) { return c.cert() }
func (c staticCreds) Roots() *x509.CertPool                  { return c.roots }
