package waypointxds

import (
	"math"

	"net/netip"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"testing"

	"github.com/weftmesh/weft/controlplane/ambient"
)

// TestTCPRouteOutcomes checks the conditions of each TCPRoute of
// testdata/tcp-route.yaml.
func TestTCPRouteOutcomes(t *testing.T) {
	got := outcomesOf(t, load(t, "testdata/tcp-route.yaml"))
	ok := want{"True", "ResolvedRefs", ""}
	for _, tc := range []struct {
		route                  string
		accepted, resolvedRefs want
	}{
		{"TCPRoute shop/split", want{"True", "Accepted", "through waypoint shop/waypoint"}, ok},
		{"TCPRoute shop/late", want{"False", "Conflicted", "TCPRoute shop/split applies to port 5432 of Service shop/db"}, ok},
		{"TCPRoute shop/detect", want{"True", "Accepted", ""}, want{"False", "BackendNotFound", "backend Service shop/ghost not found"}},
		{"TCPRoute shop/zero", want{"True", "Accepted", ""}, ok},
		{"TCPRoute shop/bad-refs", want{"True", "Accepted", ""}, want{"False", "BackendNotFound", "no ReferenceGrant in other lets TCPRoutes of namespace shop refer to Service db-v1"}},
		{"TCPRoute shop/http-port", want{"False", "NoMatchingParent", "route them with an HTTPRoute"}, ok},
		{"TCPRoute other/consumer", want{"False", "UnsupportedValue", "consumer routes"}, want{"False", "BackendNotFound", "other/evil"}},
	} {
		t.Run(tc.route, func(t *testing.T) {
			o, found := got[tc.route]
			if !found {
				t.Fatalf("no outcome for %s", tc.route)
			}
			checkOutcome(t, o, tc.accepted, tc.resolvedRefs)
		})
	}
}

// TestTCPRouteChains compiles the TCP chains of testdata/tcp-route.yaml
// with the waypoint's compiler and checks where their streams go: the
// oldest route's split, BlackHoleCluster for what has no usable backend,
// and the Service itself where no TCPRoute applies (the consumer route
// from another namespace redirects nothing).
func TestTCPRouteChains(t *testing.T) {
	f := load(t, "testdata/tcp-route.yaml")
	res, _ := Build(testMesh, ambient.NewWaypoint(f.gateways[0], ""), f.st)
	snap := compiled(t, res)
	const v1, v2 = "outbound|5432||db-v1.shop.svc.cluster.local", "outbound|5432||db-v2.shop.svc.cluster.local"
	// picks lists the cluster of each number below the chain's total.
	picks := func(target string) []string {
		ch := snap.Chain(netip.MustParseAddrPort(target))
		if ch == nil || !ch.TCP() {
			t.Fatalf("%s: no TCP chain", target)
		}
		var total uint64
		ch.PickTCP(func(max uint64) uint64 { total = max; return 0 })
		var out []string
		for x := range max(total, 1) {
			out = append(out, ch.PickTCP(func(uint64) uint64 { return x }))
		}
		return out
	}
	count := func(ps []string, name string) int {
		n := 0
		for _, p := range ps {
			if p == name {
				n++
			}
		}
		return n
	}
	if ps := picks("10.96.2.10:5432"); len(ps) != 100 || count(ps, v1) != 90 || count(ps, v2) != 10 {
		t.Errorf("db:5432 splits %d/%d of %d between v1 and v2, want 90/10 of 100", count(ps, v1), count(ps, v2), len(ps))
	}
	if ps := picks("10.96.2.10:7000"); len(ps) != 4 || count(ps, v1) != 3 || count(ps, BlackHoleCluster) != 1 {
		t.Errorf("db:7000 picks %q, want v1 3 of 4 and the rest refused", ps)
	}
	for _, target := range []string{"10.96.2.12:6379", "10.96.2.13:5672"} {
		if ps := picks(target); len(ps) != 1 || ps[0] != BlackHoleCluster {
			t.Errorf("%s picks %q, want BlackHoleCluster only", target, ps)
		}
	}
	if a := snap.Assignments[BlackHoleCluster]; a == nil || len(a.Endpoints) != 0 {
		t.Errorf("BlackHoleCluster's endpoints: %+v, want an empty assignment", a)
	}
	// The HTTP-only port has no TCP chain, whatever the TCPRoute says.
	if ch := snap.Chain(netip.MustParseAddrPort("10.96.2.10:8080")); ch == nil || ch.TCP() {
		t.Errorf("db:8080 chain %+v, want the HTTP chain", ch)
	}
}

// TestTCPRouteHugeWeights: weights past Gateway API's maximum (1,000,000,
// which the CRD enforces; an API server without that schema does not)
// must not produce a tcp_proxy the waypoint refuses: a NACK would freeze
// the configuration of every Service on the waypoint. They are clamped to
// the maximum.
func TestTCPRouteHugeWeights(t *testing.T) {
	// copies of the route's two backends: 2, and 2500 (5000 backendRefs,
	// past the schema's 16: 5000 times 1,000,000 is still past 2^32).
	for _, copies := range []int{2, 2500} {
		f := load(t, "testdata/tcp-route.yaml")
		o, _, _ := f.st.TCPRoutes.GetByKey("shop/split")
		r := o.(*gwv1.TCPRoute).DeepCopy()
		huge := int32(math.MaxInt32)
		two := r.Spec.Rules[0].BackendRefs
		r.Spec.Rules[0].BackendRefs = nil
		for range copies {
			for _, br := range two {
				br.Weight = &huge
				r.Spec.Rules[0].BackendRefs = append(r.Spec.Rules[0].BackendRefs, br)
			}
		}
		if err := f.st.TCPRoutes.Update(r); err != nil {
			t.Fatal(err)
		}
		res, _ := Build(testMesh, ambient.NewWaypoint(f.gateways[0], ""), f.st)
		snap := compiled(t, res)
		ch := snap.Chain(netip.MustParseAddrPort("10.96.2.10:5432"))
		if ch == nil || len(ch.TCPWeighted) != 2 || ch.TCPWeighted[0].Weight != ch.TCPWeighted[1].Weight {
			t.Fatalf("%d backendRefs: db:5432 weighted clusters %+v, want v1 and v2 with equal weights", 2*copies, ch)
		}
	}
}
