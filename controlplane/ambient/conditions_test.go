package ambient

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	typev1beta1 "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/authpolicy"
)

// serviceConds maps an update's Service conditions by key.
func serviceConds(u *Update) map[string]*BindingStatus {
	out := map[string]*BindingStatus{}
	for _, c := range u.Services {
		out[c.Namespace+"/"+c.Name] = c.Condition
	}
	return out
}

// writeStatus does what the status writer would with an update's Service
// conditions, and returns the batch of the informer events that follow.
func (w *world) writeStatus(u *Update) batch {
	b := batch{}
	for _, c := range u.Services {
		svc := getObj[corev1.Service](w.stores.Services, c.Namespace+"/"+c.Name)
		if svc == nil {
			continue
		}
		svc = svc.DeepCopy()
		if c.Condition == nil {
			meta.RemoveStatusCondition(&svc.Status.Conditions, ConditionWaypointBound)
		} else {
			meta.SetStatusCondition(&svc.Status.Conditions, metav1.Condition{Type: ConditionWaypointBound,
				Status: conditionStatus(c.Condition), Reason: c.Condition.Reason, Message: c.Condition.Message})
		}
		for k := range w.set(kindService, svc)[kindService] {
			b.add(kindService, k)
		}
	}
	return b
}

// TestIndexServiceBinding follows the istio.io/WaypointBound condition of
// a Service through the ways a binding is made, refused and dropped, with
// istiod's reasons and messages.
func TestIndexServiceBinding(t *testing.T) {
	w := newWorld(t)
	shopLabels := map[string]string{"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-namespace": "infra"}
	w.set(kindNamespace, ns("shop", shopLabels), ns("infra", nil), ns("plain", nil))
	w.set(kindService, newService("shop", "cart", nil), newService("plain", "web", nil),
		newService("infra", "wp", func(s *corev1.Service) { s.Labels["gateway.networking.k8s.io/gateway-name"] = "wp" }))
	w.set(kindGateway, foreignWaypoint(nil))

	denied := &BindingStatus{Reason: ReasonAttachmentDenied,
		Message: `we are not permitted to attach to waypoint "infra/wp" (missing allowedRoutes?)`}
	bound := &BindingStatus{Bound: true, Reason: ReasonWaypointAccepted, Waypoint: "infra/wp",
		Message: "Successfully attached to waypoint infra/wp"}
	// Every Service is reported on the first pass, those that ask for no
	// waypoint (or are a waypoint's own) with none, so that a condition
	// left from before is removed.
	want := map[string]*BindingStatus{"shop/cart": denied, "plain/web": nil, "infra/wp": nil}
	u := w.ix.process(w.ix.all())
	if diff := cmp.Diff(want, serviceConds(u)); diff != "" {
		t.Fatalf("first pass (-want +got):\n%s", diff)
	}
	// The status written, nothing more is reported: not for the write's
	// own events, not for another pass.
	if got := serviceConds(w.ix.process(w.writeStatus(u))); len(got) != 0 {
		t.Errorf("the Services' own status writes reported again: %v", got)
	}
	if got := serviceConds(w.ix.process(w.ix.all())); len(got) != 0 {
		t.Errorf("unchanged conditions reported again: %v", got)
	}

	steps := []struct {
		name   string
		change func() batch
		want   map[string]*BindingStatus
	}{
		{"the owner admits every namespace", func() batch {
			return w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromAll, nil)))
		}, map[string]*BindingStatus{"shop/cart": bound}},
		{"the waypoint serves workloads only", func() batch {
			gw := foreignWaypoint(fromNamespaces(gwv1.NamespacesFromAll, nil))
			gw.Labels["istio.io/waypoint-for"] = "workload"
			return w.set(kindGateway, gw)
		}, map[string]*BindingStatus{"shop/cart": {Reason: ReasonUnsupportedTraffic,
			Message: `attempting to bind to traffic type "service" which the waypoint "infra/wp" does not support`}}},
		{"the waypoint has no address", func() batch {
			gw := foreignWaypoint(fromNamespaces(gwv1.NamespacesFromAll, nil))
			gw.Status.Addresses = nil
			return w.set(kindGateway, gw)
		}, map[string]*BindingStatus{"shop/cart": {Reason: ReasonNotReady, Message: `waypoint "infra/wp" is not ready`}}},
		{"the waypoint is deleted: same words", func() batch { return w.del(kindGateway, foreignWaypoint(nil)) }, nil},
		{"the Service opts out", func() batch {
			return w.set(kindService, newService("shop", "cart", func(s *corev1.Service) { s.Labels["istio.io/use-waypoint"] = "none" }))
		}, map[string]*BindingStatus{"shop/cart": nil}},
		{"a Service of a namespace the waypoint does not admit asks by its own labels", func() batch {
			w.ix.process(w.set(kindGateway, foreignWaypoint(nil)))
			return w.set(kindService, newService("plain", "web", func(s *corev1.Service) {
				s.Labels["istio.io/use-waypoint"] = "wp"
				s.Labels["istio.io/use-waypoint-namespace"] = "infra"
			}))
		}, map[string]*BindingStatus{"plain/web": denied}},
		{"another writer changes the condition: it is put back", func() batch {
			svc := newService("plain", "web", func(s *corev1.Service) {
				s.Labels["istio.io/use-waypoint"] = "wp"
				s.Labels["istio.io/use-waypoint-namespace"] = "infra"
			})
			svc.Status.Conditions = []metav1.Condition{{Type: ConditionWaypointBound, Status: metav1.ConditionTrue, Reason: ReasonWaypointAccepted}}
			return w.set(kindService, svc)
		}, map[string]*BindingStatus{"plain/web": denied}},
		{"another writer adds the condition to a Service that asks for none: it is removed", func() batch {
			svc := newService("shop", "cart", func(s *corev1.Service) { s.Labels["istio.io/use-waypoint"] = "none" })
			svc.Status.Conditions = []metav1.Condition{{Type: ConditionWaypointBound, Status: metav1.ConditionTrue, Reason: ReasonWaypointAccepted}}
			return w.set(kindService, svc)
		}, map[string]*BindingStatus{"shop/cart": nil}},
		{"the Service is deleted: nothing to write", func() batch { return w.del(kindService, newService("plain", "web", nil)) }, nil},
	}
	for _, s := range steps {
		u := w.ix.process(s.change())
		if s.want == nil {
			s.want = map[string]*BindingStatus{}
		}
		if diff := cmp.Diff(s.want, serviceConds(u)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s.name, diff)
		}
		if got := serviceConds(w.ix.process(w.writeStatus(u))); len(got) != 0 {
			t.Errorf("%s: the status write reported again: %v", s.name, got)
		}
	}
}

// fakeLookup is a policyLookup over fixed maps.
type fakeLookup struct {
	waypoints map[string]bool
	services  map[string]*BindingStatus // present: the Service exists
	entries   map[string]*BindingStatus // present: the ServiceEntry exists
}

func (f fakeLookup) serviceEntryBinding(key string) (bool, *BindingStatus) {
	b, ok := f.entries[key]
	return ok, b
}

func (f fakeLookup) waypointReady(key string) bool { return f.waypoints[key] }
func (f fakeLookup) serviceBinding(key string) (bool, *BindingStatus) {
	b, ok := f.services[key]
	return ok, b
}

func targetPolicy(ns string, refs ...*typev1beta1.PolicyTargetReference) *securityv1.AuthorizationPolicy {
	p := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p", Generation: 1}}
	p.Spec.TargetRefs = refs
	return p
}

func ref(group, kind, name string) *typev1beta1.PolicyTargetReference {
	return &typev1beta1.PolicyTargetReference{Group: group, Kind: kind, Name: name}
}

func TestWaypointAccepted(t *testing.T) {
	look := fakeLookup{
		waypoints: map[string]bool{"shop/wp": true},
		entries: map[string]*BindingStatus{"shop/se": nil,
			"shop/egress": {Bound: true, Reason: ReasonWaypointAccepted, Waypoint: "shop/wp"}},
		services: map[string]*BindingStatus{
			"shop/bound":   {Bound: true, Reason: ReasonWaypointAccepted, Waypoint: "shop/wp"},
			"shop/refused": {Reason: ReasonAttachmentDenied},
			"shop/plain":   nil,
		},
	}
	gw := func(name string) *typev1beta1.PolicyTargetReference {
		return ref("gateway.networking.k8s.io", "Gateway", name)
	}
	svc := func(name string) *typev1beta1.PolicyTargetReference { return ref("", "Service", name) }
	class := ref("gateway.networking.k8s.io", "GatewayClass", "istio-waypoint")
	cond := func(ok bool, reason, msg string) *authpolicy.Condition {
		return &authpolicy.Condition{Status: ok, Reason: reason, Message: msg}
	}
	tests := []struct {
		name string
		p    *securityv1.AuthorizationPolicy
		want *authpolicy.Condition
	}{
		{"no targetRefs: not a waypoint policy", targetPolicy("shop"), nil},
		{"waypoint Gateway", targetPolicy("shop", gw("wp")), cond(true, "Accepted", "bound to shop/wp")},
		{"singular targetRef", func() *securityv1.AuthorizationPolicy {
			p := targetPolicy("shop")
			p.Spec.TargetRef = gw("wp")
			return p
		}(), cond(true, "Accepted", "bound to shop/wp")},
		{"Gateway that is no ready waypoint", targetPolicy("shop", gw("ghost")), cond(false, "TargetNotFound", "not bound")},
		{"bound Service", targetPolicy("shop", svc("bound")), cond(true, "Accepted", "bound to shop/wp")},
		{"Service of group core", targetPolicy("shop", ref("core", "Service", "bound")), cond(true, "Accepted", "bound to shop/wp")},
		{"Service whose binding is refused", targetPolicy("shop", svc("refused")),
			cond(false, "AncestorNotBound", "Service shop/refused is not bound to a waypoint")},
		{"Service with no waypoint", targetPolicy("shop", svc("plain")),
			cond(false, "AncestorNotBound", "Service shop/plain is not bound to a waypoint")},
		{"missing Service", targetPolicy("shop", svc("ghost")), cond(false, "TargetNotFound", "Service shop/ghost was not found")},
		{"ServiceEntry", targetPolicy("shop", ref("networking.istio.io", "ServiceEntry", "se")),
			cond(false, "AncestorNotBound", "ServiceEntry shop/se is not bound to a waypoint")},
		{"bound ServiceEntry", targetPolicy("shop", ref("networking.istio.io", "ServiceEntry", "egress")),
			cond(true, "Accepted", "bound to shop/wp")},
		{"missing ServiceEntry", targetPolicy("shop", ref("networking.istio.io", "ServiceEntry", "ghost")),
			cond(false, "TargetNotFound", "ServiceEntry shop/ghost was not found")},
		{"waypoint class from the root namespace", targetPolicy("istio-system", class), cond(true, "Accepted", "bound to istio-waypoint")},
		{"waypoint class from another namespace", targetPolicy("shop", class),
			cond(false, "Invalid", "AuthorizationPolicy must be in the root namespace `istio-system` when referencing a GatewayClass")},
		{"another class", targetPolicy("istio-system", ref("gateway.networking.k8s.io", "GatewayClass", "istio")),
			cond(false, "TargetNotFound", "not bound")},
		{"a Gateway kind of another group", targetPolicy("shop", ref("example.com", "Gateway", "wp")), cond(false, "unknown", "not bound")},
		{"a target in another namespace", targetPolicy("other", func() *typev1beta1.PolicyTargetReference {
			r := gw("wp")
			r.Namespace = "shop"
			return r
		}()), cond(false, "Invalid", "targetRef namespace shop is not the policy's: a policy binds only to targets of its own namespace")},
		{"all bound", targetPolicy("shop", gw("wp"), svc("bound")), cond(true, "Accepted", "")},
		{"some bound", targetPolicy("shop", gw("wp"), svc("plain"), svc("ghost")),
			cond(true, "PartiallyInvalid", "Invalid targetRefs: Service.core:shop/plain, Service.core:shop/ghost")},
		{"none bound", targetPolicy("shop", gw("ghost"), svc("plain")),
			cond(false, "Invalid", "Invalid targetRefs: Gateway.gateway.networking.k8s.io:shop/ghost, Service.core:shop/plain")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, waypointAccepted(tc.p, "istio-system", look)); diff != "" {
				t.Errorf("condition (-want +got):\n%s", diff)
			}
		})
	}
}

// waypointConds are an update's WaypointAccepted conditions by policy key.
func waypointConds(u *Update) map[string]*authpolicy.Condition {
	out := map[string]*authpolicy.Condition{}
	for _, c := range u.Conditions {
		if c.Type == authpolicy.WaypointConditionType {
			out[c.Namespace+"/"+c.Name] = c.Condition
		}
	}
	return out
}

// TestIndexWaypointPolicy checks that a policy's WaypointAccepted follows
// the binding of the Service it targets, and that a policy without
// targetRefs is reported once, with none.
func TestIndexWaypointPolicy(t *testing.T) {
	w := newWorld(t)
	w.set(kindNamespace, ns("shop", nil))
	w.set(kindService, newService("shop", "cart", nil))
	w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromAll, nil)))
	w.set(kindPolicy, targetPolicy("shop", ref("", "Service", "cart")), selectorPolicy("shop", "l4", nil))
	notBound := &authpolicy.Condition{Reason: "AncestorNotBound", Message: "Service shop/cart is not bound to a waypoint"}
	want := map[string]*authpolicy.Condition{"shop/p": notBound, "shop/l4": nil}
	if diff := cmp.Diff(want, waypointConds(w.ix.process(w.ix.all()))); diff != "" {
		t.Fatalf("first pass (-want +got):\n%s", diff)
	}
	bind := newService("shop", "cart", func(s *corev1.Service) {
		s.Labels["istio.io/use-waypoint"] = "wp"
		s.Labels["istio.io/use-waypoint-namespace"] = "infra"
	})
	want = map[string]*authpolicy.Condition{"shop/p": {Status: true, Reason: "Accepted", Message: "bound to infra/wp"}}
	if diff := cmp.Diff(want, waypointConds(w.ix.process(w.set(kindService, bind)))); diff != "" {
		t.Errorf("Service bound (-want +got):\n%s", diff)
	}
	if got := waypointConds(w.ix.process(w.set(kindService, bind))); len(got) != 0 {
		t.Errorf("unchanged condition reported again: %v", got)
	}
	// The waypoint withdraws its consent: the Service is refused, and so
	// is the policy.
	want = map[string]*authpolicy.Condition{"shop/p": notBound}
	if diff := cmp.Diff(want, waypointConds(w.ix.process(w.set(kindGateway, foreignWaypoint(nil))))); diff != "" {
		t.Errorf("consent withdrawn (-want +got):\n%s", diff)
	}
}
