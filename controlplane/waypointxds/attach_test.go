package waypointxds

import (
	"strings"
	"testing"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/ambient"
)

// TestCrossNamespaceBinding checks that a waypoint holds the chains of a
// Service or pod of another namespace only when its HBONE listener's
// allowedRoutes admit that namespace.
func TestCrossNamespaceBinding(t *testing.T) {
	st := Stores{Services: newIndexer(), Pods: newIndexer(), Namespaces: newIndexer(), EndpointSlices: newIndexer()}
	add := func(s interface{ Add(any) error }, obj any) {
		if err := s.Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	add(st.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Labels: map[string]string{
		"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-namespace": "infra", "team": "shop"}}})
	add(st.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "infra", Labels: map[string]string{"istio.io/use-waypoint": "wp", "team": "infra"}}})
	for _, ns := range []string{"shop", "infra"} {
		add(st.Services, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []corev1.ServicePort{{Name: "tcp", Port: 9000}}}})
		add(st.Pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api-1"},
			Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.1.0.1"}}}})
	}
	gateway := func(allowed *gwv1.AllowedRoutes) *gwv1.Gateway {
		return &gwv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Namespace: "infra", Name: "wp", Labels: map[string]string{"istio.io/waypoint-for": "all"}},
			Spec: gwv1.GatewaySpec{GatewayClassName: "istio-waypoint", Listeners: []gwv1.Listener{{
				Name: "mesh", Port: 15008, Protocol: "HBONE", AllowedRoutes: allowed}}},
		}
	}
	from := func(f gwv1.FromNamespaces, sel *metav1.LabelSelector) *gwv1.AllowedRoutes {
		return &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: &f, Selector: sel}}
	}
	own := []string{"api.infra.svc.cluster.local:9000", "workload/infra/api-1"}
	all := []string{"api.infra.svc.cluster.local:9000", "api.shop.svc.cluster.local:9000", "workload/infra/api-1", "workload/shop/api-1"}
	tests := []struct {
		name    string
		allowed *gwv1.AllowedRoutes
		want    []string
	}{
		{"no allowedRoutes", nil, own},
		{"Same", from(gwv1.NamespacesFromSame, nil), own},
		{"All", from(gwv1.NamespacesFromAll, nil), all},
		{"Selector matching both namespaces", from(gwv1.NamespacesFromSelector, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"shop", "infra"}}}}), all},
		{"Selector matching only the other namespace", from(gwv1.NamespacesFromSelector, &metav1.LabelSelector{MatchLabels: map[string]string{"team": "shop"}}),
			[]string{"api.shop.svc.cluster.local:9000", "workload/shop/api-1"}},
		{"Selector matching neither namespace", from(gwv1.NamespacesFromSelector, &metav1.LabelSelector{MatchLabels: map[string]string{"team": "x"}}), nil},
		{"Selector without selector", from(gwv1.NamespacesFromSelector, nil), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, rep := Build(testMesh, ambient.NewWaypoint(gateway(tc.allowed), ""), st)
			var got []string
			for _, fc := range res[resource.ListenerType][ListenerName].(*listenerv3.Listener).GetFilterChains() {
				// A sniffed port's TCP twin follows its HTTP chain.
				if !strings.HasSuffix(fc.GetName(), "/tcp") {
					got = append(got, fc.GetName())
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("filter chains (-want +got):\n%s", diff)
			}
			if tc.name == "Same" {
				want := []string{
					"Services of namespace shop ask for this waypoint, whose allowedRoutes do not admit that namespace",
					"Pods of namespace shop ask for this waypoint, whose allowedRoutes do not admit that namespace",
				}
				if diff := cmp.Diff(want, rep.Notes); diff != "" {
					t.Errorf("notes (-want +got):\n%s", diff)
				}
			}
		})
	}
}
