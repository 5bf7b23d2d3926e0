// Package e2e holds the CNI agent's end-to-end tests on the local cluster
// (test/cluster): the chart's agent on a real node runner, real CNI chains,
// real network namespaces and a stand-in ztunnel on the node's ZDS socket.
package e2e
