package ambient

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	"istio.io/api/annotation"
	"istio.io/api/label"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/podnet"
)

// kindWorkloadEntry marks a WorkloadEntry whose Workload must be rebuilt.
const kindWorkloadEntry = "WorkloadEntry"

// WorkloadEntryUID is the xDS name of a WorkloadEntry's Workload (istiod's
// naming): "<cluster>/networking.istio.io/WorkloadEntry/<namespace>/<name>".
func WorkloadEntryUID(clusterID, namespace, name string) string {
	return clusterID + "/networking.istio.io/WorkloadEntry/" + namespace + "/" + name
}

// WorkloadEntryLabels are a WorkloadEntry's labels as istiod reads them:
// spec.labels, overridden by metadata.labels.
func WorkloadEntryLabels(we *networkingv1.WorkloadEntry) map[string]string {
	if len(we.Spec.GetLabels()) == 0 {
		return we.Labels
	}
	out := maps.Clone(we.Spec.GetLabels())
	maps.Copy(out, we.Labels)
	return out
}

// WorkloadEntryAddress is the IP a WorkloadEntry that Weft applies is
// reached at, or the zero Addr when Weft does not apply it: its address
// is not one IP (a hostname, a Unix socket, none: the webhook refuses
// them), is an address ztunnel never connects to, or it is on another
// network than network, the mesh's.
func WorkloadEntryAddress(we *networkingv1.WorkloadEntry, network string) netip.Addr {
	if n := we.Spec.GetNetwork(); n != "" && n != network {
		return netip.Addr{}
	}
	ip, err := netip.ParseAddr(we.Spec.GetAddress())
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}
	}
	if !podnet.EndpointAddr(ip) {
		return netip.Addr{}
	}
	return ip.Unmap()
}

// WorkloadEntryInput is what a WorkloadEntry's Workload is built from.
type WorkloadEntryInput struct {
	Entry *networkingv1.WorkloadEntry
	// Waypoint is the waypoint the entry is bound to, resolved; nil for
	// none.
	Waypoint *Waypoint
	// Binding is the entry's waypoint binding (BindingFor on its labels).
	Binding Binding
	// NamespaceLabels are the labels of the entry's namespace.
	NamespaceLabels map[string]string
	// Services are the Services of the entry's namespace whose selector
	// selects it (WorkloadEntryServices).
	Services []*corev1.Service
	// EntryPorts are the ServiceEntry hosts whose workloadSelector selects
	// it, with their ports (EntrySelectedPorts).
	EntryPorts map[string][]*workloadpb.Port
	// Policies are the resource names of the workload-selector policies
	// that select the entry, then its PeerAuthentication keys.
	Policies []string
}

// WorkloadEntryWorkload builds a WorkloadEntry's Workload as istiod does,
// or nil when Weft does not apply the entry (WorkloadEntryAddress).
// Unlike istiod, the Workload is HOST_NETWORK: its address is typed in by
// whoever may write WorkloadEntries in its namespace, so ztunnel reaches it
// only as a Service's endpoint and never takes it for the pod, or the
// node, that holds the same IP. Its weight is not applied (the webhook
// refuses it: ztunnel spreads connections evenly).
func (c Config) WorkloadEntryWorkload(in WorkloadEntryInput) (w *workloadpb.Workload, refused *Refusal) {
	c = c.withDefaults()
	we := in.Entry
	ip := WorkloadEntryAddress(we, c.Network)
	if !ip.IsValid() {
		return nil, nil
	}
	labels := WorkloadEntryLabels(we)
	w = &workloadpb.Workload{
		Uid:                   WorkloadEntryUID(c.ClusterID, we.Namespace, we.Name),
		Name:                  we.Name,
		Namespace:             we.Namespace,
		Addresses:             [][]byte{ip.AsSlice()},
		Network:               c.Network,
		ServiceAccount:        we.Spec.GetServiceAccount(),
		ClusterId:             c.ClusterID,
		WorkloadType:          workloadpb.WorkloadType_POD, // as istiod: it has no type of its own
		WorkloadName:          workloadEntryName(we, labels),
		NetworkMode:           workloadpb.NetworkMode_HOST_NETWORK,
		Status:                workloadpb.WorkloadStatus_HEALTHY,
		AuthorizationPolicies: slices.Clone(in.Policies),
		Locality:              workloadEntryLocality(we.Spec.GetLocality()),
	}
	if c.TrustDomain != "cluster.local" {
		w.TrustDomain = c.TrustDomain
	}
	if we.Annotations[annotation.AmbientRedirection.Name] == apinames.RedirectionEnabled {
		w.TunnelProtocol = workloadpb.TunnelProtocol_HBONE
	}
	w.CanonicalName, w.CanonicalRevision = canonical(labels, w.WorkloadName)
	w.Waypoint, refused = resolveWaypoint(in.Binding, in.Waypoint, apinames.WaypointForWorkload, we.Namespace, in.NamespaceLabels)
	for _, svc := range in.Services {
		if svc.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		if w.Services == nil {
			w.Services = map[string]*workloadpb.PortList{}
		}
		w.Services[ServiceKey(svc.Namespace, Hostname(svc.Name, svc.Namespace, c.ClusterDomain))] =
			&workloadpb.PortList{Ports: WorkloadEntryPorts(svc, we.Spec.GetPorts())}
	}
	for k, ports := range in.EntryPorts {
		if w.Services == nil {
			w.Services = map[string]*workloadpb.PortList{}
		}
		w.Services[k] = &workloadpb.PortList{Ports: ports}
	}
	return w, refused
}

// workloadEntryName is the entry's workload name as istiod derives it:
// the auto-registration group that made it, else its
// service.istio.io/workload-name label, else its name.
func workloadEntryName(we *networkingv1.WorkloadEntry, labels map[string]string) string {
	if g, ok := we.Annotations[annotation.IoIstioAutoRegistrationGroup.Name]; ok {
		return g
	}
	if n, ok := labels[label.ServiceWorkloadName.Name]; ok {
		return n
	}
	return we.Name
}

// workloadEntryLocality reads "region/zone/subzone" (each part optional
// from the end), or nil when it names none.
func workloadEntryLocality(s string) *workloadpb.Locality {
	parts := strings.SplitN(s, "/", 3)
	parts = append(parts, "", "")
	l := &workloadpb.Locality{Region: parts[0], Zone: parts[1], Subzone: parts[2]}
	if l.Region == "" && l.Zone == "" && l.Subzone == "" {
		return nil
	}
	return l
}

// WorkloadEntryPorts is the ports a WorkloadEntry serves for a Service
// that selects it, resolved as istiod does: a named target port is looked
// up in the entry's ports (the service port is left out when the entry
// does not name it); a numeric one (the port itself when unset) is
// replaced by the entry's port of the service port's name, if any.
func WorkloadEntryPorts(svc *corev1.Service, entryPorts map[string]uint32) []*workloadpb.Port {
	out := []*workloadpb.Port{}
	for _, sp := range svc.Spec.Ports {
		port := &workloadpb.Port{ServicePort: uint32(sp.Port)}
		switch {
		case sp.TargetPort.Type == intstr.String:
			v, ok := entryPorts[sp.TargetPort.StrVal]
			if !ok || v == 0 || v > 65535 {
				continue
			}
			port.TargetPort = v
		case sp.TargetPort.IntVal != 0:
			port.TargetPort = uint32(sp.TargetPort.IntVal)
		default:
			port.TargetPort = uint32(sp.Port)
		}
		if sp.TargetPort.Type == intstr.Int {
			if v, ok := entryPorts[sp.Name]; ok && sp.Name != "" && v != 0 && v <= 65535 {
				port.TargetPort = v
			}
		}
		out = append(out, port)
	}
	return out
}

// WorkloadEntryServices returns the Services, among svcs, that select a
// WorkloadEntry: of its namespace, with a selector that is not empty and
// matches its labels (istiod's PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES,
// on by default), sorted by name.
func WorkloadEntryServices(we *networkingv1.WorkloadEntry, svcs []*corev1.Service) []*corev1.Service {
	labels := WorkloadEntryLabels(we)
	var out []*corev1.Service
	for _, s := range svcs {
		if s.Namespace == we.Namespace && len(s.Spec.Selector) > 0 && SelectorMatches(s.Spec.Selector, labels) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Service) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// markEntries marks dirty the WorkloadEntries that a batch's other
// changes may concern: those of the namespaces whose labels, Services,
// AuthorizationPolicies or PeerAuthentications changed (every one for a
// change in the root namespace). Gateways mark the entries bound to them
// themselves (the binding index). A Service is not tracked by the entries
// it selected: its namespace's entries are few, and comparing each
// rebuilt Workload with the one published sends only what changed.
func (ix *index) markEntries(b batch) {
	s := ix.stores.WorkloadEntries
	if s == nil {
		return
	}
	namespaces := map[string]bool{}
	for _, kind := range []string{kindService, kindPolicy, kindPeerAuth} {
		for key := range b[kind] {
			ns, _, _ := cache.SplitMetaNamespaceKey(key)
			namespaces[ns] = true
		}
	}
	for ns := range b[kindNamespace] {
		namespaces[ns] = true
	}
	if namespaces[ix.cfg.RootNamespace] {
		for _, k := range s.ListKeys() {
			b.add(kindWorkloadEntry, k)
		}
		return
	}
	for ns := range namespaces {
		for _, o := range ix.byNamespace(s, ns) {
			b.add(kindWorkloadEntry, keyOf(o))
		}
	}
}

// workloadEntryChanged publishes a WorkloadEntry's Workload, or removes it.
func (ix *index) workloadEntryChanged(key string, u *Update) {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	ref := objRef{kindWorkloadEntry, key}
	we := getObj[networkingv1.WorkloadEntry](ix.stores.WorkloadEntries, key)
	var res *workloadpb.Workload
	if we != nil {
		labels := WorkloadEntryLabels(we)
		in := WorkloadEntryInput{Entry: we}
		in.Binding, in.NamespaceLabels = ix.binding(ref, ns, labels)
		in.Waypoint = ix.waypoints[in.Binding.Key]
		var svcs []*corev1.Service
		for _, o := range ix.byNamespace(ix.stores.Services, ns) {
			svcs = append(svcs, o.(*corev1.Service))
		}
		in.Services = WorkloadEntryServices(we, svcs)
		in.EntryPorts = EntrySelectedPorts(ix.namespaceEntries(ns), ns, labels, we.Spec.GetPorts())
		in.Policies = append(ix.selectorPolicies(ns, labels), ix.peerAuthKeys(ns, labels)...)
		var refused *Refusal
		res, refused = ix.cfg.WorkloadEntryWorkload(in)
		ix.refused(ref, typed(we, refused), refused, u)
	} else {
		ix.unbind(ref)
	}
	publishAddress(ix, WorkloadEntryUID(ix.cfg.ClusterID, ns, name), res, u, wrapWorkload)
}

// typed returns we with its kind set when a refusal is reported on it: an
// Event's recorder finds the kind of a Pod or Service in its scheme, not
// an Istio kind's.
func typed(we *networkingv1.WorkloadEntry, r *Refusal) *networkingv1.WorkloadEntry {
	if r == nil {
		return we
	}
	c := we.DeepCopy()
	c.APIVersion, c.Kind = networkingv1.SchemeGroupVersion.String(), kindWorkloadEntry
	return c
}
