// Package securitypb holds the L4 authorization resources, proto package
// istio.security, that the control plane (istiod in Istio) streams to ztunnel
// over delta xDS next to the workload resources of package workloadpb.
//
// Each [Authorization] is one AuthorizationPolicy reduced to what a node proxy
// can enforce on connection attributes: source identity, namespace and IP,
// destination IP and port.
//
// The messages are identical on the wire to Istio's, so the xDS type URL is
// [AuthorizationTypeURL]. The Go code is generated from authorization.proto by
// scripts/proto.sh; do not edit the *.pb.go files.
package securitypb

// AuthorizationTypeURL is the xDS type URL of [Authorization] resources.
const AuthorizationTypeURL = "type.googleapis.com/istio.security.Authorization"
