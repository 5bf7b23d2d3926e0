// Package zds is the transport of ZDS, the node-local protocol over which the
// CNI node agent hands each enrolled pod's network namespace to ztunnel. Both
// ends use it: the node agent listens ([Listen], [Listener.Accept]) and
// ztunnel connects ([Dial]).
//
// Wire facts (identical to Istio's, see the zdspb package for the messages):
//
//   - A unix socket of type SOCK_SEQPACKET (Go network "unixpacket"),
//     [zdspb.DefaultSocketPath] by default. The listener removes a stale
//     socket file before it binds.
//   - One protobuf message per datagram, no length prefix. Receivers read
//     into a [zdspb.MaxMessageSize] (1 KiB) buffer; a truncated datagram
//     (MSG_TRUNC) or truncated ancillary data (MSG_CTRUNC) is a fatal error,
//     so senders refuse to send anything longer.
//   - An AddWorkload carries exactly one file descriptor, the pod's netns, as
//     SCM_RIGHTS ancillary data on the same sendmsg. Any other message with a
//     descriptor, an Add without one, or more than one descriptor is invalid.
//     Descriptors are received with MSG_CMSG_CLOEXEC and checked to be a
//     network namespace (the NS_GET_NSTYPE ioctl reports CLONE_NEWNET, or on
//     kernels without it fstatfs reports nsfs or proc). Every descriptor that
//     arrives with an invalid message is closed, so nothing leaks.
//
// Sequence (protocols.md §2.3): ztunnel sends a ZdsHello with version V1
// ([Conn.SendHello]); the node agent reads it within [HelloTimeout]
// ([Conn.RecvHello]). The node agent then sends a snapshot, one Add (with the
// netns) or Keep (uid only) per known pod, and SnapshotSent; afterwards only
// Add and Del. Each request is answered by exactly one WorkloadResponse with
// an Ack whose empty error means success; a non-empty error is a NACK,
// reported as a [*NackError]. Acks are matched to requests by order alone, so
// a Conn is used by one goroutine at a time and [Conn.Request] sends and
// awaits the ack under one [RequestTimeout] deadline. While idle, the node
// agent checks the peer every [LivenessInterval] with [Conn.Probe].
//
// Errors that wrap [ErrInvalid] describe a malformed but correctly framed
// message: a receiver should NACK it and carry on. Any other error from a
// receive (truncation, EOF, a deadline) means the connection is unusable.
package zds
