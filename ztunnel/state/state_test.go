package state

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/spiffe"
)

func ip(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

func pod(ns, name, sa, node, addr string, hbone bool, svcs map[string][]uint32) *workloadpb.Address {
	w := &workloadpb.Workload{
		Uid: "Kubernetes//Pod/" + ns + "/" + name, Name: name, Namespace: ns, ServiceAccount: sa, Node: node,
		Addresses: [][]byte{ip(addr)},
	}
	if hbone {
		w.TunnelProtocol = workloadpb.TunnelProtocol_HBONE
	}
	if len(svcs) > 0 {
		w.Services = map[string]*workloadpb.PortList{}
		for k, ports := range svcs {
			pl := &workloadpb.PortList{}
			for i := 0; i+1 < len(ports); i += 2 {
				pl.Ports = append(pl.Ports, &workloadpb.Port{ServicePort: ports[i], TargetPort: ports[i+1]})
			}
			w.Services[k] = pl
		}
	}
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: w}}
}

func service(ns, name, vip string, ports ...uint32) *workloadpb.Address {
	s := &workloadpb.Service{
		Name: name, Namespace: ns, Hostname: name + "." + ns + ".svc.cluster.local",
		Addresses: []*workloadpb.NetworkAddress{{Address: ip(vip)}},
	}
	for i := 0; i+1 < len(ports); i += 2 {
		s.Ports = append(s.Ports, &workloadpb.Port{ServicePort: ports[i], TargetPort: ports[i+1]})
	}
	return &workloadpb.Address{Type: &workloadpb.Address_Service{Service: s}}
}

func name(a *workloadpb.Address) string {
	if w := a.GetWorkload(); w != nil {
		return w.GetUid()
	}
	return a.GetService().GetNamespace() + "/" + a.GetService().GetHostname()
}

func load(t *testing.T, addrs ...*workloadpb.Address) *Store {
	t.Helper()
	s := NewStore()
	m := map[string]*workloadpb.Address{}
	for _, a := range addrs {
		m[name(a)] = a
	}
	if err := s.ApplyAddresses(m, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

const echoKey = "demo/echo.demo.svc.cluster.local"

func TestRoute(t *testing.T) {
	withWaypoint := func(a *workloadpb.Address, gw *workloadpb.GatewayAddress) *workloadpb.Address {
		a = proto.Clone(a).(*workloadpb.Address)
		if w := a.GetWorkload(); w != nil {
			w.Waypoint = gw
		} else {
			a.GetService().Waypoint = gw
		}
		return a
	}
	wpByHost := &workloadpb.GatewayAddress{
		Destination:   &workloadpb.GatewayAddress_Hostname{Hostname: &workloadpb.NamespacedHostname{Namespace: "demo", Hostname: "waypoint.demo.svc.cluster.local"}},
		HboneMtlsPort: 15008,
	}
	client := pod("demo", "client", "client", "n1", "10.244.1.5", true, nil)
	echo1 := pod("demo", "echo-1", "echo", "n1", "10.244.1.10", true, map[string][]uint32{echoKey: {80, 8080}})
	echo2 := pod("demo", "echo-2", "echo", "n2", "10.244.2.10", false, map[string][]uint32{echoKey: {80, 8080}})
	echoSvc := service("demo", "echo", "10.96.0.20", 80, 8080)
	waypoint := pod("demo", "waypoint-abc", "waypoint", "n2", "10.244.2.50", true,
		map[string][]uint32{"demo/waypoint.demo.svc.cluster.local": {15008, 15008}})
	waypointSvc := service("demo", "waypoint", "10.96.0.99", 15008, 15008)
	passthrough := func(a *workloadpb.Address) *workloadpb.Address {
		a = proto.Clone(a).(*workloadpb.Address)
		a.GetService().LoadBalancing = &workloadpb.LoadBalancing{Mode: workloadpb.LoadBalancing_PASSTHROUGH}
		return a
	}
	first := RouteOptions{Pick: func(int) int { return 0 }}
	id := func(ns, sa string) spiffeid.ID {
		return spiffeid.RequireFromString("spiffe://cluster.local/ns/" + ns + "/sa/" + sa)
	}

	tests := []struct {
		name    string
		store   []*workloadpb.Address
		src     string
		dst     string
		want    Route
		wantErr string
	}{
		{
			name:  "unknown destination passes through",
			store: []*workloadpb.Address{client},
			src:   "10.244.1.5", dst: "192.0.2.1:443",
			want: Route{Kind: Passthrough, Addr: netip.MustParseAddrPort("192.0.2.1:443")},
		},
		{
			name:  "pod IP that speaks HBONE is tunnelled to its 15008",
			store: []*workloadpb.Address{client, echo1},
			src:   "10.244.1.5", dst: "10.244.1.10:8080",
			want: Route{Kind: Tunnel, Addr: netip.MustParseAddrPort("10.244.1.10:15008"), Authority: netip.MustParseAddrPort("10.244.1.10:8080"),
				Peers: []spiffeid.ID{id("demo", "echo")}},
		},
		{
			name:  "pod IP outside the mesh passes through",
			store: []*workloadpb.Address{client, echo2},
			src:   "10.244.1.5", dst: "10.244.2.10:8080",
			want: Route{Kind: Passthrough, Addr: netip.MustParseAddrPort("10.244.2.10:8080")},
		},
		{
			name:  "service VIP picks an endpoint and translates the port",
			store: []*workloadpb.Address{client, echo1, echoSvc},
			src:   "10.244.1.5", dst: "10.96.0.20:80",
			want: Route{Kind: Tunnel, Addr: netip.MustParseAddrPort("10.244.1.10:15008"), Authority: netip.MustParseAddrPort("10.244.1.10:8080"),
				Peers: []spiffeid.ID{id("demo", "echo")}},
		},
		{
			name:  "service endpoint without HBONE gets plain TCP to the target port",
			store: []*workloadpb.Address{client, echo2, echoSvc},
			src:   "10.244.1.5", dst: "10.96.0.20:80",
			want: Route{Kind: Plain, Addr: netip.MustParseAddrPort("10.244.2.10:8080")},
		},
		{
			name:  "service port that does not exist is refused",
			store: []*workloadpb.Address{client, echo1, echoSvc},
			src:   "10.244.1.5", dst: "10.96.0.20:81",
			wantErr: "no healthy endpoint",
		},
		{
			name:  "service with a waypoint goes to a waypoint pod with the VIP as authority",
			store: []*workloadpb.Address{client, echo1, withWaypoint(echoSvc, wpByHost), waypoint, waypointSvc},
			src:   "10.244.1.5", dst: "10.96.0.20:80",
			want: Route{Kind: Waypoint, Addr: netip.MustParseAddrPort("10.244.2.50:15008"), Authority: netip.MustParseAddrPort("10.96.0.20:80"),
				Peers: []spiffeid.ID{id("demo", "waypoint")}},
		},
		{
			name:  "the waypoint itself reaches the service's endpoints directly",
			store: []*workloadpb.Address{echo1, withWaypoint(echoSvc, wpByHost), waypoint, waypointSvc},
			src:   "10.244.2.50", dst: "10.96.0.20:80",
			want: Route{Kind: Tunnel, Addr: netip.MustParseAddrPort("10.244.1.10:15008"), Authority: netip.MustParseAddrPort("10.244.1.10:8080"),
				Peers: []spiffeid.ID{id("demo", "echo")}},
		},
		{
			name:  "workload waypoint by address keeps the pod IP as authority",
			store: []*workloadpb.Address{client, withWaypoint(echo1, &workloadpb.GatewayAddress{Destination: &workloadpb.GatewayAddress_Address{Address: &workloadpb.NetworkAddress{Address: ip("10.96.0.99")}}, HboneMtlsPort: 15008}), waypoint, waypointSvc},
			src:   "10.244.1.5", dst: "10.244.1.10:8080",
			want: Route{Kind: Waypoint, Addr: netip.MustParseAddrPort("10.244.2.50:15008"), Authority: netip.MustParseAddrPort("10.244.1.10:8080"),
				Peers: []spiffeid.ID{id("demo", "waypoint")}},
		},
		{
			name:  "a passthrough service (ServiceEntry resolution NONE) goes to the address dialed",
			store: []*workloadpb.Address{client, passthrough(echoSvc)},
			src:   "10.244.1.5", dst: "10.96.0.20:80",
			want: Route{Kind: Passthrough, Addr: netip.MustParseAddrPort("10.96.0.20:80")},
		},
		{
			name:  "a passthrough service with a waypoint goes to the waypoint first",
			store: []*workloadpb.Address{client, withWaypoint(passthrough(echoSvc), wpByHost), waypoint, waypointSvc},
			src:   "10.244.1.5", dst: "10.96.0.20:80",
			want: Route{Kind: Waypoint, Addr: netip.MustParseAddrPort("10.244.2.50:15008"), Authority: netip.MustParseAddrPort("10.96.0.20:80"),
				Peers: []spiffeid.ID{id("demo", "waypoint")}},
		},
		{
			name:  "the waypoint itself passes a passthrough service's connection to the address",
			store: []*workloadpb.Address{withWaypoint(passthrough(echoSvc), wpByHost), waypoint, waypointSvc},
			src:   "10.244.2.50", dst: "10.96.0.20:80",
			want: Route{Kind: Passthrough, Addr: netip.MustParseAddrPort("10.96.0.20:80")},
		},
		{
			name:  "a waypoint with no pods is an error, not a bypass",
			store: []*workloadpb.Address{client, echo1, withWaypoint(echoSvc, wpByHost), waypointSvc},
			src:   "10.244.1.5", dst: "10.96.0.20:80",
			wantErr: "no healthy endpoint",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := load(t, tt.store...)
			got, err := s.Route(s.WorkloadByIP(netip.MustParseAddr(tt.src)), netip.MustParseAddrPort(tt.dst), first)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Kind != tt.want.Kind || got.Addr != tt.want.Addr || got.Authority != tt.want.Authority || !sameIDs(got.Peers, tt.want.Peers) {
				t.Errorf("route = {%s %s %s %v}, want {%s %s %s %v}", got.Kind, got.Addr, got.Authority, got.Peers,
					tt.want.Kind, tt.want.Addr, tt.want.Authority, tt.want.Peers)
			}
		})
	}
}

func sameIDs(a, b []spiffeid.ID) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRoutePreference(t *testing.T) {
	svc := service("demo", "echo", "10.96.0.20", 80, 8080)
	svc.GetService().LoadBalancing = &workloadpb.LoadBalancing{
		RoutingPreference: []workloadpb.LoadBalancing_Scope{workloadpb.LoadBalancing_NODE},
		Mode:              workloadpb.LoadBalancing_FAILOVER,
	}
	near := pod("demo", "near", "echo", "n1", "10.244.1.10", true, map[string][]uint32{echoKey: {80, 8080}})
	far := pod("demo", "far", "echo", "n2", "10.244.2.10", true, map[string][]uint32{echoKey: {80, 8080}})
	client := pod("demo", "client", "client", "n1", "10.244.1.5", true, nil)
	s := load(t, svc, near, far, client)
	for i := 0; i < 20; i++ {
		r, err := s.Route(s.WorkloadByIP(netip.MustParseAddr("10.244.1.5")), netip.MustParseAddrPort("10.96.0.20:80"), RouteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Workload.Name != "near" {
			t.Fatalf("failover preference NODE picked %s, want the same-node endpoint", r.Workload.Name)
		}
	}
	// Without a preference both endpoints are used.
	s = load(t, service("demo", "echo", "10.96.0.20", 80, 8080), near, far, client)
	seen := map[string]bool{}
	for i := 0; i < 2; i++ {
		r, _ := s.Route(nil, netip.MustParseAddrPort("10.96.0.20:80"), RouteOptions{Pick: func(n int) int { return i % n }})
		seen[r.Workload.Name] = true
	}
	if len(seen) != 2 {
		t.Errorf("endpoints used: %v, want both", seen)
	}
}

func TestApplyKeepsLastGoodAndNACKs(t *testing.T) {
	s := load(t, pod("demo", "a", "sa", "n1", "10.244.1.10", true, nil))
	bad := &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
		Uid: "Kubernetes//Pod/demo/a", Name: "a", Namespace: "demo", Addresses: [][]byte{{1, 2, 3}}}}}
	good := pod("demo", "b", "sa", "n1", "10.244.1.11", true, nil)
	err := s.ApplyAddresses(map[string]*workloadpb.Address{"Kubernetes//Pod/demo/a": bad, "Kubernetes//Pod/demo/b": good}, nil)
	if err == nil || !strings.Contains(err.Error(), "Kubernetes//Pod/demo/a") || !strings.Contains(err.Error(), "3 bytes") {
		t.Fatalf("err = %v, want it to name the bad resource and say why", err)
	}
	if w := s.WorkloadByIP(netip.MustParseAddr("10.244.1.10")); w == nil || w.Name != "a" {
		t.Error("the previous state of the rejected resource was lost")
	}
	if s.WorkloadByIP(netip.MustParseAddr("10.244.1.11")) == nil {
		t.Error("a valid resource next to a bad one was not applied")
	}
	// Removal cleans every index.
	if err := s.ApplyAddresses(nil, []string{"Kubernetes//Pod/demo/a"}); err != nil {
		t.Fatal(err)
	}
	if s.WorkloadByIP(netip.MustParseAddr("10.244.1.10")) != nil || s.Workload("Kubernetes//Pod/demo/a") != nil {
		t.Error("removed workload still indexed")
	}
	// An update that changes a pod's IP drops the old IP.
	moved := pod("demo", "b", "sa", "n1", "10.244.1.99", true, nil)
	if err := s.ApplyAddresses(map[string]*workloadpb.Address{"Kubernetes//Pod/demo/b": moved}, nil); err != nil {
		t.Fatal(err)
	}
	if s.WorkloadByIP(netip.MustParseAddr("10.244.1.11")) != nil || s.WorkloadByIP(netip.MustParseAddr("10.244.1.99")) == nil {
		t.Error("IP index not updated on change")
	}
	if w, sv, p := s.Counts(); w != 1 || sv != 0 || p != 0 {
		t.Errorf("counts %d %d %d", w, sv, p)
	}
}

func TestAuthorize(t *testing.T) {
	exact := func(s string) *securitypb.StringMatch {
		return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Exact{Exact: s}}
	}
	prefix := func(s string) *securitypb.StringMatch {
		return &securitypb.StringMatch{MatchType: &securitypb.StringMatch_Prefix{Prefix: s}}
	}
	rule := func(ms ...*securitypb.Match) *securitypb.Rule {
		return &securitypb.Rule{Clauses: []*securitypb.Clause{{Matches: ms}}}
	}
	pol := func(ns, name string, scope securitypb.Scope, action securitypb.Action, rules ...*securitypb.Rule) *securitypb.Authorization {
		return &securitypb.Authorization{Name: name, Namespace: ns, Scope: scope, Action: action, Rules: rules}
	}
	id := func(ns, sa string) spiffe.Identity {
		i, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, ns, sa)
		return i
	}
	selected := []string{"demo/selected"}
	conn := func(src spiffe.Identity, srcIP string, port uint16) Conn {
		return Conn{Source: src, Src: netip.MustParseAddrPort(srcIP + ":40000"), Dst: netip.AddrPortFrom(netip.MustParseAddr("10.244.1.10"), port)}
	}
	allowSA := pol("demo", "allow-client", securitypb.Scope_NAMESPACE, securitypb.Action_ALLOW,
		rule(&securitypb.Match{Principals: []*securitypb.StringMatch{exact("cluster.local/ns/demo/sa/client")}}))
	tests := []struct {
		name     string
		policies []*securitypb.Authorization
		conn     Conn
		allowed  bool
		by       string
		refs     []string // the workload-selector policies the workload names
	}{
		{"no policies allow", nil, conn(id("x", "y"), "10.0.0.1", 80), true, "", nil},
		{"ALLOW for one principal lets it in", []*securitypb.Authorization{allowSA}, conn(id("demo", "client"), "10.0.0.1", 80), true, "demo/allow-client", nil},
		{"ALLOW for one principal keeps others out", []*securitypb.Authorization{allowSA}, conn(id("demo", "other"), "10.0.0.1", 80), false, "", nil},
		{"plaintext has no principal", []*securitypb.Authorization{allowSA}, conn(spiffe.Identity{}, "10.0.0.1", 80), false, "", nil},
		{"DENY wins over ALLOW", []*securitypb.Authorization{allowSA, pol("demo", "deny-port", securitypb.Scope_NAMESPACE, securitypb.Action_DENY,
			rule(&securitypb.Match{DestinationPorts: []uint32{80}}))}, conn(id("demo", "client"), "10.0.0.1", 80), false, "demo/deny-port", nil},
		{"policy without rules allows nothing", []*securitypb.Authorization{pol("demo", "allow-nothing", securitypb.Scope_NAMESPACE, securitypb.Action_ALLOW)},
			conn(id("demo", "client"), "10.0.0.1", 80), false, "", nil},
		{"DENY without rules denies nothing", []*securitypb.Authorization{pol("demo", "deny-nothing", securitypb.Scope_NAMESPACE, securitypb.Action_DENY)},
			conn(id("demo", "client"), "10.0.0.1", 80), true, "", nil},
		{"empty rule allows all", []*securitypb.Authorization{pol("demo", "allow-all", securitypb.Scope_NAMESPACE, securitypb.Action_ALLOW, &securitypb.Rule{})},
			conn(id("x", "y"), "10.0.0.1", 80), true, "demo/allow-all", nil},
		{"global policy from the root namespace applies", []*securitypb.Authorization{pol("weft-system", "deny-ns", securitypb.Scope_GLOBAL, securitypb.Action_DENY,
			rule(&securitypb.Match{Namespaces: []*securitypb.StringMatch{exact("evil")}}))}, conn(id("evil", "x"), "10.0.0.1", 80), false, "weft-system/deny-ns", nil},
		{"another namespace's policy does not apply", []*securitypb.Authorization{pol("other", "deny-all", securitypb.Scope_NAMESPACE, securitypb.Action_DENY, &securitypb.Rule{})},
			conn(id("x", "y"), "10.0.0.1", 80), true, "", nil},
		{"workload-selector policy applies only when listed", []*securitypb.Authorization{
			pol("demo", "selected", securitypb.Scope_WORKLOAD_SELECTOR, securitypb.Action_DENY, &securitypb.Rule{}),
			pol("demo", "unlisted", securitypb.Scope_WORKLOAD_SELECTOR, securitypb.Action_ALLOW, rule(&securitypb.Match{DestinationPorts: []uint32{1}}))},
			conn(id("x", "y"), "10.0.0.1", 80), false, "demo/selected", selected},
		{"not_ variants exclude", []*securitypb.Authorization{pol("demo", "allow-but", securitypb.Scope_NAMESPACE, securitypb.Action_ALLOW,
			rule(&securitypb.Match{Namespaces: []*securitypb.StringMatch{prefix("de")}, NotServiceAccounts: []*securitypb.ServiceAccountMatch{{Namespace: "demo", ServiceAccount: "bad"}}}))},
			conn(id("demo", "bad"), "10.0.0.1", 80), false, "", nil},
		{"source IP blocks", []*securitypb.Authorization{pol("demo", "allow-net", securitypb.Scope_NAMESPACE, securitypb.Action_ALLOW,
			rule(&securitypb.Match{SourceIps: []*securitypb.Address{{Address: ip("10.244.0.0"), Length: 16}}}))},
			conn(id("x", "y"), "10.245.0.1", 80), false, "", nil},
		{"dots in names are literal, not wildcards", []*securitypb.Authorization{pol("demo", "allow-dot", securitypb.Scope_NAMESPACE, securitypb.Action_ALLOW,
			rule(&securitypb.Match{Principals: []*securitypb.StringMatch{exact("cluster.local/ns/a.b/sa/c")}}))},
			conn(id("axb", "c"), "10.0.0.1", 80), false, "", nil},
		{"presence matches any identity", []*securitypb.Authorization{pol("demo", "allow-mtls", securitypb.Scope_NAMESPACE, securitypb.Action_ALLOW,
			rule(&securitypb.Match{Principals: []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Presence{Presence: &emptypb.Empty{}}}}}))},
			conn(id("x", "y"), "10.0.0.1", 80), true, "demo/allow-mtls", nil},
		{"dry-run policies do not decide", []*securitypb.Authorization{func() *securitypb.Authorization {
			p := pol("demo", "dry", securitypb.Scope_NAMESPACE, securitypb.Action_DENY, &securitypb.Rule{})
			p.DryRun = true
			return p
		}()}, conn(id("x", "y"), "10.0.0.1", 80), true, "", nil},
		// A policy the workload names but ztunnel has not received (or could
		// not accept) may be an ALLOW or a DENY: nothing is let in until it
		// arrives, not even what another ALLOW admits.
		{"a named policy not received denies", nil, conn(id("demo", "client"), "10.0.0.1", 80), false, "demo/missing", []string{"demo/missing"}},
		{"a named policy not received denies despite a matching ALLOW", []*securitypb.Authorization{allowSA},
			conn(id("demo", "client"), "10.0.0.1", 80), false, "demo/missing", []string{"demo/missing"}},
		{"a named policy not received denies plaintext", nil, conn(spiffe.Identity{}, "10.0.0.1", 80), false, "demo/missing", []string{"demo/missing"}},
		{"a named policy received later decides", []*securitypb.Authorization{pol("demo", "late", securitypb.Scope_WORKLOAD_SELECTOR, securitypb.Action_ALLOW, &securitypb.Rule{})},
			conn(id("x", "y"), "10.0.0.1", 80), true, "demo/late", []string{"demo/late"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore()
			m := map[string]*securitypb.Authorization{}
			for _, p := range tt.policies {
				m[p.Namespace+"/"+p.Name] = p
			}
			if err := s.ApplyPolicies(m, nil); err != nil {
				t.Fatal(err)
			}
			d := s.Authorize(&Workload{UID: "u", Namespace: "demo", Policies: tt.refs}, tt.conn)
			if d.Allowed != tt.allowed || d.Policy != tt.by {
				t.Errorf("decision %+v, want allowed=%v by %q", d, tt.allowed, tt.by)
			}
		})
	}
}

func FuzzApplyAddresses(f *testing.F) {
	for _, a := range []*workloadpb.Address{
		pod("demo", "a", "sa", "n1", "10.244.1.10", true, map[string][]uint32{echoKey: {80, 8080}}),
		service("demo", "echo", "10.96.0.20", 80, 8080),
	} {
		b, _ := proto.Marshal(a)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var a workloadpb.Address
		if proto.Unmarshal(b, &a) != nil {
			return
		}
		s := NewStore()
		if err := s.ApplyAddresses(map[string]*workloadpb.Address{"x": &a}, nil); err != nil {
			if w, sv, _ := s.Counts(); w+sv != 0 {
				t.Fatal("a rejected resource changed the store")
			}
			return
		}
		// Whatever was accepted can be routed to and removed without panicking.
		for _, w := range s.Dump().Workloads {
			for _, raw := range w.GetAddresses() {
				if addr, ok := netip.AddrFromSlice(raw); ok {
					s.Route(nil, netip.AddrPortFrom(addr, 80), RouteOptions{})
				}
			}
		}
		for _, svc := range s.Dump().Services {
			for _, a := range svc.GetAddresses() {
				if addr, ok := netip.AddrFromSlice(a.GetAddress()); ok {
					s.Route(nil, netip.AddrPortFrom(addr, 80), RouteOptions{})
				}
			}
		}
		if err := s.ApplyAddresses(nil, []string{"x"}); err != nil {
			t.Fatal(err)
		}
		if w, sv, _ := s.Counts(); w+sv != 0 {
			t.Fatal("removal left state behind")
		}
	})
}

func FuzzApplyPolicies(f *testing.F) {
	b, _ := proto.Marshal(&securitypb.Authorization{Name: "p", Namespace: "n", Rules: []*securitypb.Rule{{Clauses: []*securitypb.Clause{{Matches: []*securitypb.Match{{
		SourceIps: []*securitypb.Address{{Address: ip("10.0.0.0"), Length: 8}}, DestinationPorts: []uint32{80}}}}}}}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var a securitypb.Authorization
		if proto.Unmarshal(b, &a) != nil {
			return
		}
		s := NewStore()
		if s.ApplyPolicies(map[string]*securitypb.Authorization{"x": &a}, nil) != nil {
			return
		}
		s.Authorize(&Workload{Namespace: a.GetNamespace(), Policies: []string{a.GetNamespace() + "/" + a.GetName()}},
			Conn{Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("10.0.0.2:80")})
	})
}

func TestServicesByHostname(t *testing.T) {
	s := load(t, service("b", "echo", "10.96.0.2"), service("a", "echo", "10.96.0.1"))
	s.ApplyAddresses(map[string]*workloadpb.Address{"x/Echo.Other": {Type: &workloadpb.Address_Service{Service: &workloadpb.Service{
		Name: "e", Namespace: "x", Hostname: "Echo.Other",
	}}}}, nil)
	nsOf := func(host string) []string {
		var out []string
		for _, svc := range s.ServicesByHostname(host) {
			out = append(out, svc.Namespace)
		}
		return out
	}
	got := nsOf("echo.b.svc.cluster.local")
	if len(got) != 1 || got[0] != "b" {
		t.Errorf("echo.b = %v", got)
	}
	if got := nsOf("echo.other"); len(got) != 1 || got[0] != "x" {
		t.Errorf("a hostname is indexed in lower case: %v", got)
	}
	held := s.ServicesByHostname("echo.b.svc.cluster.local")
	if err := s.ApplyAddresses(nil, []string{"b/echo.b.svc.cluster.local"}); err != nil {
		t.Fatal(err)
	}
	if got := nsOf("echo.b.svc.cluster.local"); len(got) != 0 {
		t.Errorf("removed service still found: %v", got)
	}
	if len(held) != 1 || held[0].Namespace != "b" {
		t.Errorf("a slice handed out changed under its reader: %v", held)
	}
}
