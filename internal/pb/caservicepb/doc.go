// Package caservicepb holds the gRPC stubs of the Istio CA service,
// istio.v1.auth.IstioCertificateService, whose messages are in package capb.
// The control plane serves it with these stubs; the data plane's clients
// call it with package grpcwire and capb's messages alone, so that they do
// not link the gRPC library.
//
// The Go code is generated from ca_service.proto by scripts/proto.sh; do not
// edit the *.pb.go files.
package caservicepb
