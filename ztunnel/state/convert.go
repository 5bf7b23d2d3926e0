package state

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// Workload is a workload as ztunnel uses it: the xDS message, validated,
// with its addresses and identity decoded.
type Workload struct {
	UID       string
	Name      string
	Namespace string
	Node      string
	IPs       []netip.Addr
	// Hostname is what ztunnel resolves to reach a workload without IPs
	// (a ServiceEntry endpoint resolved by DNS).
	Hostname string
	Identity spiffe.Identity
	// HBONE reports that the workload's ztunnel terminates HBONE on 15008.
	HBONE bool
	// HostNetwork marks a shared address (a host-network pod, an
	// EndpointSlice endpoint that is not a pod): reached as a Service's
	// endpoint, never looked up by IP or name, so that it cannot stand in
	// for the pod that holds the same IP.
	HostNetwork bool
	Waypoint    *Gateway
	Healthy     bool
	Locality    Locality
	// Services maps "namespace/hostname" to service port -> target port.
	Services map[string]map[uint32]uint32
	// Policies are the "namespace/name" keys of workload-selector policies.
	Policies      []string
	CanonicalName string
	CanonicalRev  string
	WorkloadName  string
	WorkloadType  string
	ClusterID     string
	Proto         *workloadpb.Workload
}

// Locality is where a workload runs.
type Locality struct{ Region, Zone, Subzone string }

// Gateway is a waypoint reference: an address or a namespaced hostname, and
// the port that terminates HBONE.
type Gateway struct {
	Addr      netip.Addr
	Namespace string
	Hostname  string
	Port      uint16
}

// Service is a Kubernetes Service as ztunnel uses it.
type Service struct {
	Key       string // namespace/hostname
	Name      string
	Namespace string
	Hostname  string
	VIPs      []netip.Addr
	// Ports maps service port -> target port (0: the endpoint decides).
	Ports    map[uint32]uint32
	SANs     []spiffeid.ID
	Waypoint *Gateway
	// Passthrough is LoadBalancing mode PASSTHROUGH: go to the original destination.
	Passthrough bool
	// Preference is the routing preference, most important first.
	Preference []workloadpb.LoadBalancing_Scope
	// Strict means only endpoints matching every preference may be used.
	Strict   bool
	AllowAll bool // health policy ALLOW_ALL
	Proto    *workloadpb.Service
}

// Policy is an L4 authorization policy.
type Policy struct {
	Key       string // namespace/name
	Name      string
	Namespace string
	Scope     securitypb.Scope
	Deny      bool
	DryRun    bool
	Rules     [][][]*Match // rules -> clauses -> matches
	Proto     *securitypb.Authorization
}

// Match is one match group of a clause, decoded.
type Match struct {
	Namespaces, NotNamespaces         []*securitypb.StringMatch
	Principals, NotPrincipals         []*securitypb.StringMatch
	ServiceAccounts, NotSAs           []*securitypb.ServiceAccountMatch
	SourceIPs, NotSourceIPs           []netip.Prefix
	DestinationIPs, NotDestinationIPs []netip.Prefix
	Ports, NotPorts                   []uint32
}

func (m *Match) empty() bool {
	return len(m.Namespaces)+len(m.NotNamespaces)+len(m.Principals)+len(m.NotPrincipals)+
		len(m.ServiceAccounts)+len(m.NotSAs)+len(m.SourceIPs)+len(m.NotSourceIPs)+
		len(m.DestinationIPs)+len(m.NotDestinationIPs)+len(m.Ports)+len(m.NotPorts) == 0
}

// DefaultTrustDomain applies when a Workload leaves trust_domain empty, as
// istiod does for cluster.local.
var DefaultTrustDomain = spiffe.DefaultTrustDomain

// ConvertWorkload validates and decodes a Workload resource.
func ConvertWorkload(w *workloadpb.Workload) (*Workload, error) {
	if w == nil {
		return nil, errors.New("empty workload")
	}
	if w.GetUid() == "" {
		return nil, fmt.Errorf("workload %s/%s has no uid", w.GetNamespace(), w.GetName())
	}
	out := &Workload{
		UID:           w.GetUid(),
		Name:          w.GetName(),
		Namespace:     w.GetNamespace(),
		Node:          w.GetNode(),
		HBONE:         w.GetTunnelProtocol() == workloadpb.TunnelProtocol_HBONE,
		HostNetwork:   w.GetNetworkMode() == workloadpb.NetworkMode_HOST_NETWORK,
		Healthy:       w.GetStatus() == workloadpb.WorkloadStatus_HEALTHY,
		CanonicalName: w.GetCanonicalName(),
		CanonicalRev:  w.GetCanonicalRevision(),
		WorkloadName:  w.GetWorkloadName(),
		WorkloadType:  strings.ToLower(w.GetWorkloadType().String()),
		ClusterID:     w.GetClusterId(),
		Policies:      w.GetAuthorizationPolicies(),
		Proto:         w,
	}
	for i, raw := range w.GetAddresses() {
		ip, ok := netip.AddrFromSlice(raw)
		if !ok {
			return nil, fmt.Errorf("workload %s: address %d is %d bytes, want 4 or 16", w.GetUid(), i, len(raw))
		}
		out.IPs = append(out.IPs, ip.Unmap())
	}
	if h := w.GetHostname(); h != "" && len(out.IPs) == 0 {
		if _, ok := dns.IsDomainName(h); !ok || strings.ContainsAny(h, "*/ ") {
			return nil, fmt.Errorf("workload %s: hostname %q is not a DNS name", w.GetUid(), h)
		}
		out.Hostname = strings.ToLower(strings.TrimSuffix(h, "."))
	}
	if w.GetServiceAccount() != "" {
		td := DefaultTrustDomain
		if w.GetTrustDomain() != "" {
			var err error
			if td, err = spiffeid.TrustDomainFromString(w.GetTrustDomain()); err != nil {
				return nil, fmt.Errorf("workload %s: trust domain %q: %w", w.GetUid(), w.GetTrustDomain(), err)
			}
		}
		id, err := spiffe.NewIdentity(td, w.GetNamespace(), w.GetServiceAccount())
		if err != nil {
			return nil, fmt.Errorf("workload %s: identity: %w", w.GetUid(), err)
		}
		out.Identity = id
	}
	if w.GetWaypoint() != nil {
		gw, err := convertGateway(w.GetWaypoint())
		if err != nil {
			return nil, fmt.Errorf("workload %s: waypoint: %w", w.GetUid(), err)
		}
		out.Waypoint = gw
	}
	if l := w.GetLocality(); l != nil {
		out.Locality = Locality{Region: l.GetRegion(), Zone: l.GetZone(), Subzone: l.GetSubzone()}
	}
	if len(w.GetServices()) > 0 {
		out.Services = make(map[string]map[uint32]uint32, len(w.GetServices()))
		for key, pl := range w.GetServices() {
			if !strings.Contains(key, "/") {
				return nil, fmt.Errorf("workload %s: service key %q is not namespace/hostname", w.GetUid(), key)
			}
			ports := make(map[uint32]uint32, len(pl.GetPorts()))
			for _, p := range pl.GetPorts() {
				if p.GetServicePort() == 0 || p.GetServicePort() > 65535 || p.GetTargetPort() > 65535 {
					return nil, fmt.Errorf("workload %s: service %s: bad port %d->%d", w.GetUid(), key, p.GetServicePort(), p.GetTargetPort())
				}
				ports[p.GetServicePort()] = p.GetTargetPort()
			}
			out.Services[key] = ports
		}
	}
	return out, nil
}

func convertGateway(g *workloadpb.GatewayAddress) (*Gateway, error) {
	port := g.GetHboneMtlsPort()
	if port == 0 || port > 65535 {
		return nil, fmt.Errorf("hbone_mtls_port %d is not a port", port)
	}
	out := &Gateway{Port: uint16(port)}
	switch {
	case g.GetAddress() != nil:
		ip, ok := netip.AddrFromSlice(g.GetAddress().GetAddress())
		if !ok {
			return nil, fmt.Errorf("address is %d bytes, want 4 or 16", len(g.GetAddress().GetAddress()))
		}
		out.Addr = ip.Unmap()
	case g.GetHostname() != nil:
		out.Namespace, out.Hostname = g.GetHostname().GetNamespace(), g.GetHostname().GetHostname()
		if out.Hostname == "" {
			return nil, errors.New("hostname is empty")
		}
	default:
		return nil, errors.New("neither address nor hostname is set")
	}
	return out, nil
}

// ConvertService validates and decodes a Service resource.
func ConvertService(s *workloadpb.Service) (*Service, error) {
	if s == nil {
		return nil, errors.New("empty service")
	}
	if s.GetHostname() == "" || s.GetNamespace() == "" {
		return nil, fmt.Errorf("service %q has no namespace or hostname", s.GetName())
	}
	out := &Service{
		Key:       s.GetNamespace() + "/" + s.GetHostname(),
		Name:      s.GetName(),
		Namespace: s.GetNamespace(),
		Hostname:  s.GetHostname(),
		Ports:     make(map[uint32]uint32, len(s.GetPorts())),
		Proto:     s,
	}
	for i, a := range s.GetAddresses() {
		ip, ok := netip.AddrFromSlice(a.GetAddress())
		if !ok {
			return nil, fmt.Errorf("service %s: address %d is %d bytes, want 4 or 16", out.Key, i, len(a.GetAddress()))
		}
		out.VIPs = append(out.VIPs, ip.Unmap())
	}
	for _, p := range s.GetPorts() {
		if p.GetServicePort() == 0 || p.GetServicePort() > 65535 || p.GetTargetPort() > 65535 {
			return nil, fmt.Errorf("service %s: bad port %d->%d", out.Key, p.GetServicePort(), p.GetTargetPort())
		}
		out.Ports[p.GetServicePort()] = p.GetTargetPort()
	}
	for _, san := range s.GetSubjectAltNames() {
		id, err := spiffeid.FromString(san)
		if err != nil {
			return nil, fmt.Errorf("service %s: subject alt name %q: %w", out.Key, san, err)
		}
		out.SANs = append(out.SANs, id)
	}
	if s.GetWaypoint() != nil {
		gw, err := convertGateway(s.GetWaypoint())
		if err != nil {
			return nil, fmt.Errorf("service %s: waypoint: %w", out.Key, err)
		}
		out.Waypoint = gw
	}
	if lb := s.GetLoadBalancing(); lb != nil {
		out.Passthrough = lb.GetMode() == workloadpb.LoadBalancing_PASSTHROUGH
		out.Strict = lb.GetMode() == workloadpb.LoadBalancing_STRICT
		out.Preference = lb.GetRoutingPreference()
		out.AllowAll = lb.GetHealthPolicy() == workloadpb.LoadBalancing_ALLOW_ALL
	}
	return out, nil
}

// ConvertPolicy validates and decodes an Authorization resource.
func ConvertPolicy(a *securitypb.Authorization) (*Policy, error) {
	if a == nil {
		return nil, errors.New("empty authorization")
	}
	if a.GetName() == "" {
		return nil, errors.New("authorization has no name")
	}
	out := &Policy{
		Key:       a.GetNamespace() + "/" + a.GetName(),
		Name:      a.GetName(),
		Namespace: a.GetNamespace(),
		Scope:     a.GetScope(),
		Deny:      a.GetAction() == securitypb.Action_DENY,
		DryRun:    a.GetDryRun(),
		Proto:     a,
	}
	if _, ok := securitypb.Scope_name[int32(a.GetScope())]; !ok {
		return nil, fmt.Errorf("authorization %s: unknown scope %d", out.Key, a.GetScope())
	}
	if _, ok := securitypb.Action_name[int32(a.GetAction())]; !ok {
		return nil, fmt.Errorf("authorization %s: unknown action %d", out.Key, a.GetAction())
	}
	for ri, r := range a.GetRules() {
		var clauses [][]*Match
		for ci, c := range r.GetClauses() {
			var ms []*Match
			for mi, m := range c.GetMatches() {
				cm, err := convertMatch(m)
				if err != nil {
					return nil, fmt.Errorf("authorization %s: rule %d clause %d match %d: %w", out.Key, ri, ci, mi, err)
				}
				ms = append(ms, cm)
			}
			clauses = append(clauses, ms)
		}
		out.Rules = append(out.Rules, clauses)
	}
	return out, nil
}

func convertMatch(m *securitypb.Match) (*Match, error) {
	out := &Match{
		Namespaces: m.GetNamespaces(), NotNamespaces: m.GetNotNamespaces(),
		Principals: m.GetPrincipals(), NotPrincipals: m.GetNotPrincipals(),
		ServiceAccounts: m.GetServiceAccounts(), NotSAs: m.GetNotServiceAccounts(),
		Ports: m.GetDestinationPorts(), NotPorts: m.GetNotDestinationPorts(),
	}
	for _, sm := range [][]*securitypb.StringMatch{out.Namespaces, out.NotNamespaces, out.Principals, out.NotPrincipals} {
		for _, s := range sm {
			if s.GetMatchType() == nil {
				return nil, errors.New("string match with no match type")
			}
		}
	}
	var err error
	if out.SourceIPs, err = prefixes(m.GetSourceIps()); err != nil {
		return nil, fmt.Errorf("source_ips: %w", err)
	}
	if out.NotSourceIPs, err = prefixes(m.GetNotSourceIps()); err != nil {
		return nil, fmt.Errorf("not_source_ips: %w", err)
	}
	if out.DestinationIPs, err = prefixes(m.GetDestinationIps()); err != nil {
		return nil, fmt.Errorf("destination_ips: %w", err)
	}
	if out.NotDestinationIPs, err = prefixes(m.GetNotDestinationIps()); err != nil {
		return nil, fmt.Errorf("not_destination_ips: %w", err)
	}
	return out, nil
}

func prefixes(as []*securitypb.Address) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, a := range as {
		ip, ok := netip.AddrFromSlice(a.GetAddress())
		if !ok {
			return nil, fmt.Errorf("address is %d bytes, want 4 or 16", len(a.GetAddress()))
		}
		ip = ip.Unmap()
		if int(a.GetLength()) > ip.BitLen() {
			return nil, fmt.Errorf("prefix length %d is longer than %d", a.GetLength(), ip.BitLen())
		}
		p, err := ip.Prefix(int(a.GetLength()))
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}
