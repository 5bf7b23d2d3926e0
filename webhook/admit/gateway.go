package admit

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"istio.io/api/annotation"
	"istio.io/api/label"
	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/internal/apinames"
)

var waypointForValues = []string{apinames.WaypointForService, apinames.WaypointForWorkload, apinames.WaypointForAll, apinames.WaypointForNone}

// validateGateway checks a Gateway of class istio-waypoint, or an ingress
// Gateway (validateIngress); other classes pass untouched.
func (a *Admitter) validateGateway(rv *review) {
	var gw gwv1.Gateway
	if !rv.decodeObject(&gw, nil) {
		return
	}
	if a.ingressClass(string(gw.Spec.GatewayClassName)) {
		ns := gw.Namespace
		if rv.req.Namespace != "" {
			ns = rv.req.Namespace
		}
		validateIngress(&rv.rep, &gw, ns)
		return
	}
	if gw.Spec.GatewayClassName != apinames.WaypointClass {
		rv.rep.skip()
		return
	}
	rep := &rv.rep
	checkWaypointName(rep, &gw)
	if v, ok := gw.Labels[label.IoIstioWaypointFor.Name]; ok {
		field := labelField("metadata.labels", label.IoIstioWaypointFor.Name)
		if checkValue(rep, "waypoint-for", field, v) && !slices.Contains(waypointForValues, v) {
			rep.deny("waypoint-for", field, "Unsupported value %s: use %s", q(v), oneOf(waypointForValues...))
		}
	}
	if v, ok := gw.Annotations[annotation.GatewayServiceAccount.Name]; ok {
		field := labelField("metadata.annotations", annotation.GatewayServiceAccount.Name)
		if checkValue(rep, "gateway-annotations", field, v) {
			if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
				rep.deny("gateway-annotations", field, "%s is not a ServiceAccount name (%s); fix or remove it", q(v), errs[0])
			}
		}
	}
	checkWaypointListeners(rep, gw.Spec.Listeners)
	checkWaypointAddresses(rep, gw.Spec.Addresses)
	if gw.Spec.AllowedListeners != nil {
		rep.deny("waypoint-listener-sets", "spec.allowedListeners", "waypoints take no ListenerSets; remove spec.allowedListeners")
	}
	if gw.Spec.TLS != nil {
		rep.warn("waypoint-tls", "spec.tls", "ignored: waypoints use the mesh's own certificates; remove it")
	}
	if inf := gw.Spec.Infrastructure; inf != nil {
		checkInfrastructure(rep, inf)
	}
}

// checkWaypointName checks that the waypoint's Deployment and Service,
// which take the Gateway's name (or its name-override annotation), can
// exist: a Service name is a DNS-1035 label.
func checkWaypointName(rep *report, gw *gwv1.Gateway) {
	name, field := gw.Name, "metadata.name"
	if v, ok := gw.Annotations[annotation.GatewayNameOverride.Name]; ok {
		field = labelField("metadata.annotations", annotation.GatewayNameOverride.Name)
		if !checkValue(rep, "waypoint-name", field, v) {
			return
		}
		name = v
	}
	if name == "" {
		return // generateName: the API server names it later
	}
	if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
		rep.deny("waypoint-name", field,
			"%s cannot name the waypoint's Service and Deployment (%s); use at most 63 lower-case letters, digits and '-', starting with a letter",
			q(name), errs[0])
	}
}

func checkWaypointListeners(rep *report, ls []gwv1.Listener) {
	const want = "{name: mesh, port: 15008, protocol: HBONE}"
	switch {
	case len(ls) == 0:
		rep.deny("waypoint-listeners", "spec.listeners", "a waypoint has exactly one listener %s; add it", want)
	case len(ls) > 1:
		rep.deny("waypoint-listeners", "spec.listeners", "a waypoint has exactly one listener %s, this one has %d; keep only that one", want, len(ls))
	}
	for i, l := range ls {
		field := fmt.Sprintf("spec.listeners[%d]", i)
		if l.Name != apinames.MeshListener {
			rep.deny("waypoint-listeners", field+".name", "Invalid value %s: the waypoint listener is named mesh; set name: mesh", q(string(l.Name)))
		}
		if l.Port != apinames.HBONEPort {
			rep.deny("waypoint-listeners", field+".port", "Invalid value %d: waypoints take HBONE on port 15008; set port: 15008", l.Port)
		}
		if l.Protocol != apinames.ProtocolHBONE {
			rep.deny("waypoint-listeners", field+".protocol", "Invalid value %s: set protocol: HBONE", q(string(l.Protocol)))
		}
		if l.Hostname != nil {
			rep.deny("waypoint-listeners", field+".hostname", "a waypoint listener serves every host; remove hostname")
		}
		if l.TLS != nil {
			rep.deny("waypoint-listeners", field+".tls", "HBONE runs over the mesh's own mutual TLS; remove tls")
		}
	}
}

// checkWaypointAddresses allows what the waypoint's ClusterIP Service can
// take: nothing (Kubernetes picks), or one IPv4 and/or one IPv6 ClusterIP.
func checkWaypointAddresses(rep *report, addrs []gwv1.GatewaySpecAddress) {
	if len(addrs) > 2 {
		rep.deny("waypoint-addresses", "spec.addresses",
			"a waypoint's Service takes at most one IPv4 and one IPv6 address, this Gateway has %d; remove the rest", len(addrs))
		return
	}
	var seen4, seen6 bool
	for i, ad := range addrs {
		field := fmt.Sprintf("spec.addresses[%d]", i)
		t := gwv1.IPAddressType
		if ad.Type != nil {
			t = *ad.Type
		}
		if t != gwv1.IPAddressType {
			rep.deny("waypoint-addresses", field+".type",
				"Unsupported value %s: Weft creates the waypoint's ClusterIP Service itself; use type IPAddress or remove spec.addresses", q(string(t)))
			continue
		}
		if !checkValue(rep, "waypoint-addresses", field+".value", ad.Value) {
			continue
		}
		ip, err := netip.ParseAddr(ad.Value)
		if err != nil || ip.Zone() != "" {
			rep.deny("waypoint-addresses", field+".value", "%s is not an IP address; give a ClusterIP or remove spec.addresses", q(ad.Value))
			continue
		}
		ip = ip.Unmap()
		if ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() {
			rep.deny("waypoint-addresses", field+".value", "%s cannot be a Service's ClusterIP; give an address from the Service range", q(ad.Value))
			continue
		}
		if (ip.Is4() && seen4) || (ip.Is6() && seen6) {
			rep.deny("waypoint-addresses", field+".value", "a second address of the same family; keep one IPv4 and one IPv6 address at most")
		}
		seen4, seen6 = seen4 || ip.Is4(), seen6 || ip.Is6()
	}
}

// checkInfrastructure checks the labels and annotations Weft copies onto
// the waypoint's Deployment, Service and pods: they must be valid there and
// carry no control characters.
func checkInfrastructure(rep *report, inf *gwv1.GatewayInfrastructure) {
	for _, k := range slices.Sorted(maps.Keys(inf.Labels)) {
		field := labelField("spec.infrastructure.labels", string(k))
		v := string(inf.Labels[k])
		if errs := content.IsLabelKey(string(k)); len(errs) > 0 {
			rep.deny("waypoint-infrastructure", field, "the key is not a label key (%s); fix it", errs[0])
			continue
		}
		if !checkValue(rep, "waypoint-infrastructure", field, v) {
			continue
		}
		if errs := content.IsLabelValue(v); len(errs) > 0 {
			rep.deny("waypoint-infrastructure", field, "%s is not a label value (%s); fix it", q(v), errs[0])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(inf.Annotations)) {
		field := labelField("spec.infrastructure.annotations", string(k))
		if errs := content.IsLabelKey(string(k)); len(errs) > 0 {
			rep.deny("waypoint-infrastructure", field, "the key is not an annotation key (%s); fix it", errs[0])
			continue
		}
		v := string(inf.Annotations[k])
		if r, bad := badChar(v); bad {
			rep.deny("waypoint-infrastructure", field, "the value holds the character %U, which is not allowed; remove it", r)
		}
	}
}

// defaultGateway gives a waypoint Gateway without listeners the mesh
// listener. It adds nothing that is already there, so a second call
// patches nothing. It leaves istio.io/waypoint-for unset when it is: the
// Gateway then takes its GatewayClass's value, or service.
func (a *Admitter) defaultGateway(rv *review) {
	var gw gwv1.Gateway
	if !rv.decodeObject(&gw, nil) {
		return
	}
	if gw.Spec.GatewayClassName != apinames.WaypointClass {
		rv.rep.skip()
		return
	}
	rep := &rv.rep
	if len(gw.Spec.Listeners) == 0 {
		rep.patch = append(rep.patch, patchOp{Op: "add", Path: "/spec/listeners", Value: []map[string]any{
			{"name": apinames.MeshListener, "port": apinames.HBONEPort, "protocol": apinames.ProtocolHBONE},
		}})
	}
}

// waypointFor is the traffic a waypoint Gateway takes: its own
// istio.io/waypoint-for, else its GatewayClass's, else service; from says
// where the value came from, for messages.
func (a *Admitter) waypointFor(gw *gwv1.Gateway) (wf, from string) {
	var classLabels map[string]string
	class := string(gw.Spec.GatewayClassName)
	if gc, err := a.cfg.Gateways.GatewayClass(class); err == nil && gc != nil {
		classLabels = gc.Labels
	}
	wf = apinames.WaypointFor(gw.Labels, classLabels)
	switch {
	case gw.Labels[label.IoIstioWaypointFor.Name] == wf:
		return wf, "istio.io/waypoint-for=" + q(wf)
	case classLabels[label.IoIstioWaypointFor.Name] == wf:
		return wf, fmt.Sprintf("istio.io/waypoint-for=%s from its GatewayClass %s", q(wf), class)
	}
	return wf, "no istio.io/waypoint-for (so " + q(wf) + ")"
}
