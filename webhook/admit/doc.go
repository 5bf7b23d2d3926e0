// Package admit holds the admission rules for ambient configuration: pure
// functions of an AdmissionRequest and a read-only view of the cluster
// ([Gateways], [Services], [Namespaces]) plus a SubjectAccessReview
// ([AccessReviewer]). Every denial names the field and says how to fix it;
// warnings fit in 120 bytes. Each rule has an ID, reported as the Result's
// Reason (the deciding rule) and Rules (every rule that fired):
//
// Waypoint Gateways (gatewayClassName istio-waypoint; classes other than it
// and istio pass):
//
//	waypoint-listeners       exactly one listener {name: mesh, port: 15008, protocol: HBONE},
//	                         without hostname or tls (Istio accepts nothing else on a waypoint)
//	waypoint-for             istio.io/waypoint-for is service, workload, all or none
//	waypoint-addresses       none, or one IPv4 and/or one IPv6 ClusterIP (no Hostname or
//	                         NamedAddress: Weft makes the waypoint's Service itself)
//	waypoint-name            the name (or gateway.istio.io/name-override) is a DNS-1035 label,
//	                         since the waypoint's Service and Deployment take it
//	waypoint-listener-sets   no spec.allowedListeners
//	waypoint-tls             warning: spec.tls is ignored
//	waypoint-infrastructure  spec.infrastructure labels and annotations are valid and free of
//	                         control characters (they are copied onto generated objects)
//	gateway-annotations      gateway.istio.io/service-account names a ServiceAccount
//
// Ingress Gateways (gatewayClassName istio, unless its GatewayClass names
// another controller): refused only for what can never work; what the
// listener's status reports in Gateway API's terms is warned about, so
// that Gateway API tools and its conformance suite see the status:
//
//	ingress-name                 <name>-istio, the name of its Service and Deployment, is a
//	                             DNS-1035 label (so the name has at most 57 characters)
//	ingress-service-type         networking.istio.io/service-type is LoadBalancer, ClusterIP
//	                             or NodePort
//	ingress-listener-conflict    listeners on one port share a protocol family (HTTP; HTTPS and
//	                             TLS; TCP; UDP), and HTTPS and TLS listeners of one port differ
//	                             in hostname (SNI decides between them)
//	ingress-listener-tls         HTTPS has tls, in mode Terminate and without options; TLS has
//	                             tls, in mode Passthrough or Terminate (the default), without
//	                             options (warning: another mode is not served,
//	                             certificateRefs are ignored in Passthrough); HTTP has no tls
//	ingress-listener-sets        no spec.allowedListeners
//	ingress-gateway-tls          no spec.tls (client certificate validation, backend client
//	                             certificates)
//	ingress-listener-protocol    warning: a protocol other than HTTP, HTTPS, TLS or TCP serves
//	                             nothing
//	ingress-certificate-ref      warning: a reference of an HTTPS or Terminate TLS listener that
//	                             is not a core Secret, or a Secret in another namespace (used
//	                             only under a ReferenceGrant)
//	ingress-route-kinds          warning: allowedRoutes.kinds the listener does not take
//	                             (HTTPRoute, GRPCRoute on HTTP and HTTPS; TLSRoute on TLS;
//	                             TCPRoute on TCP)
//	ingress-addresses            warning: spec.addresses is not supported
//	waypoint-infrastructure      as for waypoints
//
// Defaulting (Mutate) gives a waypoint without listeners the mesh listener,
// as a JSON Patch "add" of what is missing only; a second call patches
// nothing. It leaves istio.io/waypoint-for unset when it is, as istiod does:
// such a waypoint takes its GatewayClass's value, else service, and the
// waypoint-for-mismatch rule reads it so.
//
// Namespaces, Services, Pods, and the pod templates of Deployments,
// StatefulSets, DaemonSets, ReplicaSets, Jobs and CronJobs:
//
//	dataplane-mode               istio.io/dataplane-mode is ambient or none
//	sidecar-conflict             ambient together with istio-injection=enabled (Namespace) or
//	                             sidecar.istio.io/inject=true (Pod label or annotation)
//	sidecar-in-ambient-namespace warning: a pod asks for a sidecar in an ambient namespace
//	pod-annotations              ambient.istio.io/dns-capture and bypass-inbound-capture are
//	                             true or false; istio.io/reroute-virtual-interfaces lists
//	                             interface names
//	redirection-annotation       warning: ambient.istio.io/redirection is the node agent's status
//	use-waypoint                 istio.io/use-waypoint is none or a Gateway name;
//	                             istio.io/use-waypoint-namespace a namespace name
//	use-waypoint-namespace       warning: the namespace label without istio.io/use-waypoint
//	ingress-use-waypoint         istio.io/ingress-use-waypoint is a boolean (strconv.ParseBool)
//	                             on a Service or Namespace; warning: no effect on workloads
//	waypoint-missing             warning: the named waypoint does not exist (yet)
//	waypoint-class               the named Gateway is not of class istio-waypoint
//	waypoint-for-mismatch        the waypoint's istio.io/waypoint-for does not take this kind's
//	                             traffic (Service: service/all; workloads: workload/all;
//	                             Namespace: anything but none)
//	waypoint-cross-namespace     the user may not use Gateways in the waypoint's namespace
//	                             (SubjectAccessReview, verb use, 403)
//
// The last four read the cluster, so they run only when the binding (the two
// labels) is new or changed; an unrelated update never depends on another
// object. The SubjectAccessReview runs before the lookup, so a user without
// the right learns nothing about Gateways in that namespace. An object a
// built-in controller creates from a checked template (kube-controller-manager
// or a kube-system service account, with a controller owner of a kind
// checked here: a Deployment's ReplicaSet, a CronJob's Job, their Pods) is
// not reviewed again: the template was, against the user who wrote it.
//
// HTTPRoutes and GRPCRoutes with a Service parent (GAMMA):
//
//	route-service-parent   a Service parent has group "" (core)
//	route-service-port     port and sectionName exist on the Service
//	route-service-missing  warning: the Service does not exist (yet)
//	route-consumer         warning: a Service in another namespace (a consumer route)
//	route-no-waypoint      warning: neither the Service nor its namespace uses a waypoint
//
// TCPRoutes with a Service parent: the parent checks above, and
//
//	route-tcp-rules          exactly one rule (a stream has nothing that tells rules apart)
//	route-backend-kind       backends are Services (group "" or core)
//	route-backend-port       a backend names a port
//	route-backend-namespace  warning: a backend in another namespace needs a ReferenceGrant there
//	route-tcp-no-weight      warning: no backend has a weight above 0 (every connection refused)
//
// TLSRoutes and UDPRoutes with a Service parent:
//
//	route-kind-unsupported  refused: waypoints do not apply these kinds yet
//
// AuthorizationPolicies (security.istio.io v1 and v1beta1):
//
//	authz-target-refs   targetRef(s) of kind Gateway, GatewayClass (root namespace only),
//	                    Service or ServiceEntry, named, in the policy's namespace; not
//	                    targetRef and targetRefs both
//	authz-selector      not a selector and targetRefs both; no empty label key, no '*' in
//	                    a key or value; warning: a selector without labels
//	authz-provider      CUSTOM has a provider; other actions have none
//	authz-rule          no empty source, operation or condition; known condition keys;
//	                    valid ports, IPs and CIDRs; '*' only whole, as prefix or suffix;
//	                    no empty values
//	authz-l7-on-ztunnel warning: HTTP attributes (or CUSTOM) on a policy without targetRefs,
//	                    which only ztunnel enforces: an ALLOW rule becomes deny-all, a DENY
//	                    or AUDIT rule has no effect
//
// PeerAuthentications (security.istio.io v1 and v1beta1):
//
//	peerauth-unknown-field  only selector.matchLabels, mtls.mode and portLevelMtls[port].mode
//	peerauth-selector       as authz-selector
//	peerauth-mode           a mode Istio defines (a name it does not is undecodable)
//	peerauth-port-level     portLevelMtls only with a selector with matchLabels, not empty,
//	                        ports 1-65535
//	peerauth-disable        warning: ztunnel treats DISABLE as PERMISSIVE
//	peerauth-ignored        warning: a selector policy in the root namespace, which istiod
//	                        ignores for ambient workloads
//
// ServiceEntries (networking.istio.io v1, v1beta1 and v1alpha3), refused
// where Weft would accept and then not apply them:
//
//	se-location    location MESH_EXTERNAL (or unset), or MESH_INTERNAL with a
//	               workloadSelector (MESH_INTERNAL endpoints are not supported yet)
//	se-resolution  resolution STATIC, DNS, or NONE (the default) with addresses and no
//	               endpoints (passed through by address); DNS_ROUND_ROBIN and
//	               DYNAMIC_DNS are not supported yet; a lower-case name is refused here
//	               with what to write, not reported undecodable
//	se-host        at least one host; each a DNS name (a trailing dot and any case
//	               allowed), once: no wildcard (not yet), no IP, nothing
//	               under the cluster domain ([Config.ClusterDomain]), whose names are
//	               Services'
//	se-address     single IPv4 or IPv6 addresses: no CIDR block (not yet), zone,
//	               IPv4-mapped IPv6 form, nor an address the mesh never connects to
//	               (podnet.EndpointAddr: loopback, unspecified, link-local, multicast,
//	               broadcast); none is fine (one is allocated per host);
//	               warning: addresses shared by several hosts
//	se-port        at least one port; numbers 1-65535, each once; targetPort 0-65535;
//	               names DNS labels, each once
//	se-endpoint    with STATIC at least one endpoint (or a workloadSelector), each
//	               address an IP the mesh connects to; with DNS an
//	               IP or a hostname (no endpoints: the hosts are resolved); no Unix
//	               socket; no network, locality or weight (not applied yet); port map
//	               keys name ports of the entry, values 1-65535; labels and
//	               serviceAccount pass; warning: an address listed twice
//	se-selector    a workloadSelector with resolution STATIC and no endpoints, its
//	               labels exact (no '*', no empty key); warning: no labels (every
//	               pod and WorkloadEntry of the namespace)
//	se-export      exportTo absent or ["*"]: every entry is visible mesh-wide
//	se-san         subjectAltNames only with MESH_INTERNAL, each a SPIFFE ID
//	(labels)       istio.io/use-waypoint and istio.io/use-waypoint-namespace as on a
//	               Service (use-waypoint, waypoint-*): the entry's hosts go through
//	               the waypoint (egress)
//
// WorkloadEntries (networking.istio.io v1, v1beta1 and v1alpha3), checked as
// istiod checks them, and refused where Weft would not apply them:
//
//	we-address          one IPv4 or IPv6 address: not empty, no hostname (not yet:
//	                    use a ServiceEntry of resolution DNS), no Unix socket, no
//	                    zone, CIDR, port or IPv4-mapped form; not loopback,
//	                    unspecified, 0.0.0.0/8, broadcast, multicast or link-local
//	                    (ztunnel never connects there for a workload)
//	we-network          network absent or the mesh's ([Config.Network])
//	we-port             port map keys DNS labels, values 1-65535, at most
//	                    [MaxEntryPorts] entries
//	we-labels           spec.labels keys and values valid label keys and values;
//	                    istio.io/use-waypoint(-namespace) only in metadata.labels
//	we-service-account  a DNS subdomain (a service account name); empty: no identity
//	we-weight           no weight (not applied yet)
//	we-locality         region/zone/subzone, each part a label value
//	we-redirection      ambient.istio.io/redirection enabled (HBONE to the entry's
//	                    ztunnel) or disabled
//	use-waypoint, ...   the waypoint binding of metadata.labels, checked as a pod's
//
// Istio kinds Weft does not apply (WorkloadGroup, VirtualService,
// DestinationRule, networking.istio.io Gateway, Sidecar, EnvoyFilter,
// ProxyConfig, RequestAuthentication, Telemetry, WasmPlugin; every version):
//
//	kind-unsupported  every CREATE and UPDATE, with what to use instead: stored,
//	                  the object would do nothing. They are refused where a
//	                  cluster has Istio's CRDs.
//
// An UPDATE of an object of these kinds or of a ServiceEntry or
// WorkloadEntry being deleted passes, so that its finalizers can always be
// removed.
//
// Everywhere: every consumed free-form value is at most [MaxValueBytes] and
// has no control, bidirectional-formatting or invalid UTF-8 characters. An
// object that does not decode is an error (400, object-undecodable); a failed
// lookup or review an error (500). No regular expression is compiled from
// input.
package admit
