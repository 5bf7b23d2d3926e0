package controlplane_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weftmesh/weft/controlplane/ca"
	"github.com/weftmesh/weft/controlplane/internal/xdstest"
	"github.com/weftmesh/weft/internal/apitest"
	"github.com/weftmesh/weft/internal/caclient"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/test/cluster"
)

// scale is how many objects a benchmark loads: pods, and Services of
// pods/services pods each, spread evenly over namespaces.
type scale struct{ pods, services, namespaces int }

func (s scale) podsPerService() int   { return s.pods / s.services }
func (s scale) servicesPerNS() int    { return s.services / s.namespaces }
func (s scale) podsPerNamespace() int { return s.pods / s.namespaces }

// podRef is pod i's namespace and name.
func (s scale) podRef(i int) (ns, name string) {
	return fmt.Sprintf("bench-%d", i/s.podsPerNamespace()), fmt.Sprintf("pod-%d", i)
}

// Scale of the push benchmarks.
var (
	pushScale  = scale{pods: 5000, services: 1000, namespaces: 50}
	largeScale = scale{pods: 10000, services: 2000, namespaces: 50}
)

const (
	benchClients    = 10
	benchPushRounds = 15
)

// parallel runs f(i) for i in [0, n) on workers goroutines.
func parallel(n, workers int, f func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		next int
		errs []error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// loadCluster creates sc's pods and Services, each Service with an
// EndpointSlice of its pods, through the API server.
func loadCluster(b *testing.B, c *apitest.Cluster, sc scale) {
	ctx := context.Background()
	err := parallel(sc.pods, 16, func(i int) error {
		ns, name := sc.podRef(i)
		svc := (i % sc.podsPerNamespace()) / sc.podsPerService()
		_, err := c.RunPod(ctx, apitest.PodOnNode{
			Namespace: ns, Name: name, ServiceAccount: fmt.Sprintf("sa-%d", svc),
			Node: fmt.Sprintf("node-%d", i%20), IP: benchPodIP(i),
			Labels: map[string]string{"app": fmt.Sprintf("svc-%d", svc)},
		})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	err = parallel(sc.services, 16, func(i int) error {
		ns, local := fmt.Sprintf("bench-%d", i/sc.servicesPerNS()), i%sc.servicesPerNS()
		name := fmt.Sprintf("svc-%d", local)
		if _, err := c.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
		port, pname := int32(8080), "http"
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port}},
		}
		first := (i/sc.servicesPerNS())*sc.podsPerNamespace() + local*sc.podsPerService()
		for p := first; p < first+sc.podsPerService(); p++ {
			_, pod := sc.podRef(p)
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses: []string{benchPodIP(p)},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod},
			})
		}
		_, err := c.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
}

func benchPodIP(i int) string {
	return fmt.Sprintf("10.%d.%d.%d", 100+i/65536, (i/256)%256, i%256)
}

// connectClients connects benchClients ztunnel-shaped clients over TLS
// with a ztunnel pod's token and waits until each holds want workload
// resources. They run until ctx ends; wait waits for them to stop.
func connectClients(ctx context.Context, b *testing.B, addr string, tlsCfg *tls.Config, tok string, want int) (clients []*xdstest.Client, wait func()) {
	var wg sync.WaitGroup
	for i := range benchClients {
		cl, err := xdstest.New(xdstest.Config{Address: addr, TLS: tlsCfg, Token: func() (string, error) { return tok, nil },
			NodeID: fmt.Sprintf("ztunnel~10.99.0.%d~ztunnel-%d.weft-bench~weft-bench.svc.cluster.local", i+1, i)})
		if err != nil {
			b.Fatal(err)
		}
		clients = append(clients, cl)
		wg.Add(1)
		go func() { defer wg.Done(); _ = cl.Run(ctx) }()
	}
	for _, cl := range clients {
		if err := cl.Wait(ctx, workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool { return len(m) >= want }); err != nil {
			b.Fatal(err)
		}
	}
	return clients, wg.Wait
}

// pushes is what benchPushRounds pod updates took: from the API write to
// the last client holding the change, and the API write alone (the
// baseline), sorted; and the most resources any client got for one.
type pushes struct {
	lat, apiWrite []time.Duration
	maxResources  int
}

func (p pushes) median() time.Duration         { return p.lat[len(p.lat)/2] }
func (p pushes) medianAPIWrite() time.Duration { return p.apiWrite[len(p.apiWrite)/2] }

// pushRounds flips one pod's redirection annotation per round, so its
// Workload's tunnel protocol changes, and times each change reaching every
// client.
func pushRounds(ctx context.Context, b *testing.B, c *apitest.Cluster, sc scale, clients []*xdstest.Client) pushes {
	var out pushes
	for round := range benchPushRounds {
		ns, name := sc.podRef(round * 331 % sc.pods)
		uid := "Kubernetes//Pod/" + ns + "/" + name
		value := map[bool]string{true: "enabled", false: "pending"}[round%2 == 0]
		want := map[bool]workloadpb.TunnelProtocol{true: workloadpb.TunnelProtocol_HBONE, false: workloadpb.TunnelProtocol_NONE}[round%2 == 0]
		before := make([]int, len(clients))
		for i, cl := range clients {
			before[i] = len(cl.Responses())
		}
		t0 := time.Now()
		patch(b, c, "pods", ns, name, `{"metadata":{"annotations":{"ambient.istio.io/redirection":"`+value+`"}}}`)
		out.apiWrite = append(out.apiWrite, time.Since(t0))
		var cw sync.WaitGroup
		errs := make([]error, len(clients))
		for i, cl := range clients {
			cw.Add(1)
			go func() {
				defer cw.Done()
				errs[i] = cl.Wait(ctx, workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
					return xdstest.Workload(m[uid]).GetTunnelProtocol() == want
				})
			}()
		}
		cw.Wait()
		out.lat = append(out.lat, time.Since(t0))
		for i, cl := range clients {
			if errs[i] != nil {
				b.Fatal(errs[i])
			}
			n := 0
			for _, r := range cl.Responses()[before[i]:] {
				if r.TypeURL == workloadpb.AddressTypeURL {
					n += len(r.Upserts) + len(r.Removes)
				}
			}
			out.maxResources = max(out.maxResources, n)
		}
	}
	slices.Sort(out.lat)
	slices.Sort(out.apiWrite)
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkXDSPush measures, with benchPods pods and benchServices Services
// loaded through a real API server and benchClients ztunnel-shaped clients
// connected over TLS, how long one pod update takes to reach every client
// (from the API write to the last client holding it) and how many resources
// each client is sent for it. It prints
//
//	bench: xds_push_one_pod_ms        median over benchPushRounds updates
//	bench: xds_push_one_pod_resources most resources any client got for one update
//
// The state goes through the real code path: API server, watches,
// informers, the workload controller, go-control-plane, gRPC over TLS.
func BenchmarkXDSPush(b *testing.B) {
	c := realAPI(b)
	start := time.Now()
	loadCluster(b, c, pushScale)
	b.Logf("loaded %d pods and %d services in %v", pushScale.pods, pushScale.services, time.Since(start))
	cp := startControlPlane(b, c, "weft-bench", nil)
	zt, err := c.RunPod(context.Background(), apitest.PodOnNode{Namespace: "weft-bench", Name: "ztunnel", ServiceAccount: "ztunnel", Node: "node-0", IP: "10.99.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	tok := podToken(b, c, zt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	clients, wait := connectClients(ctx, b, cp.secureAddr(), cp.tlsConfig(b), tok, pushScale.pods+pushScale.services)
	defer func() { cancel(); wait() }()
	b.Logf("%d clients hold %d resources each, %v after start", benchClients, len(clients[0].Resources(workloadpb.AddressTypeURL)), time.Since(start))

	p := pushRounds(ctx, b, c, pushScale, clients)
	b.Logf("push latency over %d rounds: min %v median %v max %v (the API write alone: median %v)", len(p.lat), p.lat[0], p.median(), p.lat[len(p.lat)-1], p.medianAPIWrite())
	if sum, n := histogram(b, cp, "pilot_proxy_convergence_time"); n > 0 {
		b.Logf("control plane: informer event to xDS send, mean over %d sends %.1f ms", n, sum/float64(n)*1000)
	}
	fmt.Printf("bench: xds_push_one_pod_ms %.1f\n", ms(p.median()))
	fmt.Printf("bench: xds_push_one_pod_resources %d\n", p.maxResources)
	b.ReportMetric(ms(p.median()), "push-ms")
}

// BenchmarkControlPlaneScale runs the weft-controlplane binary, built for
// the run, against a real API server holding largeScale pods and Services,
// with benchClients ztunnel-shaped clients connected over TLS, and prints
//
//	bench: controlplane_rss_mb_at_0_pods    its RSS before any pod exists (the baseline)
//	bench: controlplane_rss_mb_at_10k_pods  its RSS once every client holds the 10k pods
//	bench: controlplane_heap_mb_at_10k_pods its Go heap in use then
//	bench: xds_push_one_of_10k_ms           median over benchPushRounds pod updates, from
//	                                        the API write to the last client holding it
//	bench: xds_push_one_of_10k_api_write_ms the API write alone (the baseline)
//	bench: xds_push_one_of_10k_resources    the most resources a client got for one update
//
// Figures are the process's own (process_resident_memory_bytes, which is
// VmRSS, and go_memstats_heap_inuse_bytes from its /metrics).
func BenchmarkControlPlaneScale(b *testing.B) {
	c := realAPI(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	const ns = "weft-scale"
	cp := startBinary(ctx, b, c, ns, "--log-level", "warn")
	mb := func(text, metric string) float64 { return cluster.SumSeries(text, metric) / (1 << 20) }
	rss0 := mb(cp.metrics(b), "process_resident_memory_bytes")

	start := time.Now()
	loadCluster(b, c, largeScale)
	b.Logf("loaded %d pods and %d services in %v", largeScale.pods, largeScale.services, time.Since(start))
	roots := cp.roots(ctx, b)
	zt, err := c.RunPod(ctx, apitest.PodOnNode{Namespace: ns, Name: "ztunnel", ServiceAccount: "ztunnel", Node: "node-0", IP: "10.99.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	tlsCfg := &tls.Config{RootCAs: roots, ServerName: "istiod." + ns + ".svc", MinVersion: tls.VersionTLS12}
	clients, wait := connectClients(ctx, b, cp.secure, tlsCfg, podToken(b, c, zt), largeScale.pods+largeScale.services)
	defer func() { cancel(); wait() }()
	b.Logf("%d clients hold %d resources each, %v after the load began", benchClients, len(clients[0].Resources(workloadpb.AddressTypeURL)), time.Since(start))

	p := pushRounds(ctx, b, c, largeScale, clients)
	text := cp.metrics(b)
	b.Logf("push latency over %d rounds: min %v median %v max %v", len(p.lat), p.lat[0], p.median(), p.lat[len(p.lat)-1])
	fmt.Printf("bench: controlplane_rss_mb_at_0_pods %.1f\n", rss0)
	fmt.Printf("bench: controlplane_rss_mb_at_10k_pods %.1f\n", mb(text, "process_resident_memory_bytes"))
	fmt.Printf("bench: controlplane_heap_mb_at_10k_pods %.1f\n", mb(text, "go_memstats_heap_inuse_bytes"))
	fmt.Printf("bench: xds_push_one_of_10k_ms %.1f\n", ms(p.median()))
	fmt.Printf("bench: xds_push_one_of_10k_api_write_ms %.1f\n", ms(p.medianAPIWrite()))
	fmt.Printf("bench: xds_push_one_of_10k_resources %d\n", p.maxResources)
}

// binaryCP is a weft-controlplane process, built for the run.
type binaryCP struct {
	c               *apitest.Cluster
	ns              string
	secure, monitor string
}

// startBinary runs the weft-controlplane binary against c for release
// namespace ns, with the chart's settings but for its addresses (loopback)
// and any args, until the benchmark ends, and waits until it is ready.
func startBinary(ctx context.Context, b *testing.B, c *apitest.Cluster, ns string, args ...string) *binaryCP {
	b.Helper()
	bin := cluster.BuildBinary(b, "./controlplane/cmd/weft-controlplane", "weft-controlplane")
	if err := c.EnsureNamespace(ctx, ns, nil); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig); err != nil {
		b.Fatal(err)
	}
	cp := &binaryCP{c: c, ns: ns, secure: freeAddr(b), monitor: freeAddr(b)}
	logf, err := os.Create(filepath.Join(dir, "controlplane.log"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { logf.Close() })
	cmd := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig, "--namespace", ns, "--secure-addr", cp.secure, "--monitor-addr", cp.monitor}, args...)...)
	cmd.Env = append(os.Environ(), "CA_TRUSTED_NODE_ACCOUNTS="+ns+"/ztunnel")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	for {
		if resp, err := http.Get("http://" + cp.monitor + "/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return cp
			}
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logf.Name())
			b.Fatalf("weft-controlplane exited before it was ready: %v\n%s", err, log)
		case <-ctx.Done():
			b.Fatal("weft-controlplane not ready")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// metrics returns the process's /metrics.
func (cp *binaryCP) metrics(b *testing.B) string {
	b.Helper()
	resp, err := http.Get("http://" + cp.monitor + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	return string(body)
}

// roots returns the mesh roots the process published.
func (cp *binaryCP) roots(ctx context.Context, b *testing.B) *x509.CertPool {
	b.Helper()
	cm, err := cp.c.Kube.CoreV1().ConfigMaps(cp.ns).Get(ctx, ca.RootCertConfigMap, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	roots, err := spiffe.ParseRoots([]byte(cm.Data[ca.RootCertKey]))
	if err != nil {
		b.Fatal(err)
	}
	return roots
}

// freeAddr is a loopback address with a port free for a process to take.
func freeAddr(tb testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// histogram returns the sum and count of a histogram metric of the control
// plane, over all label values.
func histogram(tb testing.TB, r *running, name string) (float64, uint64) {
	mfs, err := r.cp.Registry().Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetHistogram().GetSampleSum()
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return sum, n
}

// BenchmarkCASign measures CreateCertificate latency of the
// weft-controlplane binary (built for the run, with the chart's settings)
// with 50 concurrent callers, each a pod asking for its own identity with
// its own bound token over TLS, against the real TokenReview API, with the
// TokenReview cache on (the default). It prints bench: ca_sign_p99_ms, and
// its floor: the same callers in the same way calling the same server's
// gRPC health check over their own TLS connections (ca_grpc_floor_p99_ms),
// what any unary call costs on the machine at that concurrency, and the
// ratio of the two (ca_sign_p99_vs_floor).
func BenchmarkCASign(b *testing.B) { benchCASign(b, true) }

// BenchmarkCASignUncached is BenchmarkCASign with a TokenReview on every
// request (--token-review-cache -1s). It prints bench:
// ca_sign_uncached_p99_ms. The control plane's API client is held to the
// chart's request rate (--kube-qps 50), so with a review per request the
// 50 callers get about 50 certificates a second between them.
func BenchmarkCASignUncached(b *testing.B) { benchCASign(b, false) }

// caBenchCallers and caBenchCalls are the concurrent callers and the calls
// each makes, one after another.
const caBenchCallers, caBenchCalls = 50, 20

func benchCASign(b *testing.B, cached bool) {
	c := realAPI(b)
	ctx := context.Background()
	rel := map[bool]string{true: "weft-casign", false: "weft-casign-nc"}[cached]
	var args []string
	if !cached {
		args = []string{"--token-review-cache", "-1s"}
	}
	cp := startBinary(ctx, b, c, rel, args...)
	roots := cp.roots(ctx, b)
	serverName := "istiod." + rel + ".svc"
	var signers, checks []func() error
	for i := range caBenchCallers {
		pod, err := c.RunPod(ctx, apitest.PodOnNode{Namespace: rel + "-apps", Name: fmt.Sprintf("caller-%d", i),
			ServiceAccount: fmt.Sprintf("sa-%d", i), Node: "node-1", IP: fmt.Sprintf("10.98.%d.%d", map[bool]int{true: 1, false: 2}[cached], i+1)})
		if err != nil {
			b.Fatal(err)
		}
		id := spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: pod.Namespace, ServiceAccount: pod.Spec.ServiceAccountName}
		_, csr, err := spiffe.NewCSR(id)
		if err != nil {
			b.Fatal(err)
		}
		token := podToken(b, c, pod)
		cl, err := caclient.New(caclient.Config{Address: cp.secure, Roots: roots, ServerName: serverName,
			Token: func() (string, error) { return token, nil }})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cl.Close() })
		signers = append(signers, func() error {
			_, err := cl.SignCSR(ctx, csr, id, 0)
			return err
		})
		if cached {
			conn, err := grpc.NewClient(cp.secure, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: serverName})))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { conn.Close() })
			hc := healthpb.NewHealthClient(conn)
			checks = append(checks, func() error {
				resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
				if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					err = fmt.Errorf("health: %v", resp.GetStatus())
				}
				return err
			})
		}
	}
	sign := closedLoop(b, signers)
	b.Logf("cached=%v: %s", cached, sign)
	if !cached {
		fmt.Printf("bench: ca_sign_uncached_p99_ms %.2f\n", sign.p99ms())
		return
	}
	floor := closedLoop(b, checks)
	b.Logf("health check: %s", floor)
	fmt.Printf("bench: ca_sign_p99_ms %.2f\n", sign.p99ms())
	fmt.Printf("bench: ca_grpc_floor_p99_ms %.2f\n", floor.p99ms())
	fmt.Printf("bench: ca_sign_p99_vs_floor %.2f\n", sign.p99ms()/floor.p99ms())
}

// latencies are the sorted durations of a closedLoop's calls.
type latencies []time.Duration

func (l latencies) ms(q float64) float64 {
	return float64(l[int(q*float64(len(l)-1))].Microseconds()) / 1000
}

func (l latencies) p99ms() float64 { return l.ms(0.99) }

func (l latencies) String() string {
	return fmt.Sprintf("%d calls, p50 %.2f ms, p99 %.2f ms, max %.2f ms", len(l), l.ms(0.5), l.ms(0.99), l.ms(1))
}

// closedLoop warms each caller with one call (a connection, its TLS
// handshake and, for a signer, its token's review), then runs them all at
// once, each making caBenchCalls calls one after another, and returns the
// latencies of those.
func closedLoop(b *testing.B, callers []func() error) latencies {
	b.Helper()
	for _, call := range callers {
		if err := call(); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([][]time.Duration, len(callers))
	errs := make([]error, len(callers))
	var wg sync.WaitGroup
	for i, call := range callers {
		wg.Go(func() {
			for range caBenchCalls {
				t0 := time.Now()
				if err := call(); err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		})
	}
	wg.Wait()
	var all latencies
	for i := range lat {
		if errs[i] != nil {
			b.Fatal(errs[i])
		}
		all = append(all, lat[i]...)
	}
	slices.Sort(all)
	return all
}
