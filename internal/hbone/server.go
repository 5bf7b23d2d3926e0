package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/weftmesh/weft/internal/accept"
	"github.com/weftmesh/weft/internal/spiffe"
)

// Handler serves one CONNECT stream. It must answer with Accept or Reject;
// a handler that returns without answering is taken to have failed (503).
// The stream is closed when the handler returns, unless it called
// Request.Detach.
type Handler interface {
	ServeHBONE(*Request)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(*Request)

// ServeHBONE calls f(r).
func (f HandlerFunc) ServeHBONE(r *Request) { f(r) }

// Request is a CONNECT that passed the protocol checks, waiting for its
// handler's answer.
type Request struct {
	// Authority is the parsed :authority target.
	Authority Authority
	// Header holds the request's regular header fields (forwarded, baggage,
	// traceparent, ...), canonicalised.
	Header http.Header
	// Peer is the verified SPIFFE ID of the client certificate.
	Peer spiffeid.ID
	// LocalAddr and RemoteAddr are those of the carrying TCP connection.
	LocalAddr, RemoteAddr net.Addr

	s        *Stream
	srv      *Server
	c        *conn
	detached bool
}

// Detach lets the handler return while the stream goes on: the stream is
// then ended, as when a handler returns, by calling the function Detach
// returns (once). The server counts the stream as being served until then,
// so Shutdown waits for it.
func (r *Request) Detach() (done func()) {
	r.detached = true
	d := &detachedStream{srv: r.srv, c: r.c, st: r.s} // not r: its header is done with
	return d.end
}

// detachedStream is what a detached stream's end needs.
type detachedStream struct {
	srv  *Server
	c    *conn
	st   *Stream
	once sync.Once
}

func (d *detachedStream) end() { d.once.Do(func() { d.srv.handled(d.c, d.st) }) }

// Context is done when the stream is reset, the connection ends or the
// server stops.
func (r *Request) Context() context.Context { return streamContext{r.s} }

// Accept answers 200 with the extra header fields h and returns the tunnel.
// Answer only after the upstream is reachable, as ztunnel does.
func (r *Request) Accept(h http.Header) (*Stream, error) {
	if err := r.s.respond(http.StatusOK, h, false); err != nil {
		return nil, err
	}
	return r.s, nil
}

// Reject answers with status (400, 401, 503, ...) and ends the stream.
func (r *Request) Reject(status int) error {
	return r.s.respond(status, nil, true)
}

// respond writes the response HEADERS of a server stream.
func (s *Stream) respond(status int, h http.Header, end bool) error {
	if !s.answered.CompareAndSwap(false, true) {
		return errors.New("hbone: stream already answered")
	}
	fields := appendFields([]hpack.HeaderField{{Name: ":status", Value: strconv.Itoa(status)}}, h)
	c := s.c
	c.wmu.Lock()
	err := c.errOrNil()
	if err == nil {
		err = c.appendCtrlLocked()
	}
	if err == nil {
		err = c.writeHeadersLocked(s.id, fields, end)
	}
	if err == nil {
		s.endWritten = end
		err = c.flushLocked()
	}
	c.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("answering CONNECT: %w", err)
	}
	if end {
		s.mu.Lock()
		s.sendDone = true
		s.mu.Unlock()
	}
	return nil
}

// streamContext is a context whose Done is the stream's end, so a request
// context costs no goroutine.
type streamContext struct{ s *Stream }

func (streamContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c streamContext) Done() <-chan struct{}     { return c.s.dead }
func (streamContext) Value(any) any               { return nil }
func (c streamContext) Err() error {
	if isClosed(c.s.dead) {
		return context.Canceled
	}
	return nil
}

// ServerConfig configures a Server. Zero fields take the documented defaults.
type ServerConfig struct {
	// TLS is the server configuration, normally from spiffe.ServerConfig
	// (TLS 1.3, ALPN h2, client certificates required and verified). Required.
	TLS *tls.Config
	// Handler answers each CONNECT. Required.
	Handler Handler
	// MaxConcurrentStreams per connection; default 200 (ztunnel's server value).
	MaxConcurrentStreams uint32
	// StreamWindow and ConnWindow are the receive windows; defaults 4 MiB and 16 MiB.
	StreamWindow, ConnWindow uint32
	// MaxHeaderListSize bounds a request's header block; default 64 KiB.
	MaxHeaderListSize uint32
	// HandshakeTimeout bounds the TLS handshake; default 10 s.
	HandshakeTimeout time.Duration
	// KeepAlive is the PING interval, KeepAliveTimeout how long an unanswered
	// PING is tolerated; defaults 10 s and 20 s; a negative KeepAlive disables them.
	KeepAlive, KeepAliveTimeout time.Duration
	// DrainTimeout is how long Serve lets open streams finish after its
	// context ends; default 5 s.
	DrainTimeout time.Duration
	// Logger receives connection-level events; default slog.Default().
	Logger *slog.Logger
}

func (cfg *ServerConfig) setDefaults() {
	if cfg.MaxConcurrentStreams == 0 {
		cfg.MaxConcurrentStreams = 200
	}
	if cfg.StreamWindow == 0 {
		cfg.StreamWindow = DefaultStreamWindow
	}
	if cfg.ConnWindow == 0 {
		cfg.ConnWindow = DefaultConnWindow
	}
	if cfg.MaxHeaderListSize == 0 {
		cfg.MaxHeaderListSize = 64 << 10
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.KeepAliveTimeout == 0 {
		cfg.KeepAliveTimeout = DefaultKeepAliveTimeout
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
}

// Validate reports a configuration that cannot work.
func (cfg *ServerConfig) Validate() error {
	switch {
	case cfg.TLS == nil:
		return errors.New("hbone server: TLS config is required")
	case cfg.TLS.ClientAuth != tls.RequireAndVerifyClientCert && cfg.TLS.ClientAuth != tls.RequireAnyClientCert:
		return errors.New("hbone server: TLS config must require client certificates (HBONE is mutual TLS)")
	case cfg.Handler == nil:
		return errors.New("hbone server: Handler is required")
	case cfg.StreamWindow != 0 && cfg.StreamWindow < initialWindow || cfg.StreamWindow > maxWindow:
		return fmt.Errorf("hbone server: StreamWindow %d is outside %d..%d", cfg.StreamWindow, initialWindow, maxWindow)
	case cfg.ConnWindow != 0 && cfg.ConnWindow < initialWindow || cfg.ConnWindow > maxWindow:
		return fmt.Errorf("hbone server: ConnWindow %d is outside %d..%d", cfg.ConnWindow, initialWindow, maxWindow)
	}
	return nil
}

// Server accepts HBONE connections and hands each CONNECT stream to its
// Handler. It answers protocol violations itself: 400 for a method other
// than CONNECT, an extended CONNECT or a bad :authority, 431 for an
// oversized header block, REFUSED_STREAM beyond the stream limit.
type Server struct {
	cfg ServerConfig
	tls *tls.Config

	handlers sync.WaitGroup // handler goroutines

	// mu guards the connection set. A leaf: the connections are told to
	// drain after it is released.
	mu    sync.Mutex
	conns map[*conn]struct{} // guarded by mu
	drain bool               // guarded by mu
}

// NewServer returns a server; it starts nothing.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	tc := cfg.TLS.Clone()
	tc.NextProtos = []string{"h2"}
	if tc.MinVersion < tls.VersionTLS13 {
		tc.MinVersion = tls.VersionTLS13
	}
	return &Server{cfg: cfg, tls: tc, conns: make(map[*conn]struct{})}, nil
}

// Serve accepts connections on ln until ctx ends, then stops accepting, sends
// GOAWAY, lets open streams finish for DrainTimeout, closes what is left and
// returns once every connection and handler goroutine has exited.
//
// Temporary accept errors (out of file descriptors or memory, a connection
// aborted before it was accepted) pause accepting with a backoff of 5 ms
// doubling to 1 s, logged once per run. A closed listener ends Serve with
// nil; any other accept error ends it with that error.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	var conns sync.WaitGroup
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var err error
	var backoff accept.Backoff
	for {
		var nc net.Conn
		nc, err = ln.Accept()
		if err != nil {
			if ctx.Err() != nil || accept.Closed(err) {
				err = nil
				break
			}
			if accept.Temporary(err) {
				if backoff.Wait(ctx) {
					s.cfg.Logger.Warn("accepting HBONE connections failed; retrying", "addr", ln.Addr().String(), "error", err.Error())
				}
				continue
			}
			err = fmt.Errorf("accepting HBONE connections: %w", err)
			break
		}
		backoff.Reset()
		conns.Add(1)
		go func() {
			defer conns.Done()
			s.ServeConn(ctx, nc)
		}()
	}
	ln.Close()
	s.Shutdown(s.cfg.DrainTimeout)
	conns.Wait()
	s.handlers.Wait()
	return err
}

// Shutdown sends GOAWAY on every connection, waits up to timeout for their
// streams to finish, then closes them.
func (s *Server) Shutdown(timeout time.Duration) {
	s.mu.Lock()
	s.drain = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.goAway()
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for _, c := range conns {
		select {
		case <-c.done:
		case <-deadline.C:
			for _, c := range conns {
				c.fail(errors.New("hbone: server shut down"))
			}
			return
		}
	}
}

// lateHandshake is how long a handshake in progress when the server
// begins to drain may still take.
const lateHandshake = time.Second

// draining reports whether Shutdown has begun.
func (s *Server) draining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drain
}

// ServeConn runs the TLS handshake on nc and serves it until it ends.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) {
	log := s.cfg.Logger
	tc := tls.Server(newBatchConn(nc), s.tls)
	// A drain does not cut a handshake short: the connection was accepted,
	// and once it is up it is told GOAWAY below, which its client retries
	// elsewhere; closing it here would reset what it carries. It gets
	// lateHandshake to finish, so that a peer that never completes one
	// does not hold the drain for HandshakeTimeout.
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.HandshakeTimeout)
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(lateHandshake, cancel) })
	err := tc.HandshakeContext(hctx)
	stop()
	cancel()
	if err != nil {
		log.Debug("HBONE handshake failed", "peer", nc.RemoteAddr().String(), "error", err.Error())
		nc.Close()
		return
	}
	cs := tc.ConnectionState()
	peer, err := spiffe.PeerID(cs)
	if err == nil && cs.NegotiatedProtocol != "h2" {
		err = fmt.Errorf("peer negotiated ALPN %q, want h2", cs.NegotiatedProtocol)
	}
	if err != nil {
		log.Debug("HBONE peer refused", "peer", nc.RemoteAddr().String(), "error", err.Error())
		tc.Close()
		return
	}
	c := newConn(tc, true, connConfig{
		streamWindow:     s.cfg.StreamWindow,
		connWindow:       s.cfg.ConnWindow,
		maxHeaderList:    s.cfg.MaxHeaderListSize,
		maxStreams:       s.cfg.MaxConcurrentStreams,
		keepAlive:        max(s.cfg.KeepAlive, 0),
		keepAliveTimeout: s.cfg.KeepAliveTimeout,
		log:              log,
	})
	c.onStream = func(st *Stream, f *http2.MetaHeadersFrame) {
		s.handlers.Add(1)
		go s.serveStream(c, st, f, peer)
	}
	s.mu.Lock()
	s.conns[c] = struct{}{}
	late := s.drain
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	if err := c.start(); err != nil {
		return
	}
	// A connection that came up after Shutdown took its list is told
	// GOAWAY at once, so that its client opens its streams on a new
	// connection (a successor's, listening beside us) rather than losing
	// them to a close.
	if late {
		c.goAway()
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		c.goAway()
		t := time.NewTimer(s.cfg.DrainTimeout)
		select {
		case <-c.done:
		case <-t.C:
			c.fail(errors.New("hbone: server shut down"))
		}
		t.Stop()
	}
	c.loops.Wait()
}

// serveStream checks one CONNECT and runs the handler. The handler may
// relay the stream for its whole life, so this frame stays small: the
// request is built in a function of its own.
func (s *Server) serveStream(c *conn, st *Stream, f *http2.MetaHeadersFrame, peer spiffeid.ID) {
	req := newRequest(s, c, st, f, peer)
	if req == nil {
		s.streamDone(c, st)
		return
	}
	s.cfg.Handler.ServeHBONE(req)
	if !req.detached {
		s.handled(c, st)
	}
}

// handled ends st once its handler is done with it: a stream its handler
// never answered is answered 503.
func (s *Server) handled(c *conn, st *Stream) {
	if !st.answered.Load() && !isClosed(st.dead) {
		_ = st.respond(http.StatusServiceUnavailable, nil, true)
	}
	s.streamDone(c, st)
}

// streamDone closes st once its handler returned and frees its slot.
func (s *Server) streamDone(c *conn, st *Stream) {
	st.Close()
	c.handlerDone(st)
	s.handlers.Done()
}

// newRequest returns st's request, or nil when it was refused (and
// answered so).
func newRequest(srv *Server, c *conn, st *Stream, f *http2.MetaHeadersFrame, peer spiffeid.ID) *Request {
	req, status := parseRequest(f)
	if status != 0 {
		_ = st.respond(status, nil, true)
		return nil
	}
	req.Peer = peer
	req.LocalAddr = c.nc.LocalAddr()
	req.RemoteAddr = c.nc.RemoteAddr()
	req.s, req.srv, req.c = st, srv, c
	return req
}

// parseRequest applies the HBONE request rules: a plain
// RFC 9113 CONNECT with a host:port authority. It returns a status to answer
// with when the request is refused.
func parseRequest(f *http2.MetaHeadersFrame) (*Request, int) {
	if f.PseudoValue("method") != http.MethodConnect {
		return nil, http.StatusBadRequest
	}
	if f.PseudoValue("protocol") != "" || f.PseudoValue("scheme") != "" || f.PseudoValue("path") != "" {
		return nil, http.StatusBadRequest // extended CONNECT is not HBONE
	}
	auth, err := ParseAuthority(f.PseudoValue("authority"))
	if err != nil {
		return nil, http.StatusBadRequest
	}
	h := make(http.Header, len(f.Fields))
	for _, hf := range f.RegularFields() {
		h.Add(hf.Name, hf.Value)
	}
	return &Request{Authority: auth, Header: h}, 0
}
