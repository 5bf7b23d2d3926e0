package state

import (
	"net/netip"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// sliceEndpoint is a Workload as the control plane builds it for an
// EndpointSlice endpoint that is not a pod: no identity, no HBONE, a
// shared (host network) address.
func sliceEndpoint(ns, slice, addr string, healthy bool, svc string, port, target uint32) *workloadpb.Address {
	w := &workloadpb.Workload{
		Uid:         "Kubernetes/discovery.k8s.io/EndpointSlice/" + ns + "/" + slice + "/" + addr,
		Name:        slice,
		Namespace:   ns,
		Addresses:   [][]byte{ip(addr)},
		NetworkMode: workloadpb.NetworkMode_HOST_NETWORK,
		Services:    map[string]*workloadpb.PortList{svc: {Ports: []*workloadpb.Port{{ServicePort: port, TargetPort: target}}}},
	}
	if !healthy {
		w.Status = workloadpb.WorkloadStatus_UNHEALTHY
	}
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: w}}
}

// TestRouteEndpointsNotPods checks that a Service whose endpoints are not
// pods (kubernetes.default, a selectorless Service) is reached with plain
// TCP to the endpoint, and that such an endpoint never stands in for the
// pod that holds the same IP.
func TestRouteEndpointsNotPods(t *testing.T) {
	const apiKey = "default/kubernetes.default.svc.cluster.local"
	const legacyKey = "shop/legacy.shop.svc.cluster.local"
	client := pod("shop", "client", "client", "n1", "10.244.1.5", true, nil)
	api := service("default", "kubernetes", "10.96.0.1", 443, 6443)
	apiEP := sliceEndpoint("default", "kubernetes", "172.18.0.5", true, apiKey, 443, 6443)
	legacy := service("shop", "legacy", "10.96.7.7", 5432, 5432)
	// A hand-written endpoint that points at an enrolled pod's IP, under
	// the pod's own name.
	db := pod("shop", "db", "db", "n1", "10.244.1.9", true, nil)
	dbEP := sliceEndpoint("shop", "db", "10.244.1.9", true, legacyKey, 5432, 15432)
	down := sliceEndpoint("shop", "legacy-b", "10.9.0.2", false, legacyKey, 5432, 15432)

	s := load(t, client, api, apiEP, legacy, db, dbEP, down)
	src := s.WorkloadByIP(netip.MustParseAddr("10.244.1.5"))
	first := RouteOptions{Pick: func(int) int { return 0 }}

	r, err := s.Route(src, netip.MustParseAddrPort("10.96.0.1:443"), first)
	if err != nil {
		t.Fatalf("route to kubernetes.default: %v", err)
	}
	if r.Kind != Plain || r.Addr != netip.MustParseAddrPort("172.18.0.5:6443") || len(r.Peers) != 0 {
		t.Errorf("route to kubernetes.default = {%s %s peers %v}, want plain to 172.18.0.5:6443", r.Kind, r.Addr, r.Peers)
	}
	r, err = s.Route(src, netip.MustParseAddrPort("10.96.7.7:5432"), first)
	if err != nil {
		t.Fatalf("route to the selectorless Service: %v", err)
	}
	if r.Kind != Plain || r.Addr != netip.MustParseAddrPort("10.244.1.9:15432") {
		t.Errorf("route to the selectorless Service = {%s %s}, want plain to its one healthy endpoint 10.244.1.9:15432", r.Kind, r.Addr)
	}

	// The pod's IP is still the pod: HBONE to it, its identity inbound,
	// and the node agent still finds it by name.
	r, err = s.Route(src, netip.MustParseAddrPort("10.244.1.9:5432"), first)
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != Tunnel {
		t.Errorf("route to the pod's IP = %s, want hbone (an endpoint sharing its IP must not downgrade it)", r.Kind)
	}
	if w := s.WorkloadByIP(netip.MustParseAddr("10.244.1.9")); w == nil || w.UID != "Kubernetes//Pod/shop/db" {
		t.Errorf("WorkloadByIP(pod IP) = %v, want the pod", w)
	}
	if w := s.FindLocal("n1", "shop", "db", "db"); w == nil {
		t.Error("FindLocal no longer finds the pod an endpoint is named after")
	}
	// The API server's address is no workload of its own.
	if w := s.WorkloadByIP(netip.MustParseAddr("172.18.0.5")); w != nil {
		t.Errorf("WorkloadByIP(API server) = %s, want none (a shared address)", w.UID)
	}
	r, err = s.Route(src, netip.MustParseAddrPort("172.18.0.5:6443"), first)
	if err != nil || r.Kind != Passthrough {
		t.Errorf("route to the API server's address = %v, %v; want passthrough", r.Kind, err)
	}

	// Removing the endpoint leaves the pod indexed.
	if err := s.ApplyAddresses(nil, []string{name(dbEP)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Route(src, netip.MustParseAddrPort("10.96.7.7:5432"), first); err == nil {
		t.Error("route to the selectorless Service with only an unhealthy endpoint left: no error")
	}
	if w := s.WorkloadByIP(netip.MustParseAddr("10.244.1.9")); w == nil || w.UID != "Kubernetes//Pod/shop/db" {
		t.Errorf("after removing the endpoint, WorkloadByIP(pod IP) = %v, want the pod", w)
	}
}

// TestRouteHostnameEndpoint: a ServiceEntry endpoint resolved by DNS has a
// hostname and no address; the route carries the name and the target port
// for the proxy to resolve, in plain TCP. A hostname that is not a DNS
// name is refused with the workload.
func TestRouteHostnameEndpoint(t *testing.T) {
	const key = "shop/search.example"
	client := pod("shop", "client", "client", "n1", "10.244.1.5", true, nil)
	svc := &workloadpb.Address{Type: &workloadpb.Address_Service{Service: &workloadpb.Service{
		Name: "search", Namespace: "shop", Hostname: "search.example",
		Addresses: []*workloadpb.NetworkAddress{{Address: ip("240.240.1.2")}},
		Ports:     []*workloadpb.Port{{ServicePort: 443, TargetPort: 8443}},
	}}}
	ep := &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
		Uid: "Kubernetes/networking.istio.io/ServiceEntry/shop/search/search.example", Name: "search", Namespace: "shop",
		Hostname: "Search.Example.", NetworkMode: workloadpb.NetworkMode_HOST_NETWORK,
		Services: map[string]*workloadpb.PortList{key: {Ports: []*workloadpb.Port{{ServicePort: 443, TargetPort: 8443}}}},
	}}}
	s := load(t, client, svc, ep)
	src := s.WorkloadByIP(netip.MustParseAddr("10.244.1.5"))
	r, err := s.Route(src, netip.MustParseAddrPort("240.240.1.2:443"), RouteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Kind != Plain || r.Host != "search.example" || r.Addr.Port() != 8443 || r.Addr.Addr().IsValid() {
		t.Errorf("route = {%s host %q addr %s}, want plain to search.example port 8443, no address yet", r.Kind, r.Host, r.Addr)
	}
	for _, bad := range []string{"*.example", "a b.example", "http://x.example", "a..example"} {
		w := proto.Clone(ep.GetWorkload()).(*workloadpb.Workload)
		w.Hostname = bad
		if _, err := ConvertWorkload(w); err == nil {
			t.Errorf("hostname %q accepted", bad)
		}
	}
}
