// Package proxy is the waypoint's data path: an HBONE server whose CONNECT
// streams are matched to filter chains, detected as HTTP/1.1, HTTP/2 prior
// knowledge or opaque TCP, authorized, routed and re-originated to the
// chosen endpoint over HBONE (or plain TCP).
package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http2"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/waypoint/config"
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
}

// Proxy is the waypoint data path.
type Proxy struct {
	cfg    Config
	srv    *hbone.Server
	dialer *hbone.Dialer
	//lint:ignore SA1019 see dialHost
	h2       *http2.Transport
	clusters sync.Map       // cluster name -> *upstream
	drains   sync.WaitGroup // retired HTTP/2 connections finishing their streams
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
	if cfg.UpstreamHBONEPort == 0 {
		cfg.UpstreamHBONEPort = 15008
	}
	if cfg.DialTCP == nil {
		cfg.DialTCP = func(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", a.String())
		}
	}
	//lint:ignore SA1019 see dialHost
	p := &Proxy{cfg: cfg, h2: &http2.Transport{AllowHTTP: true, IdleConnTimeout: upstreamIdleTimeout}}
	var err error
	p.srv, err = hbone.NewServer(hbone.ServerConfig{
		TLS:     spiffe.ServerConfig(cfg.Certificate, cfg.Roots, cfg.Identity.TrustDomain()),
		Handler: hbone.HandlerFunc(p.serveConnect),
		Logger:  cfg.Logger,
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
	return p, nil
}

// Serve serves HBONE on ln until ctx ends, then closes the upstream
// connections.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	defer p.dialer.Close()
	jctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); p.janitor(jctx) }()
	err := p.srv.Serve(ctx, ln)
	stop()
	wg.Wait()
	p.drains.Wait()
	return err
}

// session is one accepted CONNECT.
type session struct {
	p       *Proxy
	chain   *config.Chain
	target  netip.AddrPort
	peer    string
	remote  netip.AddrPort
	baggage map[string]string
	labels  sessionLabels // metric labels of the source and service

	mu    sync.Mutex
	cache map[seriesKey]*series // guarded by mu: the metrics of this session's requests
	seen  *config.Snapshot      // guarded by mu: the snapshot http comes from
	http  *config.HTTP          // guarded by mu: the target's HTTP configuration in seen
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
		if ch := snap.Chain(s.target); ch != nil && ch.HTTP != nil {
			s.http = ch.HTTP
		}
	}
	return s.http
}

func (p *Proxy) serveConnect(r *hbone.Request) {
	snap := p.cfg.Store.Snapshot()
	target := r.Authority.AddrPort()
	if !r.Authority.IsIP() {
		r.Reject(http.StatusBadRequest)
		return
	}
	ch := snap.Chain(target)
	if ch == nil {
		p.cfg.AccessLog.Warn("connection refused", "dst_addr", target.String(), "src_identity", r.Peer.String(), "error", "no filter chain for the target", "status", 404)
		r.Reject(http.StatusNotFound)
		return
	}
	s := &session{p: p, chain: ch, target: target, peer: r.Peer.String(), baggage: map[string]string{}, seen: snap, http: ch.HTTP}
	// The source address of IP policy (ipBlocks and remoteIpBlocks alike)
	// is the connection's peer: ztunnel connects from the client pod's own
	// address. The CONNECT's Forwarded for= is written by whoever holds a
	// mesh certificate and decides nothing (ztunnel does not read it
	// either).
	if ta, ok := r.RemoteAddr.(*net.TCPAddr); ok {
		s.remote = netip.AddrPortFrom(ta.AddrPort().Addr().Unmap(), ta.AddrPort().Port())
	}
	if ms, err := hbone.ParseBaggage(r.Header.Get(hbone.HeaderBaggage)); err == nil {
		for _, m := range ms {
			s.baggage[m.Key] = m.Value
		}
	}
	s.labels = s.sessionLabels()
	st, err := r.Accept(nil)
	if err != nil {
		return
	}
	defer st.Close()
	if ch.TCPCluster != "" {
		s.serveTCP(st, nil, ch.TCPCluster)
		return
	}
	hl := &headLimiter{r: st}
	br := bufio.NewReaderSize(hl, 4096)
	st.SetReadDeadline(time.Now().Add(30 * time.Second))
	kind := sniff(br)
	st.SetReadDeadline(time.Time{})
	conn := &peekConn{Conn: st, r: br}
	switch kind {
	case sniffedH2:
		s.serveH2(conn)
	case sniffedH1:
		s.serveH1(st, br, hl)
	default:
		if httpPolicy(ch.HTTP) {
			// Bytes that are not HTTP cannot be held to the chain's HTTP
			// policy (a lower-case method is one an application's server
			// takes): they are refused, not relayed past it.
			p.cfg.AccessLog.Warn("connection refused", "dst_addr", target.String(), "src_identity", s.peer, "error", "not HTTP on a chain with HTTP authorization policy")
			return
		}
		fb := ch.HTTP.FallbackCluster
		if fb == "" {
			fb = fallbackCluster(ch, target)
		}
		s.serveTCP(conn, nil, fb)
	}
}

// httpPolicy reports whether h has an RBAC filter that can deny: an ALLOW,
// or a DENY with a policy.
func httpPolicy(h *config.HTTP) bool {
	for _, f := range h.RBAC {
		if f.Action == rbac.Allow || f.Action == rbac.Deny && len(f.Policies) > 0 {
			return true
		}
	}
	return false
}

// fallbackCluster is where a service chain's non-HTTP bytes go.
func fallbackCluster(ch *config.Chain, target netip.AddrPort) string {
	if strings.HasPrefix(ch.Name, "workload/") || ch.HTTP == nil || ch.HTTP.RouteName == "" {
		return config.PassthroughCluster
	}
	host, port, ok := strings.Cut(ch.HTTP.RouteName, ":")
	if !ok {
		return config.PassthroughCluster
	}
	_ = target
	return "outbound|" + port + "||" + host
}

type sniffed int

const (
	sniffedTCP sniffed = iota
	sniffedH1
	sniffedH2
)

// sniff tells HTTP/2 with prior knowledge (its preface), HTTP/1.x (an
// upper-case method and a space) and anything else apart from the first
// bytes of the stream, reading only as many as it takes: a short HTTP/1.0
// request does not wait for the preface's 24 bytes. Bytes that stop before
// a decision (read deadline, end of stream) count as HTTP/1.x when they are
// all method characters.
func sniff(br *bufio.Reader) sniffed {
	preface := []byte(http2.ClientPreface)
	want := 1
	for {
		b, err := br.Peek(want)
		if bytes.Equal(b, preface) {
			return sniffedH2
		}
		if !bytes.HasPrefix(preface, b) || err != nil {
			// Not the preface (or no more bytes): a method and a space?
			i := bytes.IndexFunc(b, func(c rune) bool { return c < 'A' || c > 'Z' })
			switch {
			case i < 0 && len(b) > 0 && (err != nil || len(b) >= len(preface)):
				if err != nil {
					return sniffedH1 // all method characters, then nothing
				}
				return sniffedTCP // no space in as many bytes as the preface
			case i > 0 && b[i] == ' ':
				return sniffedH1
			case i >= 0 || len(b) == 0:
				return sniffedTCP
			}
		}
		want = min(len(preface), max(br.Buffered(), len(b)+1))
	}
}

type peekConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite ends the stream's sending side (a TCP relay passes the
// upstream's half-close on).
func (c *peekConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// serveTCP relays the stream to an endpoint of cluster.
func (s *session) serveTCP(down net.Conn, _ []byte, cluster string) {
	start := time.Now()
	snap := s.p.cfg.Store.Snapshot()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, ep, err := s.p.dialCluster(ctx, snap, cluster, s.target)
	cancel()
	if err != nil {
		s.p.cfg.AccessLog.Warn("connection failed", "src_identity", s.peer, "dst_addr", s.target.String(), "cluster", cluster, "error", err.Error())
		return
	}
	var wg sync.WaitGroup
	var sent, recv int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		sent, _ = io.Copy(up, down)
		closeWrite(up)
	}()
	recv, _ = io.Copy(down, up)
	closeWrite(down)
	wg.Wait()
	up.Close()
	s.p.cfg.AccessLog.Info("connection complete", "src_identity", s.peer, "dst_addr", s.target.String(), "cluster", cluster,
		"upstream", ep.String(), "bytes_sent", sent, "bytes_recv", recv, "duration_ms", time.Since(start).Milliseconds())
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// errNoHealthy means the cluster has no usable endpoint.
var errNoHealthy = errors.New("no healthy upstream")

// dialCluster opens a connection to an endpoint of cluster for a TCP relay;
// it holds one of the cluster's connections until closed.
func (p *Proxy) dialCluster(ctx context.Context, snap *config.Snapshot, cluster string, target netip.AddrPort) (net.Conn, netip.AddrPort, error) {
	if cluster == config.PassthroughCluster {
		return p.dialPassthrough(ctx, snap, target)
	}
	pl := p.pool(snap, cluster)
	if pl == nil {
		return nil, netip.AddrPort{}, errNoHealthy
	}
	b := &pl.u.b
	if !take(&b.conns, pl.cluster.MaxConnections) {
		return nil, netip.AddrPort{}, errOverloaded
	}
	tried := map[netip.AddrPort]bool{}
	var last error = errNoHealthy
	for range 3 {
		h := pl.pick(tried)
		if h == nil {
			break
		}
		h.active.Add(1)
		c, err := p.dialEndpoint(ctx, h.ep, pl.cluster.ConnectTimeout)
		if err == nil {
			return &tcpConn{Conn: c, release: func() { h.active.Add(-1); b.connFreed() }}, h.ep.Addr, nil
		}
		h.active.Add(-1)
		pl.markFailed(h.ep.Addr)
		tried[h.ep.Addr] = true
		last = err
	}
	b.connFreed()
	return nil, netip.AddrPort{}, last
}

func (p *Proxy) dialPassthrough(ctx context.Context, snap *config.Snapshot, target netip.AddrPort) (net.Conn, netip.AddrPort, error) {
	// A workload chain covering the target says it speaks HBONE.
	if ch := snap.Chain(target); ch != nil && strings.HasPrefix(ch.Name, "workload/") {
		for _, a := range snap.Assignments {
			for _, ep := range a.Endpoints {
				if ep.Addr.Addr() == target.Addr() && ep.HBONE {
					e := ep
					e.Addr = target
					c, err := p.dialEndpoint(ctx, e, 10*time.Second)
					return c, target, err
				}
			}
		}
	}
	c, err := p.cfg.DialTCP(ctx, target)
	return c, target, err
}

func (p *Proxy) dialEndpoint(ctx context.Context, ep config.Endpoint, timeout time.Duration) (net.Conn, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if !ep.HBONE {
		return p.cfg.DialTCP(ctx, ep.Addr)
	}
	peer, err := spiffeid.FromString(ep.Identity)
	if err != nil {
		return nil, fmt.Errorf("endpoint %s identity %q: %w", ep.Addr, ep.Identity, err)
	}
	return p.dialer.Dial(ctx, hbone.Target{
		Source:    p.cfg.Identity,
		Peers:     []spiffeid.ID{peer},
		Addr:      netip.AddrPortFrom(ep.Addr.Addr(), p.cfg.UpstreamHBONEPort),
		Authority: ep.Addr.String(),
	})
}
