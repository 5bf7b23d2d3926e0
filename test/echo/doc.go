// Package echo is the test workload of Weft's end-to-end tests and demo, in
// the spirit of Istio's echo app: a [Server] that answers every request with
// who it is (pod, namespace, service account, node) and what it saw (protocol,
// peer address, host, request headers), over HTTP/1.1, h2c, gRPC and raw TCP
// (a WebSocket session on HTTP/1.1 gets each message back after its pod name);
// and a [Client] that sends requests and reports who answered each.
//
// The image weft/echo maps to the binary built from test/cmd/echo.
package echo
