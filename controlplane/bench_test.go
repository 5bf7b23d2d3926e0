package controlplane_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weftmesh/weft/controlplane"
	"github.com/weftmesh/weft/controlplane/internal/xdstest"
	"github.com/weftmesh/weft/internal/apitest"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// Scale of the push benchmark.
const (
	benchNamespaces  = 50
	benchPods        = 5000
	benchServices    = 1000
	benchClients     = 10
	benchPushRounds  = 15
	podsPerService   = benchPods / benchServices
	servicesPerNS    = benchServices / benchNamespaces
	podsPerNamespace = benchPods / benchNamespaces
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

// loadCluster creates benchPods pods and benchServices Services, each
// Service with an EndpointSlice of podsPerService pods, through the API
// server.
func loadCluster(b *testing.B, c *apitest.Cluster) {
	ctx := context.Background()
	err := parallel(benchPods, 16, func(i int) error {
		ns := fmt.Sprintf("bench-%d", i/podsPerNamespace)
		svc := (i % podsPerNamespace) / podsPerService
		_, err := c.RunPod(ctx, apitest.PodOnNode{
			Namespace: ns, Name: fmt.Sprintf("pod-%d", i), ServiceAccount: fmt.Sprintf("sa-%d", svc),
			Node: fmt.Sprintf("node-%d", i%20), IP: fmt.Sprintf("10.%d.%d.%d", 100+i/65536, (i/256)%256, i%256),
			Labels: map[string]string{"app": fmt.Sprintf("svc-%d", svc)},
		})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	err = parallel(benchServices, 16, func(i int) error {
		ns, local := fmt.Sprintf("bench-%d", i/servicesPerNS), i%servicesPerNS
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
		first := (i/servicesPerNS)*podsPerNamespace + local*podsPerService
		for p := first; p < first+podsPerService; p++ {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 100+p/65536, (p/256)%256, p%256)},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("pod-%d", p)},
			})
		}
		_, err := c.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
}

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
	loadCluster(b, c)
	b.Logf("loaded %d pods and %d services in %v", benchPods, benchServices, time.Since(start))
	cp := startControlPlane(b, c, "weft-bench", nil)
	zt, err := c.RunPod(context.Background(), apitest.PodOnNode{Namespace: "weft-bench", Name: "ztunnel", ServiceAccount: "ztunnel", Node: "node-0", IP: "10.99.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	tok := podToken(b, c, zt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var clients []*xdstest.Client
	var wg sync.WaitGroup
	for i := range benchClients {
		cl, err := xdstest.New(xdstest.Config{Address: cp.secureAddr(), TLS: cp.tlsConfig(b), Token: func() (string, error) { return tok, nil },
			NodeID: fmt.Sprintf("ztunnel~10.99.0.%d~ztunnel-%d.weft-bench~weft-bench.svc.cluster.local", i+1, i)})
		if err != nil {
			b.Fatal(err)
		}
		clients = append(clients, cl)
		wg.Add(1)
		go func() { defer wg.Done(); _ = cl.Run(ctx) }()
	}
	defer func() { cancel(); wg.Wait() }()
	for _, cl := range clients {
		if err := cl.Wait(ctx, workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool { return len(m) >= benchPods+benchServices }); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("%d clients hold %d resources each, %v after start", benchClients, len(clients[0].Resources(workloadpb.AddressTypeURL)), time.Since(start))

	var lat, apiWrite []time.Duration
	maxRes := 0
	for round := range benchPushRounds {
		name := fmt.Sprintf("pod-%d", round*331%benchPods)
		ns := fmt.Sprintf("bench-%d", (round*331%benchPods)/podsPerNamespace)
		uid := "Kubernetes//Pod/" + ns + "/" + name
		value := map[bool]string{true: "enabled", false: "pending"}[round%2 == 0]
		want := map[bool]workloadpb.TunnelProtocol{true: workloadpb.TunnelProtocol_HBONE, false: workloadpb.TunnelProtocol_NONE}[round%2 == 0]
		before := make([]int, len(clients))
		for i, cl := range clients {
			before[i] = len(cl.Responses())
		}
		t0 := time.Now()
		patch(b, c, "pods", ns, name, `{"metadata":{"annotations":{"ambient.istio.io/redirection":"`+value+`"}}}`)
		apiWrite = append(apiWrite, time.Since(t0))
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
		lat = append(lat, time.Since(t0))
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
			maxRes = max(maxRes, n)
		}
	}
	slices.Sort(lat)
	slices.Sort(apiWrite)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.Logf("push latency over %d rounds: min %v median %v max %v (the API write alone: median %v)", len(lat), lat[0], lat[len(lat)/2], lat[len(lat)-1], apiWrite[len(apiWrite)/2])
	if sum, n := histogram(b, cp, "pilot_proxy_convergence_time"); n > 0 {
		b.Logf("control plane: informer event to xDS send, mean over %d sends %.1f ms", n, sum/float64(n)*1000)
	}
	fmt.Printf("bench: xds_push_one_pod_ms %.1f\n", ms(lat[len(lat)/2]))
	fmt.Printf("bench: xds_push_one_pod_resources %d\n", maxRes)
	b.ReportMetric(ms(lat[len(lat)/2]), "push-ms")
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

// BenchmarkCASign measures CreateCertificate latency with 50 concurrent
// callers, each a pod asking for its own identity with its own bound token
// over TLS, against the real TokenReview API, with the TokenReview cache on
// (the default). It prints bench: ca_sign_p99_ms.
func BenchmarkCASign(b *testing.B) { benchCASign(b, true) }

// BenchmarkCASignUncached is BenchmarkCASign with a TokenReview on every
// request. It prints bench: ca_sign_uncached_p99_ms.
func BenchmarkCASignUncached(b *testing.B) { benchCASign(b, false) }

func benchCASign(b *testing.B, cached bool) {
	c := realAPI(b)
	const callers, perCaller = 50, 20
	ctx := context.Background()
	{
		rel := map[bool]string{true: "weft-casign", false: "weft-casign-nc"}[cached]
		cp := startControlPlane(b, c, rel, func(cfg *controlplane.Config) {
			if !cached {
				cfg.TokenReviewCacheTTL = -1
			}
		})
		var signers []func() (time.Duration, error)
		for i := range callers {
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
			cl := cp.caClient(b, podToken(b, c, pod), false)
			signers = append(signers, func() (time.Duration, error) {
				t0 := time.Now()
				_, err := cl.SignCSR(ctx, csr, id, 0)
				return time.Since(t0), err
			})
		}
		// Warm: a connection (TLS handshake) and, when cached, a review each.
		for _, s := range signers {
			if _, err := s(); err != nil {
				b.Fatal(err)
			}
		}
		lat := make([][]time.Duration, callers)
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i, s := range signers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perCaller {
					d, err := s()
					if err != nil {
						errs[i] = err
						return
					}
					lat[i] = append(lat[i], d)
				}
			}()
		}
		wg.Wait()
		var all []time.Duration
		for i := range lat {
			if errs[i] != nil {
				b.Fatal(errs[i])
			}
			all = append(all, lat[i]...)
		}
		slices.Sort(all)
		p := func(q float64) float64 { return float64(all[int(q*float64(len(all)-1))].Microseconds()) / 1000 }
		b.Logf("cached=%v: %d requests, p50 %.2f ms, p99 %.2f ms, max %.2f ms", cached, len(all), p(0.5), p(0.99), p(1))
		if cached {
			fmt.Printf("bench: ca_sign_p99_ms %.2f\n", p(0.99))
		} else {
			fmt.Printf("bench: ca_sign_uncached_p99_ms %.2f\n", p(0.99))
		}
	}
}
