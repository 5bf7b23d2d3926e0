package proxy

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/weftmesh/weft/internal/podnet"
	"github.com/weftmesh/weft/ztunnel/state"
)

// A connection that reaches one of ztunnel's listeners without being
// redirected reads that listener as its original destination. Connecting
// there hands the connection back to ztunnel, which connects again: one
// connection becomes an endless chain until file descriptors run out.
// So, as Istio's ztunnel does, ztunnel never connects to its own ports
// (15001, 15006, 15008 and 15053): not inbound (a plaintext connection's
// original destination or an HBONE target, on any address), and not
// outbound to the pod's own addresses or as a tunnel's target, direct or
// through a Service VIP whose target port is one (the destination's
// ztunnel would refuse it; refusing at the source costs no connection).
// ztunnel's admin, metrics and readiness ports (15000, 15020, 15021) are
// in ztunnel's own network namespace, not the pod's: reaching them from a
// pod is one hop, never a loop, and Prometheus in the mesh scrapes 15020,
// so they are not refused.
//
// Loopback, unspecified, multicast and broadcast addresses are refused in
// both directions: the redirection rules never capture loopback
// traffic, so such a target comes from a direct connection to a ztunnel
// port or from xDS (a WorkloadEntry at 127.0.0.1), and connecting there
// from inside the pod would reach the pod's localhost-only ports, or
// ztunnel's own listeners, outside any policy.

// A next hop that xDS chose (a Service's endpoint, a peer's ztunnel, a
// waypoint) is also never link-local: no pod or Service endpoint has such
// an address (the API server refuses them in EndpointSlices), so one comes
// from a WorkloadEntry or ServiceEntry endpoint that slipped past the
// webhook, and would send the pod's traffic to the node's link-local
// services (cloud metadata at 169.254.169.254) under the Service's name.
// A pod that dials a link-local address itself (passthrough) still
// reaches it, and so does a ServiceEntry host that ztunnel resolves by DNS
// (the name is the entry's own, as a client's lookup would be).

// ownPort reports whether port is one of ztunnel's listeners in a pod.
func ownPort(port uint16) bool {
	switch port {
	case podnet.OutboundPort, podnet.InboundPlaintextPort, podnet.HBONEPort, podnet.DNSPort:
		return true
	}
	return false
}

var (
	localhost4 = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	broadcast4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})
)

// unroutable reports the addresses ztunnel never connects to for a pod.
func (p *Pod) unroutable(a netip.Addr) bool {
	a = a.Unmap()
	if p.cfg.loopbackPods && a.Is4() && a.IsLoopback() && a != localhost4 {
		return false
	}
	return !a.IsValid() || a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() ||
		a == broadcast4 || a.Is4() && a.As4()[0] == 0 // 0.0.0.0/8 is "this network"
}

// linkLocal reports a link-local unicast or multicast address, in any
// form.
func linkLocal(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()
}

// checkTarget refuses an unroutable target, and one on a ztunnel port when
// ports is set.
func (p *Pod) checkTarget(dst netip.AddrPort, ports bool) error {
	if p.unroutable(dst.Addr()) {
		return fmt.Errorf("target %s refused: a loopback, unspecified or multicast address", dst)
	}
	if ports && ownPort(dst.Port()) {
		return fmt.Errorf("target %s refused: one of ztunnel's own ports (it would loop)", dst)
	}
	return nil
}

// checkOutbound refuses an outbound connection that would loop or leave
// for an unroutable address: the original destination, then where route
// sends it.
func (p *Pod) checkOutbound(src *state.Workload, dst netip.AddrPort, route *state.Route) error {
	self := func(a netip.Addr) bool { return slices.Contains(src.IPs, a.Unmap()) }
	if route == nil {
		return p.checkTarget(dst, self(dst.Addr()))
	}
	if route.Kind != state.Passthrough && route.Host == "" && linkLocal(route.Addr.Addr()) {
		return fmt.Errorf("next hop %s refused: a link-local address", route.Addr)
	}
	switch route.Kind {
	case state.Passthrough, state.Plain:
		return p.checkTarget(route.Addr, self(route.Addr.Addr()))
	case state.Tunnel:
		if err := p.checkTarget(route.Addr, false); err != nil {
			return err
		}
		return p.checkTarget(route.Authority, true)
	default: // Waypoint: the waypoint resolves a service's port itself
		if err := p.checkTarget(route.Addr, false); err != nil {
			return err
		}
		return p.checkTarget(route.Authority, route.Service == nil)
	}
}
