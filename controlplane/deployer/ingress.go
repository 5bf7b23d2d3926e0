package deployer

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"istio.io/api/annotation"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/internal/apinames"
)

// Ingress gateways. A Gateway of class apinames.GatewayClass, whose
// GatewayClass names Config.GatewayControllerName, gets the objects of a
// waypoint with these differences: they are named ObjectName (the
// Gateway's name and apinames.GatewaySuffix); the proxy runs in gateway
// mode (apinames.ProxyModeEnv) and may bind ports below 1024 without a
// capability (the pod's net.ipv4.ip_unprivileged_port_start is 0); it has
// no HBONE port; and the Service is of type LoadBalancer unless the
// annotation networking.istio.io/service-type or the service patch (which
// may set spec.type, to one of serviceTypes) says otherwise, with one port
// per distinct listener port and the status port. The service patch may
// also set spec.externalTrafficPolicy (one of externalTrafficPolicies) on
// a NodePort or LoadBalancer Service: Local keeps the client's own address
// as the connection's source (kube-proxy sends external traffic only to
// the node's own gateway pods, without masquerading it), which the
// gateway's policy and X-Forwarded-For then see.

// serviceTypes are the Service types an ingress gateway may have.
var serviceTypes = []string{string(corev1.ServiceTypeClusterIP), string(corev1.ServiceTypeNodePort), string(corev1.ServiceTypeLoadBalancer)}

// externalTrafficPolicies are the values an ingress gateway's service
// patch may give spec.externalTrafficPolicy, spelt as Kubernetes spells
// them.
var externalTrafficPolicies = []string{string(corev1.ServiceExternalTrafficPolicyLocal), string(corev1.ServiceExternalTrafficPolicyCluster)}

// checkTrafficPolicy refuses an external traffic policy on a Service that
// takes no external traffic, as the API server would (ClusterIP): where
// says which patch set it.
func checkTrafficPolicy(svc *corev1.Service, where string) error {
	p := svc.Spec.ExternalTrafficPolicy
	if p == "" || svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		return nil
	}
	return &ParamsError{fmt.Sprintf("%s sets spec.externalTrafficPolicy %s on a Service of type %s, which takes no external traffic; "+
		"make the type NodePort or LoadBalancer (spec.type or annotation %s), or remove spec.externalTrafficPolicy",
		where, p, svc.Spec.Type, annotation.NetworkingServiceType.Name)}
}

// serviceType is the type of an ingress gateway's Service as its
// annotation sets it: LoadBalancer without one.
func serviceType(gw *gwv1.Gateway) (corev1.ServiceType, error) {
	v, ok := gw.Annotations[annotation.NetworkingServiceType.Name]
	if !ok {
		return corev1.ServiceTypeLoadBalancer, nil
	}
	if !slices.Contains(serviceTypes, v) {
		return "", &ParamsError{fmt.Sprintf("annotation %s is %q: the gateway's Service type is one of %s",
			annotation.NetworkingServiceType.Name, v, strings.Join(serviceTypes, ", "))}
	}
	return corev1.ServiceType(v), nil
}

// reservedPorts are the gateway pod's own ports, which no listener may
// take: the Service and the pod have them already.
var reservedPorts = map[gwv1.PortNumber]string{PortMetrics: "metrics", PortStatus: "readiness"}

// checkIngress says why an ingress Gateway cannot be deployed as it is,
// or returns nil: it asks for addresses (the Service takes the address its
// load balancer gives; Weft does not ask for one), or a listener takes a
// port of the proxy's own.
func checkIngress(gw *gwv1.Gateway) *refusal {
	if len(gw.Spec.Addresses) > 0 {
		a := gw.Spec.Addresses[0]
		typ := string(gwv1.IPAddressType)
		if a.Type != nil {
			typ = string(*a.Type)
		}
		return &refusal{string(gwv1.GatewayReasonUnsupportedAddress),
			fmt.Sprintf("spec.addresses (%s %q) is not supported: the gateway's Service takes the address its load balancer assigns; remove spec.addresses", typ, a.Value)}
	}
	for _, l := range gw.Spec.Listeners {
		if use, ok := reservedPorts[l.Port]; ok {
			return &refusal{string(gwv1.GatewayReasonListenersNotValid),
				fmt.Sprintf("listener %s: port %d is the gateway proxy's %s port; use another port", l.Name, l.Port, use)}
		}
	}
	return nil
}

// asIngress turns a waypoint's objects (as Build makes them, before any
// patch) into an ingress gateway's.
func asIngress(o *Objects, gw *gwv1.Gateway) {
	pod := &o.Deployment.Spec.Template.Spec
	// Listeners on ports below 1024 bind without NET_BIND_SERVICE: a
	// namespaced sysctl, on Kubernetes' list of safe ones.
	pod.SecurityContext.Sysctls = []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}}
	c := &pod.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: apinames.ProxyModeEnv, Value: apinames.ProxyModeGateway})
	c.Ports = slices.DeleteFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == apinames.HBONEPort })
	ports := listenerPorts(gw)
	o.Service.Spec.Ports = append(ports, corev1.ServicePort{Name: "status-port", Port: PortStatus, TargetPort: intstr.FromInt32(PortStatus), Protocol: corev1.ProtocolTCP})
}

// listenerPorts are the Service ports of an ingress Gateway's listeners:
// one per distinct port (and transport protocol), in the order of the
// first listener that has it, named <protocol>-<port> after it.
func listenerPorts(gw *gwv1.Gateway) []corev1.ServicePort {
	type key struct {
		port  int32
		proto corev1.Protocol
	}
	seen := map[key]bool{}
	var out []corev1.ServicePort
	for _, l := range gw.Spec.Listeners {
		proto := corev1.ProtocolTCP
		if l.Protocol == gwv1.UDPProtocolType {
			proto = corev1.ProtocolUDP
		}
		k := key{int32(l.Port), proto}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, corev1.ServicePort{Name: portName(l.Protocol, k.port), Port: k.port, TargetPort: intstr.FromInt32(k.port), Protocol: proto})
	}
	return out
}

// portName names a listener's Service port <protocol>-<port>, lower-case,
// as Istio does; a protocol outside Gateway API's core set (a domain-
// prefixed one, say) cannot be part of a port name and gives port-<port>.
func portName(p gwv1.ProtocolType, port int32) string {
	switch p {
	case gwv1.HTTPProtocolType, gwv1.HTTPSProtocolType, gwv1.TLSProtocolType, gwv1.TCPProtocolType, gwv1.UDPProtocolType:
		return strings.ToLower(string(p)) + "-" + strconv.Itoa(int(port))
	}
	return "port-" + strconv.Itoa(int(port))
}

// supportedKinds are the route kinds a listener of protocol p admits by
// default (Gateway API's defaults by protocol): what its status says until
// the configuration controller has computed it.
func supportedKinds(p gwv1.ProtocolType) []gwv1.RouteGroupKind {
	g := ptr(gwv1.Group(gwv1.GroupName))
	kinds := func(ks ...gwv1.Kind) []gwv1.RouteGroupKind {
		out := []gwv1.RouteGroupKind{}
		for _, k := range ks {
			out = append(out, gwv1.RouteGroupKind{Group: g, Kind: k})
		}
		return out
	}
	switch p {
	case gwv1.HTTPProtocolType, gwv1.HTTPSProtocolType:
		return kinds("HTTPRoute", "GRPCRoute")
	case gwv1.TLSProtocolType:
		return kinds("TLSRoute")
	case gwv1.TCPProtocolType:
		return kinds("TCPRoute")
	case gwv1.UDPProtocolType:
		return kinds("UDPRoute")
	}
	return kinds()
}
