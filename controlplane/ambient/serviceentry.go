package ambient

import (
	"hash/fnv"
	"net/netip"
	"sort"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/podnet"
)

// ServiceEntryWorkloadUID is the xDS name of the Workload made for one
// endpoint of a ServiceEntry (istiod's naming):
// "<cluster>/networking.istio.io/ServiceEntry/<namespace>/<name>/<address>".
func ServiceEntryWorkloadUID(clusterID, namespace, name, address string) string {
	return clusterID + "/networking.istio.io/ServiceEntry/" + namespace + "/" + name + "/" + address
}

// AutoVIPPrefix is where a ServiceEntry host without addresses gets its
// address, as Istio's allocation does: clients resolve the host (through
// ztunnel's DNS proxy) to it, and ztunnel sends what they dial there to
// the entry's endpoints.
var AutoVIPPrefix = netip.MustParsePrefix("240.240.0.0/16")

// AutoVIP is the address a ServiceEntry host without addresses gets: a
// hash of "<namespace>/<name>/<host>" into AutoVIPPrefix (neither the
// first nor the last address of the prefix), so it stays the same across
// restarts and replicas. taken reports an address already given to
// another host; the next one is tried.
func AutoVIP(namespace, name, host string, taken func(netip.Addr) bool) netip.Addr {
	h := fnv.New32a()
	h.Write([]byte(namespace + "/" + name + "/" + host))
	const size = 1<<16 - 2
	base := AutoVIPPrefix.Addr().As4()
	for i := uint32(0); i < size; i++ {
		n := (h.Sum32()+i)%size + 1
		a := base
		a[2], a[3] = byte(n>>8), byte(n)
		ip := netip.AddrFrom4(a)
		if taken == nil || !taken(ip) {
			return ip
		}
	}
	return netip.Addr{} // every address taken: none
}

// ServiceEntryResources builds what a ServiceEntry publishes: one Service
// per host (its addresses, else vips[host]; its ports) and its endpoints'
// Workloads, which carry every host's ports. Weft applies MESH_EXTERNAL
// entries with resolution STATIC (each endpoint an IP) or DNS (each
// endpoint a hostname or IP; no endpoints: the hosts themselves), which
// ztunnel reaches in plain TCP, resolving hostnames itself, and NONE
// (passthrough Services at the entry's addresses, no Workloads); the
// webhook refuses the rest, and an entry that slipped past it publishes
// nothing.
func (c Config) ServiceEntryResources(se *networkingv1.ServiceEntry, vips map[string]netip.Addr) ([]*workloadpb.Service, []*workloadpb.Workload) {
	c = c.withDefaults()
	spec := &se.Spec
	static := spec.GetResolution() == networkingv1alpha3.ServiceEntry_STATIC
	dns := spec.GetResolution() == networkingv1alpha3.ServiceEntry_DNS
	none := spec.GetResolution() == networkingv1alpha3.ServiceEntry_NONE
	if !ServiceEntrySupported(se) {
		return nil, nil
	}
	var svcs []*workloadpb.Service
	portsByHost := map[string][]*workloadpb.Port{}
	for _, host := range spec.GetHosts() {
		host = NormalHost(host)
		s := &workloadpb.Service{Name: se.Name, Namespace: se.Namespace, Hostname: host}
		for _, a := range spec.GetAddresses() {
			if ip, err := netip.ParseAddr(a); err == nil && podnet.EndpointAddr(ip) {
				s.Addresses = append(s.Addresses, &workloadpb.NetworkAddress{Network: c.Network, Address: ip.Unmap().AsSlice()})
			}
		}
		if none {
			// Passed through to the address dialed: known only by the
			// entry's addresses, none allocated.
			if len(s.Addresses) == 0 {
				continue
			}
			s.LoadBalancing = &workloadpb.LoadBalancing{Mode: workloadpb.LoadBalancing_PASSTHROUGH}
		} else if len(s.Addresses) == 0 {
			if ip, ok := vips[host]; ok && ip.IsValid() {
				s.Addresses = append(s.Addresses, &workloadpb.NetworkAddress{Network: c.Network, Address: ip.AsSlice()})
			}
		}
		for _, p := range spec.GetPorts() {
			target := p.GetTargetPort()
			if target == 0 {
				target = p.GetNumber()
			}
			s.Ports = append(s.Ports, &workloadpb.Port{ServicePort: p.GetNumber(), TargetPort: target, AppProtocol: seAppProtocol(p.GetProtocol())})
		}
		if spec.GetLocation() == networkingv1alpha3.ServiceEntry_MESH_INTERNAL {
			for _, san := range spec.GetSubjectAltNames() {
				if _, err := spiffeid.FromString(san); err == nil { // ztunnel refuses a Service with another
					s.SubjectAltNames = append(s.SubjectAltNames, san)
				}
			}
		}
		svcs = append(svcs, s)
		portsByHost[host] = s.Ports
	}
	if none || spec.GetWorkloadSelector() != nil {
		// Passed through, or the selected workloads carry the hosts
		// (EntrySelectedPorts).
		return svcs, nil
	}
	endpoints := spec.GetEndpoints()
	// A DNS entry without endpoints reaches each host at its own name:
	// that host's endpoint serves that host only.
	implicit := dns && len(endpoints) == 0
	if implicit {
		for _, host := range spec.GetHosts() {
			endpoints = append(endpoints, &networkingv1alpha3.WorkloadEntry{Address: NormalHost(host)})
		}
	}
	var ws []*workloadpb.Workload
	seen := map[string]bool{}
	for _, ep := range endpoints {
		addr := NormalHost(ep.GetAddress())
		ip, err := netip.ParseAddr(addr)
		isIP := err == nil
		if (static && !isIP) || (isIP && !podnet.EndpointAddr(ip)) || addr == "" || seen[addr] {
			continue
		}
		seen[addr] = true
		w := &workloadpb.Workload{
			Uid:            ServiceEntryWorkloadUID(c.ClusterID, se.Namespace, se.Name, addr),
			Name:           se.Name,
			Namespace:      se.Namespace,
			Network:        c.Network,
			ClusterId:      c.ClusterID,
			ServiceAccount: ep.GetServiceAccount(),
			WorkloadName:   se.Name,
			CanonicalName:  se.Name,
			// A shared address: ztunnel never takes it for the pod that
			// may hold the same IP.
			NetworkMode: workloadpb.NetworkMode_HOST_NETWORK,
			Status:      workloadpb.WorkloadStatus_HEALTHY,
			Services:    map[string]*workloadpb.PortList{},
		}
		if isIP {
			w.Addresses = [][]byte{ip.Unmap().AsSlice()}
		} else {
			w.Hostname = addr
		}
		for host, ports := range portsByHost {
			if implicit && host != addr {
				continue
			}
			var pl []*workloadpb.Port
			for i, p := range ports {
				port := &workloadpb.Port{ServicePort: p.ServicePort, TargetPort: p.TargetPort, AppProtocol: p.AppProtocol}
				if v, ok := ep.GetPorts()[spec.GetPorts()[i].GetName()]; ok && v != 0 {
					port.TargetPort = v
				}
				pl = append(pl, port)
			}
			w.Services[ServiceKey(se.Namespace, host)] = &workloadpb.PortList{Ports: pl}
		}
		ws = append(ws, w)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].Uid < ws[j].Uid })
	return svcs, ws
}

// ServiceEntrySupported reports whether Weft applies a ServiceEntry: one
// the webhook admits (resolution STATIC, DNS or NONE; a workloadSelector
// only with STATIC and no endpoints; MESH_INTERNAL only with one; no
// wildcard host).
func ServiceEntrySupported(se *networkingv1.ServiceEntry) bool {
	spec := &se.Spec
	r := spec.GetResolution()
	sel := spec.GetWorkloadSelector() != nil
	switch {
	case r != networkingv1alpha3.ServiceEntry_STATIC && r != networkingv1alpha3.ServiceEntry_DNS && r != networkingv1alpha3.ServiceEntry_NONE,
		spec.GetLocation() == networkingv1alpha3.ServiceEntry_MESH_INTERNAL && !sel,
		sel && (r != networkingv1alpha3.ServiceEntry_STATIC || len(spec.GetEndpoints()) > 0):
		return false
	}
	for _, h := range spec.GetHosts() {
		if strings.Contains(h, "*") {
			return false
		}
	}
	return true
}

// seAppProtocol maps a ServiceEntry port's protocol to the workload API's.
func seAppProtocol(p string) workloadpb.AppProtocol {
	switch strings.ToUpper(p) {
	case "HTTP":
		return workloadpb.AppProtocol_HTTP11
	case "HTTP2":
		return workloadpb.AppProtocol_HTTP2
	case "GRPC":
		return workloadpb.AppProtocol_GRPC
	}
	return workloadpb.AppProtocol_UNKNOWN
}

// NormalHost is a ServiceEntry host as Weft keys it: lower case, without
// a final dot.
func NormalHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// RecordedAddresses are the addresses a ServiceEntry's status records for
// its hosts (status.addresses, as istiod's allocation writes them), by
// host: only valid addresses of AutoVIPPrefix, the first per host.
func RecordedAddresses(se *networkingv1.ServiceEntry) map[string]netip.Addr {
	var out map[string]netip.Addr
	for _, a := range se.Status.GetAddresses() {
		ip, err := netip.ParseAddr(a.GetValue())
		h := NormalHost(a.GetHost())
		if err != nil || !AutoVIPPrefix.Contains(ip) || h == "" {
			continue
		}
		if _, dup := out[h]; dup {
			continue
		}
		if out == nil {
			out = map[string]netip.Addr{}
		}
		out[h] = ip
	}
	return out
}

// EntryStatus is what a ServiceEntry's status should show: the addresses
// allocated to its hosts (status.addresses) and its istio.io/WaypointBound
// condition (nil: none).
type EntryStatus struct {
	Namespace, Name string
	Addresses       map[string]netip.Addr
	Binding         *BindingStatus
}

// EntryShows reports whether se's status shows want already.
func EntryShows(se *networkingv1.ServiceEntry, want EntryStatus) bool {
	got := se.Status.GetAddresses()
	if len(got) != len(want.Addresses) {
		return false
	}
	for _, a := range got {
		ip, err := netip.ParseAddr(a.GetValue())
		if w, ok := want.Addresses[a.GetHost()]; err != nil || !ok || w != ip {
			return false
		}
	}
	var cond *istioCondition
	for _, c := range se.Status.GetConditions() {
		if c.GetType() == ConditionWaypointBound {
			cond = &istioCondition{status: c.GetStatus(), reason: c.GetReason(), message: c.GetMessage()}
		}
	}
	if want.Binding == nil || cond == nil {
		return want.Binding == nil && cond == nil
	}
	return *cond == istioCondition{status: string(conditionStatus(want.Binding)), reason: want.Binding.Reason, message: want.Binding.Message}
}

type istioCondition struct{ status, reason, message string }

// allocates reports whether se's hosts get allocated addresses: they have
// none of their own, and are not passed through by address (NONE).
func allocates(se *networkingv1.ServiceEntry) bool {
	return len(se.Spec.GetAddresses()) == 0 && se.Spec.GetResolution() != networkingv1alpha3.ServiceEntry_NONE
}

// EntrySelectedPorts is what a workload of namespace ns with labels serves
// for the hosts of the ServiceEntries among entries whose workloadSelector
// selects it (of its namespace, applied by Weft), by "<ns>/<host>": each
// entry port to its target port, or to the workload's own port of the
// port's name (a WorkloadEntry's ports; nil for a pod), as istiod maps
// them.
func EntrySelectedPorts(entries []*networkingv1.ServiceEntry, ns string, labels map[string]string, own map[string]uint32) map[string][]*workloadpb.Port {
	var out map[string][]*workloadpb.Port
	for _, se := range entries {
		sel := se.Spec.GetWorkloadSelector()
		if se.Namespace != ns || sel == nil || !ServiceEntrySupported(se) || !SelectorMatches(sel.GetLabels(), labels) {
			continue
		}
		var ports []*workloadpb.Port
		for _, p := range se.Spec.GetPorts() {
			target := p.GetTargetPort()
			if target == 0 {
				target = p.GetNumber()
			}
			if v, ok := own[p.GetName()]; ok && v != 0 && v <= 65535 {
				target = v
			}
			ports = append(ports, &workloadpb.Port{ServicePort: p.GetNumber(), TargetPort: target, AppProtocol: seAppProtocol(p.GetProtocol())})
		}
		for _, h := range se.Spec.GetHosts() {
			if out == nil {
				out = map[string][]*workloadpb.Port{}
			}
			out[ServiceKey(ns, NormalHost(h))] = ports
		}
	}
	return out
}
