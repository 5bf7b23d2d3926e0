package cluster

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

type fakeRecords struct {
	svcs map[string]*corev1.Service
	eps  map[string][]discoveryv1.Endpoint
	ext  map[string][]netip.Addr
}

func (f fakeRecords) service(ns, name string) (*corev1.Service, bool) {
	s, ok := f.svcs[ns+"/"+name]
	return s, ok
}

func (f fakeRecords) endpoints(ns, svc string) []discoveryv1.Endpoint { return f.eps[ns+"/"+svc] }

func (f fakeRecords) external(name string) []netip.Addr { return f.ext[name] }

func TestResolve(t *testing.T) {
	yes, no := true, false
	host := "web-0"
	rec := fakeRecords{
		svcs: map[string]*corev1.Service{
			"default/kubernetes": {Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1"}},
			"apps/web":           {Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone}},
		},
		eps: map[string][]discoveryv1.Endpoint{"apps/web": {
			{Addresses: []string{"10.244.1.5"}, Hostname: &host, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.244.2.6"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.244.2.7"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
		}},
	}
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name       string
		want       []netip.Addr
		exists, ok bool
	}{
		{"kubernetes.default.svc.cluster.local.", []netip.Addr{a("10.96.0.1")}, true, true},
		{"web.apps.svc.cluster.local", []netip.Addr{a("10.244.1.5"), a("10.244.2.6")}, true, true},
		{"web-0.web.apps.svc.cluster.local", []netip.Addr{a("10.244.1.5")}, true, true},
		{"web-9.web.apps.svc.cluster.local", nil, false, true},
		{"missing.default.svc.cluster.local", nil, false, true},
		{"10-244-1-5.apps.pod.cluster.local", []netip.Addr{a("10.244.1.5")}, true, true},
		{"svc.cluster.local", nil, true, true},
		{"apps.svc.cluster.local", nil, true, true},
		{"web.cluster.local", nil, false, true},
		{"a.b.c.d.e.cluster.local", nil, false, true},
		{"example.com", nil, false, false},
		{"kubernetes.default.svc.cluster.local.example.com", nil, false, false},
	} {
		got, exists, ok := resolve(rec, "cluster.local", tc.name)
		if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" || exists != tc.exists || ok != tc.ok {
			t.Errorf("resolve(%q) = %v, %v, %v; want %v, %v, %v", tc.name, got, exists, ok, tc.want, tc.exists, tc.ok)
		}
	}
}

func TestAnswer(t *testing.T) {
	rec := fakeRecords{svcs: map[string]*corev1.Service{"default/kubernetes": {Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1"}}}}
	query := func(name string, typ dnsmessage.Type) dnsmessage.Message {
		t.Helper()
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 42, RecursionDesired: true})
		b.StartQuestions()
		b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
		req, err := b.Finish()
		if err != nil {
			t.Fatal(err)
		}
		resp, err := answer(rec, "cluster.local", req)
		if err != nil {
			t.Fatal(err)
		}
		var m dnsmessage.Message
		if err := m.Unpack(resp); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := query("Kubernetes.Default.svc.cluster.local.", dnsmessage.TypeA)
	if m.ID != 42 || !m.Response || m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 1 ||
		m.Answers[0].Body.(*dnsmessage.AResource).A != [4]byte{10, 96, 0, 1} {
		t.Fatalf("A query answered %+v", m)
	}
	if m := query("kubernetes.default.svc.cluster.local.", dnsmessage.TypeAAAA); m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 0 {
		t.Fatalf("AAAA query answered %+v, want NOERROR and no records", m)
	}
	if m := query("nope.default.svc.cluster.local.", dnsmessage.TypeA); m.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("missing name answered %v, want NXDOMAIN", m.RCode)
	}
	if m := query("example.com.", dnsmessage.TypeA); m.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("outside name answered %v, want NXDOMAIN", m.RCode)
	}
	if _, err := answer(rec, "cluster.local", []byte{1, 2, 3}); err == nil {
		t.Fatal("garbage was answered")
	}
	rec.ext = map[string][]netip.Addr{"upstream-only.example.": {netip.MustParseAddr("192.0.2.7")}}
	m = query("Upstream-Only.example.", dnsmessage.TypeA)
	if m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 1 || m.Answers[0].Body.(*dnsmessage.AResource).A != [4]byte{192, 0, 2, 7} ||
		m.Answers[0].Header.TTL != 5 {
		t.Fatalf("registered outside name answered %+v", m)
	}
	if m := query("other.example.", dnsmessage.TypeA); m.RCode != dnsmessage.RCodeNameError {
		t.Fatalf("unregistered outside name answered %v, want NXDOMAIN", m.RCode)
	}
}

func TestAddDNSRecord(t *testing.T) {
	var d dnsServer
	a := netip.MustParseAddr("192.0.2.7")
	for _, bad := range []string{"echo.default.svc.cluster.local", "cluster.local.", "x.CLUSTER.local", "", ".", "a..b"} {
		if err := d.add(bad, []netip.Addr{a}); err == nil {
			t.Errorf("add(%q) was accepted", bad)
		}
	}
	if err := d.add("Upstream-Only.Example", []netip.Addr{a}); err != nil {
		t.Fatal(err)
	}
	if got := d.external("upstream-only.example."); len(got) != 1 || got[0] != a {
		t.Fatalf("external = %v, want [%s]", got, a)
	}
	if got := d.external("cluster.local.example."); got != nil {
		t.Fatalf("external of an unregistered name = %v", got)
	}
}

func TestAddressPlan(t *testing.T) {
	if nodeAddr(1) != netip.MustParseAddr("10.99.0.11") || nodePodCIDR(2) != netip.MustParsePrefix("10.244.2.0/24") ||
		gateway(nodePodCIDR(2)) != netip.MustParseAddr("10.244.2.1") {
		t.Fatal("address plan changed")
	}
	for i := 1; i <= maxNodes; i++ {
		if !underlayNet.Contains(nodeAddr(i)) || !clusterCIDR.Contains(nodePodCIDR(i).Addr()) || nodeAddr(i) == cpAddr {
			t.Fatalf("node %d: %s %s outside the plan", i, nodeAddr(i), nodePodCIDR(i))
		}
	}
	if !serviceCIDR.Contains(kubernetesServiceIP) || !serviceCIDR.Contains(clusterDNSIP) || clusterCIDR.Overlaps(serviceCIDR) || underlayNet.Overlaps(clusterCIDR) {
		t.Fatal("ranges overlap")
	}
}

func TestDecodeManifest(t *testing.T) {
	objs, err := decodeManifest(NamespaceManifest("a", map[string]string{"x": "y"}) + "---\n" + EchoApp("a", "echo", EchoOptions{Replicas: 2, Spread: true, Labels: map[string]string{"istio.io/dataplane-mode": "ambient"}}))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
	}
	if diff := cmp.Diff([]string{"Namespace/a", "ServiceAccount/echo", "Deployment/echo", "Service/echo"}, kinds); diff != "" {
		t.Fatalf("objects (-want +got):\n%s", diff)
	}
	if _, err := decodeManifest("kind: Pod\n"); err == nil {
		t.Fatal("an object without apiVersion and name was accepted")
	}
}

func TestBridgeConfList(t *testing.T) {
	b, err := bridgeConfList(Node{Name: "node1", PodCIDR: nodePodCIDR(1), Root: "/state/node1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"type": "bridge"`, `"subnet": "10.244.1.0/24"`, `"gateway": "10.244.1.1"`, `"dataDir": "/state/node1/var/lib/cni/networks"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("conflist lacks %s:\n%s", want, b)
		}
	}
}
