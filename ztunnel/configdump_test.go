package ztunnel

import (
	"crypto/x509"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/testpki"
	"github.com/weftmesh/weft/ztunnel/inpod"
	"github.com/weftmesh/weft/ztunnel/state"
)

// TestConfigDumpShape checks /config_dump against the JSON shape Istio's
// ztunnel writes and istioctl ztunnel-config reads: addresses as
// "<network>/<ip>", ports as maps, a Service's endpoints from its
// workloads, enum names as words, and certificates as PEM with decimal
// serials. (The e2e runs istioctl itself on it.)
func TestConfigDumpShape(t *testing.T) {
	ip := func(s string) []byte { return netip.MustParseAddr(s).AsSlice() }
	wp := &workloadpb.GatewayAddress{Destination: &workloadpb.GatewayAddress_Address{
		Address: &workloadpb.NetworkAddress{Address: ip("10.96.0.9")}}, HboneMtlsPort: 15008}
	d := state.Dump{
		Workloads: []*workloadpb.Workload{{
			Uid: "Kubernetes//Pod/shop/web-1", Name: "web-1", Namespace: "shop", Addresses: [][]byte{ip("10.1.0.5")},
			TunnelProtocol: workloadpb.TunnelProtocol_HBONE, ServiceAccount: "web", WorkloadType: workloadpb.WorkloadType_DEPLOYMENT,
			WorkloadName: "web", CanonicalName: "web", CanonicalRevision: "v1", Node: "node1", ClusterId: "Kubernetes",
			Waypoint: wp, Locality: &workloadpb.Locality{Region: "r", Zone: "z"},
			Services: map[string]*workloadpb.PortList{"shop/web.shop.svc.cluster.local": {Ports: []*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}}}},
		}},
		Services: []*workloadpb.Service{{
			Name: "web", Namespace: "shop", Hostname: "web.shop.svc.cluster.local",
			Addresses: []*workloadpb.NetworkAddress{{Address: ip("10.96.0.1")}},
			Ports:     []*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}}, Waypoint: wp,
			IpFamilies: workloadpb.IPFamilies_IPV4_ONLY,
			LoadBalancing: &workloadpb.LoadBalancing{Mode: workloadpb.LoadBalancing_FAILOVER,
				RoutingPreference: []workloadpb.LoadBalancing_Scope{workloadpb.LoadBalancing_ZONE}},
		}},
		Policies: []*securitypb.Authorization{{
			Name: "deny-guest", Namespace: "shop", Scope: securitypb.Scope_NAMESPACE, Action: securitypb.Action_DENY,
			Rules: []*securitypb.Rule{{Clauses: []*securitypb.Clause{{Matches: []*securitypb.Match{{
				Namespaces:          []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Exact{Exact: "guest"}}},
				Principals:          []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Presence{Presence: &emptypb.Empty{}}}},
				SourceIps:           []*securitypb.Address{{Address: ip("10.2.0.0"), Length: 16}},
				NotDestinationPorts: []uint32{9090},
			}}}}}},
		}},
	}
	root, err := testpki.NewRoot("root")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := root.Issue(&x509.Certificate{})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string][]*x509.Certificate{
		"spiffe://cluster.local/ns/shop/sa/web":     {leaf.Cert},
		"spiffe://cluster.local/ns/shop/sa/pending": nil,
	}
	pods := []inpod.PodInfo{{UID: "uid-1", Namespace: "shop", Name: "web-1", ServiceAccount: "web"}}

	b, err := json.Marshal(newConfigDump(d, ids, pods))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	at := func(path string) any {
		var v any = got
		for _, k := range strings.Split(path, ".") {
			switch c := v.(type) {
			case map[string]any:
				v = c[k]
			case []any:
				i := int(k[0] - '0')
				if i >= len(c) {
					return nil
				}
				v = c[i]
			default:
				return nil
			}
		}
		return v
	}
	for path, want := range map[string]any{
		"workloads.0.workloadIps.0":                    "10.1.0.5",
		"workloads.0.protocol":                         "HBONE",
		"workloads.0.workloadType":                     "deployment",
		"workloads.0.status":                           "Healthy",
		"workloads.0.waypoint.destination":             "/10.96.0.9",
		"workloads.0.locality.zone":                    "z",
		"workloads.0.capacity":                         1.0,
		"services.0.vips.0":                            "/10.96.0.1",
		"services.0.ports.80":                          8080.0,
		"services.0.ipFamilies":                        "IPv4",
		"services.0.loadBalancer.mode":                 "Failover",
		"services.0.loadBalancer.routingPreferences.0": "Zone",
		"services.0.loadBalancer.healthPolicy":         "OnlyHealthy",
		"policies.0.action":                            "Deny",
		"policies.0.scope":                             "Namespace",
		"policies.0.rules.0.0.0.namespaces.0.Exact":    "guest",
		"policies.0.rules.0.0.0.sourceIps.0":           "10.2.0.0/16",
		"policies.0.rules.0.0.0.notDestinationPorts.0": 9090.0,
		"certificates.0.identity":                      "spiffe://cluster.local/ns/shop/sa/pending",
		"certificates.0.state":                         "Initializing",
		"certificates.1.state":                         "Available",
		"certificates.1.certChain.0.serialNumber":      leaf.Cert.SerialNumber.String(),
		"workloadState.uid-1.info.serviceAccount":      "web",
		"workloadState.uid-1.state":                    "Up",
	} {
		if v := at(path); v != want {
			t.Errorf("%s = %#v, want %#v", path, v, want)
		}
	}
	eps, _ := at("services.0.endpoints").(map[string]any)
	ep, _ := eps["Kubernetes//Pod/shop/web-1:/10.1.0.5"].(map[string]any)
	if ep == nil || ep["service"] != "shop/web.shop.svc.cluster.local" || ep["address"] != "/10.1.0.5" || ep["port"].(map[string]any)["80"] != 8080.0 {
		t.Errorf("the Service's endpoints: %#v, want web-1's address and its port 80->8080", eps)
	}
	if p, ok := at("policies.0.rules.0.0.0.principals.0").(map[string]any); !ok || p["Presence"] == nil {
		t.Errorf("a presence match: %#v, want {\"Presence\": {}}", at("policies.0.rules.0.0.0.principals.0"))
	}
	if pem, _ := at("certificates.1.certChain.0.pem").(string); !strings.HasPrefix(pem, "-----BEGIN CERTIFICATE-----") {
		t.Errorf("certificate PEM %q", pem)
	}
}
