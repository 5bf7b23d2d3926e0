package proxy

import (
	"testing"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
)

func weightedTCPFilter(t testing.TB, weights map[string]uint32, order ...string) *listenerv3.Filter {
	wc := &tcpv3.TcpProxy_WeightedCluster{}
	for _, name := range order {
		wc.Clusters = append(wc.Clusters, &tcpv3.TcpProxy_WeightedCluster_ClusterWeight{Name: name, Weight: weights[name]})
	}
	return &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{
		TypedConfig: mustAny(t, &tcpv3.TcpProxy{StatPrefix: "tcp", ClusterSpecifier: &tcpv3.TcpProxy_WeightedClusters{WeightedClusters: wc}})}}
}

// TestTCPWeightedClusters: a tcp_proxy with weighted_clusters sends each
// stream to one cluster picked by weight: 1:0 sends every stream to the
// first, 0:1 to the second, 1:1 some to each; a stream the chain's network
// RBAC denies reaches neither.
func TestTCPWeightedClusters(t *testing.T) {
	m := newMesh(t)
	echoA, connsA := echoServer(t)
	echoB, connsB := echoServer(t)
	const a, b = "outbound|80||a", "outbound|80||b"
	m.applyClusters(nil, map[string]clusterSpec{a: {eps: []endpointSpec{{addr: echoA}}}, b: {eps: []endpointSpec{{addr: echoB}}}})
	const n = 40
	for _, tc := range []struct {
		name         string
		wa, wb       uint32
		deny         bool
		someA, someB bool // the backend gets at least one stream
		noA, noB     bool // the backend gets none
	}{
		{name: "1:0", wa: 1, wb: 0, someA: true, noB: true},
		{name: "0:1", wa: 0, wb: 1, noA: true, someB: true},
		{name: "1:1", wa: 1, wb: 1, someA: true, someB: true},
		{name: "1:1 denied", wa: 1, wb: 1, deny: true, noA: true, noB: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fs []*listenerv3.Filter
			if tc.deny {
				fs = append(fs, netRBACFilter(t, &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{
					"deny-all": {Permissions: anyPermission, Principals: anyPrincipal}}}))
			}
			fs = append(fs, weightedTCPFilter(t, map[string]uint32{a: tc.wa, b: tc.wb}, a, b))
			m.applyListener(&listenerv3.FilterChain{Name: "tcp", FilterChainMatch: vipMatch(), Filters: fs})
			beforeA, beforeB := connsA.Load(), connsB.Load()
			for range n {
				if got := m.tcpRelays(t); got == tc.deny {
					t.Fatalf("relayed %v with deny %v", got, tc.deny)
				}
			}
			gotA, gotB := connsA.Load()-beforeA, connsB.Load()-beforeB
			if !tc.deny && gotA+gotB != n {
				t.Errorf("the backends got %d+%d streams, want %d", gotA, gotB, n)
			}
			if tc.someA && gotA == 0 || tc.someB && gotB == 0 || tc.noA && gotA != 0 || tc.noB && gotB != 0 {
				t.Errorf("weights %d:%d: a got %d, b got %d of %d streams", tc.wa, tc.wb, gotA, gotB, n)
			}
		})
	}
}

// TestTCPWeightedPickFixed: with a fixed random source the pick follows
// the weights' intervals in order.
func TestTCPWeightedPickFixed(t *testing.T) {
	var x uint64
	m := newMesh(t, func(c *Config) { c.Rand = func(max uint64) uint64 { return x % max } })
	echoA, connsA := echoServer(t)
	echoB, connsB := echoServer(t)
	const a, b = "outbound|80||a", "outbound|80||b"
	m.applyClusters(nil, map[string]clusterSpec{a: {eps: []endpointSpec{{addr: echoA}}}, b: {eps: []endpointSpec{{addr: echoB}}}})
	m.applyListener(&listenerv3.FilterChain{Name: "tcp", FilterChainMatch: vipMatch(),
		Filters: []*listenerv3.Filter{weightedTCPFilter(t, map[string]uint32{a: 3, b: 1}, a, b)}})
	for _, tc := range []struct {
		x            uint64
		wantA, wantB int32
	}{{0, 1, 0}, {2, 1, 0}, {3, 0, 1}} {
		x = tc.x
		beforeA, beforeB := connsA.Load(), connsB.Load()
		if !m.tcpRelays(t) {
			t.Fatalf("x=%d: not relayed", tc.x)
		}
		if gotA, gotB := connsA.Load()-beforeA, connsB.Load()-beforeB; gotA != tc.wantA || gotB != tc.wantB {
			t.Errorf("x=%d of 4: a got %d, b got %d; want %d, %d", tc.x, gotA, gotB, tc.wantA, tc.wantB)
		}
	}
}
