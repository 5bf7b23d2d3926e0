// Package xdsserver serves the workload discovery resources over delta
// Aggregated Discovery Service (envoy.service.discovery.v3, delta ADS only),
// as ztunnel expects from istiod (protocols.md §5.1).
//
// It holds one go-control-plane LinearCache per type URL,
// type.googleapis.com/istio.workload.Address and
// type.googleapis.com/istio.security.Authorization, and its delta server.
// Resource versions are hashes of the resources' bytes, so replicas agree on
// them and a client that reconnects with initial_resource_versions is sent
// only what changed. A client's first request for a type with no names is a
// wildcard subscription to every resource of that type.
//
// Each published update reaches every connected client as one response
// holding exactly the changed resources (and the names of removed ones). A
// NACK is logged and counted; the rejected resource is not resent until it
// changes, and every other resource keeps flowing.
//
// Waypoints are served the four Envoy types (Listener, RouteConfiguration,
// Cluster, ClusterLoadAssignment) from a go-control-plane snapshot cache
// keyed by the caller's authenticated identity, "<namespace>/<service
// account>": a waypoint's service account is named after its Gateway, so
// the identity picks the configuration and the node id a client sends is
// never trusted for it.
//
// Every subscription is authorized by the caller's authenticated identity
// (authz.go): the workload types go only to the node proxies
// (Config.NodeProxies, the ztunnels), which get every Address and policy
// because a ztunnel routes to any destination and enforces for any local
// pod; the Envoy types go only to waypoints, an identity being one when a
// waypoint's configuration is stored under it. Any other caller's stream,
// an ordinary workload's above all, ends with PermissionDenied before it is
// sent anything, and is counted in weft_xds_rejected_streams_total.
// Unauthenticated streams (authentication off, or the plaintext port) are
// served the workload types, as istiod's plaintext port is, and no waypoint
// configuration.
//
// State-of-the-world streams are refused: ztunnel speaks delta only.
package xdsserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// TypeURLs are the workload resource types, served to node proxies.
var TypeURLs = []string{workloadpb.AddressTypeURL, securitypb.AuthorizationTypeURL}

// EnvoyTypeURLs are the per-waypoint types.
var EnvoyTypeURLs = []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType}

// envoyCache is the MuxCache key of the per-waypoint snapshot cache.
const envoyCache = "envoy"

// unauthenticated is the snapshot key of streams without a caller: no
// waypoint is ever stored under it.
const unauthenticated = "<unauthenticated>"

// shortType is Istio's metric label for a type URL.
func shortType(typeURL string) string {
	switch typeURL {
	case workloadpb.AddressTypeURL:
		return "wds"
	case securitypb.AuthorizationTypeURL:
		return "wads"
	case resource.ListenerType:
		return "lds"
	case resource.RouteType:
		return "rds"
	case resource.ClusterType:
		return "cds"
	case resource.EndpointType:
		return "eds"
	}
	return "unknown"
}

func isEnvoyType(typeURL string) bool { return slices.Contains(EnvoyTypeURLs, typeURL) }

// Authenticator authenticates the caller of a stream from its gRPC context
// (the authorization metadata). It returns a name for logs.
type Authenticator interface {
	Authenticate(ctx context.Context) (string, error)
}

// Config configures a Server.
type Config struct {
	// Authenticator, when set, must accept a stream on the service that
	// Register adds before it is served, and names its caller for
	// authorization. Default nil: every stream is unauthenticated.
	Authenticator Authenticator
	// NodeProxies are the identities ("<namespace>/<service account>", as
	// the Authenticator names them) of the node proxies (ztunnels): the
	// only authenticated callers served the workload types. Default none.
	NodeProxies []string
	// Logger: default discard.
	Logger *slog.Logger
	// Registerer receives the server's metrics. Default: none.
	Registerer prometheus.Registerer
}

// Server is the delta ADS server. It implements ambient.Publisher.
type Server struct {
	cfg    Config
	log    *slog.Logger
	caches map[string]*cachev3.LinearCache
	envoy  cachev3.SnapshotCache // per waypoint, keyed by caller
	mux    *cachev3.MuxCache
	ads    serverv3.Server
	ctx    context.Context // ends every stream when cancelled
	cancel context.CancelFunc
	m      metrics

	changes         changeLog
	waypointVersion atomic.Int64

	mu      sync.Mutex
	clients map[int64]*client // guarded by mu
	// named counts the resources each caller (its cache key) subscribes
	// to by name over its open streams; guarded by mu.
	named map[string]int
}

// maxNamedPerCaller bounds the resources one caller identity subscribes to
// by name, over all its streams and types together; a request past it ends
// its stream with ResourceExhausted. The server keeps every such name for the stream, so
// without a bound one authenticated caller (any namespace that can make a
// waypoint Gateway has such an identity), or anyone on the plaintext
// port, could make it hold as many as it cared to send: a 4 MiB request
// carries some 300,000. Node proxies subscribe to whole types (all of
// them share one identity; the versions a reconnecting one says it holds
// are not subscriptions and are not counted), and a waypoint names a few
// resources per Service it routes to.
const maxNamedPerCaller = 200_000

var _ serverv3.Callbacks = (*callbacks)(nil)

// New returns a Server. It starts nothing: Register it on a gRPC server and
// call Run.
func New(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		caches:  map[string]*cachev3.LinearCache{},
		ctx:     ctx,
		cancel:  cancel,
		m:       newMetrics(),
		clients: map[int64]*client{},
		changes: changeLog{at: map[string]time.Time{}},
	}
	if cfg.Registerer != nil {
		if err := s.m.register(cfg.Registerer); err != nil {
			cancel()
			return nil, fmt.Errorf("creating xDS server: registering metrics: %w", err)
		}
	}
	classify := func(typeURL string) string {
		if isEnvoyType(typeURL) {
			return envoyCache
		}
		return typeURL
	}
	mux := &cachev3.MuxCache{
		Classify:      func(r *cachev3.Request) string { return classify(r.GetTypeUrl()) },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return classify(r.GetTypeUrl()) },
		Caches:        map[string]cachev3.Cache{},
	}
	logger := cacheLogger{s.log}
	s.envoy = cachev3.NewSnapshotCache(true, callerHash{}, logger)
	mux.Caches[envoyCache] = s.envoy
	for _, t := range TypeURLs {
		c := cachev3.NewLinearCache(t, cachev3.WithLogger(logger))
		s.caches[t] = c
		mux.Caches[t] = c
	}
	s.mux = mux
	s.ads = serverv3.NewServer(ctx, mux, &callbacks{s: s, authenticated: cfg.Authenticator != nil})
	return s, nil
}

// Register adds the Aggregated Discovery Service to g, authenticating
// streams with Config.Authenticator.
func (s *Server) Register(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, ads{Server: s.ads, s: s, auth: s.cfg.Authenticator})
}

// RegisterPlaintext adds a second Aggregated Discovery Service on the same
// resources to g, one that authenticates nobody: for the plaintext port,
// which istiod also leaves unauthenticated. Stream ids of this service are
// odd, those of Register's even.
func (s *Server) RegisterPlaintext(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, ads{Server: serverv3.NewServer(s.ctx, s.mux, &callbacks{s: s, plaintext: true}), s: s})
}

// ads exposes only delta ADS, and authenticates a stream before the ADS
// server reads anything of it: go-control-plane starts reading requests
// before its open callback runs, so a caller with no valid token could
// otherwise have a request of up to the server's message bound (32 MiB)
// read and decoded on each of its streams while its token is reviewed.
type ads struct {
	serverv3.Server
	s    *Server
	auth Authenticator // nil: streams are not authenticated
}

// callerKey is the context key of a stream's authenticated caller.
type callerKey struct{}

// authedStream is a stream whose context names its caller.
type authedStream struct {
	discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer
	ctx context.Context
}

func (st authedStream) Context() context.Context { return st.ctx }

func (a ads) DeltaAggregatedResources(st discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	if a.auth == nil {
		return a.Server.DeltaAggregatedResources(st)
	}
	caller, err := a.auth.Authenticate(st.Context())
	if err == nil && caller == "" {
		err = errors.New("the authenticator named no caller")
	}
	if err != nil {
		a.s.m.authFailures.Inc()
		var from string
		if p, ok := peer.FromContext(st.Context()); ok && p.Addr != nil {
			from = p.Addr.String()
		}
		a.s.log.Warn("xDS stream refused", "peer", from, "error", err)
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Error(codes.Unauthenticated, "authentication failed")
	}
	return a.Server.DeltaAggregatedResources(authedStream{st, context.WithValue(st.Context(), callerKey{}, caller)})
}

func (a ads) StreamAggregatedResources(discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return status.Error(codes.Unimplemented, "only delta xDS (DeltaAggregatedResources) is served")
}

// Run waits for ctx to end, then ends every open stream and returns nil.
func (s *Server) Run(ctx context.Context) error {
	<-ctx.Done()
	s.cancel()
	return nil
}

// Publish implements ambient.Publisher: it stores the resources of one type
// and notifies every client watching them.
func (s *Server) Publish(typeURL string, update map[string]proto.Message, remove []string, changedAt time.Time) error {
	c := s.caches[typeURL]
	if c == nil {
		return fmt.Errorf("publishing %s: type not served", typeURL)
	}
	if changedAt.IsZero() {
		changedAt = time.Now()
	}
	names := slices.Collect(maps.Keys(update))
	s.changes.record(typeURL, append(names, remove...), changedAt)
	res := make(map[string]types.Resource, len(update))
	for k, v := range update {
		res[k] = v
	}
	if err := c.UpdateResources(res, remove); err != nil {
		return fmt.Errorf("publishing %d %s resources: %w", len(update)+len(remove), shortType(typeURL), err)
	}
	s.m.resources.WithLabelValues(shortType(typeURL)).Set(float64(c.NumResources()))
	return nil
}

// callerHash keys the snapshot cache by the node id, which
// OnStreamDeltaRequest overwrites with the authenticated caller.
type callerHash struct{}

func (callerHash) ID(n *core.Node) string { return n.GetId() }

// SetWaypoint replaces the Envoy resources of the waypoint whose service
// account is key ("<namespace>/<name>"), by type URL then name. Connected
// waypoints are sent what changed.
func (s *Server) SetWaypoint(key string, resources map[string]map[string]proto.Message) error {
	byType := map[resource.Type][]types.Resource{}
	for _, t := range EnvoyTypeURLs {
		names := slices.Sorted(maps.Keys(resources[t]))
		list := make([]types.Resource, 0, len(names))
		for _, n := range names {
			list = append(list, resources[t][n])
		}
		byType[t] = list
	}
	for t := range resources {
		if !isEnvoyType(t) {
			return fmt.Errorf("setting waypoint %s: type %s is not a waypoint type", key, t)
		}
	}
	snap, err := cachev3.NewSnapshot(strconv.FormatInt(s.waypointVersion.Add(1), 10), byType)
	if err != nil {
		return fmt.Errorf("setting waypoint %s: %w", key, err)
	}
	if err := s.envoy.SetSnapshot(s.ctx, key, snap); err != nil {
		return fmt.Errorf("setting waypoint %s: %w", key, err)
	}
	return nil
}

// RemoveWaypoint forgets a waypoint's resources.
func (s *Server) RemoveWaypoint(key string) { s.envoy.ClearSnapshot(key) }

// Waypoints lists the waypoints that have resources.
func (s *Server) Waypoints() []string {
	return slices.Sorted(slices.Values(s.envoy.GetStatusKeys()))
}

// Resources returns how many resources of a type are held.
func (s *Server) Resources(typeURL string) int {
	if c := s.caches[typeURL]; c != nil {
		return c.NumResources()
	}
	return 0
}

// client is one delta ADS stream.
type client struct {
	id        int64
	peer      string
	caller    string
	connected time.Time
	node      *core.Node
	types     map[string]*typeState
}

type typeState struct {
	named        map[string]struct{} // subscribed to by name
	lastSent     time.Time
	lastNonce    string
	lastResponse *discovery.DeltaDiscoveryResponse
	ackedNonce   string
	responses    int
	nacks        int
	lastNACK     string
}

func (c *client) state(typeURL string) *typeState {
	t := c.types[typeURL]
	if t == nil {
		t = &typeState{}
		c.types[typeURL] = t
	}
	return t
}

// nodeID names a client for logs.
func (c *client) nodeID() string {
	if c.node != nil && c.node.GetId() != "" {
		return c.node.GetId()
	}
	return "stream-" + strconv.FormatInt(c.id, 10)
}

type callbacks struct {
	s *Server
	// authenticated: the service's streams reach the ADS server only once
	// ads has authenticated them, with the caller in their context.
	authenticated bool
	plaintext     bool
}

// global makes a server's stream id unique across both services.
func (cb *callbacks) global(id int64) int64 {
	if cb.plaintext {
		return 2*id + 1
	}
	return 2 * id
}

func (cb *callbacks) OnStreamOpen(context.Context, int64, string) error {
	return status.Error(codes.Unimplemented, "only delta xDS is served")
}
func (cb *callbacks) OnStreamClosed(int64, *core.Node)                         {}
func (cb *callbacks) OnStreamRequest(int64, *discovery.DiscoveryRequest) error { return nil }
func (cb *callbacks) OnStreamResponse(context.Context, int64, *discovery.DiscoveryRequest, *discovery.DiscoveryResponse) {
}
func (cb *callbacks) OnFetchRequest(context.Context, *discovery.DiscoveryRequest) error {
	return status.Error(codes.Unimplemented, "only delta xDS is served")
}
func (cb *callbacks) OnFetchResponse(*discovery.DiscoveryRequest, *discovery.DiscoveryResponse) {}

func (cb *callbacks) OnDeltaStreamOpen(ctx context.Context, id int64, _ string) error {
	s := cb.s
	id = cb.global(id)
	c := &client{id: id, connected: time.Now(), types: map[string]*typeState{}}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		c.peer = p.Addr.String()
	}
	if cb.authenticated {
		caller, _ := ctx.Value(callerKey{}).(string)
		if caller == "" {
			return status.Error(codes.Unauthenticated, "authentication failed")
		}
		c.caller = caller
	}
	s.mu.Lock()
	s.clients[id] = c
	n := len(s.clients)
	s.mu.Unlock()
	s.m.clients.Set(float64(n))
	s.log.Info("xDS client connected", "stream", id, "peer", c.peer, "caller", c.caller)
	return nil
}

func (cb *callbacks) OnDeltaStreamClosed(id int64, _ *core.Node) {
	s := cb.s
	id = cb.global(id)
	s.mu.Lock()
	c, ok := s.clients[id]
	delete(s.clients, id)
	n := len(s.clients)
	if ok {
		key := c.caller
		if key == "" {
			key = unauthenticated
		}
		for _, st := range c.types {
			s.named[key] -= len(st.named)
		}
		if s.named[key] <= 0 {
			delete(s.named, key)
		}
	}
	s.mu.Unlock()
	if !ok {
		return // refused at open
	}
	s.m.clients.Set(float64(n))
	s.log.Info("xDS client disconnected", "stream", id, "node", c.nodeID(), "peer", c.peer,
		"connected_for", time.Since(c.connected).Round(time.Millisecond))
}

// trackNamedLocked records the names req subscribes to and unsubscribes
// from (a wildcard is not a name) for the stream's type st, and returns
// the caller's count after it; when that would pass maxNamedPerCaller it
// records nothing and returns false.
func (s *Server) trackNamedLocked(caller string, st *typeState, req *discovery.DeltaDiscoveryRequest) (int, bool) {
	gone := 0
	for _, name := range req.GetResourceNamesUnsubscribe() {
		if _, ok := st.named[name]; ok {
			gone++
		}
	}
	var fresh map[string]struct{} // most requests, ACKs above all, name none
	for _, name := range req.GetResourceNamesSubscribe() {
		if _, ok := st.named[name]; name != "*" && !ok {
			if fresh == nil {
				fresh = map[string]struct{}{}
			}
			fresh[name] = struct{}{}
		}
	}
	total := s.named[caller] - gone + len(fresh)
	if len(fresh) > 0 && total > maxNamedPerCaller {
		return total, false
	}
	for _, name := range req.GetResourceNamesUnsubscribe() {
		delete(st.named, name)
	}
	if st.named == nil && len(fresh) > 0 {
		st.named = make(map[string]struct{}, len(fresh))
	}
	for name := range fresh {
		st.named[name] = struct{}{}
	}
	if s.named == nil {
		s.named = map[string]int{}
	}
	if s.named[caller] = total; total == 0 {
		delete(s.named, caller)
	}
	return total, true
}

// maxNACKDetail bounds how much of a client's error message is kept.
const maxNACKDetail = 1024

func (cb *callbacks) OnStreamDeltaRequest(id int64, req *discovery.DeltaDiscoveryRequest) error {
	s := cb.s
	id = cb.global(id)
	typeURL := req.GetTypeUrl()
	if typeURL != "" && s.caches[typeURL] == nil && !isEnvoyType(typeURL) {
		s.log.Warn("xDS request for a type that is not served", "stream", id, "type_url", typeURL)
		return status.Errorf(codes.InvalidArgument, "type %q is not served; this control plane serves %s",
			typeURL, strings.Join(append(slices.Clone(TypeURLs), EnvoyTypeURLs...), ", "))
	}
	s.mu.Lock()
	c := s.clients[id]
	if c == nil {
		s.mu.Unlock()
		return nil
	}
	if req.GetNode() != nil && c.node == nil {
		c.node = req.GetNode()
	}
	caller, claimed := c.caller, c.nodeID()
	s.mu.Unlock()
	if reason, msg := s.authorize(caller, typeURL); reason != "" {
		s.m.refused.WithLabelValues(typeURL, reason).Inc()
		s.log.Warn("xDS subscription refused", "stream", id, "peer", c.peer, "caller", caller,
			"node", claimed, "type_url", typeURL, "reason", reason)
		return refusal(msg)
	}
	s.mu.Lock()
	// The cache sees the authenticated caller as the node id, never what
	// the client claims.
	key := c.caller
	if key == "" {
		key = unauthenticated
	}
	n := &core.Node{Id: key}
	if c.node != nil {
		n.Cluster, n.Metadata = c.node.GetCluster(), c.node.GetMetadata()
	}
	req.Node = n
	node := c.nodeID()
	st := c.state(typeURL)
	if total, ok := s.trackNamedLocked(key, st, req); !ok {
		s.mu.Unlock()
		s.m.refused.WithLabelValues(typeURL, reasonTooManyNames).Inc()
		s.log.Warn("xDS subscription refused", "stream", id, "peer", c.peer, "caller", caller,
			"node", claimed, "type_url", typeURL, "reason", reasonTooManyNames, "named", total)
		return status.Errorf(codes.ResourceExhausted, "%s would subscribe to %d resources by name over its streams, more than the %d a caller may; "+
			"subscribe to the whole type instead", callerName(caller), total, maxNamedPerCaller)
	}
	var nackMsg string
	if d := req.GetErrorDetail(); d != nil {
		st.nacks++
		nackMsg = d.GetMessage()
		if len(nackMsg) > maxNACKDetail {
			nackMsg = nackMsg[:maxNACKDetail] + "..."
		}
		st.lastNACK = nackMsg
	} else if req.GetResponseNonce() != "" {
		st.ackedNonce = req.GetResponseNonce()
	}
	s.mu.Unlock()
	if req.GetErrorDetail() != nil {
		s.m.rejects.WithLabelValues(shortType(typeURL)).Inc()
		s.log.Warn("xDS client rejected resources", "stream", id, "node", node, "type", shortType(typeURL),
			"nonce", req.GetResponseNonce(), "code", req.GetErrorDetail().GetCode(), "error", nackMsg)
	}
	return nil
}

func (cb *callbacks) OnStreamDeltaResponse(id int64, req *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
	s := cb.s
	id = cb.global(id)
	now := time.Now()
	typ := shortType(resp.GetTypeUrl())
	s.m.pushes.WithLabelValues(typ).Inc()
	s.m.sent.WithLabelValues(typ).Add(float64(len(resp.GetResources()) + len(resp.GetRemovedResources())))
	if req.GetResponseNonce() != "" || len(req.GetInitialResourceVersions()) > 0 {
		// An update, not the first response: how long since the change?
		names := make([]string, 0, len(resp.GetResources())+len(resp.GetRemovedResources()))
		for _, r := range resp.GetResources() {
			names = append(names, r.GetName())
		}
		names = append(names, resp.GetRemovedResources()...)
		if t, ok := s.changes.earliest(resp.GetTypeUrl(), names); ok {
			s.m.convergence.WithLabelValues(typ).Observe(now.Sub(t).Seconds())
		}
	}
	s.mu.Lock()
	if c := s.clients[id]; c != nil {
		st := c.state(resp.GetTypeUrl())
		st.lastSent, st.lastNonce, st.lastResponse = now, resp.GetNonce(), resp
		st.responses++
	}
	s.mu.Unlock()
}

// changeLog remembers when each resource last changed, to measure how long
// a change takes to reach clients.
type changeLog struct {
	mu sync.Mutex
	at map[string]time.Time // guarded by mu; by typeURL + " " + name
}

// maxChangeAge bounds how long a change time is kept once the log is large.
const maxChangeAge = 5 * time.Minute

func (l *changeLog) record(typeURL string, names []string, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range names {
		l.at[typeURL+" "+n] = t
	}
	if len(l.at) > 1<<16 {
		for k, v := range l.at {
			if time.Since(v) > maxChangeAge {
				delete(l.at, k)
			}
		}
	}
}

func (l *changeLog) earliest(typeURL string, names []string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var min time.Time
	for _, n := range names {
		if t, ok := l.at[typeURL+" "+n]; ok && (min.IsZero() || t.Before(min)) {
			min = t
		}
	}
	return min, !min.IsZero()
}

// cacheLogger sends go-control-plane's warnings and errors to slog.
type cacheLogger struct{ log *slog.Logger }

func (l cacheLogger) Debugf(string, ...any) {}
func (l cacheLogger) Infof(string, ...any)  {}
func (l cacheLogger) Warnf(format string, args ...any) {
	l.log.Warn("xDS cache warning", "detail", fmt.Sprintf(format, args...))
}
func (l cacheLogger) Errorf(format string, args ...any) {
	l.log.Error("xDS cache error", "detail", fmt.Sprintf(format, args...))
}
