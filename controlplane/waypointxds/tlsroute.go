package waypointxds

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func tlsSource(r *gwv1.TLSRoute) *source {
	return &source{key: r.Namespace + "/" + r.Name, kind: kindTLSRoute, ns: r.Namespace, name: r.Name, created: r.CreationTimestamp, hostnames: r.Spec.Hostnames,
		rules: streamRules(r.Spec.Rules, func(rr gwv1.TLSRouteRule) []gwv1.BackendRef { return rr.BackendRefs })}
}

// tlsListenerMode checks a TLS listener's tls.mode and, in Passthrough,
// its other settings: Passthrough relays the connection to the backend,
// which ends TLS (no options; certificates are ignored, as Gateway API
// says, and the Accepted message says so); Terminate (Gateway API's
// default, the extended feature TLSRouteModeTerminate) ends TLS at the
// gateway with the listener's certificates, checked as an HTTPS
// listener's (gatewayBuild.tls). Another mode is UnsupportedValue.
func tlsListenerMode(gl *gwListener) {
	t := gl.spec.TLS
	switch mode := tlsMode(t); {
	case mode == gwv1.TLSModeTerminate:
	case mode != gwv1.TLSModePassthrough:
		gl.accepted = no(gwv1.ListenerReasonUnsupportedValue, "tls.mode %s is not supported on a TLS listener: use Passthrough (the backend ends TLS) or Terminate (the gateway does)", mode)
	case len(t.Options) > 0:
		gl.accepted = no(gwv1.ListenerReasonUnsupportedValue, "tls.options are not supported (%s)", optionNames(t.Options))
	case len(t.CertificateRefs) > 0:
		gl.accepted.message = "listener accepted; its tls.certificateRefs are ignored: in Passthrough mode the backend ends TLS"
	}
}

// tlsRoutes decides which TLSRoute serves each server name of a port's TLS
// listeners. A name a more specific HTTPS or TLS listener of the port
// equals or covers is left to it (listener isolation, as for HTTP); of the
// routes that claim the same name the oldest (then the first by
// namespace/name) takes it. A route with other than one rule, or left
// without names on a listener, is detached from it; a parentRef left
// attached to no listener is Accepted=False (UnsupportedValue or
// Conflicted).
func (g *gatewayBuild) tlsRoutes() {
	d := detachments{}
	byPort := map[gwv1.PortNumber][]*gwListener{}
	for _, gl := range g.listeners {
		if gl.usable() && gl.tlsClass() {
			byPort[gl.spec.Port] = append(byPort[gl.spec.Port], gl)
		}
	}
	for _, port := range slices.Sorted(maps.Keys(byPort)) {
		ls := byPort[port]
		owner := map[string]*source{} // server name → the route that has it
		for _, gl := range ls {
			if gl.spec.Protocol == gwv1.TLSProtocolType {
				g.claimNames(gl, ls, owner, &d)
			}
		}
	}
	g.settle(d)
}

// claimNames gives the routes of TLS listener gl, oldest first, the server
// names no other listener of the port (ls) claims and no older route has
// (owner), and drops the routes left with none.
func (g *gatewayBuild) claimNames(gl *gwListener, ls []*gwListener, owner map[string]*source, d *detachments) {
	sort.SliceStable(gl.routes, func(i, j int) bool { return older(gl.routes[i].src, gl.routes[j].src) })
	var kept []attachedRoute
	for _, ar := range gl.routes {
		if len(ar.src.rules) != 1 {
			d.lose(&ar, oneRule(ar.src))
			continue
		}
		var hosts, taken []string
		for _, h := range ar.hosts {
			switch {
			case claimedElsewhere(h, gl, ls):
				g.b.note("%s %s: server name %s on listener %s of Gateway %s/%s belongs to a listener with a more specific hostname",
					ar.src.kind, ar.src.key, h, gl.spec.Name, g.gw.Namespace, g.gw.Name)
			case owner[h] != nil:
				taken = append(taken, h+" ("+owner[h].kind+" "+owner[h].key+")")
			default:
				owner[h] = ar.src
				hosts = append(hosts, h)
			}
		}
		if len(taken) > 0 && len(hosts) > 0 {
			g.b.note("%s %s: on listener %s of Gateway %s/%s older routes have server names %s",
				ar.src.kind, ar.src.key, gl.spec.Name, g.gw.Namespace, g.gw.Name, strings.Join(taken, ", "))
		}
		if len(hosts) == 0 {
			why := "listeners of the port with a more specific hostname take them"
			if len(taken) > 0 {
				why = "older routes have them (of the routes with a server name the oldest, then the first by namespace/name, takes it): " + strings.Join(taken, ", ")
			}
			d.lose(&ar, problem{ReasonConflicted, fmt.Sprintf("on listener %s of Gateway %s/%s no server name of the route is left: %s",
				gl.spec.Name, g.gw.Namespace, g.gw.Name, why)})
			continue
		}
		sort.Strings(hosts)
		ar.hosts = hosts
		d.keep(&ar)
		kept = append(kept, ar)
	}
	gl.routes = kept
}

// tlsChains are a TLS listener's chains, one per route: selected by the
// route's server names ("*": any, a chain listing none), with the network
// RBAC filters, then a tcp_proxy to the route's backends. In Passthrough
// mode a chain has no transport socket: the connection goes on as it
// came, ClientHello and all, and the backend ends TLS. In Terminate mode
// it ends TLS with the listener's certificates (no ALPN: what TLS carries
// is not HTTP to the gateway) and relays the decrypted bytes.
// A listener with a hostname that no route of it lists keeps it with a
// holdChain.
func (g *gatewayBuild) tlsChains(port string, gl *gwListener, policies []*securityv1.AuthorizationPolicy) []*listenerv3.FilterChain {
	held := gl.hostname != "" && !slices.ContainsFunc(gl.routes, func(ar attachedRoute) bool { return slices.Contains(ar.hosts, gl.hostname) })
	var out []*listenerv3.FilterChain
	if held {
		out = append(out, g.holdChain(port, gl, policies))
	}
	if len(gl.routes) == 0 {
		return out
	}
	rbac := g.b.netRBACFilters(policies, nil)
	for _, ar := range gl.routes {
		g.translated[ar.src.id()] = true
		name := "tls/" + port + "/" + string(gl.spec.Name) + "/" + ar.src.key
		var m *listenerv3.FilterChainMatch
		if !slices.Contains(ar.hosts, "*") {
			m = &listenerv3.FilterChainMatch{ServerNames: ar.hosts}
		}
		proxy := g.b.tcpBackends(ar.src, "tls."+port+"."+string(gl.spec.Name)+"."+ar.src.key)
		fc := tcpChain(name, m, rbac, proxy)
		if gl.terminates() {
			fc.TransportSocket = downstreamTLS(gl.certs, nil)
		}
		out = append(out, fc)
	}
	return out
}
