// Package podnet is the in-pod network layout that ztunnel and the CNI
// agent's redirection rules agree on (protocols.md §3.1 and §3.2, Istio's
// values): the ports ztunnel listens on inside each enrolled pod's network
// namespace, where the rules send the pod's traffic, and the packet marks
// that let ztunnel's own sockets through.
package podnet

import "github.com/weftmesh/weft/internal/apinames"

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
