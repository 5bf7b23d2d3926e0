// Package ambient builds the workload discovery state that ztunnel and
// waypoints receive over delta xDS: one istio.workload.Address per pod
// (a Workload) and per Service (a Service), and the istio.security.Authorization
// resources of AuthorizationPolicies and PeerAuthentications, from the
// Kubernetes objects the control plane watches.
//
// # Resources
//
// A pod with an IP that has not terminated is a Workload named by its uid,
// "<cluster-id>//Pod/<namespace>/<name>" (protocols.md §5.1). Its tunnel
// protocol is HBONE only once the node agent has annotated it
// ambient.istio.io/redirection=enabled; its trust domain is left empty when it
// is cluster.local, as istiod does; its services map comes from the
// EndpointSlices that list it, with each service port's target port resolved
// as the slice resolved it; its authorization_policies are the
// workload-selector policies of its namespace and of the root namespace whose
// selector matches its labels, then the one its effective PeerAuthentication
// mode names (package peerauth): the static STRICT policy, published while
// any PeerAuthentication exists, or the converted form of its workload
// PeerAuthentication. Its locality is its node's topology labels
// (topology.kubernetes.io/region and zone, topology.istio.io/subzone), so
// that a Service's trafficDistribution (PreferClose, PreferSameZone,
// PreferSameNode) keeps connections close; a change of a node's labels
// republishes its pods, any other change of a node nothing. Workloads of
// endpoints that are not pods have no locality.
//
// A Service (other than ExternalName) is a Service named
// "<namespace>/<hostname>", with its cluster IPs as addresses and its ports
// (a named target port is sent as 0: the workloads carry the resolved port).
//
// # ServiceEntries
//
// A networking.istio.io ServiceEntry that Weft applies (resolution STATIC,
// DNS or NONE; a workloadSelector only with STATIC; MESH_INTERNAL only
// with a selector; no wildcard host; the webhook refuses the others) is a
// Service per host, named "<namespace>/<host>", with the entry's
// addresses or, without any, one allocated from 240.240.0.0/16 (AutoVIP:
// a hash of namespace, name and host, moved on past an address another
// host holds, kept while the entry names the host, and recorded in the
// entry's status.addresses, which is read back first), and a Workload per
// endpoint, "<cluster>/networking.istio.io/ServiceEntry/<namespace>/<name>/<address>",
// HOST_NETWORK and without a tunnel protocol, so that ztunnel reaches it in
// plain TCP, carrying every host's ports (an endpoint's own port mapping
// first). A DNS entry's endpoint that is a hostname, and with no endpoints
// each host itself (serving that host only), is a Workload with that
// hostname and no address: ztunnel resolves it when it connects. NONE
// gives passthrough Services at the entry's addresses and no Workloads; a
// workloadSelector gives no Workloads either, the selected pods and
// WorkloadEntries carry the hosts (EntrySelectedPorts). An entry bound to
// a waypoint gives its Services that waypoint; its status carries
// istio.io/WaypointBound.
//
// # WorkloadEntries
//
// A networking.istio.io WorkloadEntry (a VM or other host outside the
// cluster) is a Workload named
// "<cluster>/networking.istio.io/WorkloadEntry/<namespace>/<name>", built
// as istiod builds it: its labels are spec.labels overridden by
// metadata.labels; its address is its one IP (an entry whose address is a
// hostname, a Unix socket, none, or one ztunnel never connects to —
// loopback, unspecified, multicast, link-local, 0.0.0.0/8, broadcast — or
// whose network is not the mesh's publishes nothing: the webhook refuses
// them); its service account is spec.serviceAccount, empty when unset (no
// identity, as istiod); its locality spec.locality ("region/zone/subzone");
// its tunnel protocol HBONE only when annotated
// ambient.istio.io/redirection=enabled; its waypoint binding, canonical
// name and revision and selector policies as a pod's. Its services map
// lists every Service of its namespace whose selector (not empty) matches
// its labels, each port's target port resolved from the entry's ports: a
// named target port by that name (the port is left out when the entry has
// none), a numeric one replaced by the entry's port of the service port's
// name. Unlike istiod's, the Workload is HOST_NETWORK: ztunnel reaches it
// only as a Service's endpoint and never takes it for the pod or node that
// holds the same IP. A change of a namespace, or of a Service, policy or
// PeerAuthentication in it (any entry for the root namespace), rebuilds
// the namespace's entries.
//
// # Waypoints
//
// A Gateway of class istio-waypoint is a waypoint. The label
// istio.io/use-waypoint on a pod or Service, or else on its namespace, names
// one (in the object's namespace, or in istio.io/use-waypoint-namespace from
// the same object); "none" opts out, and the object's own label wins over its
// namespace's. A waypoint serves the kinds of traffic in its
// istio.io/waypoint-for label (service by default; workload, all or none): a
// pod binds only to a waypoint for workload or all, a Service only to one for
// service or all, otherwise the binding is ignored. A waypoint takes
// bindings only from the namespaces its owner admits in the
// allowedRoutes.namespaces of its HBONE listener (Same by default, All, or
// a Selector on namespace labels; [Check]); a binding it does not admit is
// not made, and is reported once in [Update] (Denied). A waypoint is used only
// once its Gateway has status.addresses: a hostname (published as a
// namespaced hostname) is preferred to an IP, and the HBONE port is always
// 15008. A waypoint's own pods and Service never get a waypoint.
//
// # Status
//
// A Service that asks for a waypoint shows why in its status, with the
// condition istio.io/WaypointBound that istiod writes: True, reason
// WaypointAccepted, once it is bound; False with the refusal's reason
// ([Check]) while it is not; and none once it asks for no waypoint
// ([ServiceStatusWriter]: set by server-side apply of that one condition,
// removed by a JSON patch of that one entry, so other controllers'
// conditions stay; one that another writer changes is put back). A policy with targetRefs shows
// WaypointAccepted: whether each target binds it to a waypoint, with
// istiod's reasons (Accepted, PartiallyInvalid, Invalid, TargetNotFound,
// AncestorNotBound) and messages ([Update] Conditions).
//
// # Pushes
//
// [Controller] reacts to informer events by marking objects dirty; after a
// short quiet period (or at most a maximum delay) it recomputes exactly the
// resources those objects affect, compares each with what it last published,
// and hands only the changed and removed ones to the [Publisher]. One pod
// change therefore sends one resource.
package ambient
