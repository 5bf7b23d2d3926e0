package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftmesh/weft/internal/accept"
	"github.com/weftmesh/weft/internal/proxytune"
	"github.com/weftmesh/weft/internal/sockio"
	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/internal/h1server"
	"github.com/weftmesh/weft/waypoint/route"
)

// Gateway mode (Config.Gateway, PROXY_MODE=gateway): the proxy takes no
// HBONE streams; it listens itself on the port of every Listener with an
// address in the current configuration, for clients outside the mesh.
//
//   - A Listener that appears is bound, one that goes is closed (its open
//     connections are served until they end, as Envoy drains a listener),
//     one whose port changes is closed and bound again. A port that cannot
//     be bound is logged, tried again every rebindInterval, and keeps
//     GatewayReady false.
//   - A connection on a plain listener is served by its one chain: sniffed
//     as HTTP/1.x or h2c and served as an HBONE stream's would be (the
//     same sanitizing, policy, CORS and routing), relayed by a tcp_proxy
//     chain, refused with 400 when it is not HTTP on an HTTP chain.
//   - On a listener with the TLS inspector every connection is TLS: the
//     ClientHello's server name picks the chain (config.Listener.SelectSNI)
//     in crypto/tls's GetConfigForClient; no chain: the connection is
//     closed without a TLS alert (as Envoy closes a connection no filter
//     chain takes), and no certificate is shown. A chain with a
//     certificate ends TLS and serves
//     HTTP/2 when ALPN chose h2, else HTTP/1.1 (or relays what TLS
//     carries, with tcp_proxy); one without passes the connection through
//     (the bytes read so far replayed) to its tcp_proxy cluster.
//   - Misdirected requests (RFC 9110 section 15.5.20, RFC 9113 section
//     9.1.1): on a connection whose TLS the proxy ended, a request whose
//     Host (or :authority) names a server that another chain of the
//     listener takes, as the ClientHello's server name would pick it
//     (SelectSNI; the name without its port or a trailing dot, in any
//     case), is answered 421 before routing, so that a client which
//     reused the connection for another origin (HTTP/2 coalescing, or a
//     Host that disagrees with the SNI) opens a new one and meets that
//     chain's certificate, policy and routes. A Host that picks the
//     connection's own chain, or no chain, is routed by the chain's route
//     configuration (404 when nothing takes it), as the Gateway API asks.
//   - The client has no mesh identity; the source address of policy is the
//     TCP peer; a connection finds its chain again by listener and chain
//     name in each newer configuration.
//   - Limits: the handshake must end within handshakeTimeout, the sniff
//     within sniffTimeout; heads and idle connections are bounded as on
//     the HBONE side; accept errors back off (internal/accept).

const (
	// handshakeTimeout bounds a TLS handshake, as the HBONE server's.
	handshakeTimeout = 10 * time.Second
	// rebindInterval is how often a port that could not be bound is tried
	// again.
	rebindInterval = 5 * time.Second
	// drainTimeout bounds how long connections may end on their own once
	// the proxy stops; past it they are closed. The pod's grace period is
	// sized by it (the deployer's).
	drainTimeout = proxytune.Drain
	// maxClientHello bounds the bytes kept to replay a passed-through
	// connection's start.
	maxClientHello = 64 << 10
)

// gateway is the proxy's listeners in gateway mode.
type gateway struct {
	p    *Proxy
	host string // what listeners bind; "" for every address

	wg sync.WaitGroup // accept loops and connections

	mu     sync.Mutex
	open   map[string]*gatewayListener // guarded by mu: by Listener name
	failed map[string]string           // guarded by mu: Listener name → why it is not bound
	conns  map[net.Conn]struct{}       // guarded by mu: open connections
}

// gatewayListener is one bound Listener.
type gatewayListener struct {
	name string
	port uint16
	ln   net.Listener
}

func newGateway(p *Proxy, host string) *gateway {
	return &gateway{p: p, host: host, open: map[string]*gatewayListener{}, failed: map[string]string{}, conns: map[net.Conn]struct{}{}}
}

// ServeGateway serves gateway mode until ctx ends, then stops listening,
// lets connections end for up to drainTimeout, closes the rest and the
// upstream connections.
func (p *Proxy) ServeGateway(ctx context.Context) error {
	if p.gw == nil {
		return errors.New("waypoint proxy: ServeGateway needs Config.Gateway")
	}
	defer p.dialer.Close()
	jctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.upstream.Run(jctx) }()
	p.gw.run(ctx)
	stop()
	wg.Wait()
	return nil
}

// GatewayReady reports nil when every Listener with an address in the
// current configuration is bound, else which are not.
func (p *Proxy) GatewayReady() error {
	if p.gw == nil {
		return errors.New("not in gateway mode")
	}
	want := p.cfg.Store.Snapshot().Addressed()
	p.gw.mu.Lock()
	defer p.gw.mu.Unlock()
	var missing []string
	for name, l := range want {
		if gl := p.gw.open[name]; gl == nil || gl.port != l.Addr.Port() {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("listeners not bound: %s", strings.Join(missing, ", "))
	}
	return nil
}

// run keeps the listeners those of the current configuration until ctx
// ends.
func (g *gateway) run(ctx context.Context) {
	for {
		changed := g.p.cfg.Store.Changed()
		retry := g.reconcile(ctx, g.p.cfg.Store.Snapshot())
		var again <-chan time.Time
		if retry {
			again = time.After(rebindInterval)
		}
		select {
		case <-ctx.Done():
			g.shutdown()
			return
		case <-changed:
		case <-again:
		}
	}
}

// reconcile binds and closes listeners to match snap; it reports whether
// a port could not be bound.
func (g *gateway) reconcile(ctx context.Context, snap *config.Snapshot) (failed bool) {
	want := snap.Addressed()
	g.mu.Lock()
	defer g.mu.Unlock()
	for name, gl := range g.open {
		if l, ok := want[name]; !ok || l.Addr.Port() != gl.port {
			gl.ln.Close() // its accept loop ends; its connections drain
			delete(g.open, name)
			g.p.cfg.Logger.Info("gateway listener closed", "listener", name, "port", gl.port)
		}
	}
	for name := range g.failed {
		if _, ok := want[name]; !ok {
			delete(g.failed, name)
		}
	}
	for name, l := range want {
		if g.open[name] != nil {
			continue
		}
		port := l.Addr.Port()
		ln, err := net.Listen("tcp", net.JoinHostPort(g.host, strconv.Itoa(int(port))))
		if err != nil {
			if g.failed[name] != err.Error() {
				g.p.cfg.Logger.Error("gateway listener not bound", "listener", name, "port", port, "error", err.Error())
			}
			g.failed[name] = err.Error()
			continue
		}
		delete(g.failed, name)
		gl := &gatewayListener{name: name, port: port, ln: ln}
		g.open[name] = gl
		g.p.cfg.Logger.Info("gateway listener bound", "listener", name, "port", port)
		g.wg.Add(1)
		go g.acceptLoop(ctx, gl)
	}
	return len(g.failed) > 0
}

// shutdown closes the listeners, waits for connections to end for up to
// drainTimeout, then closes them.
func (g *gateway) shutdown() {
	g.mu.Lock()
	for name, gl := range g.open {
		gl.ln.Close()
		delete(g.open, name)
	}
	g.mu.Unlock()
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(drainTimeout):
	}
	g.mu.Lock()
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	<-done
}

// acceptLoop accepts gl's connections until it is closed.
func (g *gateway) acceptLoop(ctx context.Context, gl *gatewayListener) {
	defer g.wg.Done()
	var b accept.Backoff
	for {
		c, err := gl.ln.Accept()
		if err != nil {
			if accept.Closed(err) {
				return
			}
			if accept.Temporary(err) {
				if b.Wait(ctx) {
					g.p.cfg.Logger.Warn("gateway accept failing, backing off", "listener", gl.name, "error", err.Error())
				}
				continue
			}
			g.p.cfg.Logger.Error("gateway listener failed", "listener", gl.name, "error", err.Error())
			g.mu.Lock()
			if g.open[gl.name] == gl {
				delete(g.open, gl.name)
				g.failed[gl.name] = err.Error()
			}
			g.mu.Unlock()
			gl.ln.Close()
			return
		}
		b.Reset()
		g.mu.Lock()
		g.conns[c] = struct{}{}
		g.mu.Unlock()
		g.wg.Add(1)
		go g.serveGatewayConn(gl.name, c)
	}
}

// serveGatewayConn serves one downstream connection of listener name.
func (g *gateway) serveGatewayConn(name string, c net.Conn) {
	defer g.wg.Done()
	defer func() {
		c.Close()
		g.mu.Lock()
		delete(g.conns, c)
		g.mu.Unlock()
	}()
	snap := g.p.cfg.Store.Snapshot()
	l := snap.Listeners[name]
	if l == nil || len(l.Chains) == 0 {
		return // removed while the connection was being accepted
	}
	s := &session{p: g.p, listener: name, scheme: "http", baggage: map[string]string{}, seen: snap,
		target: addrPort(c.LocalAddr())}
	s.setRemote(addrPort(c.RemoteAddr()))
	if l.TLSInspector {
		s.serveTLS(l, c)
		return
	}
	ch := l.Chains[0]
	if ch.TCP() {
		s.serveDownstream(tcpStream{c}, ch)
		return
	}
	rc := newReadAheadConn(sockio.NewConn(c))
	defer rc.Close()
	s.serveDownstream(rc, ch)
}

func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// serveDownstream serves st, a connection whose chain is ch, once its
// first bytes tell its protocol (a tcp_proxy chain is relayed without).
func (s *session) serveDownstream(st clientConn, ch *config.Chain) {
	if ch.TCP() {
		s.use(ch, "")
		s.serveTCP(st, ch)
		return
	}
	br, hl, kind := sniffConn(st)
	s.use(ch, kind.proto())
	s.serveHTTP(st, br, hl, kind)
}

// errPassthrough ends the handshake of a connection whose chain passes
// TLS through.
var errPassthrough = errors.New("TLS passthrough")

// serveTLS serves a connection of a listener with the TLS inspector: the
// chain the server name picks ends TLS or passes it through.
func (s *session) serveTLS(l *config.Listener, c net.Conn) {
	// TLS reads and writes the socket with raw system calls (see
	// internal/sockio), as plain HTTP does; a passed-through connection is
	// relayed as c (splice(2) between two TCP connections).
	rec := &recordingConn{Conn: sockio.NewConn(c), record: true}
	var ch *config.Chain
	conf := &tls.Config{
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			cur := s.p.cfg.Store.Snapshot().Listeners[s.listener]
			if cur == nil {
				cur = l
			}
			if ch = cur.SelectSNI(hello.ServerName); ch == nil {
				// Closed without an alert, as Envoy closes a connection
				// no filter chain takes.
				rec.mute()
				return nil, fmt.Errorf("no filter chain for server name %q", hello.ServerName)
			}
			if ch.TLS == nil {
				rec.mute() // the alert crypto/tls sends is not for the client
				return nil, errPassthrough
			}
			return &tls.Config{Certificates: ch.TLS.Certificates, NextProtos: ch.TLS.ALPN, MinVersion: tls.VersionTLS12}, nil
		},
	}
	tc := tls.Server(rec, conf)
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	err := tc.Handshake()
	c.SetDeadline(time.Time{})
	switch {
	case errors.Is(err, errPassthrough) && rec.recorded() == nil:
		s.p.cfg.AccessLog.Warn("connection refused", "src_addr", s.remote.String(), "listener", s.listener, "chain", ch.Name,
			"error", "TLS ClientHello too large to pass through", "response_flags", string(flagDownstreamProtocol))
		return
	case errors.Is(err, errPassthrough):
		s.use(ch, "")
		s.serveTCP(&replayConn{Conn: c, head: rec.recorded()}, ch)
		return
	case err != nil:
		s.p.cfg.AccessLog.Warn("connection refused", "src_addr", s.remote.String(), "listener", s.listener, "dst_addr", s.target.String(),
			"error", "TLS handshake: "+err.Error(), "response_flags", string(flagDownstreamProtocol))
		return
	}
	rec.stop()
	if ch.TCP() {
		// TLS ends here and what it carried is relayed.
		s.use(ch, "")
		s.serveTCP(&tlsStream{Conn: tc}, ch)
		return
	}
	cs := tc.ConnectionState()
	s.scheme, s.tlsState = "https", &cs
	if cs.NegotiatedProtocol == "h2" {
		s.use(ch, config.ProtoH2C)
		s.serveH2(tc, h2TLS)
		return
	}
	s.use(ch, config.ProtoHTTP11)
	// As a tlsStream, so that a switched session that breaks resets the
	// client without a close_notify.
	rc := newReadAheadConn(&tlsStream{Conn: tc})
	defer rc.Close()
	hl := h1server.NewHeadLimiter(rc)
	s.serveHTTP(rc, bufio.NewReaderSize(hl, 4096), hl, sniffedH1)
}

// misdirected reports whether r, on a gateway connection whose TLS the
// proxy ended, names by its Host a server that another chain of the
// connection's listener in snap takes (see the package's gateway notes).
func (s *session) misdirected(snap *config.Snapshot, r *http.Request) bool {
	if s.tlsState == nil || s.listener == "" {
		return false
	}
	l := snap.Listeners[s.listener]
	if l == nil || len(l.Chains) < 2 {
		return false
	}
	host := strings.TrimSuffix(route.StripPort(r.Host), ".")
	if host == "" {
		return false
	}
	ch := l.SelectSNI(host)
	return ch != nil && ch.Name != s.chain.Name
}

// h2TLS is HTTP/2 over TLS, negotiated by ALPN.
var h2TLS = func() *http.Protocols {
	var p http.Protocols
	p.SetHTTP2(true)
	return &p
}()

// clientConn is a connection a session serves: an HBONE stream, or a
// gateway's TCP or TLS connection.
type clientConn interface {
	net.Conn
	CloseWrite() error
	AfterPeerEnd(f func()) (stop func() bool)
}

// tcpStream is a gateway's connection relayed by tcp_proxy, as a
// clientConn: the relay sees the client's end itself, so AfterPeerEnd
// never calls. HTTP/1 connections are readAheadConns.
type tcpStream struct{ net.Conn }

func (c tcpStream) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (tcpStream) AfterPeerEnd(func()) func() bool { return func() bool { return false } }

// SetLinger sets the socket's SO_LINGER (below TLS, when TLS ends here):
// with 0, the relay's abort resets the client's connection.
func (c tcpStream) SetLinger(sec int) error {
	nc := c.Conn
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if l, ok := nc.(interface{ SetLinger(int) error }); ok {
		return l.SetLinger(sec)
	}
	return nil
}

// tlsStream is a gateway connection whose TLS the proxy ended, relayed by
// tcp_proxy, as a clientConn. Once the relay aborts (SetLinger(0)), Close
// resets the socket below without the close_notify alert tls.Conn.Close
// sends first: the client would read that alert as a clean end of what it
// was sent, and take an answer the backend's reset cut off for a whole
// one.
type tlsStream struct {
	*tls.Conn
	reset atomic.Bool
}

func (*tlsStream) AfterPeerEnd(func()) func() bool { return func() bool { return false } }

// SetLinger sets the socket's SO_LINGER; with 0, Close resets it.
func (c *tlsStream) SetLinger(sec int) error {
	c.reset.Store(sec == 0)
	return tcpStream{c.Conn}.SetLinger(sec)
}

// Close ends TLS with close_notify and closes the socket, or only resets
// the socket after SetLinger(0).
func (c *tlsStream) Close() error {
	if c.reset.Load() {
		return c.NetConn().Close()
	}
	return c.Conn.Close()
}

// recordingConn keeps what a TLS server reads during the handshake, so
// that a passed-through connection can be replayed, and drops what it
// writes once muted.
type recordingConn struct {
	net.Conn
	mu     sync.Mutex
	record bool   // guarded by mu
	muted  bool   // guarded by mu
	buf    []byte // guarded by mu
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if c.record {
		if len(c.buf)+n > maxClientHello {
			c.record, c.buf = false, nil
		} else {
			c.buf = append(c.buf, p[:n]...)
		}
	}
	c.mu.Unlock()
	return n, err
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	muted := c.muted
	c.mu.Unlock()
	if muted {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// SetLinger sets the socket's SO_LINGER: TLS that ended here is above it.
func (c *recordingConn) SetLinger(sec int) error { return tcpStream{c.Conn}.SetLinger(sec) }

func (c *recordingConn) mute() {
	c.mu.Lock()
	c.muted = true
	c.mu.Unlock()
}

func (c *recordingConn) stop() {
	c.mu.Lock()
	c.record, c.buf = false, nil
	c.mu.Unlock()
}

// recorded returns what was read, or nil when it grew past the bound.
func (c *recordingConn) recorded() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf
}

// replayConn reads head, then the connection.
type replayConn struct {
	net.Conn
	head []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *replayConn) CloseWrite() error { return tcpStream{c.Conn}.CloseWrite() }

func (c *replayConn) SetLinger(sec int) error { return tcpStream{c.Conn}.SetLinger(sec) }
