// Package clustertest holds the control plane's local-cluster tests: the
// chart's control-plane manifests installed into the local cluster
// (test/cluster: real API server, scheduler, controller manager, nodes and
// pods in network namespaces), a ztunnel-shaped xDS client watching real
// pods, Services and EndpointSlices come and go, and the CA's impersonation
// matrix with tokens of real pods on two nodes.
//
// The tests reach the control plane from the host through a loopback
// forwarder that dials from inside the control plane pod's own network
// namespace, so no address of the test topology is used outside it. They run
// as root with WEFT_ROOT_TESTS=1 (`make test`).
package clustertest
