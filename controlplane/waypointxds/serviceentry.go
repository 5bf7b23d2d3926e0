package waypointxds

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"istio.io/api/label"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/podnet"
)

// A ServiceEntry bound to the waypoint (istio.io/use-waypoint on it or its
// namespace) is served as its hosts' Services would be: each host is seen
// as a Service of the entry's name and namespace, at the entry's addresses
// or the one its status records for the host, with its ports, so that
// policies, routes and chains are built by the Services' code. What differs
// is kept in builder.entries: the host (the cluster and chain names), the
// parents and targetRefs that name it (kind ServiceEntry), and its
// endpoints (the entry's, reached in plain TCP; a DNS entry's resolved by
// the waypoint).

// Group and kind of a ServiceEntry, as parentRefs and targetRefs name it.
const (
	entryGroup = "networking.istio.io"
	entryKind  = "ServiceEntry"
	// hostnameKind is Istio's backendRef kind that names a host.
	hostnameKind = "Hostname"
)

// entryRef is what a Service view of a ServiceEntry host stands for.
type entryRef struct {
	se   *networkingv1.ServiceEntry
	host string
}

// boundEntries lists the hosts of the ServiceEntries bound to the waypoint
// as Services, sorted by entry and host, and records what each stands
// for. A host without an address yet (its allocation not recorded in the
// entry's status) is skipped: no client can reach it.
func (b *builder) boundEntries() []*corev1.Service {
	if !b.serves(apinames.WaypointForService) || b.st.ServiceEntries == nil {
		return nil
	}
	objs := b.st.ServiceEntries.List()
	sort.Slice(objs, func(i, j int) bool { return keyOf(objs[i]) < keyOf(objs[j]) })
	var out []*corev1.Service
	for _, o := range objs {
		se := o.(*networkingv1.ServiceEntry)
		if !ambient.ServiceEntrySupported(se) || !b.bound(se.Namespace, se.Labels, apinames.WaypointForService, entryKind) {
			continue
		}
		recorded := ambient.RecordedAddresses(se)
		for _, h := range se.Spec.GetHosts() {
			host := ambient.NormalHost(h)
			svc := entryService(se, host, recorded[host])
			if len(svc.Spec.ClusterIPs) == 0 {
				b.note("ServiceEntry %s/%s: host %s has no address yet", se.Namespace, se.Name, host)
				continue
			}
			if b.entries == nil {
				b.entries = map[*corev1.Service]entryRef{}
			}
			b.entries[svc] = entryRef{se: se, host: host}
			out = append(out, svc)
		}
	}
	return out
}

// entryService is the Service view of one host of se: its addresses (else
// the one allocated to it), its ports.
func entryService(se *networkingv1.ServiceEntry, host string, allocated netip.Addr) *corev1.Service {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: se.Namespace, Name: se.Name, Labels: se.Labels}}
	for _, a := range se.Spec.GetAddresses() {
		if ip, err := netip.ParseAddr(a); err == nil && podnet.EndpointAddr(ip) {
			svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, ip.Unmap().String())
		}
	}
	if len(svc.Spec.ClusterIPs) == 0 && allocated.IsValid() {
		svc.Spec.ClusterIPs = []string{allocated.String()}
	}
	for _, p := range se.Spec.GetPorts() {
		target := p.GetTargetPort()
		if target == 0 {
			target = p.GetNumber()
		}
		sp := corev1.ServicePort{Name: p.GetName(), Protocol: corev1.ProtocolTCP, Port: int32(p.GetNumber()), TargetPort: intstr.FromInt32(int32(target))}
		if ap := entryAppProtocol(p.GetProtocol()); ap != "" {
			sp.AppProtocol = &ap
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
	}
	return svc
}

// entryAppProtocol is the appProtocol a ServiceEntry port's protocol
// stands for ("": detected, as Istio does for a port without one).
func entryAppProtocol(p string) string {
	switch p = strings.ToLower(p); p {
	case "http", "http2", "grpc", "tcp", "tls":
		return p
	case "https":
		return "tls" // TLS the waypoint relays, never opens
	case "mongo", "mysql", "redis":
		return p
	}
	return ""
}

// hostOf is the hostname of a Service, or of the ServiceEntry host it
// stands for.
func (b *builder) hostOf(svc *corev1.Service) string {
	if e, ok := b.entries[svc]; ok {
		return e.host
	}
	return ambient.Hostname(svc.Name, svc.Namespace, b.mesh.ClusterDomain)
}

// entryParent reports whether a parentRef names a ServiceEntry.
func entryParent(r gwv1.ParentReference) bool {
	return r.Group != nil && r.Kind != nil && string(*r.Group) == entryGroup && string(*r.Kind) == entryKind
}

// entryCluster adds the Cluster of a ServiceEntry host's port: STRICT_DNS
// with the entry's endpoints (or the host itself) for resolution DNS,
// resolved again at Envoy's default interval (5 s), EDS with its IP
// endpoints for STATIC, ORIGINAL_DST for NONE.
func (b *builder) entryCluster(c *clusterv3.Cluster, e entryRef, port corev1.ServicePort) {
	if e.se.Spec.GetResolution() == networkingv1alpha3.ServiceEntry_NONE {
		// Passed through: to the address the client dialed.
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
		c.EdsClusterConfig = nil
		c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
		b.res.add(resource.ClusterType, c.Name, c)
		return
	}
	cla := b.entryEndpoints(c.Name, e, port)
	if e.se.Spec.GetResolution() != networkingv1alpha3.ServiceEntry_DNS {
		b.res.add(resource.ClusterType, c.Name, c)
		b.res.add(resource.EndpointType, c.Name, cla)
		return
	}
	c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STRICT_DNS}
	c.EdsClusterConfig = nil
	c.LoadAssignment = cla
	// An address of the family the pod network surely has first.
	c.DnsLookupFamily = clusterv3.Cluster_V4_PREFERRED
	b.res.add(resource.ClusterType, c.Name, c)
}

// entryEndpoints are the endpoints of a ServiceEntry host's port: the
// workloads its workloadSelector selects, else the entry's endpoints (an
// endpoint's own port for the port's name first), or for a DNS entry
// without endpoints the host itself. The entry's own endpoints are reached
// in plain TCP: an external endpoint has no mesh identity.
func (b *builder) entryEndpoints(name string, e entryRef, port corev1.ServicePort) *endpointv3.ClusterLoadAssignment {
	spec := &e.se.Spec
	if sel := spec.GetWorkloadSelector(); sel != nil {
		return b.selectedEndpoints(name, e, port, sel.GetLabels())
	}
	dns := spec.GetResolution() == networkingv1alpha3.ServiceEntry_DNS
	eps := spec.GetEndpoints()
	if dns && len(eps) == 0 {
		eps = []*networkingv1alpha3.WorkloadEntry{{Address: e.host}}
	}
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	var lbs []*endpointv3.LbEndpoint
	seen := map[string]bool{}
	for _, ep := range eps {
		addr := ambient.NormalHost(ep.GetAddress())
		if ip, err := netip.ParseAddr(addr); err == nil {
			if !podnet.EndpointAddr(ip) {
				continue // never the waypoint's own localhost, nor the node's metadata service
			}
			addr = ip.Unmap().String()
		} else if !dns {
			continue // STATIC: IPs only (the webhook refuses the rest)
		}
		p := uint32(port.TargetPort.IntValue())
		if v, ok := ep.GetPorts()[port.Name]; ok && v != 0 {
			p = v
		}
		if addr == "" || p == 0 || seen[addr+":"+itoa(int(p))] {
			continue
		}
		seen[addr+":"+itoa(int(p))] = true
		lbs = append(lbs, &endpointv3.LbEndpoint{
			HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
				Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
					Address: addr, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: p},
				}},
			}}},
		})
	}
	if len(lbs) > 0 {
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}
	}
	return cla
}

// entryBackend resolves a backendRef to a ServiceEntry host of the route's
// namespace: kind Hostname names the host, kind ServiceEntry an entry of
// one host.
func (b *builder) entryBackend(src *source, ref gwv1.BackendObjectReference) (string, bool) {
	if ref.Namespace != nil && string(*ref.Namespace) != src.ns {
		b.refProblem(src, gwv1.RouteReasonRefNotPermitted, "backend %s %s is in another namespace: a route reaches only ServiceEntries of its own", *ref.Kind, ref.Name)
		return "", false
	}
	var se *networkingv1.ServiceEntry
	host := ""
	if *ref.Kind == entryKind {
		se = get[networkingv1.ServiceEntry](b.st.ServiceEntries, src.ns+"/"+string(ref.Name))
		if se != nil {
			if hosts := se.Spec.GetHosts(); len(hosts) == 1 {
				host = ambient.NormalHost(hosts[0])
			} else {
				b.refProblem(src, gwv1.RouteReasonInvalidKind, "backend ServiceEntry %s/%s has %d hosts; name the one to use with kind Hostname", src.ns, ref.Name, len(hosts))
				return "", false
			}
		}
	} else {
		host = ambient.NormalHost(string(ref.Name))
		for _, o := range byNamespace(b.st.ServiceEntries, src.ns) {
			cand := o.(*networkingv1.ServiceEntry)
			for _, h := range cand.Spec.GetHosts() {
				if ambient.NormalHost(h) == host && (se == nil || keyOf(cand) < keyOf(se)) {
					se = cand
				}
			}
		}
	}
	switch {
	case se == nil:
		b.refProblem(src, gwv1.RouteReasonBackendNotFound, "backend %s %s: no ServiceEntry of namespace %s has it", *ref.Kind, ref.Name, src.ns)
		return "", false
	case !ambient.ServiceEntrySupported(se):
		b.refProblem(src, gwv1.RouteReasonBackendNotFound, "backend ServiceEntry %s/%s is not applied (its admission says why)", se.Namespace, se.Name)
		return "", false
	case ref.Port == nil:
		b.refProblem(src, gwv1.RouteReasonBackendNotFound, "backend %s has no port", ref.Name)
		return "", false
	}
	view := entryService(se, host, netip.Addr{})
	for _, p := range view.Spec.Ports {
		if p.Port == int32(*ref.Port) {
			if b.entries == nil {
				b.entries = map[*corev1.Service]entryRef{}
			}
			b.entries[view] = entryRef{se: se, host: host}
			name := ClusterName(host, p.Port)
			b.clusters[name] = clusterRef{view, p}
			return name, true
		}
	}
	b.refProblem(src, gwv1.RouteReasonBackendNotFound, "backend ServiceEntry %s/%s has no port %d", se.Namespace, se.Name, *ref.Port)
	return "", false
}

// entryParent is the Accepted condition of a ServiceEntry parentRef.
func (o *outcomes) entryParent(src *source, rep *routeReport, i int, ref gwv1.ParentReference) *metav1.Condition {
	ns := src.ns
	if ref.Namespace != nil {
		ns = string(*ref.Namespace)
	}
	key := ns + "/" + string(ref.Name)
	no := func(reason gwv1.RouteConditionReason, format string, args ...any) *metav1.Condition {
		return &metav1.Condition{Status: metav1.ConditionFalse, Reason: string(reason), Message: fmt.Sprintf(format, args...)}
	}
	if ns != src.ns {
		return no(gwv1.RouteReasonUnsupportedValue,
			"parent ServiceEntry %s is in another namespace: routes for another namespace's ServiceEntry are not supported", key)
	}
	se := get[networkingv1.ServiceEntry](o.st.ServiceEntries, key)
	if se == nil {
		return no(gwv1.RouteReasonNoMatchingParent, "parent ServiceEntry %s not found", key)
	}
	if wp, ok := rep.attachedTo(i); ok {
		if rep != nil && len(rep.unsupported) > 0 {
			return no(gwv1.RouteReasonUnsupportedValue, "%s", joinProblems(rep.unsupported))
		}
		return &metav1.Condition{Status: metav1.ConditionTrue, Reason: string(gwv1.RouteReasonAccepted),
			Message: fmt.Sprintf("routes traffic to ServiceEntry %s through waypoint %s", key, wp)}
	}
	if p, ok := rep.rejectedAt(i); ok {
		return no(p.reason, "%s", p.message)
	}
	none := gwv1.RouteReasonNoMatchingParent
	nsl := nsLabels(o.st.Namespaces, ns)
	bind := ambient.BindingFor(ns, se.Labels, nsl)
	matched := false
	for _, p := range se.Spec.GetPorts() {
		if (ref.Port == nil || uint32(*ref.Port) == p.GetNumber()) && (ref.SectionName == nil || string(*ref.SectionName) == p.GetName()) {
			matched = true
		}
	}
	switch {
	case !ambient.ServiceEntrySupported(se):
		return no(none, "ServiceEntry %s is not applied (its admission says why)", key)
	case !matched:
		return no(none, "ServiceEntry %s has no port that the parentRef names", key)
	case bind.Key == "":
		return no(none, "ServiceEntry %s uses no waypoint: label it, or its namespace, %s=<waypoint name>", key, label.IoIstioUseWaypoint.Name)
	}
	if r := ambient.Check(bind, o.waypoints[bind.Key], apinames.WaypointForService, ns, nsl); r != nil {
		if r.Reason == ambient.ReasonAttachmentDenied {
			none = gwv1.RouteReasonNotAllowedByListeners
		}
		return no(none, "ServiceEntry %s is not bound to its waypoint: %s", key, r.Message)
	}
	return no(none, "waypoint %s has not taken ServiceEntry %s yet (a host without an address, or a port whose protocol the route does not apply to)", bind.Key, key)
}

// selectedEndpoints are the endpoints of a ServiceEntry host's port among
// the pods and WorkloadEntries of the entry's namespace that its
// workloadSelector selects, as ztunnel's Workloads carry them
// (ambient.EntrySelectedPorts): a pod at the port's target port, over
// HBONE when it is enrolled; an entry at its own port of the port's name.
func (b *builder) selectedEndpoints(name string, e entryRef, port corev1.ServicePort, sel map[string]string) *endpointv3.ClusterLoadAssignment {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	ns := e.se.Namespace
	var lbs []*endpointv3.LbEndpoint
	seen := map[string]bool{}
	add := func(ip netip.Addr, p uint32, mk func() *endpointv3.LbEndpoint) {
		key := netip.AddrPortFrom(ip, uint16(p)).String()
		if !seen[key] && p != 0 && p <= 65535 {
			seen[key] = true
			lbs = append(lbs, mk())
		}
	}
	target := uint32(port.TargetPort.IntValue())
	pods := byNamespace(b.st.Pods, ns)
	sort.Slice(pods, func(i, j int) bool { return keyOf(pods[i]) < keyOf(pods[j]) })
	for _, o := range pods {
		pod := o.(*corev1.Pod)
		if pod.Spec.HostNetwork || pod.DeletionTimestamp != nil || !ambient.SelectorMatches(sel, pod.Labels) {
			continue
		}
		for _, pip := range pod.Status.PodIPs {
			ip, err := netip.ParseAddr(pip.IP)
			if err != nil || !podnet.EndpointAddr(ip) {
				continue
			}
			ip = ip.Unmap()
			add(ip, target, func() *endpointv3.LbEndpoint { return b.lbEndpoint(ip, int32(target), ambient.PodReady(pod), pod) })
		}
	}
	for _, e := range b.selectedEntries(ns, sel) {
		p := target
		if v, ok := e.we.Spec.GetPorts()[port.Name]; ok && v != 0 {
			p = v
		}
		add(e.ip, p, func() *endpointv3.LbEndpoint { return b.weEndpoint(e.we, e.ip, p) })
	}
	if len(lbs) > 0 {
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}
	}
	return cla
}
