package ambient

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/reference"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/podnet"
)

func workloadEntry(name, addr string, labels map[string]string, mod func(*networkingv1.WorkloadEntry)) *networkingv1.WorkloadEntry {
	we := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: labels, Annotations: map[string]string{}}}
	we.Spec = networkingv1alpha3.WorkloadEntry{Address: addr}
	if mod != nil {
		mod(we)
	}
	return we
}

const vmUID = "Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-1"

func TestWorkloadEntryWorkload(t *testing.T) {
	base := func() *workloadpb.Workload {
		return &workloadpb.Workload{
			Uid: vmUID, Name: "vm-1", Namespace: "shop", Addresses: [][]byte{ip("192.0.2.10")},
			ClusterId: "Kubernetes", WorkloadType: workloadpb.WorkloadType_POD, WorkloadName: "vm-1",
			CanonicalName: "cart", CanonicalRevision: "latest", NetworkMode: workloadpb.NetworkMode_HOST_NETWORK,
			Status: workloadpb.WorkloadStatus_HEALTHY,
		}
	}
	app := map[string]string{"app": "cart"}
	svc := newService("shop", "cart", nil) // ports 80->8080, 9000->"api"
	tests := []struct {
		name string
		cfg  Config
		in   WorkloadEntryInput
		want func(*workloadpb.Workload) *workloadpb.Workload
	}{
		{"plain", testCfg, WorkloadEntryInput{Entry: workloadEntry("vm-1", "192.0.2.10", app, nil)},
			func(w *workloadpb.Workload) *workloadpb.Workload { return w }},
		{"ipv4-mapped address unmapped", testCfg, WorkloadEntryInput{Entry: workloadEntry("vm-1", "::ffff:192.0.2.10", app, nil)},
			func(w *workloadpb.Workload) *workloadpb.Workload { return w }},
		{"everything", Config{RootNamespace: "weft-system", TrustDomain: "example.org", Network: "n1", ClusterID: "c1"},
			WorkloadEntryInput{
				Entry: workloadEntry("vm-1", "2001:db8::10", map[string]string{"app": "meta"}, func(we *networkingv1.WorkloadEntry) {
					we.Annotations["ambient.istio.io/redirection"] = "enabled"
					we.Spec.Labels = map[string]string{"app": "spec", "version": "v2", "service.istio.io/workload-name": "vms"}
					we.Spec.ServiceAccount = "cart-sa"
					we.Spec.Network = "n1"
					we.Spec.Locality = "eu/eu-1/rack-2"
					we.Spec.Weight = 7
					we.Spec.Ports = map[string]uint32{"http": 18080, "api": 19000}
				}),
				Services: []*corev1.Service{svc},
				Policies: []string{"shop/allow"},
			},
			func(w *workloadpb.Workload) *workloadpb.Workload {
				w.Uid = "c1/networking.istio.io/WorkloadEntry/shop/vm-1"
				w.ClusterId = "c1"
				w.Addresses = [][]byte{ip("2001:db8::10")}
				w.Network, w.TrustDomain, w.ServiceAccount = "n1", "example.org", "cart-sa"
				w.TunnelProtocol = workloadpb.TunnelProtocol_HBONE
				w.WorkloadName, w.CanonicalName, w.CanonicalRevision = "vms", "meta", "v2" // metadata.labels win
				w.Locality = &workloadpb.Locality{Region: "eu", Zone: "eu-1", Subzone: "rack-2"}
				w.AuthorizationPolicies = []string{"shop/allow"}
				w.Services = map[string]*workloadpb.PortList{"shop/cart.shop.svc.cluster.local": {Ports: []*workloadpb.Port{
					{ServicePort: 80, TargetPort: 18080}, {ServicePort: 9000, TargetPort: 19000}}}}
				return w
			}},
		{"redirection annotation other than enabled", testCfg, WorkloadEntryInput{Entry: workloadEntry("vm-1", "192.0.2.10", app, func(we *networkingv1.WorkloadEntry) {
			we.Annotations["ambient.istio.io/redirection"] = "disabled"
		})}, func(w *workloadpb.Workload) *workloadpb.Workload { return w }},
		{"auto-registration group names the workload", testCfg, WorkloadEntryInput{Entry: workloadEntry("vm-1", "192.0.2.10", nil, func(we *networkingv1.WorkloadEntry) {
			we.Annotations["istio.io/autoRegistrationGroup"] = "group"
		})}, func(w *workloadpb.Workload) *workloadpb.Workload {
			w.WorkloadName, w.CanonicalName = "group", "group"
			return w
		}},
		{"zone only", testCfg, WorkloadEntryInput{Entry: workloadEntry("vm-1", "192.0.2.10", app, func(we *networkingv1.WorkloadEntry) {
			we.Spec.Locality = "eu/eu-1"
		})}, func(w *workloadpb.Workload) *workloadpb.Workload {
			w.Locality = &workloadpb.Locality{Region: "eu", Zone: "eu-1"}
			return w
		}},
		{"ExternalName Service left out", testCfg, WorkloadEntryInput{Entry: workloadEntry("vm-1", "192.0.2.10", app, nil),
			Services: []*corev1.Service{newService("shop", "ext", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName })}},
			func(w *workloadpb.Workload) *workloadpb.Workload { return w }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, refused := tc.cfg.WorkloadEntryWorkload(tc.in)
			if refused != nil {
				t.Errorf("refused %v", refused)
			}
			if diff := cmp.Diff(tc.want(base()), got, protocmp.Transform()); diff != "" {
				t.Errorf("workload (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWorkloadEntryNotApplied: an entry the webhook refuses, if one is
// stored anyway, publishes nothing: no address ztunnel must never dial, no
// hostname, no other network.
func TestWorkloadEntryNotApplied(t *testing.T) {
	for _, addr := range []string{
		"", "vm.example.com", "unix:///var/run/app.sock", "127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1",
		"0.0.0.0", "::", "0.1.2.3", "169.254.169.254", "::ffff:169.254.169.254", "fe80::1", "fe80::1%eth0",
		"224.0.0.1", "ff02::1", "255.255.255.255", "192.0.2.10/32", " 192.0.2.10",
	} {
		if w, _ := testCfg.WorkloadEntryWorkload(WorkloadEntryInput{Entry: workloadEntry("vm-1", addr, nil, nil)}); w != nil {
			t.Errorf("address %q published %v", addr, w.GetAddresses())
		}
	}
	other := workloadEntry("vm-1", "192.0.2.10", nil, func(we *networkingv1.WorkloadEntry) { we.Spec.Network = "elsewhere" })
	if w, _ := testCfg.WorkloadEntryWorkload(WorkloadEntryInput{Entry: other}); w != nil {
		t.Error("an entry on another network published")
	}
	same := Config{RootNamespace: "weft-system", Network: "elsewhere"}
	if w, _ := same.WorkloadEntryWorkload(WorkloadEntryInput{Entry: other}); w == nil {
		t.Error("an entry on the mesh's own network not published")
	}
}

func TestWorkloadEntryPorts(t *testing.T) {
	svc := newService("shop", "cart", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)},
			{Name: "grpc-api", Port: 9000, TargetPort: intstr.FromString("api")},
			{Name: "plain", Port: 7000},
			{Name: "metrics", Port: 9090, TargetPort: intstr.FromString("metrics")},
		}
	})
	tests := []struct {
		name  string
		ports map[string]uint32
		want  []*workloadpb.Port
	}{
		{"no port map: numeric target ports, named ones left out", nil,
			[]*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 7000, TargetPort: 7000}}},
		{"by service port name and target port name", map[string]uint32{"http": 18080, "api": 19000, "plain": 17000, "metrics": 19090},
			[]*workloadpb.Port{{ServicePort: 80, TargetPort: 18080}, {ServicePort: 9000, TargetPort: 19000},
				{ServicePort: 7000, TargetPort: 17000}, {ServicePort: 9090, TargetPort: 19090}}},
		{"the service port's name does not resolve a named target port", map[string]uint32{"grpc-api": 19000},
			[]*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 7000, TargetPort: 7000}}},
		{"out-of-range values ignored", map[string]uint32{"http": 70000, "api": 0},
			[]*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}, {ServicePort: 7000, TargetPort: 7000}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, WorkloadEntryPorts(svc, tc.ports), protocmp.Transform()); diff != "" {
				t.Errorf("ports (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWorkloadEntryServices(t *testing.T) {
	we := workloadEntry("vm-1", "192.0.2.10", map[string]string{"app": "cart"}, func(we *networkingv1.WorkloadEntry) {
		we.Spec.Labels = map[string]string{"tier": "db"}
	})
	sel := func(ns, name string, selector map[string]string) *corev1.Service {
		return newService(ns, name, func(s *corev1.Service) { s.Spec.Selector = selector })
	}
	svcs := []*corev1.Service{
		sel("shop", "z-both", map[string]string{"app": "cart", "tier": "db"}),
		sel("shop", "a-app", map[string]string{"app": "cart"}),
		sel("shop", "spec-label", map[string]string{"tier": "db"}),
		sel("shop", "no-selector", nil),
		sel("shop", "other-app", map[string]string{"app": "web"}),
		sel("shop", "more-labels", map[string]string{"app": "cart", "zone": "a"}),
		sel("other", "other-ns", map[string]string{"app": "cart"}),
	}
	var got []string
	for _, s := range WorkloadEntryServices(we, svcs) {
		got = append(got, s.Name)
	}
	if want := []string{"a-app", "spec-label", "z-both"}; !slices.Equal(got, want) {
		t.Errorf("selected %v, want %v", got, want)
	}
}

// TestIndexWorkloadEntry: an entry is published, updated and removed with
// its own events; a Service selecting it, or ceasing to, changes its
// services map without an event of the entry; selector policies and
// waypoints apply to it as to a pod.
func TestIndexWorkloadEntry(t *testing.T) {
	w := newWorld(t)
	w.set(kindNamespace, ns("shop", nil))
	we := workloadEntry("vm-1", "192.0.2.10", map[string]string{"app": "cart"}, nil)
	u := w.ix.process(w.set(kindWorkloadEntry, we))
	if changed, _ := names(u); !slices.Equal(changed, []string{vmUID}) {
		t.Fatalf("published %v, want the entry's Workload", changed)
	}
	if got := w.workload(vmUID).GetServices(); len(got) != 0 {
		t.Errorf("services %v before any Service", got)
	}

	// A Service that selects it: the entry's Workload carries its ports.
	svc := newService("shop", "cart", func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "cart"} })
	u = w.ix.process(w.set(kindService, svc))
	if changed, _ := names(u); !slices.Equal(changed, []string{vmUID, cartSvc}) {
		t.Errorf("a selecting Service published %v", changed)
	}
	want := map[string]*workloadpb.PortList{cartSvc: {Ports: []*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}}}}
	if diff := cmp.Diff(want, w.workload(vmUID).GetServices(), protocmp.Transform()); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	// An update of the Service that changes nothing of the entry sends
	// only the Service.
	svc2 := svc.DeepCopy()
	svc2.Spec.ClusterIPs = []string{"10.96.1.2"}
	if changed, _ := names(w.ix.process(w.set(kindService, svc2))); !slices.Equal(changed, []string{cartSvc}) {
		t.Errorf("a Service's address change published %v", changed)
	}

	// The entry's port map changes its target port.
	we2 := we.DeepCopy()
	we2.Spec.Ports = map[string]uint32{"http": 18080}
	w.ix.process(w.set(kindWorkloadEntry, we2))
	if p := w.workload(vmUID).GetServices()[cartSvc].GetPorts()[0].GetTargetPort(); p != 18080 {
		t.Errorf("target port %d after the entry's update, want 18080", p)
	}

	// The entry's labels change: the Service no longer selects it.
	we3 := we2.DeepCopy()
	we3.Labels = map[string]string{"app": "web"}
	w.ix.process(w.set(kindWorkloadEntry, we3))
	if got := w.workload(vmUID).GetServices(); len(got) != 0 {
		t.Errorf("services %v after the labels moved away", got)
	}
	// The Service's selector follows: selected again, without an event of
	// the entry.
	svc3 := svc2.DeepCopy()
	svc3.Spec.Selector = map[string]string{"app": "web"}
	w.ix.process(w.set(kindService, svc3))
	if got := w.workload(vmUID).GetServices(); len(got) != 1 {
		t.Errorf("services %v after the selector followed", got)
	}
	// The Service goes: so does the entry's port list.
	w.ix.process(w.del(kindService, svc3))
	if got := w.workload(vmUID).GetServices(); len(got) != 0 {
		t.Errorf("services %v after the Service was deleted", got)
	}

	// A selector policy selects it; removing the policy unlists it.
	pol := selectorPolicy("shop", "allow-web", map[string]string{"app": "web"})
	w.ix.process(w.set(kindPolicy, pol))
	if got := w.workload(vmUID).GetAuthorizationPolicies(); !slices.Equal(got, []string{"shop/allow-web"}) {
		t.Errorf("policies %v, want shop/allow-web", got)
	}
	w.ix.process(w.del(kindPolicy, pol))
	if got := w.workload(vmUID).GetAuthorizationPolicies(); len(got) != 0 {
		t.Errorf("policies %v after the policy was deleted", got)
	}
	// A root-namespace policy too.
	root := selectorPolicy("weft-system", "mesh", map[string]string{"app": "web"})
	w.ix.process(w.set(kindPolicy, root))
	if got := w.workload(vmUID).GetAuthorizationPolicies(); !slices.Equal(got, []string{"weft-system/mesh"}) {
		t.Errorf("policies %v, want weft-system/mesh", got)
	}

	// The namespace names a workload waypoint: the entry binds once it
	// has an address, with the Gateway's event only.
	w.ix.process(w.set(kindNamespace, ns("shop", map[string]string{"istio.io/use-waypoint": "waypoint"})))
	if w.workload(vmUID).GetWaypoint() != nil {
		t.Fatal("a waypoint without a Gateway")
	}
	addr := gwv1.GatewayStatusAddress{Type: ptr(gwv1.HostnameAddressType), Value: "waypoint.shop.svc.cluster.local"}
	u = w.ix.process(w.set(kindGateway, gateway("istio-waypoint", map[string]string{"istio.io/waypoint-for": "workload"}, addr)))
	if changed, _ := names(u); !slices.Contains(changed, vmUID) || w.workload(vmUID).GetWaypoint() == nil {
		t.Errorf("the waypoint's arrival published %v; waypoint %v", changed, w.workload(vmUID).GetWaypoint())
	}

	// Deleted: the Workload goes, and nothing remembers it.
	u = w.ix.process(w.del(kindWorkloadEntry, we3))
	if _, removed := names(u); !slices.Equal(removed, []string{vmUID}) {
		t.Errorf("the delete removed %v", removed)
	}
	if _, bound := w.ix.bindings[objRef{kindWorkloadEntry, "shop/vm-1"}]; bound {
		t.Error("the deleted entry is still bound to the waypoint")
	}

	// An entry moved to a forbidden address is withdrawn.
	w.ix.process(w.set(kindWorkloadEntry, we))
	bad := we.DeepCopy()
	bad.Spec.Address = "169.254.169.254"
	if _, removed := names(w.ix.process(w.set(kindWorkloadEntry, bad))); !slices.Equal(removed, []string{vmUID}) {
		t.Errorf("a move to a link-local address removed %v", removed)
	}
}

// TestIndexWorkloadEntryAll: the first batch (everything) publishes the
// entries with their Services, whatever the order of the stores.
func TestIndexWorkloadEntryAll(t *testing.T) {
	w := newWorld(t)
	w.set(kindNamespace, ns("shop", nil))
	w.set(kindService, newService("shop", "cart", func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "cart"} }))
	w.set(kindWorkloadEntry, workloadEntry("vm-1", "192.0.2.10", map[string]string{"app": "cart"}, nil),
		workloadEntry("vm-2", "localhost", map[string]string{"app": "cart"}, nil))
	w.ix.process(w.ix.all())
	if got := w.workload(vmUID).GetServices(); len(got) != 1 {
		t.Errorf("services %v", got)
	}
	if a := w.ix.addresses["Kubernetes/networking.istio.io/WorkloadEntry/shop/vm-2"]; a != nil {
		t.Errorf("a hostname entry published %v", a)
	}
}

// FuzzWorkloadEntryWorkload: whatever an entry holds, building its
// Workload never panics, and a published Workload has exactly one address,
// never one ztunnel must not dial, and only service ports of the
// selecting Service with target ports 1-65535.
func FuzzWorkloadEntryWorkload(f *testing.F) {
	f.Add("192.0.2.10", "http", uint32(8080), "eu/a/b", "api")
	f.Add("::ffff:169.254.169.254", "api", uint32(0), "//", "")
	f.Add("fe80::1%eth0", "", uint32(70000), "a/b/c/d", "http")
	f.Add("0.0.0.0", "grpc-api", uint32(1), "", "grpc-api")
	svc := newService("shop", "cart", func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "cart"} })
	f.Fuzz(func(t *testing.T, addr, portName string, port uint32, locality, targetName string) {
		svc := svc.DeepCopy()
		svc.Spec.Ports[1].TargetPort = intstr.FromString(targetName)
		we := workloadEntry("vm-1", addr, map[string]string{"app": "cart"}, func(we *networkingv1.WorkloadEntry) {
			we.Spec.Ports = map[string]uint32{portName: port}
			we.Spec.Locality = locality
		})
		w, _ := testCfg.WorkloadEntryWorkload(WorkloadEntryInput{Entry: we, Services: WorkloadEntryServices(we, []*corev1.Service{svc})})
		if w == nil {
			return
		}
		if len(w.GetAddresses()) != 1 {
			t.Fatalf("%d addresses", len(w.GetAddresses()))
		}
		a, ok := netip.AddrFromSlice(w.GetAddresses()[0])
		if !ok || a.Is4In6() || !podnet.EndpointAddr(a) {
			t.Fatalf("address %q published as %v", addr, a)
		}
		for _, pl := range w.GetServices() {
			for _, p := range pl.GetPorts() {
				if p.GetServicePort() != 80 && p.GetServicePort() != 9000 || p.GetTargetPort() == 0 || p.GetTargetPort() > 65535 {
					t.Fatalf("port %v", p)
				}
			}
		}
	})
}

// TestIndexWorkloadEntryDenied: an entry bound to a waypoint whose owner
// does not admit its namespace gets no waypoint, and the refusal is
// reported once, on an object an Event can refer to.
func TestIndexWorkloadEntryDenied(t *testing.T) {
	w := newWorld(t)
	w.set(kindNamespace, ns("shop", nil), ns("infra", nil))
	gw := gateway("istio-waypoint", map[string]string{"istio.io/waypoint-for": "workload"},
		gwv1.GatewayStatusAddress{Type: ptr(gwv1.HostnameAddressType), Value: "waypoint.infra.svc.cluster.local"})
	gw.Namespace = "infra"
	w.set(kindGateway, gw)
	w.ix.process(w.ix.all())
	we := workloadEntry("vm-1", "192.0.2.10", map[string]string{"istio.io/use-waypoint": "waypoint", "istio.io/use-waypoint-namespace": "infra"}, nil)
	u := w.ix.process(w.set(kindWorkloadEntry, we))
	if w.workload(vmUID).GetWaypoint() != nil {
		t.Error("bound to a waypoint that does not admit the entry's namespace")
	}
	if len(u.Denied) != 1 || u.Denied[0].Kind != "WorkloadEntry" || u.Denied[0].Key != "shop/vm-1" {
		t.Fatalf("denied %+v, want the entry once", u.Denied)
	}
	ref, err := reference.GetReference(scheme.Scheme, u.Denied[0].Object)
	if err != nil || ref.Kind != "WorkloadEntry" || ref.APIVersion != "networking.istio.io/v1" || ref.Name != "vm-1" {
		t.Errorf("Event reference %+v, %v", ref, err)
	}
	if we.Kind != "" {
		t.Error("the informer's object was changed")
	}
	if u := w.ix.process(w.set(kindWorkloadEntry, we)); len(u.Denied) != 0 {
		t.Errorf("the same refusal reported again: %+v", u.Denied)
	}
}
