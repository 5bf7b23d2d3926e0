// Package bench holds Weft's benchmarks (`make bench`). They print
// `bench: <name> <value>` lines, each figure measured against its baseline
// in the same run:
//
//   - BenchmarkCluster: the local cluster's cold tool build, its start time
//     and how fast pods get Ready.
//   - BenchmarkZtunnel: two pods in their own network namespaces with
//     Istio's in-pod redirection, enrolled in the product's ztunnel binary
//     (configured as the chart configures it) by the node agent's end of
//     ZDS, with the control plane's xDS server and CA in the benchmark
//     process; throughput, added latency, RSS, Go heap, CPU and
//     idle-connection memory against the same pods without redirection,
//     and the RSS per enrolled pod with 100 more pods; beside them, the
//     throughput and added latency of two nginx TCP relays on ztunnel's
//     path (nginx's stream module), the floor any pair of user-space
//     proxies sets on this machine.
//   - BenchmarkZtunnelScale: the same ztunnel told about 1k, 10k and 50k
//     workloads elsewhere in the mesh; its RSS and heap at each size and
//     how long each push takes to show in its config dump.
//   - BenchmarkWaypoint: the same pods plus a waypoint in a third namespace
//     and a process of its own; the latency ztunnel + waypoint adds over
//     ztunnel alone and the waypoint's RSS at 1000 req/s, and its requests/s
//     per busy core against nginx as a reverse proxy to the same backend
//     (nginx runs from a configuration the benchmark writes; `make bench`
//     installs it), over HTTP/1.1 and over HTTP/2 (gRPC unary calls, nginx
//     with grpc_pass to the same gRPC server).
//   - BenchmarkGateway: the waypoint binary as an ingress gateway
//     terminating TLS in the waypoint's namespace; the latency it adds at
//     1000 req/s of HTTPS over the same client talking TLS to the backend
//     directly, and its requests/s per busy core against nginx terminating
//     TLS with the same certificate.
//
// The namespace benchmarks need root and WEFT_ROOT_TESTS=1 (`make bench`
// sets it); everything they build is in namespaces they create and remove.
package bench
