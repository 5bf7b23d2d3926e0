package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weftmesh/weft/cni/redirect"
	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/pb/zdspb"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/test/cluster"
)

// The ztunnel benchmark: two pods in their own network namespaces joined by
// a veth pair, each with Istio's in-pod redirection rules, enrolled in the
// product's ztunnel binary running in a third namespace (see node_test.go)
// as the node's one ztunnel for both pods. The client app in pod A talks to
// the server app in pod B through ztunnel's proxy in A, HBONE, and its
// proxy in B; the baseline is the same pods with the rules removed. Every
// figure is measured in the same run.
const (
	podA = "10.250.0.1"
	podB = "10.250.0.2"
	// benchNS is the Kubernetes namespace of every workload in the mesh's view.
	benchNS = "bench"
	// manyPods are enrolled for ztunnel_rss_per_pod_kib.
	manyPods = 100
)

// BenchmarkZtunnel prints, of the ztunnel process (which serves both ends):
//
//	ztunnel_throughput_vs_direct  bulk TCP pod A -> pod B through ztunnel at both ends ÷ direct
//	ztunnel_added_p90_ms          1 KiB HTTP request/response at 1000 req/s, p90 minus direct
//	ztunnel_added_p99_ms          the same, p99
//	relay_pair_added_p90_ms       the same through two nginx TCP relays on ztunnel's path, one
//	relay_pair_added_p99_ms       in each pod, instead: what any user-space proxy pair adds here
//	relay_pair_throughput_vs_direct  the bulk transfer through them ÷ direct
//	ztunnel_rss_mb                its RSS (VmRSS) under that load
//	ztunnel_heap_inuse_mb         its Go heap in use under that load (go_memstats_heap_inuse_bytes)
//	ztunnel_cpu_per_1000rps       CPU cores per 1000 req/s, per end (half the process's)
//	ztunnel_idle_conn_kib         heap + stack in use (after a collection) per idle proxied
//	                              connection, per end
//	ztunnel_rss_per_pod_kib       RSS growth of a fresh ztunnel per enrolled pod, 100 pods
//	                              (each its own namespace, Workload and service account) over
//	                              the 2-pod baseline
//
// and the raw figures behind them. With WEFT_BENCH_ZTUNNEL_PROFILE=<prefix>
// ztunnel samples its heap finely (GODEBUG=memprofilerate=4096), and its
// heap profile, goroutines and metrics are saved under the 1000 req/s load
// to <prefix>-load-heap.prof, <prefix>-load-goroutine.txt and
// <prefix>-load-metrics.txt (and a CPU profile of 3 s of the load to
// <prefix>-load-cpu.prof), in the first second of bulk transfer through
// it to <prefix>-throughput-*, with the 1000 idle connections open to
// <prefix>-idle-*, and with 102 pods enrolled to <prefix>-pods-*.
func BenchmarkZtunnel(b *testing.B) {
	if why := cluster.SkipReason(); why != "" {
		b.Skip(why)
	}
	env := newPodPair(b)
	fi, err := os.Stat(env.bin)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Printf("bench: ztunnel_binary_mb %.1f\n", float64(fi.Size())/(1<<20))
	fmt.Printf("bench: ztunnel_idle_rss_mb %.1f\n", float64(procRSS(b, env.zt.pid()))/(1<<20))
	for range b.N {
		env.throughput(b)
		env.latency(b)
		env.idle(b)
		env.manyPods(b)
	}
}

// podPair is the two pods and the node around them: ztunnel, the control
// plane and the node agent.
type podPair struct {
	a, b *netns.NS
	// w is the waypoint's namespace, once addWaypoint made it.
	w *netns.NS
	// node is ztunnel's namespace, where the control plane listens too.
	node      *netns.NS
	names     []string
	ca        *spiffe.CA
	bin, dir  string // ztunnel's binary; its files (root, token, ZDS socket, logs)
	cp        *controlPlane
	agent     *nodeAgent
	zt        *ztunnelProc
	redirects bool
	relays    bool // the relay pair runs
}

func newPodPair(b *testing.B) *podPair {
	b.Helper()
	p := &podPair{bin: cluster.BuildBinary(b, "./ztunnel/cmd/ztunnel", "ztunnel"), dir: b.TempDir()}
	b.Cleanup(p.close)
	for _, side := range []string{"a", "b", "n"} {
		name := fmt.Sprintf("weft-bench-%d-%s", os.Getpid(), side)
		ns, err := netns.Create(name)
		if err != nil {
			b.Fatal(err)
		}
		p.names = append(p.names, name)
		switch side {
		case "a":
			p.a = ns
		case "b":
			p.b = ns
		default:
			p.node = ns
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
	}{{p.a, podA}, {p.b, podB}, {p.node, ""}} {
		h, err := side.ns.Netlink()
		if err != nil {
			b.Fatal(err)
		}
		for _, ifname := range []string{"lo", "eth0"} {
			if ifname == "eth0" && side.addr == "" {
				continue
			}
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
	p.ca, err = spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	if err != nil {
		b.Fatal(err)
	}
	p.cp = startControlPlane(b, p.node, p.ca, p.dir)
	p.agent = listenZDS(b, filepath.Join(p.dir, "ztunnel.sock"))
	for _, name := range []string{"client", "server"} {
		ns := p.a
		if name == "server" {
			ns = p.b
		}
		err := p.agent.enroll(agentPod{uid: "uid-" + name, ns: ns.Path(),
			info: &zdspb.WorkloadInfo{Name: name, Namespace: benchNS, ServiceAccount: name}})
		if err != nil {
			b.Fatal(err)
		}
	}
	p.zt = startZtunnel(b, p.node, p.bin, p.dir, p.agent)
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
	srv := &http.Server{Handler: appHandler()}
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

// appHandler is the server app's HTTP handler: it reads the request body
// and answers 1 KiB.
func appHandler() http.Handler {
	body := bytes.Repeat([]byte("w"), 1024)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write(body)
	})
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

func (p *podPair) close() {
	for _, ns := range []*netns.NS{p.a, p.b, p.w, p.node} {
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

// bulk writes from pod A to addr, the sink app in pod B or a way to it,
// for d and returns the bytes per second.
func (p *podPair) bulk(b *testing.B, addr string, d time.Duration) float64 {
	c, err := p.dialFromA(addr)
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
	for round := range 3 {
		p.setRedirect(b, false)
		direct = append(direct, p.bulk(b, sinkAddr, time.Second))
		p.setRedirect(b, true)
		var saved <-chan struct{}
		if round == 0 {
			saved = p.profile(b, "throughput", 0, time.Second)
		}
		mesh = append(mesh, p.bulk(b, sinkAddr, 2*time.Second))
		if saved != nil {
			<-saved
		}
	}
	d, m := median(direct), median(mesh)
	fmt.Printf("bench: ztunnel_throughput_gbps %.2f\n", m*8/1e9)
	fmt.Printf("bench: direct_pod_throughput_gbps %.2f\n", d*8/1e9)
	fmt.Printf("bench: ztunnel_throughput_vs_direct %.3f\n", m/d)
	p.setRedirect(b, false)
	if p.relayPair(b) {
		var relayed []float64
		for range 3 {
			relayed = append(relayed, p.bulk(b, relaySinkAddr, 2*time.Second))
		}
		fmt.Printf("bench: relay_pair_throughput_vs_direct %.3f\n", median(relayed)/d)
	}
}

// openLoop sends 1 KiB POSTs to url from pod A at a fixed rate over conns
// keep-alive connections (a schedule that does not wait for responses,
// like fortio's uniform mode): a warm-up second, whose first conns
// requests go at once to open every connection, then d whose requests'
// latencies, from when each was sent, it returns.
// The measured requests find their connections open, so no connect or TLS
// handshake is in their latency. An https url is fetched with the TLS
// settings tc (nil for http), over HTTP/1.1.
func (p *podPair) openLoop(b *testing.B, url string, tc *tls.Config, rate int, d time.Duration, conns int) []time.Duration {
	tr := &http.Transport{
		MaxConnsPerHost: conns, MaxIdleConnsPerHost: conns, TLSClientConfig: tc,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return p.dialFromA(addr) },
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	body := bytes.Repeat([]byte("q"), 1024)
	warm := rate // requests in the warm-up second
	n := warm + int(d.Seconds()*float64(rate))
	due := make(chan int, n)
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	var failed int
	var firstErr error
	var wg sync.WaitGroup
	for range conns * 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range due {
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
				} else if i >= warm {
					lat = append(lat, el)
				}
				mu.Unlock()
			}
		}()
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		// The first conns requests go at once, so that each opens a
		// connection of its own.
		t0 := start.Add(time.Duration(i) * interval)
		if w := time.Until(t0); w > 0 && i >= conns {
			time.Sleep(w)
		}
		due <- i
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
	const d = 10 * time.Second
	url := "http://" + podB + ":8080/"
	p.setRedirect(b, false)
	direct := p.openLoop(b, url, nil, rate, d, conns)
	var relayed []time.Duration
	if p.relayPair(b) {
		relayed = p.openLoop(b, "http://"+relayHTTPAddr+"/", nil, rate, d, conns)
	}
	p.setRedirect(b, true)
	saved := p.profile(b, "load", d/2, 3*time.Second)
	pid := p.zt.pid()
	opened := p.zt.sum(b, "istio_tcp_connections_opened_total")
	cpu0 := procCPU(b, pid)
	t0 := time.Now()
	mesh := p.openLoop(b, url, nil, rate, d, conns)
	cpu := procCPU(b, pid) - cpu0
	// Each connection is counted by both ends.
	if n := p.zt.sum(b, "istio_tcp_connections_opened_total") - opened; n < 2 {
		b.Fatalf("ztunnel counted %v connections opened under the load: the traffic did not go through it", n)
	}
	el := time.Since(t0)
	rss := procRSS(b, pid)
	m := p.zt.metrics(b, "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines")
	<-saved
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	fmt.Printf("bench: direct_p90_ms %.3f\n", ms(pct(direct, 0.90)))
	fmt.Printf("bench: ztunnel_p90_ms %.3f\n", ms(pct(mesh, 0.90)))
	fmt.Printf("bench: direct_p99_ms %.3f\n", ms(pct(direct, 0.99)))
	fmt.Printf("bench: ztunnel_p99_ms %.3f\n", ms(pct(mesh, 0.99)))
	fmt.Printf("bench: ztunnel_added_p90_ms %.3f\n", ms(pct(mesh, 0.90)-pct(direct, 0.90)))
	fmt.Printf("bench: ztunnel_added_p99_ms %.3f\n", ms(pct(mesh, 0.99)-pct(direct, 0.99)))
	if relayed != nil {
		fmt.Printf("bench: relay_pair_added_p90_ms %.3f\n", ms(pct(relayed, 0.90)-pct(direct, 0.90)))
		fmt.Printf("bench: relay_pair_added_p99_ms %.3f\n", ms(pct(relayed, 0.99)-pct(direct, 0.99)))
	}
	fmt.Printf("bench: ztunnel_rss_mb %.1f\n", float64(rss)/(1<<20))
	fmt.Printf("bench: ztunnel_rss_anon_mb %.1f\n", float64(procStatus(b, pid, "RssAnon"))/(1<<20))
	fmt.Printf("bench: ztunnel_heap_inuse_mb %.1f\n", m["go_memstats_heap_inuse_bytes"]/(1<<20))
	fmt.Printf("bench: ztunnel_stack_inuse_mb %.1f\n", m["go_memstats_stack_inuse_bytes"]/(1<<20))
	fmt.Printf("bench: ztunnel_goroutines %.0f\n", m["go_goroutines"])
	// The process serves both ends, so each end's share is half.
	fmt.Printf("bench: ztunnel_cpu_per_1000rps %.3f\n", cpu.Seconds()/el.Seconds()/(rate/1000.0)/2)
}

// The relay pair: two nginx TCP relays where ztunnel's ends are, one in
// pod A, which the client app dials with the redirection off, relaying over
// the pods' link to one in pod B, relaying to the server app (HTTP) or the
// sink. nginx's stream proxy is an event loop that copies bytes and nothing
// more, so what it adds is about the least any pair of user-space proxies
// adds on this machine: the floor under ztunnel's figures, whose proxies
// also encrypt and multiplex.
const (
	sinkAddr      = podB + ":9000"
	relayHTTPAddr = podA + ":15101"
	relaySinkAddr = podA + ":15103"
)

// relayPair starts the relay pair once and reports whether it runs: false,
// and the floors are not printed, without nginx.
func (p *podPair) relayPair(b *testing.B) bool {
	if p.relays {
		return true
	}
	bin, why := findNginx()
	if bin == "" {
		b.Logf("no relay-pair floor: %s", why)
		return false
	}
	startNginxRelay(b, p, p.b, bin, [][2]string{{podB + ":15102", podB + ":8080"}, {podB + ":15104", sinkAddr}})
	startNginxRelay(b, p, p.a, bin, [][2]string{{relayHTTPAddr, podB + ":15102"}, {relaySinkAddr, podB + ":15104"}})
	p.relays = true
	return true
}

// profile saves ztunnel's heap profile, goroutines and metrics after
// wait, and a CPU profile of the cpu that follows (none for 0), when
// WEFT_BENCH_ZTUNNEL_PROFILE names a file prefix; the returned channel is
// closed once they are saved (at once without the variable).
func (p *podPair) profile(b *testing.B, phase string, wait, cpu time.Duration) <-chan struct{} {
	done := make(chan struct{})
	prefix := os.Getenv("WEFT_BENCH_ZTUNNEL_PROFILE")
	if prefix == "" {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		time.Sleep(wait)
		files := map[string]string{
			"heap.prof":     "http://" + ztAdmin + "/debug/pprof/heap",
			"goroutine.txt": "http://" + ztAdmin + "/debug/pprof/goroutine?debug=1",
			"metrics.txt":   "http://" + ztMetrics + "/metrics",
		}
		if cpu > 0 {
			files["cpu.prof"] = fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", ztAdmin, int(cpu.Seconds()))
		}
		for file, url := range files {
			data, err := p.zt.get(url)
			if err == nil {
				err = os.WriteFile(prefix+"-"+phase+"-"+file, data, 0o644)
			}
			if err != nil {
				b.Errorf("ztunnel profile: %v", err)
			}
		}
	}()
	return done
}

func (p *podPair) idle(b *testing.B) {
	const n = 1000
	p.setRedirect(b, true)
	pid := p.zt.pid()
	before, rss0 := p.zt.memInUse(b), procRSS(b, pid)
	opened := p.zt.sum(b, "istio_tcp_connections_opened_total")
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := p.dialFromA(podB + ":9000")
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte("x")); err != nil { // make sure the tunnel is up
			b.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond) // let every tunnel settle on both ends
	after, rss1 := p.zt.memInUse(b), procRSS(b, pid)
	<-p.profile(b, "idle", 0, 0)
	if got := p.zt.sum(b, "istio_tcp_connections_opened_total") - opened; got < 2*n {
		b.Fatalf("ztunnel counted %v connections opened for %d at both ends", got, n)
	}
	fmt.Printf("bench: ztunnel_idle_conn_kib %.1f\n", (after-before)/n/2/1024)
	fmt.Printf("bench: ztunnel_idle_conn_rss_kib %.1f\n", float64(rss1-rss0)/n/2/1024)
}

// manyPods restarts ztunnel with the two pods, then enrolls manyPods more,
// each in a namespace of its own with a Workload (and service account) of
// its own, and reports the growth of ztunnel's RSS and of its heap and
// stacks in use per pod. The pods are removed and their namespaces deleted
// at the end.
func (p *podPair) manyPods(b *testing.B) {
	p.zt.stop()
	p.zt = startZtunnel(b, p.node, p.bin, p.dir, p.agent)
	pid := p.zt.pid()
	time.Sleep(2 * time.Second)
	rss0, mem0 := procRSS(b, pid), p.zt.memInUse(b)
	var names []string
	var uids, addrs []string
	defer func() {
		for _, uid := range uids {
			p.agent.remove(uid)
		}
		p.cp.publish(b, nil, addrs)
		for _, name := range names {
			if err := netns.Delete(name); err != nil {
				b.Error(err)
			}
		}
	}()
	start := time.Now()
	for i := range manyPods {
		name := fmt.Sprintf("weft-bench-%d-p%03d", os.Getpid(), i)
		ns, err := netns.Create(name)
		if err != nil {
			b.Fatal(err)
		}
		names = append(names, name)
		err = func() error {
			defer ns.Close()
			h, err := ns.Netlink()
			if err != nil {
				return err
			}
			defer h.Close()
			lo, err := h.LinkByName("lo")
			if err != nil {
				return err
			}
			return h.LinkSetUp(lo)
		}()
		if err != nil {
			b.Fatal(err)
		}
		pod := fmt.Sprintf("pod-%03d", i)
		w := &workloadpb.Workload{
			Uid: "Kubernetes//Pod/" + benchNS + "/" + pod, Name: pod, Namespace: benchNS, ServiceAccount: pod, Node: benchNode,
			Addresses:      [][]byte{netip.AddrFrom4([4]byte{10, 251, byte(i >> 8), byte(i + 1)}).AsSlice()},
			TunnelProtocol: workloadpb.TunnelProtocol_HBONE,
		}
		p.cp.publish(b, map[string]*workloadpb.Address{w.Uid: {Type: &workloadpb.Address_Workload{Workload: w}}}, nil)
		addrs = append(addrs, w.Uid)
		uid := "uid-" + pod
		if err := p.agent.enroll(agentPod{uid: uid, ns: netns.Path(name),
			info: &zdspb.WorkloadInfo{Name: pod, Namespace: benchNS, ServiceAccount: pod}}); err != nil {
			b.Fatalf("enrolling %s: %v\n%s", pod, err, p.zt.logTail())
		}
		uids = append(uids, uid)
	}
	enrolled := time.Since(start)
	time.Sleep(2 * time.Second)
	if pods, certs := p.zt.servedPods(b); pods != manyPods+2 || certs != manyPods+2 {
		b.Fatalf("ztunnel serves %d pods with %d certificates, want %d of each", pods, certs, manyPods+2)
	}
	rss1, mem1 := procRSS(b, pid), p.zt.memInUse(b)
	<-p.profile(b, "pods", 0, 0)
	fmt.Printf("bench: ztunnel_enroll_%d_pods_s %.2f\n", manyPods, enrolled.Seconds())
	fmt.Printf("bench: ztunnel_2pod_rss_mb %.1f\n", float64(rss0)/(1<<20))
	fmt.Printf("bench: ztunnel_%dpod_rss_mb %.1f\n", manyPods+2, float64(rss1)/(1<<20))
	fmt.Printf("bench: ztunnel_rss_per_pod_kib %.1f\n", float64(rss1-rss0)/manyPods/1024)
	fmt.Printf("bench: ztunnel_mem_per_pod_kib %.1f\n", (mem1-mem0)/manyPods/1024)
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

// meshAddresses is what the control plane publishes to ztunnel: the
// client and server pods, the server's Service, and the waypoint with its
// Service. With waypoint, the server's Service is bound to the waypoint.
// Pod-IP traffic (BenchmarkZtunnel's) routes the same either way.
func meshAddresses(waypoint bool) map[string]*workloadpb.Address {
	workload := func(name, ip string, svc string, port, target uint32) *workloadpb.Address {
		w := &workloadpb.Workload{
			Uid: "Kubernetes//Pod/" + benchNS + "/" + name, Name: name, Namespace: benchNS, ServiceAccount: name, Node: benchNode,
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
