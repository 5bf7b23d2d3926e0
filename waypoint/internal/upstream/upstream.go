// Package upstream is the waypoint's upstream side: per cluster a circuit
// breaker with Envoy's circuit_breakers.thresholds[0] semantics
// (max_connections, max_pending_requests, max_requests, max_retries), the
// choice of an endpoint (round robin, or least request by two random
// choices; an endpoint whose connect failed is passed over for 5 s while
// another is left, Envoy's panic mode when none is), per endpoint a pool
// of persistent HTTP/1.1 connections and shared HTTP/2 connections, and
// the clients that send a request over them: HTTP/1.1 (RFC 9112) and
// HTTP/2 with prior knowledge (RFC 9113), over an HBONE stream when the
// endpoint has a tunnel, plain TCP otherwise.
//
// A Client keeps this state across configuration versions: each call names
// the snapshot whose cluster settings and endpoints apply; the connections
// of an endpoint that stays are kept, those of an endpoint that leaves are
// retired. RoundTrip is one attempt of a request, which it repeats itself
// only when the upstream cannot have acted on it (a pooled connection the
// peer had closed, an HTTP/2 stream the upstream refused or never
// processed); the route's retries (within TakeRetry's budget), timeouts
// and mirrors are the caller's. Dial opens a TCP relay's connection. Stats
// is a read-only view of a cluster's breaker counters.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/waypoint/config"
)

// ErrOverloaded means a circuit breaker refused the request (Envoy's
// overflow, response flag UO).
var ErrOverloaded = errors.New("upstream overflow: circuit breaker open")

// ErrNoHealthy means the cluster has no usable endpoint.
var ErrNoHealthy = errors.New("no healthy upstream")

// maxReplayBody bounds the request body RoundTrip keeps to send again on a
// new connection when its pooled one turns out closed.
const maxReplayBody = 64 << 10

// Config configures a Client.
type Config struct {
	// Identity is the waypoint's own SPIFFE identity, the source of its
	// HBONE connections. Required.
	Identity spiffeid.ID
	// Dialer opens the HBONE connections to endpoints that have a tunnel.
	// Required; its owner closes it once Run returned.
	Dialer *hbone.Dialer
	// Snapshot returns the current configuration: Run forgets the
	// connections of clusters it no longer has. Required.
	Snapshot func() *config.Snapshot
	// HBONEPort is the endpoints' HBONE port; default 15008.
	HBONEPort uint16
	// DialTCP makes the plain TCP connects to endpoints; default a
	// net.Dialer's.
	DialTCP func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
}

// Client holds the upstream connections and breakers of every cluster.
type Client struct {
	cfg      Config
	h2       *http.Transport // starts the HTTP/2 client connections (newH2ClientConn)
	clusters sync.Map        // cluster name -> *upstream
	drains   sync.WaitGroup  // retired HTTP/2 connections finishing their streams
}

// New returns a client; Run sweeps its idle connections.
func New(cfg Config) (*Client, error) {
	if cfg.Dialer == nil || cfg.Snapshot == nil || cfg.Identity.IsZero() {
		return nil, errors.New("waypoint upstream: Identity, Dialer and Snapshot are required")
	}
	if cfg.HBONEPort == 0 {
		cfg.HBONEPort = apinames.HBONEPort
	}
	if cfg.DialTCP == nil {
		cfg.DialTCP = func(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", a.String())
		}
	}
	return &Client{cfg: cfg, h2: newH2Transport()}, nil
}

// Run closes idle connections past their idle timeout until ctx ends, then
// closes every pooled connection, and returns once the HTTP/2 ones have
// finished their streams (30 s at most).
func (c *Client) Run(ctx context.Context) error {
	c.janitor(ctx)
	c.drains.Wait()
	return nil
}

// Picked is the endpoint a request went to.
type Picked struct {
	Addr     netip.AddrPort
	Endpoint *config.Endpoint // nil for the passthrough cluster
}

// Stats are a cluster's circuit-breaker counters at one moment.
type Stats struct {
	// Connections counts the open connections, idle ones included, and
	// those being opened (max_connections).
	Connections int64
	// Pending counts the requests waiting for a connection
	// (max_pending_requests).
	Pending int64
	// Requests counts the requests whose response is not done yet
	// (max_requests).
	Requests int64
	// Retries counts the retries under way (max_retries, TakeRetry).
	Retries int64
}

// Stats returns cluster's breaker counters; false when the cluster was
// never used.
func (c *Client) Stats(cluster string) (Stats, bool) {
	v, ok := c.clusters.Load(cluster)
	if !ok {
		return Stats{}, false
	}
	b := &v.(*upstream).b
	return Stats{Connections: b.conns.Load(), Pending: b.pending.Load(), Requests: b.requests.Load(), Retries: b.retries.Load()}, true
}

// TakeRetry claims one of cluster's concurrent retries and returns the
// function that gives it back; nil when the budget is spent. A cluster
// missing from snap has no budget: the retry goes, and fails on its own.
func (c *Client) TakeRetry(snap *config.Snapshot, cluster string) func() {
	pl := c.pool(snap, cluster)
	if pl == nil {
		return func() {}
	}
	b := &pl.u.b
	if !take(&b.retries, pl.cluster.MaxRetries) {
		return nil
	}
	return func() { b.retries.Add(-1) }
}

// Dial opens a connection to an endpoint of cluster for a TCP relay (to
// target for an ORIGINAL_DST cluster) and returns it with the endpoint's
// address. The connection holds one of the cluster's connections until
// closed.
func (c *Client) Dial(ctx context.Context, snap *config.Snapshot, cluster string, target netip.AddrPort) (net.Conn, netip.AddrPort, error) {
	if passthrough(snap, cluster) {
		return c.dialPassthrough(ctx, snap, target)
	}
	pl := c.pool(snap, cluster)
	if pl == nil {
		return nil, netip.AddrPort{}, ErrNoHealthy
	}
	b := &pl.u.b
	if !take(&b.conns, pl.cluster.MaxConnections) {
		return nil, netip.AddrPort{}, ErrOverloaded
	}
	tried := map[netip.AddrPort]bool{}
	var last error = ErrNoHealthy
	for range 3 {
		h := pl.pick(tried)
		if h == nil {
			break
		}
		h.active.Add(1)
		ep := h.ep.Load()
		conn, err := c.dialEndpoint(ctx, *ep, pl.cluster.ConnectTimeout)
		if err == nil {
			return &tcpConn{Conn: conn, release: func() { h.active.Add(-1); b.connFreed() }}, ep.Addr, nil
		}
		h.active.Add(-1)
		pl.markFailed(ep.Addr)
		tried[ep.Addr] = true
		last = err
	}
	b.connFreed()
	return nil, netip.AddrPort{}, last
}

// passthrough reports whether cluster sends to the original destination:
// the passthrough cluster, or any other ORIGINAL_DST cluster (a
// ServiceEntry of resolution NONE).
func passthrough(snap *config.Snapshot, cluster string) bool {
	if cluster == config.PassthroughCluster {
		return true
	}
	cl := snap.Clusters[cluster]
	return cl != nil && cl.Passthrough
}

func (c *Client) dialPassthrough(ctx context.Context, snap *config.Snapshot, target netip.AddrPort) (net.Conn, netip.AddrPort, error) {
	// A workload chain covering the target says it speaks HBONE.
	if ch := snap.Chain(target); ch != nil && strings.HasPrefix(ch.Name, "workload/") {
		for _, a := range snap.Assignments {
			for _, ep := range a.Endpoints {
				if ep.Addr.Addr() == target.Addr() && ep.HBONE {
					e := ep
					e.Addr = target
					conn, err := c.dialEndpoint(ctx, e, 10*time.Second)
					return conn, target, err
				}
			}
		}
	}
	conn, err := c.cfg.DialTCP(ctx, target)
	return conn, target, err
}

func (c *Client) dialEndpoint(ctx context.Context, ep config.Endpoint, timeout time.Duration) (net.Conn, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if !ep.HBONE {
		return c.cfg.DialTCP(ctx, ep.Addr)
	}
	peer, err := spiffeid.FromString(ep.Identity)
	if err != nil {
		return nil, fmt.Errorf("endpoint %s identity %q: %w", ep.Addr, ep.Identity, err)
	}
	t := hbone.Target{
		Source:    c.cfg.Identity,
		Peers:     []spiffeid.ID{peer},
		Addr:      netip.AddrPortFrom(ep.Addr.Addr(), c.cfg.HBONEPort),
		Authority: ep.Addr.String(),
	}
	if ep.Authority.IsValid() {
		// A relay (a waypoint): its own HBONE address, asked for the
		// destination behind it.
		t.Addr, t.Authority = ep.Addr, ep.Authority.String()
	}
	return c.cfg.Dialer.Dial(ctx, t)
}

// tcpConn is a TCP relay's upstream connection, holding its slot.
type tcpConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *tcpConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// SetLinger sets the underlying connection's SO_LINGER (an HBONE
// stream's, which with 0 resets it on Close) when it has one: a relay
// resets its upstream when the client's side failed.
func (c *tcpConn) SetLinger(sec int) error {
	if l, ok := c.Conn.(interface{ SetLinger(int) error }); ok {
		return l.SetLinger(sec)
	}
	return nil
}

// CloseWrite half-closes the underlying connection when it can.
func (c *tcpConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
