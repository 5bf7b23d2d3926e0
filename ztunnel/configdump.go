package ztunnel

import (
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/ztunnel/inpod"
	"github.com/weftmesh/weft/ztunnel/state"
)

// configDump is /config_dump in the JSON shape of Istio's ztunnel, which
// istioctl ztunnel-config reads (workloads, services, policies,
// certificates, workloadState), plus Weft's xDS counters under xds.
type configDump struct {
	Workloads     []dumpWorkload               `json:"workloads"`
	Services      []dumpService                `json:"services"`
	Policies      []dumpPolicy                 `json:"policies"`
	Certificates  []dumpCertificates           `json:"certificates"`
	WorkloadState map[string]dumpWorkloadState `json:"workloadState"`
	XDS           any                          `json:"xds,omitempty"`
}

type dumpWorkload struct {
	UID                   string         `json:"uid"`
	WorkloadIPs           []string       `json:"workloadIps"`
	Waypoint              *dumpGateway   `json:"waypoint,omitempty"`
	NetworkGateway        *dumpGateway   `json:"networkGateway,omitempty"`
	Protocol              string         `json:"protocol"`
	Name                  string         `json:"name"`
	Namespace             string         `json:"namespace"`
	ServiceAccount        string         `json:"serviceAccount"`
	WorkloadName          string         `json:"workloadName"`
	WorkloadType          string         `json:"workloadType"`
	CanonicalName         string         `json:"canonicalName"`
	CanonicalRevision     string         `json:"canonicalRevision"`
	ClusterID             string         `json:"clusterId"`
	TrustDomain           string         `json:"trustDomain,omitempty"`
	Locality              *dumpLocality  `json:"locality,omitempty"`
	Node                  string         `json:"node"`
	Network               string         `json:"network,omitempty"`
	Status                string         `json:"status"`
	Hostname              string         `json:"hostname,omitempty"`
	Capacity              uint32         `json:"capacity"`
	NativeTunnel          bool           `json:"nativeTunnel,omitempty"`
	AuthorizationPolicies []string       `json:"authorizationPolicies,omitempty"`
	ApplicationTunnel     *dumpAppTunnel `json:"applicationTunnel,omitempty"`
}

type dumpAppTunnel struct {
	Protocol string  `json:"protocol"`
	Port     *uint32 `json:"port,omitempty"`
}

type dumpLocality struct {
	Region  string `json:"region,omitempty"`
	Zone    string `json:"zone,omitempty"`
	Subzone string `json:"subzone,omitempty"`
}

// dumpGateway names a waypoint or network gateway: "<network>/<ip>" or
// "<namespace>/<hostname>", as istioctl matches it against the services.
type dumpGateway struct {
	Destination   string `json:"destination"`
	HBONEMTLSPort uint32 `json:"hboneMtlsPort,omitempty"`
}

type dumpService struct {
	Name            string                   `json:"name"`
	Namespace       string                   `json:"namespace"`
	Hostname        string                   `json:"hostname"`
	VIPs            []string                 `json:"vips"`
	Ports           map[string]uint32        `json:"ports"`
	LoadBalancer    *dumpLoadBalancer        `json:"loadBalancer,omitempty"`
	Waypoint        *dumpGateway             `json:"waypoint,omitempty"`
	Endpoints       map[string]*dumpEndpoint `json:"endpoints"`
	SubjectAltNames []string                 `json:"subjectAltNames"`
	IPFamilies      string                   `json:"ipFamilies"`
	Canonical       bool                     `json:"canonical,omitempty"`
}

type dumpLoadBalancer struct {
	Mode               string   `json:"mode"`
	RoutingPreferences []string `json:"routingPreferences"`
	HealthPolicy       string   `json:"healthPolicy"`
}

type dumpEndpoint struct {
	WorkloadUID string            `json:"workloadUid"`
	Service     string            `json:"service"`
	Address     string            `json:"address,omitempty"`
	Port        map[string]uint32 `json:"port"`
}

type dumpPolicy struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Scope     string            `json:"scope"`
	Action    string            `json:"action"`
	DryRun    bool              `json:"dryRun,omitempty"`
	Rules     [][][]dumpMatches `json:"rules"`
}

type dumpMatches struct {
	Namespaces          []map[string]any `json:"namespaces,omitempty"`
	NotNamespaces       []map[string]any `json:"notNamespaces,omitempty"`
	Principals          []map[string]any `json:"principals,omitempty"`
	NotPrincipals       []map[string]any `json:"notPrincipals,omitempty"`
	SourceIPs           []string         `json:"sourceIps,omitempty"`
	NotSourceIPs        []string         `json:"notSourceIps,omitempty"`
	DestinationIPs      []string         `json:"destinationIps,omitempty"`
	NotDestinationIPs   []string         `json:"notDestinationIps,omitempty"`
	DestinationPorts    []uint32         `json:"destinationPorts,omitempty"`
	NotDestinationPorts []uint32         `json:"notDestinationPorts,omitempty"`
	ServiceAccounts     []dumpSAMatch    `json:"serviceAccounts,omitempty"`
	NotServiceAccounts  []dumpSAMatch    `json:"notServiceAccounts,omitempty"`
}

type dumpSAMatch struct {
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
}

type dumpCertificates struct {
	Identity  string     `json:"identity"`
	State     string     `json:"state"`
	CertChain []dumpCert `json:"certChain"`
	RootCerts []dumpCert `json:"rootCerts"`
}

type dumpCert struct {
	PEM            string `json:"pem"`
	SerialNumber   string `json:"serialNumber"`
	ValidFrom      string `json:"validFrom"`
	ExpirationTime string `json:"expirationTime"`
}

type dumpWorkloadState struct {
	State string           `json:"state"`
	Info  dumpWorkloadInfo `json:"info"`
}

type dumpWorkloadInfo struct {
	Name           string `json:"name"`
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
}

// newConfigDump renders the node's state: the store's resources, the
// identities held with their chains (nil while the first is fetched), and
// the pods enrolled.
func newConfigDump(d state.Dump, ids map[string][]*x509.Certificate, pods []inpod.PodInfo) configDump {
	out := configDump{
		Workloads: []dumpWorkload{}, Services: []dumpService{}, Policies: []dumpPolicy{}, Certificates: []dumpCertificates{},
		WorkloadState: map[string]dumpWorkloadState{},
	}
	services := map[string]*dumpService{}
	for _, s := range d.Services {
		ds := serviceView(s)
		out.Services = append(out.Services, ds)
		services[s.Namespace+"/"+s.Hostname] = &out.Services[len(out.Services)-1]
	}
	for _, w := range d.Workloads {
		out.Workloads = append(out.Workloads, workloadView(w))
		for key, pl := range w.Services {
			svc := services[key]
			if svc == nil {
				continue
			}
			ep := &dumpEndpoint{WorkloadUID: w.Uid, Service: key, Port: map[string]uint32{}}
			if len(w.Addresses) > 0 {
				ep.Address = netAddr(w.Network, w.Addresses[0])
			}
			for _, p := range pl.GetPorts() {
				ep.Port[strconv.FormatUint(uint64(p.ServicePort), 10)] = p.TargetPort
			}
			svc.Endpoints[w.Uid+":"+ep.Address] = ep
		}
	}
	for _, p := range d.Policies {
		out.Policies = append(out.Policies, policyView(p))
	}
	names := make([]string, 0, len(ids))
	for id := range ids {
		names = append(names, id)
	}
	sort.Strings(names)
	for _, id := range names {
		c := dumpCertificates{Identity: id, State: "Initializing", CertChain: []dumpCert{}, RootCerts: []dumpCert{}}
		if chain := ids[id]; len(chain) > 0 {
			c.State = "Available"
			for _, cert := range chain {
				c.CertChain = append(c.CertChain, certView(cert))
			}
		}
		out.Certificates = append(out.Certificates, c)
	}
	for _, p := range pods {
		out.WorkloadState[p.UID] = dumpWorkloadState{State: "Up",
			Info: dumpWorkloadInfo{Name: p.Name, Namespace: p.Namespace, ServiceAccount: p.ServiceAccount}}
	}
	return out
}

func workloadView(w *workloadpb.Workload) dumpWorkload {
	dw := dumpWorkload{
		UID: w.Uid, WorkloadIPs: []string{}, Name: w.Name, Namespace: w.Namespace, ServiceAccount: w.ServiceAccount,
		WorkloadName: w.WorkloadName, WorkloadType: strings.ToLower(w.WorkloadType.String()),
		CanonicalName: w.CanonicalName, CanonicalRevision: w.CanonicalRevision, ClusterID: w.ClusterId,
		TrustDomain: w.TrustDomain, Node: w.Node, Network: w.Network, Hostname: w.Hostname,
		Capacity: 1, NativeTunnel: w.NativeTunnel, AuthorizationPolicies: w.AuthorizationPolicies,
		Waypoint: gatewayView(w.Waypoint), NetworkGateway: gatewayView(w.NetworkGateway),
		Protocol: "TCP", Status: "Healthy",
	}
	for _, a := range w.Addresses {
		if ip, ok := netip.AddrFromSlice(a); ok {
			dw.WorkloadIPs = append(dw.WorkloadIPs, ip.Unmap().String())
		}
	}
	switch w.TunnelProtocol {
	case workloadpb.TunnelProtocol_HBONE:
		dw.Protocol = "HBONE"
	case workloadpb.TunnelProtocol_LEGACY_ISTIO_MTLS:
		dw.Protocol = "LegacyIstioMtls"
	}
	if w.Status == workloadpb.WorkloadStatus_UNHEALTHY {
		dw.Status = "Unhealthy"
	}
	if w.Capacity != nil {
		dw.Capacity = w.Capacity.Value
	}
	if l := w.Locality; l != nil {
		dw.Locality = &dumpLocality{Region: l.Region, Zone: l.Zone, Subzone: l.Subzone}
	}
	if t := w.ApplicationTunnel; t != nil {
		dw.ApplicationTunnel = &dumpAppTunnel{Protocol: t.Protocol.String()}
		if t.Port != 0 {
			port := t.Port
			dw.ApplicationTunnel.Port = &port
		}
	}
	return dw
}

func serviceView(s *workloadpb.Service) dumpService {
	ds := dumpService{
		Name: s.Name, Namespace: s.Namespace, Hostname: s.Hostname, VIPs: []string{}, Ports: map[string]uint32{},
		Waypoint: gatewayView(s.Waypoint), Endpoints: map[string]*dumpEndpoint{},
		SubjectAltNames: append([]string{}, s.SubjectAltNames...), Canonical: s.Canonical,
	}
	for _, a := range s.Addresses {
		ds.VIPs = append(ds.VIPs, netAddr(a.Network, a.Address))
	}
	for _, p := range s.Ports {
		ds.Ports[strconv.FormatUint(uint64(p.ServicePort), 10)] = p.TargetPort
	}
	switch s.IpFamilies {
	case workloadpb.IPFamilies_IPV4_ONLY:
		ds.IPFamilies = "IPv4"
	case workloadpb.IPFamilies_IPV6_ONLY:
		ds.IPFamilies = "IPv6"
	case workloadpb.IPFamilies_DUAL:
		ds.IPFamilies = "Dual"
	default:
		ds.IPFamilies = "Automatic"
	}
	if lb := s.LoadBalancing; lb != nil {
		dl := &dumpLoadBalancer{Mode: titleEnum(lb.Mode.String()), HealthPolicy: titleEnum(lb.HealthPolicy.String()), RoutingPreferences: []string{}}
		for _, r := range lb.RoutingPreference {
			dl.RoutingPreferences = append(dl.RoutingPreferences, titleEnum(r.String()))
		}
		ds.LoadBalancer = dl
	}
	return ds
}

func gatewayView(g *workloadpb.GatewayAddress) *dumpGateway {
	if g == nil {
		return nil
	}
	dg := &dumpGateway{HBONEMTLSPort: g.HboneMtlsPort}
	switch d := g.Destination.(type) {
	case *workloadpb.GatewayAddress_Hostname:
		dg.Destination = d.Hostname.GetNamespace() + "/" + d.Hostname.GetHostname()
	case *workloadpb.GatewayAddress_Address:
		dg.Destination = netAddr(d.Address.GetNetwork(), d.Address.GetAddress())
	}
	return dg
}

func policyView(p *securitypb.Authorization) dumpPolicy {
	dp := dumpPolicy{Name: p.Name, Namespace: p.Namespace, DryRun: p.DryRun, Rules: [][][]dumpMatches{}}
	switch p.Scope {
	case securitypb.Scope_NAMESPACE:
		dp.Scope = "Namespace"
	case securitypb.Scope_WORKLOAD_SELECTOR:
		dp.Scope = "WorkloadSelector"
	default:
		dp.Scope = "Global"
	}
	dp.Action = "Allow"
	if p.Action == securitypb.Action_DENY {
		dp.Action = "Deny"
	}
	for _, r := range p.Rules {
		clauses := [][]dumpMatches{}
		for _, c := range r.Clauses {
			matches := []dumpMatches{}
			for _, m := range c.Matches {
				matches = append(matches, matchView(m))
			}
			clauses = append(clauses, matches)
		}
		dp.Rules = append(dp.Rules, clauses)
	}
	return dp
}

func matchView(m *securitypb.Match) dumpMatches {
	strs := func(ms []*securitypb.StringMatch) []map[string]any {
		var out []map[string]any
		for _, s := range ms {
			switch t := s.MatchType.(type) {
			case *securitypb.StringMatch_Exact:
				out = append(out, map[string]any{"Exact": t.Exact})
			case *securitypb.StringMatch_Prefix:
				out = append(out, map[string]any{"Prefix": t.Prefix})
			case *securitypb.StringMatch_Suffix:
				out = append(out, map[string]any{"Suffix": t.Suffix})
			case *securitypb.StringMatch_Presence:
				out = append(out, map[string]any{"Presence": struct{}{}})
			}
		}
		return out
	}
	cidrs := func(as []*securitypb.Address) []string {
		var out []string
		for _, a := range as {
			if ip, ok := netip.AddrFromSlice(a.Address); ok {
				out = append(out, netip.PrefixFrom(ip.Unmap(), int(a.Length)).String())
			}
		}
		return out
	}
	sas := func(ms []*securitypb.ServiceAccountMatch) []dumpSAMatch {
		var out []dumpSAMatch
		for _, s := range ms {
			out = append(out, dumpSAMatch{Namespace: s.Namespace, ServiceAccount: s.ServiceAccount})
		}
		return out
	}
	return dumpMatches{
		Namespaces: strs(m.Namespaces), NotNamespaces: strs(m.NotNamespaces),
		Principals: strs(m.Principals), NotPrincipals: strs(m.NotPrincipals),
		SourceIPs: cidrs(m.SourceIps), NotSourceIPs: cidrs(m.NotSourceIps),
		DestinationIPs: cidrs(m.DestinationIps), NotDestinationIPs: cidrs(m.NotDestinationIps),
		DestinationPorts: m.DestinationPorts, NotDestinationPorts: m.NotDestinationPorts,
		ServiceAccounts: sas(m.ServiceAccounts), NotServiceAccounts: sas(m.NotServiceAccounts),
	}
}

func certView(c *x509.Certificate) dumpCert {
	return dumpCert{
		PEM:            string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})),
		SerialNumber:   c.SerialNumber.String(),
		ValidFrom:      c.NotBefore.UTC().Format(time.RFC3339),
		ExpirationTime: c.NotAfter.UTC().Format(time.RFC3339),
	}
}

// netAddr is an address as Istio's ztunnel writes it: "<network>/<ip>".
func netAddr(network string, b []byte) string {
	ip, ok := netip.AddrFromSlice(b)
	if !ok {
		return network + "/"
	}
	return network + "/" + ip.Unmap().String()
}

// titleEnum turns a protobuf enum name (ONLY_HEALTHY) into the name
// Istio's ztunnel writes (OnlyHealthy).
func titleEnum(s string) string {
	var b strings.Builder
	for _, part := range strings.Split(strings.ToLower(s), "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}
