// Package apinames holds the names of Weft's API that istio.io/api does not
// declare: Weft's own (the waypoint GatewayClass, its controller and its one
// listener), the values of Istio's labels and annotations, and the few Istio
// names missing from istio.io/api.
//
// Istio's label and annotation names themselves are read from
// istio.io/api/label and istio.io/api/annotation (label.IoIstioUseWaypoint.Name,
// ...); production code spells none of them as a literal. Tests may: a test
// that spells the wire name independently checks it.
package apinames

import "istio.io/api/label"

// The waypoint Gateway API: a Gateway of class WaypointClass, handled by the
// controller WaypointController, with exactly one listener {name:
// MeshListener, port: HBONEPort, protocol: ProtocolHBONE}.
const (
	// WaypointClass is the GatewayClass of waypoints (Istio's name).
	WaypointClass = "istio-waypoint"
	// WaypointController is the default controllerName of the waypoint
	// GatewayClass.
	WaypointController = "weft.dev/waypoint-controller"
	// MeshListener is the name of a waypoint's listener.
	MeshListener = "mesh"
	// HBONEPort is where waypoints and ztunnel terminate HBONE.
	HBONEPort = 15008
	// ProtocolHBONE is the protocol of a waypoint's listener.
	ProtocolHBONE = "HBONE"
	// MetricsPath is where ztunnel and waypoints serve Prometheus metrics
	// (on 15020), Envoy's path, which Istio's scrape annotations name.
	MetricsPath = "/stats/prometheus"
)

// Values of the label istio.io/dataplane-mode.
// The ingress Gateway API: a Gateway of class GatewayClass, handled by the
// controller GatewayController, is an ingress gateway: the waypoint's proxy
// in gateway mode (ProxyModeGateway), serving the Gateway's listeners on
// its ports, deployed as objects named after the Gateway with
// GatewaySuffix (Istio's names).
const (
	// GatewayClass is the GatewayClass of ingress gateways (Istio's name).
	GatewayClass = "istio"
	// GatewayController is the default controllerName of the ingress
	// GatewayClass.
	GatewayController = "weft.dev/gateway-controller"
	// GatewaySuffix ends the names of an ingress Gateway's Deployment,
	// Service and ServiceAccount: "<gateway>-istio", as Istio names them.
	GatewaySuffix = "-istio"
	// ProxyModeEnv is the waypoint binary's environment variable that
	// selects its mode: ProxyModeWaypoint (the default: HBONE on
	// HBONEPort) or ProxyModeGateway (the Listeners' own addresses and
	// ports, plain TCP or TLS, no HBONE server).
	ProxyModeEnv      = "PROXY_MODE"
	ProxyModeWaypoint = "waypoint"
	ProxyModeGateway  = "gateway"
)

const (
	ModeAmbient = "ambient"
	ModeNone    = "none"
)

// Values of the label istio.io/waypoint-for: which traffic a waypoint takes.
const (
	WaypointForService  = "service"
	WaypointForWorkload = "workload"
	WaypointForAll      = "all"
	WaypointForNone     = "none"
)

// WaypointFor is the traffic a waypoint takes, as istiod decides it: the
// istio.io/waypoint-for label of its Gateway, else of its GatewayClass,
// else service. A label whose value is none of the four is passed over, as
// if absent (the webhook refuses it on a Gateway; a GatewayClass is not
// admitted through it).
func WaypointFor(gatewayLabels, classLabels map[string]string) string {
	for _, l := range []map[string]string{gatewayLabels, classLabels} {
		switch v := l[label.IoIstioWaypointFor.Name]; v {
		case WaypointForService, WaypointForWorkload, WaypointForAll, WaypointForNone:
			return v
		}
	}
	return WaypointForService
}

// WaypointNone, as the value of istio.io/use-waypoint, opts a resource out of
// an inherited waypoint.
const WaypointNone = "none"

// Values of the annotation ambient.istio.io/redirection, written by the node
// agent.
const (
	// RedirectionEnabled: the pod's traffic is redirected to ztunnel.
	RedirectionEnabled = "enabled"
	// RedirectionPending: the pod is being enrolled.
	RedirectionPending = "pending"
)

// LabelInjection is Istio's namespace label of sidecar injection, which
// istio.io/api does not declare.
const LabelInjection = "istio-injection"
