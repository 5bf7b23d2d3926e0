package ambient

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

var testCfg = Config{RootNamespace: "weft-system"}

func ip(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

func ptr[T any](v T) *T { return &v }

type podOpt func(*corev1.Pod)

func newPod(ns, name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec:       corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "sa-" + name},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      "10.1.0.1",
			PodIPs:     []corev1.PodIP{{IP: "10.1.0.1"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func withLabel(k, v string) podOpt      { return func(p *corev1.Pod) { p.Labels[k] = v } }
func withAnnotation(k, v string) podOpt { return func(p *corev1.Pod) { p.Annotations[k] = v } }
func withIPs(ips ...string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.PodIPs = nil
		p.Status.PodIP = ""
		for _, s := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: s})
		}
		if len(ips) > 0 {
			p.Status.PodIP = ips[0]
		}
	}
}
func withOwner(kind, name string) podOpt {
	return func(p *corev1.Pod) {
		p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{Kind: kind, Name: name, Controller: ptr(true)})
	}
}

var hostWaypoint = &workloadpb.GatewayAddress{
	Destination:   &workloadpb.GatewayAddress_Hostname{Hostname: &workloadpb.NamespacedHostname{Namespace: "shop", Hostname: "waypoint.shop.svc.cluster.local"}},
	HboneMtlsPort: 15008,
}

func TestWorkload(t *testing.T) {
	base := func() *workloadpb.Workload {
		return &workloadpb.Workload{
			Uid: "Kubernetes//Pod/shop/cart", Name: "cart", Namespace: "shop",
			Addresses: [][]byte{ip("10.1.0.1")}, ServiceAccount: "sa-cart", Node: "node-a",
			ClusterId: "Kubernetes", WorkloadType: workloadpb.WorkloadType_POD, WorkloadName: "cart",
			CanonicalName: "cart", CanonicalRevision: "latest",
		}
	}
	wpAll := &Waypoint{Namespace: "shop", Name: "waypoint", For: "all", Address: hostWaypoint}
	tests := []struct {
		name string
		cfg  Config
		in   PodInput
		want func(w *workloadpb.Workload) *workloadpb.Workload
	}{
		{name: "plain pod", in: PodInput{Pod: newPod("shop", "cart")}, want: func(w *workloadpb.Workload) *workloadpb.Workload { return w }},
		{
			name: "redirected pod speaks HBONE",
			in:   PodInput{Pod: newPod("shop", "cart", withAnnotation("ambient.istio.io/redirection", "enabled"))},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.TunnelProtocol = workloadpb.TunnelProtocol_HBONE
				return w
			},
		},
		{
			name: "pending redirection is not HBONE",
			in:   PodInput{Pod: newPod("shop", "cart", withAnnotation("ambient.istio.io/redirection", "pending"))},
			want: func(w *workloadpb.Workload) *workloadpb.Workload { return w },
		},
		{
			name: "other trust domain is sent",
			cfg:  Config{RootNamespace: "weft-system", TrustDomain: "example.org", ClusterID: "east"},
			in:   PodInput{Pod: newPod("shop", "cart")},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.TrustDomain, w.ClusterId, w.Uid = "example.org", "east", "east//Pod/shop/cart"
				return w
			},
		},
		{
			name: "dual stack and no service account: no identity, never default",
			in: PodInput{Pod: newPod("shop", "cart", withIPs("10.1.0.1", "fd00::1"), func(p *corev1.Pod) {
				p.Spec.ServiceAccountName = ""
			})},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.Addresses = [][]byte{ip("10.1.0.1"), ip("fd00::1")}
				w.ServiceAccount = ""
				return w
			},
		},
		{
			name: "mirror pod has no identity",
			in:   PodInput{Pod: newPod("shop", "cart", withAnnotation(corev1.MirrorPodAnnotationKey, "3f6c1b"))},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.ServiceAccount = ""
				return w
			},
		},
		{
			name: "not ready is unhealthy",
			in: PodInput{Pod: newPod("shop", "cart", func(p *corev1.Pod) {
				p.Status.Conditions[0].Status = corev1.ConditionFalse
			})},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.Status = workloadpb.WorkloadStatus_UNHEALTHY
				return w
			},
		},
		{
			name: "terminating is unhealthy",
			in:   PodInput{Pod: newPod("shop", "cart", func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{} })},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.Status = workloadpb.WorkloadStatus_UNHEALTHY
				return w
			},
		},
		{name: "no IP yet", in: PodInput{Pod: newPod("shop", "cart", withIPs())}},
		{name: "succeeded", in: PodInput{Pod: newPod("shop", "cart", func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded })}},
		{name: "failed", in: PodInput{Pod: newPod("shop", "cart", func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })}},
		{
			name: "host network",
			in:   PodInput{Pod: newPod("shop", "cart", func(p *corev1.Pod) { p.Spec.HostNetwork = true })},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.NetworkMode = workloadpb.NetworkMode_HOST_NETWORK
				return w
			},
		},
		{
			name: "deployment pod",
			in:   PodInput{Pod: newPod("shop", "cart", withLabel(labelPodTemplateHash, "5d8f"), withOwner("ReplicaSet", "cart-api-5d8f"))},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.WorkloadName, w.CanonicalName = "cart-api", "cart-api"
				return w
			},
		},
		{
			name: "cronjob pod",
			in: PodInput{Pod: newPod("shop", "cart", withLabel("batch.kubernetes.io/cronjob-name", "report"),
				withOwner("Job", "report-29001234"))},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.WorkloadName, w.CanonicalName = "report", "report"
				return w
			},
		},
		{
			name: "canonical labels",
			in: PodInput{Pod: newPod("shop", "cart", withLabel("app", "web"), withLabel("version", "v2"),
				withLabel("service.istio.io/canonical-name", "storefront"))},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.CanonicalName, w.CanonicalRevision = "storefront", "v2"
				return w
			},
		},
		{
			name: "bound to a workload waypoint",
			in:   PodInput{Pod: newPod("shop", "cart"), Binding: Binding{Key: "shop/waypoint", Explicit: true}, Waypoint: wpAll},
			want: func(w *workloadpb.Workload) *workloadpb.Workload { w.Waypoint = hostWaypoint; return w },
		},
		{
			name: "service-only waypoint is not used by a pod",
			in: PodInput{Pod: newPod("shop", "cart"), Binding: Binding{Key: "shop/waypoint"},
				Waypoint: &Waypoint{Namespace: "shop", Name: "waypoint", For: "service", Address: hostWaypoint}},
			want: func(w *workloadpb.Workload) *workloadpb.Workload { return w },
		},
		{
			name: "waypoint without address is not used",
			in: PodInput{Pod: newPod("shop", "cart"), Binding: Binding{Key: "shop/waypoint"},
				Waypoint: &Waypoint{Namespace: "shop", Name: "waypoint", For: "all"}},
			want: func(w *workloadpb.Workload) *workloadpb.Workload { return w },
		},
		{
			name: "a waypoint's own pod gets no waypoint",
			in:   PodInput{Pod: newPod("shop", "cart"), Binding: Binding{Key: "shop/waypoint"}, Waypoint: wpAll, IsWaypoint: true},
			want: func(w *workloadpb.Workload) *workloadpb.Workload { return w },
		},
		{
			name: "services and policies",
			in: PodInput{Pod: newPod("shop", "cart"),
				Services: map[string][]*workloadpb.Port{"shop/cart.shop.svc.cluster.local": {{ServicePort: 80, TargetPort: 8080}}},
				Policies: []string{"shop/a", "weft-system/b"}},
			want: func(w *workloadpb.Workload) *workloadpb.Workload {
				w.Services = map[string]*workloadpb.PortList{"shop/cart.shop.svc.cluster.local": {Ports: []*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}}}}
				w.AuthorizationPolicies = []string{"shop/a", "weft-system/b"}
				return w
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.RootNamespace == "" {
				cfg = testCfg
			}
			got, _ := cfg.Workload(tc.in)
			var want *workloadpb.Workload
			if tc.want != nil {
				want = tc.want(base())
			}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("workload (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBindingFor(t *testing.T) {
	tests := []struct {
		name      string
		obj, ns   map[string]string
		want      Binding
		wantEmpty bool
	}{
		{name: "none anywhere", want: Binding{}},
		{name: "own label", obj: map[string]string{"istio.io/use-waypoint": "wp"}, want: Binding{Key: "shop/wp", Explicit: true}},
		{name: "own label other namespace", obj: map[string]string{"istio.io/use-waypoint": "wp", "istio.io/use-waypoint-namespace": "infra"},
			want: Binding{Key: "infra/wp", Explicit: true}},
		{name: "inherited", ns: map[string]string{"istio.io/use-waypoint": "ns-wp"}, want: Binding{Key: "shop/ns-wp"}},
		{name: "inherited other namespace", ns: map[string]string{"istio.io/use-waypoint": "ns-wp", "istio.io/use-waypoint-namespace": "infra"},
			want: Binding{Key: "infra/ns-wp"}},
		{name: "own wins", obj: map[string]string{"istio.io/use-waypoint": "wp"}, ns: map[string]string{"istio.io/use-waypoint": "ns-wp"},
			want: Binding{Key: "shop/wp", Explicit: true}},
		{name: "own none opts out", obj: map[string]string{"istio.io/use-waypoint": "none"}, ns: map[string]string{"istio.io/use-waypoint": "ns-wp"}},
		{name: "namespace none", ns: map[string]string{"istio.io/use-waypoint": "none"}},
		{name: "namespace's other-namespace label alone does nothing", ns: map[string]string{"istio.io/use-waypoint-namespace": "infra"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := BindingFor("shop", tc.obj, tc.ns); got != tc.want {
				t.Errorf("BindingFor = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func gateway(class string, labels map[string]string, addrs ...gwv1.GatewayStatusAddress) *gwv1.Gateway {
	return &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "waypoint", Labels: labels},
		Spec:       gwv1.GatewaySpec{GatewayClassName: gwv1.ObjectName(class)},
		Status:     gwv1.GatewayStatus{Addresses: addrs},
	}
}

func TestNewWaypoint(t *testing.T) {
	hostname := gwv1.GatewayStatusAddress{Type: ptr(gwv1.HostnameAddressType), Value: "waypoint.shop.svc.cluster.local"}
	ipAddr := gwv1.GatewayStatusAddress{Type: ptr(gwv1.IPAddressType), Value: "10.96.0.20"}
	ipWaypoint := &workloadpb.GatewayAddress{
		Destination:   &workloadpb.GatewayAddress_Address{Address: &workloadpb.NetworkAddress{Address: ip("10.96.0.20")}},
		HboneMtlsPort: 15008,
	}
	tests := []struct {
		name string
		gw   *gwv1.Gateway
		want *Waypoint
	}{
		{"not a waypoint", gateway("istio", nil, hostname), nil},
		{"no address yet", gateway("istio-waypoint", nil), &Waypoint{Namespace: "shop", Name: "waypoint", For: "service"}},
		{"hostname preferred", gateway("istio-waypoint", nil, ipAddr, hostname),
			&Waypoint{Namespace: "shop", Name: "waypoint", For: "service", Address: hostWaypoint}},
		{"ip", gateway("istio-waypoint", map[string]string{"istio.io/waypoint-for": "workload"}, ipAddr),
			&Waypoint{Namespace: "shop", Name: "waypoint", For: "workload", Address: ipWaypoint}},
		{"untyped address is an IP", gateway("istio-waypoint", nil, gwv1.GatewayStatusAddress{Value: "10.96.0.20"}),
			&Waypoint{Namespace: "shop", Name: "waypoint", For: "service", Address: ipWaypoint}},
		{"unknown waypoint-for means service", gateway("istio-waypoint", map[string]string{"istio.io/waypoint-for": "bogus"}),
			&Waypoint{Namespace: "shop", Name: "waypoint", For: "service"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := NewWaypoint(tc.gw, "")
			if tc.want != nil {
				tc.want.Attachment = Attachment{From: gwv1.NamespacesFromSame} // no listener
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform(), cmp.Comparer(Attachment.Equal)); diff != "" {
				t.Errorf("waypoint (-want +got):\n%s", diff)
			}
		})
	}
}

func newService(ns, name string, mod func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.1.1",
			ClusterIPs: []string{"10.96.1.1"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "grpc-api", Port: 9000, TargetPort: intstr.FromString("api")},
			},
		},
	}
	if mod != nil {
		mod(s)
	}
	return s
}

func TestService(t *testing.T) {
	base := func() *workloadpb.Service {
		return &workloadpb.Service{
			Name: "cart", Namespace: "shop", Hostname: "cart.shop.svc.cluster.local",
			Addresses: []*workloadpb.NetworkAddress{{Address: ip("10.96.1.1")}},
			Ports: []*workloadpb.Port{
				{ServicePort: 80, TargetPort: 8080, AppProtocol: workloadpb.AppProtocol_HTTP11},
				{ServicePort: 9000, AppProtocol: workloadpb.AppProtocol_GRPC},
			},
		}
	}
	wpSvc := &Waypoint{Namespace: "shop", Name: "waypoint", For: "service", Address: hostWaypoint}
	tests := []struct {
		name string
		in   ServiceInput
		want func(*workloadpb.Service) *workloadpb.Service
	}{
		{name: "cluster IP", in: ServiceInput{Service: newService("shop", "cart", nil)}, want: func(s *workloadpb.Service) *workloadpb.Service { return s }},
		{name: "dual stack", in: ServiceInput{Service: newService("shop", "cart", func(s *corev1.Service) {
			s.Spec.ClusterIPs = []string{"10.96.1.1", "fd00:96::1"}
		})}, want: func(s *workloadpb.Service) *workloadpb.Service {
			s.Addresses = append(s.Addresses, &workloadpb.NetworkAddress{Address: ip("fd00:96::1")})
			return s
		}},
		{name: "headless", in: ServiceInput{Service: newService("shop", "cart", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"}
		})}, want: func(s *workloadpb.Service) *workloadpb.Service { s.Addresses = nil; return s }},
		{name: "external name", in: ServiceInput{Service: newService("shop", "cart", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeExternalName
		})}},
		{name: "appProtocol field wins", in: ServiceInput{Service: newService("shop", "cart", func(s *corev1.Service) {
			s.Spec.Ports[0].AppProtocol = ptr("kubernetes.io/h2c")
		})}, want: func(s *workloadpb.Service) *workloadpb.Service {
			s.Ports[0].AppProtocol = workloadpb.AppProtocol_HTTP2
			return s
		}},
		{name: "service waypoint", in: ServiceInput{Service: newService("shop", "cart", nil), Binding: Binding{Key: "shop/waypoint"}, Waypoint: wpSvc},
			want: func(s *workloadpb.Service) *workloadpb.Service { s.Waypoint = hostWaypoint; return s }},
		{name: "ingress through the waypoint", in: ServiceInput{Service: newService("shop", "cart", func(s *corev1.Service) {
			s.Labels = map[string]string{"istio.io/ingress-use-waypoint": "true"}
		}), Binding: Binding{Key: "shop/waypoint"}, Waypoint: wpSvc},
			want: func(s *workloadpb.Service) *workloadpb.Service {
				s.Waypoint, s.IngressUseWaypoint = hostWaypoint, true
				return s
			}},
		{name: "ingress through the waypoint from the namespace", in: ServiceInput{Service: newService("shop", "cart", nil),
			Binding: Binding{Key: "shop/waypoint"}, Waypoint: wpSvc, NamespaceLabels: map[string]string{"istio.io/ingress-use-waypoint": "True"}},
			want: func(s *workloadpb.Service) *workloadpb.Service {
				s.Waypoint, s.IngressUseWaypoint = hostWaypoint, true
				return s
			}},
		{name: "the service's own ingress label wins over its namespace's", in: ServiceInput{Service: newService("shop", "cart", func(s *corev1.Service) {
			s.Labels = map[string]string{"istio.io/ingress-use-waypoint": "false"}
		}), Binding: Binding{Key: "shop/waypoint"}, Waypoint: wpSvc, NamespaceLabels: map[string]string{"istio.io/ingress-use-waypoint": "true"}},
			want: func(s *workloadpb.Service) *workloadpb.Service { s.Waypoint = hostWaypoint; return s }},
		{name: "an ingress label that is no boolean is false", in: ServiceInput{Service: newService("shop", "cart", func(s *corev1.Service) {
			s.Labels = map[string]string{"istio.io/ingress-use-waypoint": "yes"}
		}), Binding: Binding{Key: "shop/waypoint"}, Waypoint: wpSvc},
			want: func(s *workloadpb.Service) *workloadpb.Service { s.Waypoint = hostWaypoint; return s }},
		{name: "no ingress through a waypoint the service does not use", in: ServiceInput{Service: newService("shop", "cart", func(s *corev1.Service) {
			s.Labels = map[string]string{"istio.io/ingress-use-waypoint": "true"}
		})}, want: func(s *workloadpb.Service) *workloadpb.Service { return s }},
		{name: "workload-only waypoint is not used by a service", in: ServiceInput{Service: newService("shop", "cart", nil), Binding: Binding{Key: "shop/waypoint"},
			Waypoint: &Waypoint{Namespace: "shop", Name: "waypoint", For: "workload", Address: hostWaypoint}},
			want: func(s *workloadpb.Service) *workloadpb.Service { return s }},
		{name: "the waypoint's own service", in: ServiceInput{Service: newService("shop", "cart", nil), Binding: Binding{Key: "shop/waypoint"}, Waypoint: wpSvc, IsWaypoint: true},
			want: func(s *workloadpb.Service) *workloadpb.Service { return s }},
		{name: "node-local traffic policy", in: ServiceInput{Service: newService("shop", "cart", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		})}, want: func(s *workloadpb.Service) *workloadpb.Service {
			s.LoadBalancing = &workloadpb.LoadBalancing{RoutingPreference: []workloadpb.LoadBalancing_Scope{workloadpb.LoadBalancing_NODE}, Mode: workloadpb.LoadBalancing_STRICT}
			return s
		}},
		{name: "prefer close", in: ServiceInput{Service: newService("shop", "cart", func(s *corev1.Service) {
			s.Spec.TrafficDistribution = ptr(corev1.ServiceTrafficDistributionPreferClose)
		})}, want: func(s *workloadpb.Service) *workloadpb.Service {
			s.LoadBalancing = &workloadpb.LoadBalancing{RoutingPreference: []workloadpb.LoadBalancing_Scope{
				workloadpb.LoadBalancing_NETWORK, workloadpb.LoadBalancing_REGION, workloadpb.LoadBalancing_ZONE, workloadpb.LoadBalancing_SUBZONE,
			}, Mode: workloadpb.LoadBalancing_FAILOVER}
			return s
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := testCfg.Service(tc.in)
			var want *workloadpb.Service
			if tc.want != nil {
				want = tc.want(base())
			}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("service (-want +got):\n%s", diff)
			}
		})
	}
}

func TestServicePorts(t *testing.T) {
	svc := newService("shop", "cart", func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "metrics", Port: 9090, TargetPort: intstr.FromString("metrics")})
	})
	slice := &discoveryv1.EndpointSlice{Ports: []discoveryv1.EndpointPort{
		{Name: ptr("http"), Port: ptr[int32](8080)},
		{Name: ptr("grpc-api"), Port: ptr[int32](7000)},
	}}
	want := []*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 9000, TargetPort: 7000}}
	if diff := cmp.Diff(want, ServicePorts(svc, slice), protocmp.Transform()); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}
}

// FuzzWorkload feeds arbitrary pods (as JSON) to the Workload conversion:
// it must not panic, and what it produces must be well formed.
func FuzzWorkload(f *testing.F) {
	for _, p := range []*corev1.Pod{
		newPod("shop", "cart"),
		newPod("shop", "cart", withIPs("10.0.0.1", "fd00::1", "not-an-ip"), withAnnotation("ambient.istio.io/redirection", "enabled"),
			withLabel("istio.io/use-waypoint", "wp"), withOwner("ReplicaSet", "cart-7f9"), withLabel(labelPodTemplateHash, "7f9")),
	} {
		b, err := json.Marshal(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, true)
	}
	wp := &Waypoint{Namespace: "shop", Name: "wp", For: "all", Address: hostWaypoint}
	f.Fuzz(func(t *testing.T, data []byte, bound bool) {
		var p corev1.Pod
		if err := json.Unmarshal(data, &p); err != nil {
			return
		}
		in := PodInput{Pod: &p}
		if bound {
			in.Binding, in.Waypoint = BindingFor(p.Namespace, p.Labels, nil), wp
		}
		w, _ := testCfg.Workload(in)
		if w == nil {
			return
		}
		// A pod's identity is its service account, never a default one (a
		// mirror pod or a pod without one has none).
		if w.GetUid() != PodUID("Kubernetes", p.Namespace, p.Name) || len(w.GetAddresses()) == 0 || w.GetServiceAccount() != ServiceAccount(&p) {
			t.Fatalf("malformed workload %v", w)
		}
		for _, a := range w.GetAddresses() {
			if len(a) != 4 && len(a) != 16 {
				t.Fatalf("address of %d bytes", len(a))
			}
		}
		if _, err := proto.Marshal(w); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzService is FuzzWorkload for Services.
func FuzzService(f *testing.F) {
	b, err := json.Marshal(newService("shop", "cart", nil))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		var s corev1.Service
		if err := json.Unmarshal(data, &s); err != nil {
			return
		}
		svc, _ := testCfg.Service(ServiceInput{Service: &s})
		if svc == nil {
			return
		}
		if svc.GetHostname() != Hostname(s.Name, s.Namespace, "cluster.local") {
			t.Fatalf("hostname %q", svc.GetHostname())
		}
		for _, a := range svc.GetAddresses() {
			if l := len(a.GetAddress()); l != 4 && l != 16 {
				t.Fatalf("address of %d bytes", l)
			}
		}
		if _, err := proto.Marshal(svc); err != nil {
			t.Fatal(err)
		}
	})
}
