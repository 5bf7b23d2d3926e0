package waypointxds

import (
	"net/netip"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/internal/apinames"
)

// ingressWaypoint is the waypoint an ingress Gateway sends a Service's
// traffic through, nil when it goes straight to the Service's endpoints:
// the Service (or its namespace) says istio.io/ingress-use-waypoint and is
// bound to a waypoint by the rule ztunnel follows (ambient.Check, and the
// waypoint has an address), so that the gateway passes the waypoint
// exactly when a mesh client would.
func (b *builder) ingressWaypoint(svc *corev1.Service) *ambient.Waypoint {
	if !b.ingress || b.st.Gateways == nil {
		return nil
	}
	nsl := nsLabels(b.st.Namespaces, svc.Namespace)
	if !ambient.IngressUseWaypoint(svc.Labels, nsl) {
		return nil
	}
	bind := ambient.BindingFor(svc.Namespace, svc.Labels, nsl)
	if bind.Key == "" {
		return nil
	}
	gw := get[gwv1.Gateway](b.st.Gateways, bind.Key)
	var class *gwv1.GatewayClass
	if gw != nil {
		class = get[gwv1.GatewayClass](b.st.GatewayClasses, string(gw.Spec.GatewayClassName))
	}
	wp := ambient.NewWaypointOfClass(gw, class, b.mesh.Network)
	if ambient.Check(bind, wp, apinames.WaypointForService, svc.Namespace, nsl) != nil || wp.Address == nil {
		return nil
	}
	return wp
}

// waypointEndpoints are the endpoints of a Service port reached through
// its waypoint wp: each ready pod of the waypoint's Service at its HBONE
// port, with the pod's identity, asked for the Service's address and port
// (authority) as ztunnel asks a waypoint. A waypoint pod whose identity is
// unknown is left out: the gateway must verify whom it hands the traffic
// to. No pod: no endpoint, and the gateway answers 503 rather than pass
// the waypoint by.
func (b *builder) waypointEndpoints(name string, ref clusterRef, wp *ambient.Waypoint, vip netip.Addr) *endpointv3.ClusterLoadAssignment {
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	wsvc := get[corev1.Service](b.st.Services, wp.Key())
	if wsvc == nil {
		b.note("Service %s/%s: its waypoint %s has no Service; the gateway cannot reach it", ref.svc.Namespace, ref.svc.Name, wp.Key())
		return cla
	}
	var mesh corev1.ServicePort
	for _, p := range wsvc.Spec.Ports {
		if p.Port == apinames.HBONEPort {
			mesh = p
		}
	}
	if mesh.Port == 0 {
		b.note("Service %s/%s: its waypoint's Service %s has no port %d", ref.svc.Namespace, ref.svc.Name, wp.Key(), apinames.HBONEPort)
		return cla
	}
	authority := structpb.NewStringValue(netip.AddrPortFrom(vip, uint16(ref.port.Port)).String())
	var lbs []*endpointv3.LbEndpoint
	for _, le := range b.endpoints(name, clusterRef{svc: wsvc, port: mesh}).GetEndpoints() {
		for _, e := range le.GetLbEndpoints() {
			md := e.GetMetadata().GetFilterMetadata()[MetadataKey]
			if md.GetFields()["identity"].GetStringValue() == "" {
				continue
			}
			md.Fields["tunnel"] = structpb.NewStringValue("HBONE")
			md.Fields["authority"] = authority
			lbs = append(lbs, e)
		}
	}
	if len(lbs) > 0 {
		cla.Endpoints = []*endpointv3.LocalityLbEndpoints{{LbEndpoints: lbs}}
	}
	return cla
}
