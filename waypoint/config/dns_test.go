//lint:file-ignore SA1019 the deprecated Cluster fields are those Istio sends and Envoy still reads

package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/net/dns/dnsmessage"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// socket is an lb_endpoint of a socket address.
func socket(addr string, port uint32) *endpointv3.LbEndpoint {
	return &endpointv3.LbEndpoint{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}}}}
}

// strictDNS returns a STRICT_DNS cluster of the lb_endpoints, as the
// control plane sends them for a ServiceEntry with resolution DNS.
func strictDNS(name string, eps ...*endpointv3.LbEndpoint) *clusterv3.Cluster {
	return &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS},
		ConnectTimeout: durationpb.New(2 * time.Second),
		LoadAssignment: &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: eps}}}}
}

func TestCompileDNSCluster(t *testing.T) {
	const name = "outbound|80||httpbin.example"
	c, err := CompileCluster(strictDNS(name, socket("httpbin.example", 80), socket("192.0.2.1", 8080), socket("::ffff:192.0.2.2", 81)))
	if err != nil {
		t.Fatal(err)
	}
	want := &DNS{Refresh: DefaultDNSRefresh, Family: clusterv3.Cluster_AUTO, Targets: []DNSTarget{
		{Host: "httpbin.example", Port: 80}, {IP: netip.MustParseAddr("192.0.2.1"), Port: 8080}, {IP: netip.MustParseAddr("192.0.2.2"), Port: 81}}}
	if diff := cmp.Diff(want, c.DNS, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("DNS (-want +got):\n%s", diff)
	}
	if c.LB != RoundRobin || c.ConnectTimeout != 2*time.Second || c.Passthrough {
		t.Errorf("cluster %+v", c)
	}

	cl := strictDNS(name, socket("httpbin.example", 80))
	cl.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_LOGICAL_DNS}
	cl.LbPolicy = clusterv3.Cluster_LEAST_REQUEST
	cl.DnsRefreshRate = durationpb.New(30 * time.Second)
	cl.DnsLookupFamily = clusterv3.Cluster_V4_ONLY
	c, err = CompileCluster(cl)
	if err != nil {
		t.Fatal(err)
	}
	if !c.DNS.Logical || c.DNS.Refresh != 30*time.Second || c.DNS.Family != clusterv3.Cluster_V4_ONLY || c.LB != LeastRequest {
		t.Errorf("LOGICAL_DNS cluster: %+v %+v", c, c.DNS)
	}
}

func TestCompileDNSClusterRefused(t *testing.T) {
	const name = "outbound|80||httpbin.example"
	ok := func() *clusterv3.Cluster { return strictDNS(name, socket("httpbin.example", 80)) }
	many := make([]*endpointv3.LbEndpoint, maxDNSTargets+1)
	for i := range many {
		many[i] = socket(fmt.Sprintf("h%d.example", i), 80)
	}
	tests := []struct {
		name   string
		modify func(c *clusterv3.Cluster)
		want   string
	}{
		{"no load_assignment", func(c *clusterv3.Cluster) { c.LoadAssignment = nil }, ".load_assignment is required for type STRICT_DNS"},
		{"no endpoints", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints = nil }, "lists no endpoints"},
		{"empty host", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints[0].LbEndpoints[0] = socket("", 80) }, "the host name is empty"},
		{"port 0", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints[0].LbEndpoints[0] = socket("a.example", 0) }, "port_value 0 is not a port"},
		{"port too big", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints[0].LbEndpoints[0] = socket("a.example", 65536) }, "port_value 65536 is not a port"},
		{"bad name", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints[0].LbEndpoints[0] = socket("a..example", 80) }, `"a..example" is not a DNS name`},
		{"IPv4 shorthand", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints[0].LbEndpoints[0] = socket("127.1", 80) }, "last label is all digits"},
		{"bracketed IPv6", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints[0].LbEndpoints[0] = socket("[::1]", 80) }, "is not a DNS name"},
		{"IPv6 zone", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints[0].LbEndpoints[0] = socket("fe80::1%eth0", 80) }, "IPv6 zone"},
		{"too many", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints[0].LbEndpoints = many }, "more than 64 endpoints"},
		{"named port", func(c *clusterv3.Cluster) {
			c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().GetAddress().GetSocketAddress().PortSpecifier = &corev3.SocketAddress_NamedPort{NamedPort: "http"}
		}, "socket_address.named_port is not supported"},
		{"resolver_name", func(c *clusterv3.Cluster) {
			c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().GetAddress().GetSocketAddress().ResolverName = "x"
		}, "socket_address.resolver_name is not supported"},
		{"UDP", func(c *clusterv3.Cluster) {
			c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().GetAddress().GetSocketAddress().Protocol = corev3.SocketAddress_UDP
		}, "socket_address.protocol is not supported"},
		{"pipe", func(c *clusterv3.Cluster) {
			c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address = &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/x"}}}
		}, "address.pipe is not supported"},
		{"endpoint hostname", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Hostname = "x" }, "endpoint.hostname is not supported"},
		{"health status", func(c *clusterv3.Cluster) {
			c.LoadAssignment.Endpoints[0].LbEndpoints[0].HealthStatus = corev3.HealthStatus_DRAINING
		}, "lb_endpoints[0].health_status is not supported"},
		{"priority", func(c *clusterv3.Cluster) { c.LoadAssignment.Endpoints[0].Priority = 1 }, "endpoints[0].priority is not supported"},
		{"policy", func(c *clusterv3.Cluster) { c.LoadAssignment.Policy = &endpointv3.ClusterLoadAssignment_Policy{} }, "load_assignment.policy is not supported"},
		{"other cluster_name", func(c *clusterv3.Cluster) { c.LoadAssignment.ClusterName = "other" }, `cluster_name "other" is not the cluster's name`},
		{"respect_dns_ttl", func(c *clusterv3.Cluster) { c.RespectDnsTtl = true }, ".respect_dns_ttl is not supported"},
		{"dns_failure_refresh_rate", func(c *clusterv3.Cluster) { c.DnsFailureRefreshRate = &clusterv3.Cluster_RefreshRate{} }, ".dns_failure_refresh_rate is not supported"},
		{"dns_resolvers", func(c *clusterv3.Cluster) { c.DnsResolvers = []*corev3.Address{{}} }, ".dns_resolvers is not supported"},
		{"refresh 1ms", func(c *clusterv3.Cluster) { c.DnsRefreshRate = durationpb.New(time.Millisecond) }, "dns_refresh_rate 1ms must be longer than 1ms"},
		{"refresh negative", func(c *clusterv3.Cluster) { c.DnsRefreshRate = durationpb.New(-time.Second) }, "dns_refresh_rate -1s must be longer"},
		{"unknown family", func(c *clusterv3.Cluster) { c.DnsLookupFamily = 42 }, "dns_lookup_family 42 is not supported"},
		{"eds config", func(c *clusterv3.Cluster) { c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{} }, "eds_cluster_config is not supported for type STRICT_DNS"},
		{"ring hash", func(c *clusterv3.Cluster) { c.LbPolicy = clusterv3.Cluster_RING_HASH }, "lb_policy RING_HASH is not supported"},
		{"logical with two", func(c *clusterv3.Cluster) {
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_LOGICAL_DNS}
			c.LoadAssignment.Endpoints[0].LbEndpoints = append(c.LoadAssignment.Endpoints[0].LbEndpoints, socket("b.example", 80))
		}, "LOGICAL_DNS takes exactly one"},
		{"load_assignment on EDS", func(c *clusterv3.Cluster) {
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
		}, ".load_assignment is not supported for type EDS"},
		{"dns family on EDS", func(c *clusterv3.Cluster) {
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
			c.LoadAssignment = nil
			c.DnsLookupFamily = clusterv3.Cluster_V4_ONLY
		}, ".dns_lookup_family is not supported for type EDS"},
		{"STATIC", func(c *clusterv3.Cluster) {
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC}
		}, "is not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok()
			tt.modify(c)
			_, err := CompileCluster(c)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), `cluster "outbound|80||httpbin.example"`) {
				t.Errorf("error %q does not name the cluster", err)
			}
		})
	}
}

func TestCheckHostname(t *testing.T) {
	long := strings.Repeat("a", 63)
	name253 := strings.Join([]string{long, long, long, strings.Repeat("b", 61)}, ".")
	tests := []struct {
		host string
		ok   bool
	}{
		{"httpbin.example", true},
		{"HTTPBIN.Example.", true},
		{"a", true},
		{"_dmarc.example.com", true},
		{"xn--bcher-kva.example", true},
		{"1.example", true},
		{"example.123a", true},
		{name253, true},
		{name253 + ".", true},
		{"", false},
		{".", false},
		{"..", false},
		{name253 + "c", false},
		{long + "a.example", false},
		{".example", false},
		{"a..example", false},
		{"-a.example", false},
		{"a-.example", false},
		{"a b.example", false},
		{"a/b", false},
		{"a:80", false},
		{"bücher.example", false},
		{"127.0.0.1", false}, // an IP literal is parsed before, never as a name
		{"127.1", false},
		{"2130706433", false},
		{"0x7f.0.0.1", false},
		{"::1", false},
		{"[::1]", false},
		{"a.example\x00.evil", false},
		{"a.example\n", false},
	}
	for _, tt := range tests {
		if err := CheckHostname(tt.host); (err == nil) != tt.ok {
			t.Errorf("CheckHostname(%q) = %v, want ok=%v", tt.host, err, tt.ok)
		}
	}
}

func FuzzCheckHostname(f *testing.F) {
	for _, s := range []string{"httpbin.example", "a..b", "127.1", "x.", "-a", "a_b.c", strings.Repeat("a.", 130)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		if CheckHostname(h) != nil {
			return
		}
		name := strings.TrimSuffix(h, ".")
		if len(name) == 0 || len(name) > 253 {
			t.Fatalf("accepted %q of length %d", h, len(name))
		}
		if _, err := netip.ParseAddr(h); err == nil {
			t.Fatalf("accepted the IP address %q as a name", h)
		}
		for _, l := range strings.Split(name, ".") {
			if l == "" || len(l) > 63 || strings.HasPrefix(l, "-") || strings.HasSuffix(l, "-") {
				t.Fatalf("accepted %q with label %q", h, l)
			}
			if strings.ContainsFunc(l, func(r rune) bool {
				return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
			}) {
				t.Fatalf("accepted %q with label %q", h, l)
			}
		}
	})
}

// fakeResolver answers from a table it can change; a name with an error
// fails. It records the networks asked for.
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr // "network host" or "host" (any network)
	errs    map[string]error
	calls   []string
}

func newFake() *fakeResolver {
	return &fakeResolver{answers: map[string][]netip.Addr{}, errs: map[string]error{}}
}

func (f *fakeResolver) set(host string, addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var as []netip.Addr
	for _, a := range addrs {
		as = append(as, netip.MustParseAddr(a))
	}
	f.answers[host] = as
	delete(f.errs, host)
}

func (f *fakeResolver) remove(host string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.answers, host)
	delete(f.errs, host)
}

func (f *fakeResolver) fail(host string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[host] = err
}

func (f *fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, network+" "+host)
	if err := f.errs[host]; err != nil {
		return nil, err
	}
	if as, ok := f.answers[network+" "+host]; ok {
		return as, nil
	}
	if as, ok := f.answers[host]; ok {
		return as, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (f *fakeResolver) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// logRecorder keeps the messages logged.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}

// count returns how many messages contain s.
func (l *logRecorder) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

// dnsStore runs a store with the resolver r in a synctest bubble; the
// returned stop ends Run and waits for it.
func dnsStore(t *testing.T, r Resolver, logs *logRecorder) (*Store, func()) {
	s := NewStoreWith(StoreConfig{Resolver: r, Logger: slog.New(logs)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	return s, func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if n := s.resolving.Load(); n != 0 {
			t.Errorf("%d resolutions still running after Run returned", n)
		}
	}
}

func applyClusters(t *testing.T, s *Store, rm []string, cs ...*clusterv3.Cluster) {
	t.Helper()
	up := map[string]*anypb.Any{}
	for _, c := range cs {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		up[c.Name] = a
	}
	if err := s.ApplyClusters(up, rm); err != nil {
		t.Fatal(err)
	}
}

// endpoints lists the Snapshot's endpoints of a cluster; nil when it has
// no assignment.
func endpoints(s *Store, name string) []string {
	a := s.Snapshot().Assignments[name]
	if a == nil {
		return nil
	}
	out := []string{}
	for _, e := range a.Endpoints {
		if !e.Healthy || e.HBONE {
			out = append(out, "unexpected endpoint "+fmt.Sprint(e))
		}
		out = append(out, e.Addr.String())
	}
	return out
}

func TestStrictDNSResolution(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const name = "outbound|80||httpbin.example"
		r, logs := newFake(), &logRecorder{}
		r.set("httpbin.example", "192.0.2.1", "192.0.2.2")
		r.set("mirror.example", "2001:db8::1", "192.0.2.1")
		s, stop := dnsStore(t, r, logs)
		defer stop()
		c := strictDNS(name, socket("httpbin.example", 80), socket("mirror.example", 8080), socket("198.51.100.7", 80))
		c.DnsRefreshRate = durationpb.New(10 * time.Second)
		applyClusters(t, s, nil, c)
		synctest.Wait()
		want := []string{"192.0.2.1:80", "192.0.2.1:8080", "192.0.2.2:80", "198.51.100.7:80", "[2001:db8::1]:8080"}
		if diff := cmp.Diff(want, endpoints(s, name)); diff != "" {
			t.Fatalf("at start (-want +got):\n%s", diff)
		}

		// A new answer shows after the refresh interval, not before.
		r.set("httpbin.example", "192.0.2.3")
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if got := endpoints(s, name); !slices.Contains(got, "192.0.2.2:80") {
			t.Fatalf("changed before the refresh: %v", got)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		want = []string{"192.0.2.1:8080", "192.0.2.3:80", "198.51.100.7:80", "[2001:db8::1]:8080"}
		if diff := cmp.Diff(want, endpoints(s, name)); diff != "" {
			t.Fatalf("after a refresh (-want +got):\n%s", diff)
		}

		// A failed lookup keeps the last good addresses, logged once for
		// three failing refreshes.
		snap := s.Snapshot()
		r.fail("httpbin.example", errors.New("server misbehaving"))
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if diff := cmp.Diff(want, endpoints(s, name)); diff != "" {
			t.Fatalf("after failures (-want +got):\n%s", diff)
		}
		if s.Snapshot() != snap {
			t.Error("a refresh with no change published a new Snapshot")
		}
		if n := logs.count("failed; keeping its last addresses"); n != 1 {
			t.Errorf("logged the failure %d times, want once", n)
		}
		r.set("httpbin.example", "192.0.2.4")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := endpoints(s, name); !slices.Contains(got, "192.0.2.4:80") {
			t.Fatalf("after recovery: %v", got)
		}
		if n := logs.count("resolves again"); n != 1 {
			t.Errorf("logged the recovery %d times, want once", n)
		}

		// A name that no longer exists (NXDOMAIN, NODATA) is an empty
		// answer, as in Envoy: its addresses go, the other names' stay.
		r.remove("httpbin.example")
		time.Sleep(30 * time.Second)
		synctest.Wait()
		want = []string{"192.0.2.1:8080", "198.51.100.7:80", "[2001:db8::1]:8080"}
		if diff := cmp.Diff(want, endpoints(s, name)); diff != "" {
			t.Fatalf("after NXDOMAIN (-want +got):\n%s", diff)
		}
		if n := logs.count("has no address"); n != 1 {
			t.Errorf("logged the missing name %d times, want once", n)
		}
	})
}

// TestDNSFirstFailure: a name that never resolved has no endpoints (an
// empty assignment, so requests fail fast as for an empty EDS cluster).
func TestDNSFirstFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newFake()
		s, stop := dnsStore(t, r, &logRecorder{})
		defer stop()
		applyClusters(t, s, nil, strictDNS("c", socket("nowhere.example", 80)))
		synctest.Wait()
		if got := endpoints(s, "c"); got == nil || len(got) != 0 {
			t.Fatalf("endpoints %v, want an empty assignment", got)
		}
	})
}

func TestDNSGuard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, logs := newFake(), &logRecorder{}
		r.set("rebind.example", "127.0.0.1", "192.0.2.1", "::ffff:127.0.0.1", "::1", "0.0.0.0", "169.254.169.254", "224.0.0.1", "::ffff:198.51.100.1", "fe80::1")
		r.set("local.example", "::ffff:127.0.0.1")
		s, stop := dnsStore(t, r, logs)
		defer stop()
		c := strictDNS("c", socket("rebind.example", 80), socket("local.example", 81), socket("127.0.0.1", 82), socket("::ffff:169.254.169.254", 83))
		c.DnsRefreshRate = durationpb.New(time.Second)
		applyClusters(t, s, nil, c)
		synctest.Wait()
		want := []string{"192.0.2.1:80", "198.51.100.1:80"}
		if diff := cmp.Diff(want, endpoints(s, "c")); diff != "" {
			t.Fatalf("(-want +got):\n%s", diff)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		// One warning per target with dropped addresses, not per refresh.
		if n := logs.count("dropped resolved addresses"); n != 4 {
			t.Errorf("logged dropped addresses %d times, want 4 (once per target)", n)
		}
		// LOGICAL_DNS takes the first usable address, never a dropped one.
		l := strictDNS("l", socket("rebind.example", 80))
		l.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_LOGICAL_DNS}
		applyClusters(t, s, nil, l)
		synctest.Wait()
		if diff := cmp.Diff([]string{"192.0.2.1:80"}, endpoints(s, "l")); diff != "" {
			t.Fatalf("LOGICAL_DNS (-want +got):\n%s", diff)
		}
	})
}

// TestDNSLongAnswer: of an answer with more addresses than maxDNSAnswer,
// the first ones are kept, and that is logged once.
func TestDNSLongAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, logs := newFake(), &logRecorder{}
		var addrs []string
		for i := range 300 {
			addrs = append(addrs, fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))
		}
		r.set("many.example", addrs...)
		s, stop := dnsStore(t, r, logs)
		defer stop()
		applyClusters(t, s, nil, strictDNS("c", socket("many.example", 80)))
		synctest.Wait()
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := endpoints(s, "c"); len(got) != maxDNSAnswer {
			t.Errorf("%d endpoints, want %d", len(got), maxDNSAnswer)
		}
		if n := logs.count("more addresses than the waypoint keeps"); n != 1 {
			t.Errorf("logged %d times, want once", n)
		}
	})
}

func TestDNSLookupFamily(t *testing.T) {
	tests := []struct {
		family clusterv3.Cluster_DnsLookupFamily
		v6     bool // the name has AAAA records
		calls  []string
		want   []string
	}{
		{clusterv3.Cluster_AUTO, true, []string{"ip6 h.example"}, []string{"[2001:db8::1]:80"}},
		{clusterv3.Cluster_AUTO, false, []string{"ip6 h.example", "ip4 h.example"}, []string{"192.0.2.1:80"}},
		{clusterv3.Cluster_V4_PREFERRED, true, []string{"ip4 h.example"}, []string{"192.0.2.1:80"}},
		{clusterv3.Cluster_V4_ONLY, true, []string{"ip4 h.example"}, []string{"192.0.2.1:80"}},
		{clusterv3.Cluster_V6_ONLY, true, []string{"ip6 h.example"}, []string{"[2001:db8::1]:80"}},
		{clusterv3.Cluster_V6_ONLY, false, []string{"ip6 h.example"}, []string{}},
		{clusterv3.Cluster_ALL, true, []string{"ip h.example"}, []string{"192.0.2.1:80", "[2001:db8::1]:80"}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/v6=%v", tt.family, tt.v6), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newFake()
				r.set("ip4 h.example", "192.0.2.1")
				if tt.v6 {
					r.set("ip6 h.example", "2001:db8::1")
					r.set("ip h.example", "192.0.2.1", "2001:db8::1")
				} else {
					r.set("ip h.example", "192.0.2.1")
				}
				s, stop := dnsStore(t, r, &logRecorder{})
				defer stop()
				c := strictDNS("c", socket("h.example", 80))
				c.DnsLookupFamily = tt.family
				applyClusters(t, s, nil, c)
				synctest.Wait()
				if diff := cmp.Diff(tt.want, endpoints(s, "c")); diff != "" {
					t.Errorf("endpoints (-want +got):\n%s", diff)
				}
				r.mu.Lock()
				defer r.mu.Unlock()
				if diff := cmp.Diff(tt.calls, r.calls); diff != "" {
					t.Errorf("lookups (-want +got):\n%s", diff)
				}
			})
		})
	}
}

// TestDNSClusterLifecycle: a removed or changed cluster stops its
// resolution; an unchanged one keeps it through updates; EDS never
// overrides a DNS cluster's endpoints.
func TestDNSClusterLifecycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newFake()
		r.set("a.example", "192.0.2.1")
		r.set("b.example", "192.0.2.2")
		s, stop := dnsStore(t, r, &logRecorder{})
		defer stop()
		c := strictDNS("c", socket("a.example", 80))
		applyClusters(t, s, nil, c, strictDNS("d", socket("b.example", 80)))
		synctest.Wait()
		if n := s.resolving.Load(); n != 2 {
			t.Fatalf("%d resolutions running, want 2", n)
		}

		// An EDS assignment of the same name is kept aside, not served.
		cla, _ := anypb.New(&endpointv3.ClusterLoadAssignment{ClusterName: "c", Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{socket("203.0.113.9", 80)}}}})
		if err := s.ApplyEndpoints(map[string]*anypb.Any{"c": cla}, nil); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"192.0.2.1:80"}, endpoints(s, "c")); diff != "" {
			t.Fatalf("after EDS for a DNS cluster (-want +got):\n%s", diff)
		}

		// The same cluster again (a SotW push) keeps its resolution: no
		// new lookup before the refresh.
		calls := r.callCount()
		applyClusters(t, s, nil, c, strictDNS("d", socket("b.example", 80)))
		synctest.Wait()
		if r.callCount() != calls {
			t.Errorf("an unchanged cluster was resolved again at once")
		}

		// Changed: the old resolution stops, the old endpoints serve until
		// the new one answers.
		r.set("a2.example", "192.0.2.5")
		c2 := strictDNS("c", socket("a2.example", 80))
		applyClusters(t, s, nil, c2)
		synctest.Wait()
		if diff := cmp.Diff([]string{"192.0.2.5:80"}, endpoints(s, "c")); diff != "" {
			t.Fatalf("after a change (-want +got):\n%s", diff)
		}
		if n := s.resolving.Load(); n != 2 {
			t.Fatalf("%d resolutions running after a change, want 2", n)
		}

		// Removed: its resolution stops and it has no assignment.
		applyClusters(t, s, []string{"d"})
		synctest.Wait()
		if n := s.resolving.Load(); n != 1 {
			t.Fatalf("%d resolutions running after a removal, want 1", n)
		}
		if _, ok := s.Snapshot().Assignments["d"]; ok {
			t.Error("a removed DNS cluster kept its assignment")
		}
		calls = r.callCount()
		time.Sleep(time.Minute)
		synctest.Wait()
		r.mu.Lock()
		for _, call := range r.calls[calls:] {
			if strings.HasSuffix(call, " b.example") || strings.HasSuffix(call, " a.example") {
				t.Errorf("a stopped resolution looked up %s", call)
			}
		}
		r.mu.Unlock()

		// The cluster turned EDS: the EDS assignment serves.
		e := &clusterv3.Cluster{Name: "c", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}, EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{}}
		applyClusters(t, s, nil, e)
		synctest.Wait()
		if n := s.resolving.Load(); n != 0 {
			t.Fatalf("%d resolutions running for EDS clusters", n)
		}
		if diff := cmp.Diff([]string{"203.0.113.9:80"}, endpoints(s, "c")); diff != "" {
			t.Fatalf("after turning EDS (-want +got):\n%s", diff)
		}
	})
}

// TestDNSBeforeAndAfterRun: clusters applied before Run resolve when it
// starts; Run returns once every resolution stopped, and a second Run is
// refused.
func TestDNSBeforeAndAfterRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newFake()
		r.set("a.example", "192.0.2.1")
		s := NewStoreWith(StoreConfig{Resolver: r})
		applyClusters(t, s, nil, strictDNS("c", socket("a.example", 80)))
		synctest.Wait()
		if got := endpoints(s, "c"); got != nil {
			t.Fatalf("resolved before Run: %v", got)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- s.Run(ctx) }()
		synctest.Wait()
		if diff := cmp.Diff([]string{"192.0.2.1:80"}, endpoints(s, "c")); diff != "" {
			t.Fatalf("(-want +got):\n%s", diff)
		}
		if err := s.Run(ctx); err == nil {
			t.Error("a second Run was accepted")
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// After Run, an update starts no resolution.
		applyClusters(t, s, nil, strictDNS("e", socket("a.example", 80)))
		synctest.Wait()
		if n := s.resolving.Load(); n != 0 {
			t.Fatalf("%d resolutions after Run returned", n)
		}
	})
}

// dnsServer is a DNS server on loopback UDP answering A and AAAA queries
// from a table the test can change.
type dnsServer struct {
	pc       net.PacketConn
	mu       sync.Mutex
	records  map[string][]netip.Addr // absolute lower-case name
	servfail map[string]bool         // names answered SERVFAIL
}

func newDNSServer(t *testing.T) *dnsServer {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dnsServer{pc: pc, records: map[string][]netip.Addr{}, servfail: map[string]bool{}}
	done := make(chan struct{})
	go func() { defer close(done); d.serve() }()
	t.Cleanup(func() { pc.Close(); <-done })
	return d
}

func (d *dnsServer) set(name string, addrs ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.records[name] = nil
	for _, a := range addrs {
		d.records[name] = append(d.records[name], netip.MustParseAddr(a))
	}
}

func (d *dnsServer) serve() {
	buf := make([]byte, 512)
	for {
		n, from, err := d.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp, err := d.answer(buf[:n]); err == nil {
			d.pc.WriteTo(resp, from)
		}
	}
}

func (d *dnsServer) answer(req []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	addrs, ok := d.records[strings.ToLower(q.Name.String())]
	fail := d.servfail[strings.ToLower(q.Name.String())]
	d.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	switch {
	case fail:
		rh.RCode, addrs = dnsmessage.RCodeServerFailure, nil
	case !ok:
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	for _, a := range addrs {
		hdr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 30}
		switch {
		case a.Is4() && q.Type == dnsmessage.TypeA:
			hdr.Type = dnsmessage.TypeA
			err = b.AResource(hdr, dnsmessage.AResource{A: a.As4()})
		case a.Is6() && q.Type == dnsmessage.TypeAAAA:
			hdr.Type = dnsmessage.TypeAAAA
			err = b.AAAAResource(hdr, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
		if err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// resolver is a Go resolver that asks only this server.
func (d *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "udp", d.pc.LocalAddr().String())
	}}
}

// TestDNSRealResolver resolves through net.Resolver against a DNS server
// on loopback: the answers' addresses, the guard, and a change at refresh.
func TestDNSRealResolver(t *testing.T) {
	srv := newDNSServer(t)
	srv.set("httpbin.example.", "192.0.2.1", "127.0.0.1", "198.51.100.2")
	srv.set("v6.example.", "2001:db8::7", "::ffff:127.0.0.1")
	logs := &logRecorder{}
	s := NewStoreWith(StoreConfig{Resolver: srv.resolver(), Logger: slog.New(logs)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	c := strictDNS("c", socket("httpbin.example", 80), socket("v6.example", 443))
	c.DnsRefreshRate = durationpb.New(50 * time.Millisecond)
	c.DnsLookupFamily = clusterv3.Cluster_ALL
	applyClusters(t, s, nil, c)
	waitEndpoints(t, s, "c", []string{"192.0.2.1:80", "198.51.100.2:80", "[2001:db8::7]:443"})
	if n := logs.count("dropped resolved addresses"); n != 2 {
		t.Errorf("the loopback answers were logged %d times, want once per name", n)
	}
	srv.set("httpbin.example.", "192.0.2.9")
	waitEndpoints(t, s, "c", []string{"192.0.2.9:80", "[2001:db8::7]:443"})
	// SERVFAIL keeps the last good answer; NXDOMAIN empties it.
	srv.mu.Lock()
	srv.servfail["httpbin.example."] = true
	srv.mu.Unlock()
	time.Sleep(300 * time.Millisecond)
	waitEndpoints(t, s, "c", []string{"192.0.2.9:80", "[2001:db8::7]:443"})
	if n := logs.count("failed; keeping its last addresses"); n != 1 {
		t.Errorf("SERVFAIL logged %d times, want once", n)
	}
	srv.mu.Lock()
	delete(srv.records, "httpbin.example.")
	delete(srv.servfail, "httpbin.example.")
	srv.mu.Unlock()
	waitEndpoints(t, s, "c", []string{"[2001:db8::7]:443"})

	// localhost (from the hosts file, or else not found) never yields an
	// endpoint.
	applyClusters(t, s, nil, strictDNS("l", socket("localhost", 80), socket("LOCALHOST.", 81)))
	waitEndpoints(t, s, "l", []string{})
}

func waitEndpoints(t *testing.T, s *Store, name string, want []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := endpoints(s, name)
		if cmp.Equal(want, got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoints of %s: got %v, want %v", name, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDNSApplyRefusesUnsupported: through the Store, a DNS cluster with a
// field the waypoint does not implement is NACKed and starts nothing
// (respect_dns_ttl: the TTL is not honoured, so it is not accepted).
func TestDNSApplyRefusesUnsupported(t *testing.T) {
	s := NewStore()
	c := strictDNS("c", socket("a.example", 80))
	c.RespectDnsTtl = true
	a, _ := anypb.New(c)
	err := s.ApplyClusters(map[string]*anypb.Any{"c": a}, nil)
	if err == nil || !strings.Contains(err.Error(), `cluster "c".respect_dns_ttl is not supported`) {
		t.Fatalf("got %v", err)
	}
	if len(s.dns) != 0 {
		t.Error("a refused cluster got a resolution")
	}
}
