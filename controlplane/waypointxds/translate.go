package waypointxds

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	httpinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	httpopts "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"istio.io/api/annotation"
	"istio.io/api/label"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// TypeURLs are the four types, in the order a proxy applies them.
var TypeURLs = []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType}

// Names of the fixed resources.
const (
	ListenerName       = "waypoint"
	PassthroughCluster = "passthrough"
	// MetadataKey holds an endpoint's tunnel and identity.
	MetadataKey = "weft"
)

// Mesh holds the settings the translation depends on.
type Mesh struct {
	// TrustDomain of the mesh. Default "cluster.local".
	TrustDomain string
	// ClusterDomain is the DNS suffix of Service hostnames. Default
	// "cluster.local".
	ClusterDomain string
	// RootNamespace holds mesh-wide policies (which never bind to a
	// waypoint here: only targetRefs do).
	RootNamespace string
	// PathNormalization of every HTTP chain. Default PathBase.
	PathNormalization PathNormalization
	// Network is the mesh's network: a WorkloadEntry on another is not
	// reached. Default none.
	Network string
}

func (m Mesh) withDefaults() Mesh {
	if m.TrustDomain == "" {
		m.TrustDomain = "cluster.local"
	}
	if m.ClusterDomain == "" {
		m.ClusterDomain = "cluster.local"
	}
	if m.PathNormalization == "" {
		m.PathNormalization = PathBase
	}
	return m
}

// Stores are the informer caches the translation reads. EndpointSlices must
// carry the index ambient.IndexServiceName; Namespaces, GRPCRoutes, TCPRoutes and
// Policies may be nil.
type Stores struct {
	Services, EndpointSlices, Pods, Namespaces cache.Indexer
	HTTPRoutes, GRPCRoutes, Policies           cache.Indexer
	// TCPRoutes may be nil.
	TCPRoutes cache.Indexer
	// TLSRoutes attach to ingress Gateways' TLS listeners; nil: none.
	TLSRoutes cache.Indexer
	// ReferenceGrants (gateway.networking.k8s.io/v1) let a route use a
	// backend in another namespace; nil allows none.
	ReferenceGrants cache.Indexer
	// Secrets hold the certificates of ingress Gateways' HTTPS listeners
	// (only type kubernetes.io/tls is read); nil: none.
	Secrets cache.Indexer
	// ServiceEntries (networking.istio.io/v1) bound to the waypoint are
	// served like Services; nil: none.
	ServiceEntries cache.Indexer
	// WorkloadEntries (networking.istio.io/v1) are endpoints of the
	// Services that select them, as ztunnel sees them; nil: none.
	WorkloadEntries cache.Indexer
	// Gateways and GatewayClasses tell an ingress Gateway the waypoint a
	// Service with istio.io/ingress-use-waypoint is bound to; nil: none
	// (the Service's endpoints are reached directly).
	Gateways, GatewayClasses cache.Indexer
}

// Resources are one waypoint's resources: by type URL, then by name.
type Resources map[string]map[string]proto.Message

func (r Resources) add(typeURL, name string, m proto.Message) {
	if r[typeURL] == nil {
		r[typeURL] = map[string]proto.Message{}
	}
	r[typeURL][name] = m
}

// Count is the number of resources held.
func (r Resources) Count() int {
	n := 0
	for _, m := range r {
		n += len(m)
	}
	return n
}

// ClusterName is Istio's name of a Service port's cluster.
func ClusterName(host string, port int32) string {
	return "outbound|" + strconv.Itoa(int(port)) + "||" + host
}

// chainName names a Service port's filter chain and its RouteConfiguration.
func chainName(host string, port int32) string { return host + ":" + strconv.Itoa(int(port)) }

// builder accumulates one waypoint's resources.
type builder struct {
	mesh Mesh
	st   Stores
	wp   *ambient.Waypoint
	// ingress: wp stands for an ingress Gateway (BuildGateway).
	ingress bool
	res     Resources
	// clusters to emit, by name: the Service and its port.
	clusters map[string]clusterRef
	chains   []*listenerv3.FilterChain
	// inspect: some chain needs the detected protocol.
	inspect bool
	// needBlackHole: some tcp_proxy goes to BlackHoleCluster.
	needBlackHole bool
	// Notes are the problems found, for the log (not errors: the rest of
	// the configuration is still served); a route's problems are also in
	// routes, for its status.
	notes []string
	noted map[string]bool // notes already taken, each kept once
	// denied is the "<kind> <namespace>" pairs already noted as not admitted.
	denied map[string]bool
	// routes are what translating each attached route found.
	routes map[RouteKey]*routeReport
	// entries are the Service views of ServiceEntry hosts (boundEntries).
	entries map[*corev1.Service]entryRef
}

type clusterRef struct {
	svc  *corev1.Service
	port corev1.ServicePort
}

// Build computes the resources of one waypoint, and reports the problems
// found and what became of the routes it translated (see Outcomes).
func Build(mesh Mesh, wp *ambient.Waypoint, st Stores) (Resources, Report) {
	b := &builder{mesh: mesh.withDefaults(), st: st, wp: wp, res: Resources{}, clusters: map[string]clusterRef{}}
	services := append(b.boundServices(), b.boundEntries()...)
	policies := b.policies()
	for _, svc := range services {
		b.service(svc, policies)
	}
	if wp.For == apinames.WaypointForWorkload || wp.For == apinames.WaypointForAll {
		b.workloads(policies)
	}
	for _, name := range sortedKeys(b.clusters) {
		b.cluster(name, b.clusters[name])
	}
	if b.needBlackHole {
		b.blackHoleCluster()
	}
	b.res.add(resource.ClusterType, PassthroughCluster, &clusterv3.Cluster{
		Name:                 PassthroughCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST},
		LbPolicy:             clusterv3.Cluster_CLUSTER_PROVIDED,
		ConnectTimeout:       durationpb.New(10 * time.Second),
	})
	l := &listenerv3.Listener{Name: ListenerName, FilterChains: b.chains}
	if b.inspect {
		l.ListenerFilters = []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.http_inspector",
			ConfigType: &listenerv3.ListenerFilter_TypedConfig{TypedConfig: mustAny(&httpinspector.HttpInspector{})}}}
	}
	b.res.add(resource.ListenerType, ListenerName, l)
	return b.res, Report{Notes: b.notes, routes: b.routes}
}

// note records a problem once (a Gateway's policy is translated for every
// Service).
func (b *builder) note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	if b.noted[n] {
		return
	}
	if b.noted == nil {
		b.noted = map[string]bool{}
	}
	b.noted[n] = true
	b.notes = append(b.notes, n)
}

func (b *builder) serves(kind string) bool {
	return b.wp.For == apinames.WaypointForAll || b.wp.For == kind
}

func nsLabels(st cache.Indexer, ns string) map[string]string {
	if n := get[corev1.Namespace](st, ns); n != nil {
		return n.Labels
	}
	return nil
}

// bound reports whether an object of namespace ns with labels is bound to
// the waypoint for traffic of kind: it asks for it and the binding rule
// (ambient.Check) lets it. A binding the waypoint's owner does not admit is
// noted.
func (b *builder) bound(ns string, labels map[string]string, kind, what string) bool {
	nsl := nsLabels(b.st.Namespaces, ns)
	bind := ambient.BindingFor(ns, labels, nsl)
	if bind.Key != b.wp.Key() {
		return false
	}
	r := ambient.Check(bind, b.wp, kind, ns, nsl)
	if r != nil && r.Reason == ambient.ReasonAttachmentDenied && !b.denied[what+" "+ns] {
		if b.denied == nil {
			b.denied = map[string]bool{}
		}
		b.denied[what+" "+ns] = true
		b.note("%ss of namespace %s ask for this waypoint, whose allowedRoutes do not admit that namespace", what, ns)
	}
	return r == nil
}

// boundServices lists the Services bound to the waypoint, sorted by key.
func (b *builder) boundServices() []*corev1.Service {
	if !b.serves(apinames.WaypointForService) || b.st.Services == nil {
		return nil
	}
	var out []*corev1.Service
	for _, o := range b.st.Services.List() {
		svc := o.(*corev1.Service)
		if svc.Spec.Type == corev1.ServiceTypeExternalName || svc.Labels[label.IoK8sNetworkingGatewayGatewayName.Name] != "" {
			continue
		}
		if b.bound(svc.Namespace, svc.Labels, apinames.WaypointForService, "Service") {
			out = append(out, svc)
		}
	}
	sort.Slice(out, func(i, j int) bool { return keyOf(out[i]) < keyOf(out[j]) })
	return out
}

func serviceIPs(svc *corev1.Service) []*corev3.CidrRange {
	var out []*corev3.CidrRange
	for _, a := range ambient.ClusterIPs(svc) {
		out = append(out, &corev3.CidrRange{AddressPrefix: a.String(), PrefixLen: wrapperspb.UInt32(uint32(a.BitLen()))})
	}
	return out
}

// Kinds of Service port, by what the waypoint does with its streams.
const (
	portDetect = iota // unknown protocol: HTTP chain for HTTP, TCP chain for the rest
	portHTTP          // HTTP only: anything else gets 400
	portTCP           // TCP only: relayed, never parsed
)

// portKind follows Istio's waypoint: a port whose protocol (appProtocol,
// else the name's prefix) says HTTP, HTTP/2 or gRPC gets only an HTTP
// chain, one that says TCP, TLS or another protocol Istio relays as opaque
// bytes only a TCP chain, and any other has its protocol detected from the
// first bytes of each stream.
func portKind(p corev1.ServicePort) int {
	switch ambient.AppProtocol(p) {
	case workloadpb.AppProtocol_HTTP11, workloadpb.AppProtocol_HTTP2, workloadpb.AppProtocol_GRPC:
		return portHTTP
	case workloadpb.AppProtocol_TCP, workloadpb.AppProtocol_TLS:
		return portTCP
	}
	proto, _, _ := strings.Cut(strings.ToLower(p.Name), "-")
	if p.AppProtocol != nil {
		proto = strings.ToLower(*p.AppProtocol)
	}
	switch proto {
	case "grpc-web":
		return portHTTP
	case "mongo", "mysql", "redis":
		return portTCP
	}
	return portDetect
}

// detected are the application protocols of the HTTP chain of a port whose
// protocol is detected (what Envoy's HTTP inspector reports).
var detected = []string{"http/1.0", "http/1.1", "h2c"}

// tcpChainSuffix names the TCP chain of a port whose protocol is detected.
const tcpChainSuffix = "/tcp"

// service adds the chains, routes and clusters of one bound Service.
func (b *builder) service(svc *corev1.Service, policies []*securityv1.AuthorizationPolicy) {
	ips := serviceIPs(svc)
	if len(ips) == 0 {
		return // headless: its pods are reached as workloads
	}
	host := b.hostOf(svc)
	filters := b.rbacFilters(policies, svc)
	var netFilters []*listenerv3.Filter
	netDone := false
	for _, p := range svc.Spec.Ports {
		if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
			continue
		}
		name := chainName(host, p.Port)
		cname := ClusterName(host, p.Port)
		b.clusters[cname] = clusterRef{svc, p}
		match := func(protos []string) *listenerv3.FilterChainMatch {
			return &listenerv3.FilterChainMatch{PrefixRanges: ips, DestinationPort: wrapperspb.UInt32(uint32(p.Port)), ApplicationProtocols: protos}
		}
		kind := portKind(p)
		if kind != portHTTP && !netDone {
			netFilters, netDone = b.netRBACFilters(policies, svc), true
		}
		switch kind {
		case portTCP:
			b.chains = append(b.chains, tcpChain(name, match(nil), netFilters, b.tcpTarget(svc, p, cname)))
			continue
		case portDetect:
			b.chains = append(b.chains, tcpChain(name+tcpChainSuffix, match(nil), netFilters, b.tcpTarget(svc, p, cname)))
			b.inspect = true
		}
		protos := []string(nil)
		if kind == portDetect {
			protos = detected
		}
		b.chains = append(b.chains, &listenerv3.FilterChain{Name: name, FilterChainMatch: match(protos), Filters: []*listenerv3.Filter{b.httpManager(name, filters)}})
		b.res.add(resource.RouteType, name, b.routeConfig(name, svc, p, cname))
	}
}

// tcpChain is a chain of network RBAC filters and a tcp_proxy: the
// policies always run before the proxy picks a cluster.
func tcpChain(name string, m *listenerv3.FilterChainMatch, rbac []*listenerv3.Filter, proxy *listenerv3.Filter) *listenerv3.FilterChain {
	fs := append(append([]*listenerv3.Filter(nil), rbac...), proxy)
	return &listenerv3.FilterChain{Name: name, FilterChainMatch: m, Filters: fs}
}

// workloads adds a passthrough chain per pod bound to the waypoint.
func (b *builder) workloads(policies []*securityv1.AuthorizationPolicy) {
	if b.st.Pods == nil {
		return
	}
	pods := b.st.Pods.List()
	sort.Slice(pods, func(i, j int) bool { return keyOf(pods[i]) < keyOf(pods[j]) })
	filters := b.rbacFilters(policies, nil)
	var netFilters []*listenerv3.Filter
	netDone := false
	for _, o := range pods {
		p := o.(*corev1.Pod)
		if p.Labels[label.IoK8sNetworkingGatewayGatewayName.Name] != "" || p.Spec.HostNetwork {
			continue
		}
		if !b.bound(p.Namespace, p.Labels, apinames.WaypointForWorkload, "Pod") {
			continue
		}
		var ranges []*corev3.CidrRange
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil {
				ranges = append(ranges, &corev3.CidrRange{AddressPrefix: a.Unmap().String(), PrefixLen: wrapperspb.UInt32(uint32(a.Unmap().BitLen()))})
			}
		}
		if len(ranges) == 0 {
			continue
		}
		name := "workload/" + p.Namespace + "/" + p.Name
		if !netDone {
			netFilters, netDone = b.netRBACFilters(policies, nil), true
		}
		// A workload's ports are unknown: its streams are detected.
		b.chains = append(b.chains, tcpChain(name+tcpChainSuffix, &listenerv3.FilterChainMatch{PrefixRanges: ranges}, netFilters, tcpProxy(PassthroughCluster)))
		b.inspect = true
		b.chains = append(b.chains, &listenerv3.FilterChain{
			Name:             name,
			FilterChainMatch: &listenerv3.FilterChainMatch{PrefixRanges: ranges, ApplicationProtocols: detected},
			Filters: []*listenerv3.Filter{b.httpManagerInline(name, filters, &routev3.RouteConfiguration{
				Name: name,
				VirtualHosts: []*routev3.VirtualHost{{Name: name, Domains: []string{"*"}, Routes: []*routev3.Route{{
					Name:   "default",
					Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: PassthroughCluster}}},
				}}}},
			})},
		})
	}
}

func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("packing %T: %v", m, err)) // only for messages of linked types
	}
	return a
}

func tcpProxy(cluster string) *listenerv3.Filter {
	return tcpFilter(&tcpv3.TcpProxy{StatPrefix: cluster, ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: cluster}})
}

func tcpFilter(p *tcpv3.TcpProxy) *listenerv3.Filter {
	return &listenerv3.Filter{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(p)}}
}

func router() *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&routerv3.Router{})}}
}

func (b *builder) httpManager(routeName string, filters []*hcmv3.HttpFilter) *listenerv3.Filter {
	return b.hcmFilter(&hcmv3.HttpConnectionManager{
		StatPrefix:     routeName,
		CodecType:      hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: routeName}},
		HttpFilters:    append(append([]*hcmv3.HttpFilter(nil), filters...), corsFilter(), router()),
	})
}

func (b *builder) httpManagerInline(name string, filters []*hcmv3.HttpFilter, rc *routev3.RouteConfiguration) *listenerv3.Filter {
	return b.hcmFilter(&hcmv3.HttpConnectionManager{
		StatPrefix:     name,
		CodecType:      hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc},
		HttpFilters:    append(append([]*hcmv3.HttpFilter(nil), filters...), corsFilter(), router()),
	})
}

// hcmFilter wraps m, with the mesh's path normalization, as a listener
// filter.
func (b *builder) hcmFilter(m *hcmv3.HttpConnectionManager) *listenerv3.Filter {
	b.mesh.PathNormalization.apply(m)
	return &listenerv3.Filter{Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(m)}}
}

// http2Upstream reports whether a port speaks HTTP/2 to its endpoints.
func http2Upstream(p corev1.ServicePort) bool {
	switch ambient.AppProtocol(p) {
	case workloadpb.AppProtocol_HTTP2, workloadpb.AppProtocol_GRPC:
		return true
	}
	return false
}

// cluster adds a Service port's Cluster and its endpoints.
func (b *builder) cluster(name string, ref clusterRef) {
	c := &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			ResourceApiVersion:    corev3.ApiVersion_V3,
		}},
		LbPolicy:       clusterv3.Cluster_LEAST_REQUEST,
		ConnectTimeout: durationpb.New(10 * time.Second),
	}
	if http2Upstream(ref.port) {
		c.TypedExtensionProtocolOptions = map[string]*anypb.Any{
			"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": mustAny(&httpopts.HttpProtocolOptions{
				UpstreamProtocolOptions: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &httpopts.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
				}},
			}),
		}
	}
	if e, ok := b.entries[ref.svc]; ok {
		b.entryCluster(c, e, ref.port)
		return
	}
	b.res.add(resource.ClusterType, name, c)
	if wp := b.ingressWaypoint(ref.svc); wp != nil {
		// The waypoint serves the Service at its primary cluster IP.
		if ips := ambient.ClusterIPs(ref.svc); len(ips) > 0 {
			b.res.add(resource.EndpointType, name, b.waypointEndpoints(name, ref, wp, ips[0]))
			return
		}
		b.note("Service %s/%s: headless, so the gateway reaches its endpoints without its waypoint %s (a waypoint serves a Service at its cluster IP)",
			ref.svc.Namespace, ref.svc.Name, wp.Key())
	}
	b.res.add(resource.EndpointType, name, b.endpoints(name, ref))
}

// blackHoleCluster adds BlackHoleCluster: an EDS cluster whose
// assignment has no endpoints, so that the waypoint closes what goes to it.
func (b *builder) blackHoleCluster() {
	b.res.add(resource.ClusterType, BlackHoleCluster, &clusterv3.Cluster{
		Name:                 BlackHoleCluster,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			ResourceApiVersion:    corev3.ApiVersion_V3,
		}},
		ConnectTimeout: durationpb.New(10 * time.Second),
	})
	b.res.add(resource.EndpointType, BlackHoleCluster, &endpointv3.ClusterLoadAssignment{ClusterName: BlackHoleCluster})
}

// endpoints lists the endpoints of a Service port from its EndpointSlices.
func (b *builder) endpoints(name string, ref clusterRef) *endpointv3.ClusterLoadAssignment {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	if b.st.EndpointSlices == nil {
		return cla
	}
	objs, _ := b.st.EndpointSlices.ByIndex(ambient.IndexServiceName, keyOf(ref.svc))
	sort.Slice(objs, func(i, j int) bool { return keyOf(objs[i]) < keyOf(objs[j]) })
	var lbs []*endpointv3.LbEndpoint
	seen := map[string]bool{}
	for _, o := range objs {
		slice := o.(*discoveryv1.EndpointSlice)
		port, ok := slicePort(ref.port, slice)
		if !ok {
			continue
		}
		for _, ep := range slice.Endpoints {
			if ep.Conditions.Terminating != nil && *ep.Conditions.Terminating && (ep.Conditions.Serving == nil || !*ep.Conditions.Serving) {
				continue
			}
			healthy := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			var pod *corev1.Pod
			if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
				ns := ep.TargetRef.Namespace
				if ns == "" {
					ns = slice.Namespace
				}
				pod = get[corev1.Pod](b.st.Pods, ns+"/"+ep.TargetRef.Name)
			}
			for _, addr := range ep.Addresses {
				a, err := netip.ParseAddr(addr)
				if err != nil {
					continue
				}
				key := netip.AddrPortFrom(a.Unmap(), uint16(port)).String()
				if seen[key] {
					continue
				}
				seen[key] = true
				lbs = append(lbs, b.lbEndpoint(a.Unmap(), port, healthy, pod))
			}
		}
	}
	lbs = append(lbs, b.workloadEntryEndpoints(ref, seen)...)
	if len(lbs) > 0 {
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}
	}
	return cla
}

// workloadEntryEndpoints are the endpoints of a Service port among the
// WorkloadEntries the Service selects (of its namespace, by a selector
// that is not empty), at the port the entry maps it to, as ztunnel's
// Workloads carry them; seen are the addresses already listed.
func (b *builder) workloadEntryEndpoints(ref clusterRef, seen map[string]bool) []*endpointv3.LbEndpoint {
	if len(ref.svc.Spec.Selector) == 0 {
		return nil
	}
	var lbs []*endpointv3.LbEndpoint
	for _, e := range b.selectedEntries(ref.svc.Namespace, ref.svc.Spec.Selector) {
		for _, p := range ambient.WorkloadEntryPorts(&corev1.Service{Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{ref.port}}}, e.we.Spec.GetPorts()) {
			key := netip.AddrPortFrom(e.ip, uint16(p.TargetPort)).String()
			if seen[key] {
				continue
			}
			seen[key] = true
			lbs = append(lbs, b.weEndpoint(e.we, e.ip, p.TargetPort))
		}
	}
	return lbs
}

// selectedEntry is a WorkloadEntry a selector picked, at its address.
type selectedEntry struct {
	we *networkingv1.WorkloadEntry
	ip netip.Addr
}

// selectedEntries lists, sorted, the WorkloadEntries of ns that sel
// selects and that Weft reaches (ambient.WorkloadEntryAddress).
func (b *builder) selectedEntries(ns string, sel map[string]string) []selectedEntry {
	if b.st.WorkloadEntries == nil {
		return nil
	}
	objs := byNamespace(b.st.WorkloadEntries, ns)
	sort.Slice(objs, func(i, j int) bool { return keyOf(objs[i]) < keyOf(objs[j]) })
	var out []selectedEntry
	for _, o := range objs {
		we := o.(*networkingv1.WorkloadEntry)
		ip := ambient.WorkloadEntryAddress(we, b.mesh.Network)
		if ip.IsValid() && ambient.SelectorMatches(sel, ambient.WorkloadEntryLabels(we)) {
			out = append(out, selectedEntry{we, ip})
		}
	}
	return out
}

// weEndpoint is a WorkloadEntry's endpoint at ip and port, with its
// identity, over HBONE when it is annotated for redirection.
func (b *builder) weEndpoint(we *networkingv1.WorkloadEntry, ip netip.Addr, port uint32) *endpointv3.LbEndpoint {
	e := b.lbEndpoint(ip, int32(port), true, nil)
	fields := map[string]*structpb.Value{
		"workload":      structpb.NewStringValue(we.Name),
		"namespace":     structpb.NewStringValue(we.Namespace),
		"workload_name": structpb.NewStringValue(we.Name),
	}
	if sa := we.Spec.GetServiceAccount(); sa != "" {
		fields["identity"] = structpb.NewStringValue("spiffe://" + b.mesh.TrustDomain + "/ns/" + we.Namespace + "/sa/" + sa)
		if we.Annotations[annotation.AmbientRedirection.Name] == apinames.RedirectionEnabled {
			fields["tunnel"] = structpb.NewStringValue("HBONE")
		}
	}
	e.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataKey: {Fields: fields}}}
	return e
}

func (b *builder) lbEndpoint(a netip.Addr, port int32, healthy bool, pod *corev1.Pod) *endpointv3.LbEndpoint {
	e := &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
			Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: a.String(), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
			}},
		}}},
		HealthStatus: corev3.HealthStatus_HEALTHY,
	}
	if !healthy {
		e.HealthStatus = corev3.HealthStatus_UNHEALTHY
	}
	if pod == nil {
		return e
	}
	fields := map[string]*structpb.Value{
		"workload":      structpb.NewStringValue(pod.Name),
		"namespace":     structpb.NewStringValue(pod.Namespace),
		"workload_name": structpb.NewStringValue(ambient.WorkloadName(pod)),
	}
	// A pod without an identity (no service account, or a mirror pod) is
	// reached in plaintext: there is no peer identity to verify over HBONE.
	if sa := ambient.ServiceAccount(pod); sa != "" {
		fields["identity"] = structpb.NewStringValue("spiffe://" + b.mesh.TrustDomain + "/ns/" + pod.Namespace + "/sa/" + sa)
		if pod.Annotations[annotation.AmbientRedirection.Name] == apinames.RedirectionEnabled {
			fields["tunnel"] = structpb.NewStringValue("HBONE")
		}
	}
	e.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{MetadataKey: {Fields: fields}}}
	return e
}

// slicePort resolves a Service port's target port in an EndpointSlice (by
// port name), falling back to a numeric target port.
func slicePort(sp corev1.ServicePort, slice *discoveryv1.EndpointSlice) (int32, bool) {
	for _, p := range slice.Ports {
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		if name == sp.Name && p.Port != nil {
			return *p.Port, true
		}
	}
	if sp.TargetPort.IntVal != 0 {
		return sp.TargetPort.IntVal, true
	}
	if sp.TargetPort.StrVal == "" {
		return sp.Port, true
	}
	return 0, false
}

func get[T any](s cache.Indexer, key string) *T {
	if s == nil {
		return nil
	}
	obj, ok, err := s.GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	t, _ := obj.(*T)
	return t
}

func keyOf(obj any) string {
	k, _ := cache.MetaNamespaceKeyFunc(obj)
	return k
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// byNamespace lists the objects of a namespace.
func byNamespace(s cache.Indexer, ns string) []any {
	if s == nil {
		return nil
	}
	objs, err := s.ByIndex(cache.NamespaceIndex, ns)
	if err == nil {
		return objs
	}
	var out []any
	for _, o := range s.List() {
		if m, ok := o.(interface{ GetNamespace() string }); ok && m.GetNamespace() == ns {
			out = append(out, o)
		}
	}
	return out
}

// serviceKind reports whether a parent or backend reference names a core
// Service.
func serviceKind(group *gwv1.Group, kind *gwv1.Kind) bool {
	g, k := "", "Service"
	if group != nil {
		g = string(*group)
	}
	if kind != nil {
		k = string(*kind)
	}
	return (g == "" || g == "core") && k == "Service"
}
