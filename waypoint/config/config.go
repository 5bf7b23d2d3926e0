// Package config compiles the waypoint's Envoy xDS resources (Listener,
// RouteConfiguration, Cluster, ClusterLoadAssignment; the subset of the
// waypoint xDS contract) into an immutable Snapshot. Anything outside the
// subset is an error naming the resource and the field, which the xDS
// client turns into a NACK.
//
// Listeners: the waypoint's HBONE listener (`waypoint`, no address), and
// the listeners with an address an ingress gateway listens on itself, with
// their TLS chains and certificates (gateway.go).
//
// Cluster types: EDS (endpoints from ClusterLoadAssignments), ORIGINAL_DST
// (the passthrough cluster), and STRICT_DNS and LOGICAL_DNS with an inline
// load_assignment of host names or IPs, which the Store resolves while it
// runs (dns.go) and publishes as the cluster's Assignment.
package config

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	rbacfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	httpinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	httpopts "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/weftmesh/weft/waypoint/internal/pbcheck"
	"github.com/weftmesh/weft/waypoint/rbac"
	"github.com/weftmesh/weft/waypoint/route"
	"github.com/weftmesh/weft/waypoint/urlpath"
)

// PassthroughCluster is the ORIGINAL_DST cluster name.
const PassthroughCluster = "passthrough"

// Application protocols the waypoint tells apart by sniffing the first
// bytes of a stream (what Envoy's HTTP inspector reports).
const (
	ProtoHTTP10 = "http/1.0"
	ProtoHTTP11 = "http/1.1"
	ProtoH2C    = "h2c"
)

// Chain is a compiled filter chain.
type Chain struct {
	Name     string
	Prefixes []netip.Prefix
	Port     uint32 // 0: any
	// AppProtocols is filter_chain_match.application_protocols: the chain
	// takes only streams detected as one of them. Empty: any stream its
	// address and port select that no chain listing the detected protocol
	// takes. HTTP/1.0 and HTTP/1.1 are listed together or not at all.
	AppProtocols []string
	// Exactly one of HTTP, TCPCluster or TCPWeighted.
	HTTP       *HTTP
	TCPCluster string
	// TCPWeighted is tcp_proxy's weighted_clusters: each connection goes to
	// one cluster, picked by weight (PickTCP). Weights are at least one in
	// total; a cluster of weight 0 is never picked.
	TCPWeighted []WeightedCluster
	// NetRBAC are the network RBAC filters before tcp_proxy, in order.
	NetRBAC []*rbac.Filter
	// NetShadowRBAC are those filters' shadow rules (dry-run policies):
	// evaluated and recorded, never enforced.
	NetShadowRBAC []*rbac.Filter
	// ServerNames is filter_chain_match.server_names, lower-cased: exact
	// names and `*.` wildcards (addressed listeners with the TLS inspector
	// only; see gateway.go).
	ServerNames []string
	// TLS is the chain's TLS transport socket: TLS ends here. nil on a
	// TLS listener: the connection passes through as it came.
	TLS *TLS
}

// WeightedCluster is one cluster of tcp_proxy's weighted_clusters.
type WeightedCluster struct {
	Name   string
	Weight uint32
}

// TCP reports whether the chain relays streams (tcp_proxy) rather than
// parsing them as HTTP.
func (c *Chain) TCP() bool { return c.TCPCluster != "" || len(c.TCPWeighted) > 0 }

// PickTCP names the cluster a new stream of a TCP chain goes to: the
// chain's cluster, or one of its weighted clusters, each with the chance
// of its weight in the total. n returns a uniform number in [0, max)
// (math/rand/v2.Uint64N).
func (c *Chain) PickTCP(n func(max uint64) uint64) string {
	if len(c.TCPWeighted) == 0 {
		return c.TCPCluster
	}
	var total uint64
	for _, w := range c.TCPWeighted {
		total += uint64(w.Weight)
	}
	x := n(total)
	for _, w := range c.TCPWeighted {
		if x < uint64(w.Weight) {
			return w.Name
		}
		x -= uint64(w.Weight)
	}
	return c.TCPWeighted[len(c.TCPWeighted)-1].Name // not reached with n in range
}

// Takes reports whether the chain lists proto in its application
// protocols.
func (c *Chain) Takes(proto string) bool {
	for _, p := range c.AppProtocols {
		if p == proto {
			return true
		}
	}
	return false
}

// HTTP is a compiled http_connection_manager.
type HTTP struct {
	RouteName string       // rds
	Inline    *route.Table // route_config inline
	RBAC      []*rbac.Filter
	// ShadowRBAC are the RBAC filters' shadow rules (dry-run policies), in
	// filter order: evaluated and recorded, never enforced.
	ShadowRBAC []*rbac.Filter
	// CORS: the chain has the CORS filter, so that routes' CORS policies
	// apply. It follows the RBAC filters (Istio's order): a preflight is
	// authorized as the OPTIONS request it is.
	CORS           bool
	RequestTimeout time.Duration
	IdleTimeout    time.Duration
	// Path is how request paths are normalized before policy and routing
	// (normalize_path, merge_slashes, path_with_escaped_slashes_action;
	// unset: none, as in Envoy).
	Path urlpath.Options
	// UseRemoteAddress (use_remote_address): the TCP peer's address is
	// appended to X-Forwarded-For and X-Forwarded-Proto is set to the
	// connection's scheme, replacing the client's.
	UseRemoteAddress bool
	// StripAnyHostPort (strip_any_host_port): the port is removed from
	// the request's host before policy and routing, and upstream.
	StripAnyHostPort bool
}

// Listener is a compiled Listener: the `waypoint` one, which takes HBONE
// streams, or one with an address, which a gateway listens on (gateway.go).
type Listener struct {
	Name string
	// Addr is address.socket_address; the zero value for the HBONE
	// listener, which has none.
	Addr   netip.AddrPort
	Chains []*Chain
	// Inspects: the listener has the HTTP inspector listener filter, which
	// chains with application_protocols need.
	Inspects bool
	// TLSInspector: the listener has envoy.filters.listener.tls_inspector;
	// its connections are TLS, their chains chosen by server name
	// (SelectSNI). Addressed listeners only.
	TLSInspector bool

	// The chains by server name, for SelectSNI (indexNames).
	exactNames map[string]*Chain // a listed name: its chain
	wildNames  map[string]*Chain // ".example.com" for a listed "*.example.com": its chain
	noNames    *Chain            // the first chain listing no names
}

// LB policy.
const (
	RoundRobin = iota
	LeastRequest
)

// Cluster is a compiled Cluster.
type Cluster struct {
	Name                                                string
	Passthrough                                         bool
	LB                                                  int
	ConnectTimeout                                      time.Duration
	MaxConnections, MaxPending, MaxRequests, MaxRetries int
	HTTP2                                               bool
	// DNS is set for a STRICT_DNS or LOGICAL_DNS cluster: its endpoints
	// come from resolving names (dns.go), not from EDS.
	DNS *DNS
}

// Endpoint is one upstream endpoint.
type Endpoint struct {
	Addr         netip.AddrPort
	Healthy      bool
	HBONE        bool
	Identity     string
	Workload     string
	Namespace    string
	WorkloadName string
	// Authority, when valid, is the CONNECT target of an HBONE endpoint
	// that relays for another destination (a waypoint an ingress gateway
	// sends a Service's traffic through): the stream asks Addr, the
	// relay's HBONE address, for Authority. Otherwise the stream asks for
	// Addr itself at the endpoint's HBONE port.
	Authority netip.AddrPort
}

// Assignment is a compiled ClusterLoadAssignment.
type Assignment struct {
	Name      string
	Endpoints []Endpoint
}

// The fields the waypoint supports in each message; Fields checks the names
// against the descriptors when the package loads.
var (
	listenerFields       = pbcheck.Fields[*listenerv3.Listener]("name", "address", "filter_chains", "stat_prefix", "listener_filters")
	listenerFilterFields = pbcheck.Fields[*listenerv3.ListenerFilter]("name", "typed_config")
	httpInspectorFields  = pbcheck.Fields[*httpinspector.HttpInspector]()
	filterChainFields    = pbcheck.Fields[*listenerv3.FilterChain]("name", "filter_chain_match", "filters", "transport_socket")
	chainMatchFields     = pbcheck.Fields[*listenerv3.FilterChainMatch]("prefix_ranges", "destination_port", "application_protocols", "server_names")
	filterFields         = pbcheck.Fields[*listenerv3.Filter]("name", "typed_config")
	netRBACFields        = pbcheck.Fields[*netrbac.RBAC]("rules", "stat_prefix", "shadow_rules", "shadow_rules_stat_prefix")
	tcpProxyFields       = pbcheck.Fields[*tcpv3.TcpProxy]("cluster", "weighted_clusters", "stat_prefix")
	tcpWeightedFields    = pbcheck.Fields[*tcpv3.TcpProxy_WeightedCluster]("clusters")
	tcpClusterWFields    = pbcheck.Fields[*tcpv3.TcpProxy_WeightedCluster_ClusterWeight]("name", "weight")
	hcmFields            = pbcheck.Fields[*hcmv3.HttpConnectionManager]("codec_type", "stat_prefix", "rds", "route_config", "http_filters", "stream_idle_timeout", "request_timeout",
		"normalize_path", "merge_slashes", "path_with_escaped_slashes_action", "use_remote_address", "strip_any_host_port")
	rdsFields             = pbcheck.Fields[*hcmv3.Rds]("route_config_name", "config_source")
	httpFilterFields      = pbcheck.Fields[*hcmv3.HttpFilter]("name", "typed_config")
	httpRBACFields        = pbcheck.Fields[*rbacfilter.RBAC]("rules", "shadow_rules", "shadow_rules_stat_prefix")
	routerFields          = pbcheck.Fields[*routerv3.Router]()
	corsFields            = pbcheck.Fields[*corsv3.Cors]()
	clusterFields         = pbcheck.Fields[*clusterv3.Cluster]("name", "type", "eds_cluster_config", "lb_policy", "connect_timeout", "circuit_breakers", "typed_extension_protocol_options", "alt_stat_name", "load_assignment", "dns_refresh_rate", "dns_lookup_family")
	breakersFields        = pbcheck.Fields[*clusterv3.CircuitBreakers]("thresholds")
	thresholdsFields      = pbcheck.Fields[*clusterv3.CircuitBreakers_Thresholds]("priority", "max_connections", "max_pending_requests", "max_requests", "max_retries")
	protocolOptionsFields = pbcheck.Fields[*httpopts.HttpProtocolOptions]("explicit_http_config")
	assignmentFields      = pbcheck.Fields[*endpointv3.ClusterLoadAssignment]("cluster_name", "endpoints")
	localityFields        = pbcheck.Fields[*endpointv3.LocalityLbEndpoints]("lb_endpoints", "locality")
	lbEndpointFields      = pbcheck.Fields[*endpointv3.LbEndpoint]("endpoint", "health_status", "metadata", "load_balancing_weight")
)

// CompileListener compiles a Listener: the waypoint's HBONE listener,
// without an address, or one a gateway listens on, with one.
func CompileListener(l *listenerv3.Listener) (*Listener, error) {
	where := fmt.Sprintf("listener %q", l.GetName())
	if err := listenerFields.Check(l, where); err != nil {
		return nil, err
	}
	out := &Listener{Name: l.GetName()}
	if l.GetAddress() != nil {
		a, err := compileAddress(l.GetAddress(), where)
		if err != nil {
			return nil, err
		}
		out.Addr = a
	}
	for i, lf := range l.GetListenerFilters() {
		w := fmt.Sprintf("%s: listener_filters[%d] (%s)", where, i, lf.GetName())
		if err := listenerFilterFields.Check(lf, w); err != nil {
			return nil, err
		}
		if lf.GetTypedConfig() == nil {
			return nil, fmt.Errorf("%s.typed_config is required", w)
		}
		msg, err := unmarshalTyped(lf.GetTypedConfig(), w)
		if err != nil {
			return nil, err
		}
		switch m := msg.(type) {
		case *httpinspector.HttpInspector:
			if err := httpInspectorFields.Check(m, w); err != nil {
				return nil, err
			}
			out.Inspects = true
		case *tlsinspector.TlsInspector:
			if !out.Addr.IsValid() {
				return nil, fmt.Errorf("%s: the TLS inspector is supported on a listener with an address only", w)
			}
			if err := tlsInspectorFields.Check(m, w); err != nil {
				return nil, err
			}
			out.TLSInspector = true
		default:
			return nil, fmt.Errorf("%s.typed_config %s is not supported (the HTTP or TLS inspector only)", w, lf.GetTypedConfig().GetTypeUrl())
		}
	}
	for i, fc := range l.GetFilterChains() {
		w := fmt.Sprintf("%s: filter_chains[%d]", where, i)
		if fc.GetName() != "" {
			w = fmt.Sprintf("%s: filter_chain %q", where, fc.GetName())
		}
		if err := filterChainFields.Check(fc, w); err != nil {
			return nil, err
		}
		c := &Chain{Name: fc.GetName()}
		m := fc.GetFilterChainMatch()
		if err := chainMatchFields.Check(m, w+".filter_chain_match"); err != nil {
			return nil, err
		}
		protos, err := appProtocols(m.GetApplicationProtocols(), out.Inspects, w+".filter_chain_match.application_protocols")
		if err != nil {
			return nil, err
		}
		c.AppProtocols = protos
		for j, pr := range m.GetPrefixRanges() {
			p, err := prefix(pr, fmt.Sprintf("%s.filter_chain_match.prefix_ranges[%d]", w, j))
			if err != nil {
				return nil, err
			}
			c.Prefixes = append(c.Prefixes, p)
		}
		c.Port = m.GetDestinationPort().GetValue()
		if c.Port > 65535 {
			return nil, fmt.Errorf("%s.filter_chain_match.destination_port %d is not a port", w, c.Port)
		}
		if (len(m.GetServerNames()) > 0 || fc.GetTransportSocket() != nil) && !out.TLSInspector {
			return nil, fmt.Errorf("%s: server_names and transport_socket need the listener filter envoy.filters.listener.tls_inspector on a listener with an address", w)
		}
		if c.ServerNames, err = compileServerNames(m.GetServerNames(), w+".filter_chain_match.server_names"); err != nil {
			return nil, err
		}
		if ts := fc.GetTransportSocket(); ts != nil {
			if c.TLS, err = compileTransportSocket(ts, w); err != nil {
				return nil, err
			}
		}
		if err := compileFilters(c, fc.GetFilters(), w); err != nil {
			return nil, err
		}
		out.Chains = append(out.Chains, c)
	}
	if out.Addr.IsValid() {
		if err := compileAddressed(l, out, where); err != nil {
			return nil, err
		}
		out.indexNames()
	}
	return out, nil
}

// appProtocols checks a chain's application_protocols: the names the
// waypoint detects, HTTP/1.0 with HTTP/1.1, and an HTTP inspector to set
// them.
func appProtocols(ps []string, inspects bool, where string) ([]string, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	if !inspects {
		return nil, fmt.Errorf("%s needs the listener filter envoy.filters.listener.http_inspector", where)
	}
	seen := map[string]bool{}
	for _, p := range ps {
		switch p {
		case ProtoHTTP10, ProtoHTTP11, ProtoH2C:
			seen[p] = true
		default:
			return nil, fmt.Errorf("%s: %q is not supported (%s, %s, %s)", where, p, ProtoHTTP10, ProtoHTTP11, ProtoH2C)
		}
	}
	if seen[ProtoHTTP10] != seen[ProtoHTTP11] {
		return nil, fmt.Errorf("%s must list %s and %s together: the waypoint tells them apart only after choosing the chain", where, ProtoHTTP10, ProtoHTTP11)
	}
	return append([]string(nil), ps...), nil
}

func prefix(pr *corev3.CidrRange, where string) (netip.Prefix, error) {
	a, err := netip.ParseAddr(pr.GetAddressPrefix())
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s.address_prefix %q: %v", where, pr.GetAddressPrefix(), err)
	}
	a = a.Unmap()
	bits := a.BitLen()
	if pr.GetPrefixLen() != nil {
		bits = int(pr.GetPrefixLen().GetValue())
	}
	if bits > a.BitLen() {
		return netip.Prefix{}, fmt.Errorf("%s.prefix_len %d is longer than the address", where, bits)
	}
	return netip.PrefixFrom(a, bits).Masked(), nil
}

func compileFilters(c *Chain, fs []*listenerv3.Filter, where string) error {
	for i, f := range fs {
		w := fmt.Sprintf("%s.filters[%d] (%s)", where, i, f.GetName())
		if err := filterFields.Check(f, w); err != nil {
			return err
		}
		if f.GetTypedConfig() == nil {
			return fmt.Errorf("%s.typed_config is required", w)
		}
		msg, err := unmarshalTyped(f.GetTypedConfig(), w)
		if err != nil {
			return err
		}
		last := i == len(fs)-1
		switch m := msg.(type) {
		case *netrbac.RBAC:
			if last {
				return fmt.Errorf("%s: network RBAC must precede tcp_proxy", w)
			}
			if err := netRBACFields.Check(m, w); err != nil {
				return err
			}
			r, shadow, err := compileRBAC(m.GetRules(), m.GetShadowRules(), true, w)
			if err != nil {
				return err
			}
			c.NetRBAC = appendFilter(c.NetRBAC, r)
			c.NetShadowRBAC = appendFilter(c.NetShadowRBAC, shadow)
		case *tcpv3.TcpProxy:
			if !last {
				return fmt.Errorf("%s: tcp_proxy must be the last filter", w)
			}
			if err := compileTCPProxy(c, m, w); err != nil {
				return err
			}
		case *hcmv3.HttpConnectionManager:
			if !last || len(c.NetRBAC) > 0 {
				return fmt.Errorf("%s: http_connection_manager must be the only filter", w)
			}
			h, err := compileHCM(m, w)
			if err != nil {
				return err
			}
			c.HTTP = h
		default:
			return fmt.Errorf("%s.typed_config %s is not supported", w, f.GetTypedConfig().GetTypeUrl())
		}
	}
	if c.HTTP == nil && !c.TCP() {
		return fmt.Errorf("%s.filters has no http_connection_manager or tcp_proxy", where)
	}
	return nil
}

// maxTCPWeight bounds a weighted_clusters total, as Envoy's route weights
// are bounded: large enough for any split, small enough to add up safely.
const maxTCPWeight = 1 << 32

// compileTCPProxy compiles a tcp_proxy: a cluster, or weighted_clusters
// with names and a total weight of at least one.
func compileTCPProxy(c *Chain, m *tcpv3.TcpProxy, w string) error {
	if err := tcpProxyFields.Check(m, w); err != nil {
		return err
	}
	wc := m.GetWeightedClusters()
	if wc == nil {
		if m.GetCluster() == "" {
			return fmt.Errorf("%s: cluster or weighted_clusters is required", w)
		}
		c.TCPCluster = m.GetCluster()
		return nil
	}
	w += ".weighted_clusters"
	if err := tcpWeightedFields.Check(wc, w); err != nil {
		return err
	}
	if len(wc.GetClusters()) == 0 {
		return fmt.Errorf("%s.clusters is empty: list at least one cluster", w)
	}
	var total uint64
	for i, cw := range wc.GetClusters() {
		cwhere := fmt.Sprintf("%s.clusters[%d]", w, i)
		if err := tcpClusterWFields.Check(cw, cwhere); err != nil {
			return err
		}
		if cw.GetName() == "" {
			return fmt.Errorf("%s.name is required", cwhere)
		}
		total += uint64(cw.GetWeight())
		c.TCPWeighted = append(c.TCPWeighted, WeightedCluster{Name: cw.GetName(), Weight: cw.GetWeight()})
	}
	switch {
	case total == 0:
		return fmt.Errorf("%s: the weights add up to 0, so no cluster could be picked; give one cluster a weight", w)
	case total > maxTCPWeight:
		return fmt.Errorf("%s: the weights add up to %d, more than %d", w, total, uint64(maxTCPWeight))
	}
	return nil
}

// unmarshalTyped decodes a filter's typed_config; a type this binary does
// not know is unsupported by definition.
func unmarshalTyped(a *anypb.Any, where string) (proto.Message, error) {
	msg, err := a.UnmarshalNew()
	if errors.Is(err, protoregistry.NotFound) {
		return nil, fmt.Errorf("%s.typed_config %s is not supported", where, a.GetTypeUrl())
	}
	if err != nil {
		return nil, fmt.Errorf("%s.typed_config %s: %v", where, a.GetTypeUrl(), err)
	}
	return msg, nil
}

func compileHCM(m *hcmv3.HttpConnectionManager, w string) (*HTTP, error) {
	if err := hcmFields.Check(m, w); err != nil {
		return nil, err
	}
	if m.GetCodecType() != hcmv3.HttpConnectionManager_AUTO {
		return nil, fmt.Errorf("%s.codec_type %v is not supported (AUTO only)", w, m.GetCodecType())
	}
	h := &HTTP{RequestTimeout: m.GetRequestTimeout().AsDuration(), IdleTimeout: m.GetStreamIdleTimeout().AsDuration(),
		UseRemoteAddress: m.GetUseRemoteAddress().GetValue(), StripAnyHostPort: m.GetStripAnyHostPort()}
	h.Path = urlpath.Options{RFC3986: m.GetNormalizePath().GetValue(), MergeSlashes: m.GetMergeSlashes()}
	switch a := m.GetPathWithEscapedSlashesAction(); a {
	case hcmv3.HttpConnectionManager_IMPLEMENTATION_SPECIFIC_DEFAULT, hcmv3.HttpConnectionManager_KEEP_UNCHANGED:
		h.Path.EscapedSlashes = urlpath.KeepEscapedSlashes
	case hcmv3.HttpConnectionManager_REJECT_REQUEST:
		h.Path.EscapedSlashes = urlpath.RejectEscapedSlashes
	case hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT:
		h.Path.EscapedSlashes = urlpath.UnescapeAndRedirect
	case hcmv3.HttpConnectionManager_UNESCAPE_AND_FORWARD:
		h.Path.EscapedSlashes = urlpath.UnescapeAndForward
	default:
		return nil, fmt.Errorf("%s.path_with_escaped_slashes_action %v is not supported", w, a)
	}
	switch rs := m.GetRouteSpecifier().(type) {
	case *hcmv3.HttpConnectionManager_Rds:
		if err := rdsFields.Check(rs.Rds, w+".rds"); err != nil {
			return nil, err
		}
		if rs.Rds.GetRouteConfigName() == "" {
			return nil, fmt.Errorf("%s.rds.route_config_name is required", w)
		}
		h.RouteName = rs.Rds.GetRouteConfigName()
	case *hcmv3.HttpConnectionManager_RouteConfig:
		t, err := route.Compile(rs.RouteConfig)
		if err != nil {
			return nil, fmt.Errorf("%s.route_config: %w", w, err)
		}
		h.Inline = t
	default:
		return nil, fmt.Errorf("%s has no rds or route_config", w)
	}
	fs := m.GetHttpFilters()
	for i, f := range fs {
		fw := fmt.Sprintf("%s.http_filters[%d] (%s)", w, i, f.GetName())
		if err := httpFilterFields.Check(f, fw); err != nil {
			return nil, err
		}
		if f.GetTypedConfig() == nil {
			return nil, fmt.Errorf("%s.typed_config is required", fw)
		}
		msg, err := unmarshalTyped(f.GetTypedConfig(), fw)
		if err != nil {
			return nil, err
		}
		switch fm := msg.(type) {
		case *rbacfilter.RBAC:
			if err := httpRBACFields.Check(fm, fw); err != nil {
				return nil, err
			}
			if h.CORS {
				return nil, fmt.Errorf("%s: an RBAC filter after the CORS filter is not supported (policies apply before CORS)", fw)
			}
			r, shadow, err := compileRBAC(fm.GetRules(), fm.GetShadowRules(), false, fw)
			if err != nil {
				return nil, err
			}
			h.RBAC = appendFilter(h.RBAC, r)
			h.ShadowRBAC = appendFilter(h.ShadowRBAC, shadow)
		case *corsv3.Cors:
			if err := corsFields.Check(fm, fw); err != nil {
				return nil, err
			}
			if f.GetName() != route.CORSFilter || h.CORS {
				return nil, fmt.Errorf("%s: the CORS filter must be named %s, once", fw, route.CORSFilter)
			}
			h.CORS = true
		case *routerv3.Router:
			if i != len(fs)-1 {
				return nil, fmt.Errorf("%s: the router must be the last HTTP filter", fw)
			}
			if err := routerFields.Check(fm, fw); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%s.typed_config %s is not supported", fw, f.GetTypedConfig().GetTypeUrl())
		}
	}
	if len(fs) == 0 || fs[len(fs)-1].GetName() != "envoy.filters.http.router" {
		return nil, fmt.Errorf("%s.http_filters must end with envoy.filters.http.router", w)
	}
	return h, nil
}

// CompileCluster compiles a Cluster.
func CompileCluster(c *clusterv3.Cluster) (*Cluster, error) {
	w := fmt.Sprintf("cluster %q", c.GetName())
	if err := clusterFields.Check(c, w); err != nil {
		return nil, err
	}
	out := &Cluster{Name: c.GetName(), ConnectTimeout: 10 * time.Second, MaxConnections: 1024, MaxPending: 1024, MaxRequests: 1024, MaxRetries: 1024}
	if c.GetConnectTimeout() != nil {
		out.ConnectTimeout = c.GetConnectTimeout().AsDuration()
	}
	if err := dnsOnlyFields(c, w); err != nil {
		return nil, err
	}
	switch c.GetType() {
	case clusterv3.Cluster_EDS:
	case clusterv3.Cluster_STRICT_DNS, clusterv3.Cluster_LOGICAL_DNS:
		d, err := compileDNS(c, w)
		if err != nil {
			return nil, err
		}
		out.DNS = d
	case clusterv3.Cluster_ORIGINAL_DST:
		if c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
			return nil, fmt.Errorf("%s.lb_policy must be CLUSTER_PROVIDED for ORIGINAL_DST", w)
		}
		out.Passthrough = true
	default:
		return nil, fmt.Errorf("%s.type %v is not supported", w, c.GetType())
	}
	if !out.Passthrough {
		switch c.GetLbPolicy() {
		case clusterv3.Cluster_ROUND_ROBIN:
		case clusterv3.Cluster_LEAST_REQUEST:
			out.LB = LeastRequest
		default:
			return nil, fmt.Errorf("%s.lb_policy %v is not supported", w, c.GetLbPolicy())
		}
	}
	if cb := c.GetCircuitBreakers(); cb != nil {
		if err := breakersFields.Check(cb, w+".circuit_breakers"); err != nil {
			return nil, err
		}
		if th := cb.GetThresholds(); len(th) > 0 {
			t := th[0]
			if err := thresholdsFields.Check(t, w+".circuit_breakers.thresholds[0]"); err != nil {
				return nil, err
			}
			set := func(dst *int, v interface{ GetValue() uint32 }, ok bool) {
				if ok {
					*dst = int(v.GetValue())
				}
			}
			set(&out.MaxConnections, t.GetMaxConnections(), t.GetMaxConnections() != nil)
			set(&out.MaxPending, t.GetMaxPendingRequests(), t.GetMaxPendingRequests() != nil)
			set(&out.MaxRequests, t.GetMaxRequests(), t.GetMaxRequests() != nil)
			set(&out.MaxRetries, t.GetMaxRetries(), t.GetMaxRetries() != nil)
		}
	}
	for k, v := range c.GetTypedExtensionProtocolOptions() {
		ow := fmt.Sprintf("%s.typed_extension_protocol_options[%q]", w, k)
		if k != "envoy.extensions.upstreams.http.v3.HttpProtocolOptions" {
			return nil, fmt.Errorf("%s is not supported", ow)
		}
		var o httpopts.HttpProtocolOptions
		if err := v.UnmarshalTo(&o); err != nil {
			return nil, fmt.Errorf("%s: %v", ow, err)
		}
		if err := protocolOptionsFields.Check(&o, ow); err != nil {
			return nil, err
		}
		if o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil {
			out.HTTP2 = true
		}
	}
	return out, nil
}

// CompileAssignment compiles a ClusterLoadAssignment.
func CompileAssignment(a *endpointv3.ClusterLoadAssignment) (*Assignment, error) {
	w := fmt.Sprintf("endpoints %q", a.GetClusterName())
	if err := assignmentFields.Check(a, w); err != nil {
		return nil, err
	}
	out := &Assignment{Name: a.GetClusterName()}
	for i, le := range a.GetEndpoints() {
		lw := fmt.Sprintf("%s.endpoints[%d]", w, i)
		if err := localityFields.Check(le, lw); err != nil {
			return nil, err
		}
		for j, e := range le.GetLbEndpoints() {
			ew := fmt.Sprintf("%s.lb_endpoints[%d]", lw, j)
			if err := lbEndpointFields.Check(e, ew); err != nil {
				return nil, err
			}
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			ip, err := netip.ParseAddr(sa.GetAddress())
			if err != nil {
				return nil, fmt.Errorf("%s.endpoint.address.socket_address.address %q: %v", ew, sa.GetAddress(), err)
			}
			if sa.GetPortValue() == 0 || sa.GetPortValue() > 65535 {
				return nil, fmt.Errorf("%s.endpoint.address.socket_address.port_value %d is not a port", ew, sa.GetPortValue())
			}
			ep := Endpoint{Addr: netip.AddrPortFrom(ip.Unmap(), uint16(sa.GetPortValue()))}
			switch e.GetHealthStatus() {
			case corev3.HealthStatus_HEALTHY, corev3.HealthStatus_UNKNOWN:
				ep.Healthy = true
			}
			if md := e.GetMetadata().GetFilterMetadata()["weft"]; md != nil {
				f := md.GetFields()
				ep.HBONE = f["tunnel"].GetStringValue() == "HBONE"
				ep.Identity = f["identity"].GetStringValue()
				ep.Workload = f["workload"].GetStringValue()
				ep.Namespace = f["namespace"].GetStringValue()
				ep.WorkloadName = f["workload_name"].GetStringValue()
				if ep.HBONE && ep.Identity == "" {
					return nil, fmt.Errorf("%s.metadata.filter_metadata.weft.identity is required for an HBONE endpoint", ew)
				}
				if v, ok := f["authority"]; ok {
					a, err := netip.ParseAddrPort(v.GetStringValue())
					switch {
					case err != nil || a.Port() == 0:
						return nil, fmt.Errorf("%s.metadata.filter_metadata.weft.authority %q is not an IP address and port", ew, v.GetStringValue())
					case !ep.HBONE:
						return nil, fmt.Errorf("%s.metadata.filter_metadata.weft.authority needs tunnel HBONE: only an HBONE endpoint relays", ew)
					}
					ep.Authority = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
				}
			}
			out.Endpoints = append(out.Endpoints, ep)
		}
	}
	return out, nil
}

// Snapshot is one consistent, immutable configuration.
type Snapshot struct {
	// Listener is the HBONE listener: the one named `waypoint`, else one
	// without an address; nil when there is none (a gateway).
	Listener *Listener
	// Listeners are all the Listeners by name, the HBONE one included.
	Listeners   map[string]*Listener
	Routes      map[string]*route.Table
	Clusters    map[string]*Cluster
	Assignments map[string]*Assignment
}

// Chains returns the chains a CONNECT target selects by address and port:
// those whose prefix ranges contain the IP, with the target's port if any
// has it, else those without a port (Envoy matches the destination port
// before the address). More than one differ by application protocol.
func (s *Snapshot) Chains(target netip.AddrPort) []*Chain {
	if s == nil || s.Listener == nil {
		return nil
	}
	var exact, anyPort []*Chain
	ip := target.Addr().Unmap()
	for _, c := range s.Listener.Chains {
		if !containsIP(c.Prefixes, ip) {
			continue
		}
		switch c.Port {
		case uint32(target.Port()):
			exact = append(exact, c)
		case 0:
			anyPort = append(anyPort, c)
		}
	}
	if len(exact) > 0 {
		return exact
	}
	return anyPort
}

func containsIP(ps []netip.Prefix, ip netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Select picks the chain for a CONNECT target whose stream was detected as
// proto (ProtoHTTP11, ProtoH2C, or "" for bytes that are not HTTP): the
// first of Chains that lists proto in its application protocols, else the
// first that lists none. nil when none matches.
func (s *Snapshot) Select(target netip.AddrPort, proto string) *Chain {
	return SelectFrom(s.Chains(target), proto)
}

// SelectFrom is Select over chains already found.
func SelectFrom(chains []*Chain, proto string) *Chain {
	var plain *Chain
	for _, c := range chains {
		if proto != "" && c.Takes(proto) {
			return c
		}
		if len(c.AppProtocols) == 0 && plain == nil {
			plain = c
		}
	}
	return plain
}

// Detects reports whether the choice among chains depends on the
// protocol detected in the stream's first bytes.
func Detects(chains []*Chain) bool {
	for _, c := range chains {
		if len(c.AppProtocols) > 0 {
			return true
		}
	}
	return false
}

// Chain picks the chain for a target when its stream is not told apart
// by protocol: Select(target, "").
func (s *Snapshot) Chain(target netip.AddrPort) *Chain {
	return s.Select(target, "")
}

// RouteTable returns the route table of an HTTP chain.
func (s *Snapshot) RouteTable(h *HTTP) *route.Table {
	if h.Inline != nil {
		return h.Inline
	}
	return s.Routes[h.RouteName]
}

var _ = routev3.RouteConfiguration{}

// compileRBAC compiles an RBAC filter's rules and shadow rules, either of
// which may be absent (nil), but not both. A filter without rules enforces
// nothing, as Envoy's; its shadow rules are only evaluated.
func compileRBAC(rules, shadow *rbacv3.RBAC, network bool, where string) (r, sh *rbac.Filter, err error) {
	if rules == nil && shadow == nil {
		return nil, nil, fmt.Errorf("%s.rules is required", where)
	}
	if rules != nil {
		if r, err = rbac.Compile(rules, network, where); err != nil {
			return nil, nil, err
		}
	}
	if shadow != nil {
		if sh, err = rbac.Compile(shadow, network, where+".shadow"); err != nil {
			return nil, nil, err
		}
	}
	return r, sh, nil
}

func appendFilter(fs []*rbac.Filter, f *rbac.Filter) []*rbac.Filter {
	if f == nil {
		return fs
	}
	return append(fs, f)
}
