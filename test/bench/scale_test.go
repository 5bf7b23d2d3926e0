package bench

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/test/cluster"
)

// scaleSteps are the mesh sizes BenchmarkZtunnelScale grows ztunnel's store
// to, in workloads (a Service per 10 of them).
var scaleSteps = []int{1000, 10000, 50000}

// BenchmarkZtunnelScale measures how the real ztunnel's cost grows with the
// mesh it is told about: with its two pods, the control plane publishes
// synthesized workloads elsewhere in the mesh (each with an address, an
// identity and a Service of 10), 1k, then 10k, then 50k in all, and for
// each size prints
//
//	ztunnel_rss_mb_at_<n>_workloads   its RSS once it holds them
//	ztunnel_heap_mb_at_<n>_workloads  its Go heap and stacks in use, after a collection
//	xds_push_<n>_workloads_ms         from the publish of the step's workloads to ztunnel's
//	                                  config dump listing them all (polled every 50 ms)
//
// beside ztunnel_rss_mb_at_2_workloads, the baseline of the same process.
func BenchmarkZtunnelScale(b *testing.B) {
	if why := cluster.SkipReason(); why != "" {
		b.Skip(why)
	}
	p := newPodPair(b)
	pid := p.zt.pid()
	time.Sleep(time.Second)
	fmt.Printf("bench: ztunnel_rss_mb_at_2_workloads %.1f\n", float64(procRSS(b, pid))/(1<<20))
	for range b.N {
		var published []string
		have := 0
		for _, n := range scaleSteps {
			up := map[string]*workloadpb.Address{}
			for i := have; i < n; i++ {
				for _, a := range scaleAddresses(i) {
					key := a.GetWorkload().GetUid()
					if s := a.GetService(); s != nil {
						key = s.GetNamespace() + "/" + s.GetHostname()
					}
					up[key] = a
					published = append(published, key)
				}
			}
			t0 := time.Now()
			p.cp.publish(b, up, nil)
			deadline := time.Now().Add(5 * time.Minute)
			for {
				d, err := p.zt.dump()
				if err == nil && len(d.Workloads) >= n+2 {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("ztunnel does not list %d workloads after 5 minutes (%v)\n%s", n+2, err, p.zt.logTail())
				}
				time.Sleep(50 * time.Millisecond)
			}
			push := time.Since(t0)
			have = n
			mem := p.zt.memInUse(b)
			label := fmt.Sprintf("%dk", n/1000)
			fmt.Printf("bench: xds_push_%s_workloads_ms %.0f\n", label, float64(push.Milliseconds()))
			fmt.Printf("bench: ztunnel_rss_mb_at_%s_workloads %.1f\n", label, float64(procRSS(b, pid))/(1<<20))
			fmt.Printf("bench: ztunnel_heap_mb_at_%s_workloads %.1f\n", label, mem/(1<<20))
		}
		p.cp.publish(b, nil, published)
	}
}

// scaleAddresses is the i-th synthesized workload of the mesh, on another
// node, and every tenth time the Service it and the nine before it back.
func scaleAddresses(i int) []*workloadpb.Address {
	ns := fmt.Sprintf("scale-%d", i/1000)
	svc := fmt.Sprintf("svc-%d", i/10)
	host := svc + "." + ns + ".svc.cluster.local"
	w := &workloadpb.Workload{
		Uid: "Kubernetes//Pod/" + ns + "/pod-" + fmt.Sprint(i), Name: "pod-" + fmt.Sprint(i), Namespace: ns,
		ServiceAccount: svc, Node: "node-far", TunnelProtocol: workloadpb.TunnelProtocol_HBONE,
		Addresses:    [][]byte{netip.AddrFrom4([4]byte{10, 200 + byte(i>>16), byte(i >> 8), byte(i)}).AsSlice()},
		WorkloadName: svc, CanonicalName: svc, CanonicalRevision: "v1",
		Services: map[string]*workloadpb.PortList{ns + "/" + host: {Ports: []*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}}}},
	}
	out := []*workloadpb.Address{{Type: &workloadpb.Address_Workload{Workload: w}}}
	if i%10 == 9 {
		n := i / 10
		out = append(out, &workloadpb.Address{Type: &workloadpb.Address_Service{Service: &workloadpb.Service{
			Name: svc, Namespace: ns, Hostname: host,
			Addresses: []*workloadpb.NetworkAddress{{Address: netip.AddrFrom4([4]byte{10, 97, byte(n >> 8), byte(n)}).AsSlice()}},
			Ports:     []*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}},
		}}})
	}
	return out
}
