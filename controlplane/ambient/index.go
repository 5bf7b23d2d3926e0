package ambient

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sort"

	"google.golang.org/protobuf/proto"
	"istio.io/api/label"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/authpolicy"
	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// Kinds of objects the index watches, as dirty-set keys and metric labels.
const (
	kindPod           = "Pod"
	kindService       = "Service"
	kindEndpointSlice = "EndpointSlice"
	kindNamespace     = "Namespace"
	kindGateway       = "Gateway"
	kindGatewayClass  = "GatewayClass"
	kindPolicy        = "AuthorizationPolicy"
	kindPeerAuth      = "PeerAuthentication"
	kindNode          = "Node"
	kindServiceEntry  = "ServiceEntry"
	// kindWorkloadEntry is in workloadentry.go.
	// kindSliceWorkloads marks an EndpointSlice whose endpoints that are not
	// pods must be rebuilt (its own change, or its Service's).
	kindSliceWorkloads = "EndpointSliceWorkloads"
)

// IndexServiceName indexes EndpointSlices by "<namespace>/<service name>".
const IndexServiceName = "weft-service-name"

// IndexPodNode indexes Pods by the name of the node they run on.
const IndexPodNode = "weft-pod-node"

// Stores are the informer caches the index reads. Gateways may be nil when
// the Gateway API is not installed (then there are no waypoints).
type Stores struct {
	Pods, Services, EndpointSlices, Namespaces, Gateways, Policies cache.Indexer
	// PeerAuths holds the PeerAuthentications.
	PeerAuths cache.Indexer
	// Nodes holds the Nodes, for the workloads' locality; nil: no locality.
	Nodes cache.Indexer
	// GatewayClasses holds the GatewayClasses, whose istio.io/waypoint-for
	// their Gateways inherit; nil: none is read.
	GatewayClasses cache.Indexer
	// ServiceEntries holds the networking.istio.io ServiceEntries; nil:
	// none is read.
	ServiceEntries cache.Indexer
	// WorkloadEntries holds the networking.istio.io WorkloadEntries; nil:
	// none is read.
	WorkloadEntries cache.Indexer
}

// Update is the outcome of one batch: the resources to publish and remove,
// by type URL, and the policy conditions that changed.
type Update struct {
	Addresses      map[string]proto.Message
	AddressRemoved []string
	Authz          map[string]proto.Message
	AuthzRemoved   []string
	Conditions     []PolicyCondition
	// Services are the Services whose istio.io/WaypointBound condition
	// changed (or that are new to this process).
	Services []ServiceCondition
	// Denied are the bindings newly refused because the waypoint's owner
	// does not admit the object's namespace.
	Denied []DeniedBinding
	// Entries are the ServiceEntries whose status should change.
	Entries []EntryStatus
}

// DeniedBinding is a waypoint binding refused for want of the waypoint
// owner's consent, reported once when it starts (or its message changes).
type DeniedBinding struct {
	// Object is the *corev1.Pod, *corev1.Service or ServiceEntry that asked.
	Object runtime.Object
	// Kind is "Pod", "Service" or "ServiceEntry"; Key its "<namespace>/<name>".
	Kind, Key string
	Refusal   Refusal
}

// PolicyCondition is a condition to write on one policy.
type PolicyCondition struct {
	Namespace, Name string
	Generation      int64
	// Type is authpolicy.ConditionType or authpolicy.WaypointConditionType.
	Type string
	// Condition is nil to remove the condition.
	Condition *authpolicy.Condition
}

// ServiceCondition is the istio.io/WaypointBound condition to write on one
// Service.
type ServiceCondition struct {
	Namespace, Name string
	// Condition is nil to remove it.
	Condition *BindingStatus
}

// empty reports whether u publishes nothing.
func (u *Update) empty() bool {
	return len(u.Addresses)+len(u.AddressRemoved)+len(u.Authz)+len(u.AuthzRemoved) == 0
}

// batch is the set of dirty object keys by kind.
type batch map[string]map[string]struct{}

func (b batch) add(kind, key string) {
	m := b[kind]
	if m == nil {
		m = map[string]struct{}{}
		b[kind] = m
	}
	m[key] = struct{}{}
}

type objRef struct{ kind, key string }

type policyEntry struct {
	namespace string
	scope     securitypb.Scope
	selector  map[string]string // for WORKLOAD_SELECTOR policies that are sent
	cond      *authpolicy.Condition
	// generation is the policy's, targets whether it has targetRefs.
	generation int64
	targets    bool
	// waypoint is the WaypointAccepted condition last reported, if
	// waypointSent.
	waypoint     *authpolicy.Condition
	waypointSent bool
}

// index computes resources from the stores. It is owned by one goroutine.
type index struct {
	cfg    Config
	stores Stores
	log    *slog.Logger

	addresses map[string]*workloadpb.Address       // published, by resource name
	authz     map[string]*securitypb.Authorization // published, by resource name
	policies  map[string]*policyEntry              // by "<ns>/<name>"
	waypoints map[string]*Waypoint                 // by gateway key
	// sliceTargets is the pods each EndpointSlice lists; podSlices the reverse.
	sliceTargets map[string][]string
	podSlices    map[string]map[string]struct{}
	// sliceWorkloads is the uids of the Workloads published for each
	// EndpointSlice's endpoints that are not pods.
	sliceWorkloads map[string][]string
	// bindings is the waypoint each pod or Service asks for; boundTo the reverse.
	bindings map[objRef]string
	boundTo  map[string]map[objRef]struct{}
	// denied is the message of each binding refused for want of consent.
	denied map[objRef]string
	// services is the istio.io/WaypointBound condition last reported for
	// each Service, by key (nil: none).
	services map[string]*BindingStatus
	// localities is each node's locality, by name (absent: none).
	localities map[string]*workloadpb.Locality
	// peerAuths is the PeerAuthentications as last processed, by
	// namespace and then key. Workloads' keys and converted policies are
	// both computed from it, so a workload never names a policy that is
	// not in authz.
	peerAuths     map[string]map[string]*securityv1.PeerAuthentication
	peerAuthCount int
	// entries is the resource names each ServiceEntry published, by key;
	// entryVIPs the addresses allocated to its hosts, vipOwner the reverse
	// ("<key>/<host>").
	entries   map[string][]string
	entryVIPs map[string]map[string]netip.Addr
	vipOwner  map[netip.Addr]string
	// entryBindings is the istio.io/WaypointBound condition of each
	// ServiceEntry that asks for a waypoint, by key.
	entryBindings map[string]*BindingStatus
	// selecting holds the keys of the ServiceEntries with a
	// workloadSelector, as last seen.
	selecting map[string]bool
}

func newIndex(cfg Config, stores Stores, log *slog.Logger) *index {
	return &index{
		cfg:            cfg.withDefaults(),
		stores:         stores,
		log:            log,
		addresses:      map[string]*workloadpb.Address{},
		authz:          map[string]*securitypb.Authorization{},
		policies:       map[string]*policyEntry{},
		peerAuths:      map[string]map[string]*securityv1.PeerAuthentication{},
		waypoints:      map[string]*Waypoint{},
		sliceTargets:   map[string][]string{},
		podSlices:      map[string]map[string]struct{}{},
		sliceWorkloads: map[string][]string{},
		bindings:       map[objRef]string{},
		boundTo:        map[string]map[objRef]struct{}{},
		denied:         map[objRef]string{},
		services:       map[string]*BindingStatus{},
		localities:     map[string]*workloadpb.Locality{},
		entries:        map[string][]string{},
		entryVIPs:      map[string]map[string]netip.Addr{},
		vipOwner:       map[netip.Addr]string{},
		entryBindings:  map[string]*BindingStatus{},
		selecting:      map[string]bool{},
	}
}

// all returns a batch holding every object in the stores.
func (ix *index) all() batch {
	b := batch{}
	add := func(kind string, s cache.Indexer) {
		if s == nil {
			return
		}
		for _, k := range s.ListKeys() {
			b.add(kind, k)
		}
	}
	add(kindNode, ix.stores.Nodes)
	add(kindNamespace, ix.stores.Namespaces)
	add(kindGateway, ix.stores.Gateways)
	add(kindPolicy, ix.stores.Policies)
	add(kindPeerAuth, ix.stores.PeerAuths)
	add(kindEndpointSlice, ix.stores.EndpointSlices)
	add(kindService, ix.stores.Services)
	add(kindPod, ix.stores.Pods)
	add(kindServiceEntry, ix.stores.ServiceEntries)
	add(kindWorkloadEntry, ix.stores.WorkloadEntries)
	return b
}

// process recomputes what the dirty objects affect and returns what changed.
// The order matters: each step may mark more pods and Services dirty.
func (ix *index) process(b batch) *Update {
	u := &Update{Addresses: map[string]proto.Message{}, Authz: map[string]proto.Message{}}
	for key := range b[kindNode] {
		ix.nodeChanged(key, b)
	}
	for key := range b[kindNamespace] {
		ix.namespaceChanged(key, b)
	}
	for key := range b[kindGatewayClass] {
		ix.gatewayClassChanged(key, b)
	}
	for key := range b[kindGateway] {
		ix.gatewayChanged(key, b)
	}
	for _, key := range sortedKeys(b[kindPolicy]) {
		ix.policyChanged(key, b, u)
	}
	for _, key := range sortedKeys(b[kindPeerAuth]) {
		ix.peerAuthChanged(key, b, u)
	}
	for key := range b[kindEndpointSlice] {
		ix.sliceChanged(key, b)
	}
	for key := range b[kindService] {
		ix.serviceChanged(key, b, u)
	}
	for key := range b[kindSliceWorkloads] {
		ix.sliceWorkloadsChanged(key, u)
	}
	ix.markSelected(b)
	for key := range b[kindPod] {
		ix.podChanged(key, u)
	}
	ix.claimEntryAddresses(b[kindServiceEntry])
	for _, key := range sortedKeys(b[kindServiceEntry]) {
		ix.serviceEntryChanged(key, u)
	}
	ix.markEntries(b)
	for key := range b[kindWorkloadEntry] {
		ix.workloadEntryChanged(key, u)
	}
	if len(b[kindPolicy])+len(b[kindGateway])+len(b[kindService])+len(b[kindNamespace])+len(b[kindServiceEntry]) > 0 {
		ix.waypointPolicies(b[kindPolicy], u)
	}
	return u
}

func getObj[T any](s cache.Indexer, key string) *T {
	if s == nil {
		return nil
	}
	obj, ok, err := s.GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	t, _ := obj.(*T)
	return t
}

func (ix *index) byNamespace(s cache.Indexer, ns string) []any {
	if s == nil {
		return nil
	}
	objs, err := s.ByIndex(cache.NamespaceIndex, ns)
	if err != nil {
		// The namespace index is missing: fall back to a scan.
		var out []any
		for _, o := range s.List() {
			if m, ok := o.(interface{ GetNamespace() string }); ok && m.GetNamespace() == ns {
				out = append(out, o)
			}
		}
		return out
	}
	return objs
}

func keyOf(obj any) string {
	k, _ := cache.MetaNamespaceKeyFunc(obj)
	return k
}

func (ix *index) namespaceChanged(ns string, b batch) {
	for _, p := range ix.byNamespace(ix.stores.Pods, ns) {
		b.add(kindPod, keyOf(p))
	}
	for _, s := range ix.byNamespace(ix.stores.Services, ns) {
		b.add(kindService, keyOf(s))
	}
	for _, s := range ix.byNamespace(ix.stores.ServiceEntries, ns) {
		b.add(kindServiceEntry, keyOf(s))
	}
}

// nodeChanged marks the node's pods when its locality changed (a node's
// other changes, its status above all, concern no workload).
func (ix *index) nodeChanged(name string, b batch) {
	var loc *workloadpb.Locality
	if n := getObj[corev1.Node](ix.stores.Nodes, name); n != nil {
		loc = NodeLocality(n.Labels)
	}
	if old, had := ix.localities[name]; had == (loc != nil) && proto.Equal(old, loc) {
		return
	}
	if loc == nil {
		delete(ix.localities, name)
	} else {
		ix.localities[name] = loc
	}
	pods, _ := ix.stores.Pods.ByIndex(IndexPodNode, name)
	for _, p := range pods {
		b.add(kindPod, keyOf(p))
	}
}

// gatewayClassChanged marks the Gateways of the class: their traffic type
// may follow its istio.io/waypoint-for.
func (ix *index) gatewayClassChanged(name string, b batch) {
	if ix.stores.Gateways == nil {
		return
	}
	for _, o := range ix.stores.Gateways.List() {
		if gw := o.(*gwv1.Gateway); string(gw.Spec.GatewayClassName) == name {
			b.add(kindGateway, keyOf(gw))
		}
	}
}

func (ix *index) gatewayChanged(key string, b batch) {
	gw := getObj[gwv1.Gateway](ix.stores.Gateways, key)
	var class *gwv1.GatewayClass
	if gw != nil {
		class = getObj[gwv1.GatewayClass](ix.stores.GatewayClasses, string(gw.Spec.GatewayClassName))
	}
	wp := NewWaypointOfClass(gw, class, ix.cfg.Network)
	old := ix.waypoints[key]
	if wp == nil {
		delete(ix.waypoints, key)
	} else {
		ix.waypoints[key] = wp
	}
	if (old == nil) == (wp == nil) && (old == nil || (old.For == wp.For && proto.Equal(old.Address, wp.Address) && old.Attachment.Equal(wp.Attachment))) {
		return
	}
	for ref := range ix.boundTo[key] {
		b.add(ref.kind, ref.key)
	}
	// The waypoint's own pods and Service, which never get a waypoint.
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	for _, p := range ix.byNamespace(ix.stores.Pods, ns) {
		if p.(*corev1.Pod).Labels[label.IoK8sNetworkingGatewayGatewayName.Name] == name {
			b.add(kindPod, keyOf(p))
		}
	}
	for _, s := range ix.byNamespace(ix.stores.Services, ns) {
		if s.(*corev1.Service).Labels[label.IoK8sNetworkingGatewayGatewayName.Name] == name {
			b.add(kindService, keyOf(s))
		}
	}
}

func (ix *index) policyChanged(key string, b batch, u *Update) {
	p := getObj[securityv1.AuthorizationPolicy](ix.stores.Policies, key)
	old := ix.policies[key]
	var entry *policyEntry
	var res authpolicy.Result
	if p != nil {
		res = authpolicy.Translate(ix.cfg.RootNamespace, p)
		entry = &policyEntry{namespace: p.Namespace, cond: res.Condition, generation: p.Generation,
			targets: p.Spec.GetTargetRef() != nil || len(p.Spec.GetTargetRefs()) > 0}
		if old != nil && old.generation == p.Generation {
			entry.waypoint, entry.waypointSent = old.waypoint, old.waypointSent
		}
		if res.Authorization != nil {
			entry.scope = res.Authorization.GetScope()
			if entry.scope == securitypb.Scope_WORKLOAD_SELECTOR {
				entry.selector = res.Selector
			}
		}
	}
	ix.publishAuthz(key, res.Authorization, u)
	// Status: only when it or the generation changed, the policy is new
	// to this process, or it does not show the condition (another writer
	// changed it).
	if p != nil && (old == nil || old.generation != p.Generation || !condEqual(old.cond, res.Condition) ||
		!policyShows(p, authpolicy.ConditionType, res.Condition)) {
		u.Conditions = append(u.Conditions, PolicyCondition{Namespace: p.Namespace, Name: p.Name, Generation: p.Generation,
			Type: authpolicy.ConditionType, Condition: res.Condition})
	}
	if entry == nil {
		delete(ix.policies, key)
	} else {
		ix.policies[key] = entry
	}
	// Workloads list selector policies: re-examine the pods in scope when
	// the policy enters, leaves or changes its selector.
	oldSel, newSel := selectorOf(old), selectorOf(entry)
	if (oldSel == nil) == (newSel == nil) && (oldSel == nil || mapsEqual(oldSel, newSel)) {
		return
	}
	ns, _, _ := cache.SplitMetaNamespaceKey(key)
	if ns == ix.cfg.RootNamespace {
		if ix.stores.Pods != nil {
			for _, k := range ix.stores.Pods.ListKeys() {
				b.add(kindPod, k)
			}
		}
		return
	}
	for _, pod := range ix.byNamespace(ix.stores.Pods, ns) {
		b.add(kindPod, keyOf(pod))
	}
}

// publishAuthz records the Authorization named key (nil: none) and adds
// it to u if it differs from what was published.
func (ix *index) publishAuthz(key string, a *securitypb.Authorization, u *Update) {
	if a == nil {
		if _, ok := ix.authz[key]; ok {
			delete(ix.authz, key)
			delete(u.Authz, key)
			u.AuthzRemoved = append(u.AuthzRemoved, key)
		}
		return
	}
	if prev := ix.authz[key]; prev == nil || !proto.Equal(prev, a) {
		ix.authz[key] = a
		u.Authz[key] = a
		u.AuthzRemoved = slices.DeleteFunc(u.AuthzRemoved, func(k string) bool { return k == key })
	}
}

func selectorOf(e *policyEntry) map[string]string {
	if e == nil {
		return nil
	}
	return e.selector
}

func condEqual(a, b *authpolicy.Condition) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func (ix *index) sliceChanged(key string, b batch) {
	b.add(kindSliceWorkloads, key)
	slice := getObj[discoveryv1.EndpointSlice](ix.stores.EndpointSlices, key)
	var targets []string
	if slice != nil {
		for _, ep := range slice.Endpoints {
			if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" && ep.TargetRef.Name != "" {
				ns := ep.TargetRef.Namespace
				if ns == "" {
					ns = slice.Namespace
				}
				targets = append(targets, ns+"/"+ep.TargetRef.Name)
			}
		}
		slices.Sort(targets)
		targets = slices.Compact(targets)
	}
	for _, pod := range ix.sliceTargets[key] {
		delete(ix.podSlices[pod], key)
		if len(ix.podSlices[pod]) == 0 {
			delete(ix.podSlices, pod)
		}
		b.add(kindPod, pod)
	}
	if len(targets) == 0 {
		delete(ix.sliceTargets, key)
	} else {
		ix.sliceTargets[key] = targets
	}
	for _, pod := range targets {
		m := ix.podSlices[pod]
		if m == nil {
			m = map[string]struct{}{}
			ix.podSlices[pod] = m
		}
		m[key] = struct{}{}
		b.add(kindPod, pod)
	}
}

func (ix *index) serviceChanged(key string, b batch, u *Update) {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	ref := objRef{kindService, key}
	rname := ServiceKey(ns, Hostname(name, ns, ix.cfg.ClusterDomain))
	svc := getObj[corev1.Service](ix.stores.Services, key)
	var res *workloadpb.Service
	if svc != nil {
		in := ServiceInput{Service: svc}
		in.Binding, in.NamespaceLabels = ix.binding(ref, ns, svc.Labels)
		in.Waypoint = ix.waypoints[in.Binding.Key]
		in.IsWaypoint = ix.waypoints[ns+"/"+svc.Labels[label.IoK8sNetworkingGatewayGatewayName.Name]] != nil
		var refused *Refusal
		res, refused = ix.cfg.Service(in)
		ix.refused(ref, svc, refused, u)
		ix.serviceStatus(svc, serviceBinding(in, res, refused), u)
	} else {
		ix.unbind(ref)
		delete(ix.services, key)
	}
	publishAddress(ix, rname, res, u, func(s *workloadpb.Service) *workloadpb.Address {
		return &workloadpb.Address{Type: &workloadpb.Address_Service{Service: s}}
	})
	// The pods of the Service carry its ports.
	if ix.stores.EndpointSlices != nil {
		slicesOf, _ := ix.stores.EndpointSlices.ByIndex(IndexServiceName, key)
		for _, s := range slicesOf {
			b.add(kindSliceWorkloads, keyOf(s))
			for _, pod := range ix.sliceTargets[keyOf(s)] {
				b.add(kindPod, pod)
			}
		}
	}
}

// sliceWorkloadsChanged publishes the Workloads of a slice's endpoints that
// are not pods, and removes those it no longer has.
func (ix *index) sliceWorkloadsChanged(key string, u *Update) {
	var ws []*workloadpb.Workload
	if slice := getObj[discoveryv1.EndpointSlice](ix.stores.EndpointSlices, key); slice != nil {
		if name := slice.Labels[discoveryv1.LabelServiceName]; name != "" {
			svc := getObj[corev1.Service](ix.stores.Services, slice.Namespace+"/"+name)
			ws = ix.cfg.SliceWorkloads(svc, slice)
		}
	}
	uids := make([]string, 0, len(ws))
	now := make(map[string]bool, len(ws))
	for _, w := range ws {
		uids = append(uids, w.GetUid())
		now[w.GetUid()] = true
		publishAddress(ix, w.GetUid(), w, u, wrapWorkload)
	}
	for _, old := range ix.sliceWorkloads[key] {
		if !now[old] {
			publishAddress(ix, old, (*workloadpb.Workload)(nil), u, wrapWorkload)
		}
	}
	if len(uids) == 0 {
		delete(ix.sliceWorkloads, key)
	} else {
		ix.sliceWorkloads[key] = uids
	}
}

func wrapWorkload(w *workloadpb.Workload) *workloadpb.Address {
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: w}}
}

func (ix *index) podChanged(key string, u *Update) {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	ref := objRef{kindPod, key}
	uid := PodUID(ix.cfg.ClusterID, ns, name)
	pod := getObj[corev1.Pod](ix.stores.Pods, key)
	var res *workloadpb.Workload
	if pod != nil {
		in := PodInput{Pod: pod}
		in.Binding, in.NamespaceLabels = ix.binding(ref, ns, pod.Labels)
		in.Waypoint = ix.waypoints[in.Binding.Key]
		in.IsWaypoint = ix.waypoints[ns+"/"+pod.Labels[label.IoK8sNetworkingGatewayGatewayName.Name]] != nil
		in.Services = ix.podServices(key)
		for k, ports := range EntrySelectedPorts(ix.namespaceEntries(ns), ns, pod.Labels, nil) {
			if in.Services == nil {
				in.Services = map[string][]*workloadpb.Port{}
			}
			in.Services[k] = ports
		}
		in.Policies = append(ix.podPolicies(pod), ix.podPeerAuthKeys(pod)...)
		in.Locality = ix.localities[pod.Spec.NodeName]
		var refused *Refusal
		res, refused = ix.cfg.Workload(in)
		ix.refused(ref, pod, refused, u)
	} else {
		ix.unbind(ref)
	}
	publishAddress(ix, uid, res, u, wrapWorkload)
}

// publishAddress records a computed resource (nil: none) under name and adds
// it to u if it differs from what was published.
func publishAddress[T proto.Message](ix *index, name string, res T, u *Update, wrap func(T) *workloadpb.Address) {
	var zero T
	prev, had := ix.addresses[name]
	if any(res) == any(zero) {
		if had {
			delete(ix.addresses, name)
			delete(u.Addresses, name)
			u.AddressRemoved = append(u.AddressRemoved, name)
		}
		return
	}
	a := wrap(res)
	if had && proto.Equal(prev, a) {
		return
	}
	ix.addresses[name] = a
	u.Addresses[name] = a
}

// refused notes why an object's binding was not made (nil: it was, or it
// asks for none). A refusal for want of consent is reported in u once, when
// it starts; the others are routine (a waypoint not deployed yet) and only
// logged at debug level.
func (ix *index) refused(ref objRef, obj runtime.Object, r *Refusal, u *Update) {
	if r == nil || r.Reason != ReasonAttachmentDenied {
		if _, was := ix.denied[ref]; was {
			delete(ix.denied, ref)
			ix.log.Info("waypoint binding no longer denied", "kind", ref.kind, "object", ref.key)
		}
		if r != nil && ix.log.Enabled(context.Background(), slog.LevelDebug) {
			ix.log.Debug("waypoint binding not made", "kind", ref.kind, "object", ref.key, "reason", r.Reason, "message", r.Message)
		}
		return
	}
	if ix.denied[ref] == r.Message {
		return
	}
	ix.denied[ref] = r.Message
	u.Denied = append(u.Denied, DeniedBinding{Object: obj, Kind: ref.kind, Key: ref.key, Refusal: *r})
}

// serviceStatus records a Service's istio.io/WaypointBound condition and
// reports it in u if it changed, or the Service does not show it (a
// Service new to this process may hold a condition from before, and
// another writer may change it).
func (ix *index) serviceStatus(svc *corev1.Service, c *BindingStatus, u *Update) {
	key := svc.Namespace + "/" + svc.Name
	if old, ok := ix.services[key]; ok && bindingEqual(old, c) && shows(svc, c) {
		return
	}
	ix.services[key] = c
	u.Services = append(u.Services, ServiceCondition{Namespace: svc.Namespace, Name: svc.Name, Condition: c})
}

func bindingEqual(a, b *BindingStatus) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// waypointPolicies recomputes the WaypointAccepted condition of the
// policies with targetRefs, and reports those that changed, and those of
// changed that do not show it (another writer changed it); a policy
// without targetRefs is reported once, to remove a condition left from
// before. Any change of a waypoint, Service or namespace may change them,
// and there are few such policies: all are recomputed.
func (ix *index) waypointPolicies(changed map[string]struct{}, u *Update) {
	for _, key := range sortedKeys(ix.policies) {
		e := ix.policies[key]
		if !e.targets && e.waypointSent {
			continue
		}
		p := getObj[securityv1.AuthorizationPolicy](ix.stores.Policies, key)
		if p == nil {
			continue
		}
		c := waypointAccepted(p, ix.cfg.RootNamespace, ix)
		_, dirty := changed[key]
		if e.waypointSent && condEqual(e.waypoint, c) && (!dirty || policyShows(p, authpolicy.WaypointConditionType, c)) {
			continue
		}
		e.waypoint, e.waypointSent = c, true
		u.Conditions = append(u.Conditions, PolicyCondition{Namespace: p.Namespace, Name: p.Name, Generation: p.Generation,
			Type: authpolicy.WaypointConditionType, Condition: c})
	}
}

// policyShows reports whether a policy's status shows the condition c of
// type typ (nil: none) for its generation.
func policyShows(p *securityv1.AuthorizationPolicy, typ string, c *authpolicy.Condition) bool {
	for _, cur := range p.Status.GetConditions() {
		if cur.GetType() != typ {
			continue
		}
		st := "False"
		if c != nil && c.Status {
			st = "True"
		}
		return c != nil && cur.GetStatus() == st && cur.GetReason() == c.Reason && cur.GetMessage() == c.Message &&
			cur.GetObservedGeneration() == p.Generation
	}
	return c == nil
}

// waypointReady implements policyLookup.
func (ix *index) waypointReady(key string) bool {
	wp := ix.waypoints[key]
	return wp != nil && wp.Address != nil
}

// serviceBinding implements policyLookup, from the conditions of this
// batch's Services.
func (ix *index) serviceBinding(key string) (bool, *BindingStatus) {
	b, ok := ix.services[key]
	return ok, b
}

// serviceEntryBinding implements policyLookup.
func (ix *index) serviceEntryBinding(key string) (bool, *BindingStatus) {
	if getObj[networkingv1.ServiceEntry](ix.stores.ServiceEntries, key) == nil {
		return false, nil
	}
	return true, ix.entryBindings[key]
}

// binding reads an object's waypoint binding, with the labels of its
// namespace, and keeps the reverse index current, so that a waypoint change
// finds the objects that use it.
func (ix *index) binding(ref objRef, ns string, labels map[string]string) (Binding, map[string]string) {
	var nsLabels map[string]string
	if n := getObj[corev1.Namespace](ix.stores.Namespaces, ns); n != nil {
		nsLabels = n.Labels
	}
	b := BindingFor(ns, labels, nsLabels)
	if old := ix.bindings[ref]; old != b.Key {
		ix.unbind(ref)
		if b.Key != "" {
			ix.bindings[ref] = b.Key
			m := ix.boundTo[b.Key]
			if m == nil {
				m = map[objRef]struct{}{}
				ix.boundTo[b.Key] = m
			}
			m[ref] = struct{}{}
		}
	}
	return b, nsLabels
}

func (ix *index) unbind(ref objRef) {
	delete(ix.denied, ref)
	old, ok := ix.bindings[ref]
	if !ok {
		return
	}
	delete(ix.bindings, ref)
	delete(ix.boundTo[old], ref)
	if len(ix.boundTo[old]) == 0 {
		delete(ix.boundTo, old)
	}
}

// podServices builds a pod's services map from the EndpointSlices listing it.
func (ix *index) podServices(podKey string) map[string][]*workloadpb.Port {
	keys := sortedKeys(ix.podSlices[podKey])
	if len(keys) == 0 {
		return nil
	}
	out := map[string][]*workloadpb.Port{}
	for _, k := range keys {
		slice := getObj[discoveryv1.EndpointSlice](ix.stores.EndpointSlices, k)
		if slice == nil {
			continue
		}
		svcName := slice.Labels[discoveryv1.LabelServiceName]
		if svcName == "" {
			continue
		}
		svc := getObj[corev1.Service](ix.stores.Services, slice.Namespace+"/"+svcName)
		if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		if ports := ServicePorts(svc, slice); len(ports) > 0 {
			out[ServiceKey(svc.Namespace, Hostname(svc.Name, svc.Namespace, ix.cfg.ClusterDomain))] = ports
		}
	}
	return out
}

// podPolicies lists the workload-selector policies, of the pod's namespace
// and of the root namespace, that select it.
func (ix *index) podPolicies(pod *corev1.Pod) []string {
	return ix.selectorPolicies(pod.Namespace, pod.Labels)
}

// selectorPolicies lists the workload-selector policies, of namespace ns
// and of the root namespace, that select a workload of ns with labels.
func (ix *index) selectorPolicies(ns string, labels map[string]string) []string {
	var out []string
	for key, e := range ix.policies {
		if e.selector == nil || (e.namespace != ns && e.namespace != ix.cfg.RootNamespace) {
			continue
		}
		if _, sent := ix.authz[key]; sent && SelectorMatches(e.selector, labels) {
			out = append(out, key)
		}
	}
	sort.Strings(out)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// claimEntryAddresses gives each dirty ServiceEntry the addresses its
// status records for its hosts, where no other host holds them yet. It
// runs before any address is allocated, so that an address recorded
// before (by this process or another replica, before a restart) is kept.
func (ix *index) claimEntryAddresses(keys map[string]struct{}) {
	for _, key := range sortedKeys(keys) {
		se := getObj[networkingv1.ServiceEntry](ix.stores.ServiceEntries, key)
		if se == nil || !ServiceEntrySupported(se) || !allocates(se) {
			continue
		}
		hosts := map[string]bool{}
		for _, h := range se.Spec.GetHosts() {
			hosts[NormalHost(h)] = true
		}
		for h, ip := range RecordedAddresses(se) {
			owner := key + "/" + h
			if cur, taken := ix.vipOwner[ip]; !hosts[h] || (taken && cur != owner) {
				continue
			}
			if _, has := ix.entryVIPs[key][h]; has {
				continue
			}
			ix.vipOwner[ip] = owner
			if ix.entryVIPs[key] == nil {
				ix.entryVIPs[key] = map[string]netip.Addr{}
			}
			ix.entryVIPs[key][h] = ip
		}
	}
}

// serviceEntryChanged publishes a ServiceEntry's Services and Workloads and
// removes what it no longer has. A host without addresses keeps the
// address it was given for as long as the entry names it, and the entry's
// status records it (as istiod's allocation does), so that it survives a
// restart and every consumer (the waypoints' configuration too) reads the
// same one. The entry's Services take its waypoint.
func (ix *index) serviceEntryChanged(key string, u *Update) {
	ref := objRef{kindServiceEntry, key}
	se := getObj[networkingv1.ServiceEntry](ix.stores.ServiceEntries, key)
	var svcs []*workloadpb.Service
	var ws []*workloadpb.Workload
	vips := map[string]netip.Addr{}
	if se != nil && ServiceEntrySupported(se) {
		old := ix.entryVIPs[key]
		for _, h := range se.Spec.GetHosts() {
			h = NormalHost(h)
			if !allocates(se) {
				break
			}
			if ip, ok := old[h]; ok {
				vips[h] = ip
				continue
			}
			ip := AutoVIP(se.Namespace, se.Name, h, func(a netip.Addr) bool { _, taken := ix.vipOwner[a]; return taken })
			if ip.IsValid() {
				vips[h] = ip
				ix.vipOwner[ip] = key + "/" + h
			}
		}
		svcs, ws = ix.cfg.ServiceEntryResources(se, vips)
		bind, nsl := ix.binding(ref, se.Namespace, se.Labels)
		var status *BindingStatus
		if bind.Key != "" {
			wp, refused := resolveWaypoint(bind, ix.waypoints[bind.Key], apinames.WaypointForService, se.Namespace, nsl)
			for _, s := range svcs {
				s.Waypoint = wp
			}
			ix.refused(ref, se, refused, u)
			status = bindingStatus(bind.Key, refused)
		} else {
			ix.refused(ref, se, nil, u)
		}
		ix.entryStatus(se, vips, status, u)
	} else {
		ix.unbind(ref)
		delete(ix.entryBindings, key)
		if se != nil {
			ix.entryStatus(se, nil, nil, u)
		}
	}
	for h, ip := range ix.entryVIPs[key] {
		if _, kept := vips[h]; !kept {
			delete(ix.vipOwner, ip)
		}
	}
	if len(vips) == 0 {
		delete(ix.entryVIPs, key)
	} else {
		ix.entryVIPs[key] = vips
	}
	now := map[string]bool{}
	var names []string
	for _, s := range svcs {
		name := ServiceKey(s.Namespace, s.Hostname)
		names, now[name] = append(names, name), true
		publishAddress(ix, name, s, u, func(s *workloadpb.Service) *workloadpb.Address {
			return &workloadpb.Address{Type: &workloadpb.Address_Service{Service: s}}
		})
	}
	for _, w := range ws {
		names, now[w.Uid] = append(names, w.Uid), true
		publishAddress(ix, w.Uid, w, u, wrapWorkload)
	}
	for _, old := range ix.entries[key] {
		if !now[old] {
			publishAddress(ix, old, (*workloadpb.Workload)(nil), u, wrapWorkload)
		}
	}
	if len(names) == 0 {
		delete(ix.entries, key)
	} else {
		ix.entries[key] = names
	}
}

// entryStatus records what a ServiceEntry's status should show and reports
// it in u if it changed or the entry does not show it.
func (ix *index) entryStatus(se *networkingv1.ServiceEntry, vips map[string]netip.Addr, c *BindingStatus, u *Update) {
	key := se.Namespace + "/" + se.Name
	want := EntryStatus{Namespace: se.Namespace, Name: se.Name, Addresses: vips, Binding: c}
	if len(want.Addresses) == 0 {
		want.Addresses = nil
	}
	if c == nil {
		delete(ix.entryBindings, key)
	} else {
		ix.entryBindings[key] = c
	}
	if EntryShows(se, want) {
		return
	}
	u.Entries = append(u.Entries, want)
}

// markSelected marks dirty the pods and WorkloadEntries of the namespace
// of each changed ServiceEntry that selects workloads, or did: they carry
// its hosts (EntrySelectedPorts). It runs before the pods are processed.
func (ix *index) markSelected(b batch) {
	for key := range b[kindServiceEntry] {
		se := getObj[networkingv1.ServiceEntry](ix.stores.ServiceEntries, key)
		now := se != nil && se.Spec.GetWorkloadSelector() != nil
		if !now && !ix.selecting[key] {
			continue
		}
		if now {
			ix.selecting[key] = true
		} else {
			delete(ix.selecting, key)
		}
		ns, _, _ := cache.SplitMetaNamespaceKey(key)
		for _, p := range ix.byNamespace(ix.stores.Pods, ns) {
			b.add(kindPod, keyOf(p))
		}
		for _, w := range ix.byNamespace(ix.stores.WorkloadEntries, ns) {
			b.add(kindWorkloadEntry, keyOf(w))
		}
	}
}

// namespaceEntries lists the ServiceEntries of ns.
func (ix *index) namespaceEntries(ns string) []*networkingv1.ServiceEntry {
	var out []*networkingv1.ServiceEntry
	for _, o := range ix.byNamespace(ix.stores.ServiceEntries, ns) {
		out = append(out, o.(*networkingv1.ServiceEntry))
	}
	return out
}
