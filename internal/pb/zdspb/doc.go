// Package zdspb holds the messages of ZDS, the protocol over which the
// istio-cni node agent (Weft's cni agent) hands each enrolled pod's network
// namespace to ztunnel on the same node.
//
// The messages travel one per datagram on a SOCK_SEQPACKET unix socket,
// [DefaultSocketPath] by default, where the node agent listens and ztunnel
// connects. An [AddWorkload] carries the pod's netns file descriptor as
// SCM_RIGHTS ancillary data. Every encoded message must fit in
// [MaxMessageSize] bytes. ztunnel opens with a [ZdsHello]; the node agent then
// sends [WorkloadRequest]s and ztunnel answers each with one
// [WorkloadResponse].
//
// The proto package is istio.workload.zds, identical on the wire to Istio's.
// The Go code is generated from zds.proto by scripts/proto.sh; do not edit the
// *.pb.go files.
package zdspb

const (
	// DefaultSocketPath is where the node agent listens and ztunnel connects
	// unless configured otherwise.
	DefaultSocketPath = "/var/run/ztunnel/ztunnel.sock"

	// MaxMessageSize is the size of the receive buffer both peers use. A
	// longer datagram is truncated, which the receiver treats as a fatal
	// protocol error.
	MaxMessageSize = 1024
)
