// Package authpolicy translates security.istio.io AuthorizationPolicy objects
// into the istio.security.Authorization resources that ztunnel enforces, with
// Istio's L4 semantics for ambient mode.
//
// # Scope
//
// A policy without a selector applies to its namespace (scope NAMESPACE), or
// to the whole mesh when it lives in the root namespace (scope GLOBAL). A
// policy with a selector has scope WORKLOAD_SELECTOR: it applies only to the
// workloads that list its resource name, "<namespace>/<name>", in
// Workload.authorization_policies, which the control plane fills from the
// selector (pods of the policy's namespace, or of every namespace for a policy
// in the root namespace). A policy with targetRef or targetRefs is bound to a
// waypoint, not to ztunnel, and is not translated here.
//
// # Rules
//
// Each policy rule becomes one Rule. Its clauses, all of which must match,
// are: one clause for the rule's "to" list (one match per operation, any of
// which may match), one for its "from" list (one match per source), and one
// per "when" condition. A rule without from, to or when matches every
// connection; a policy without rules matches none.
//
// Names compile to literal string matches only: "*" alone is presence, a
// leading "*" a suffix match, a trailing "*" a prefix match, anything else an
// exact match. No value is ever a pattern, so a '.' or '[' in a namespace or
// service account name means only itself (CVE-2026-39350 was a regex built
// from such names).
//
// # What ztunnel cannot enforce
//
// ztunnel sees connections, not requests. HTTP attributes (hosts, methods,
// paths, request principals, remote IP blocks, trust domains, and when-keys
// other than source.ip, source.namespace, source.principal, destination.ip and
// destination.port) are handled as Istio does:
//
//   - In an ALLOW policy a rule that uses any of them is omitted, so it allows
//     nothing. An ALLOW policy whose every rule is omitted denies every
//     connection to the workloads it selects: more restrictive than asked,
//     never less.
//   - In a DENY policy the HTTP attributes are omitted and the rule denies on
//     its remaining L4 conditions, which is broader than asked. A rule left
//     with nothing ztunnel can match is dropped, and a DENY policy left with no
//     rule is not sent at all.
//
// Both outcomes are reported in the policy's ZtunnelAccepted status
// condition. A value that cannot be parsed (a port, an IP block, a misplaced
// '*') fails closed in the same way: the ALLOW rule that holds it allows
// nothing, the DENY rule that holds it denies every connection, and the
// condition says so. Actions other than ALLOW and DENY (AUDIT, CUSTOM) are not
// enforced by ztunnel and are reported as unsupported.
package authpolicy
