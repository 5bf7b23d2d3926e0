package ambient

import (
	"net/netip"
	"slices"
	"testing"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

func serviceEntry(name string, spec *networkingv1alpha3.ServiceEntry) *networkingv1.ServiceEntry {
	se := &networkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"}}
	se.Spec.Hosts, se.Spec.Addresses, se.Spec.Ports = spec.Hosts, spec.Addresses, spec.Ports
	se.Spec.Location, se.Spec.Resolution, se.Spec.Endpoints = spec.Location, spec.Resolution, spec.Endpoints
	se.Spec.WorkloadSelector = spec.WorkloadSelector
	return se
}

var sePorts = []*networkingv1alpha3.ServicePort{{Number: 443, Name: "https", Protocol: "TLS"}, {Number: 80, Name: "http", Protocol: "HTTP", TargetPort: 8080}}

// TestServiceEntryResources: a STATIC entry's hosts become Services with
// its addresses and ports, its endpoints Workloads reached in plain TCP
// with every host's ports (an endpoint's own port mapping first); a DNS
// entry without endpoints makes a hostname Workload of each host and takes
// the allocated address; what Weft does not apply publishes nothing.
func TestServiceEntryResources(t *testing.T) {
	c := Config{}
	static := serviceEntry("payments", &networkingv1alpha3.ServiceEntry{
		Hosts: []string{"api.pay.example", "API.Pay2.example."}, Addresses: []string{"192.0.2.10"}, Ports: sePorts,
		Resolution: networkingv1alpha3.ServiceEntry_STATIC,
		Endpoints: []*networkingv1alpha3.WorkloadEntry{{Address: "203.0.113.5", Ports: map[string]uint32{"https": 8443}},
			{Address: "2001:db8::5"}, {Address: "203.0.113.5"}, {Address: "not-an-ip.example"}},
	})
	svcs, ws := c.ServiceEntryResources(static, nil)
	if len(svcs) != 2 || svcs[0].Hostname != "api.pay.example" || svcs[1].Hostname != "api.pay2.example" {
		t.Fatalf("services %v, want one per host, lower case, no trailing dot", svcs)
	}
	if got := netip.AddrFrom4([4]byte(svcs[0].Addresses[0].Address)); got.String() != "192.0.2.10" {
		t.Errorf("address %v", got)
	}
	if p := svcs[0].Ports[1]; p.ServicePort != 80 || p.TargetPort != 8080 || p.AppProtocol != workloadpb.AppProtocol_HTTP11 {
		t.Errorf("port %v, want 80->8080 HTTP", p)
	}
	if len(ws) != 2 {
		t.Fatalf("%d workloads, want 2 (a repeated address once, a hostname never with STATIC): %v", len(ws), ws)
	}
	w := ws[1] // sorted by uid: 203.0.113.5 after 2001:db8::5
	if w.Uid != "Kubernetes/networking.istio.io/ServiceEntry/shop/payments/203.0.113.5" || w.TunnelProtocol != workloadpb.TunnelProtocol_NONE ||
		w.NetworkMode != workloadpb.NetworkMode_HOST_NETWORK {
		t.Errorf("workload %v", w)
	}
	for _, key := range []string{"shop/api.pay.example", "shop/api.pay2.example"} {
		ports := w.Services[key].GetPorts()
		if len(ports) != 2 || ports[0].TargetPort != 8443 || ports[1].TargetPort != 8080 {
			t.Errorf("%s ports %v, want 443->8443 (the endpoint's) and 80->8080", key, ports)
		}
	}

	dns := serviceEntry("search", &networkingv1alpha3.ServiceEntry{
		Hosts: []string{"search.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_DNS,
	})
	vip := netip.MustParseAddr("240.240.1.2")
	svcs, ws = c.ServiceEntryResources(dns, map[string]netip.Addr{"search.example": vip})
	if len(svcs) != 1 || len(svcs[0].Addresses) != 1 || netip.AddrFrom4([4]byte(svcs[0].Addresses[0].Address)) != vip {
		t.Errorf("services %v, want search.example at %v", svcs, vip)
	}
	if len(ws) != 1 || ws[0].Hostname != "search.example" || len(ws[0].Addresses) != 0 {
		t.Errorf("workloads %v, want the host itself to resolve", ws)
	}

	for name, spec := range map[string]*networkingv1alpha3.ServiceEntry{
		"none":     {Hosts: []string{"a.example"}, Ports: sePorts},
		"internal": {Hosts: []string{"a.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_DNS, Location: networkingv1alpha3.ServiceEntry_MESH_INTERNAL},
		"wildcard": {Hosts: []string{"*.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_DNS},
		"selector": {Hosts: []string{"a.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_STATIC,
			WorkloadSelector: &networkingv1alpha3.WorkloadSelector{Labels: map[string]string{"app": "a"}}},
	} {
		if svcs, ws := c.ServiceEntryResources(serviceEntry(name, spec), nil); svcs != nil || ws != nil {
			t.Errorf("%s: published %v %v, want nothing", name, svcs, ws)
		}
	}
}

// TestAutoVIP: the same host gets the same address every time, inside
// 240.240.0.0/16 and never its first or last; a taken address moves it on.
func TestAutoVIP(t *testing.T) {
	a := AutoVIP("shop", "search", "search.example", nil)
	if a != AutoVIP("shop", "search", "search.example", nil) || !AutoVIPPrefix.Contains(a) {
		t.Fatalf("AutoVIP %v: not stable or outside %v", a, AutoVIPPrefix)
	}
	b := AutoVIP("shop", "search", "search.example", func(x netip.Addr) bool { return x == a })
	if b == a || !AutoVIPPrefix.Contains(b) {
		t.Errorf("with %v taken: %v", a, b)
	}
	for _, x := range []netip.Addr{a, b} {
		if x == AutoVIPPrefix.Addr() || x == netip.MustParseAddr("240.240.255.255") {
			t.Errorf("%v is the prefix's first or last address", x)
		}
	}
	if got := AutoVIP("shop", "search", "search.example", func(netip.Addr) bool { return true }); got.IsValid() {
		t.Errorf("with every address taken: %v, want none", got)
	}
}

// TestIndexServiceEntry: an entry publishes its Services and Workloads,
// keeps a host's allocated address across updates, drops what an update
// takes away, and a deleted entry takes everything (and its addresses)
// with it.
func TestIndexServiceEntry(t *testing.T) {
	w := newWorld(t)
	se := serviceEntry("search", &networkingv1alpha3.ServiceEntry{
		Hosts: []string{"search.example", "img.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_DNS,
	})
	u := w.ix.process(w.set(kindServiceEntry, se))
	changed, _ := names(u)
	want := []string{"Kubernetes/networking.istio.io/ServiceEntry/shop/search/img.example",
		"Kubernetes/networking.istio.io/ServiceEntry/shop/search/search.example", "shop/img.example", "shop/search.example"}
	if !slices.Equal(changed, want) {
		t.Fatalf("published %v, want %v", changed, want)
	}
	vip := func() netip.Addr {
		s := w.ix.addresses["shop/search.example"].GetService()
		return netip.AddrFrom4([4]byte(s.GetAddresses()[0].GetAddress()))
	}
	first := vip()
	if !AutoVIPPrefix.Contains(first) {
		t.Fatalf("search.example at %v", first)
	}

	se2 := se.DeepCopy()
	se2.Spec.Hosts = []string{"search.example"}
	se2.Spec.Ports = sePorts[:1]
	u = w.ix.process(w.set(kindServiceEntry, se2))
	_, removed := names(u)
	if !slices.Equal(removed, []string{"Kubernetes/networking.istio.io/ServiceEntry/shop/search/img.example", "shop/img.example"}) {
		t.Errorf("removed %v, want img.example's Service and Workload", removed)
	}
	if vip() != first {
		t.Errorf("search.example moved from %v to %v on an update", first, vip())
	}

	u = w.ix.process(w.del(kindServiceEntry, se2))
	if _, removed := names(u); len(removed) != 2 || len(w.ix.vipOwner) != 0 || len(w.ix.entries) != 0 {
		t.Errorf("after the delete: removed %v, %d addresses still taken, %d entries", removed, len(w.ix.vipOwner), len(w.ix.entries))
	}
}
