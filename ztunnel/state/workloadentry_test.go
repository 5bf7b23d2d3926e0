package state

import (
	"net/netip"
	"testing"

	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// entryWorkload is a Workload as the control plane builds it for a
// WorkloadEntry: an address typed in by a user, a service account, shared
// (host network), HBONE only when annotated.
func entryWorkload(name, addr, sa string, hbone bool, svc string, port, target uint32) *workloadpb.Address {
	w := &workloadpb.Workload{
		Uid:            "Kubernetes/networking.istio.io/WorkloadEntry/shop/" + name,
		Name:           name,
		Namespace:      "shop",
		Addresses:      [][]byte{ip(addr)},
		ServiceAccount: sa,
		WorkloadType:   workloadpb.WorkloadType_POD,
		NetworkMode:    workloadpb.NetworkMode_HOST_NETWORK,
		Status:         workloadpb.WorkloadStatus_HEALTHY,
		Services:       map[string]*workloadpb.PortList{svc: {Ports: []*workloadpb.Port{{ServicePort: port, TargetPort: target}}}},
	}
	if hbone {
		w.TunnelProtocol = workloadpb.TunnelProtocol_HBONE
	}
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: w}}
}

// TestRouteWorkloadEntry: a Service whose endpoint is a WorkloadEntry is
// reached in plain TCP at the entry's address and target port (HBONE, to
// the entry's identity, when it is annotated so), and an entry written
// with an enrolled pod's IP, name and node-less never stands in for the
// pod: not by IP, not by name, not as a local pod.
func TestRouteWorkloadEntry(t *testing.T) {
	const vmKey = "shop/vm.shop.svc.cluster.local"
	client := pod("shop", "client", "client", "n1", "10.244.1.5", true, nil)
	vm := service("shop", "vm", "10.96.8.8", 80, 80)
	vmEP := entryWorkload("vm-1", "192.0.2.10", "", false, vmKey, 80, 18080)
	secure := service("shop", "secure", "10.96.8.9", 443, 443)
	secureEP := entryWorkload("vm-2", "192.0.2.11", "vm-sa", true, "shop/secure.shop.svc.cluster.local", 443, 8443)
	db := pod("shop", "db", "db", "n1", "10.244.1.9", true, nil)
	// A WorkloadEntry named as the pod, at its IP, claiming another
	// identity.
	spoof := entryWorkload("db", "10.244.1.9", "admin", false, "shop/other.shop.svc.cluster.local", 80, 5432)

	s := load(t, client, vm, vmEP, secure, secureEP, db, spoof)
	src := s.WorkloadByIP(netip.MustParseAddr("10.244.1.5"))
	first := RouteOptions{Pick: func(int) int { return 0 }}

	r, err := s.Route(src, netip.MustParseAddrPort("10.96.8.8:80"), first)
	if err != nil {
		t.Fatalf("route to the VM's Service: %v", err)
	}
	if r.Kind != Plain || r.Addr != netip.MustParseAddrPort("192.0.2.10:18080") || len(r.Peers) != 0 {
		t.Errorf("route to the VM's Service = {%s %s peers %v}, want plain to 192.0.2.10:18080", r.Kind, r.Addr, r.Peers)
	}
	r, err = s.Route(src, netip.MustParseAddrPort("10.96.8.9:443"), first)
	if err != nil {
		t.Fatalf("route to the HBONE VM's Service: %v", err)
	}
	if r.Kind != Tunnel || r.Addr != netip.MustParseAddrPort("192.0.2.11:15008") ||
		len(r.Peers) != 1 || r.Peers[0].String() != "spiffe://cluster.local/ns/shop/sa/vm-sa" {
		t.Errorf("route to the HBONE VM's Service = {%s %s peers %v}, want hbone to 192.0.2.11:15008 as vm-sa", r.Kind, r.Addr, r.Peers)
	}

	// The pod's IP is still the pod.
	if w := s.WorkloadByIP(netip.MustParseAddr("10.244.1.9")); w == nil || w.UID != "Kubernetes//Pod/shop/db" {
		t.Errorf("WorkloadByIP(pod IP) = %v, want the pod", w)
	}
	if w := s.FindLocal("n1", "shop", "db", "db"); w == nil || w.UID != "Kubernetes//Pod/shop/db" {
		t.Errorf("FindLocal(db) = %v, want the pod", w)
	}
	r, err = s.Route(src, netip.MustParseAddrPort("10.244.1.9:5432"), first)
	if err != nil || r.Kind != Tunnel || len(r.Peers) != 1 || r.Peers[0].String() != "spiffe://cluster.local/ns/shop/sa/db" {
		t.Errorf("route to the pod's IP = %v %v peers %v; want hbone to the pod's own identity", r.Kind, err, r.Peers)
	}
	// The VM's own address, dialled directly, is no workload: passthrough.
	if w := s.WorkloadByIP(netip.MustParseAddr("192.0.2.10")); w != nil {
		t.Errorf("WorkloadByIP(VM) = %s, want none (a shared address)", w.UID)
	}
}
