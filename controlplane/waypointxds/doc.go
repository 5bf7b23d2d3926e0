// Package waypointxds computes each waypoint's Envoy configuration — the
// Listener, RouteConfigurations, Clusters and ClusterLoadAssignments of the
// subset the waypoint proxy accepts (ARCHITECTURE.md "Waypoint") — from the
// Services bound to it, their HTTPRoutes, GRPCRoutes and TCPRoutes (GAMMA: a
// parentRef of kind Service) and the AuthorizationPolicies that target the waypoint's
// Gateway or one of those Services; and each ingress Gateway's (class
// istio; see Ingress gateways below) from the routes attached to its
// listeners.
//
// # Binding
//
// A Service is bound to a waypoint when it (or, failing a label of its own,
// its namespace) names the waypoint in istio.io/use-waypoint and the
// waypoint serves service traffic (istio.io/waypoint-for service or all)
// and its HBONE listener's allowedRoutes admit the Service's namespace —
// the rule ztunnel's Service resources follow (ambient.Check), so that the waypoint holds a
// filter chain for every Service that ztunnel sends to it. A waypoint that
// serves workload traffic also gets one chain per bound pod, named
// workload/<namespace>/<pod>, that passes the connection to its original
// destination. A ServiceEntry bound the same way (egress) is served host
// by host as a Service of the entry's name at the address its status
// records (serviceentry.go): routes and targetRefs name it by kind
// ServiceEntry (group networking.istio.io), backendRefs by kind Hostname
// or ServiceEntry, and its clusters are STRICT_DNS (resolution DNS), EDS
// (STATIC: its endpoints, or the workloads its workloadSelector selects)
// or ORIGINAL_DST (NONE).
//
// # Ports
//
// As in Istio's waypoint, a Service port's protocol (appProtocol, else the
// prefix of its name) decides its filter chains: http, http2, grpc and
// grpc-web get an HTTP chain only (bytes that are not HTTP get 400); tcp,
// tls, https, mongo, mysql and redis a TCP chain only (tcp_proxy, never
// parsed); any other port both, told apart by the HTTP inspector: the HTTP
// chain lists application_protocols http/1.0, http/1.1 and h2c, and the
// TCP chain <host>:<port>/tcp takes the rest. A workload's ports are
// unknown, so its chains are such a pair too.
//
// # Routes
//
// Only producer routes apply: an HTTPRoute or GRPCRoute in the Service's own
// namespace with a parentRef to the Service (and, when the parentRef names a
// port, only that port). Backends are Services of the route's namespace, or
// of another namespace while a ReferenceGrant there names the route's kind
// and namespace and that Service (or every Service); Istio reads no grants
// for mesh routes, Weft keeps Gateway API's rule so that a namespace
// decides who sends to it through a waypoint.
// Each rule's matches become Envoy routes sorted by Gateway API precedence:
// an exact path before a regular expression before a prefix, longer paths
// first, then a method match, more header matches, more query matches, then
// the older route, then the route's namespace/name, then rule and match
// order. A port without routes routes everything to the Service itself; a
// port with routes answers 404 for a request no rule matches. A rule without
// backends answers 500, as Gateway API asks.
//
// A rule's CORS filter becomes its routes' CorsPolicy for the chain's
// envoy.filters.http.cors, which every HTTP chain has after its RBAC
// filters (cors.go): a preflight is answered by the waypoint, and is
// authorized first like any OPTIONS request. A backendRef's header
// modifiers become its weighted cluster's request and response header
// changes; its other filters are reported unsupported.
//
// # TCP routes
//
// A producer TCPRoute (attached as above) applies to the TCP chain of each
// port it names: a tcp, tls, mongo, mysql or redis port, or the /tcp chain
// of a port whose protocol is detected. An HTTP-only port has no TCP chain,
// so a TCPRoute naming only such ports is not applied (NoMatchingParent,
// saying to use an HTTPRoute). Its one rule's backends (Services with a
// port, of the route's namespace or granted as above) become the
// tcp_proxy's weighted_clusters, or its cluster when one is left; a weight
// of 0 takes none of the connections. A backend that cannot be used keeps its weight and goes to
// BlackHoleCluster, which has no endpoints: as Gateway API asks, that share
// of the connections is refused, never sent elsewhere, and when no backend
// has a weight every connection is. A stream carries nothing that tells
// routes or rules apart, so of the TCPRoutes of a port the oldest applies
// (then the first by namespace/name) and the others are Accepted=False
// with the reason Conflicted; a TCPRoute with other than one rule (the
// schema allows one) is not applied (UnsupportedValue). The chain's network
// RBAC filters run before the proxy picks a cluster. A port without a
// TCPRoute relays to the Service itself.
//
// # Status
//
// What the translation finds about a route is recorded per route and
// parentRef (Report) and becomes, through Outcomes, the route's Gateway API
// conditions: Accepted (True when a waypoint applies it; NoMatchingParent,
// NotAllowedByListeners, UnsupportedValue or, for a shadowed TCPRoute,
// Conflicted with the reason when not) and
// ResolvedRefs (BackendNotFound, RefNotPermitted, InvalidKind). The log's
// notes are derived from the same records. StatusWriter writes them into
// status.parents under the waypoint controller's name.
//
// # Policy
//
// AuthorizationPolicies with targetRefs to the waypoint's Gateway (in its
// namespace) apply to every chain; those that target a Service apply to that
// Service's chains. They become Envoy RBAC http filters in the order AUDIT
// (action LOG), DENY, ALLOW, with Istio's semantics: a request must match no
// DENY rule, and, when any ALLOW policy applies, at least one ALLOW rule. A
// policy without rules allows nothing (ALLOW) or denies nothing (DENY).
// Names compile to literal string matches ("*" alone is presence, a leading
// or trailing "*" a suffix or prefix), never to patterns made of user text;
// namespaces match principals by a regular expression of quoted names.
// Fields the waypoint cannot evaluate (requestPrincipals, request.auth
// conditions) make an ALLOW rule allow nothing and are dropped from a DENY
// rule, so that a policy is never less strict than written.
//
// TCP chains get the same policies as network RBAC filters before their
// tcp_proxy, with Istio's rule for the fields a stream does not have
// (hosts, methods, paths, requestPrincipals, request.* conditions): an
// ALLOW rule with any of them never matches on TCP, and a DENY or AUDIT
// rule is kept without them, so it matches more (a DENY on a path alone
// denies every stream of a TCP port).
//
// # Ingress gateways
//
// BuildGateway computes an ingress Gateway's resources (class istio whose
// GatewayClass names apinames.GatewayController, or that has none:
// Ingress), published under its proxy's identity GatewayKey
// "<namespace>/<gateway>-istio". Its listeners are checked in spec order:
// HTTP, HTTPS, TLS and TCP are served, any other protocol is
// Accepted=False (UnsupportedProtocol); allowedRoutes.kinds other than
// HTTPRoute and GRPCRoute (TLSRoute on a TLS listener, TCPRoute on a TCP
// listener, whose hostname is ignored) make ResolvedRefs False
// (InvalidRouteKinds) and are left out of supportedKinds; an HTTPS
// listener's tls.mode must be Terminate and tls.options and the Gateway's
// spec.tls.frontend empty (else UnsupportedValue); a TLS listener's
// tls.mode is Passthrough or Terminate (Gateway API's default and its
// extended TLSRouteModeTerminate; another mode is UnsupportedValue, with
// no supportedKinds), its tls.options empty. In Passthrough its
// certificateRefs are ignored, as Gateway API says, and its Accepted
// message says so; in Terminate they are resolved as an HTTPS listener's
// (below, and the Gateway's spec.tls.frontend is UnsupportedValue too).
// The first listener of a port sets its protocol (HTTPS
// and TLS go together, in either mode: Gateway API's TLSRouteModeMixed);
// a later one of another is Conflicted
// (ProtocolConflict), a later one with the same hostname (or none, twice)
// Conflicted (HostnameConflict); a conflicted listener takes no routes and
// gets no chain.
//
// A certificateRef must name a Secret (group "", kind Secret) of type
// kubernetes.io/tls in the Gateway's namespace, or in another one whose
// ReferenceGrant lets Gateways of the Gateway's namespace refer to it
// (else ResolvedRefs False, RefNotPermitted, as Gateway API and its
// conformance tests ask); its tls.crt and tls.key must be PEM of a
// certificate chain and the matching key, the check crypto/tls makes (else
// InvalidCertificateRef). An HTTPS listener, or a TLS listener in
// Terminate mode, with any unusable reference (or none) is not served
// (Programmed False, Invalid; no chain of its own, its hostname held as
// below); the routes attached to it stay attached.
//
// A route attaches through a parentRef that names the Gateway (group and
// kind default to Gateway's, namespace to the route's) to the listeners
// its sectionName and port select (none: NoMatchingParent), of those the
// accepted, unconflicted ones that admit its kind from its namespace
// (none: NotAllowedByListeners), of those the ones whose hostname
// intersects the route's (none: NoMatchingListenerHostname). The
// intersection serves: the route's hostnames under a listener without
// one; the listener's when the route has none ("*" when neither has);
// else each route hostname equal to the listener's or covered by its
// wildcard, and the listener's hostname when a route wildcard covers it.
// A wildcard "*.example.com" covers names with at least one more label,
// never example.com itself. A TCPRoute attaches the same way to TCP
// listeners; of those a listener takes, the oldest with exactly one rule
// applies (as at a waypoint's TCP port) and the others are Accepted=False
// (Conflicted, or UnsupportedValue for other than one rule) unless they
// apply on another listener. A TLSRoute attaches the same way to TLS
// listeners, with the server names of the intersection (a ClientHello's
// SNI, compared in lower case). Of the names of a port's TLS listeners, a
// name that a more specific HTTPS or TLS listener of the port equals or
// covers is left to that listener (listener isolation, as for HTTP: a
// name is listed by one chain only), and a name that two routes claim
// goes to the older (then the first by namespace/name: Gateway API's rule
// for routes that conflict). A TLSRoute left with no name on a listener,
// or with other than one rule (the v1 schema allows one), is detached
// from it, and a parentRef left attached nowhere is Accepted=False
// (Conflicted, or UnsupportedValue); one that keeps some of its names is
// Accepted, the names it lost logged. A TLSRoute whose parent is a
// Service is UnsupportedValue: waypoints apply none.
//
// Per port with served listeners a Listener "0.0.0.0_<port>": the port's
// HTTP listeners share one chain "http/<port>" and RouteConfiguration
// "http.<port>"; each HTTPS listener has a chain "https/<port>/<name>"
// matched by server_names (its hostname; none without one), a TLS
// transport socket with its certificates and ALPN h2, http/1.1, and
// RouteConfiguration "https.<port>.<name>"; the Listener gets the TLS
// inspector. A TCP listener's port has one chain "tcp/<port>": network
// RBAC filters, then a tcp_proxy to its TCPRoute's backends by weight (an
// unusable backend's share to BlackHoleCluster), or to BlackHoleCluster
// when no TCPRoute applies. A TLS listener has a chain
// "tls/<port>/<listener>/<namespace>/<route>" per TLSRoute it keeps,
// matched by the route's server_names (none, taking every name and a
// ClientHello without SNI, for a route without hostnames under a listener
// without one): network RBAC filters, then a tcp_proxy to the route's
// backends as for a TCPRoute. In Passthrough mode the chain has no
// transport socket, so the connection goes on as it came and the backend
// ends TLS; in Terminate mode its transport socket ends TLS with the
// listener's certificates, offering no ALPN (the gateway does not read
// what TLS carries), and the tcp_proxy relays the decrypted bytes. Both
// share the port's Listener and TLS inspector with the HTTPS listeners:
// one server name is listed by one chain only (listener isolation above
// and one route per name), so a name of a Passthrough listener is never
// terminated and a name of a Terminate or HTTPS listener never passed
// through; the proxy picks the exact name, then the longest wildcard,
// then the chain without names, whatever their modes. A TLS listener with
// a hostname that no route of it lists, and an HTTPS or TLS listener with
// a hostname but no usable certificate on a port that is served, keep
// that hostname with a chain "tls/<port>/<listener>" to BlackHoleCluster
// without a transport socket (closed before any certificate), so that
// its names never fall to the wildcard (or name-less) chain of a less
// specific listener, of the other mode perhaps. A port whose only
// listeners are TLS listeners without routes gets one chain "tls/<port>"
// listing no names, with a tcp_proxy to BlackHoleCluster and no
// transport socket: the port is open, and its connections closed before
// any certificate is shown. Every connection manager takes the client address from the
// connection (use_remote_address), strips the port of the Host before
// matching, and has the RBAC filters of the AuthorizationPolicies whose
// targetRefs name the Gateway (or the GatewayClass istio, in the root
// namespace), then cors and router. A RouteConfiguration holds a virtual
// host "<hostname>:<port>" per hostname served and per listener hostname,
// domains [<hostname>], with the rules of every route serving that
// hostname on its listeners, in Gateway API precedence across routes. On
// a port whose HTTP listeners have nested hostnames, a hostname a more
// specific listener equals or covers is left to that listener's routes
// (Gateway API's listener isolation: with listeners "*.example.com" and
// "abc.example.com" on one port, a request for abc.example.com reaches
// only the second listener's routes, never a route of the first that
// names abc.example.com). spec.tls.backend is not supported (noted).
// No virtual host or no route: 404.
//
// A backend Service whose istio.io/ingress-use-waypoint (its own label,
// else its namespace's; strconv.ParseBool) is true and that is bound to a
// waypoint by ztunnel's rule (ambient.Check, the waypoint with an address)
// is reached through the waypoint, as a mesh client's traffic is
// (ingresswaypoint.go): its cluster's endpoints are the ready pods of the
// waypoint's Service at 15008, with their identities, tunnel HBONE and the
// authority "<cluster IP>:<port>" that the proxy asks the waypoint for. A
// waypoint pod of unknown identity is left out; without a waypoint pod the
// cluster has no endpoint (503), never a path around the waypoint. A
// headless Service, which a waypoint cannot serve, is reached directly
// (noted).
//
// Status: each listener's supportedKinds, attachedRoutes (the routes
// attached to it, including those on an HTTPS or Terminate TLS listener
// without a usable certificate) and the conditions Accepted, ResolvedRefs, Conflicted and
// Programmed (True when it is served) with the Gateway's generation go
// in GatewayReport.Listeners, which the controller hands to
// ControllerConfig.Gateways; a route's parent entry for the Gateway is
// written by StatusWriter under apinames.GatewayController.
//
// # Paths
//
// Every HTTP chain's http_connection_manager carries the mesh's path
// normalization (Istio's meshConfig.pathNormalization) as Istio writes it:
// NONE is normalize_path false; BASE normalize_path true; MERGE_SLASHES
// adds merge_slashes; DECODE_AND_MERGE_SLASHES adds
// path_with_escaped_slashes_action UNESCAPE_AND_FORWARD (otherwise
// KEEP_UNCHANGED). The waypoint normalizes once, before policy and
// routing, and forwards the normalized path.
package waypointxds
