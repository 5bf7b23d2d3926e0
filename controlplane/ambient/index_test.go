package ambient

import (
	"log/slog"
	"slices"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1alpha1 "istio.io/api/meta/v1alpha1"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/authpolicy"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// world is a set of in-memory stores the index reads, as informers would
// fill them.
type world struct {
	t      *testing.T
	stores Stores
	ix     *index
}

func newWorld(t *testing.T) *world {
	newStore := func(extra cache.Indexers) cache.Indexer {
		idx := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
		for k, v := range extra {
			idx[k] = v
		}
		return cache.NewIndexer(cache.MetaNamespaceKeyFunc, idx)
	}
	s := Stores{
		Pods: newStore(cache.Indexers{IndexPodNode: PodNodeIndex}), Services: newStore(nil), Namespaces: newStore(nil),
		Nodes: newStore(nil), GatewayClasses: newStore(nil),
		EndpointSlices: newStore(cache.Indexers{IndexServiceName: SliceServiceIndex}),
		Gateways:       newStore(nil), Policies: newStore(nil), PeerAuths: newStore(nil),
		ServiceEntries: newStore(nil), WorkloadEntries: newStore(nil),
	}
	return &world{t: t, stores: s, ix: newIndex(testCfg, s, slog.New(slog.DiscardHandler))}
}

func (w *world) store(kind string) cache.Indexer {
	switch kind {
	case kindPod:
		return w.stores.Pods
	case kindService:
		return w.stores.Services
	case kindEndpointSlice:
		return w.stores.EndpointSlices
	case kindNamespace:
		return w.stores.Namespaces
	case kindGateway:
		return w.stores.Gateways
	case kindPolicy:
		return w.stores.Policies
	case kindPeerAuth:
		return w.stores.PeerAuths
	case kindNode:
		return w.stores.Nodes
	case kindGatewayClass:
		return w.stores.GatewayClasses
	case kindServiceEntry:
		return w.stores.ServiceEntries
	case kindWorkloadEntry:
		return w.stores.WorkloadEntries
	}
	panic(kind)
}

// set adds or replaces objects and returns the batch an informer would
// have produced.
func (w *world) set(kind string, objs ...any) batch {
	b := batch{}
	for _, o := range objs {
		if err := w.store(kind).Update(o); err != nil {
			w.t.Fatal(err)
		}
		b.add(kind, keyOf(o))
	}
	return b
}

func (w *world) del(kind string, obj any) batch {
	if err := w.store(kind).Delete(obj); err != nil {
		w.t.Fatal(err)
	}
	b := batch{}
	b.add(kind, keyOf(obj))
	return b
}

// names returns the sorted names of an update's changed and removed
// addresses.
func names(u *Update) (changed, removed []string) {
	for k := range u.Addresses {
		changed = append(changed, k)
	}
	sort.Strings(changed)
	removed = slices.Clone(u.AddressRemoved)
	sort.Strings(removed)
	return changed, removed
}

func (w *world) workload(uid string) *workloadpb.Workload {
	a := w.ix.addresses[uid]
	if a == nil {
		w.t.Fatalf("no workload %s published", uid)
	}
	return a.GetWorkload()
}

func ns(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func endpointSlice(ns, name, svc string, port int32, pods ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		Ports:      []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(port)}},
	}
	for _, p := range pods {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: p}})
	}
	return s
}

func selectorPolicy(ns, name string, labels map[string]string) *securityv1.AuthorizationPolicy {
	p := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 1}}
	p.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: labels}
	p.Spec.Rules = []*securityv1beta1.Rule{{}}
	return p
}

const cartSvc = "shop/cart.shop.svc.cluster.local"

func node(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func resourceQuantity(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

func onNode(name string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = name } }

// TestIndexGatewayClassWaypointFor: a waypoint without istio.io/waypoint-for
// of its own takes the traffic its GatewayClass's label says, follows that
// label's changes, and its own label wins over it.
func TestIndexGatewayClassWaypointFor(t *testing.T) {
	w := newWorld(t)
	class := func(labels map[string]string) *gwv1.GatewayClass {
		return &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "istio-waypoint", Labels: labels}}
	}
	addr := gwv1.GatewayStatusAddress{Type: ptr(gwv1.HostnameAddressType), Value: "waypoint.shop.svc.cluster.local"}
	w.set(kindNamespace, ns("shop", map[string]string{"istio.io/use-waypoint": "waypoint"}))
	w.set(kindGatewayClass, class(nil))
	w.set(kindGateway, gateway("istio-waypoint", nil, addr))
	w.set(kindPod, newPod("shop", "cart-1"))
	w.ix.process(w.ix.all())
	const pod = "Kubernetes//Pod/shop/cart-1"
	if w.workload(pod).GetWaypoint() != nil {
		t.Fatal("a pod bound to a service waypoint")
	}
	// The class says workload: the pod binds, through the Gateway's event.
	u := w.ix.process(w.set(kindGatewayClass, class(map[string]string{"istio.io/waypoint-for": "workload"})))
	if changed, _ := names(u); !cmp.Equal(changed, []string{pod}) || w.workload(pod).GetWaypoint() == nil {
		t.Errorf("class for workload: published %v, pod waypoint %v", changed, w.workload(pod).GetWaypoint())
	}
	// The Gateway's own label wins.
	w.ix.process(w.set(kindGateway, gateway("istio-waypoint", map[string]string{"istio.io/waypoint-for": "service"}, addr)))
	if w.workload(pod).GetWaypoint() != nil {
		t.Error("the Gateway says service, yet the pod keeps its waypoint")
	}
	// A class of another name changes nothing.
	other := class(map[string]string{"istio.io/waypoint-for": "none"})
	other.Name = "other"
	if changed, _ := names(w.ix.process(w.set(kindGatewayClass, other))); len(changed) > 0 {
		t.Errorf("another class's label published %v", changed)
	}
}

// TestIndexLocality: a workload's locality is its node's topology labels;
// a change of them republishes the node's pods and no other, and a change
// of anything else of the node publishes nothing.
func TestIndexLocality(t *testing.T) {
	w := newWorld(t)
	w.set(kindNamespace, ns("shop", nil))
	zoneA := map[string]string{"topology.kubernetes.io/region": "r1", "topology.kubernetes.io/zone": "a", "topology.istio.io/subzone": "rack-1"}
	w.set(kindNode, node("n1", zoneA), node("n2", nil))
	w.set(kindPod, newPod("shop", "on-1", onNode("n1")), newPod("shop", "on-2", onNode("n2")), newPod("shop", "nowhere"))
	w.ix.process(w.ix.all())
	loc := func(pod string) *workloadpb.Locality { return w.workload("Kubernetes//Pod/shop/" + pod).GetLocality() }
	if l := loc("on-1"); l.GetRegion() != "r1" || l.GetZone() != "a" || l.GetSubzone() != "rack-1" {
		t.Errorf("on-1 locality %v, want r1/a/rack-1", l)
	}
	if l := loc("on-2"); l != nil {
		t.Errorf("on-2, on a node without topology labels, has locality %v", l)
	}
	if l := loc("nowhere"); l != nil {
		t.Errorf("a pod on no node has locality %v", l)
	}

	// The node's status (not its labels) changes: nothing to publish.
	n1 := node("n1", zoneA)
	n1.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: *resourceQuantity("110")}
	if changed, _ := names(w.ix.process(w.set(kindNode, n1))); len(changed) > 0 {
		t.Errorf("a node status change published %v", changed)
	}
	// n2 gets a zone: its pod, and only it, is published again.
	u := w.ix.process(w.set(kindNode, node("n2", map[string]string{"topology.kubernetes.io/zone": "b"})))
	if changed, _ := names(u); !cmp.Equal(changed, []string{"Kubernetes//Pod/shop/on-2"}) {
		t.Errorf("n2 zoned: published %v, want on-2 only", changed)
	}
	if l := loc("on-2"); l.GetZone() != "b" || l.GetRegion() != "" {
		t.Errorf("on-2 locality %v, want zone b", l)
	}
	// n1 loses its labels, then goes: on-1 has no locality.
	w.ix.process(w.set(kindNode, node("n1", nil)))
	if l := loc("on-1"); l != nil {
		t.Errorf("on-1 locality %v after its node lost its labels", l)
	}
	w.ix.process(w.set(kindNode, node("n1", zoneA)))
	u = w.ix.process(w.del(kindNode, node("n1", zoneA)))
	if changed, _ := names(u); !cmp.Equal(changed, []string{"Kubernetes//Pod/shop/on-1"}) || loc("on-1") != nil {
		t.Errorf("n1 deleted: published %v, on-1 locality %v", changed, loc("on-1"))
	}
}

// TestIndexIncremental drives the index through a sequence of changes and
// checks after each that exactly the affected resources are published.
func TestIndexIncremental(t *testing.T) {
	w := newWorld(t)
	w.set(kindNamespace, ns("shop", nil), ns("weft-system", nil))
	w.set(kindPod, newPod("shop", "cart-1", withLabel("app", "cart")), newPod("shop", "cart-2", withLabel("app", "cart")),
		newPod("shop", "db", withLabel("app", "db")))
	w.set(kindService, newService("shop", "cart", nil))
	w.set(kindEndpointSlice, endpointSlice("shop", "cart-abc", "cart", 8080, "cart-1", "cart-2"))

	u := w.ix.process(w.ix.all())
	changed, _ := names(u)
	want := []string{"Kubernetes//Pod/shop/cart-1", "Kubernetes//Pod/shop/cart-2", "Kubernetes//Pod/shop/db", cartSvc}
	if diff := cmp.Diff(want, changed); diff != "" {
		t.Fatalf("initial resources (-want +got):\n%s", diff)
	}
	if got := w.workload("Kubernetes//Pod/shop/cart-1").GetServices()[cartSvc].GetPorts(); len(got) != 1 || got[0].GetTargetPort() != 8080 {
		t.Errorf("cart-1 ports for %s = %v, want only 80->8080 (the named port 9000 is not resolved by the slice)", cartSvc, got)
	}

	steps := []struct {
		name        string
		change      func() batch
		wantChanged []string
		wantRemoved []string
		check       func(t *testing.T)
	}{
		{
			name:   "recomputing everything again publishes nothing",
			change: func() batch { return w.ix.all() },
		},
		{
			name: "one pod annotated: one resource",
			change: func() batch {
				return w.set(kindPod, newPod("shop", "cart-1", withLabel("app", "cart"), withAnnotation("ambient.istio.io/redirection", "enabled")))
			},
			wantChanged: []string{"Kubernetes//Pod/shop/cart-1"},
			check: func(t *testing.T) {
				if w.workload("Kubernetes//Pod/shop/cart-1").GetTunnelProtocol() != workloadpb.TunnelProtocol_HBONE {
					t.Error("cart-1 does not speak HBONE")
				}
			},
		},
		{
			name: "pod status change without effect: nothing",
			change: func() batch {
				return w.set(kindPod, newPod("shop", "cart-1", withLabel("app", "cart"), withAnnotation("ambient.istio.io/redirection", "enabled"),
					func(p *corev1.Pod) { p.ResourceVersion = "2" }))
			},
		},
		{
			name: "endpoint slice drops a pod: that pod only",
			change: func() batch {
				return w.set(kindEndpointSlice, endpointSlice("shop", "cart-abc", "cart", 8080, "cart-1"))
			},
			wantChanged: []string{"Kubernetes//Pod/shop/cart-2"},
			check: func(t *testing.T) {
				if s := w.workload("Kubernetes//Pod/shop/cart-2").GetServices(); len(s) != 0 {
					t.Errorf("cart-2 still has services %v", s)
				}
			},
		},
		{
			name: "target port changes: the service's pods",
			change: func() batch {
				return w.set(kindEndpointSlice, endpointSlice("shop", "cart-abc", "cart", 8081, "cart-1"))
			},
			wantChanged: []string{"Kubernetes//Pod/shop/cart-1"},
		},
		{
			name: "selector policy: published, listed by the pods it selects",
			change: func() batch {
				return w.set(kindPolicy, selectorPolicy("shop", "cart-only", map[string]string{"app": "cart"}))
			},
			wantChanged: []string{"Kubernetes//Pod/shop/cart-1", "Kubernetes//Pod/shop/cart-2"},
			check: func(t *testing.T) {
				if _, ok := w.ix.authz["shop/cart-only"]; !ok {
					t.Error("policy shop/cart-only not published")
				}
				if got := w.workload("Kubernetes//Pod/shop/cart-2").GetAuthorizationPolicies(); !slices.Equal(got, []string{"shop/cart-only"}) {
					t.Errorf("cart-2 policies = %v", got)
				}
				if got := w.workload("Kubernetes//Pod/shop/db").GetAuthorizationPolicies(); len(got) != 0 {
					t.Errorf("db policies = %v, want none", got)
				}
			},
		},
		{
			name: "root-namespace selector policy applies in every namespace",
			change: func() batch {
				return w.set(kindPolicy, selectorPolicy("weft-system", "dbs", map[string]string{"app": "db"}))
			},
			wantChanged: []string{"Kubernetes//Pod/shop/db"},
		},
		{
			name:        "policy deleted: removed, and unlisted",
			change:      func() batch { return w.del(kindPolicy, selectorPolicy("shop", "cart-only", nil)) },
			wantChanged: []string{"Kubernetes//Pod/shop/cart-1", "Kubernetes//Pod/shop/cart-2"},
			check: func(t *testing.T) {
				if _, ok := w.ix.authz["shop/cart-only"]; ok {
					t.Error("policy shop/cart-only still published")
				}
			},
		},
		{
			name: "namespace points at a waypoint that does not exist yet: nothing",
			change: func() batch {
				return w.set(kindNamespace, ns("shop", map[string]string{"istio.io/use-waypoint": "waypoint"}))
			},
		},
		{
			name: "waypoint gets an address: the service binds, pods do not (service waypoint)",
			change: func() batch {
				return w.set(kindGateway, gateway("istio-waypoint", nil, gwv1.GatewayStatusAddress{
					Type: ptr(gwv1.HostnameAddressType), Value: "waypoint.shop.svc.cluster.local"}))
			},
			wantChanged: []string{cartSvc},
			check: func(t *testing.T) {
				if w.ix.addresses[cartSvc].GetService().GetWaypoint() == nil {
					t.Error("cart service has no waypoint")
				}
			},
		},
		{
			name: "waypoint serves all: pods bind too",
			change: func() batch {
				return w.set(kindGateway, gateway("istio-waypoint", map[string]string{"istio.io/waypoint-for": "all"}, gwv1.GatewayStatusAddress{
					Type: ptr(gwv1.HostnameAddressType), Value: "waypoint.shop.svc.cluster.local"}))
			},
			wantChanged: []string{"Kubernetes//Pod/shop/cart-1", "Kubernetes//Pod/shop/cart-2", "Kubernetes//Pod/shop/db"},
		},
		{
			name: "a pod opts out",
			change: func() batch {
				return w.set(kindPod, newPod("shop", "db", withLabel("app", "db"), withLabel("istio.io/use-waypoint", "none")))
			},
			wantChanged: []string{"Kubernetes//Pod/shop/db"},
			check: func(t *testing.T) {
				if w.workload("Kubernetes//Pod/shop/db").GetWaypoint() != nil {
					t.Error("db still has a waypoint")
				}
			},
		},
		{
			name:        "waypoint deleted: bound objects lose it",
			change:      func() batch { return w.del(kindGateway, gateway("istio-waypoint", nil)) },
			wantChanged: []string{"Kubernetes//Pod/shop/cart-1", "Kubernetes//Pod/shop/cart-2", cartSvc},
		},
		{
			name:        "service deleted: removed, and gone from its pods",
			change:      func() batch { return w.del(kindService, newService("shop", "cart", nil)) },
			wantChanged: []string{"Kubernetes//Pod/shop/cart-1"},
			wantRemoved: []string{cartSvc},
		},
		{
			name:        "pod deleted: removed",
			change:      func() batch { return w.del(kindPod, newPod("shop", "cart-2")) },
			wantRemoved: []string{"Kubernetes//Pod/shop/cart-2"},
		},
		{
			name:        "pod loses its IP: removed",
			change:      func() batch { return w.set(kindPod, newPod("shop", "db", withIPs())) },
			wantRemoved: []string{"Kubernetes//Pod/shop/db"},
		},
	}
	for _, st := range steps {
		u := w.ix.process(st.change())
		changed, removed := names(u)
		if diff := cmp.Diff(st.wantChanged, changed); diff != "" {
			t.Errorf("%s: changed (-want +got):\n%s", st.name, diff)
		}
		if diff := cmp.Diff(st.wantRemoved, removed); diff != "" {
			t.Errorf("%s: removed (-want +got):\n%s", st.name, diff)
		}
		if st.check != nil {
			st.check(t)
		}
	}
}

// TestIndexPolicyConditions checks that a policy's condition is reported
// once, and again only when it changes.
// ztunnelConds are an update's ZtunnelAccepted conditions.
func ztunnelConds(u *Update) []PolicyCondition {
	var out []PolicyCondition
	for _, c := range u.Conditions {
		if c.Type == authpolicy.ConditionType {
			out = append(out, c)
		}
	}
	return out
}

// writePolicyStatus does what the status writer would with an update's
// policy conditions, and returns the batch of the informer events that
// follow.
func (w *world) writePolicyStatus(u *Update) batch {
	b := batch{}
	for _, c := range u.Conditions {
		p := getObj[securityv1.AuthorizationPolicy](w.stores.Policies, c.Namespace+"/"+c.Name)
		if p == nil {
			continue
		}
		p = p.DeepCopy()
		var kept []*metav1alpha1.IstioCondition
		for _, cur := range p.Status.GetConditions() {
			if cur.GetType() != c.Type {
				kept = append(kept, cur)
			}
		}
		if c.Condition != nil {
			st := "False"
			if c.Condition.Status {
				st = "True"
			}
			kept = append(kept, &metav1alpha1.IstioCondition{Type: c.Type, Status: st, Reason: c.Condition.Reason,
				Message: c.Condition.Message, ObservedGeneration: c.Generation})
		}
		p.Status.Conditions = kept
		for k := range w.set(kindPolicy, p)[kindPolicy] {
			b.add(kindPolicy, k)
		}
	}
	return b
}

func TestIndexPolicyConditions(t *testing.T) {
	w := newWorld(t)
	p := selectorPolicy("shop", "p", map[string]string{"app": "x"})
	u := w.ix.process(w.set(kindPolicy, p))
	if c := ztunnelConds(u); len(c) != 1 || !c[0].Condition.Status || c[0].Generation != 1 {
		t.Fatalf("conditions = %+v, want one accepted at generation 1", u.Conditions)
	}
	if u := w.ix.process(w.writePolicyStatus(u)); len(u.Conditions) != 0 {
		t.Errorf("the policy's own status write reported again: %+v", u.Conditions)
	}
	p = getObj[securityv1.AuthorizationPolicy](w.stores.Policies, "shop/p")
	if u := w.ix.process(w.set(kindPolicy, p)); len(u.Conditions) != 0 {
		t.Errorf("unchanged policy reported again: %+v", u.Conditions)
	}
	// Another writer changes the condition: it is put back.
	changed := p.DeepCopy()
	for _, c := range changed.Status.Conditions {
		if c.Type == authpolicy.ConditionType {
			c.Status = "False"
		}
	}
	if c := ztunnelConds(w.ix.process(w.set(kindPolicy, changed))); len(c) != 1 || !c[0].Condition.Status {
		t.Errorf("a condition another writer changed: %+v, want it reported again", c)
	}
	p2 := p.DeepCopy()
	p2.Spec.Rules = []*securityv1beta1.Rule{{To: []*securityv1beta1.Rule_To{{Operation: &securityv1beta1.Operation{Methods: []string{"GET"}}}}}}
	u = w.ix.process(w.set(kindPolicy, p2))
	if c := ztunnelConds(u); len(c) != 1 || c[0].Condition.Reason != "UnsupportedValue" {
		t.Errorf("conditions after adding an HTTP rule = %+v", u.Conditions)
	}
	// A new generation with the same outcome is reported again, for its
	// observedGeneration.
	p3 := p2.DeepCopy()
	p3.Generation = 2
	u = w.ix.process(w.set(kindPolicy, p3))
	if c := ztunnelConds(u); len(c) != 1 || c[0].Generation != 2 {
		t.Errorf("conditions after a new generation = %+v", u.Conditions)
	}
}
