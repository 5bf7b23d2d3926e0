package ambient

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// foreignWaypoint is the waypoint infra/wp serving all traffic, with an
// address, whose HBONE listener has the given allowedRoutes (nil: none).
func foreignWaypoint(allowed *gwv1.AllowedRoutes) *gwv1.Gateway {
	return &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: "infra", Name: "wp", Labels: map[string]string{"istio.io/waypoint-for": "all"}},
		Spec: gwv1.GatewaySpec{GatewayClassName: "istio-waypoint", Listeners: []gwv1.Listener{{
			Name: "mesh", Port: 15008, Protocol: "HBONE", AllowedRoutes: allowed,
		}}},
		Status: gwv1.GatewayStatus{Addresses: []gwv1.GatewayStatusAddress{{
			Type: ptr(gwv1.HostnameAddressType), Value: "wp.infra.svc.cluster.local"}}},
	}
}

func fromNamespaces(from gwv1.FromNamespaces, sel *metav1.LabelSelector) *gwv1.AllowedRoutes {
	return &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &from, Selector: sel}}
}

// TestIndexCrossNamespaceConsent binds a namespace to a waypoint of another
// namespace and checks that the binding is made only while the waypoint's
// HBONE listener admits that namespace, and that it follows changes of the
// Gateway and of the namespace's labels.
func TestIndexCrossNamespaceConsent(t *testing.T) {
	const (
		shopCart = "Kubernetes//Pod/shop/cart-1"
		infraAPI = "infra/api.infra.svc.cluster.local"
	)
	shopLabels := func(team string) map[string]string {
		return map[string]string{"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-namespace": "infra", "team": team}
	}
	w := newWorld(t)
	w.set(kindNamespace, ns("shop", shopLabels("shop")), ns("infra", map[string]string{"istio.io/use-waypoint": "wp", "team": "infra"}))
	w.set(kindPod, newPod("shop", "cart-1", withLabel("app", "cart")))
	w.set(kindService, newService("shop", "cart", nil), newService("infra", "api", nil))
	w.set(kindGateway, foreignWaypoint(nil))
	w.ix.process(w.ix.all())

	// bound checks shop's pod and Service, and the Service of the
	// waypoint's own namespace, which a selector must select too.
	bound := func(t *testing.T, want, own bool) {
		t.Helper()
		svc := w.ix.addresses[cartSvc].GetService().GetWaypoint() != nil
		pod := w.workload(shopCart).GetWaypoint() != nil
		if svc != want || pod != want {
			t.Errorf("shop/cart service bound %v, pod bound %v; want %v", svc, pod, want)
		}
		if got := w.ix.addresses[infraAPI].GetService().GetWaypoint() != nil; got != own {
			t.Errorf("infra/api, in the waypoint's own namespace, bound %v; want %v", got, own)
		}
	}
	t.Run("no allowedRoutes: only the waypoint's namespace", func(t *testing.T) { bound(t, false, true) })
	teams := func(v ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: v}}}
	}

	steps := []struct {
		name        string
		change      func() batch
		wantChanged []string
		bound, own  bool
	}{
		{
			name:   "from Same",
			change: func() batch { return w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromSame, nil))) },
			own:    true,
		},
		{
			name:        "from All",
			change:      func() batch { return w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromAll, nil))) },
			wantChanged: []string{shopCart, cartSvc},
			bound:       true, own: true,
		},
		{
			name: "from a Selector that matches shop and infra",
			change: func() batch {
				return w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromSelector, teams("shop", "infra"))))
			},
			bound: true, own: true,
		},
		{
			name:        "shop's labels change so that the selector no longer matches",
			change:      func() batch { return w.set(kindNamespace, ns("shop", shopLabels("other"))) },
			wantChanged: []string{shopCart, cartSvc},
			own:         true,
		},
		{
			name:        "and back",
			change:      func() batch { return w.set(kindNamespace, ns("shop", shopLabels("shop"))) },
			wantChanged: []string{shopCart, cartSvc},
			bound:       true, own: true,
		},
		{
			name: "a Selector that matches only infra",
			change: func() batch {
				return w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromSelector, teams("infra"))))
			},
			wantChanged: []string{shopCart, cartSvc},
			own:         true,
		},
		{
			name: "a Selector that matches only shop: the waypoint's own namespace is not special",
			change: func() batch {
				return w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromSelector, teams("shop"))))
			},
			wantChanged: []string{shopCart, infraAPI, cartSvc},
			bound:       true,
		},
		{
			name: "from Selector without a selector: nobody",
			change: func() batch {
				return w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromSelector, nil)))
			},
			wantChanged: []string{shopCart, cartSvc},
		},
		{
			name:        "back to Same",
			change:      func() batch { return w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromSame, nil))) },
			wantChanged: []string{infraAPI},
			own:         true,
		},
		{
			name: "an invalid selector: nobody",
			change: func() batch {
				return w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromSelector,
					&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "Matches"}}})))
			},
			wantChanged: []string{infraAPI},
		},
		{
			name:        "a from value of another case reads as Same",
			change:      func() batch { return w.set(kindGateway, foreignWaypoint(fromNamespaces("all", nil))) },
			wantChanged: []string{infraAPI},
			own:         true,
		},
		{
			name: "the allowedRoutes of another listener do not count",
			change: func() batch {
				gw := foreignWaypoint(nil)
				gw.Spec.Listeners = append(gw.Spec.Listeners, gwv1.Listener{Name: "other", Port: 15009, Protocol: "HBONE",
					AllowedRoutes: fromNamespaces(gwv1.NamespacesFromAll, nil)})
				return w.set(kindGateway, gw)
			},
			own: true,
		},
		{
			name: "nor do those of a listener named mesh on another port",
			change: func() batch {
				gw := foreignWaypoint(fromNamespaces(gwv1.NamespacesFromAll, nil))
				gw.Spec.Listeners[0].Port = 15009
				return w.set(kindGateway, gw)
			},
			own: true,
		},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			changed, _ := names(w.ix.process(st.change()))
			if diff := cmp.Diff(st.wantChanged, changed); diff != "" {
				t.Errorf("changed (-want +got):\n%s", diff)
			}
			bound(t, st.bound, st.own)
		})
	}
}

// TestCheck is the binding rule, case by case.
func TestCheck(t *testing.T) {
	wp := func(forKind string, allowed *gwv1.AllowedRoutes) *Waypoint {
		gw := foreignWaypoint(allowed)
		gw.Labels["istio.io/waypoint-for"] = forKind
		return NewWaypoint(gw, "")
	}
	shop := map[string]string{"team": "shop", "kubernetes.io/metadata.name": "shop"}
	byName := func(ns string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
	}
	foreign := Binding{Key: "infra/wp"}
	tests := []struct {
		name     string
		b        Binding
		wp       *Waypoint
		kind, ns string
		nsLabels map[string]string
		want     string // reason, "" when bound
	}{
		{"no binding", Binding{}, nil, "service", "shop", nil, ""},
		{"not found", foreign, nil, "service", "shop", nil, ReasonNotReady},
		{"own namespace, default", foreign, wp("service", nil), "service", "infra", nil, ""},
		{"other namespace, default", foreign, wp("service", nil), "service", "shop", shop, ReasonAttachmentDenied},
		{"other namespace, Same", foreign, wp("all", fromNamespaces(gwv1.NamespacesFromSame, nil)), "workload", "shop", shop, ReasonAttachmentDenied},
		{"other namespace, All", foreign, wp("all", fromNamespaces(gwv1.NamespacesFromAll, nil)), "workload", "shop", shop, ""},
		{"selector by name", foreign, wp("service", fromNamespaces(gwv1.NamespacesFromSelector, byName("shop"))), "service", "shop", shop, ""},
		{"selector by another name", foreign, wp("service", fromNamespaces(gwv1.NamespacesFromSelector, byName("shop2"))), "service", "shop", shop, ReasonAttachmentDenied},
		{"empty selector selects every namespace", foreign, wp("service", fromNamespaces(gwv1.NamespacesFromSelector, &metav1.LabelSelector{})), "service", "shop", nil, ""},
		{"selector and unknown namespace labels", foreign, wp("service", fromNamespaces(gwv1.NamespacesFromSelector, byName("shop"))), "service", "shop", nil, ReasonAttachmentDenied},
		{"Selector without selector", foreign, wp("service", fromNamespaces(gwv1.NamespacesFromSelector, nil)), "service", "infra", nil, ReasonAttachmentDenied},
		{"unknown from", foreign, wp("service", fromNamespaces("Everyone", nil)), "service", "shop", shop, ReasonAttachmentDenied},
		{"namespaces without from", foreign, wp("service", &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{Selector: byName("shop")}}), "service", "shop", shop, ReasonAttachmentDenied},
		{"traffic kind before consent", foreign, wp("service", nil), "workload", "shop", shop, ReasonUnsupportedTraffic},
		{"none waypoint", foreign, wp("none", fromNamespaces(gwv1.NamespacesFromAll, nil)), "service", "shop", shop, ReasonUnsupportedTraffic},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if r := Check(tc.b, tc.wp, tc.kind, tc.ns, tc.nsLabels); r != nil {
				got = r.Reason
			}
			if got != tc.want {
				t.Errorf("Check = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestIndexReportsDenialOnce checks that a denied binding is reported when
// it starts, not on every recomputation, and again after it was lifted.
func TestIndexReportsDenialOnce(t *testing.T) {
	w := newWorld(t)
	w.set(kindNamespace, ns("shop", map[string]string{"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-namespace": "infra"}))
	w.set(kindService, newService("shop", "cart", nil))
	w.set(kindPod, newPod("shop", "cart-1"))
	w.set(kindGateway, foreignWaypoint(nil))
	denied := func(u *Update) []string {
		var out []string
		for _, d := range u.Denied {
			if d.Refusal.Reason != ReasonAttachmentDenied || d.Object == nil {
				t.Errorf("denial %+v", d)
			}
			out = append(out, d.Kind+" "+d.Key)
		}
		return out
	}
	want := []string{"Service shop/cart", "Pod shop/cart-1"}
	if diff := cmp.Diff(want, denied(w.ix.process(w.ix.all()))); diff != "" {
		t.Errorf("first pass (-want +got):\n%s", diff)
	}
	if got := denied(w.ix.process(w.ix.all())); len(got) != 0 {
		t.Errorf("reported again: %v", got)
	}
	w.ix.process(w.set(kindGateway, foreignWaypoint(fromNamespaces(gwv1.NamespacesFromAll, nil))))
	if diff := cmp.Diff(want, denied(w.ix.process(w.set(kindGateway, foreignWaypoint(nil))))); diff != "" {
		t.Errorf("after the consent was withdrawn (-want +got):\n%s", diff)
	}
}
