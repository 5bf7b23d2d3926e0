package config

import (
	"net/netip"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	httpinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weftmesh/weft/waypoint/urlpath"
)

func TestNACKNamesField(t *testing.T) {
	c := &clusterv3.Cluster{Name: "outbound|80||a", ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}, OutlierDetection: &clusterv3.OutlierDetection{}}
	a, _ := anypb.New(c)
	s := NewStore()
	err := s.ApplyClusters(map[string]*anypb.Any{c.Name: a}, nil)
	if err == nil || !strings.Contains(err.Error(), `cluster "outbound|80||a".outlier_detection is not supported`) {
		t.Fatalf("got %v", err)
	}
	if len(s.Snapshot().Clusters) != 0 {
		t.Fatal("a rejected cluster was applied")
	}
	select {
	case <-s.Applied():
		t.Fatal("applied after a NACK")
	default:
	}
}

func FuzzCompile(f *testing.F) {
	b, _ := proto.Marshal(&listenerv3.Listener{Name: "waypoint"})
	f.Add(b, uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, kind uint8) {
		s := NewStore()
		urls := []string{resource.ListenerType, resource.RouteType, resource.ClusterType, resource.EndpointType}
		a := &anypb.Any{TypeUrl: urls[int(kind)%4], Value: data}
		up := map[string]*anypb.Any{"x": a}
		switch kind % 4 {
		case 0:
			s.ApplyListeners(up, nil)
		case 1:
			s.ApplyRoutes(up, nil)
		case 2:
			s.ApplyClusters(up, nil)
		case 3:
			s.ApplyEndpoints(up, nil)
		}
	})
}

// TestUnknownFilterType: a filter of a type the waypoint does not link is
// refused as unsupported, with the type named.
func TestUnknownFilterType(t *testing.T) {
	l := &listenerv3.Listener{Name: "waypoint", FilterChains: []*listenerv3.FilterChain{{
		Name:    "echo:80",
		Filters: []*listenerv3.Filter{{Name: "x", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: &anypb.Any{TypeUrl: "type.googleapis.com/example.Unknown"}}}},
	}}}
	a, _ := anypb.New(l)
	err := NewStore().ApplyListeners(map[string]*anypb.Any{"waypoint": a}, nil)
	if err == nil || !strings.Contains(err.Error(), "typed_config type.googleapis.com/example.Unknown is not supported") {
		t.Fatalf("got %v", err)
	}
}

func chainWith(t *testing.T, name string, match *listenerv3.FilterChainMatch, f proto.Message) *listenerv3.FilterChain {
	t.Helper()
	a, err := anypb.New(f)
	if err != nil {
		t.Fatal(err)
	}
	return &listenerv3.FilterChain{Name: name, FilterChainMatch: match, Filters: []*listenerv3.Filter{{Name: name, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: a}}}}
}

func inspector(t *testing.T) []*listenerv3.ListenerFilter {
	a, err := anypb.New(&httpinspector.HttpInspector{})
	if err != nil {
		t.Fatal(err)
	}
	return []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.http_inspector", ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: a}}}
}

// TestApplicationProtocols: a port whose protocol is detected has an HTTP
// chain for HTTP streams and a TCP chain for the rest; what the waypoint
// cannot detect, or a chain that no inspector would ever select, is
// refused.
func TestApplicationProtocols(t *testing.T) {
	vip := &corev3.CidrRange{AddressPrefix: "10.96.0.10", PrefixLen: wrapperspb.UInt32(32)}
	match := func(protos ...string) *listenerv3.FilterChainMatch {
		return &listenerv3.FilterChainMatch{PrefixRanges: []*corev3.CidrRange{vip}, DestinationPort: wrapperspb.UInt32(80), ApplicationProtocols: protos}
	}
	hcm := &hcmv3.HttpConnectionManager{RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "r"}},
		HttpFilters: []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAnyT(t, &routerv3.Router{})}}}}
	tcp := &tcpv3.TcpProxy{StatPrefix: "t", ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: "c"}}
	l := &listenerv3.Listener{Name: "waypoint", ListenerFilters: inspector(t), FilterChains: []*listenerv3.FilterChain{
		chainWith(t, "tcp", match(), tcp),
		chainWith(t, "http", match("http/1.0", "http/1.1", "h2c"), hcm),
	}}
	cl, err := CompileListener(l)
	if err != nil {
		t.Fatal(err)
	}
	snap := &Snapshot{Listener: cl}
	target := netip.MustParseAddrPort("10.96.0.10:80")
	if !Detects(snap.Chains(target)) {
		t.Error("the pair does not depend on the protocol")
	}
	for proto, want := range map[string]string{ProtoHTTP11: "http", ProtoH2C: "http", "": "tcp"} {
		if c := snap.Select(target, proto); c == nil || c.Name != want {
			t.Errorf("%q selects %+v, want %s", proto, c, want)
		}
	}
	for _, tc := range []struct {
		name string
		l    *listenerv3.Listener
		err  string
	}{
		{"no inspector", &listenerv3.Listener{Name: "waypoint", FilterChains: []*listenerv3.FilterChain{chainWith(t, "http", match("http/1.1", "http/1.0"), hcm)}},
			"needs the listener filter envoy.filters.listener.http_inspector"},
		{"unknown protocol", &listenerv3.Listener{Name: "waypoint", ListenerFilters: inspector(t), FilterChains: []*listenerv3.FilterChain{chainWith(t, "http", match("h2"), hcm)}},
			`"h2" is not supported`},
		{"HTTP/1.1 without 1.0", &listenerv3.Listener{Name: "waypoint", ListenerFilters: inspector(t), FilterChains: []*listenerv3.FilterChain{chainWith(t, "http", match("http/1.1"), hcm)}},
			"must list http/1.0 and http/1.1 together"},
		{"another listener filter", &listenerv3.Listener{Name: "waypoint", ListenerFilters: []*listenerv3.ListenerFilter{{Name: "tls",
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAnyT(t, &tcpv3.TcpProxy{})}}}},
			"is not supported (the HTTP or TLS inspector only)"},
		{"header principal in network RBAC", &listenerv3.Listener{Name: "waypoint", FilterChains: []*listenerv3.FilterChain{{Name: "tcp", Filters: []*listenerv3.Filter{
			{Name: "rbac", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAnyT(t, &netrbac.RBAC{StatPrefix: "tcp.", Rules: &rbacv3.RBAC{Policies: map[string]*rbacv3.Policy{"p": {
				Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}},
				Principals: []*rbacv3.Principal{{Identifier: &rbacv3.Principal_NotId{NotId: &rbacv3.Principal{Identifier: &rbacv3.Principal_Header{Header: &routev3.HeaderMatcher{Name: "x",
					HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}}}}}},
			}}}})}},
			{Name: "tcp", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAnyT(t, tcp)}},
		}}}}, "header is not supported in network RBAC"},
	} {
		if _, err := CompileListener(tc.l); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.err)
		}
	}
}

// TestCompilePathNormalization: the http_connection_manager's path fields
// as Istio's meshConfig.pathNormalization settings write them, and those
// the waypoint refuses.
func TestCompilePathNormalization(t *testing.T) {
	router := &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAnyT(t, &routerv3.Router{})}}
	hcm := func(tweak func(*hcmv3.HttpConnectionManager)) *hcmv3.HttpConnectionManager {
		m := &hcmv3.HttpConnectionManager{RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "r"}}, HttpFilters: []*hcmv3.HttpFilter{router}}
		tweak(m)
		return m
	}
	for _, tc := range []struct {
		name  string
		tweak func(*hcmv3.HttpConnectionManager)
		want  urlpath.Options
		err   string
	}{
		{"unset", func(*hcmv3.HttpConnectionManager) {}, urlpath.Options{}, ""},
		{"NONE", func(m *hcmv3.HttpConnectionManager) {
			m.NormalizePath = wrapperspb.Bool(false)
			m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_KEEP_UNCHANGED
		}, urlpath.Options{}, ""},
		{"BASE", func(m *hcmv3.HttpConnectionManager) { m.NormalizePath = wrapperspb.Bool(true) }, urlpath.Options{RFC3986: true}, ""},
		{"MERGE_SLASHES", func(m *hcmv3.HttpConnectionManager) { m.NormalizePath, m.MergeSlashes = wrapperspb.Bool(true), true }, urlpath.Options{RFC3986: true, MergeSlashes: true}, ""},
		{"DECODE_AND_MERGE_SLASHES", func(m *hcmv3.HttpConnectionManager) {
			m.NormalizePath, m.MergeSlashes = wrapperspb.Bool(true), true
			m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_UNESCAPE_AND_FORWARD
		}, urlpath.Options{RFC3986: true, MergeSlashes: true, EscapedSlashes: urlpath.UnescapeAndForward}, ""},
		{"reject", func(m *hcmv3.HttpConnectionManager) {
			m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_REJECT_REQUEST
		}, urlpath.Options{EscapedSlashes: urlpath.RejectEscapedSlashes}, ""},
		{"redirect", func(m *hcmv3.HttpConnectionManager) {
			m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT
		}, urlpath.Options{EscapedSlashes: urlpath.UnescapeAndRedirect}, ""},
		{"unknown action", func(m *hcmv3.HttpConnectionManager) {
			m.PathWithEscapedSlashesAction = 99
		}, urlpath.Options{}, "path_with_escaped_slashes_action 99 is not supported"},
		{"path_normalization_options", func(m *hcmv3.HttpConnectionManager) {
			m.PathNormalizationOptions = &hcmv3.HttpConnectionManager_PathNormalizationOptions{}
		}, urlpath.Options{}, "path_normalization_options is not supported"},
		{"forward_client_cert_details", func(m *hcmv3.HttpConnectionManager) {
			m.ForwardClientCertDetails = hcmv3.HttpConnectionManager_APPEND_FORWARD
		}, urlpath.Options{}, "forward_client_cert_details is not supported"},
	} {
		h, err := compileHCM(hcm(tc.tweak), "hcm")
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: got %v, want an error with %q", tc.name, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case h.Path != tc.want:
			t.Errorf("%s: got %+v, want %+v", tc.name, h.Path, tc.want)
		}
	}
}

func mustAnyT(t testing.TB, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestTCPWeightedClusters: tcp_proxy's weighted_clusters compile to the
// chain's weighted clusters; what could never pick a cluster, or names
// none, is refused with the field named.
func TestTCPWeightedClusters(t *testing.T) {
	weighted := func(cws ...*tcpv3.TcpProxy_WeightedCluster_ClusterWeight) *tcpv3.TcpProxy {
		return &tcpv3.TcpProxy{StatPrefix: "t", ClusterSpecifier: &tcpv3.TcpProxy_WeightedClusters{
			WeightedClusters: &tcpv3.TcpProxy_WeightedCluster{Clusters: cws}}}
	}
	cw := func(name string, w uint32) *tcpv3.TcpProxy_WeightedCluster_ClusterWeight {
		return &tcpv3.TcpProxy_WeightedCluster_ClusterWeight{Name: name, Weight: w}
	}
	compile := func(p *tcpv3.TcpProxy) (*Chain, error) {
		l, err := CompileListener(&listenerv3.Listener{Name: "waypoint", FilterChains: []*listenerv3.FilterChain{chainWith(t, "tcp", nil, p)}})
		if err != nil {
			return nil, err
		}
		return l.Chains[0], nil
	}
	ch, err := compile(weighted(cw("a", 3), cw("b", 0), cw("c", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if !ch.TCP() || ch.TCPCluster != "" || len(ch.TCPWeighted) != 3 {
		t.Fatalf("compiled %+v", ch)
	}
	// Every number of [0, 4) picks by the intervals a:[0,3), c:[3,4); b
	// (weight 0) never.
	for x, want := range []string{"a", "a", "a", "c"} {
		if got := ch.PickTCP(func(max uint64) uint64 {
			if max != 4 {
				t.Fatalf("total %d, want 4", max)
			}
			return uint64(x)
		}); got != want {
			t.Errorf("x=%d picks %s, want %s", x, got, want)
		}
	}
	for _, tc := range []struct {
		name string
		p    *tcpv3.TcpProxy
		err  string
	}{
		{"no cluster", &tcpv3.TcpProxy{StatPrefix: "t"}, "cluster or weighted_clusters is required"},
		{"empty list", weighted(), "weighted_clusters.clusters is empty"},
		{"all zero", weighted(cw("a", 0), cw("b", 0)), "the weights add up to 0"},
		{"no name", weighted(cw("a", 1), cw("", 1)), "weighted_clusters.clusters[1].name is required"},
		{"metadata", weighted(&tcpv3.TcpProxy_WeightedCluster_ClusterWeight{Name: "a", Weight: 1, MetadataMatch: &corev3.Metadata{}}),
			"metadata_match is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := compile(tc.p); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("got %v, want %q", err, tc.err)
			}
		})
	}
}

// TestEndpointAuthority: an HBONE endpoint may relay for another
// destination (metadata authority); an authority that is not an address
// and port, or on an endpoint that is not HBONE, is refused with the field.
func TestEndpointAuthority(t *testing.T) {
	ep := func(fields map[string]any) *endpointv3.ClusterLoadAssignment {
		md, err := structpb.NewStruct(fields)
		if err != nil {
			t.Fatal(err)
		}
		return &endpointv3.ClusterLoadAssignment{ClusterName: "c", Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: "10.0.0.9", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 15008}}}}}},
			Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"weft": md}},
		}}}}}
	}
	id := "spiffe://cluster.local/ns/shop/sa/waypoint"
	a, err := CompileAssignment(ep(map[string]any{"tunnel": "HBONE", "identity": id, "authority": "10.96.0.5:80"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Endpoints[0]; got.Authority != netip.MustParseAddrPort("10.96.0.5:80") || got.Addr != netip.MustParseAddrPort("10.0.0.9:15008") {
		t.Errorf("endpoint %+v", got)
	}
	for _, c := range []struct {
		fields map[string]any
		want   string
	}{
		{map[string]any{"tunnel": "HBONE", "identity": id, "authority": "shop:80"}, `authority "shop:80" is not an IP address and port`},
		{map[string]any{"tunnel": "HBONE", "identity": id, "authority": "10.96.0.5"}, "is not an IP address and port"},
		{map[string]any{"tunnel": "HBONE", "identity": id, "authority": "10.96.0.5:0"}, "is not an IP address and port"},
		{map[string]any{"tunnel": "HBONE", "identity": id, "authority": 80.0}, "is not an IP address and port"},
		{map[string]any{"authority": "10.96.0.5:80"}, "authority needs tunnel HBONE"},
	} {
		if _, err := CompileAssignment(ep(c.fields)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.fields, err, c.want)
		}
	}
}
