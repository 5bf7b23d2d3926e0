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

	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// apiServerService is the shape of kubernetes.default: no selector, 443 to
// the API server's secure port.
func apiServerService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.1",
			ClusterIPs: []string{"10.96.0.1"},
			Ports:      []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(6443)}},
		},
	}
}

// apiServerSlice is the EndpointSlice the API server writes for itself:
// its address, no targetRef.
func apiServerSlice(addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "kubernetes", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(6443)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}})
	}
	return s
}

// selectorless is a Service without a selector, whose endpoints a user
// writes by hand.
func selectorless(mod func(*corev1.Service)) *corev1.Service {
	return newService("shop", "legacy", func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.7.7", []string{"10.96.7.7"}
		s.Spec.Ports = []corev1.ServicePort{{Name: "db", Port: 5432, TargetPort: intstr.FromInt32(5432)}}
		if mod != nil {
			mod(s)
		}
	})
}

func ep(ready *bool, addrs ...string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
}

func handSlice(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "legacy"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("db"), Port: ptr(int32(15432)), Protocol: ptr(corev1.ProtocolTCP)}},
		Endpoints:   eps,
	}
}

const (
	apiServerUID = "Kubernetes/discovery.k8s.io/EndpointSlice/default/kubernetes/172.18.0.5"
	legacySvc    = "shop/legacy.shop.svc.cluster.local"
)

// TestIndexAPIServerEndpoints checks that kubernetes.default, whose
// endpoint is the API server and not a pod, has an endpoint: a workload
// with the slice's address and port, no identity and no HBONE.
func TestIndexAPIServerEndpoints(t *testing.T) {
	w := newWorld(t)
	w.set(kindNamespace, ns("default", nil))
	w.set(kindService, apiServerService())
	w.set(kindEndpointSlice, apiServerSlice("172.18.0.5"))
	w.ix.process(w.ix.all())

	a := w.ix.addresses[apiServerUID]
	if a == nil {
		t.Fatalf("no workload %s published; have %v", apiServerUID, sortedKeys(w.ix.addresses))
	}
	want := &workloadpb.Workload{
		Uid:         apiServerUID,
		Name:        "kubernetes",
		Namespace:   "default",
		Addresses:   [][]byte{ip("172.18.0.5")},
		ClusterId:   "Kubernetes",
		Status:      workloadpb.WorkloadStatus_HEALTHY,
		NetworkMode: workloadpb.NetworkMode_HOST_NETWORK,
		Services: map[string]*workloadpb.PortList{
			"default/kubernetes.default.svc.cluster.local": {Ports: []*workloadpb.Port{{ServicePort: 443, TargetPort: 6443}}},
		},
	}
	if diff := cmp.Diff(want, a.GetWorkload(), protocmp.Transform()); diff != "" {
		t.Errorf("API server workload (-want +got):\n%s", diff)
	}

	// The API server moves: the old address goes, the new one comes.
	u := w.ix.process(w.set(kindEndpointSlice, apiServerSlice("172.18.0.6")))
	changed, removed := names(u)
	if diff := cmp.Diff([]string{"Kubernetes/discovery.k8s.io/EndpointSlice/default/kubernetes/172.18.0.6"}, changed); diff != "" {
		t.Errorf("after the move, changed (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{apiServerUID}, removed); diff != "" {
		t.Errorf("after the move, removed (-want +got):\n%s", diff)
	}
}

// TestIndexSelectorlessService drives a selectorless Service with
// hand-written EndpointSlices through its changes.
func TestIndexSelectorlessService(t *testing.T) {
	uid := func(slice, addr string) string {
		return "Kubernetes/discovery.k8s.io/EndpointSlice/shop/" + slice + "/" + addr
	}
	w := newWorld(t)
	w.set(kindNamespace, ns("shop", nil))
	w.set(kindPod, newPod("shop", "db-0"))
	w.set(kindService, selectorless(nil))
	w.set(kindEndpointSlice,
		handSlice("legacy-a",
			ep(nil, "10.9.0.1"),                  // no condition: ready
			ep(ptr(false), "10.9.0.2"),           // not ready
			ep(ptr(true), "10.9.0.1"),            // the same address again: one workload
			ep(ptr(true), "not-an-ip"),           // skipped
			ep(ptr(true), "127.0.0.1"),           // loopback: skipped
			ep(ptr(true), "::ffff:127.0.0.1"),    // loopback, v4-mapped: skipped
			ep(ptr(true), "169.254.169.254"),     // link-local: skipped
			ep(ptr(true), "0.0.0.0"),             // unspecified: skipped
			ep(ptr(true), "fe80::1%eth0"),        // zoned: skipped
			ep(ptr(true), "::ffff:10.9.0.3"),     // v4-mapped: the v4 address
			discoveryv1.Endpoint{Addresses: nil}, // no address: skipped
		),
		func() *discoveryv1.EndpointSlice {
			// An endpoint naming a pod is the pod's workload, not another.
			s := handSlice("legacy-b")
			s.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.9"}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "db-0"}}}
			return s
		}(),
		func() *discoveryv1.EndpointSlice {
			s := handSlice("legacy-fqdn", ep(nil, "db.example.com"))
			s.AddressType = discoveryv1.AddressTypeFQDN
			return s
		}(),
	)
	u := w.ix.process(w.ix.all())
	changed, _ := names(u)
	want := []string{"Kubernetes//Pod/shop/db-0", uid("legacy-a", "10.9.0.1"), uid("legacy-a", "10.9.0.2"), uid("legacy-a", "10.9.0.3"), legacySvc}
	if diff := cmp.Diff(want, changed); diff != "" {
		t.Fatalf("initial resources (-want +got):\n%s", diff)
	}
	if got := w.workload("Kubernetes//Pod/shop/db-0").GetServices()[legacySvc].GetPorts(); len(got) != 1 || got[0].GetTargetPort() != 15432 {
		t.Errorf("db-0 ports for %s = %v, want 5432->15432", legacySvc, got)
	}
	for _, a := range []string{"10.9.0.1", "10.9.0.3"} {
		got := w.workload(uid("legacy-a", a))
		if got.GetStatus() != workloadpb.WorkloadStatus_HEALTHY || got.GetTunnelProtocol() != workloadpb.TunnelProtocol_NONE || got.GetServiceAccount() != "" {
			t.Errorf("%s: status %v, tunnel %v, service account %q; want healthy, plaintext, no identity", a, got.GetStatus(), got.GetTunnelProtocol(), got.GetServiceAccount())
		}
		if ports := got.GetServices()[legacySvc].GetPorts(); len(ports) != 1 || ports[0].GetServicePort() != 5432 || ports[0].GetTargetPort() != 15432 {
			t.Errorf("%s: ports %v, want 5432->15432", a, ports)
		}
	}
	if got := w.workload(uid("legacy-a", "10.9.0.2")).GetStatus(); got != workloadpb.WorkloadStatus_UNHEALTHY {
		t.Errorf("not-ready endpoint status = %v, want UNHEALTHY", got)
	}

	steps := []struct {
		name                     string
		change                   func() batch
		wantChanged, wantRemoved []string
	}{
		{
			name:   "recomputing everything again publishes nothing",
			change: func() batch { return w.ix.all() },
		},
		{
			name: "the Service publishes not-ready addresses: the not-ready endpoint is healthy",
			change: func() batch {
				return w.set(kindService, selectorless(func(s *corev1.Service) { s.Spec.PublishNotReadyAddresses = true }))
			},
			wantChanged: []string{uid("legacy-a", "10.9.0.2")},
		},
		{
			name: "the Service's port changes: its endpoints follow",
			change: func() batch {
				return w.set(kindService, selectorless(func(s *corev1.Service) {
					s.Spec.PublishNotReadyAddresses = true
					s.Spec.Ports[0].Port = 5433
				}))
			},
			wantChanged: []string{"Kubernetes//Pod/shop/db-0", uid("legacy-a", "10.9.0.1"), uid("legacy-a", "10.9.0.2"), uid("legacy-a", "10.9.0.3"), legacySvc},
		},
		{
			name: "an endpoint leaves the slice: its workload is removed",
			change: func() batch {
				return w.set(kindEndpointSlice, handSlice("legacy-a", ep(nil, "10.9.0.1"), ep(nil, "10.9.0.2")))
			},
			wantRemoved: []string{uid("legacy-a", "10.9.0.3")},
		},
		{
			name:        "the slice is deleted: its workloads are removed",
			change:      func() batch { return w.del(kindEndpointSlice, handSlice("legacy-a")) },
			wantRemoved: []string{uid("legacy-a", "10.9.0.1"), uid("legacy-a", "10.9.0.2")},
		},
		{
			name: "a slice for a Service that does not exist: nothing",
			change: func() batch {
				return w.set(kindEndpointSlice, handSlice("legacy-a", ep(nil, "10.9.0.1")), apiServerSlice("172.18.0.5"))
			},
			// legacy exists, kubernetes does not.
			wantChanged: []string{uid("legacy-a", "10.9.0.1")},
		},
		{
			name:        "the Service is deleted: its endpoints go with it",
			change:      func() batch { return w.del(kindService, selectorless(nil)) },
			wantChanged: []string{"Kubernetes//Pod/shop/db-0"},
			wantRemoved: []string{uid("legacy-a", "10.9.0.1"), legacySvc},
		},
		{
			name:        "the Service comes back: so do its endpoints",
			change:      func() batch { return w.set(kindService, selectorless(nil)) },
			wantChanged: []string{"Kubernetes//Pod/shop/db-0", uid("legacy-a", "10.9.0.1"), legacySvc},
		},
		{
			name: "it becomes an ExternalName Service: no endpoints",
			change: func() batch {
				return w.set(kindService, selectorless(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }))
			},
			wantChanged: []string{"Kubernetes//Pod/shop/db-0"},
			wantRemoved: []string{uid("legacy-a", "10.9.0.1"), legacySvc},
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
	}
}

// FuzzSliceWorkloads feeds arbitrary EndpointSlices (as JSON), which users
// may write by hand, to SliceWorkloads: it must not panic, and every
// Workload must be well formed, uniquely named, without identity or HBONE,
// and never at an address that sends ztunnel to itself.
func FuzzSliceWorkloads(f *testing.F) {
	for _, s := range []*discoveryv1.EndpointSlice{
		apiServerSlice("172.18.0.5", "fd00::5"),
		handSlice("legacy-a", ep(nil, "10.9.0.1"), ep(ptr(false), "10.9.0.2", "10.9.0.3"), ep(ptr(true), "127.0.0.1"), ep(nil, "::ffff:10.9.0.1")),
	} {
		b, err := json.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
	}
	f.Fuzz(func(t *testing.T, data []byte, publishNotReady bool) {
		var s discoveryv1.EndpointSlice
		if err := json.Unmarshal(data, &s); err != nil {
			return
		}
		svc := selectorless(func(svc *corev1.Service) {
			svc.Namespace, svc.Name = s.Namespace, s.Labels[discoveryv1.LabelServiceName]
			svc.Spec.PublishNotReadyAddresses = publishNotReady
		})
		seen := map[string]bool{}
		for _, w := range testCfg.SliceWorkloads(svc, &s) {
			if seen[w.GetUid()] {
				t.Fatalf("uid %s twice", w.GetUid())
			}
			seen[w.GetUid()] = true
			if len(w.GetAddresses()) == 0 || w.GetServiceAccount() != "" || w.GetTunnelProtocol() != workloadpb.TunnelProtocol_NONE ||
				w.GetNetworkMode() != workloadpb.NetworkMode_HOST_NETWORK || w.GetNamespace() != s.Namespace {
				t.Fatalf("malformed workload %v", w)
			}
			for _, raw := range w.GetAddresses() {
				a, ok := netip.AddrFromSlice(raw)
				if !ok || a.Is4In6() || a.IsLoopback() || a.IsUnspecified() || a.IsLinkLocalUnicast() || a.IsMulticast() {
					t.Fatalf("address %v in %s", raw, w.GetUid())
				}
			}
			if _, err := proto.Marshal(w); err != nil {
				t.Fatal(err)
			}
		}
	})
}
