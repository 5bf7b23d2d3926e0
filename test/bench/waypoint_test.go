package bench

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpopts "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/vishvananda/netlink"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/waypoint/config"
)

// The waypoint benchmark adds a third network namespace to
// BenchmarkZtunnel's two pods: the waypoint's, with podW on its loopback,
// joined to each pod by a veth pair. The waypoint runs there: the product's
// binary, built for the run, on a static Envoy configuration (waypoint
// -bootstrap) with its default settings but the access log off; the
// ztunnel binary serves both pods as in BenchmarkZtunnel. nginx, for
// the throughput baseline, runs in the waypoint's namespace too, so both
// proxies reach the same backend (the server app in pod B) over the same
// link.
const (
	podW = "10.250.0.3"
	// serverHost's VIP is what the client app in pod A connects to; the
	// control plane binds it to the waypoint in bindWaypoint.
	serverHost = "server." + benchNS + ".svc.cluster.local"
	serverVIP  = "10.96.0.10"
	// serviceRange is routed from pod A's eth0 so that its app can connect
	// to a VIP; its ztunnel takes the connection before it leaves the pod.
	serviceRange = "10.96.0.0/16"
	// waypointHost is the waypoint's own Service, named by the binding.
	waypointHost = "waypoint." + benchNS + ".svc.cluster.local"
	waypointVIP  = "10.96.0.99"
	// backendHost's VIP is the throughput benchmark's CONNECT target: the
	// waypoint routes it to the server app over plain TCP, as nginx does.
	backendHost = "backend." + benchNS + ".svc.cluster.local"
	backendVIP  = "10.96.0.11"
	nginxPort   = 8081
	// The waypoint's own ports, on its namespace's loopback.
	waypointMetrics = "127.0.0.1:15020"
	waypointReady   = "127.0.0.1:15021"
	waypointDebug   = "127.0.0.1:15000"
)

// BenchmarkWaypoint prints:
//
//	waypoint_added_p99_ms   1 KiB HTTP request/response at 1000 req/s from pod A to the server's
//	                        Service VIP: p99 through ztunnel + waypoint minus p99 through ztunnel alone
//	waypoint_rss_mb         the waypoint process's RSS (VmRSS) at the end of that load
//	                        (waypoint_idle_rss_mb is the same before any load, waypoint_rss_anon_mb
//	                        the anonymous part: heap, stacks)
//	waypoint_rps_vs_nginx   requests/s per busy core of the waypoint (HBONE in, HTTP/1.1 keep-alive
//	                        inside the streams, 1 KiB responses) ÷ the same for nginx as a reverse proxy
//	                        (keep-alive upstream) to the same backend, under the same closed-loop load
//	waypoint_h2_rps_vs_nginx the same for HTTP/2: gRPC unary calls answered with 1 KiB, 16 in flight
//	                        over 4 connections (HBONE in, h2c inside the streams), ÷ nginx with http2
//	                        on its plain listener and grpc_pass to the same gRPC server (waypointH2RPS)
//
// and the raw figures behind them. Every figure is measured against its
// baseline in the same run. The throughput loads reach nginx over plain
// TCP and the waypoint over HBONE, as a mesh client reaches it: the
// waypoint's figures include terminating mutual TLS and the tunnel, which
// nginx's do not. With WEFT_BENCH_WAYPOINT_CPUPROFILE=<prefix> the waypoint
// serves pprof and each measured round's CPU profile is saved to
// <prefix>-<latency|waypoint_rps|waypoint_h2_rps>-<round>.prof (`go tool
// pprof` merges several).
func BenchmarkWaypoint(b *testing.B) {
	if why := cluster.SkipReason(); why != "" {
		b.Skip(why)
	}
	bin := cluster.BuildBinary(b, "./waypoint/cmd/waypoint", "waypoint")
	p := newPodPair(b)
	p.addWaypoint(b)
	wp := startWaypoint(b, p, bin)
	fmt.Printf("bench: waypoint_idle_rss_mb %.1f\n", float64(procRSS(b, wp.pid()))/(1<<20))
	// Latency first: the RSS figure is the waypoint's after the 1000 req/s
	// load, not after the throughput runs.
	b.Run("latency", func(b *testing.B) {
		for range b.N {
			waypointLatency(b, p, wp)
		}
	})
	b.Run("rps_vs_nginx", func(b *testing.B) {
		bin, why := findNginx()
		if why != "" {
			b.Skip(why)
		}
		for range b.N {
			waypointRPS(b, p, wp, bin)
		}
	})
	b.Run("h2_rps_vs_nginx", func(b *testing.B) {
		bin, why := findNginx()
		if why != "" {
			b.Skip(why)
		}
		for range b.N {
			waypointH2RPS(b, p, wp, bin)
		}
	})
}

// addWaypoint makes the waypoint's namespace: podW on its loopback, a veth
// pair to each pod ("eth1" in the pod, "a" or "b" in the waypoint's
// namespace) with host routes both ways, and the Service range routed from
// pod A's eth0.
func (p *podPair) addWaypoint(b *testing.B) {
	name := fmt.Sprintf("weft-bench-%d-w", os.Getpid())
	ns, err := netns.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	p.names = append(p.names, name)
	p.w = ns
	hw, err := ns.Netlink()
	if err != nil {
		b.Fatal(err)
	}
	defer hw.Close()
	check := func(err error, what string) {
		if err != nil {
			b.Fatalf("waypoint topology: %s: %v", what, err)
		}
	}
	lo, err := hw.LinkByName("lo")
	check(err, "lo")
	check(hw.AddrAdd(lo, &netlink.Addr{IPNet: ipnet(podW + "/32")}), "address on lo")
	check(hw.LinkSetUp(lo), "lo up")
	for _, side := range []struct {
		ns         *netns.NS
		peer, addr string
	}{{p.a, "a", podA}, {p.b, "b", podB}} {
		h, err := side.ns.Netlink()
		check(err, side.ns.Path())
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth1"}, PeerName: side.peer, PeerNamespace: netlink.NsFd(ns.Fd())}
		check(h.LinkAdd(veth), "veth to "+side.addr)
		l, err := h.LinkByName("eth1")
		check(err, "eth1")
		check(h.LinkSetUp(l), "eth1 up")
		check(h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipnet(podW + "/32"), Src: net.ParseIP(side.addr), Scope: netlink.SCOPE_LINK}), "route to the waypoint")
		if side.addr == podA {
			eth0, err := h.LinkByName("eth0")
			check(err, "eth0")
			check(h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipnet(serviceRange), Scope: netlink.SCOPE_LINK}), "service route")
		}
		h.Close()
		pl, err := hw.LinkByName(side.peer)
		check(err, side.peer)
		check(hw.LinkSetUp(pl), side.peer+" up")
		check(hw.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Dst: ipnet(side.addr + "/32"), Src: net.ParseIP(podW), Scope: netlink.SCOPE_LINK}), "route to "+side.addr)
	}
}

// bindWaypoint binds the server's Service to the waypoint in ztunnel's
// view, or removes the binding: the control plane publishes the change and
// bindWaypoint waits until ztunnel's configuration dump shows it.
func (p *podPair) bindWaypoint(b *testing.B, on bool) {
	p.cp.publish(b, meshAddresses(on), nil)
	var last error
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(10 * time.Millisecond) {
		d, err := p.zt.dump()
		if err != nil {
			last = err
			continue
		}
		for _, s := range d.Services {
			if s.Hostname == serverHost && (len(s.Waypoint) > 0 && string(s.Waypoint) != "null") == on {
				return
			}
		}
		last = fmt.Errorf("the binding is not %v yet", on)
	}
	b.Fatalf("ztunnel did not apply the waypoint binding: %v", last)
}

func waypointLatency(b *testing.B, p *podPair, wp *waypointProc) {
	const rate, conns, rounds = 1000, 8, 2
	const d = 5 * time.Second
	url := "http://" + serverVIP + "/"
	p.setRedirect(b, true)
	var base, mesh []time.Duration
	var cpu, el time.Duration
	// Alternate so that drift in the machine's load hits both sides alike.
	for round := range rounds {
		p.bindWaypoint(b, false)
		n0 := wp.requests(b)
		base = append(base, p.openLoop(b, url, nil, rate, d, conns)...)
		if n := wp.requests(b) - n0; n != 0 {
			b.Fatalf("%d requests went through the waypoint with the binding removed", n)
		}
		p.bindWaypoint(b, true)
		n0 = wp.requests(b)
		stop := wp.profile(b, "latency", round, d)
		cpu0, t0 := procCPU(b, wp.pid()), time.Now()
		lat := p.openLoop(b, url, nil, rate, d, conns)
		cpu += procCPU(b, wp.pid()) - cpu0
		stop()
		el += time.Since(t0)
		if n := wp.requests(b) - n0; n < len(lat) {
			b.Fatalf("only %d of %d requests went through the waypoint", n, len(lat))
		}
		mesh = append(mesh, lat...)
	}
	rss, anon := procRSS(b, wp.pid()), procStatus(b, wp.pid(), "RssAnon")
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	fmt.Printf("bench: svc_ztunnel_p90_ms %.3f\n", ms(pct(base, 0.90)))
	fmt.Printf("bench: svc_ztunnel_p99_ms %.3f\n", ms(pct(base, 0.99)))
	fmt.Printf("bench: svc_ztunnel_waypoint_p90_ms %.3f\n", ms(pct(mesh, 0.90)))
	fmt.Printf("bench: svc_ztunnel_waypoint_p99_ms %.3f\n", ms(pct(mesh, 0.99)))
	fmt.Printf("bench: waypoint_added_p50_ms %.3f\n", ms(pct(mesh, 0.50)-pct(base, 0.50)))
	fmt.Printf("bench: waypoint_added_p90_ms %.3f\n", ms(pct(mesh, 0.90)-pct(base, 0.90)))
	fmt.Printf("bench: waypoint_added_p99_ms %.3f\n", ms(pct(mesh, 0.99)-pct(base, 0.99)))
	fmt.Printf("bench: waypoint_rss_mb %.1f\n", float64(rss)/(1<<20))
	fmt.Printf("bench: waypoint_rss_anon_mb %.1f\n", float64(anon)/(1<<20))
	fmt.Printf("bench: waypoint_cpu_per_1000rps %.3f\n", cpu.Seconds()/el.Seconds()/(rate/1000.0))
}

func waypointRPS(b *testing.B, p *podPair, wp *waypointProc, nginxBin string) {
	p.setRedirect(b, false) // the load generator in pod A talks to both proxies itself
	ng := startNginx(b, p, nginxBin, nginxServer{listen: fmt.Sprintf("%s:%d", podW, nginxPort)})
	hb, src := p.hboneClient(b)
	wpID := benchID("waypoint")
	viaWaypoint := func() (net.Conn, error) {
		return hb.Dial(context.Background(), hbone.Target{Source: src, Peers: []spiffeid.ID{wpID},
			Addr: netip.MustParseAddrPort(podW + ":15008"), Authority: backendVIP + ":80"})
	}
	viaNginx := func() (net.Conn, error) { return p.dialFromA(fmt.Sprintf("%s:%d", podW, nginxPort)) }
	rpsVersusNginx(b, "waypoint", "nginx", h1Load, wp, viaWaypoint, ng, viaNginx)
}

// rpsVersusNginx runs the same closed-loop load (three rounds of 3 s,
// after a warm-up) through the proxy under test and through nginx, each
// dialed by its function, and prints their requests/s, CPU cores and
// requests/s per core, named <name>_rps... and <baseline>_rps..., and
// <name>_rps_vs_nginx, the ratio of the medians per core.
func rpsVersusNginx(b *testing.B, name, baseline string, load rpsLoad, wp *waypointProc, via func() (net.Conn, error), ng *exec.Cmd, viaNginx func() (net.Conn, error)) {
	const rounds = 3
	const d = 3 * time.Second
	ngPIDs := append([]int{ng.Process.Pid}, childPIDs(ng.Process.Pid)...)
	if len(ngPIDs) < 2 {
		b.Fatal("nginx has no worker processes")
	}
	load(b, viaNginx, nil, time.Second) // warm-up
	load(b, via, nil, time.Second)
	var ngRPS, ngCores, wpRPS, wpCores, ngPerCore, wpPerCore []float64
	for round := range rounds {
		r, c := load(b, viaNginx, ngPIDs, d)
		ngRPS, ngCores, ngPerCore = append(ngRPS, r), append(ngCores, c), append(ngPerCore, r/c)
		stop := wp.profile(b, name+"_rps", round, d)
		r, c = load(b, via, []int{wp.pid()}, d)
		stop()
		wpRPS, wpCores, wpPerCore = append(wpRPS, r), append(wpCores, c), append(wpPerCore, r/c)
		b.Logf("round %d: %s %.0f/s per core, %s %.0f/s per core (%.0f/s on %.3f cores)", round, baseline, ngPerCore[round], name, wpPerCore[round], r, c)
	}
	fmt.Printf("bench: %s_rps %.0f\n", baseline, median(ngRPS))
	fmt.Printf("bench: %s_cpu_cores %.3f\n", baseline, median(ngCores))
	fmt.Printf("bench: %s_rps_per_core %.0f\n", baseline, median(ngPerCore))
	fmt.Printf("bench: %s_rps %.0f\n", name, median(wpRPS))
	fmt.Printf("bench: %s_cpu_cores %.3f\n", name, median(wpCores))
	fmt.Printf("bench: %s_rps_per_core %.0f\n", name, median(wpPerCore))
	fmt.Printf("bench: %s_rps_vs_nginx %.3f\n", name, median(wpPerCore)/median(ngPerCore))
}

// rpsLoad is a closed load rpsVersusNginx runs for d on connections that
// dial opens, returning the completed requests per second and the CPU
// cores the processes pids used meanwhile.
type rpsLoad func(b *testing.B, dial func() (net.Conn, error), pids []int, d time.Duration) (rps, cores float64)

// h1Load is the HTTP/1.1 load: 16 keep-alive connections, each with one
// GET in flight at all times (closedLoop).
func h1Load(b *testing.B, dial func() (net.Conn, error), pids []int, d time.Duration) (rps, cores float64) {
	return closedLoop(b, dial, pids, 16, d)
}

// benchID is the SPIFFE ID of service account sa in benchNS.
func benchID(sa string) spiffeid.ID {
	id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, benchNS, sa)
	return id.ID()
}

// hboneClient is an HBONE dialer for the client app in pod A, with the
// client's SVID from the bench CA.
func (p *podPair) hboneClient(b *testing.B) (*hbone.Dialer, spiffeid.ID) {
	ca := p.ca
	id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, benchNS, "client")
	svid, err := ca.IssueSVID(id, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	d, err := hbone.NewDialer(hbone.DialerConfig{
		TLS: func(_ spiffeid.ID, peers []spiffeid.ID) (*tls.Config, error) {
			return spiffe.ClientConfig(spiffe.StaticCertificate(svid), ca.Roots(), peers), nil
		},
		Dial: func(ctx context.Context, addr netip.AddrPort, _ netip.Addr) (net.Conn, error) {
			return p.dialFromA(addr.String())
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d, id.ID()
}

// closedLoop keeps conns keep-alive connections busy for d, each sending
// its next GET as soon as the previous 1 KiB response is read, and returns
// the completed requests per second and the CPU cores the processes pids
// used meanwhile (drive).
func closedLoop(b *testing.B, dial func() (net.Conn, error), pids []int, conns int, d time.Duration) (rps, cores float64) {
	cs := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for range conns {
		c, err := dial()
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
	}
	req := []byte("GET / HTTP/1.1\r\nHost: " + backendHost + "\r\n\r\n")
	brs := make([]*bufio.Reader, len(cs))
	for i, c := range cs {
		brs[i] = bufio.NewReaderSize(c, 4096)
	}
	return drive(b, conns, pids, d, func(i int) error { return exchange(cs[i], brs[i], req) })
}

// drive runs workers goroutines for d, each calling do with its number
// again as soon as it returns, and returns the calls completed per second
// and the CPU cores the processes pids used meanwhile (CPU seconds ÷ wall
// seconds, from /proc/<pid>/stat). An error from do fails the benchmark.
func drive(b *testing.B, workers int, pids []int, d time.Duration, do func(worker int) error) (rps, cores float64) {
	var total atomic.Int64
	var errOnce sync.Once
	var firstErr error
	var wg sync.WaitGroup
	cpu0 := cpuOf(b, pids)
	start := time.Now()
	deadline := start.Add(d)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var n int64
			defer func() { total.Add(n) }()
			for time.Now().Before(deadline) {
				if err := do(i); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				n++
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	cpu := cpuOf(b, pids) - cpu0
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return float64(total.Load()) / el.Seconds(), cpu.Seconds() / el.Seconds()
}

// exchange sends one request and reads its response to the end.
func exchange(c net.Conn, br *bufio.Reader, req []byte) error {
	if _, err := c.Write(req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || n != 1024 {
		return fmt.Errorf("response %d with %d bytes, want 200 with 1024", resp.StatusCode, n)
	}
	return nil
}

func cpuOf(b *testing.B, pids []int) time.Duration {
	var t time.Duration
	for _, pid := range pids {
		t += procCPU(b, pid)
	}
	return t
}

// childPIDs lists the processes whose parent is pid.
func childPIDs(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n))
		i := strings.LastIndexByte(string(raw), ')')
		if err != nil || i < 0 {
			continue
		}
		if f := strings.Fields(string(raw[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// findNginx returns nginx's path, or why the throughput comparison cannot
// run.
func findNginx() (path, why string) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, ""
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", ""
	}
	return "", "nginx is not installed: `make bench` installs it (BENCH=1 scripts/deps.sh), or apt-get install nginx"
}

// nginxConf is nginx as a reverse proxy with keep-alive connections on
// both sides and no access log (the waypoint runs with none either); %[1]s
// is the run's directory, %[2]s the backend, %[3]s the listen directive's
// parameters, %[4]s more directives of the server and %[5]s the location's.
const nginxConf = `daemon off;
master_process on;
worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events {
	worker_connections 1024;
}
http {
	access_log off;
	client_body_temp_path %[1]s/client_body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	keepalive_requests 1000000;
	upstream backend {
		server %[2]s;
		keepalive 64;
		keepalive_requests 1000000;
	}
	server {
		listen %[3]s;
%[4]s
		location / {
%[5]s
		}
	}
}
`

// nginxServer is what nginx serves: listen is the listen directive's
// address (and parameters, such as ssl), files are written into its
// directory (a certificate and key), and directives are added to its
// server block. backend (default the server app, podB:8080) is its
// upstream and pass the location's directives (default nginxHTTP1Pass).
type nginxServer struct {
	listen     string
	files      map[string][]byte
	directives string
	backend    string
	pass       string
}

// nginxHTTP1Pass proxies to the upstream over HTTP/1.1 keep-alive.
const nginxHTTP1Pass = `			proxy_pass http://backend;
			proxy_http_version 1.1;
			proxy_set_header Connection "";`

// startNginx runs nginx in the waypoint's namespace, proxying to the server
// app, with its configuration, pid, log and temp files in a temporary
// directory; it is stopped when the benchmark ends.
func startNginx(b *testing.B, p *podPair, bin string, srv nginxServer) *exec.Cmd {
	dir := nginxDir(b)
	for name, data := range srv.files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	listen, _, _ := strings.Cut(srv.listen, " ")
	directives := strings.ReplaceAll(srv.directives, "$DIR", dir)
	backend, pass := cmp.Or(srv.backend, podB+":8080"), cmp.Or(srv.pass, nginxHTTP1Pass)
	return runNginx(b, p, p.w, bin, dir, fmt.Sprintf(nginxConf, dir, backend, srv.listen, directives, pass), listen)
}

// nginxStreamConf is nginx as a plain TCP relay, one worker, no log:
// %[1]s is the run's directory, %[2]s the module's path and %[3]s its
// servers.
const nginxStreamConf = `daemon off;
master_process on;
worker_processes 1;
load_module %[2]s;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events {
	worker_connections 1024;
}
stream {
%[3]s}
`

// nginxStreamModule is where Debian's libnginx-mod-stream puts the module.
const nginxStreamModule = "/usr/lib/nginx/modules/ngx_stream_module.so"

// startNginxRelay runs nginx in ns as a TCP relay from each address of
// relays, in the order given, to the address it maps to, until the
// benchmark ends.
func startNginxRelay(b *testing.B, p *podPair, ns *netns.NS, bin string, relays [][2]string) *exec.Cmd {
	if _, err := os.Stat(nginxStreamModule); err != nil {
		b.Fatalf("nginx's stream module is not installed: `make bench` installs it (BENCH=1 scripts/deps.sh), or apt-get install libnginx-mod-stream")
	}
	var servers strings.Builder
	for _, r := range relays {
		fmt.Fprintf(&servers, "\tserver {\n\t\tlisten %s;\n\t\tproxy_pass %s;\n\t}\n", r[0], r[1])
	}
	dir := nginxDir(b)
	return runNginx(b, p, ns, bin, dir, fmt.Sprintf(nginxStreamConf, dir, nginxStreamModule, servers.String()), relays[0][0])
}

// nginxDir is a directory for one nginx's configuration, pid, log and temp
// files, which its workers (nobody) can reach.
func nginxDir(b *testing.B) string {
	dir := b.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// runNginx runs nginx in ns with configuration conf, written into dir, and
// waits until pod A reaches it on listen and its workers are up; it is
// stopped when the benchmark ends.
func runNginx(b *testing.B, p *podPair, ns *netns.NS, bin, dir, conf, listen string) *exec.Cmd {
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log"))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := ns.Do(cmd.Start); err != nil {
		b.Fatalf("starting nginx: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	b.Cleanup(func() {
		workers := childPIDs(cmd.Process.Pid)
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		for _, pid := range workers {
			syscall.Kill(pid, syscall.SIGKILL) // gone already unless the master was killed
		}
	})
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			b.Fatalf("nginx exited: %s", log)
		default:
		}
		c, err := p.dialFromA(listen)
		if err == nil {
			c.Close()
			break
		}
		if time.Since(start) > 10*time.Second {
			b.Fatalf("nginx does not listen on %s: %v", listen, err)
		}
	}
	// The master starts its workers right after it listens.
	for start := time.Now(); len(childPIDs(cmd.Process.Pid)) == 0 && time.Since(start) < 5*time.Second; {
		time.Sleep(20 * time.Millisecond)
	}
	return cmd
}

// waypointProc is the waypoint binary running in the waypoint's namespace.
type waypointProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	// admin reaches its metrics, readiness and debug ports, dialing inside
	// its namespace.
	admin         *http.Client
	profilePrefix string // WEFT_BENCH_WAYPOINT_CPUPROFILE
}

// startWaypoint runs the waypoint on the mesh's bootstrap
// (waypointBootstrap) with HBONE on 15008.
func startWaypoint(b *testing.B, p *podPair, bin string) *waypointProc {
	boot, err := waypointBootstrap()
	if err != nil {
		b.Fatal(err)
	}
	return startProxy(b, p, bin, boot, "HBONE_ADDR=:15008")
}

// startProxy runs the waypoint binary in the waypoint's namespace on the
// bootstrap file boot, with its SVID, the settings env added to the
// benchmark's (metrics, readiness, no access log), until the benchmark
// ends; it returns once the proxy is ready.
func startProxy(b *testing.B, p *podPair, bin string, boot []byte, env ...string) *waypointProc {
	dir := b.TempDir()
	ca := p.ca
	id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, benchNS, "waypoint")
	svid, err := ca.IssueSVID(id, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	var chain []byte
	for _, c := range svid.Chain {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	key, err := x509.MarshalPKCS8PrivateKey(svid.Key)
	if err != nil {
		b.Fatal(err)
	}
	files := map[string][]byte{"cert.pem": chain, "key.pem": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
		"roots.pem": ca.RootsPEM(), "bootstrap.json": boot}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	wp := &waypointProc{exited: make(chan struct{}), profilePrefix: os.Getenv("WEFT_BENCH_WAYPOINT_CPUPROFILE")}
	wp.admin = &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := p.w.Do(func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}}
	wp.cmd = exec.Command(bin, "-bootstrap", filepath.Join(dir, "bootstrap.json"), "-cert", filepath.Join(dir, "cert.pem"),
		"-key", filepath.Join(dir, "key.pem"), "-roots", filepath.Join(dir, "roots.pem"))
	wp.cmd.Env = append(append(os.Environ(), "METRICS_ADDR="+waypointMetrics, "READINESS_ADDR="+waypointReady, "ACCESS_LOG=off"), env...)
	if wp.profilePrefix != "" {
		wp.cmd.Env = append(wp.cmd.Env, "DEBUG_ADDR="+waypointDebug)
	}
	wp.cmd.Stdout, wp.cmd.Stderr = os.Stderr, os.Stderr
	if err := p.w.Do(wp.cmd.Start); err != nil { // forks from the thread in the namespace
		b.Fatalf("starting the waypoint: %v", err)
	}
	go func() { wp.cmd.Wait(); close(wp.exited) }()
	b.Cleanup(func() {
		wp.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-wp.exited:
		case <-time.After(10 * time.Second):
			wp.cmd.Process.Kill()
			<-wp.exited
		}
	})
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-wp.exited:
			b.Fatalf("the waypoint exited: %v", wp.cmd.ProcessState)
		default:
		}
		if _, err := wp.get("http://" + waypointReady + "/healthz/ready"); err == nil {
			return wp
		} else if time.Since(start) > 20*time.Second {
			b.Fatalf("the waypoint is not ready: %v", err)
		}
	}
}

func (wp *waypointProc) pid() int { return wp.cmd.Process.Pid }

// get fetches one of the waypoint's admin URLs.
func (wp *waypointProc) get(url string) ([]byte, error) { return adminGet(wp.admin, url) }

// adminGet fetches an admin URL of a proxy under test: its body, an error
// for any status but 200.
func adminGet(c *http.Client, url string) ([]byte, error) {
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s %s", url, resp.Status, body)
	}
	return body, err
}

// requests is how many requests the waypoint has answered
// (istio_requests_total over all series).
func (wp *waypointProc) requests(b *testing.B) int {
	body, err := wp.get("http://" + waypointMetrics + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "istio_requests_total{") {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				b.Fatalf("metrics line %q: %v", line, err)
			}
			sum += v
		}
	}
	return int(sum)
}

// profile takes a CPU profile of the waypoint for the next d, when
// WEFT_BENCH_WAYPOINT_CPUPROFILE names a file prefix; the returned
// function waits for it and saves it to <prefix>-<phase>-<round>.prof.
func (wp *waypointProc) profile(b *testing.B, phase string, round int, d time.Duration) func() {
	if wp.profilePrefix == "" {
		return func() {}
	}
	type result struct {
		data []byte
		err  error
	}
	got := make(chan result, 1)
	go func() {
		data, err := wp.get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", waypointDebug, int(d.Seconds())))
		got <- result{data, err}
	}()
	return func() {
		r := <-got
		if r.err == nil {
			r.err = os.WriteFile(fmt.Sprintf("%s-%s-%d.prof", wp.profilePrefix, phase, round), r.data, 0o644)
		}
		if r.err != nil {
			b.Fatalf("waypoint CPU profile: %v", r.err)
		}
	}
}

// waypointBootstrap is the waypoint's bootstrap file (JSON): the Envoy
// resources the control plane would send for three Services bound to it:
// the server's (its VIP routed to pod B over HBONE, as in the mesh), the
// throughput benchmark's backend (routed to the same app over plain TCP, as
// nginx reaches it) and the HTTP/2 benchmark's gRPC backend (plain TCP,
// HTTP/2 upstream). It is checked the way the waypoint will read it.
func waypointBootstrap() ([]byte, error) {
	var errs []error
	toAny := func(m proto.Message) *anypb.Any {
		a, err := anypb.New(m)
		errs = append(errs, err)
		return a
	}
	router := &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: toAny(&routerv3.Router{})}}
	l := &listenerv3.Listener{Name: "waypoint"}
	var routes, clusters, endpoints []proto.Message
	for _, s := range []struct {
		host, vip    string
		hbone, http2 bool
		port         uint32
	}{{serverHost, serverVIP, true, false, 8080}, {backendHost, backendVIP, false, false, 8080}, {grpcHost, grpcVIP, false, true, grpcPort}} {
		name, cluster := s.host+":80", "outbound|80||"+s.host
		l.FilterChains = append(l.FilterChains, &listenerv3.FilterChain{
			Name: name,
			FilterChainMatch: &listenerv3.FilterChainMatch{
				PrefixRanges:    []*corev3.CidrRange{{AddressPrefix: s.vip, PrefixLen: wrapperspb.UInt32(32)}},
				DestinationPort: wrapperspb.UInt32(80),
			},
			Filters: []*listenerv3.Filter{{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: toAny(&hcmv3.HttpConnectionManager{
				StatPrefix:     name,
				RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: name}},
				HttpFilters:    []*hcmv3.HttpFilter{router},
			})}}},
		})
		routes = append(routes, &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{{
			Name: name, Domains: []string{"*"},
			Routes: []*routev3.Route{{
				Name:   "default",
				Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
				Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster}}},
			}},
		}}})
		c := &clusterv3.Cluster{Name: cluster, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{}, ConnectTimeout: durationpb.New(10 * time.Second)} // Istio's default
		if s.http2 { // as the control plane writes a gRPC port's cluster
			c.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": toAny(&httpopts.HttpProtocolOptions{
				UpstreamProtocolOptions: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
				}},
			})}
		}
		clusters = append(clusters, c)
		md := map[string]any{"tunnel": "", "workload": "server", "namespace": benchNS, "workload_name": "server"}
		if s.hbone {
			md["tunnel"] = "HBONE"
			md["identity"] = benchID("server").String()
		}
		meta, err := structpb.NewStruct(md)
		errs = append(errs, err)
		endpoints = append(endpoints, &endpointv3.ClusterLoadAssignment{ClusterName: cluster, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
					SocketAddress: &corev3.SocketAddress{Address: podB, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: s.port}}}}}},
				HealthStatus: corev3.HealthStatus_HEALTHY,
				Metadata:     &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"weft": meta}},
			}},
		}}})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	file := map[string][]json.RawMessage{}
	for list, ms := range map[string][]proto.Message{"listeners": {l}, "routes": routes, "clusters": clusters, "endpoints": endpoints} {
		for _, m := range ms {
			js, err := protojson.Marshal(m)
			if err != nil {
				return nil, err
			}
			file[list] = append(file[list], js)
		}
	}
	data, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		return nil, err
	}
	boot, err := config.ParseBootstrap(data)
	if err == nil {
		err = boot.Apply(config.NewStore())
	}
	if err != nil {
		return nil, fmt.Errorf("the waypoint's bootstrap file: %w", err)
	}
	return data, nil
}
