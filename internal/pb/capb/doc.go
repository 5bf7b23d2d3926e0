// Package capb holds the Istio CA API, proto package istio.v1.auth: the unary
// gRPC call IstioCertificateService/CreateCertificate with which ztunnel and
// waypoints get SPIFFE workload certificates signed by the control plane
// (istiod in Istio, Weft's controlplane), on its xDS port 15012.
//
// The caller authenticates with its service-account token in the
// "authorization" (Bearer) and "clusterid" gRPC metadata. A node proxy may ask
// for the identity of a pod on its node by setting the string field
// [ImpersonatedIdentityKey] of [IstioCertificateRequest.Metadata]. The returned
// chain lists the leaf first and the root last.
//
// The service and messages are identical on the wire to Istio's. The Go code
// is generated from ca.proto by scripts/proto.sh; do not edit the *.pb.go
// files. The service's gRPC stubs are in package caservicepb, apart, so that
// a client (ztunnel's, over package grpcwire) can use the messages without
// linking the gRPC library.
//
// Because the proto names are Istio's, a binary must not also link Istio's
// own generated copy (istio.io/api/security/v1alpha1): the protobuf runtime
// refuses the duplicate registration at start-up.
package capb

// ImpersonatedIdentityKey is the field of [IstioCertificateRequest.Metadata]
// in which a trusted node proxy names the SPIFFE ID it requests a certificate
// for, when that is not its own.
const ImpersonatedIdentityKey = "ImpersonatedIdentity"

// CreateCertificateMethod is the gRPC method path of
// IstioCertificateService/CreateCertificate (the service's stubs are in
// package caservicepb).
const CreateCertificateMethod = "/istio.v1.auth.IstioCertificateService/CreateCertificate"
