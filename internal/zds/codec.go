package zds

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weftmesh/weft/internal/pb/zdspb"
)

// Protocol timings (protocols.md §2.3).
const (
	// HelloTimeout bounds the node agent's wait for ztunnel's ZdsHello.
	HelloTimeout = 5 * time.Second
	// RequestTimeout bounds one request: the send and the wait for its ack.
	RequestTimeout = 5 * time.Second
	// LivenessInterval is how long a connection may be idle before the node
	// agent probes it.
	LivenessInterval = 5 * time.Second
	// ProbeWait is how long a liveness probe waits for an EOF.
	ProbeWait = 10 * time.Millisecond
)

// ErrInvalid is wrapped by errors about a received message that was framed
// correctly but breaks the protocol: undecodable bytes, an empty oneof, a
// missing uid, a netns descriptor where none belongs or none where one must
// be. The connection stays usable; the receiver should NACK the message.
var ErrInvalid = errors.New("invalid ZDS message")

// NackError is the error ztunnel returned in its Ack: it refused the request.
type NackError struct {
	Message string
}

func (e *NackError) Error() string {
	return "ztunnel refused the request: " + e.Message
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// AddRequest builds the Add for a pod. uid is the pod's metadata.uid; info
// carries its name, namespace and service account.
func AddRequest(uid string, info *zdspb.WorkloadInfo) *zdspb.WorkloadRequest {
	return &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{Uid: uid, WorkloadInfo: info}}}
}

// KeepRequest builds the snapshot-only Keep for a pod whose netns the node
// agent does not hold.
func KeepRequest(uid string) *zdspb.WorkloadRequest {
	return &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Keep{Keep: &zdspb.KeepWorkload{Uid: uid}}}
}

// DelRequest builds the Del for a pod.
func DelRequest(uid string) *zdspb.WorkloadRequest {
	return &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{Del: &zdspb.DelWorkload{Uid: uid}}}
}

// SnapshotSentRequest builds the marker that ends the snapshot.
func SnapshotSentRequest() *zdspb.WorkloadRequest {
	return &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_SnapshotSent{SnapshotSent: &zdspb.SnapshotSent{}}}
}

// IsAdd reports whether req is an Add, the only request that carries a netns.
func IsAdd(req *zdspb.WorkloadRequest) bool {
	_, ok := req.GetPayload().(*zdspb.WorkloadRequest_Add)
	return ok
}

// Kind names the payload of req for logs and errors: add, keep, del,
// snapshot_sent, or none.
func Kind(req *zdspb.WorkloadRequest) string {
	switch req.GetPayload().(type) {
	case *zdspb.WorkloadRequest_Add:
		return "add"
	case *zdspb.WorkloadRequest_Keep:
		return "keep"
	case *zdspb.WorkloadRequest_Del:
		return "del"
	case *zdspb.WorkloadRequest_SnapshotSent:
		return "snapshot_sent"
	default:
		return "none"
	}
}

// ValidateRequest checks req as a receiver would: a payload is set, Add,
// Keep and Del name a uid, and Add carries workload info. nfds is the number
// of descriptors that came with it: exactly one for an Add, none otherwise.
func ValidateRequest(req *zdspb.WorkloadRequest, nfds int) error {
	switch p := req.GetPayload().(type) {
	case *zdspb.WorkloadRequest_Add:
		if p.Add.GetUid() == "" {
			return invalidf("add without a uid")
		}
		if p.Add.GetWorkloadInfo() == nil {
			return invalidf("add for %q without workload_info", p.Add.GetUid())
		}
		if nfds != 1 {
			return invalidf("add for %q carries %d file descriptors, want exactly 1 (the netns)", p.Add.GetUid(), nfds)
		}
		return nil
	case *zdspb.WorkloadRequest_Keep:
		if p.Keep.GetUid() == "" {
			return invalidf("keep without a uid")
		}
	case *zdspb.WorkloadRequest_Del:
		if p.Del.GetUid() == "" {
			return invalidf("del without a uid")
		}
	case *zdspb.WorkloadRequest_SnapshotSent:
	default:
		return invalidf("request without a payload")
	}
	if nfds != 0 {
		return invalidf("%s carries %d file descriptors, want none", Kind(req), nfds)
	}
	return nil
}

// DecodeRequest decodes one WorkloadRequest datagram that arrived with nfds
// descriptors and validates it with [ValidateRequest].
func DecodeRequest(b []byte, nfds int) (*zdspb.WorkloadRequest, error) {
	req := &zdspb.WorkloadRequest{}
	if err := proto.Unmarshal(b, req); err != nil {
		return nil, invalidf("decoding WorkloadRequest: %v", err)
	}
	if err := ValidateRequest(req, nfds); err != nil {
		return nil, err
	}
	return req, nil
}

// DecodeResponse decodes one WorkloadResponse datagram, which must hold an
// Ack.
func DecodeResponse(b []byte) (*zdspb.WorkloadResponse, error) {
	resp := &zdspb.WorkloadResponse{}
	if err := proto.Unmarshal(b, resp); err != nil {
		return nil, invalidf("decoding WorkloadResponse: %v", err)
	}
	if resp.GetAck() == nil {
		return nil, invalidf("response without an ack")
	}
	return resp, nil
}

// DecodeHello decodes ztunnel's ZdsHello and requires version V1.
func DecodeHello(b []byte) (*zdspb.ZdsHello, error) {
	h := &zdspb.ZdsHello{}
	if err := proto.Unmarshal(b, h); err != nil {
		return nil, invalidf("decoding ZdsHello: %v", err)
	}
	if h.GetVersion() != zdspb.Version_V1 {
		return nil, invalidf("unsupported ZDS version %v, this node agent speaks V1", h.GetVersion())
	}
	return h, nil
}

// encode marshals m and refuses messages the peer could not receive whole.
func encode(m proto.Message) ([]byte, error) {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encoding %T: %w", m, err)
	}
	if len(b) > zdspb.MaxMessageSize {
		return nil, fmt.Errorf("encoding %T: %d bytes exceed the %d-byte ZDS datagram limit", m, len(b), zdspb.MaxMessageSize)
	}
	return b, nil
}
