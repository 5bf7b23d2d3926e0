// Package xdsclient is a delta ADS client (envoy.service.discovery.v3
// AggregatedDiscoveryService/DeltaAggregatedResources) for Weft's data
// plane: ztunnel subscribes to istio.workload.Address and
// istio.security.Authorization, waypoints to Envoy route, cluster and
// endpoint types. Each type is a wildcard subscription; every response is
// handed to the type's handler and ACKed, or NACKed with the handler's
// error (the handler keeps serving its last good state). On reconnect the
// client sends the versions it holds (initial_resource_versions) so the
// server can skip what did not change.
//
// The stream is made with package grpcwire and the messages of package
// discoverypb, not with the gRPC library and Envoy's generated API, which
// would add several megabytes to the binary and heap of every proxy.
package xdsclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/weftmesh/weft/internal/grpcwire"
	"github.com/weftmesh/weft/internal/pb/discoverypb"
	"github.com/weftmesh/weft/internal/reconnect"
)

// HandlerFunc applies one response of a type: upserts by resource name and
// the names removed. A non-nil error NACKs the response with its text.
type HandlerFunc func(upserts map[string]*anypb.Any, removes []string) error

// Subscription is one resource type and what to do with it.
type Subscription struct {
	TypeURL string
	Handle  HandlerFunc
}

// Config configures a Client. Zero fields take the documented defaults.
type Config struct {
	// Address is the control plane's host:port. Required.
	Address string
	// TLS, when set, secures the connection; nil means plaintext.
	TLS *tls.Config
	// Node identifies this proxy to the control plane.
	Node *discoverypb.Node
	// Token, when set, returns the bearer token sent with every stream
	// (a projected service-account token, re-read on each connect).
	Token func() (string, error)
	// Metadata is sent with every stream (for example clusterid).
	Metadata map[string]string
	// Subscriptions are the types to subscribe to. Required.
	Subscriptions []Subscription
	// MinBackoff and MaxBackoff bound the reconnect delay (see package
	// reconnect); defaults 10 ms and 15 s.
	MinBackoff, MaxBackoff time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Client keeps a delta ADS stream to the control plane.
type Client struct {
	cfg    Config
	synced chan struct{}

	mu       sync.Mutex
	versions map[string]map[string]string // guarded by mu: type -> name -> version
	acked    map[string]bool              // guarded by mu: types that got their first response
	stats    Stats                        // guarded by mu
}

// Stats counts the client's traffic, for metrics and tests.
type Stats struct {
	Connects, Responses, ACKs, NACKs int
	LastError                        string
}

// New returns a client; it starts nothing.
func New(cfg Config) (*Client, error) {
	if cfg.Address == "" {
		return nil, errors.New("xds client: Address is required")
	}
	if len(cfg.Subscriptions) == 0 {
		return nil, errors.New("xds client: at least one subscription is required")
	}
	for _, s := range cfg.Subscriptions {
		if s.TypeURL == "" || s.Handle == nil {
			return nil, errors.New("xds client: every subscription needs a TypeURL and a handler")
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Client{cfg: cfg, synced: make(chan struct{}), versions: map[string]map[string]string{}, acked: map[string]bool{}}, nil
}

// Synced is closed once every subscribed type received its first response.
func (c *Client) Synced() <-chan struct{} { return c.synced }

// Stats returns the traffic counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// MaxMessageSize bounds one xDS response the client takes. gRPC's default
// of 4 MiB would refuse the first response of a mesh of some 25,000
// workloads, and the client would reconnect and be refused forever; the
// control plane is the client's trusted, authenticated peer, so the bound
// is only a backstop (a 50,000-workload mesh is about 8 MiB).
const MaxMessageSize = 256 << 20

// Run keeps a stream open until ctx ends, reconnecting with exponential
// backoff and jitter, from MinBackoff again after a stream that was up for
// reconnect.Healthy. It returns nil when ctx ends.
func (c *Client) Run(ctx context.Context) error {
	conn, err := grpcwire.New(grpcwire.Config{Address: c.cfg.Address, TLS: c.cfg.TLS, MaxRecvSize: MaxMessageSize})
	if err != nil {
		return fmt.Errorf("xds client: %w", err)
	}
	defer conn.Close()
	backoff := reconnect.NewBackoff(c.cfg.MinBackoff, c.cfg.MaxBackoff)
	for {
		start := time.Now()
		err := c.stream(ctx, conn)
		if ctx.Err() != nil {
			return nil
		}
		c.mu.Lock()
		c.stats.LastError = err.Error()
		c.mu.Unlock()
		lived := time.Since(start)
		delay := backoff.Delay(lived)
		// A stream that served for a while and ended is routine (the
		// control plane ages connections out, or restarts); one that
		// ends soon after it was opened is a fault.
		level := slog.LevelWarn
		if lived >= routineStreamLife {
			level = slog.LevelInfo
		}
		c.cfg.Logger.Log(ctx, level, "xds stream ended", "address", c.cfg.Address, "error", err.Error(), "lived", lived.Round(time.Millisecond).String(), "retry_in", delay.String())
		if !reconnect.Sleep(ctx, delay) {
			return nil
		}
	}
}

// routineStreamLife is how long a stream must have lived for its end to be
// logged at info rather than as a warning.
const routineStreamLife = time.Minute

// stream runs one DeltaAggregatedResources stream until it fails.
func (c *Client) stream(ctx context.Context, conn *grpcwire.Conn) error {
	md := make(map[string]string, len(c.cfg.Metadata)+1)
	for k, v := range c.cfg.Metadata {
		md[k] = v
	}
	if c.cfg.Token != nil {
		tok, err := c.cfg.Token()
		if err != nil {
			return fmt.Errorf("reading the xds token: %w", err)
		}
		md["authorization"] = "Bearer " + tok
	}
	st, err := conn.NewStream(ctx, discoverypb.DeltaAggregatedResourcesMethod, md)
	if err != nil {
		return fmt.Errorf("opening the delta ADS stream to %s: %w", c.cfg.Address, err)
	}
	defer st.Close()
	c.mu.Lock()
	c.stats.Connects++
	c.mu.Unlock()
	handlers := map[string]HandlerFunc{}
	for i, s := range c.cfg.Subscriptions {
		handlers[s.TypeURL] = s.Handle
		req := &discoverypb.DeltaDiscoveryRequest{TypeUrl: s.TypeURL, InitialResourceVersions: c.knownVersions(s.TypeURL)}
		if i == 0 {
			req.Node = c.cfg.Node
		}
		if err := st.Send(req); err != nil {
			return fmt.Errorf("subscribing to %s: %w", s.TypeURL, err)
		}
	}
	for {
		resp := &discoverypb.DeltaDiscoveryResponse{}
		if err := st.Recv(resp); err != nil {
			return fmt.Errorf("receiving from %s: %w", c.cfg.Address, err)
		}
		h := handlers[resp.GetTypeUrl()]
		if h == nil {
			c.cfg.Logger.Warn("xds response for a type not subscribed", "type_url", resp.GetTypeUrl())
			continue
		}
		herr := c.apply(resp, h)
		ack := &discoverypb.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
		if herr != nil {
			ack.ErrorDetail = &discoverypb.Status{Code: int32(grpcwire.InvalidArgument), Message: herr.Error()}
			c.cfg.Logger.Warn("xds NACK", "type_url", resp.GetTypeUrl(), "nonce", resp.GetNonce(), "error", herr.Error())
		}
		if err := st.Send(ack); err != nil {
			return fmt.Errorf("acknowledging %s: %w", resp.GetTypeUrl(), err)
		}
	}
}

// apply hands a response to its handler and records versions and stats.
func (c *Client) apply(resp *discoverypb.DeltaDiscoveryResponse, h HandlerFunc) error {
	upserts := make(map[string]*anypb.Any, len(resp.GetResources()))
	var bad []error
	for _, r := range resp.GetResources() {
		switch {
		case r.GetName() == "":
			bad = append(bad, errors.New("resource without a name"))
		case r.GetResource() == nil:
			bad = append(bad, fmt.Errorf("resource %s has no body", r.GetName()))
		case r.GetResource().GetTypeUrl() != resp.GetTypeUrl():
			bad = append(bad, fmt.Errorf("resource %s is a %s in a %s response", r.GetName(), r.GetResource().GetTypeUrl(), resp.GetTypeUrl()))
		default:
			upserts[r.GetName()] = r.GetResource()
		}
	}
	err := h(upserts, resp.GetRemovedResources())
	err = errors.Join(append(bad, err)...)

	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Responses++
	if err != nil {
		c.stats.NACKs++
	} else {
		c.stats.ACKs++
		v := c.versions[resp.GetTypeUrl()]
		if v == nil {
			v = map[string]string{}
			c.versions[resp.GetTypeUrl()] = v
		}
		for _, r := range resp.GetResources() {
			v[r.GetName()] = r.GetVersion()
		}
		for _, name := range resp.GetRemovedResources() {
			delete(v, name)
		}
	}
	if !c.acked[resp.GetTypeUrl()] {
		c.acked[resp.GetTypeUrl()] = true
		if len(c.acked) == len(c.cfg.Subscriptions) {
			close(c.synced)
		}
	}
	return err
}

func (c *Client) knownVersions(typeURL string) map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.versions[typeURL]) == 0 {
		return nil
	}
	out := make(map[string]string, len(c.versions[typeURL]))
	for k, v := range c.versions[typeURL] {
		out[k] = v
	}
	return out
}
