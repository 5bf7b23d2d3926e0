// Package podnet is the in-pod network layout that ztunnel and the CNI
// agent's redirection rules agree on (protocols.md §3.1 and §3.2, Istio's
// values): the ports ztunnel listens on inside each enrolled pod's network
// namespace, where the rules send the pod's traffic, and the packet marks
// that let ztunnel's own sockets through; and which addresses a mesh
// endpoint may have.
package podnet

import (
	"net/netip"

	"github.com/weftmesh/weft/internal/apinames"
)

// EndpointAddr reports whether a may be the address of an endpoint the
// mesh connects to (an EndpointSlice's, a ServiceEntry's or a
// WorkloadEntry's): a unicast address that is not loopback, unspecified,
// link-local, broadcast or of 0.0.0.0/8, as the API server requires of an
// EndpointSlice. Connecting to any other would reach the connecting
// proxy's own localhost-only ports, or the node's metadata service,
// outside any policy.
func EndpointAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsValid() && a.Zone() == "" && !a.IsUnspecified() && !a.IsLoopback() && !a.IsMulticast() &&
		!a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255}) &&
		!(a.Is4() && a.As4()[0] == 0)
}

// Ports ztunnel listens on inside each pod.
const (
	// OutboundPort takes the TCP connections the pod's app opens,
	// redirected.
	OutboundPort = 15001
	// InboundPlaintextPort takes TCP connections into the pod that did not
	// come through HBONE, redirected.
	InboundPlaintextPort = 15006
	// HBONEPort takes HBONE into the pod, addressed to it: the port
	// waypoints terminate HBONE on too.
	HBONEPort = apinames.HBONEPort
	// DNSPort is ztunnel's DNS proxy on the pod's loopback, UDP and TCP,
	// when DNS capture is on.
	DNSPort = 15053
)

// Marks.
const (
	// ZtunnelMark is the SO_MARK ztunnel sets on every socket it opens in
	// a pod; the rules redirect none of its traffic.
	ZtunnelMark uint32 = 0x539
	// ConnMark marks the connections ztunnel opened into the pod, so the
	// app's replies are routed back to ztunnel.
	ConnMark uint32 = 0x111
	// MarkMask masks both marks.
	MarkMask uint32 = 0xfff
)
