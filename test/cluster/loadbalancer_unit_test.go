package cluster

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestLoadBalancerFree: the lowest address not used, never the network's
// or the broadcast address, none when the pool is full.
func TestLoadBalancerFree(t *testing.T) {
	lb := &loadBalancer{pool: netip.MustParsePrefix("10.98.0.0/29")} // .1 to .6
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	used := map[netip.Addr]string{}
	var got []netip.Addr
	for {
		addr, ok := lb.free(used)
		if !ok {
			break
		}
		got = append(got, addr)
		used[addr] = "ns/svc"
	}
	want := []netip.Addr{a("10.98.0.1"), a("10.98.0.2"), a("10.98.0.3"), a("10.98.0.4"), a("10.98.0.5"), a("10.98.0.6")}
	if len(got) != len(want) {
		t.Fatalf("assigned %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("assigned %v, want %v", got, want)
		}
	}
	// A released address is the next one given.
	delete(used, a("10.98.0.3"))
	if addr, ok := lb.free(used); !ok || addr != a("10.98.0.3") {
		t.Errorf("after a release: %v %v, want 10.98.0.3", addr, ok)
	}
	// The pool is the harness's, routed to the nodes, and holds neither
	// the underlay, the pods nor the services.
	for _, p := range []netip.Prefix{underlayNet, clusterCIDR, serviceCIDR} {
		if p.Overlaps(loadBalancerPool) {
			t.Errorf("the load balancer pool %s overlaps %s", loadBalancerPool, p)
		}
	}
	if !underlayNet.Contains(outsideAddr) || outsideAddr == cpAddr {
		t.Errorf("the outside address %s: want one of the underlay that the control plane does not have", outsideAddr)
	}
	for i := 1; i <= maxNodes; i++ {
		if nodeAddr(i) == outsideAddr {
			t.Errorf("the outside address %s is node %d's", outsideAddr, i)
		}
	}
}

// TestLocalServices: only LoadBalancer Services of the harness with the
// policy Local and a health-check port are routed by their nodes' health,
// by each of their addresses in the pool.
func TestLocalServices(t *testing.T) {
	pool := netip.MustParsePrefix("10.98.0.0/24")
	svc := func(typ corev1.ServiceType, policy corev1.ServiceExternalTrafficPolicy, hc int32, class *string, ips ...string) *corev1.Service {
		s := &corev1.Service{Spec: corev1.ServiceSpec{Type: typ, ExternalTrafficPolicy: policy, HealthCheckNodePort: hc, LoadBalancerClass: class}}
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
		}
		return s
	}
	lb, local, cluster := corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, corev1.ServiceExternalTrafficPolicyCluster
	got := localServices([]*corev1.Service{
		svc(lb, local, 31000, nil, "10.98.0.1"),
		svc(lb, local, 31001, nil, "10.98.0.2", "192.0.2.1", "not an address", ""),
		svc(lb, cluster, 0, nil, "10.98.0.3"),
		svc(lb, local, 0, nil, "10.98.0.4"), // no health-check port yet
		svc(lb, local, 31002, ptrTo("example.com/other"), "10.98.0.5"),
		svc(corev1.ServiceTypeNodePort, local, 31003, nil, "10.98.0.6"),
		svc(lb, local, 31004, nil),
	}, pool)
	want := []localService{{netip.MustParseAddr("10.98.0.1"), 31000}, {netip.MustParseAddr("10.98.0.2"), 31001}}
	if !slices.Equal(got, want) {
		t.Errorf("localServices = %v, want %v", got, want)
	}
}
