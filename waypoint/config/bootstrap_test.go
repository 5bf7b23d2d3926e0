package config

import (
	"net/netip"
	"os"
	"strings"
	"testing"
)

// TestBootstrapExample: the example file compiles to a chain for its VIP,
// its route table and a cluster with its endpoint.
func TestBootstrapExample(t *testing.T) {
	data, err := os.ReadFile("testdata/bootstrap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseBootstrap(data)
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore()
	if err := b.Apply(s); err != nil {
		t.Fatal(err)
	}
	snap := s.Snapshot()
	ch := snap.Chain(netip.MustParseAddrPort("10.96.0.10:80"))
	if ch == nil || ch.HTTP == nil {
		t.Fatalf("no HTTP chain for 10.96.0.10:80: %+v", ch)
	}
	if snap.RouteTable(ch.HTTP) == nil {
		t.Error("the chain's routes are missing")
	}
	const cluster = "outbound|80||echo.demo.svc.cluster.local"
	a := snap.Assignments[cluster]
	if snap.Clusters[cluster] == nil || a == nil || len(a.Endpoints) != 1 || a.Endpoints[0].Addr != netip.MustParseAddrPort("10.250.0.2:8080") {
		t.Errorf("cluster %s: %+v, endpoints %+v", cluster, snap.Clusters[cluster], a)
	}
}

// TestBootstrapJSON: the same in JSON, camelCase names included.
func TestBootstrapJSON(t *testing.T) {
	js := `{"listeners": [{"name": "waypoint", "filterChains": [{"name": "x:80", "filterChainMatch": {"prefixRanges": [{"addressPrefix": "10.0.0.1", "prefixLen": 32}], "destinationPort": 80},
		"filters": [{"name": "tcp", "typedConfig": {"@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy", "statPrefix": "x", "cluster": "c"}}]}]}],
		"clusters": [{"name": "c", "type": "EDS", "edsClusterConfig": {}}]}`
	b, err := ParseBootstrap([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	s := NewStore()
	if err := b.Apply(s); err != nil {
		t.Fatal(err)
	}
	if ch := s.Snapshot().Chain(netip.MustParseAddrPort("10.0.0.1:80")); ch == nil || ch.TCPCluster != "c" {
		t.Errorf("tcp_proxy chain: %+v", ch)
	}
}

// TestBootstrapErrors: a bad file is refused with the place of the fault.
func TestBootstrapErrors(t *testing.T) {
	const listener = "listeners: [{name: waypoint}]\n"
	for _, tc := range []struct {
		name, file, want string
		apply            bool // the fault shows when compiling
	}{
		{"not yaml", "listeners: [\n", "neither YAML nor JSON", false},
		{"unknown top-level key", "static_resources: {}\n", `unknown field "static_resources"`, false},
		{"unknown field", "listeners: [{name: waypoint, colour: blue}]\n", `listeners[0]: `, false},
		{"wrong type", "clusters: [{name: 3, type: EDS}]\n" + listener, "clusters[0]: ", false},
		{"no name", listener + "clusters: [{type: EDS}]\n", "clusters[0] has no name", false},
		{"twice", listener + "routes: [{name: r}, {name: r}]\n", `routes[1]: "r" is defined twice`, false},
		{"endpoints without cluster_name", listener + "endpoints: [{endpoints: []}]\n", "endpoints[0] has no name", false},
		{"unknown @type", "listeners: [{name: waypoint, filter_chains: [{filters: [{name: f, typed_config: {'@type': type.googleapis.com/example.Nope}}]}]}]\n", "listeners[0]: ", false},
		{"no listener", "clusters: [{name: c, type: EDS}]\n", "no listener", false},
		{"unsupported field", listener + "clusters: [{name: c, type: EDS, outlier_detection: {}}]\n", `cluster "c".outlier_detection is not supported`, true},
		{"unsupported type", listener + "clusters: [{name: c, type: STATIC}]\n", `cluster "c".type STATIC is not supported`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ParseBootstrap([]byte(tc.file))
			if tc.apply {
				if err != nil {
					t.Fatalf("parse: %v", err)
				}
				err = b.Apply(NewStore())
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func FuzzParseBootstrap(f *testing.F) {
	if data, err := os.ReadFile("testdata/bootstrap.yaml"); err == nil {
		f.Add(data)
	}
	f.Add([]byte(`{"listeners": [{"name": "waypoint"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := ParseBootstrap(data)
		if err != nil {
			return
		}
		if len(b.Listeners) == 0 {
			t.Fatal("parsed without a listener")
		}
		b.Apply(NewStore())
	})
}
