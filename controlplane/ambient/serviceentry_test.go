package ambient

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	metav1alpha1 "istio.io/api/meta/v1alpha1"
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

	// Two hosts without endpoints: each is reached at its own name only,
	// never at the other's.
	two := serviceEntry("two", &networkingv1alpha3.ServiceEntry{
		Hosts: []string{"a.example", "b.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_DNS,
	})
	_, ws = c.ServiceEntryResources(two, nil)
	for _, w := range ws {
		if len(w.Services) != 1 || w.Services["shop/"+w.Hostname] == nil {
			t.Errorf("workload %s serves %v, want only its own host", w.Hostname, w.Services)
		}
	}

	// NONE: a passthrough Service at the entry's addresses, no Workloads,
	// and nothing without addresses.
	none := serviceEntry("partner", &networkingv1alpha3.ServiceEntry{
		Hosts: []string{"partner.example"}, Addresses: []string{"198.51.100.7"}, Ports: sePorts,
	})
	svcs, ws = c.ServiceEntryResources(none, map[string]netip.Addr{"partner.example": vip})
	if len(svcs) != 1 || len(ws) != 0 || svcs[0].GetLoadBalancing().GetMode() != workloadpb.LoadBalancing_PASSTHROUGH ||
		len(svcs[0].Addresses) != 1 || netip.AddrFrom4([4]byte(svcs[0].Addresses[0].Address)).String() != "198.51.100.7" {
		t.Errorf("NONE: services %v, workloads %v; want one passthrough Service at 198.51.100.7 and no workload", svcs, ws)
	}
	none.Spec.Addresses = nil
	if svcs, ws = c.ServiceEntryResources(none, map[string]netip.Addr{"partner.example": vip}); len(svcs)+len(ws) != 0 {
		t.Errorf("NONE without addresses: %v %v, want nothing (an allocated address would pass nowhere)", svcs, ws)
	}

	for name, spec := range map[string]*networkingv1alpha3.ServiceEntry{
		"internal": {Hosts: []string{"a.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_DNS, Location: networkingv1alpha3.ServiceEntry_MESH_INTERNAL},
		"wildcard": {Hosts: []string{"*.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_DNS},
		"selector with endpoints": {Hosts: []string{"a.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_STATIC,
			WorkloadSelector: &networkingv1alpha3.WorkloadSelector{Labels: map[string]string{"app": "a"}},
			Endpoints:        []*networkingv1alpha3.WorkloadEntry{{Address: "192.0.2.1"}}},
		"selector with DNS": {Hosts: []string{"a.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_DNS,
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

// TestIndexServiceEntryWaypoint: an entry labelled istio.io/use-waypoint,
// or in a namespace so labelled, sends its hosts through the waypoint, and
// its status shows the binding; the waypoint's deletion and the label's
// removal undo it.
func TestIndexServiceEntryWaypoint(t *testing.T) {
	w := newWorld(t)
	w.ix.process(w.set(kindNamespace, ns("shop", nil), ns("infra", nil)))
	gw := foreignWaypoint(nil)
	gw.Namespace = "shop"
	w.ix.process(w.set(kindGateway, gw))
	se := serviceEntry("egress", &networkingv1alpha3.ServiceEntry{
		Hosts: []string{"api.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_DNS,
	})
	se.Labels = map[string]string{"istio.io/use-waypoint": "wp"}
	u := w.ix.process(w.set(kindServiceEntry, se))
	svc := w.ix.addresses["shop/api.example"].GetService()
	if svc.GetWaypoint().GetHostname().GetHostname() != "wp.infra.svc.cluster.local" {
		t.Fatalf("waypoint %v, want the Gateway's address", svc.GetWaypoint())
	}
	if len(u.Entries) != 1 || u.Entries[0].Binding == nil || !u.Entries[0].Binding.Bound || u.Entries[0].Binding.Waypoint != "shop/wp" {
		t.Fatalf("entry status %+v, want bound to shop/wp", u.Entries)
	}
	if found, b := w.ix.serviceEntryBinding("shop/egress"); !found || b == nil || !b.Bound {
		t.Errorf("serviceEntryBinding = %v, %+v", found, b)
	}

	u = w.ix.process(w.del(kindGateway, gw))
	if got := w.ix.addresses["shop/api.example"].GetService().GetWaypoint(); got != nil {
		t.Errorf("with the waypoint deleted: waypoint %v", got)
	}
	if len(u.Entries) != 1 || u.Entries[0].Binding == nil || u.Entries[0].Binding.Bound {
		t.Errorf("with the waypoint deleted: status %+v, want not bound", u.Entries)
	}

	// The namespace's label binds an entry without one.
	w.ix.process(w.set(kindGateway, gw))
	plain := se.DeepCopy()
	plain.Labels = nil
	w.ix.process(w.set(kindServiceEntry, plain))
	w.ix.process(w.set(kindNamespace, ns("shop", map[string]string{"istio.io/use-waypoint": "wp"})))
	if w.ix.addresses["shop/api.example"].GetService().GetWaypoint() == nil {
		t.Errorf("the namespace's use-waypoint did not bind the entry")
	}
	// "none" on the entry opts it out.
	none := plain.DeepCopy()
	none.Labels = map[string]string{"istio.io/use-waypoint": "none"}
	u = w.ix.process(w.set(kindServiceEntry, none))
	if w.ix.addresses["shop/api.example"].GetService().GetWaypoint() != nil {
		t.Errorf("use-waypoint=none on the entry did not opt it out")
	}
	if len(u.Entries) != 1 || u.Entries[0].Binding != nil {
		t.Errorf("opted out: status %+v, want no condition", u.Entries)
	}
}

// TestIndexServiceEntryRecordedAddress: a host's address recorded in the
// entry's status is the one it keeps (a restart or another replica
// allocated it), unless another host holds it; an address outside the
// prefix or for a host the entry no longer names is ignored. Recorded
// addresses are claimed before any is allocated, whatever the order.
func TestIndexServiceEntryRecordedAddress(t *testing.T) {
	w := newWorld(t)
	spec := func(host string) *networkingv1alpha3.ServiceEntry {
		return &networkingv1alpha3.ServiceEntry{Hosts: []string{host}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_DNS}
	}
	// "a" would be given b's recorded address if allocation came first.
	a := serviceEntry("a", spec("a.example"))
	taken := AutoVIP("shop", "a", "a.example", nil)
	b := serviceEntry("b", spec("b.example"))
	b.Status.Addresses = []*networkingv1alpha3.ServiceEntryAddress{{Value: taken.String(), Host: "b.example"}}
	c := serviceEntry("c", spec("c.example"))
	c.Status.Addresses = []*networkingv1alpha3.ServiceEntryAddress{{Value: "10.0.0.1", Host: "c.example"}, {Value: "240.240.9.9", Host: "gone.example"}}
	u := w.ix.process(w.set(kindServiceEntry, a, b, c))
	vip := func(host string) netip.Addr {
		s := w.ix.addresses["shop/"+host].GetService()
		return netip.AddrFrom4([4]byte(s.GetAddresses()[0].GetAddress()))
	}
	if vip("b.example") != taken {
		t.Errorf("b.example at %v, want its recorded %v", vip("b.example"), taken)
	}
	if vip("a.example") == taken || !AutoVIPPrefix.Contains(vip("a.example")) {
		t.Errorf("a.example at %v, want another address of the prefix", vip("a.example"))
	}
	if got := vip("c.example"); got == netip.MustParseAddr("10.0.0.1") || got == netip.MustParseAddr("240.240.9.9") {
		t.Errorf("c.example at %v: took an address it may not", got)
	}
	writes := map[string]EntryStatus{}
	for _, e := range u.Entries {
		writes[e.Name] = e
	}
	if _, ok := writes["b"]; ok {
		t.Errorf("b shows its status already; written again: %+v", writes["b"])
	}
	if got := writes["a"].Addresses["a.example"]; got != vip("a.example") {
		t.Errorf("a's status to record %v, want %v", got, vip("a.example"))
	}
	if got := writes["c"].Addresses; len(got) != 1 || got["c.example"] != vip("c.example") {
		t.Errorf("c's status to record %v, want only c.example's address", got)
	}

	// A second entry recording the same address as b does not take it.
	d := serviceEntry("d", spec("d.example"))
	d.Status.Addresses = []*networkingv1alpha3.ServiceEntryAddress{{Value: taken.String(), Host: "d.example"}}
	w.ix.process(w.set(kindServiceEntry, d))
	if vip("d.example") == taken {
		t.Errorf("d.example took b's address %v", taken)
	}
}

// TestEntryStatus: what the writer sets is what EntryShows reads back;
// other conditions stay, and an unchanged condition keeps its time.
func TestEntryStatus(t *testing.T) {
	se := serviceEntry("egress", &networkingv1alpha3.ServiceEntry{Hosts: []string{"b.example", "a.example"}})
	se.Status.Conditions = []*metav1alpha1.IstioCondition{{Type: "Reconciled", Status: "True"}}
	want := EntryStatus{Namespace: "shop", Name: "egress",
		Addresses: map[string]netip.Addr{"b.example": netip.MustParseAddr("240.240.0.2"), "a.example": netip.MustParseAddr("240.240.0.1")},
		Binding:   &BindingStatus{Bound: true, Reason: ReasonWaypointAccepted, Message: "Successfully attached to waypoint shop/wp", Waypoint: "shop/wp"}}
	if EntryShows(se, want) {
		t.Fatal("an empty status shows the addresses")
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	setEntryStatus(&se.Status, want, t0)
	if !EntryShows(se, want) {
		t.Fatalf("status %v does not show what was set", se.Status.String())
	}
	if a := se.Status.Addresses; len(a) != 2 || a[0].Host != "a.example" || a[0].Value != "240.240.0.1" {
		t.Errorf("addresses %v, want sorted by host", a)
	}
	if len(se.Status.Conditions) != 2 || se.Status.Conditions[0].Type != "Reconciled" {
		t.Errorf("conditions %v, want the other kept", se.Status.Conditions)
	}
	setEntryStatus(&se.Status, want, t0.Add(time.Hour))
	if got := se.Status.Conditions[1].LastTransitionTime.AsTime(); !got.Equal(t0) {
		t.Errorf("unchanged condition moved to %v", got)
	}
	none := EntryStatus{Namespace: "shop", Name: "egress"}
	if EntryShows(se, none) {
		t.Error("shows no status while it holds one")
	}
	setEntryStatus(&se.Status, none, t0)
	if !EntryShows(se, none) || len(se.Status.Conditions) != 1 {
		t.Errorf("after clearing: %v", se.Status.String())
	}
}

// TestIndexServiceEntrySelector: an entry's workloadSelector makes the
// pods and WorkloadEntries of its namespace that it selects carry its
// hosts (a WorkloadEntry's own port of a port's name first); changing the
// selector or deleting the entry takes the hosts away again.
func TestIndexServiceEntrySelector(t *testing.T) {
	w := newWorld(t)
	pod := newPod("shop", "api-1", withLabel("app", "api"))
	other := newPod("shop", "web-1", withLabel("app", "web"), withIPs("10.1.0.2"))
	w.ix.process(w.set(kindPod, pod, other))
	vm := &networkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "vm", Labels: map[string]string{"app": "api"}}}
	vm.Spec.Address, vm.Spec.Ports = "192.0.2.30", map[string]uint32{"http": 9090}
	w.ix.process(w.set(kindWorkloadEntry, vm))
	se := serviceEntry("api", &networkingv1alpha3.ServiceEntry{
		Hosts: []string{"api.internal.example"}, Ports: sePorts, Resolution: networkingv1alpha3.ServiceEntry_STATIC,
		Location:         networkingv1alpha3.ServiceEntry_MESH_INTERNAL,
		WorkloadSelector: &networkingv1alpha3.WorkloadSelector{Labels: map[string]string{"app": "api"}},
	})
	w.ix.process(w.set(kindServiceEntry, se))
	const key = "shop/api.internal.example"
	if s := w.ix.addresses[key].GetService(); s == nil || len(s.GetAddresses()) != 1 {
		t.Fatalf("service %v, want the host at an allocated address", s)
	}
	ports := func(uid string) []*workloadpb.Port { return w.workload(uid).GetServices()[key].GetPorts() }
	if p := ports("Kubernetes//Pod/shop/api-1"); len(p) != 2 || p[1].TargetPort != 8080 {
		t.Errorf("selected pod's ports %v, want 443->443 and 80->8080", p)
	}
	if p := ports("Kubernetes/networking.istio.io/WorkloadEntry/shop/vm"); len(p) != 2 || p[1].TargetPort != 9090 {
		t.Errorf("selected WorkloadEntry's ports %v, want 80 at its own http port 9090", p)
	}
	if p := ports("Kubernetes//Pod/shop/web-1"); p != nil {
		t.Errorf("a pod the selector does not match carries the host: %v", p)
	}

	moved := se.DeepCopy()
	moved.Spec.WorkloadSelector.Labels = map[string]string{"app": "web"}
	w.ix.process(w.set(kindServiceEntry, moved))
	if ports("Kubernetes//Pod/shop/api-1") != nil || ports("Kubernetes/networking.istio.io/WorkloadEntry/shop/vm") != nil ||
		ports("Kubernetes//Pod/shop/web-1") == nil {
		t.Error("after the selector moved to app=web, the hosts did not follow it")
	}
	w.ix.process(w.del(kindServiceEntry, moved))
	if ports("Kubernetes//Pod/shop/web-1") != nil || w.ix.addresses[key] != nil {
		t.Error("after the delete, the host is still published or carried")
	}
}
