package upstream

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/sockio"
	"github.com/weftmesh/weft/waypoint/config"
)

// Upstream connections and circuit breakers.
//
// Every cluster has an upstream: a breaker with Envoy's
// circuit_breakers.thresholds[0] semantics and, per endpoint, a host that
// keeps idle HTTP/1.1 connections (most recently used first) and the
// shared HTTP/2 client connections of h2c clusters. Both outlive
// configuration pushes that keep the cluster and the endpoint; an endpoint
// that leaves the assignment has its host retired (idle connections closed,
// busy ones closed when their request ends, HTTP/2 ones drained).

const (
	// upstreamIdleTimeout closes a pooled connection unused for that long.
	// It stays under the keep-alive timeouts of common servers (Node.js,
	// Apache httpd and uvicorn close idle connections after 5 s), so that
	// the upstream seldom closes a connection just as a request is sent on
	// it; Envoy's default (common_http_protocol_options.idle_timeout) is
	// 1 h. The liveness check and the retry of a request the upstream
	// never received cover the rest.
	upstreamIdleTimeout = 4 * time.Second
	// janitorInterval is how often idle connections are swept.
	janitorInterval = 2 * time.Second
	// h2DrainTimeout bounds how long a retired HTTP/2 connection may finish
	// its streams.
	h2DrainTimeout = 30 * time.Second
)

// breaker counts what a cluster's circuit-breaker thresholds limit.
type breaker struct {
	conns, pending, requests, retries atomic.Int64

	mu    sync.Mutex
	freed chan struct{} // closed when a connection is freed or pooled; nil when nobody waits
}

// take counts one more in n unless that passes limit.
func take(n *atomic.Int64, limit int) bool {
	if n.Add(1) > int64(limit) {
		n.Add(-1)
		return false
	}
	return true
}

// wait returns a channel closed by the next notify.
func (b *breaker) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed == nil {
		b.freed = make(chan struct{})
	}
	return b.freed
}

// notify wakes the requests waiting for a connection, if any.
func (b *breaker) notify() {
	if b.pending.Load() == 0 {
		return
	}
	b.mu.Lock()
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
	b.mu.Unlock()
}

// connFreed gives back a connection slot.
func (b *breaker) connFreed() {
	b.conns.Add(-1)
	b.notify()
}

// upstream is one cluster's state that outlives configuration versions.
type upstream struct {
	b   breaker
	cur atomic.Pointer[pool]

	mu    sync.Mutex
	hosts map[hostKey]*host // the current version's hosts
}

type hostKey struct {
	addr      netip.AddrPort
	hbone     bool
	identity  string
	authority netip.AddrPort
}

// host is one endpoint's connections.
type host struct {
	// ep is the endpoint as the latest push has it (health and workload
	// labels change); each push stores a new one, so one Load is a
	// consistent view for as long as a request holds it.
	ep     atomic.Pointer[config.Endpoint]
	u      *upstream
	active atomic.Int64 // requests and TCP relays in flight (LEAST_REQUEST)

	mu      sync.Mutex
	idle    []*h1conn // oldest first
	h2      []*h2conn
	retired bool
}

// pool is one configuration version of a cluster: its settings and hosts.
type pool struct {
	cluster *config.Cluster
	u       *upstream
	hosts   []*host
	rr      atomic.Uint64
	ver     *config.Assignment
	cver    *config.Cluster

	mu     sync.Mutex
	failed map[netip.AddrPort]time.Time
}

// pool returns the current pool of a cluster, nil when the cluster or its
// assignment is missing.
func (c *Client) pool(snap *config.Snapshot, name string) *pool {
	cl, ok := snap.Clusters[name]
	a, ok2 := snap.Assignments[name]
	if !ok || !ok2 {
		return nil
	}
	v, ok := c.clusters.Load(name)
	if !ok {
		v, _ = c.clusters.LoadOrStore(name, &upstream{hosts: map[hostKey]*host{}})
	}
	u := v.(*upstream)
	if pl := u.cur.Load(); pl != nil && pl.ver == a && pl.cver == cl {
		return pl
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if pl := u.cur.Load(); pl != nil && pl.ver == a && pl.cver == cl {
		return pl
	}
	pl := &pool{cluster: cl, u: u, ver: a, cver: cl, failed: map[netip.AddrPort]time.Time{}}
	hosts := make(map[hostKey]*host, len(a.Endpoints))
	for _, ep := range a.Endpoints {
		k := hostKey{ep.Addr, ep.HBONE, ep.Identity, ep.Authority}
		h := hosts[k]
		if h == nil {
			h = u.hosts[k]
		}
		if h == nil {
			h = &host{u: u}
		}
		h.ep.Store(&ep) // ep is this iteration's own copy
		hosts[k] = h
		pl.hosts = append(pl.hosts, h)
	}
	for k, h := range u.hosts {
		if _, ok := hosts[k]; !ok {
			c.retire(h)
		}
	}
	u.hosts = hosts
	u.cur.Store(pl)
	return pl
}

// usable reports whether h may be picked: healthy, not in skip and, unless
// anyway, not marked failed in the last 5 s.
func (pl *pool) usable(h *host, skip map[netip.AddrPort]bool, anyway bool) bool {
	ep := h.ep.Load()
	if !ep.Healthy || skip[ep.Addr] {
		return false
	}
	if anyway {
		return true
	}
	pl.mu.Lock()
	t, bad := pl.failed[ep.Addr]
	pl.mu.Unlock()
	return !bad || time.Since(t) > 5*time.Second
}

// pick chooses an endpoint by the cluster's policy; nil when none is usable.
// Endpoints whose connect failed lately are passed over while others are
// left; when none is, they are tried again (Envoy's panic mode), so that a
// cluster whose only endpoint restarted answers as soon as it is back.
func (pl *pool) pick(skip map[netip.AddrPort]bool) *host {
	n := len(pl.hosts)
	if n == 0 {
		return nil
	}
	var best *host
	if pl.cluster.LB == config.LeastRequest {
		// power of two choices
		for _, i := range [2]int{rand.IntN(n), rand.IntN(n)} {
			h := pl.hosts[i]
			if pl.usable(h, skip, false) && (best == nil || h.active.Load() < best.active.Load()) {
				best = h
			}
		}
	}
	for _, anyway := range [2]bool{false, true} {
		if best != nil {
			break
		}
		start := int(pl.rr.Add(1))
		for k := range n {
			if h := pl.hosts[(start+k)%n]; pl.usable(h, skip, anyway) {
				best = h
				break
			}
		}
	}
	return best
}

func (pl *pool) markFailed(a netip.AddrPort) {
	pl.mu.Lock()
	pl.failed[a] = time.Now()
	pl.mu.Unlock()
}

// stealIdle closes one idle HTTP/1.1 connection so that its slot can go to
// h: one of another host, or also of h itself when h's pooled connections
// are not to be used (fresh). It reports whether it freed one.
func (pl *pool) stealIdle(h *host, fresh bool) bool {
	for _, o := range pl.hosts {
		if o == h && !fresh {
			continue
		}
		o.mu.Lock()
		var c *h1conn
		if len(o.idle) > 0 {
			c = o.idle[0]
			o.idle[0] = nil
			o.idle = o.idle[1:]
		}
		o.mu.Unlock()
		if c != nil {
			c.discard()
			return true
		}
	}
	return false
}

// takeConn claims a connection slot for h, closing an idle connection (see
// stealIdle) when the cluster is at max_connections.
func (pl *pool) takeConn(h *host, fresh bool) bool {
	b := &pl.u.b
	return take(&b.conns, pl.cluster.MaxConnections) ||
		pl.stealIdle(h, fresh) && take(&b.conns, pl.cluster.MaxConnections)
}

// lease is a connection handed to one request attempt.
type lease struct {
	h      *host
	h1     *h1conn
	h2     *h2conn
	reused bool
}

// want says what connection a request attempt needs.
type want struct {
	h2    bool // an HTTP/2 stream, not an HTTP/1.1 connection
	fresh bool // a new connection, not a pooled one
	// retryable: the attempt is repeated on a new connection when a pooled
	// one turns out dead (an idempotent request with a replayable body),
	// so a pooled TCP connection is taken without first asking the kernel
	// whether its peer closed it (a syscall per request otherwise).
	retryable bool
}

// checkout returns a connection to an endpoint of pl: a pooled one unless
// w.fresh, else a new one within MaxConnections, else it waits (as one of
// at most MaxPending requests) for one to be freed. A failed dial marks the
// endpoint and moves to another, three endpoints at most.
func (c *Client) checkout(ctx context.Context, pl *pool, w want) (lease, error) {
	useH2, fresh := w.h2, w.fresh
	b := &pl.u.b
	var tried map[netip.AddrPort]bool
	var last error = ErrNoHealthy
	waiting := false
	defer func() {
		if waiting {
			b.pending.Add(-1)
		}
	}()
	for dials := 0; dials < 3; {
		h := pl.pick(tried)
		if h == nil {
			return lease{}, last
		}
		if !fresh {
			if l, ok := h.reuse(useH2, !w.retryable); ok {
				return l, nil
			}
		}
		if !pl.takeConn(h, fresh) {
			if !waiting {
				if !take(&b.pending, pl.cluster.MaxPending) {
					return lease{}, ErrOverloaded
				}
				waiting = true
			}
			ch := b.wait()
			// A connection freed between the checks above and wait would
			// otherwise go unnoticed. (A fresh attempt must not take one:
			// the lease would be dropped with its slot.)
			if !fresh {
				if l, ok := h.reuse(useH2, !w.retryable); ok {
					return l, nil
				}
			}
			if !pl.takeConn(h, fresh) {
				select {
				case <-ch:
					continue
				case <-ctx.Done():
					return lease{}, ctx.Err()
				}
			}
		}
		l, err := c.dialHost(ctx, pl, h, useH2)
		if err == nil {
			return l, nil
		}
		b.connFreed()
		if ctx.Err() != nil {
			// The request ended (its client left, its timeout passed), not
			// the endpoint: a failure here says nothing about the endpoint.
			return lease{}, err
		}
		addr := h.ep.Load().Addr // part of the host's key: it never changes
		pl.markFailed(addr)
		if tried == nil {
			tried = map[netip.AddrPort]bool{}
		}
		tried[addr] = true
		last = err
		dials++
	}
	return lease{}, last
}

// reuse takes a pooled connection of h: an idle HTTP/1.1 one (checked
// live first when probe is set or it is an HBONE stream), or a stream
// reserved on a shared HTTP/2 one.
func (h *host) reuse(useH2, probe bool) (lease, bool) {
	if useH2 {
		if c := h.reserveH2(); c != nil {
			return lease{h: h, h2: c, reused: true}, true
		}
		return lease{}, false
	}
	now := time.Now()
	for {
		h.mu.Lock()
		n := len(h.idle)
		if n == 0 {
			h.mu.Unlock()
			return lease{}, false
		}
		c := h.idle[n-1]
		if now.Sub(c.idleAt) > upstreamIdleTimeout {
			// The newest is too old, so are all the others.
			stale := h.idle
			h.idle = nil
			h.mu.Unlock()
			for _, c := range stale {
				c.discard()
			}
			return lease{}, false
		}
		h.idle[n-1] = nil
		h.idle = h.idle[:n-1]
		h.mu.Unlock()
		// An HBONE stream's check costs nothing; a socket's, a syscall.
		if _, tunneled := c.nc.(*hbone.Stream); (probe || tunneled) && !alive(c.nc) {
			c.discard()
			continue
		}
		return lease{h: h, h1: c, reused: true}, true
	}
}

// dialHost opens a connection to h; the caller holds its connection slot,
// which the connection keeps on success.
func (c *Client) dialHost(ctx context.Context, pl *pool, h *host, useH2 bool) (lease, error) {
	nc, err := c.dialEndpoint(ctx, *h.ep.Load(), pl.cluster.ConnectTimeout)
	if err != nil {
		return lease{}, err
	}
	if !useH2 {
		return lease{h: h, h1: newH1Conn(nc, h)}, nil
	}
	cc, err := c.newH2ClientConn(ctx, nc)
	if err != nil {
		return lease{}, err
	}
	hc := &h2conn{cc: cc, b: &h.u.b}
	// A connection that cannot take the stream fails its round trip.
	cc.Reserve()
	h.mu.Lock()
	retired := h.retired
	if !retired {
		h.h2 = append(h.h2, hc)
	}
	h.mu.Unlock()
	if retired {
		// Not pooled: serves this one request, then closes.
		hc.closeWhenIdle = true
	}
	return lease{h: h, h2: hc}, nil
}

// openConnKey is the context key under which newH2ClientConn hands its
// connection to the transport's dial.
type openConnKey struct{}

// newH2Transport returns the transport that starts the upstream HTTP/2
// client connections: HTTP/2 with prior knowledge on a connection the pool
// opened itself (often an HBONE stream), which its dial hands back.
func newH2Transport() *http.Transport {
	var h2c http.Protocols // without TLS and without HTTP/1
	h2c.SetUnencryptedHTTP2(true)
	return &http.Transport{
		Protocols:       &h2c,
		IdleConnTimeout: upstreamIdleTimeout,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if nc, ok := ctx.Value(openConnKey{}).(net.Conn); ok {
				return nc, nil
			}
			return nil, errors.New("an HTTP/2 upstream connection is started on an open connection only")
		},
	}
}

// newH2ClientConn starts an HTTP/2 client connection on nc, which is
// closed when that fails.
func (c *Client) newH2ClientConn(ctx context.Context, nc net.Conn) (*http.ClientConn, error) {
	return c.startH2(ctx, nc, gatherWait)
}

// startH2 is newH2ClientConn with the time a request's headers wait for
// its body.
func (c *Client) startH2(ctx context.Context, nc net.Conn, wait time.Duration) (*http.ClientConn, error) {
	// The address is not dialled: the transport's dial returns nc, a
	// plain socket's reads and writes made raw system calls, that sends a
	// request's headers with its body (gatherConn).
	cc, err := c.h2.NewClientConn(context.WithValue(ctx, openConnKey{}, newGatherConn(sockio.NewConn(nc), wait)), "http", "upstream:80")
	if err != nil {
		nc.Close()
		return nil, err
	}
	return cc, nil
}

// h2conn is a shared HTTP/2 client connection.
type h2conn struct {
	cc            *http.ClientConn
	b             *breaker
	once          sync.Once
	closeWhenIdle bool
}

// close closes the connection and gives back its slot, once.
func (c *h2conn) close() {
	c.once.Do(func() {
		c.cc.Close()
		c.b.connFreed()
	})
}

// reserveH2 reserves a stream on a usable HTTP/2 connection of h.
func (h *host) reserveH2() *h2conn { return h.scanH2(true) }

// scanH2 drops h's closed HTTP/2 connections and, when reserve is set,
// reserves a stream on the first that has room.
func (h *host) scanH2(reserve bool) *h2conn {
	var got *h2conn
	var dead []*h2conn
	h.mu.Lock()
	keep := h.h2[:0]
	for _, c := range h.h2 {
		if reserve && got == nil && c.cc.Reserve() == nil {
			got = c
		} else if c.spent() {
			dead = append(dead, c)
			continue
		}
		keep = append(keep, c)
	}
	clear(h.h2[len(keep):])
	h.h2 = keep
	h.mu.Unlock()
	for _, c := range dead {
		c.close()
	}
	return got
}

// spent reports whether c is closed, or takes no new stream (after a
// GOAWAY, past its idle timeout) and has none open or reserved.
func (c *h2conn) spent() bool {
	return c.cc.Err() != nil || c.cc.Available() == 0 && c.cc.InFlight() == 0
}

// drain closes c once its streams, open or reserved, are done, or when ctx
// ends.
func (c *h2conn) drain(ctx context.Context) {
	idle := make(chan struct{})
	var once sync.Once
	check := func(cc *http.ClientConn) {
		if cc.InFlight() == 0 || cc.Err() != nil {
			once.Do(func() { close(idle) })
		}
	}
	c.cc.SetStateHook(check) // called as streams end
	check(c.cc)
	select {
	case <-idle:
	case <-ctx.Done():
	}
	c.cc.SetStateHook(nil)
	c.close()
}

// retire stops pooling on h: idle connections close now, busy HTTP/1.1 ones
// when their request ends, HTTP/2 ones once their streams finish.
func (c *Client) retire(h *host) {
	h.mu.Lock()
	h.retired = true
	idle, h2s := h.idle, h.h2
	h.idle, h.h2 = nil, nil
	h.mu.Unlock()
	for _, hc := range idle {
		hc.discard()
	}
	for _, hc := range h2s {
		c.drains.Add(1)
		go func() {
			defer c.drains.Done()
			ctx, cancel := context.WithTimeout(context.Background(), h2DrainTimeout)
			defer cancel()
			hc.drain(ctx)
		}()
	}
}

// sweep closes h's idle connections older than the idle timeout and forgets
// its closed HTTP/2 ones.
func (h *host) sweep(now time.Time) {
	h.mu.Lock()
	i := 0
	for i < len(h.idle) && now.Sub(h.idle[i].idleAt) > upstreamIdleTimeout {
		i++
	}
	stale := slices.Clone(h.idle[:i])
	n := copy(h.idle, h.idle[i:])
	clear(h.idle[n:])
	h.idle = h.idle[:n]
	h.mu.Unlock()
	for _, c := range stale {
		c.discard()
	}
	h.scanH2(false)
}

// janitor sweeps idle connections until ctx ends, then closes them all.
func (c *Client) janitor(ctx context.Context) {
	t := time.NewTicker(janitorInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.clusters.Range(func(k, v any) bool {
				u := v.(*upstream)
				u.mu.Lock()
				for _, h := range u.hosts {
					c.retire(h)
				}
				u.mu.Unlock()
				return true
			})
			return
		case now := <-t.C:
			snap := c.cfg.Snapshot()
			c.clusters.Range(func(k, v any) bool {
				u := v.(*upstream)
				u.mu.Lock()
				gone := snap == nil || snap.Clusters[k.(string)] == nil
				for _, h := range u.hosts {
					if gone {
						c.retire(h)
					} else {
						h.sweep(now)
					}
				}
				if gone {
					u.hosts = map[hostKey]*host{}
					u.cur.Store(nil)
				}
				u.mu.Unlock()
				return true
			})
		}
	}
}
