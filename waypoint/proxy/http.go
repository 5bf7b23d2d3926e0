package proxy

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/internal/router"
	"github.com/weftmesh/weft/waypoint/internal/upstream"
	"github.com/weftmesh/weft/waypoint/rbac"
	"github.com/weftmesh/weft/waypoint/route"
)

// Limits on the downstream HTTP side.
const (
	maxHeaderBytes       = 60 << 10
	maxConcurrentStreams = 100
)

func idle(d time.Duration) time.Duration {
	if d == 0 {
		return 5 * time.Minute
	}
	return d
}

// serveH2 serves c, a connection that began with the HTTP/2 preface (or a
// TLS connection whose ALPN chose h2), until it ends: net/http's server,
// speaking HTTP/2 only (protos: h2cOnly or h2TLS), on a listener that
// yields c alone.
func (s *session) serveH2(c net.Conn, protos *http.Protocols) {
	l := &connListener{c: c, addr: c.LocalAddr(), done: make(chan struct{})}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if s.handle(w, r, true) {
				// net/http's HTTP/2 server resets the stream for this value
				// and logs nothing.
				panic(http.ErrAbortHandler)
			}
		}),
		Protocols:      protos,
		HTTP2:          &http.HTTP2Config{MaxConcurrentStreams: maxConcurrentStreams, MaxDecoderHeaderTableSize: 4096},
		IdleTimeout:    idle(s.chain.HTTP.IdleTimeout),
		MaxHeaderBytes: maxHeaderBytes,
		// OPTIONS * is routed and authorized as any other request.
		DisableGeneralOptionsHandler: true,
		ConnState:                    l.track,
	}
	srv.Serve(l)
}

// h2cOnly is HTTP/2 with prior knowledge, without TLS and without HTTP/1.
var h2cOnly = func() *http.Protocols {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &p
}()

// connListener hands one connection to an http.Server: Accept returns it,
// then blocks until the server is done with it and says the listener is
// closed, so that Serve returns once the connection ended.
type connListener struct {
	c    net.Conn // nil once accepted; only Serve's goroutine reads it
	addr net.Addr
	done chan struct{} // closed when the server closed the connection
	once sync.Once
}

func (l *connListener) Accept() (net.Conn, error) {
	if c := l.c; c != nil {
		l.c = nil
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

// Close does nothing: the connection's end stops the listener.
func (l *connListener) Close() error { return nil }

func (l *connListener) Addr() net.Addr { return l.addr }

// track is the server's ConnState hook.
func (l *connListener) track(_ net.Conn, st http.ConnState) {
	if st == http.StateClosed || st == http.StateHijacked {
		l.once.Do(func() { close(l.done) })
	}
}

// reqInfo is what the access log and metrics record about a request.
type reqInfo struct {
	status         int
	route, cluster string
	picked         upstream.Picked // the endpoint the last attempt went to
	audit          bool
	auditPolicy    string
	shadow         shadowResult // dry-run policies' verdict
	grpcStatus     string
	// reqMsgs and rspMsgs count a gRPC call's messages each way; nil for
	// other requests.
	reqMsgs, rspMsgs *grpcMessages
	// reqBytes is added to by whoever reads the request body: the handler,
	// or an HTTP/2 upstream's body writer that may outlive the response.
	reqBytes atomic.Int64
	rspBytes int64
	flags    flag
	// aborted: the response broke off after its head was sent, or
	// the client left before it.
	aborted bool
}

type countingBody struct {
	io.ReadCloser
	n    *atomic.Int64
	msgs *grpcMessages // a gRPC call's, else nil
}

func (b countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	if b.msgs != nil {
		b.msgs.feed(p[:n])
	}
	return n, err
}

type countingWriter struct {
	http.ResponseWriter
	n      int64
	status int
	msgs   *grpcMessages // a gRPC call's, else nil
}

func (w *countingWriter) WriteHeader(c int) {
	if w.status == 0 {
		w.status = c
	}
	w.ResponseWriter.WriteHeader(c)
}

func (w *countingWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = 200
	}
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	if w.msgs != nil {
		w.msgs.feed(p[:n])
	}
	return n, err
}

// AdoptHeader hands h to the server's writer when that can take it.
func (w *countingWriter) AdoptHeader(h http.Header) bool {
	a, ok := w.ResponseWriter.(headerAdopter)
	return ok && a.AdoptHeader(h)
}

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// handle serves one request; it reports whether the response broke off
// after its head was sent, which the caller's server must end in error:
// an HTTP/1.1 connection closed without the rest, an HTTP/2 stream reset.
func (s *session) handle(w http.ResponseWriter, r *http.Request, h2 bool) (aborted bool) {
	start := time.Now()
	if r.TLS == nil {
		r.TLS = s.tlsState
	}
	info := &reqInfo{}
	cw := &countingWriter{ResponseWriter: w}
	grpc := strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
	if grpc {
		info.reqMsgs, info.rspMsgs = new(grpcMessages), new(grpcMessages)
		cw.msgs = info.rspMsgs
	}
	if r.ContentLength == 0 {
		// A server's request of length 0 has no body (HTTP/2's
		// END_STREAM on its HEADERS included): upstream it has none
		// either, rather than an empty chunked one.
		r.Body = http.NoBody
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = countingBody{ReadCloser: r.Body, n: &info.reqBytes, msgs: info.reqMsgs}
	}
	unnominate(r.Header)
	tp := traceparent(r.Header.Get("Traceparent"))
	r.Header["Traceparent"] = []string{tp}
	if r.Header.Get("X-Request-Id") == "" {
		// As Envoy: a request without one gets one, and keeps it upstream.
		r.Header.Set("X-Request-Id", requestID())
	}
	s.route(cw, r, h2, info)
	info.status = cw.status
	info.rspBytes = cw.n
	if grpc {
		info.grpcStatus = grpcStatus(cw.Header())
	}
	s.p.record(s, r, info, time.Since(start), tp, grpc)
	return info.aborted
}

// route serves one request: admits it, finds its route, and answers it
// from the route or from upstream.
func (s *session) route(w http.ResponseWriter, r *http.Request, h2 bool, info *reqInfo) {
	snap := s.p.cfg.Store.Snapshot()
	hc := s.httpConfig(snap)
	stream, ok := s.admit(w, r, h2, hc, info)
	if !ok {
		return
	}
	if s.misdirected(snap, r) {
		reply(w, info, replyMisdirected)
		return
	}
	rt := router.Match(snap, hc, r)
	if rt == nil {
		reply(w, info, replyNoRoute)
		return
	}
	info.route = rt.Name
	cors := corsOf(hc, rt, r)
	if hc.CORS && rt.CORS != nil && route.IsPreflight(r) && preflight(w, r, rt.CORS) {
		return
	}
	switch {
	case rt.Direct:
		rt.Response.Apply(w.Header())
		cors(w.Header())
		w.WriteHeader(rt.DirectCode)
		io.WriteString(w, rt.DirectBody)
	case rt.Redirect != nil:
		cors(w.Header())
		router.Redirect(w, r, rt)
	default:
		s.forward(w, r, snap, hc, rt, h2, stream, cors, info)
	}
}

// corsOf returns what adds rt's CORS headers to the response to r: nothing
// when the route has no policy or the chain no CORS filter (Envoy's
// per-filter config needs its filter). It keeps r's Origin: the route's
// header changes to the upstream request must not change the answer.
func corsOf(hc *config.HTTP, rt *route.Route, r *http.Request) func(http.Header) {
	if !hc.CORS || rt.CORS == nil {
		return func(http.Header) {}
	}
	req := http.Header{"Origin": r.Header["Origin"]}
	return func(h http.Header) { rt.CORS.Actual(req, h) }
}

// preflight answers a CORS preflight from the route's policy without
// reaching the upstream, and reports whether it did: one from an origin
// not allowed goes upstream when the policy forwards those.
func preflight(w http.ResponseWriter, r *http.Request, c *route.CORS) bool {
	if !c.Preflight(r.Header, w.Header()) && c.ForwardUnmatched {
		return false
	}
	w.WriteHeader(http.StatusOK)
	return true
}

// admit readies r for routing and authorizes it: an HTTP/2 WebSocket made
// the upgrade it stands for (its stream returned), the target normalized,
// the policies applied. It reports whether r goes on; if not, it was
// answered.
func (s *session) admit(w http.ResponseWriter, r *http.Request, h2 bool, hc *config.HTTP, info *reqInfo) (*wsStream, bool) {
	var stream *wsStream
	if h2 && r.Method == http.MethodConnect && r.Header[":protocol"] != nil {
		if stream = fromExtendedConnect(r); stream == nil {
			reply(w, info, replyUpgradeRefused)
			return nil, false
		}
	}
	if sr := sanitize(r, hc.Path); sr.code != 0 {
		if sr.location != "" {
			w.Header().Set("Location", sr.location)
			w.WriteHeader(sr.code)
		} else {
			reply(w, info, localReply{code: sr.code, body: sr.text})
		}
		return nil, false
	}
	forwarded(r, hc, s.remoteIP, s.scheme)
	rq := route.FromHTTP(r)
	rr := &rbac.Request{HTTP: &rq, Principal: s.peer, RemoteIP: s.remote.Addr(), DstPort: uint32(s.target.Port())}
	if s.remote.IsValid() {
		rr.DirectIP = s.remote.Addr()
	}
	info.shadow = s.p.evaluateShadow(hc.ShadowRBAC, rr)
	for _, f := range hc.RBAC {
		res := f.Evaluate(rr)
		if f.Action == rbac.Log {
			if res.Policy != "" {
				info.audit, info.auditPolicy = true, res.Policy
			}
			continue
		}
		if res.Denied {
			reply(w, info, replyDenied)
			return nil, false
		}
	}
	return stream, true
}

// forward sends r to a cluster of rt (package router: the cluster's
// pick, mirrors, retries) and relays the answer.
func (s *session) forward(w http.ResponseWriter, r *http.Request, snap *config.Snapshot, hc *config.HTTP, rt *route.Route, h2 bool, stream *wsStream, cors func(http.Header), info *reqInfo) {
	ctx := r.Context()
	if timeout := router.Timeout(rt, hc); timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	wc := router.Pick(rt)
	info.cluster = wc.Name
	upgrade := upgradeToken(r, h2)
	if stream != nil {
		upgrade = upgradeWebSocket
	}
	call, err := router.NewCall(ctx, snap, rt, wc, r, s.upstreamH2(r, h2), upgrade)
	if err != nil {
		reply(w, info, replyBadBody)
		return
	}
	call.Target = s.origDst()
	s.p.router.Mirror(call)
	resp, done, err := s.p.router.Send(ctx, call, &info.picked)
	if err != nil {
		if r.Context().Err() != nil {
			// The client left (while the handler runs, nothing else ends
			// its context): the upstream's error is that, not a timeout
			// or failure of the upstream's, and the response ends unsent
			// (a half-closed client reads no made-up answer).
			info.flags = flagDownstreamConnection
			info.aborted = true
			return
		}
		reply(w, info, upstreamFailure(err))
		return
	}
	defer done()
	defer resp.Body.Close()
	s.respond(ctx, w, resp, call, stream, cors, info)
}

// upstreamH2 says whether r, which came over HTTP/2 when h2, goes to a
// cluster that does not ask for HTTP/2 over HTTP/2 all the same. A
// waypoint passes on the client's protocol (the client spoke it to the
// backend's address). A gateway's client chose its protocol with the
// gateway (ALPN, or h2c to the gateway's port), which says nothing of the
// backend: upstream it is HTTP/1.1 unless the cluster asks for HTTP/2 or
// r is gRPC, which needs HTTP/2 all the way, as Istio's gateways do
// (only its sidecars use the downstream protocol).
func (s *session) upstreamH2(r *http.Request, h2 bool) bool {
	if s.listener == "" {
		return h2
	}
	return h2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
}

// headerAdopter is a ResponseWriter that can take the upstream's header as
// its own (h1server's).
type headerAdopter interface{ AdoptHeader(http.Header) bool }

// respond relays resp, the upstream's answer to call, to the client: a
// switch of protocols as a tunnel, anything else as a response. The
// header changes go from the most specific to the least, as Envoy's:
// the backend's, the route's, then CORS.
func (s *session) respond(ctx context.Context, w http.ResponseWriter, resp *http.Response, call *router.Call, stream *wsStream, cors func(http.Header), info *reqInfo) {
	var h http.Header
	// A switch of protocols reads resp's Upgrade later; anything else
	// hands resp's header on when w can take it.
	if a, ok := w.(headerAdopter); ok && stream == nil && resp.StatusCode != http.StatusSwitchingProtocols && a.AdoptHeader(resp.Header) {
		h = resp.Header
	} else {
		h = w.Header()
		for k, vs := range resp.Header {
			h[k] = vs
		}
	}
	router.StripHop(h)
	call.Backend.Response.Apply(h)
	call.Route.Response.Apply(h)
	cors(h)
	delete(h, "Trailer")
	for k := range resp.Trailer {
		h.Add("Trailer", k)
	}
	switch {
	case stream != nil && (resp.StatusCode == http.StatusSwitchingProtocols || resp.StatusCode < 300):
		s.switchedStream(w, resp, stream, info)
		return
	case resp.StatusCode == http.StatusSwitchingProtocols:
		s.switched(w, resp, call.Upgrade, info)
		return
	}
	w.WriteHeader(resp.StatusCode)
	if err := copyBody(w, resp.Body, resp.ContentLength); err != nil {
		// Ending the response normally would pass a truncated body off as
		// complete.
		info.aborted = true
		info.flags = brokenOff(ctx)
		return
	}
	// Trailers are complete once the body is read. Those the upstream did not
	// announce (gRPC's grpc-status, RFC 9113 section 8.1) are only sent
	// under TrailerPrefix.
	for k, vs := range resp.Trailer {
		w.Header()[http.TrailerPrefix+k] = vs
	}
}

// copyBuffers holds the buffers copyBody relays bodies through.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyBody copies an upstream body to the client as it comes: whatever was
// read is flushed at once, unless the body's declared length says it is
// complete, in which case the server's end of response sends it (with the
// head, when it is small) in one write. It returns the upstream's error when
// the body ends other than at its end; a client that went away is not an
// error here.
func copyBody(w http.ResponseWriter, r io.Reader, length int64) error {
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	f, _ := w.(http.Flusher)
	remain := length // -1: unknown
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return nil
			}
			if remain > 0 {
				remain = max(remain-int64(n), 0)
			}
			if f != nil && remain != 0 && err == nil {
				f.Flush()
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the upstream response body: %w", err)
		}
	}
}

// traceparent keeps the trace id and flags of a valid incoming W3C
// traceparent (version 00: 00-<32 hex trace id>-<16 hex span id>-<2 hex
// flags>) with a new span id, or starts a new trace, never sampled: the
// waypoint reports no spans, so whether a trace is recorded is the
// caller's decision. Ids come from math/rand/v2's generator, seeded by the
// runtime from the system's entropy: unique and unguessable enough for an
// id that is no secret, at no system call per request.
func traceparent(in string) string {
	var b [55]byte
	copy(b[:], "00-")
	b[35], b[52] = '-', '-'
	hex64(b[36:52], rand.Uint64())
	if len(in) == len(b) && in[2] == '-' && in[35] == '-' && in[52] == '-' &&
		!strings.Contains(in[:2], "-") && !strings.Contains(in[36:52], "-") &&
		isHex(in[3:35]) && isHex(in[53:]) && in[3:35] != "00000000000000000000000000000000" {
		copy(b[3:35], in[3:35])
		copy(b[53:], in[53:])
	} else {
		hex64(b[3:19], rand.Uint64())
		hex64(b[19:35], rand.Uint64())
		copy(b[53:], "00")
	}
	return string(b[:])
}

// requestID is a new x-request-id, a version 4 UUID (RFC 9562) from the
// same generator as traceparent's ids.
func requestID() string {
	var b [36]byte
	hi := rand.Uint64()&^(0xf<<12) | 4<<12 // version 4
	lo := rand.Uint64()&^(3<<62) | 2<<62   // variant 10
	var x [32]byte
	hex64(x[:16], hi)
	hex64(x[16:], lo)
	copy(b[0:8], x[0:8])
	copy(b[9:13], x[8:12])
	copy(b[14:18], x[12:16])
	copy(b[19:23], x[16:20])
	copy(b[24:], x[20:])
	b[8], b[13], b[18], b[23] = '-', '-', '-', '-'
	return string(b[:])
}

// hex64 writes v as 16 lower-case hex digits into dst.
func hex64(dst []byte, v uint64) {
	const digits = "0123456789abcdef"
	for i := 15; i >= 0; i-- {
		dst[i] = digits[v&0xf]
		v >>= 4
	}
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
