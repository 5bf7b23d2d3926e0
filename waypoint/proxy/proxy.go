// Package proxy is the waypoint's data path: an HBONE server whose CONNECT
// streams are matched to filter chains, detected as HTTP/1.1, HTTP/2 prior
// knowledge or opaque TCP, authorized, routed and re-originated to the
// chosen endpoint over HBONE (or plain TCP).
//
// In gateway mode (an ingress gateway, gateway.go) the same HTTP and TCP
// machinery serves connections from outside the mesh on the ports of the
// Listeners with an address, in plain TCP or TLS chosen by server name.
//
// Three parts live in packages of their own: the downstream HTTP/1.1
// server (waypoint/internal/h1server); the router, which matches a
// request's route and sends it to the route's cluster with its mirrors and
// retries (waypoint/internal/router); and the upstream side, the clusters'
// connection pools, circuit breakers and HTTP clients
// (waypoint/internal/upstream). What stays here is the HBONE server,
// sniffing, the HTTP/2 server, admission (sanitizing, RBAC, dry-run RBAC),
// TCP relays, upgrades, local replies, metrics and the access log.
package proxy

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/proxytune"
	"github.com/weftmesh/weft/internal/relay"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/internal/h1server"
	"github.com/weftmesh/weft/waypoint/internal/router"
	"github.com/weftmesh/weft/waypoint/internal/upstream"
	"github.com/weftmesh/weft/waypoint/rbac"
)

// Config configures a Proxy.
type Config struct {
	// Identity is the waypoint's own SPIFFE identity. Required.
	Identity spiffeid.ID
	// Certificate returns the current SVID. Required.
	Certificate func() (*tls.Certificate, error)
	// Roots are the mesh trust anchors. Required.
	Roots *x509.CertPool
	// Store holds the xDS configuration. Required.
	Store *config.Store
	// Metrics; default NewMetrics(nil) (unregistered).
	Metrics *Metrics
	// Logger and AccessLog default to slog.Default().
	Logger, AccessLog *slog.Logger
	// UpstreamHBONEPort is the endpoints' HBONE port; default 15008.
	UpstreamHBONEPort uint16
	// DialTCP replaces the plain TCP connect to endpoints (tests).
	DialTCP func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
	// Rand returns a uniform number in [0, max): the pick of a TCP chain's
	// weighted clusters. Default math/rand/v2.Uint64N.
	Rand func(max uint64) uint64
	// Gateway: serve as an ingress gateway (ServeGateway, gateway.go)
	// rather than an HBONE waypoint (Serve). Default false.
	Gateway bool
	// GatewayHost is the address gateway listeners bind; default "", every
	// address of both families (tests bind 127.0.0.1).
	GatewayHost string
}

// Proxy is the waypoint data path.
type Proxy struct {
	cfg      Config
	srv      *hbone.Server
	dialer   *hbone.Dialer
	upstream *upstream.Client
	router   *router.Router
	gw       *gateway // gateway mode only
}

// New returns a proxy; Serve starts it.
func New(cfg Config) (*Proxy, error) {
	if cfg.Certificate == nil || cfg.Roots == nil || cfg.Store == nil || cfg.Identity.IsZero() {
		return nil, errors.New("waypoint proxy: Identity, Certificate, Roots and Store are required")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AccessLog == nil {
		cfg.AccessLog = cfg.Logger
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Uint64N
	}
	p := &Proxy{cfg: cfg}
	var err error
	p.srv, err = hbone.NewServer(hbone.ServerConfig{
		TLS:     spiffe.ServerConfig(cfg.Certificate, cfg.Roots, cfg.Identity.TrustDomain()),
		Handler: hbone.HandlerFunc(p.serveConnect),
		Logger:  cfg.Logger,
		// The pod's grace period is sized by it (the deployer's).
		DrainTimeout: proxytune.Drain,
	})
	if err != nil {
		return nil, err
	}
	p.dialer, err = hbone.NewDialer(hbone.DialerConfig{
		TLS: func(_ spiffeid.ID, peers []spiffeid.ID) (*tls.Config, error) {
			return spiffe.ClientConfig(cfg.Certificate, cfg.Roots, peers), nil
		},
		Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	p.upstream, err = upstream.New(upstream.Config{
		Identity:  cfg.Identity,
		Dialer:    p.dialer,
		Snapshot:  cfg.Store.Snapshot,
		HBONEPort: cfg.UpstreamHBONEPort,
		DialTCP:   cfg.DialTCP,
	})
	if err != nil {
		return nil, err
	}
	p.router = router.New(p.upstream)
	if cfg.Gateway {
		p.gw = newGateway(p, cfg.GatewayHost)
	}
	return p, nil
}

// Serve serves HBONE on ln until ctx ends, then closes the upstream
// connections.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	defer p.dialer.Close()
	jctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.upstream.Run(jctx) }()
	err := p.srv.Serve(ctx, ln)
	stop()
	wg.Wait()
	return err
}

// session is one accepted CONNECT, or one gateway connection.
type session struct {
	p     *Proxy
	chain *config.Chain // the chain chosen for the stream
	proto string        // the protocol detected: config.ProtoHTTP11, config.ProtoH2C or ""
	// target is the CONNECT's target; for a gateway connection, the
	// address it came to.
	target netip.AddrPort
	peer   string // the client's SPIFFE ID; "" for a gateway's client
	remote netip.AddrPort
	// remoteIP is remote's address as X-Forwarded-For gives it, made once
	// per connection (setRemote); "" when remote is unknown.
	remoteIP string
	// listener is a gateway connection's Listener; "" for HBONE.
	listener string
	// scheme is the connection's: "https" for a gateway's TLS, else
	// "http".
	scheme string
	// tlsState is a gateway TLS connection's, given to its requests as
	// net/http's server would (r.TLS); nil otherwise.
	tlsState *tls.ConnectionState
	baggage  map[string]string
	labels   sessionLabels // metric labels of the source and service

	mu    sync.Mutex
	cache map[seriesKey]*series // guarded by mu: the metrics of this session's requests
	seen  *config.Snapshot      // guarded by mu: the snapshot http comes from
	http  *config.HTTP          // guarded by mu: the target's HTTP configuration in seen
}

// setRemote records the client's address.
func (s *session) setRemote(ap netip.AddrPort) {
	s.remote = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if s.remote.IsValid() {
		s.remoteIP = s.remote.Addr().String()
	}
}

// httpConfig returns the HTTP configuration of the session's target in
// snap, so that a listener update (an AuthorizationPolicy added, a timeout
// changed) applies from the next request of an open connection on, not
// only to new connections. A target whose HTTP chain is gone keeps the one
// it had until its connection ends, as Envoy drains a removed chain.
func (s *session) httpConfig(snap *config.Snapshot) *config.HTTP {
	s.mu.Lock()
	defer s.mu.Unlock()
	if snap != s.seen {
		s.seen = snap
		if ch := s.current(snap); ch != nil && ch.HTTP != nil {
			s.http = ch.HTTP
		}
	}
	return s.http
}

// origDst is where a passthrough (ORIGINAL_DST) cluster sends the
// session's requests: the CONNECT's target. A gateway connection has none:
// its destination is the gateway itself, which a passthrough cluster must
// not loop back to, so such a cluster fails to connect (503).
func (s *session) origDst() netip.AddrPort {
	if s.listener != "" {
		return netip.AddrPort{}
	}
	return s.target
}

// current returns the session's chain as snap has it, or nil: for HBONE
// the chain the target and protocol select, for a gateway connection the
// chain of the same name in its listener.
func (s *session) current(snap *config.Snapshot) *config.Chain {
	if s.listener != "" {
		return snap.Listeners[s.listener].ChainNamed(s.chain.Name)
	}
	return snap.Select(s.target, s.proto)
}

// sniffTimeout bounds the wait for the bytes that tell the protocol.
const sniffTimeout = 30 * time.Second

func (p *Proxy) serveConnect(r *hbone.Request) {
	snap := p.cfg.Store.Snapshot()
	target := r.Authority.AddrPort()
	if !r.Authority.IsIP() {
		r.Reject(http.StatusBadRequest)
		return
	}
	chains := snap.Chains(target)
	if len(chains) == 0 {
		p.cfg.AccessLog.Warn("connection refused", "dst_addr", target.String(), "src_identity", r.Peer.String(), "error", "no filter chain for the target", "status", 404)
		r.Reject(http.StatusNotFound)
		return
	}
	s := &session{p: p, target: target, peer: r.Peer.String(), scheme: "http", baggage: map[string]string{}, seen: snap}
	// The source address of IP policy (ipBlocks and remoteIpBlocks alike)
	// is the connection's peer: ztunnel connects from the client pod's own
	// address. The CONNECT's Forwarded for= is written by whoever holds a
	// mesh certificate and decides nothing (ztunnel does not read it
	// either).
	if ta, ok := r.RemoteAddr.(*net.TCPAddr); ok {
		s.setRemote(ta.AddrPort())
	}
	if ms, err := hbone.ParseBaggage(r.Header.Get(hbone.HeaderBaggage)); err == nil {
		for _, m := range ms {
			s.baggage[m.Key] = m.Value
		}
	}
	st, err := r.Accept(nil)
	if err != nil {
		return
	}
	defer st.Close()
	if !config.Detects(chains) {
		// A TCP port: nothing to detect, and a protocol whose server speaks
		// first must not wait for the client.
		if ch := config.SelectFrom(chains, ""); ch != nil && ch.TCP() {
			s.use(ch, "")
			s.serveTCP(st, ch)
			return
		}
	}
	br, hl, kind := sniffConn(st)
	conn := &peekConn{Conn: st, r: br}
	ch := config.SelectFrom(chains, kind.proto())
	if ch == nil {
		p.cfg.AccessLog.Warn("connection refused", "dst_addr", target.String(), "src_identity", s.peer, "error", "no filter chain for the detected protocol", "protocol", kind.String())
		return
	}
	s.use(ch, kind.proto())
	if ch.TCP() {
		s.serveTCP(conn, ch)
		return
	}
	s.serveHTTP(st, br, hl, kind)
}

// serveHTTP serves st, whose first bytes were sniffed as kind and which
// is read through br over hl, on the session's HTTP chain.
func (s *session) serveHTTP(st clientConn, br *bufio.Reader, hl *h1server.HeadLimiter, kind sniffed) {
	switch kind {
	case sniffedH2:
		s.serveH2(&peekConn{Conn: st, r: br}, h2cOnly)
	case sniffedTCP:
		s.refuseNotHTTP(st)
	default:
		// HTTP/1, or bytes that stopped before telling: the HTTP/1 server
		// answers what is malformed.
		h1server.Serve(st, br, hl, h1server.Config{
			Handler:        func(w http.ResponseWriter, r *http.Request) bool { return s.handle(w, r, false) },
			IdleTimeout:    idle(s.chain.HTTP.IdleTimeout),
			MaxHeaderBytes: maxHeaderBytes,
		})
	}
}

// use makes ch, chosen for a stream detected as proto, the session's chain.
func (s *session) use(ch *config.Chain, proto string) {
	s.chain, s.proto = ch, proto
	s.mu.Lock()
	s.http = ch.HTTP
	s.mu.Unlock()
	s.labels = s.sessionLabels()
}

// refuseNotHTTP answers 400 to bytes that are not HTTP on a chain that
// serves only HTTP (a port whose protocol says HTTP), as Envoy's HTTP/1
// codec does, and ends the stream: they are never relayed.
func (s *session) refuseNotHTTP(st clientConn) {
	s.p.cfg.AccessLog.Warn("connection refused", "src_addr", s.remote.String(), "src_identity", s.peer, "dst_addr", s.target.String(),
		"chain", s.chain.Name, "error", "not HTTP on an HTTP port", "status", 400, "response_flags", string(flagDownstreamProtocol))
	h1server.RefuseNotHTTP(st)
}

type sniffed int

const (
	sniffedTCP  sniffed = iota // not HTTP
	sniffedH1                  // an HTTP/1.x request line begins
	sniffedH2                  // the HTTP/2 preface
	sniffedNone                // the stream ended or stalled before telling
)

// proto is the application protocol a chain match sees (what Envoy's HTTP
// inspector reports); "" for a stream not detected as HTTP.
func (k sniffed) proto() string {
	switch k {
	case sniffedH1:
		return config.ProtoHTTP11
	case sniffedH2:
		return config.ProtoH2C
	}
	return ""
}

func (k sniffed) String() string {
	return [...]string{"tcp", "http/1", "h2c", "unknown"}[k]
}

// sniffConn reads as many of c's first bytes as it takes to tell its
// protocol, waiting at most sniffTimeout, through a head limiter (the HTTP
// servers' bound on a request head) into the reader the stream is served
// from.
func sniffConn(c net.Conn) (*bufio.Reader, *h1server.HeadLimiter, sniffed) {
	hl := h1server.NewHeadLimiter(c)
	br := bufio.NewReaderSize(hl, 4096)
	c.SetReadDeadline(time.Now().Add(sniffTimeout))
	kind := sniff(br)
	c.SetReadDeadline(time.Time{})
	return br, hl, kind
}

// sniff tells HTTP/2 with prior knowledge (its whole preface), HTTP/1.x
// and anything else apart from the first bytes of the stream, reading only
// as many as it takes: a short HTTP/1.0 request does not wait for the
// preface's 24 bytes.
//
// HTTP/1.x is a request line's start as RFC 9112 section 3 has it: a
// method that is any token (RFC 9110 section 9.1: case matters, extension
// methods are methods) and a single space, after any empty lines (CRLF or
// a bare LF), which a server ignores before a request line (RFC 9112
// section 2.2). It is what net/http's http.ReadRequest accepts as the
// start of a request, and more (the empty lines). A method that fills the
// whole buffer counts as HTTP/1.x. Bytes that stop (end of stream, read
// deadline) part way into the preface are judged as a request line, since
// that is what they are to an HTTP/1 server; any others that stop before a
// decision are sniffedNone.
func sniff(br *bufio.Reader) sniffed {
	want := 1
	for {
		b, err := br.Peek(want)
		if k := classify(b); k != sniffedNone {
			return k
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			// As much as the buffer holds and still undecided: the empty
			// lines and a method have taken it all, or the preface has not.
			if _, tok := requestLinePrefix(b); tok > 0 {
				return sniffedH1
			}
			return sniffedTCP
		}
		if err != nil {
			if k := requestLine(b); k == sniffedH1 {
				return k
			}
			return sniffedNone
		}
		want = max(br.Buffered(), len(b)+1)
	}
}

// classify decides from the first bytes b of a stream, or returns
// sniffedNone when more are needed.
func classify(b []byte) sniffed {
	preface := []byte(http2.ClientPreface)
	switch {
	case len(b) >= len(preface) && bytes.Equal(b[:len(preface)], preface):
		return sniffedH2
	case len(b) < len(preface) && bytes.HasPrefix(preface, b):
		return sniffedNone // the preface so far (which is also a request line's start)
	}
	return requestLine(b)
}

// requestLine classifies b by its request line alone: sniffedH1 for a
// method and a space, sniffedNone when more bytes are needed, else
// sniffedTCP.
func requestLine(b []byte) sniffed {
	i, tok := requestLinePrefix(b)
	switch {
	case i == len(b):
		return sniffedNone
	case b[i] == ' ' && tok > 0:
		return sniffedH1
	}
	return sniffedTCP
}

// requestLinePrefix skips the empty lines and the method token at the
// start of b; it returns where it stopped and the token's length. It stops
// at len(b) when b may still continue into a request line.
func requestLinePrefix(b []byte) (i, tok int) {
	for i < len(b) {
		switch {
		case b[i] == '\n':
			i++
			continue
		case b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n':
			i += 2
			continue
		case b[i] == '\r' && i+1 == len(b):
			return i + 1, 0 // a CR whose LF may follow
		}
		break
	}
	start := i
	for i < len(b) && b[i] < utf8.RuneSelf && httpguts.IsTokenRune(rune(b[i])) {
		i++
	}
	return i, i - start
}

type peekConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite ends the stream's sending side (a TCP relay passes the
// upstream's half-close on).
func (c *peekConn) CloseWrite() error { return tcpStream{c.Conn}.CloseWrite() }

// SetLinger with 0 makes Close reset the stream (a TCP relay passes the
// upstream's reset on).
func (c *peekConn) SetLinger(sec int) error { return tcpStream{c.Conn}.SetLinger(sec) }

// netRequest is what a network RBAC filter looks at.
func (s *session) netRequest() *rbac.Request {
	r := &rbac.Request{Principal: s.peer, DstPort: uint32(s.target.Port())}
	if s.remote.IsValid() {
		r.RemoteIP, r.DirectIP = s.remote.Addr(), s.remote.Addr()
	}
	return r
}

// authorizeTCP applies a TCP chain's network RBAC filters in order (LOG,
// then DENY and ALLOW as the control plane orders them), as Envoy's
// network RBAC filter does on a connection's first bytes: it reports the
// policy that denied the stream, if one did, and the audit policy that
// matched.
func (s *session) authorizeTCP(ch *config.Chain) (denied bool, policy, audit string) {
	r := s.netRequest()
	for _, f := range ch.NetRBAC {
		res := f.Evaluate(r)
		if f.Action == rbac.Log {
			if res.Policy != "" && audit == "" {
				audit = res.Policy
			}
			continue
		}
		if res.Denied {
			return true, res.Policy, audit
		}
	}
	return false, "", audit
}

// serveTCP relays the stream to an endpoint of ch's cluster once ch's
// network RBAC filters allow it; a denied stream is closed before any
// upstream connection. The chain's latest version applies: a policy
// added while the stream was being sniffed counts.
func (s *session) serveTCP(down net.Conn, ch *config.Chain) {
	start := time.Now()
	snap := s.p.cfg.Store.Snapshot()
	if cur := s.current(snap); cur != nil && cur.TCP() && cur.Name == ch.Name {
		ch = cur
	}
	log := []any{"src_addr", s.remote.String(), "src_identity", s.peer, "dst_addr", s.target.String(), "chain", ch.Name}
	denied, policy, audit := s.authorizeTCP(ch)
	log = s.p.evaluateShadow(ch.NetShadowRBAC, s.netRequest()).appendLog(log)
	if audit != "" {
		log = append(log, "audit", true, "audit_policy", audit)
	}
	if denied {
		s.p.cfg.AccessLog.Info("connection denied", append(log, "response_flags", string(flagRBAC),
			"connection_termination_details", "rbac_access_denied_matched_policy["+cmp.Or(policy, "none")+"]")...)
		return
	}
	// The cluster is picked only for a stream the policies let through: a
	// denied stream reaches no cluster, whatever the weights.
	cluster := ch.PickTCP(s.p.cfg.Rand)
	log = append(log, "cluster", cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, ep, err := s.p.upstream.Dial(ctx, snap, cluster, s.origDst())
	cancel()
	if err != nil {
		s.p.cfg.AccessLog.Warn("connection failed", append(log, "response_flags", string(flagConnectFailure), "error", err.Error())...)
		return
	}
	// bytes_recv is what came from downstream, bytes_sent what went back,
	// as Envoy counts them. A failure either way resets both ends.
	recv, sent, err := relay.Join(down, up, 0)
	log = append(log, "upstream", ep.String(), "bytes_sent", sent, "bytes_recv", recv, "duration_ms", time.Since(start).Milliseconds())
	if err != nil {
		log = append(log, "error", err.Error())
	}
	s.p.cfg.AccessLog.Info("connection complete", log...)
}
