package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/internal/upstream"
	"github.com/weftmesh/weft/waypoint/rbac"
	"github.com/weftmesh/weft/waypoint/route"
)

// Limits on the downstream HTTP side.
const (
	maxHeaderBytes       = 60 << 10
	maxConcurrentStreams = 100
	maxRetryBody         = 64 << 10
	maxMirrors           = 64
)

func idle(d time.Duration) time.Duration {
	if d == 0 {
		return 5 * time.Minute
	}
	return d
}

// serveH2 serves c, a connection that began with the HTTP/2 preface, until
// it ends: net/http's server, speaking HTTP/2 with prior knowledge only,
// on a listener that yields c alone.
func (s *session) serveH2(c net.Conn) {
	l := &connListener{c: c, addr: c.LocalAddr(), done: make(chan struct{})}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if s.handle(w, r, true) {
				// net/http's HTTP/2 server resets the stream for this value
				// and logs nothing.
				panic(http.ErrAbortHandler)
			}
		}),
		Protocols:      h2cOnly,
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
	// aborted: the response broke off after its head was sent.
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
	info := &reqInfo{}
	cw := &countingWriter{ResponseWriter: w}
	grpc := strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
	if grpc {
		info.reqMsgs, info.rspMsgs = new(grpcMessages), new(grpcMessages)
		cw.msgs = info.rspMsgs
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = countingBody{ReadCloser: r.Body, n: &info.reqBytes, msgs: info.reqMsgs}
	}
	tp := traceparent(r.Header.Get("Traceparent"))
	r.Header["Traceparent"] = []string{tp}
	if r.Header.Get("X-Request-Id") == "" {
		// As Envoy: a request without one gets one, and keeps it upstream.
		r.Header.Set("X-Request-Id", uuid.NewString())
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
	var rt *route.Route
	if r.Method != http.MethodConnect {
		// A CONNECT (inside the stream) matches no route: the waypoint
		// opens no tunnel of its own, as Envoy without a connect_matcher.
		rq := route.FromHTTP(r)
		rt = snap.RouteTable(hc).Match(&rq)
	}
	if rt == nil {
		reply(w, info, replyNoRoute)
		return
	}
	info.route = rt.Name
	switch {
	case rt.Direct:
		rt.Response.Apply(w.Header())
		w.WriteHeader(rt.DirectCode)
		io.WriteString(w, rt.DirectBody)
	case rt.Redirect != nil:
		redirect(w, r, rt)
	default:
		s.forward(w, r, snap, hc, rt, h2, stream, info)
	}
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

// upstreamCall is one request on its way to a route's cluster.
type upstreamCall struct {
	snap    *config.Snapshot
	rt      *route.Route
	cluster string
	out     *http.Request // what goes upstream
	body    []byte        // out's body, kept for retries and mirrors; nil when not kept
	h2      bool          // to the upstream over HTTP/2
	upgrade string        // the protocol out asks to switch to, or ""
}

// forward sends r to a cluster of rt, with rt's retries, and relays the
// answer.
func (s *session) forward(w http.ResponseWriter, r *http.Request, snap *config.Snapshot, hc *config.HTTP, rt *route.Route, h2 bool, stream *wsStream, info *reqInfo) {
	ctx := r.Context()
	timeout := rt.Timeout
	if timeout == 0 {
		timeout = hc.RequestTimeout
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	wc := rt.Pick(uint32(mrand.Uint64N(uint64(max(rt.TotalWeight, 1)))))
	info.cluster = wc.Name
	call := &upstreamCall{snap: snap, rt: rt, cluster: wc.Name, h2: h2, upgrade: upgradeToken(r, h2)}
	if stream != nil {
		call.upgrade, call.h2 = upgradeWebSocket, false
	}
	// The handler owns r: its header is edited in place (neither server
	// reads it once the handler runs), everything else is copied.
	out := r.WithContext(ctx)
	out.RequestURI = ""
	out.Close = false // the upstream connection is ours to keep
	stripHop(out.Header)
	if call.upgrade != "" {
		out.Header.Set("Upgrade", call.upgrade)
	}
	rt.Request.Apply(out.Header)
	wc.Request.Apply(out.Header)
	out.URL = upstreamURL(r.URL, rt)
	out.URL.Scheme, out.URL.Host = "http", r.Host
	if rt.HostRewrite != "" {
		out.Host = rt.HostRewrite
	}
	call.out = out
	retryable := rt.Retry != nil && rt.Retry.NumRetries > 0
	hasBody := r.Body != nil && r.Body != http.NoBody
	switch {
	case (retryable || len(rt.Mirrors) > 0) && hasBody && r.ContentLength >= 0 && r.ContentLength <= maxRetryBody:
		b, err := io.ReadAll(io.LimitReader(r.Body, maxRetryBody+1))
		if err != nil {
			reply(w, info, replyBadBody)
			return
		}
		call.body = b
	case retryable && hasBody:
		retryable = false // a body too large to keep goes once
	}
	for _, m := range rt.Mirrors {
		if mrand.Float64()*100 < m.Percent {
			s.p.mirror(snap, m.Cluster, out, call.body, h2)
		}
	}
	attempts := 1
	if retryable {
		attempts += rt.Retry.NumRetries
	}
	resp, done, err := s.tryUpstream(ctx, call, attempts, info)
	if err != nil {
		reply(w, info, upstreamFailure(err))
		return
	}
	defer done()
	defer resp.Body.Close()
	s.respond(ctx, w, resp, call, stream, info)
}

// tryUpstream makes up to attempts attempts at call, with the route's
// back-off between them, until one gets a response its retry policy
// keeps. done ends the kept attempt's timeout once its body is read.
func (s *session) tryUpstream(ctx context.Context, call *upstreamCall, attempts int, info *reqInfo) (resp *http.Response, done func(), err error) {
	policy := call.rt.Retry
	var backoff time.Duration
	if policy != nil {
		backoff = policy.BaseInterval
	}
	var slot func() // the retry budget the attempt under way holds
	for a := 0; ; a++ {
		if a > 0 {
			select {
			case <-time.After(time.Duration(mrand.Int64N(int64(backoff) + 1))):
			case <-ctx.Done():
			}
			backoff = min(backoff*2, policy.MaxInterval)
		}
		var cancel context.CancelFunc
		resp, cancel, err = s.attempt(ctx, call, info)
		if slot != nil {
			slot()
			slot = nil
		}
		if ctx.Err() != nil {
			cancel()
			if resp != nil {
				resp.Body.Close()
			}
			return nil, nil, context.DeadlineExceeded
		}
		last := a == attempts-1 || !shouldRetry(policy, resp, err)
		if !last {
			// Envoy's max_retries: a retry over the cluster's budget is
			// not made and this attempt's outcome stands.
			slot = s.p.upstream.TakeRetry(call.snap, call.cluster)
			last = slot == nil
		}
		if last {
			if err != nil {
				cancel()
				return nil, nil, err
			}
			return resp, cancel, nil
		}
		if resp != nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		cancel()
	}
}

// attempt makes one attempt at call under the route's per-try timeout,
// which cancel ends.
func (s *session) attempt(ctx context.Context, call *upstreamCall, info *reqInfo) (*http.Response, context.CancelFunc, error) {
	out := call.out
	if body := call.body; body != nil {
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	tctx, cancel := ctx, context.CancelFunc(func() {})
	if rt := call.rt; rt.Retry != nil && rt.Retry.PerTryTimeout > 0 {
		tctx, cancel = context.WithTimeout(ctx, rt.Retry.PerTryTimeout)
		out = out.WithContext(tctx)
	}
	resp, err := s.p.upstream.RoundTrip(tctx, call.snap, call.cluster, out, call.h2, s.target, &info.picked)
	return resp, cancel, err
}

// respond relays resp, the upstream's answer to call, to the client: a
// switch of protocols as a tunnel, anything else as a response.
func (s *session) respond(ctx context.Context, w http.ResponseWriter, resp *http.Response, call *upstreamCall, stream *wsStream, info *reqInfo) {
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	stripHop(h)
	call.rt.Response.Apply(h)
	h.Del("Trailer")
	for k := range resp.Trailer {
		h.Add("Trailer", k)
	}
	switch {
	case stream != nil && (resp.StatusCode == http.StatusSwitchingProtocols || resp.StatusCode < 300):
		s.switchedStream(w, resp, stream, info)
		return
	case resp.StatusCode == http.StatusSwitchingProtocols:
		s.switched(w, resp, call.upgrade, info)
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

// upstreamURL is the request's URL with the route's path rewrite applied;
// the caller sets its scheme and host.
func upstreamURL(in *url.URL, rt *route.Route) *url.URL {
	path, q, _ := strings.Cut(in.RequestURI(), "?")
	np := rt.RewritePath(path)
	if np == path && in.Opaque == "" && in.Scheme == "" && in.Host == "" && in.User == nil && !in.ForceQuery && in.Fragment == "" {
		u := *in // an origin-form target, unchanged: what parsing it again would give
		return &u
	}
	if q != "" {
		np += "?" + q
	}
	if u, err := in.Parse(np); err == nil {
		return u
	}
	u := *in
	u.Opaque = ""
	return &u
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

func shouldRetry(p *route.Retry, resp *http.Response, err error) bool {
	if p == nil {
		return false
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return p.On5xx || p.OnGatewayError
		}
		return p.On5xx || p.OnGatewayError || p.OnConnectFailure || p.OnReset
	}
	c := resp.StatusCode
	switch {
	case p.On5xx && c >= 500:
		return true
	case p.OnGatewayError && (c == 502 || c == 503 || c == 504):
		return true
	case p.OnStatus:
		for _, s := range p.StatusCodes {
			if s == c {
				return true
			}
		}
	}
	return false
}

var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Te", "Transfer-Encoding", "Upgrade", "Proxy-Authenticate", "Proxy-Authorization"}

func stripHop(h http.Header) {
	te := strings.Contains(strings.ToLower(h.Get("Te")), "trailers")
	for _, f := range h.Values("Connection") {
		for v := range strings.SplitSeq(f, ",") {
			h.Del(strings.TrimSpace(v))
		}
	}
	for _, n := range hopHeaders {
		h.Del(n)
	}
	if te {
		h.Set("Te", "trailers")
	}
}

func redirect(w http.ResponseWriter, r *http.Request, rt *route.Route) {
	rd := rt.Redirect
	scheme := "http"
	if rd.Scheme != "" {
		scheme = rd.Scheme
	}
	host := r.Host
	hname, port := host, ""
	if h, p, err := net.SplitHostPort(host); err == nil {
		hname, port = h, p
	}
	if rd.Host != "" {
		hname = rd.Host
	}
	if rd.Port != 0 {
		port = strconv.Itoa(int(rd.Port))
	}
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") || (rd.Scheme != "" && rd.Port == 0) {
		port = ""
	}
	path := r.URL.EscapedPath()
	if rd.Path != "" {
		path = rd.Path
	} else if rd.PrefixRewrite != nil {
		cp := *rt
		cp.PrefixRewrite = rd.PrefixRewrite
		path = cp.RewritePath(path)
	}
	loc := scheme + "://" + hname
	if port != "" {
		loc += ":" + port
	}
	loc += path
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	rt.Response.Apply(w.Header())
	w.Header().Set("Location", loc)
	w.WriteHeader(rd.Code)
}

var mirrorSem = make(chan struct{}, maxMirrors)

// mirror sends a copy of req to cluster without waiting; dropped when too
// many mirrors are in flight.
func (p *Proxy) mirror(snap *config.Snapshot, cluster string, req *http.Request, body []byte, h2 bool) {
	select {
	case mirrorSem <- struct{}{}:
	default:
		return
	}
	m := req.Clone(context.Background())
	m.Header = req.Header.Clone()
	m.Header.Del("Upgrade") // a mirror opens no tunnel
	m.Host = req.Host + "-shadow"
	m.Body = http.NoBody
	m.ContentLength = 0
	if body != nil {
		m.Body = io.NopCloser(bytes.NewReader(body))
		m.ContentLength = int64(len(body))
	}
	go func() {
		defer func() { <-mirrorSem }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := p.upstream.RoundTrip(ctx, snap, cluster, m.WithContext(ctx), h2, netip.AddrPort{}, nil)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
}

// traceparent keeps the trace id and flags of a valid incoming W3C
// traceparent (version 00: 00-<32 hex trace id>-<16 hex span id>-<2 hex
// flags>) with a new span id, or starts a new trace, never sampled: the
// waypoint reports no spans, so whether a trace is recorded is the
// caller's decision.
func traceparent(in string) string {
	var r [24]byte
	rand.Read(r[:])
	var b [55]byte
	copy(b[:], "00-")
	b[35], b[52] = '-', '-'
	hex.Encode(b[36:52], r[16:])
	if len(in) == len(b) && in[2] == '-' && in[35] == '-' && in[52] == '-' &&
		!strings.Contains(in[:2], "-") && !strings.Contains(in[36:52], "-") &&
		isHex(in[3:35]) && isHex(in[53:]) && in[3:35] != "00000000000000000000000000000000" {
		copy(b[3:35], in[3:35])
		copy(b[53:], in[53:])
	} else {
		hex.Encode(b[3:35], r[:16])
		copy(b[53:], "00")
	}
	return string(b[:])
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
