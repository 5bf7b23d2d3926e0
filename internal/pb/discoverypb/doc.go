// Package discoverypb holds the messages of Envoy's delta xDS stream as the
// data plane's xDS client (package xdsclient) uses them: the same bytes on
// the wire as Envoy's envoy.service.discovery.v3 messages, with only the
// fields the client reads or sends, under a proto package of Weft's own.
// It lets ztunnel speak xDS without linking Envoy's generated API, whose
// descriptors and code are a large share of a binary's size and start-up
// heap.
//
// The Go code is generated from discovery.proto by scripts/proto.sh; do not
// edit the *.pb.go files.
package discoverypb

// DeltaAggregatedResourcesMethod is the gRPC method path of the delta ADS
// stream.
const DeltaAggregatedResourcesMethod = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
