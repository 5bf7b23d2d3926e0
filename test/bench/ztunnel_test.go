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
	"path/filepath"
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
	// benchNS is the Kubernetes namespace of every workload in the mesh's view.
	benchNS = "bench"
	// childEnv makes the re-executed test binary run the proxies.
	childEnv = "WEFT_BENCH_ZTUNNEL_CHILD"
	// caEnv names the directory holding the mesh CA (ca.pem, ca-key.pem)
	// that the parent made and every child loads.
	caEnv = "WEFT_BENCH_CA"
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
	a, b *netns.NS
	// w is the waypoint's namespace, once addWaypoint made it.
	w         *netns.NS
	names     []string
	caDir     string
	child     *childProc // ztunnel's proxies for both pods
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
	p.caDir = newCADir(b)
	p.child = startChild(b, "ztunnel", "TestZtunnelChild", nil, childEnv+"="+p.a.Path()+","+p.b.Path(), caEnv+"="+p.caDir)
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

// childProc is this test binary re-executed to run one part of a benchmark
// in a process of its own, so that its CPU time and memory are its own. It
// answers each command line on stdin with one line and ends when stdin
// closes.
type childProc struct {
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	once sync.Once
}

// startChild runs the test function test as a child process with env added
// to its environment, inside ns when ns is not nil, and waits for its
// "ready". The child is stopped when the benchmark ends.
func startChild(b *testing.B, name, test string, ns *netns.NS, env ...string) *childProc {
	b.Helper()
	c := &childProc{name: name, cmd: exec.Command(os.Args[0], "-test.run", "^"+test+"$", "-test.v")}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stderr = os.Stderr
	c.in, _ = c.cmd.StdinPipe()
	out, _ := c.cmd.StdoutPipe()
	c.out = bufio.NewReader(out)
	var err error
	if ns != nil {
		// os/exec forks from the calling thread, which is in ns.
		err = ns.Do(c.cmd.Start)
	} else {
		err = c.cmd.Start()
	}
	if err != nil {
		b.Fatalf("starting the %s child: %v", name, err)
	}
	b.Cleanup(c.stop)
	if line := c.line(b, ""); line != "ready" {
		b.Fatalf("%s child: %s", name, line)
	}
	return c
}

// line sends a command (if any) and returns the child's next answer.
func (c *childProc) line(b *testing.B, cmd string) string {
	if cmd != "" {
		fmt.Fprintln(c.in, cmd)
	}
	for {
		line, err := c.out.ReadString('\n')
		if err != nil {
			b.Fatalf("%s child: %v", c.name, err)
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "=== RUN") || line == "" {
			continue // go test's own output
		}
		return line
	}
}

func (c *childProc) pid() int { return c.cmd.Process.Pid }

// stop closes the child's stdin and waits for it to exit, killing it after
// 10 s.
func (c *childProc) stop() {
	c.once.Do(func() {
		c.in.Close()
		done := make(chan struct{})
		go func() { c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			c.cmd.Process.Kill()
			<-done
		}
	})
}

func (p *podPair) close() {
	for _, ns := range []*netns.NS{p.a, p.b, p.w} {
		if ns != nil {
			ns.Close()
		}
	}
	for _, name := range p.names {
		netns.Delete(name)
	}
}

// newCADir makes the mesh CA every process of a benchmark trusts and writes
// it to a temporary directory the children load it from.
func newCADir(b *testing.B) string {
	ca, err := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	if err != nil {
		b.Fatal(err)
	}
	key, err := ca.KeyPEM()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	for name, data := range map[string][]byte{"ca.pem": ca.CertPEM(), "ca-key.pem": key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// loadCA loads the CA newCADir wrote.
func loadCA(dir string) (*spiffe.CA, error) {
	cert, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return nil, err
	}
	key, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		return nil, err
	}
	return spiffe.LoadCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain}, cert, key)
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

// openLoop sends 1 KiB POSTs to url from pod A at a fixed rate for d over
// conns keep-alive connections (a schedule that does not wait for
// responses, like fortio's uniform mode) and returns each request's latency
// from when it was sent.
func (p *podPair) openLoop(b *testing.B, url string, rate int, d time.Duration, conns int) []time.Duration {
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
	var firstErr error
	var wg sync.WaitGroup
	for range conns * 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range due {
				t0 := time.Now()
				resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				el := time.Since(t0)
				mu.Lock()
				if err != nil {
					failed++
					if firstErr == nil {
						firstErr = err
					}
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
		b.Fatalf("%d of %d requests failed, the first with: %v", failed, n, firstErr)
	}
	return lat
}

func (p *podPair) latency(b *testing.B) {
	const rate, conns = 1000, 8
	url := "http://" + podB + ":8080/"
	p.setRedirect(b, false)
	p.openLoop(b, url, rate, time.Second, conns) // warm-up
	direct := p.openLoop(b, url, rate, 10*time.Second, conns)
	p.setRedirect(b, true)
	p.openLoop(b, url, rate, time.Second, conns)
	cpu0 := procCPU(b, p.child.pid())
	t0 := time.Now()
	mesh := p.openLoop(b, url, rate, 10*time.Second, conns)
	cpu := procCPU(b, p.child.pid()) - cpu0
	el := time.Since(t0)
	rss := procRSS(b, p.child.pid())
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
	before, _ := strconv.ParseFloat(p.child.line(b, "mem"), 64)
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
	after, _ := strconv.ParseFloat(p.child.line(b, "mem"), 64)
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

func procRSS(b *testing.B, pid int) int64 { return procStatus(b, pid, "VmRSS") }

// procStatus reads a size in bytes from /proc/<pid>/status (VmRSS,
// RssAnon, RssFile, ...).
func procStatus(b *testing.B, pid int, field string) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
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

// runChild runs ztunnel's proxies for both pods until stdin closes. It
// answers on stdout: "mem" with heap + stack in use after a collection,
// "waypoint on" and "waypoint off" (binding the server's Service to the
// waypoint, or not) with "ok".
func runChild(spec string) error {
	paths := strings.Split(spec, ",")
	ca, err := loadCA(os.Getenv(caEnv))
	if err != nil {
		return err
	}
	store := state.NewStore()
	pods := []struct{ path, name string }{{paths[0], "client"}, {paths[1], "server"}}
	if err := store.ApplyAddresses(meshAddresses(false), nil); err != nil {
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
		id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, benchNS, p.name)
		svid, err := ca.IssueSVID(id, time.Hour)
		if err != nil {
			return err
		}
		px, err := proxy.NewPod(proxy.PodConfig{
			Namespace: benchNS, Name: p.name, ServiceAccount: p.name, Node: "node", Store: store,
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
		switch cmd := sc.Text(); cmd {
		case "mem":
			fmt.Println(memInUse())
		case "waypoint on", "waypoint off":
			if err := store.ApplyAddresses(meshAddresses(cmd == "waypoint on"), nil); err != nil {
				fmt.Println("error:", err)
				continue
			}
			fmt.Println("ok")
		}
	}
	return nil
}

// memInUse is heap + stack in use after a collection.
func memInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

// meshAddresses is the control plane's view the ztunnel child holds: the
// client and server pods, the server's Service, and the waypoint with its
// Service. With waypoint, the server's Service is bound to the waypoint.
// Pod-IP traffic (BenchmarkZtunnel's) routes the same either way.
func meshAddresses(waypoint bool) map[string]*workloadpb.Address {
	workload := func(name, ip string, svc string, port, target uint32) *workloadpb.Address {
		w := &workloadpb.Workload{
			Uid: "Kubernetes//Pod/" + benchNS + "/" + name, Name: name, Namespace: benchNS, ServiceAccount: name, Node: "node",
			Addresses: [][]byte{netip.MustParseAddr(ip).AsSlice()}, TunnelProtocol: workloadpb.TunnelProtocol_HBONE,
		}
		if svc != "" {
			w.Services = map[string]*workloadpb.PortList{benchNS + "/" + svc: {Ports: []*workloadpb.Port{{ServicePort: port, TargetPort: target}}}}
		}
		return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: w}}
	}
	service := func(host, vip string, port, target uint32) *workloadpb.Service {
		return &workloadpb.Service{
			Name: strings.Split(host, ".")[0], Namespace: benchNS, Hostname: host,
			Addresses: []*workloadpb.NetworkAddress{{Address: netip.MustParseAddr(vip).AsSlice()}},
			Ports:     []*workloadpb.Port{{ServicePort: port, TargetPort: target}},
		}
	}
	server := service(serverHost, serverVIP, 80, 8080)
	if waypoint {
		server.Waypoint = &workloadpb.GatewayAddress{
			Destination:   &workloadpb.GatewayAddress_Hostname{Hostname: &workloadpb.NamespacedHostname{Namespace: benchNS, Hostname: waypointHost}},
			HboneMtlsPort: 15008,
		}
	}
	addrs := map[string]*workloadpb.Address{}
	for _, a := range []*workloadpb.Address{
		workload("client", podA, "", 0, 0),
		workload("server", podB, serverHost, 80, 8080),
		workload("waypoint", podW, waypointHost, 15008, 15008),
		{Type: &workloadpb.Address_Service{Service: server}},
		{Type: &workloadpb.Address_Service{Service: service(waypointHost, waypointVIP, 15008, 15008)}},
	} {
		if w := a.GetWorkload(); w != nil {
			addrs[w.GetUid()] = a
		} else {
			addrs[benchNS+"/"+a.GetService().GetHostname()] = a
		}
	}
	return addrs
}

type staticCreds struct {
	cert  func() (*tls.Certificate, error)
	roots *x509.CertPool
}

func (c staticCreds) Certificate() (*tls.Certificate, error) { return c.cert() }
func (c staticCreds) Roots() *x509.CertPool                  { return c.roots }
