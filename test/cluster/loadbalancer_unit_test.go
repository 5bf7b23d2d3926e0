package cluster

import (
	"net/netip"
	"testing"
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
