// Package cluster is Weft's local Kubernetes cluster of real parts, with no
// container engine: the end-to-end test harness and the engine of
// `make demo`.
//
// [Start] builds, from the tools in bin/ (`make tools`):
//
//   - a control-plane network namespace running etcd, kube-apiserver (RBAC,
//     admission webhooks, a service CIDR, aggregator routing to endpoint IPs),
//     kube-controller-manager and kube-scheduler, with certificates and
//     service-account keys generated in Go; the API server presents a client
//     certificate of its own CA ([Cluster.WebhookClientCA]) to admission
//     webhooks behind Services that ask for one, through an admission
//     configuration as a cluster admin would write it;
//   - Nodes, each a network namespace with a pod bridge and a pod CIDR,
//     running kube-proxy and the real kubelet with a containerd and runc of
//     the node's own, running OCI images imported at start (Config.NodeMode
//     "kubelet", the default); or, with NodeMode "standin"
//     (WEFT_NODES=standin), a node runner (package node) in place of the
//     kubelet, which wires pods with the real CNI plugins through libcni;
//   - an underlay joining the control plane and the nodes, inside a network
//     namespace of its own;
//   - cluster DNS for Services and pods (the kube-dns Service, 10.96.0.10),
//     answered by the harness from inside the control-plane namespace;
//   - a load balancer: every Service of type LoadBalancer gets an address
//     of 10.98.0.0/24 in its status from a controller in the harness, and
//     an outside namespace on the underlay, which is no node, routes that
//     range to the nodes' kube-proxy; [Cluster.DialOutside] and
//     [Cluster.OutsideHTTPClient] connect from there, as a client outside
//     the cluster.
//
// Nothing of that topology touches the machine's own (root) network
// namespace: no link, route or address is added there and no namespace has
// a route towards it. The host reaches the API server through a TCP
// forwarder on 127.0.0.1 that dials from inside the control-plane namespace;
// the admin kubeconfig points at it.
//
// Names are unique per run (a "wft" prefix and a random run ID); a start
// first removes what killed runs left behind (their namespaces, processes
// and files), and [Cluster.Close] removes everything the run made, which
// [Cluster.Leftovers] verifies.
//
// Tests share one cluster per package through [Shared]; they skip unless the
// process is root and WEFT_ROOT_TESTS is set (`make test` sets it).
package cluster
