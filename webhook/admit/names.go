package admit

// User-facing names the rules read; they are Istio's.
const (
	LabelDataplaneMode        = "istio.io/dataplane-mode"
	LabelUseWaypoint          = "istio.io/use-waypoint"
	LabelUseWaypointNamespace = "istio.io/use-waypoint-namespace"
	LabelWaypointFor          = "istio.io/waypoint-for"
	LabelInjection            = "istio-injection"
	// LabelSidecarInject is both a Pod label and (older) a Pod annotation.
	LabelSidecarInject = "sidecar.istio.io/inject"

	AnnotationRedirection       = "ambient.istio.io/redirection"
	AnnotationDNSCapture        = "ambient.istio.io/dns-capture"
	AnnotationBypassInbound     = "ambient.istio.io/bypass-inbound-capture"
	AnnotationRerouteInterfaces = "istio.io/reroute-virtual-interfaces"
	AnnotationServiceAccount    = "gateway.istio.io/service-account"
	AnnotationNameOverride      = "gateway.istio.io/name-override"

	// WaypointClass is the GatewayClass of waypoints.
	WaypointClass = "istio-waypoint"
	// MeshListener, HBONEPort and ProtocolHBONE describe a waypoint's one listener.
	MeshListener  = "mesh"
	HBONEPort     = 15008
	ProtocolHBONE = "HBONE"

	ModeAmbient = "ambient"
	ModeNone    = "none"
	// WaypointNone opts a resource out of an inherited waypoint.
	WaypointNone = "none"

	WaypointForService  = "service"
	WaypointForWorkload = "workload"
	WaypointForAll      = "all"
	WaypointForNone     = "none"
)
