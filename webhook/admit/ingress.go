package admit

import (
	"fmt"
	"slices"

	"istio.io/api/annotation"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/internal/apinames"
)

// ingressClass reports whether Gateways of class are Weft's ingress
// gateways: class istio, unless its GatewayClass names another controller
// (the chart's class can be turned off and the name left to someone else).
// A class not found yet is taken as Weft's: its name is.
func (a *Admitter) ingressClass(class string) bool {
	if class != apinames.GatewayClass {
		return false
	}
	gc, err := a.cfg.Gateways.GatewayClass(class)
	return err != nil || gc == nil || string(gc.Spec.ControllerName) == apinames.GatewayController
}

// ingressServiceTypes are the values of networking.istio.io/service-type
// an ingress gateway's Service may take.
var ingressServiceTypes = []string{string(corev1.ServiceTypeLoadBalancer), string(corev1.ServiceTypeClusterIP), string(corev1.ServiceTypeNodePort)}

// ingressProtocols are the listener protocols an ingress gateway serves.
var ingressProtocols = []gwv1.ProtocolType{gwv1.HTTPProtocolType, gwv1.HTTPSProtocolType, gwv1.TLSProtocolType, gwv1.TCPProtocolType}

// validateIngress checks an ingress Gateway. It refuses only what can never
// work: objects it cannot name, a Service type that does not exist,
// listeners that one port cannot serve together, features Weft would
// otherwise drop without a word. What a listener's status reports in
// Gateway API's own terms (a protocol not served, a certificate reference
// that does not resolve, route kinds) is admitted with a warning, so that
// the status says it where Gateway API tools look.
func validateIngress(rep *report, gw *gwv1.Gateway, ns string) {
	if gw.Name != "" {
		name := gw.Name + apinames.GatewaySuffix
		if errs := validation.IsDNS1035Label(name); len(errs) > 0 {
			rep.deny("ingress-name", "metadata.name",
				"%s cannot name the gateway's Service and Deployment %s (%s); use at most %d lower-case letters, digits and '-', starting with a letter",
				q(gw.Name), q(name), errs[0], validation.DNS1035LabelMaxLength-len(apinames.GatewaySuffix))
		}
	}
	if v, ok := gw.Annotations[annotation.NetworkingServiceType.Name]; ok {
		field := labelField("metadata.annotations", annotation.NetworkingServiceType.Name)
		if checkValue(rep, "ingress-service-type", field, v) && !slices.Contains(ingressServiceTypes, v) {
			rep.deny("ingress-service-type", field, "Unsupported value %s: use %s", q(v), oneOf(ingressServiceTypes...))
		}
	}
	checkIngressListeners(rep, gw, ns)
	if len(gw.Spec.Addresses) > 0 {
		rep.warn("ingress-addresses", "spec.addresses",
			"not supported, so the Gateway is reported Accepted=False (UnsupportedAddress); remove it")
	}
	if gw.Spec.AllowedListeners != nil {
		rep.deny("ingress-listener-sets", "spec.allowedListeners", "ingress gateways take no ListenerSets yet; remove spec.allowedListeners")
	}
	if gw.Spec.TLS != nil {
		rep.deny("ingress-gateway-tls", "spec.tls",
			"not supported: Weft's ingress gateways neither validate client certificates nor present one to backends; remove spec.tls")
	}
	if inf := gw.Spec.Infrastructure; inf != nil {
		checkInfrastructure(rep, inf)
	}
}

// portFamily groups the protocols that can share a port: HTTP alone (the
// bytes say nothing of the host before the request), HTTPS and TLS (told
// apart by SNI), TCP alone, UDP alone.
func portFamily(p gwv1.ProtocolType) string {
	switch p {
	case gwv1.HTTPSProtocolType, gwv1.TLSProtocolType:
		return "TLS"
	}
	return string(p)
}

func checkIngressListeners(rep *report, gw *gwv1.Gateway, ns string) {
	type seen struct {
		i    int
		l    *gwv1.Listener
		host string
	}
	byPort := map[gwv1.PortNumber][]seen{}
	for i := range gw.Spec.Listeners {
		l := &gw.Spec.Listeners[i]
		field := fmt.Sprintf("spec.listeners[%d]", i)
		host := ""
		if l.Hostname != nil {
			host = string(*l.Hostname)
		}
		if !slices.Contains(ingressProtocols, l.Protocol) {
			rep.warn("ingress-listener-protocol", field+".protocol",
				"listener %s serves nothing: only HTTP, HTTPS, TLS and TCP are (UnsupportedProtocol)", q(string(l.Name)))
		}
		for _, o := range byPort[l.Port] {
			switch {
			case portFamily(o.l.Protocol) != portFamily(l.Protocol):
				rep.deny("ingress-listener-conflict", field+".protocol",
					"listeners %s (%s) and %s (%s) share port %d, which one port cannot serve together; give them different ports",
					q(string(o.l.Name)), o.l.Protocol, q(string(l.Name)), l.Protocol, l.Port)
			case o.host == host && o.l.Protocol != l.Protocol:
				rep.deny("ingress-listener-conflict", field+".hostname",
					"listeners %s (%s) and %s (%s) share port %d and hostname %s, so a client's SNI cannot choose between them; give them different hostnames or ports",
					q(string(o.l.Name)), o.l.Protocol, q(string(l.Name)), l.Protocol, l.Port, q(orAny(host)))
			}
		}
		byPort[l.Port] = append(byPort[l.Port], seen{i, l, host})
		checkIngressTLS(rep, ns, field, l)
		if ar := l.AllowedRoutes; ar != nil {
			for j, k := range ar.Kinds {
				if !ingressRouteKind(l.Protocol, k) {
					rep.warn("ingress-route-kinds", fmt.Sprintf("%s.allowedRoutes.kinds[%d]", field, j),
						"%s: not a kind the listener takes (InvalidRouteKinds)", q(routeKindName(k)))
				}
			}
		}
	}
}

func orAny(host string) string {
	if host == "" {
		return "(any)"
	}
	return host
}

// ingressRouteKind reports whether a listener of protocol p takes routes
// of kind k: HTTPRoute and GRPCRoute on HTTP and HTTPS, TLSRoute on TLS,
// TCPRoute on TCP.
func ingressRouteKind(p gwv1.ProtocolType, k gwv1.RouteGroupKind) bool {
	var kinds []gwv1.Kind
	switch p {
	case gwv1.HTTPProtocolType, gwv1.HTTPSProtocolType:
		kinds = []gwv1.Kind{"HTTPRoute", "GRPCRoute"}
	case gwv1.TLSProtocolType:
		kinds = []gwv1.Kind{"TLSRoute"}
	case gwv1.TCPProtocolType:
		kinds = []gwv1.Kind{"TCPRoute"}
	default:
		return true // the listener itself is reported
	}
	if k.Group != nil && *k.Group != gwv1.GroupName {
		return false
	}
	return slices.Contains(kinds, k.Kind)
}

// checkIngressTLS checks a listener's tls. HTTPS, and TLS in mode
// Terminate (the API's default mode), end TLS with certificates from
// Secrets; TLS in mode Passthrough relays it to the backend; HTTP has
// none.
func checkIngressTLS(rep *report, ns, field string, l *gwv1.Listener) {
	switch l.Protocol {
	case gwv1.HTTPProtocolType:
		if l.TLS != nil {
			rep.deny("ingress-listener-tls", field+".tls", "an HTTP listener has no TLS; remove tls, or use protocol HTTPS")
		}
		return
	case gwv1.HTTPSProtocolType:
		if l.TLS == nil {
			rep.deny("ingress-listener-tls", field+".tls", "an HTTPS listener terminates TLS with a certificate; add tls.certificateRefs naming a kubernetes.io/tls Secret")
			return
		}
		if l.TLS.Mode != nil && *l.TLS.Mode == gwv1.TLSModePassthrough {
			rep.deny("ingress-listener-tls", field+".tls.mode",
				"an HTTPS listener terminates TLS; for passthrough use protocol TLS with a TLSRoute, or remove mode")
		}
	case gwv1.TLSProtocolType:
		switch t := l.TLS; {
		case t == nil:
			rep.deny("ingress-listener-tls", field+".tls",
				"a TLS listener needs tls: mode Passthrough (the backend ends TLS), or Terminate with tls.certificateRefs naming a kubernetes.io/tls Secret")
			return
		case t.Mode != nil && *t.Mode == gwv1.TLSModePassthrough:
			checkIngressPassthrough(rep, field, l)
			return
		case t.Mode != nil && *t.Mode != gwv1.TLSModeTerminate:
			rep.warn("ingress-listener-tls", field+".tls.mode", "%s is not served on TLS (UnsupportedValue); use Passthrough or Terminate", *t.Mode)
			return
		}
	default:
		return
	}
	checkIngressTerminate(rep, ns, field, l.TLS)
}

// checkIngressTerminate checks the tls of a listener that ends TLS: no
// options, certificates from core Secrets. A reference that cannot
// resolve is warned about: the listener's status reports it
// (InvalidCertificateRef), and the Secret or the ReferenceGrant may come
// later.
func checkIngressTerminate(rep *report, ns, field string, t *gwv1.ListenerTLSConfig) {
	if len(t.Options) > 0 {
		rep.deny("ingress-listener-tls", field+".tls.options", "Weft's ingress gateways take no TLS options; remove tls.options")
	}
	for j, ref := range t.CertificateRefs {
		rf := fmt.Sprintf("%s.tls.certificateRefs[%d]", field, j)
		if (ref.Group != nil && *ref.Group != "") || (ref.Kind != nil && *ref.Kind != "Secret") {
			rep.warn("ingress-certificate-ref", rf,
				"not a core Secret, so ResolvedRefs=False (InvalidCertificateRef)")
			continue
		}
		if ref.Namespace != nil && string(*ref.Namespace) != ns {
			rep.warn("ingress-certificate-ref", rf+".namespace",
				"used only while a ReferenceGrant in %s allows it", *ref.Namespace)
		}
	}
}

// checkIngressPassthrough checks a TLS listener's tls in Passthrough (the
// backend ends TLS): no options; certificates, which Gateway API ignores
// in Passthrough mode, are warned about.
func checkIngressPassthrough(rep *report, field string, l *gwv1.Listener) {
	switch t := l.TLS; {
	case len(t.Options) > 0:
		rep.deny("ingress-listener-tls", field+".tls.options", "Weft's ingress gateways take no TLS options; remove tls.options")
	case len(t.CertificateRefs) > 0:
		rep.warn("ingress-listener-tls", field+".tls.certificateRefs", "ignored: in Passthrough the backend ends TLS; remove them")
	}
}

// routeKindName is a route kind as a message shows it: with its group
// when that is not Gateway API's.
func routeKindName(k gwv1.RouteGroupKind) string {
	if k.Group != nil && *k.Group != gwv1.GroupName {
		return string(*k.Group) + "/" + string(k.Kind)
	}
	return string(k.Kind)
}
