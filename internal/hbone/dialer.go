package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http2/hpack"
)

// DialerConfig configures a Dialer. Zero fields take the documented defaults.
type DialerConfig struct {
	// TLS returns the client configuration for connections from source whose
	// server must be one of peers, normally spiffe.ClientConfig with source's
	// certificate. Required.
	TLS func(source spiffeid.ID, peers []spiffeid.ID) (*tls.Config, error)
	// MaxStreamsPerConn caps the streams on one connection; default 100
	// (ztunnel's POOL_MAX_STREAMS_PER_CONNECTION). The peer's
	// SETTINGS_MAX_CONCURRENT_STREAMS lowers it further.
	MaxStreamsPerConn int
	// IdleTimeout releases a pooled connection that carried no stream for
	// that long; default 5 min.
	IdleTimeout time.Duration
	// ConnectTimeout bounds the TCP connect and TLS handshake; default 10 s.
	ConnectTimeout time.Duration
	// StreamWindow and ConnWindow are the receive windows; defaults 4 MiB and 16 MiB.
	StreamWindow, ConnWindow uint32
	// MaxHeaderListSize bounds a response header block; default 16 KiB.
	MaxHeaderListSize uint32
	// KeepAlive and KeepAliveTimeout: PING interval and tolerance; defaults
	// 10 s and 20 s; a negative KeepAlive disables them.
	KeepAlive, KeepAliveTimeout time.Duration
	// Control, when set, is called on each new socket before it connects
	// (for SO_MARK and the like).
	Control func(network, address string, c syscall.RawConn) error
	// Dial, when set, replaces the TCP connect (a node proxy dials from
	// inside a pod's network namespace); Control is then not used. source is
	// the Target's SourceIP, possibly invalid.
	Dial func(ctx context.Context, addr netip.AddrPort, source netip.Addr) (net.Conn, error)
	// Logger receives connection-level events; default slog.Default().
	Logger *slog.Logger
}

func (cfg *DialerConfig) setDefaults() {
	if cfg.MaxStreamsPerConn == 0 {
		cfg.MaxStreamsPerConn = 100
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 5 * time.Minute
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	if cfg.StreamWindow == 0 {
		cfg.StreamWindow = DefaultStreamWindow
	}
	if cfg.ConnWindow == 0 {
		cfg.ConnWindow = DefaultConnWindow
	}
	if cfg.MaxHeaderListSize == 0 {
		cfg.MaxHeaderListSize = 16 << 10
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.KeepAliveTimeout == 0 {
		cfg.KeepAliveTimeout = DefaultKeepAliveTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
}

// Validate reports a configuration that cannot work.
func (cfg *DialerConfig) Validate() error {
	switch {
	case cfg.TLS == nil:
		return errors.New("hbone dialer: TLS is required")
	case cfg.MaxStreamsPerConn < 0:
		return errors.New("hbone dialer: MaxStreamsPerConn must not be negative")
	case cfg.StreamWindow != 0 && cfg.StreamWindow < initialWindow || cfg.StreamWindow > maxWindow:
		return fmt.Errorf("hbone dialer: StreamWindow %d is outside %d..%d", cfg.StreamWindow, initialWindow, maxWindow)
	case cfg.ConnWindow != 0 && cfg.ConnWindow < initialWindow || cfg.ConnWindow > maxWindow:
		return fmt.Errorf("hbone dialer: ConnWindow %d is outside %d..%d", cfg.ConnWindow, initialWindow, maxWindow)
	}
	return nil
}

// Target says where a tunnel goes and who may terminate it.
type Target struct {
	// Source is the identity the tunnel is opened as (its certificate is
	// presented); part of the pool key.
	Source spiffeid.ID
	// Peers are the identities the server may present, any of them; part of
	// the pool key. Must not be empty.
	Peers []spiffeid.ID
	// Addr is the next hop, normally <ip>:15008; part of the pool key.
	Addr netip.AddrPort
	// SourceIP, when valid, is the local address to connect from; part of
	// the pool key.
	SourceIP netip.Addr
	// Authority is the CONNECT :authority, for example the pod IP and target
	// port, or the original service VIP and port through a waypoint.
	Authority string
	// Header holds extra CONNECT header fields (forwarded, baggage, traceparent).
	Header http.Header
}

// StatusError reports a CONNECT the server answered with a status other than 200.
type StatusError struct {
	Code      int
	Authority string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("hbone: CONNECT %s answered %d %s", e.Authority, e.Code, http.StatusText(e.Code))
}

// Dialer opens HBONE tunnels over pooled connections. Connections are keyed
// by (source identity, acceptable peer identities, next hop, source IP), as
// ztunnel keys them; a connection carries at most
// MaxStreamsPerConn streams, concurrent dials for one key share one
// handshake, and a connection idle for IdleTimeout is released.
type Dialer struct {
	cfg DialerConfig

	// mu guards the pools. Held before conn.mu, never with conn.wmu; taken
	// under a Stream's rmu or wmu when a connection failing in a Read or
	// Write leaves its pool (onClose).
	mu     sync.Mutex
	pools  map[string]*pool // guarded by mu
	closed bool             // guarded by mu
}

// pool is the set of connections of one key.
type pool struct {
	key     string
	conns   []*conn   // guarded by Dialer.mu
	dialing *dialCall // guarded by Dialer.mu: the handshake in flight, if any
}

type dialCall struct {
	done chan struct{}
	err  error
}

// NewDialer returns a dialer; it starts nothing.
func NewDialer(cfg DialerConfig) (*Dialer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Dialer{cfg: cfg, pools: make(map[string]*pool)}, nil
}

func poolKey(t Target) string {
	peers := make([]string, len(t.Peers))
	for i, p := range t.Peers {
		peers[i] = p.String()
	}
	slices.Sort(peers)
	return strings.Join([]string{t.Source.String(), strings.Join(peers, ","), t.Addr.String(), t.SourceIP.String()}, "|")
}

// Dial opens a tunnel to t. It returns a *StatusError when the server
// answered the CONNECT with an error status.
func (d *Dialer) Dial(ctx context.Context, t Target) (*Stream, error) {
	if len(t.Peers) == 0 {
		return nil, errors.New("hbone: dial needs at least one acceptable peer identity")
	}
	if !t.Addr.IsValid() {
		return nil, errors.New("hbone: dial needs a next-hop address")
	}
	if _, err := ParseAuthority(t.Authority); err != nil {
		return nil, fmt.Errorf("hbone: dial: %w", err)
	}
	key := poolKey(t)
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		c, err := d.conn(ctx, key, t)
		if err != nil {
			return nil, err
		}
		s, err := c.openStream(t.Authority, t.Header)
		if err == nil {
			err = s.awaitResponse(ctx)
		}
		var se *StatusError
		if errors.As(err, &se) {
			se.Authority = t.Authority
		}
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errRefused) && !errors.Is(err, errGoAway) {
			return nil, err
		}
		lastErr = err
	}
	return nil, fmt.Errorf("hbone: dial %s via %s: %w", t.Authority, t.Addr, lastErr)
}

// awaitResponse waits for the CONNECT response of a client stream. A
// response that arrived counts even when the stream ended right after it
// (a reset, the connection's end): the caller gets the stream, which yields
// the data that came with the response and then the error.
func (s *Stream) awaitResponse(ctx context.Context) error {
	select {
	case <-s.respReady:
		return s.responded()
	case <-s.dead:
		if isClosed(s.respReady) {
			return s.responded()
		}
		s.mu.Lock()
		err := s.err
		s.mu.Unlock()
		if err == nil {
			err = net.ErrClosed
		}
		return err
	case <-ctx.Done():
		s.Close()
		return ctx.Err()
	}
}

func (s *Stream) responded() error {
	if s.status != http.StatusOK {
		s.Close()
		return &StatusError{Code: s.status, Authority: ""}
	}
	return nil
}

// conn returns a pooled connection with a stream slot reserved for the caller.
func (d *Dialer) conn(ctx context.Context, key string, t Target) (*conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		if d.closed {
			return nil, net.ErrClosed
		}
		p := d.pools[key]
		if p == nil {
			p = &pool{key: key}
			d.pools[key] = p
		}
		for _, c := range p.conns {
			if c.tryReserve(d.cfg.MaxStreamsPerConn) {
				return c, nil
			}
		}
		if call := p.dialing; call != nil {
			d.mu.Unlock()
			select {
			case <-call.done:
			case <-ctx.Done():
				d.mu.Lock()
				return nil, ctx.Err()
			}
			d.mu.Lock()
			if call.err != nil {
				return nil, call.err
			}
			continue
		}
		call := &dialCall{done: make(chan struct{})}
		p.dialing = call
		d.mu.Unlock()
		// One waiter giving up must not fail the others: dial without its cancellation.
		c, err := d.dialConn(context.WithoutCancel(ctx), t, p)
		d.mu.Lock()
		p.dialing = nil
		call.err = err
		close(call.done)
		if err != nil {
			if len(p.conns) == 0 && d.pools[key] == p {
				delete(d.pools, key)
			}
			return nil, err
		}
		if d.closed {
			d.mu.Unlock()
			c.close()
			d.mu.Lock()
			return nil, net.ErrClosed
		}
		p.conns = append(p.conns, c)
	}
}

// tryReserve takes a stream slot if the connection has one.
func (c *conn) tryReserve(limit int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.goAwayRecv || c.nextID > maxStreamID {
		return false
	}
	if c.reserved >= limit || int64(c.reserved) >= int64(c.peerMaxStreams) {
		return false
	}
	c.reserved++
	return true
}

// unreserve gives back a slot that did not become a stream.
func (c *conn) unreserve() {
	c.mu.Lock()
	c.reserved--
	if c.reserved == 0 {
		c.lastIdle = time.Now()
	}
	idle := c.reserved == 0
	c.mu.Unlock()
	if idle && c.onIdle != nil {
		c.onIdle(c)
	}
}

const maxStreamID = 1<<31 - 1

// openStream sends a CONNECT on a reserved slot.
func (c *conn) openStream(authority string, h http.Header) (*Stream, error) {
	fields := requestFields(authority, h)
	c.wmu.Lock()
	s, err := c.writeConnectLocked(fields)
	c.wmu.Unlock()
	if s == nil && err != nil {
		c.unreserve()
	}
	return s, err
}

// writeConnectLocked allocates the next stream ID and sends the CONNECT;
// the caller holds wmu, which keeps stream IDs in order on the wire.
func (c *conn) writeConnectLocked(fields []hpack.HeaderField) (*Stream, error) {
	c.mu.Lock()
	err := c.err
	if err == nil && (c.goAwayRecv || c.nextID > maxStreamID) {
		err = errRefused
	}
	id := c.nextID
	if err == nil {
		c.nextID += 2
	}
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	s := c.newStreamLocked(id)
	s.respReady = make(chan struct{})
	c.streams[id] = s
	c.mu.Unlock()
	err = c.appendCtrlLocked()
	if err == nil {
		err = c.writeHeadersLocked(id, fields, false)
	}
	if err == nil {
		err = c.flushLocked()
	}
	if err != nil {
		err = fmt.Errorf("sending CONNECT to %s: %w", c.nc.RemoteAddr(), err)
		go c.fail(err)
		return s, err
	}
	return s, nil
}

// dialConn connects, handshakes and starts a pooled connection.
func (d *Dialer) dialConn(ctx context.Context, t Target, p *pool) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.ConnectTimeout)
	defer cancel()
	var raw net.Conn
	var err error
	if d.cfg.Dial != nil {
		raw, err = d.cfg.Dial(ctx, t.Addr, t.SourceIP)
	} else {
		nd := net.Dialer{Control: d.cfg.Control}
		if t.SourceIP.IsValid() {
			nd.LocalAddr = &net.TCPAddr{IP: t.SourceIP.AsSlice()}
		}
		raw, err = nd.DialContext(ctx, "tcp", t.Addr.String())
	}
	if err != nil {
		return nil, fmt.Errorf("hbone: connecting to %s: %w", t.Addr, err)
	}
	tcfg, err := d.cfg.TLS(t.Source, t.Peers)
	if err != nil {
		raw.Close()
		return nil, fmt.Errorf("hbone: TLS config for %s: %w", t.Source, err)
	}
	tcfg = tcfg.Clone()
	tcfg.NextProtos = []string{"h2"}
	tc := tls.Client(newBatchConn(raw), tcfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("hbone: TLS handshake with %s: %w", t.Addr, err)
	}
	if proto := tc.ConnectionState().NegotiatedProtocol; proto != "h2" {
		tc.Close()
		return nil, fmt.Errorf("hbone: %s negotiated ALPN %q, want h2", t.Addr, proto)
	}
	c := newConn(tc, false, connConfig{
		streamWindow:     d.cfg.StreamWindow,
		connWindow:       d.cfg.ConnWindow,
		maxHeaderList:    d.cfg.MaxHeaderListSize,
		keepAlive:        max(d.cfg.KeepAlive, 0),
		keepAliveTimeout: d.cfg.KeepAliveTimeout,
		log:              d.cfg.Logger,
	})
	c.onIdle = func(c *conn) { d.scheduleRelease(p, c) }
	c.onClose = func(c *conn) { d.remove(p, c) }
	if err := c.start(); err != nil {
		return nil, fmt.Errorf("hbone: starting connection to %s: %w", t.Addr, err)
	}
	d.scheduleRelease(p, c)
	return c, nil
}

// scheduleRelease closes c after IdleTimeout unless it carries a stream by then.
func (d *Dialer) scheduleRelease(p *pool, c *conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idleTimer != nil {
		c.idleTimer.Reset(d.cfg.IdleTimeout)
		return
	}
	c.idleTimer = time.AfterFunc(d.cfg.IdleTimeout, func() {
		c.mu.Lock()
		idle := c.reserved == 0 && time.Since(c.lastIdle) >= d.cfg.IdleTimeout-time.Millisecond
		c.mu.Unlock()
		if idle {
			d.remove(p, c)
			c.fail(errIdle)
		}
	})
}

var errIdle = errors.New("hbone: pooled connection released after being idle")

// remove drops c from its pool.
func (d *Dialer) remove(p *pool, c *conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p.conns = slices.DeleteFunc(p.conns, func(x *conn) bool { return x == c })
	if len(p.conns) == 0 && p.dialing == nil && d.pools[p.key] == p {
		delete(d.pools, p.key)
	}
}

// Close closes every pooled connection (and the tunnels on them) and waits
// for their goroutines.
func (d *Dialer) Close() error {
	d.mu.Lock()
	d.closed = true
	var conns []*conn
	for _, p := range d.pools {
		conns = append(conns, p.conns...)
	}
	d.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	return nil
}

// Stats reports the pooled connections and open streams, for metrics and tests.
func (d *Dialer) Stats() (conns, streams int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.pools {
		for _, c := range p.conns {
			conns++
			c.mu.Lock()
			streams += c.reserved
			c.mu.Unlock()
		}
	}
	return conns, streams
}
