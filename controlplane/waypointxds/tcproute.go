package waypointxds

import (
	"fmt"
	"sort"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// BlackHoleCluster is the cluster without endpoints that a TCPRoute's
// connections go to when they have no backend to go to (Istio's name):
// the waypoint closes them, it never sends them elsewhere.
const BlackHoleCluster = "BlackHoleCluster"

// ReasonConflicted is the Accepted reason of a TCPRoute that another
// TCPRoute of the same Service port shadows: a stream has nothing to tell
// two TCPRoutes apart, so only the oldest applies.
const ReasonConflicted gwv1.RouteConditionReason = "Conflicted"

// Gateway API's bounds of a rule's backendRefs and of a weight, which the
// CRD enforces. An API server without that schema does not, and the
// waypoint refuses a split whose weights add up past 2^32 (a refusal would
// freeze the configuration of every Service on the waypoint), so the
// translation keeps HTTP, gRPC and TCP routes to them.
const (
	maxBackends = 16
	maxWeight   = 1000000
)

func tcpSource(r *gwv1.TCPRoute) *source {
	return &source{key: r.Namespace + "/" + r.Name, kind: kindTCPRoute, ns: r.Namespace, name: r.Name, created: r.CreationTimestamp,
		rules: streamRules(r.Spec.Rules, func(rr gwv1.TCPRouteRule) []gwv1.BackendRef { return rr.BackendRefs })}
}

// streamRules are the rules of a route of streams (TCPRoute, TLSRoute):
// each its weighted backends, nothing to match.
func streamRules[R any](rules []R, refs func(R) []gwv1.BackendRef) []rule {
	var out []rule
	for _, rr := range rules {
		var ru rule
		for _, br := range refs(rr) {
			ru.backends = append(ru.backends, backend{ref: br.BackendObjectReference, weight: weightOf(br.Weight)})
		}
		out = append(out, ru)
	}
	return out
}

// older orders routes as Gateway API resolves conflicts: the oldest, then
// by namespace/name.
func older(a, b *source) bool {
	if !a.created.Equal(&b.created) {
		return a.created.Before(&b.created)
	}
	return a.key < b.key
}

// tcpRoute finds the TCPRoute that applies to a Service port's TCP chain:
// of the producer TCPRoutes attached to it (as HTTPRoutes attach) with
// exactly one rule, the oldest. The others attached are recorded as
// shadowed, a route with another number of rules as unsupported; nil when
// none applies.
func (b *builder) tcpRoute(svc *corev1.Service, port corev1.ServicePort) *source {
	var cands []*source
	parents := map[*source][]int{}
	for _, o := range byNamespace(b.st.TCPRoutes, svc.Namespace) {
		r := o.(*gwv1.TCPRoute)
		src := tcpSource(r)
		for i, ref := range r.Spec.ParentRefs {
			if b.parentMatches(src.ns, ref, svc, port) {
				parents[src] = append(parents[src], i)
			}
		}
		if parents[src] != nil {
			cands = append(cands, src)
		}
	}
	sort.Slice(cands, func(i, j int) bool { return older(cands[i], cands[j]) })
	var win *source
	for _, src := range cands {
		rep := b.report(src)
		var p problem
		switch {
		case len(src.rules) != 1:
			p = problem{gwv1.RouteReasonUnsupportedValue, fmt.Sprintf(
				"a TCPRoute has %d rules here; a stream has nothing that tells rules apart, so a TCPRoute must have exactly one", len(src.rules))}
		case win != nil:
			p = problem{ReasonConflicted, fmt.Sprintf(
				"TCPRoute %s applies to port %d of Service %s/%s: of the TCPRoutes of a port the oldest applies (then the first by namespace/name), since a stream has nothing that tells them apart",
				win.key, port.Port, svc.Namespace, svc.Name)}
		default:
			win = src
			for _, i := range parents[src] {
				rep.attach(i, b.wp.Key())
			}
			continue
		}
		for _, i := range parents[src] {
			rep.reject(i, p)
		}
		b.note("%s %s: %s", src.kind, src.key, p.message)
	}
	return win
}

// tcpTarget is the tcp_proxy of a Service port's TCP chain: to the
// Service itself (self) when no TCPRoute applies, else to the route's
// backends by weight. A backend that cannot be used keeps its weight and
// goes to BlackHoleCluster, as Gateway API asks (its share of the
// connections is refused); so do all connections when no backend has a
// weight.
func (b *builder) tcpTarget(svc *corev1.Service, port corev1.ServicePort, self string) *listenerv3.Filter {
	src := b.tcpRoute(svc, port)
	if src == nil {
		return tcpProxy(self)
	}
	return b.tcpBackends(src, self)
}

// tcpBackends is the tcp_proxy to a TCPRoute's one rule's backends, by
// weight, with statistics under stat.
func (b *builder) tcpBackends(src *source, stat string) *listenerv3.Filter {
	var cws []*tcpv3.TcpProxy_WeightedCluster_ClusterWeight
	backends := src.rules[0].backends
	if len(backends) > maxBackends {
		b.unsupported(src, "the rule has %d backendRefs, more than Gateway API's %d; only the first %d are used", len(backends), maxBackends, maxBackends)
		backends = backends[:maxBackends]
	}
	for _, be := range backends {
		if be.weight <= 0 {
			continue // weight 0: no connection goes there
		}
		be.weight = min(be.weight, maxWeight)
		name, ok := b.backendCluster(src, be.ref)
		if !ok {
			name = b.blackHole()
		}
		cws = addWeight(cws, name, uint32(be.weight))
	}
	switch len(cws) {
	case 0:
		return tcpProxy(b.blackHole())
	case 1:
		return tcpProxy(cws[0].Name)
	}
	return tcpFilter(&tcpv3.TcpProxy{StatPrefix: stat, ClusterSpecifier: &tcpv3.TcpProxy_WeightedClusters{
		WeightedClusters: &tcpv3.TcpProxy_WeightedCluster{Clusters: cws}}})
}

// addWeight adds a cluster's weight, to its entry if it has one (two
// backends that cannot be used share BlackHoleCluster).
func addWeight(cws []*tcpv3.TcpProxy_WeightedCluster_ClusterWeight, name string, w uint32) []*tcpv3.TcpProxy_WeightedCluster_ClusterWeight {
	for _, cw := range cws {
		if cw.Name == name {
			cw.Weight += w
			return cws
		}
	}
	return append(cws, &tcpv3.TcpProxy_WeightedCluster_ClusterWeight{Name: name, Weight: w})
}

// blackHole returns BlackHoleCluster and has it emitted.
func (b *builder) blackHole() string {
	b.needBlackHole = true
	return BlackHoleCluster
}
