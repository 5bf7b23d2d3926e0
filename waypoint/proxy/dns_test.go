//lint:file-ignore SA1019 the deprecated Cluster fields are those Istio sends and Envoy still reads

package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weftmesh/weft/internal/podnet"
	"github.com/weftmesh/weft/waypoint/config"
)

// nameTable is a resolver answering from a table the test changes.
type nameTable struct {
	mu    sync.Mutex
	addrs map[string][]netip.Addr
}

func (n *nameTable) set(host string, addrs ...netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.addrs[host] = addrs
}

func (n *nameTable) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if as, ok := n.addrs[host]; ok {
		return as, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// dnsMesh is a waypoint whose Store resolves through names and keeps the
// resolved addresses allow accepts (nil: the default guard); the Store runs
// until the test ends.
func dnsMesh(t *testing.T, names *nameTable, allow func(netip.Addr) bool) *mesh {
	store := config.NewStoreWith(config.StoreConfig{Resolver: names, AllowAddr: allow})
	m := newMesh(t, func(c *Config) { c.Store = store })
	m.store = store
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- store.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	// The listener and the route to the DNS cluster; no EDS cluster.
	m.applyClusters([]*routev3.Route{{Match: prefix("/"), Action: toCluster(egressCluster)}}, nil)
	return m
}

const egressCluster = "outbound|80||httpbin.example"

// applyDNSCluster pushes the STRICT_DNS cluster of httpbin.example:port,
// refreshed every 50 ms.
func (m *mesh) applyDNSCluster(port uint16) {
	c := &clusterv3.Cluster{Name: egressCluster, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		ConnectTimeout: durationpb.New(time.Second), DnsRefreshRate: durationpb.New(50 * time.Millisecond), DnsLookupFamily: clusterv3.Cluster_V4_ONLY,
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: egressCluster, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: "httpbin.example", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)}}}}}},
		}}}}}}
	if err := m.store.ApplyClusters(map[string]*anypb.Any{egressCluster: mustAny(m.t, c)}, nil); err != nil {
		m.t.Fatal(err)
	}
}

// twoLoopbackBackends starts backends v1 on 127.0.0.1 and v2 on 127.0.0.2
// with the same port, so that only the resolved address tells them apart.
func twoLoopbackBackends(t *testing.T) (port uint16) {
	for range 20 {
		ln1, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln1.Addr().(*net.TCPAddr).AddrPort().Port()
		ln2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", port))
		if err != nil {
			ln1.Close()
			continue
		}
		for name, ln := range map[string]net.Listener{"v1": ln1, "v2": ln2} {
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, name) })}
			done := make(chan struct{})
			go func() { srv.Serve(ln); close(done) }()
			t.Cleanup(func() { srv.Close(); <-done })
		}
		return port
	}
	t.Fatal("no port free on both 127.0.0.1 and 127.0.0.2")
	return 0
}

// waitBody sends requests until one answers want.
func (m *mesh) waitBody(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := m.do(get("/"))
		got := fmt.Sprintf("%d %s", resp.StatusCode, body(resp))
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %q, want %q", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStrictDNSEgress: requests to a STRICT_DNS cluster go to the address
// its name resolves to, and follow the name to a new address after a
// refresh.
//
// The upstreams are on loopback, which the Store's guard drops, so this
// test lets loopback through its AllowAddr; TestStrictDNSGuard runs the
// default guard on the same setup, and config's tests cover the guard's
// cases.
func TestStrictDNSEgress(t *testing.T) {
	port := twoLoopbackBackends(t)
	names := &nameTable{addrs: map[string][]netip.Addr{}}
	names.set("httpbin.example", netip.MustParseAddr("127.0.0.1"))
	m := dnsMesh(t, names, func(a netip.Addr) bool { return a.Unmap().IsLoopback() || podnet.EndpointAddr(a) })
	m.applyDNSCluster(port)
	m.waitBody(t, "200 v1")
	for range 5 {
		if resp := m.do(get("/")); resp.StatusCode != 200 {
			t.Fatalf("before the name changed: %d", resp.StatusCode)
		} else if b := body(resp); b != "v1" {
			t.Fatalf("before the name changed: reached %s", b)
		}
	}

	names.set("httpbin.example", netip.MustParseAddr("127.0.0.2"))
	m.waitBody(t, "200 v2")
	for range 5 {
		if resp := m.do(get("/")); resp.StatusCode != 200 {
			t.Fatalf("after the name changed: %d", resp.StatusCode)
		} else if b := body(resp); b != "v2" {
			t.Fatalf("after the name changed: reached %s", b)
		}
	}
	if a := m.store.Snapshot().Assignments[egressCluster]; a == nil || len(a.Endpoints) != 1 || a.Endpoints[0].Addr != netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), port) {
		t.Errorf("assignment %+v", a)
	}
}

// TestStrictDNSGuard: with the default guard, a name resolving to the
// waypoint's own loopback gets no endpoint: the request fails with no
// healthy upstream and never reaches the local server.
func TestStrictDNSGuard(t *testing.T) {
	reached := make(chan string, 10)
	local := backend(t, "local", func(w http.ResponseWriter, r *http.Request) { reached <- r.URL.Path })
	names := &nameTable{addrs: map[string][]netip.Addr{}}
	names.set("httpbin.example", netip.MustParseAddr("::ffff:127.0.0.1"), netip.MustParseAddr("127.0.0.1"))
	m := dnsMesh(t, names, nil)
	m.applyDNSCluster(local.Port())
	deadline := time.Now().Add(10 * time.Second)
	for m.store.Snapshot().Assignments[egressCluster] == nil {
		if time.Now().After(deadline) {
			t.Fatal("the name was never resolved")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp := m.do(get("/secret"))
	if b := body(resp); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(b, "no healthy upstream") {
		t.Errorf("got %d %q, want 503 no healthy upstream", resp.StatusCode, b)
	}
	select {
	case p := <-reached:
		t.Errorf("the local server was reached at %s", p)
	default:
	}
}
