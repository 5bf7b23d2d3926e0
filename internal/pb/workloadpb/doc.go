// Package workloadpb holds the workload discovery resources, proto package
// istio.workload, that the control plane (istiod in Istio) streams to ztunnel
// and waypoints over delta xDS.
//
// Every resource is an [Address] holding either a [Workload], named by its
// uid, or a [Service], named "<namespace>/<hostname>". Both are also
// reachable by "<network>/<IP>" alias names.
//
// The messages are identical on the wire to Istio's, so the xDS type URL is
// [AddressTypeURL]. The Go code is generated from workload.proto by
// scripts/proto.sh; do not edit the *.pb.go files.
package workloadpb

// AddressTypeURL is the xDS type URL of [Address] resources.
const AddressTypeURL = "type.googleapis.com/istio.workload.Address"
