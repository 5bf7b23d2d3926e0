// Package peerauth turns security.istio.io PeerAuthentication objects into
// the istio.security.Authorization resources ztunnel enforces, with istiod's
// ambient semantics: ztunnel never sees a PeerAuthentication, only DENY
// policies that refuse connections without a peer identity.
//
// # Levels and precedence
//
// A policy without a selector (or with empty matchLabels) is mesh-wide in
// the root namespace and namespace-wide elsewhere. A policy with matchLabels
// outside the root namespace is a workload policy for the pods of its
// namespace it selects; one with matchLabels in the root namespace is
// ignored, as istiod ignores it in ambient mode. When several policies
// compete at one level, the oldest (by creationTimestamp, then by
// namespace/name) wins. The mode is resolved mesh, then namespace, then
// workload: UNSET inherits the level above, and with nothing set the mode
// is PERMISSIVE. ztunnel treats DISABLE as PERMISSIVE: it has no way to
// refuse mTLS, only to refuse plaintext.
//
// # What ztunnel receives
//
// One static policy, "<root>/istio_converted_static_strict" (DENY when the
// peer has no principal, scope WORKLOAD_SELECTOR), is published while any
// PeerAuthentication exists. A workload whose effective mode is STRICT with
// no port exception lists it in its authorization_policies.
//
// A workload policy with portLevelMtls that differ from its effective mode
// is converted into "<namespace>/converted_peer_authentication_<name>":
//
//   - effective STRICT with PERMISSIVE (or DISABLE) ports: one rule, DENY
//     when the peer has no principal and the destination port is none of
//     those ports. The workload lists this policy instead of the static one
//     (a DENY policy cannot be excepted by another).
//   - effective PERMISSIVE with STRICT ports: one rule per port, DENY when
//     the peer has no principal and the destination is that port.
//
// Ports are the workload's own (container) ports, the destination port
// ztunnel sees inbound, never a Service port. A port whose mode is UNSET
// follows the workload's mode.
//
// # Where this differs from istiod
//
// istiod decides which keys a workload lists and what a converted policy
// holds in two separate functions that disagree in a few corners: a
// workload listing a converted policy that istiod never publishes (which
// its ztunnel then skips, failing open), or a DISABLE port exception that
// is published but not listed. Here both come from one resolution
// ([Resolve]), so a workload lists a converted policy exactly when it is
// published and always with the content its modes ask for; in the cases
// where istiod agrees with itself, the resources are the same.
package peerauth
