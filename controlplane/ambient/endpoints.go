package ambient

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/podnet"
)

// SliceWorkloadUID is the xDS name of the Workload made for one address of
// an EndpointSlice that names no pod (istiod's naming):
// "<cluster>/discovery.k8s.io/EndpointSlice/<namespace>/<slice>/<address>".
func SliceWorkloadUID(clusterID, namespace, slice string, addr netip.Addr) string {
	return clusterID + "/discovery.k8s.io/EndpointSlice/" + namespace + "/" + slice + "/" + addr.String()
}

// SliceWorkloads builds the Workloads of the endpoints of a Service's
// EndpointSlice that are not pods: kubernetes.default's API server, the
// hand-written endpoints of a selectorless Service. Endpoints naming a pod
// are left out (the pod's own Workload lists the Service). Each endpoint
// becomes one Workload keyed by its first address, with no identity and no
// HBONE, so ztunnel sends it plain TCP; it is HOST_NETWORK, a shared
// address, so that ztunnel never takes it for the pod that may hold the
// same IP. A not-ready endpoint is UNHEALTHY unless the Service publishes
// not-ready addresses. FQDN slices and ExternalName Services have none.
func (c Config) SliceWorkloads(svc *corev1.Service, slice *discoveryv1.EndpointSlice) []*workloadpb.Workload {
	c = c.withDefaults()
	if svc == nil || slice == nil || svc.Spec.Type == corev1.ServiceTypeExternalName || slice.AddressType == discoveryv1.AddressTypeFQDN {
		return nil
	}
	key := ServiceKey(svc.Namespace, Hostname(svc.Name, svc.Namespace, c.ClusterDomain))
	seen := map[netip.Addr]bool{}
	var out []*workloadpb.Workload
	for _, ep := range slice.Endpoints {
		if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
			continue
		}
		addrs := endpointAddrs(ep.Addresses)
		if len(addrs) == 0 || seen[addrs[0]] {
			continue
		}
		seen[addrs[0]] = true
		w := &workloadpb.Workload{
			Uid:         SliceWorkloadUID(c.ClusterID, slice.Namespace, slice.Name, addrs[0]),
			Name:        slice.Name,
			Namespace:   slice.Namespace,
			Network:     c.Network,
			ClusterId:   c.ClusterID,
			NetworkMode: workloadpb.NetworkMode_HOST_NETWORK,
			Status:      workloadpb.WorkloadStatus_HEALTHY,
			Services:    map[string]*workloadpb.PortList{key: {Ports: ServicePorts(svc, slice)}},
		}
		for _, a := range addrs {
			w.Addresses = append(w.Addresses, a.AsSlice())
		}
		if ep.Conditions.Ready != nil && !*ep.Conditions.Ready && !svc.Spec.PublishNotReadyAddresses {
			w.Status = workloadpb.WorkloadStatus_UNHEALTHY
		}
		out = append(out, w)
	}
	return out
}

// endpointAddrs parses an endpoint's addresses, unmapped. An endpoint with
// an address that is not a unicast IP a Service may name (the API server's
// own validation refuses unspecified, loopback, link-local and multicast
// addresses) is skipped whole, so that no endpoint sends ztunnel to itself
// or to the node's metadata service.
func endpointAddrs(raw []string) []netip.Addr {
	out := make([]netip.Addr, 0, len(raw))
	for _, s := range raw {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return nil
		}
		a = a.Unmap()
		if !podnet.EndpointAddr(a) {
			return nil
		}
		out = append(out, a)
	}
	return out
}
