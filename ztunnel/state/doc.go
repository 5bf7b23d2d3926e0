// Package state is ztunnel's view of the mesh: the workloads, services and
// L4 authorization policies the control plane sends over xDS
// (istio.workload.Address and istio.security.Authorization), validated and
// indexed by uid, IP, VIP and namespace. It answers the two questions the
// proxy asks per connection: where an outbound connection goes (Route) and
// whether an inbound one is allowed (Authorize), both with Istio's ambient
// semantics.
package state
