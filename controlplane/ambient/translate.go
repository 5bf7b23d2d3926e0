package ambient

import (
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"istio.io/api/annotation"
	"istio.io/api/label"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

const labelPodTemplateHash = "pod-template-hash"

// Config holds the mesh settings the translation depends on.
type Config struct {
	// ClusterID names the cluster in workload uids. Default "Kubernetes".
	ClusterID string
	// TrustDomain is the mesh trust domain. Default "cluster.local"
	// (sent as an empty trust_domain).
	TrustDomain string
	// ClusterDomain is the DNS suffix of Service hostnames. Default
	// "cluster.local".
	ClusterDomain string
	// Network is the network of every workload and address. Default "".
	Network string
	// RootNamespace holds the mesh-wide policies. Required.
	RootNamespace string
}

func (c Config) withDefaults() Config {
	if c.ClusterID == "" {
		c.ClusterID = "Kubernetes"
	}
	if c.TrustDomain == "" {
		c.TrustDomain = "cluster.local"
	}
	if c.ClusterDomain == "" {
		c.ClusterDomain = "cluster.local"
	}
	return c
}

// Validate reports whether c can be used.
func (c Config) Validate() error {
	if c.RootNamespace == "" {
		return errors.New("no root namespace")
	}
	return nil
}

// PodUID is the xDS name of a pod's Workload.
func PodUID(clusterID, namespace, name string) string {
	return clusterID + "//Pod/" + namespace + "/" + name
}

// Hostname is a Service's DNS name.
func Hostname(name, namespace, clusterDomain string) string {
	return name + "." + namespace + ".svc." + clusterDomain
}

// ServiceKey is the xDS name of a Service, and its key in a Workload's
// services map: "<namespace>/<hostname>".
func ServiceKey(namespace, hostname string) string { return namespace + "/" + hostname }

// Waypoint is a Gateway of class istio-waypoint.
type Waypoint struct {
	Namespace, Name string
	// For is the traffic it serves: a value of istio.io/waypoint-for
	// (apinames.WaypointForService, ...).
	For string
	// Address is what ztunnel sends to; nil until the Gateway has a status
	// address, and then the waypoint is not used.
	Address *workloadpb.GatewayAddress
	// Attachment is the namespaces whose objects may bind to it.
	Attachment Attachment
}

// Key is "<namespace>/<name>".
func (w *Waypoint) Key() string { return w.Namespace + "/" + w.Name }

func (w *Waypoint) serves(kind string) bool {
	return w.For == apinames.WaypointForAll || w.For == kind
}

// NewWaypoint returns the waypoint a Gateway defines, or nil if it is not of
// the waypoint class, for a GatewayClass without labels.
func NewWaypoint(gw *gwv1.Gateway, network string) *Waypoint {
	return NewWaypointOfClass(gw, nil, network)
}

// NewWaypointOfClass returns the waypoint a Gateway defines, or nil if it is
// not of the waypoint class; class is its GatewayClass (nil if unknown),
// whose istio.io/waypoint-for applies when the Gateway has none.
func NewWaypointOfClass(gw *gwv1.Gateway, class *gwv1.GatewayClass, network string) *Waypoint {
	if gw == nil || string(gw.Spec.GatewayClassName) != apinames.WaypointClass {
		return nil
	}
	var classLabels map[string]string
	if class != nil {
		classLabels = class.Labels
	}
	w := &Waypoint{Namespace: gw.Namespace, Name: gw.Name, For: apinames.WaypointFor(gw.Labels, classLabels), Attachment: NewAttachment(gw)}
	var ip *workloadpb.GatewayAddress
	for _, a := range gw.Status.Addresses {
		switch {
		case a.Type != nil && *a.Type == gwv1.HostnameAddressType && a.Value != "":
			w.Address = &workloadpb.GatewayAddress{
				Destination:   &workloadpb.GatewayAddress_Hostname{Hostname: &workloadpb.NamespacedHostname{Namespace: gw.Namespace, Hostname: a.Value}},
				HboneMtlsPort: apinames.HBONEPort,
			}
			return w
		case ip == nil && (a.Type == nil || *a.Type == gwv1.IPAddressType):
			if addr, err := netip.ParseAddr(a.Value); err == nil {
				ip = &workloadpb.GatewayAddress{
					Destination:   &workloadpb.GatewayAddress_Address{Address: &workloadpb.NetworkAddress{Network: network, Address: addr.Unmap().AsSlice()}},
					HboneMtlsPort: apinames.HBONEPort,
				}
			}
		}
	}
	w.Address = ip
	return w
}

// Binding is the waypoint an object asks for through its labels.
type Binding struct {
	// Key is the waypoint's "<namespace>/<name>"; empty for none.
	Key string
	// Explicit is true when the object itself carries the label, false when
	// it inherits it from its namespace.
	Explicit bool
}

// BindingFor reads istio.io/use-waypoint(-namespace) from an object and its
// namespace. The object's own label wins, and "none" on the object opts out
// even when its namespace names a waypoint.
func BindingFor(objNamespace string, objLabels, nsLabels map[string]string) Binding {
	if name, ok := objLabels[label.IoIstioUseWaypoint.Name]; ok {
		if name == "" || name == apinames.WaypointForNone {
			return Binding{}
		}
		ns := objNamespace
		if v := objLabels[label.IoIstioUseWaypointNamespace.Name]; v != "" {
			ns = v
		}
		return Binding{Key: ns + "/" + name, Explicit: true}
	}
	if name := nsLabels[label.IoIstioUseWaypoint.Name]; name != "" && name != apinames.WaypointForNone {
		ns := objNamespace
		if v := nsLabels[label.IoIstioUseWaypointNamespace.Name]; v != "" {
			ns = v
		}
		return Binding{Key: ns + "/" + name}
	}
	return Binding{}
}

// resolveWaypoint returns the address for a binding, from an object of
// namespace ns, to a waypoint serving kind, or nil with the reason when it
// is not made.
func resolveWaypoint(b Binding, wp *Waypoint, kind, ns string, nsLabels map[string]string) (*workloadpb.GatewayAddress, *Refusal) {
	if r := Check(b, wp, kind, ns, nsLabels); r != nil || b.Key == "" {
		return nil, r
	}
	if wp.Address == nil {
		return nil, notReady(b.Key)
	}
	return wp.Address, nil
}

// PodInput is what a pod's Workload is built from.
type PodInput struct {
	Pod *corev1.Pod
	// Waypoint is the waypoint the pod is bound to, resolved; nil for none.
	Waypoint *Waypoint
	// Binding is the pod's waypoint binding (BindingFor).
	Binding Binding
	// NamespaceLabels are the labels of the pod's namespace, which the
	// waypoint's allowedRoutes may select.
	NamespaceLabels map[string]string
	// IsWaypoint is true for a waypoint's own pod: it never gets a waypoint.
	IsWaypoint bool
	// Services maps "<namespace>/<hostname>" to the ports the pod serves for
	// that Service (ServicePorts).
	Services map[string][]*workloadpb.Port
	// Policies are the resource names of the workload-selector policies
	// that select the pod.
	Policies []string
	// Locality is the locality of the pod's node (NodeLocality); nil for
	// none.
	Locality *workloadpb.Locality
}

// Workload builds a pod's Workload, or returns nil when the pod is not a
// workload yet or any more (no IP, or terminated). refused explains a
// waypoint binding that was not made.
func (c Config) Workload(in PodInput) (w *workloadpb.Workload, refused *Refusal) {
	c = c.withDefaults()
	p := in.Pod
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil, nil
	}
	addrs := podIPs(p)
	if len(addrs) == 0 {
		return nil, nil
	}
	w = &workloadpb.Workload{
		Uid:                   PodUID(c.ClusterID, p.Namespace, p.Name),
		Name:                  p.Name,
		Namespace:             p.Namespace,
		Addresses:             addrs,
		Network:               c.Network,
		ServiceAccount:        ServiceAccount(p),
		Node:                  p.Spec.NodeName,
		ClusterId:             c.ClusterID,
		WorkloadType:          workloadpb.WorkloadType_POD,
		WorkloadName:          WorkloadName(p),
		Status:                workloadpb.WorkloadStatus_HEALTHY,
		AuthorizationPolicies: slices.Clone(in.Policies),
	}
	if c.TrustDomain != "cluster.local" {
		w.TrustDomain = c.TrustDomain
	}
	if p.Annotations[annotation.AmbientRedirection.Name] == apinames.RedirectionEnabled {
		w.TunnelProtocol = workloadpb.TunnelProtocol_HBONE
	}
	if p.Spec.HostNetwork {
		w.NetworkMode = workloadpb.NetworkMode_HOST_NETWORK
	}
	if !PodReady(p) || p.DeletionTimestamp != nil {
		w.Status = workloadpb.WorkloadStatus_UNHEALTHY
	}
	w.CanonicalName, w.CanonicalRevision = canonical(p.Labels, w.WorkloadName)
	if in.Locality != nil {
		w.Locality = proto.Clone(in.Locality).(*workloadpb.Locality)
	}
	if !in.IsWaypoint {
		w.Waypoint, refused = resolveWaypoint(in.Binding, in.Waypoint, apinames.WaypointForWorkload, p.Namespace, in.NamespaceLabels)
	}
	if len(in.Services) > 0 {
		w.Services = make(map[string]*workloadpb.PortList, len(in.Services))
		for k, ports := range in.Services {
			w.Services[k] = &workloadpb.PortList{Ports: ports}
		}
	}
	return w, refused
}

// ServiceAccount is the service account whose identity a pod's workload
// has, or "" for none. A mirror pod (annotation kubernetes.io/config.mirror)
// has none: any node can create one in any namespace, and the API server
// forbids it a service account. An empty name is never read as "default";
// as istiod, the workload is published without an identity.
func ServiceAccount(p *corev1.Pod) string {
	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return ""
	}
	return p.Spec.ServiceAccountName
}

func podIPs(p *corev1.Pod) [][]byte {
	ips := p.Status.PodIPs
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: p.Status.PodIP}}
	}
	var out [][]byte
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			continue
		}
		out = append(out, a.Unmap().AsSlice())
	}
	return out
}

// PodReady reports whether a pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WorkloadName names the controller a pod belongs to: the Deployment for a
// pod of a ReplicaSet made by one (the ReplicaSet's name less its
// pod-template-hash suffix), the CronJob for a pod of a Job it made, else the
// owning controller, else the pod itself.
func WorkloadName(p *corev1.Pod) string {
	for _, ref := range p.OwnerReferences {
		if ref.Controller == nil || !*ref.Controller {
			continue
		}
		switch ref.Kind {
		case "ReplicaSet":
			if h := p.Labels[labelPodTemplateHash]; h != "" {
				if name, ok := strings.CutSuffix(ref.Name, "-"+h); ok {
					return name
				}
			}
		case "Job":
			// A CronJob names its Jobs <cronjob>-<scheduled time in minutes>.
			if i := strings.LastIndexByte(ref.Name, '-'); i > 0 && isDigits(ref.Name[i+1:]) && p.Labels["batch.kubernetes.io/cronjob-name"] == ref.Name[:i] {
				return ref.Name[:i]
			}
		}
		return ref.Name
	}
	return p.Name
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// canonical returns the canonical service name and revision of a workload,
// from Istio's labels, then the Kubernetes recommended ones, then app/version.
func canonical(labels map[string]string, workload string) (string, string) {
	name := firstLabel(labels, label.ServiceCanonicalName.Name, "app.kubernetes.io/name", "app")
	if name == "" {
		name = workload
	}
	rev := firstLabel(labels, label.ServiceCanonicalRevision.Name, "app.kubernetes.io/version", "version")
	if rev == "" {
		rev = "latest"
	}
	return name, rev
}

func firstLabel(labels map[string]string, keys ...string) string {
	for _, k := range keys {
		if v := labels[k]; v != "" {
			return v
		}
	}
	return ""
}

// ServiceInput is what a Service resource is built from.
type ServiceInput struct {
	Service  *corev1.Service
	Waypoint *Waypoint
	Binding  Binding
	// NamespaceLabels are the labels of the Service's namespace.
	NamespaceLabels map[string]string
	// IsWaypoint is true for a waypoint's own Service.
	IsWaypoint bool
}

// Service builds a Service resource, or nil for an ExternalName Service;
// refused explains a waypoint binding that was not made.
func (c Config) Service(in ServiceInput) (s *workloadpb.Service, refused *Refusal) {
	c = c.withDefaults()
	svc := in.Service
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, nil
	}
	s = &workloadpb.Service{
		Name:      svc.Name,
		Namespace: svc.Namespace,
		Hostname:  Hostname(svc.Name, svc.Namespace, c.ClusterDomain),
	}
	for _, a := range ClusterIPs(svc) {
		s.Addresses = append(s.Addresses, &workloadpb.NetworkAddress{Network: c.Network, Address: a.AsSlice()})
	}
	for _, p := range svc.Spec.Ports {
		port := &workloadpb.Port{ServicePort: uint32(p.Port), AppProtocol: AppProtocol(p)}
		if p.TargetPort.Type == intstr.Int {
			port.TargetPort = uint32(p.TargetPort.IntVal)
		}
		if p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal == 0 {
			port.TargetPort = uint32(p.Port)
		}
		s.Ports = append(s.Ports, port)
	}
	s.LoadBalancing = loadBalancing(svc)
	if !in.IsWaypoint {
		s.Waypoint, refused = resolveWaypoint(in.Binding, in.Waypoint, apinames.WaypointForService, svc.Namespace, in.NamespaceLabels)
		s.IngressUseWaypoint = s.Waypoint != nil && IngressUseWaypoint(svc.Labels, in.NamespaceLabels)
	}
	return s, refused
}

// ClusterIPs are a Service's cluster IPs, the primary first, unmapped;
// none for a headless Service ("None" is no address).
func ClusterIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// IngressUseWaypoint reads istio.io/ingress-use-waypoint from a Service and
// its namespace: the Service's own label wins, and a value is true when
// strconv.ParseBool says so (the webhook refuses others; a value that does
// not parse is false). When it is true and the Service is bound to a
// waypoint, ingress gateways send the Service's traffic through that
// waypoint rather than straight to its endpoints.
func IngressUseWaypoint(svcLabels, nsLabels map[string]string) bool {
	v, ok := svcLabels[label.IoIstioIngressUseWaypoint.Name]
	if !ok {
		v = nsLabels[label.IoIstioIngressUseWaypoint.Name]
	}
	on, err := strconv.ParseBool(v)
	return err == nil && on
}

// AppProtocol maps a Service port's appProtocol, or else its name prefix
// (Istio's port-naming convention), to the xDS enum.
func AppProtocol(p corev1.ServicePort) workloadpb.AppProtocol {
	proto := ""
	if p.AppProtocol != nil {
		proto = strings.ToLower(*p.AppProtocol)
	} else {
		proto, _, _ = strings.Cut(strings.ToLower(p.Name), "-")
	}
	switch proto {
	case "http", "kubernetes.io/http":
		return workloadpb.AppProtocol_HTTP11
	case "http2", "kubernetes.io/h2c":
		return workloadpb.AppProtocol_HTTP2
	case "grpc":
		return workloadpb.AppProtocol_GRPC
	case "tcp":
		return workloadpb.AppProtocol_TCP
	case "tls", "https":
		return workloadpb.AppProtocol_TLS
	}
	return workloadpb.AppProtocol_UNKNOWN
}

// NodeLocality is the locality of a node with labels: its region and zone
// from the well-known topology labels, its subzone from Istio's
// topology.istio.io/subzone, as istiod reads them; nil when it has none of
// them.
func NodeLocality(labels map[string]string) *workloadpb.Locality {
	l := &workloadpb.Locality{
		Region:  labels[corev1.LabelTopologyRegion],
		Zone:    labels[corev1.LabelTopologyZone],
		Subzone: labels[label.TopologySubzone.Name],
	}
	if l.Region == "" && l.Zone == "" && l.Subzone == "" {
		return nil
	}
	return l
}

// loadBalancing maps internalTrafficPolicy and trafficDistribution.
func loadBalancing(svc *corev1.Service) *workloadpb.LoadBalancing {
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
		return &workloadpb.LoadBalancing{
			RoutingPreference: []workloadpb.LoadBalancing_Scope{workloadpb.LoadBalancing_NODE},
			Mode:              workloadpb.LoadBalancing_STRICT,
		}
	}
	if svc.Spec.TrafficDistribution == nil {
		return nil
	}
	scopes := []workloadpb.LoadBalancing_Scope{
		workloadpb.LoadBalancing_NETWORK, workloadpb.LoadBalancing_REGION,
		workloadpb.LoadBalancing_ZONE, workloadpb.LoadBalancing_SUBZONE,
	}
	switch *svc.Spec.TrafficDistribution {
	case corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone:
	case corev1.ServiceTrafficDistributionPreferSameNode:
		scopes = append(scopes, workloadpb.LoadBalancing_NODE)
	default:
		return nil
	}
	return &workloadpb.LoadBalancing{RoutingPreference: scopes, Mode: workloadpb.LoadBalancing_FAILOVER}
}

// ServicePorts returns the ports a Service's endpoint in slice serves: each
// service port with its target port as the EndpointSlice resolved it
// (matching by port name), or the service's numeric target port when the
// slice does not list it. A named target port the slice did not resolve is
// left out.
func ServicePorts(svc *corev1.Service, slice *discoveryv1.EndpointSlice) []*workloadpb.Port {
	var out []*workloadpb.Port
	for _, sp := range svc.Spec.Ports {
		port := &workloadpb.Port{ServicePort: uint32(sp.Port)}
		found := false
		for _, ep := range slice.Ports {
			name := ""
			if ep.Name != nil {
				name = *ep.Name
			}
			if name == sp.Name && ep.Port != nil {
				port.TargetPort = uint32(*ep.Port)
				found = true
				break
			}
		}
		if !found {
			switch {
			case sp.TargetPort.Type == intstr.Int && sp.TargetPort.IntVal != 0:
				port.TargetPort = uint32(sp.TargetPort.IntVal)
			case sp.TargetPort.Type == intstr.Int:
				port.TargetPort = uint32(sp.Port)
			default:
				continue
			}
		}
		out = append(out, port)
	}
	return out
}

// SelectorMatches reports whether a policy's match labels select labels. An
// empty selector selects everything.
func SelectorMatches(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
