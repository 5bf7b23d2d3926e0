// Package h1server is the waypoint's downstream HTTP/1.1 server (RFC 9112):
// it serves the requests of one HBONE stream (or one connection of a
// gateway, TCP or TLS), one at a time, to a handler.
//
// It is our own rather than net/http's, which serves only from a listener,
// reads in a goroutine of its own during every request to notice a client
// leaving, and moves the read deadline several times per request; here the
// stream says when the client left (Stream.AfterPeerEnd), and a
// request costs the parsing (http.ReadRequest) and one write of the
// response.
//
// It keeps what clients see of net/http's server: requests answered one at
// a time in order (pipelined ones wait in the buffer); keep-alive for
// HTTP/1.1 unless either side says Connection: close, and for HTTP/1.0 with
// Connection: keep-alive; 400 for a malformed request, a missing or bad
// Host or an invalid header, 431 past Config.MaxHeaderBytes, 501 for an unknown
// transfer coding, 505 for another major version, 417 for an expectation
// other than 100-continue, each ending the connection; 100 Continue sent
// when the body is first read; a body the handler left unread skipped up to
// 256 KiB, past that the connection ends; responses framed by the declared
// length, by a length the server computes for a small body sent at the end,
// chunked with trailers (announced in Trailer or set with
// http.TrailerPrefix), or for HTTP/1.0 by the end of the connection; HEAD,
// 1xx, 204 and 304 without a body; a Date header; a response that breaks
// off ends the connection without its last chunk. Unlike net/http it does
// not guess a Content-Type from the body, and it cancels a request only
// when its client ended its side of the stream (net/http also cancels it
// when it cannot read the connection).
package h1server

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

const (
	// headerTimeout bounds reading a request's head (net/http's
	// ReadHeaderTimeout as the waypoint set it).
	headerTimeout = 30 * time.Second
	// maxDiscard is how much of a request body left unread by its handler
	// is skipped to keep the connection (net/http's amount).
	maxDiscard = 256 << 10
	// lingerTimeout is how long a connection that is ended after a response
	// reads what the client still sends before it closes, so that the
	// response is not lost to the reset a close with unread data sends (RFC
	// 9112 section 9.6).
	lingerTimeout = 500 * time.Millisecond
	// maxBufferedBody is how much body a response keeps before it writes
	// its head, to send a small body with a length rather than chunked.
	maxBufferedBody = 4 << 10
	// maxOut is how much response the server gathers before it writes to
	// the stream without being asked to flush.
	maxOut = 64 << 10
)

// errTooLarge is HeadLimiter's error past its limit.
var errTooLarge = errors.New("request head too large")

// HeadLimiter is the stream under the server's bufio.Reader (the sniffer
// reads through it first). While a request head is read it lets through at
// most remain bytes (net/http's limit: the maximum header bytes and 4 KiB);
// it keeps the stream's last error, which tells a failed read from a
// malformed request.
type HeadLimiter struct {
	r      io.Reader
	limit  bool
	remain int
	err    error
}

func (l *HeadLimiter) Read(p []byte) (int, error) {
	if l.limit {
		if l.remain <= 0 {
			l.err = errTooLarge
			return 0, errTooLarge
		}
		p = p[:min(len(p), l.remain)]
	}
	n, err := l.r.Read(p)
	if l.limit {
		l.remain -= n
	}
	if err != nil {
		l.err = err
	}
	return n, err
}

// NewHeadLimiter returns the limiter to read r through.
func NewHeadLimiter(r io.Reader) *HeadLimiter { return &HeadLimiter{r: r} }

// Handler serves one request; it reports whether the response broke off
// after its head was sent, which ends the connection without the rest.
type Handler func(w http.ResponseWriter, r *http.Request) (aborted bool)

// Config is what a connection's server needs besides the stream.
type Config struct {
	Handler Handler
	// IdleTimeout bounds the wait for the next request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request head (431 past it, with 4 KiB of
	// slack as net/http).
	MaxHeaderBytes int
}

// Stream is the connection a server serves: an HBONE stream
// (*hbone.Stream), or a gateway's TCP or TLS connection.
type Stream interface {
	io.Writer
	SetReadDeadline(time.Time) error
	CloseWrite() error
	// AfterPeerEnd calls f once the client has ended its side, or failed;
	// stop stops that. A connection that cannot tell without reading
	// never calls f: its requests end with their own timeouts.
	AfterPeerEnd(f func()) (stop func() bool)
}

// h1Server serves the requests of one stream, one at a time.
type h1Server struct {
	cfg Config
	st  Stream
	hl  *HeadLimiter
	br  *bufio.Reader // over hl

	// wmu orders what the handler writes after a 100 Continue that a body
	// reader in another goroutine (an HTTP/2 upstream's) may send.
	wmu      sync.Mutex
	headSent bool // guarded by wmu: the current response's head is written

	out  []byte  // the current response's bytes not yet written
	outp *[]byte // out's pooled buffer, when it has one

	mu   sync.Mutex
	ctx  *requestContext // guarded by mu: the running request's
	left bool            // guarded by mu: the client ended its side
}

// outBuffers holds response buffers between responses, so that an idle
// connection holds none.
var outBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// Serve serves the requests of st, read through br over hl, until the
// connection ends.
func Serve(st Stream, br *bufio.Reader, hl *HeadLimiter, cfg Config) {
	c := &h1Server{cfg: cfg, st: st, hl: hl, br: br}
	// One watcher for the stream's life cancels whichever request runs
	// when the client leaves.
	defer st.AfterPeerEnd(c.clientLeft)()
	idleTimeout := cfg.IdleTimeout
	for first := true; ; first = false {
		deadline := false
		if !first && br.Buffered() == 0 {
			// Between requests only the idle timeout applies.
			st.SetReadDeadline(time.Now().Add(idleTimeout))
			deadline = true
			if _, err := br.Peek(1); err != nil {
				return
			}
		}
		// A head that is in the buffer already cannot stall; moving the
		// deadline costs a timer operation, so it is left alone then.
		if !headBuffered(br) {
			st.SetReadDeadline(time.Now().Add(headerTimeout))
			deadline = true
		}
		hl.limit, hl.remain, hl.err = true, cfg.MaxHeaderBytes+4<<10, nil
		skipEmptyLines(br)
		req, err := http.ReadRequest(br)
		hl.limit = false
		if deadline {
			st.SetReadDeadline(time.Time{})
		}
		if err == nil {
			err = checkRequest(req)
		}
		if err != nil {
			c.refuse(err)
			return
		}
		if !c.serve(req) {
			return
		}
	}
}

// skipEmptyLines drops the empty lines (CRLF or a bare LF) before a
// request line, as a server should (RFC 9112 section 2.2) and as the
// sniffer does when it takes a stream for HTTP/1.x: http.ReadRequest
// would refuse them. The head limit bounds how many.
func skipEmptyLines(br *bufio.Reader) {
	for {
		b, err := br.Peek(1)
		switch {
		case err != nil:
			return
		case b[0] == '\n':
			br.Discard(1)
			continue
		case b[0] != '\r':
			return
		}
		if b, err = br.Peek(2); err != nil || b[1] != '\n' {
			return
		}
		br.Discard(2)
	}
}

// headBuffered reports whether the buffer holds a whole request head.
func headBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.Contains(b, []byte("\r\n\r\n"))
}

// clientLeft cancels the request in progress, if any: its client ended its
// side of the stream.
func (c *h1Server) clientLeft() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.left = true
	if c.ctx != nil {
		c.ctx.cancel()
	}
}

// requestError is a request refused before its handler runs.
type requestError struct {
	code int
	text string
}

func (e *requestError) Error() string { return e.text }

// checkRequest applies the rules net/http's server adds to
// http.ReadRequest's (a Host required in HTTP/1.1, valid fields).
func checkRequest(req *http.Request) error {
	if req.ProtoMajor != 1 {
		return &requestError{http.StatusHTTPVersionNotSupported, "unsupported protocol version"}
	}
	// http.ReadRequest took the Host field out of the header (or the host
	// of an absolute URI).
	if req.ProtoAtLeast(1, 1) && req.Host == "" && req.Method != "CONNECT" {
		return &requestError{http.StatusBadRequest, "missing required Host header"}
	}
	if req.Host != "" && !httpguts.ValidHostHeader(req.Host) {
		return &requestError{http.StatusBadRequest, "malformed Host header"}
	}
	for k, vs := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return &requestError{http.StatusBadRequest, "invalid header name"}
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return &requestError{http.StatusBadRequest, "invalid header value"}
			}
		}
	}
	return nil
}

// RefuseNotHTTP answers 400 on st, whose bytes are not HTTP, and ends
// its sending side.
func RefuseNotHTTP(st interface {
	Stream
	io.Reader
}) {
	c := &h1Server{st: st, hl: NewHeadLimiter(st)}
	c.br = bufio.NewReader(c.hl)
	c.refuse(&requestError{http.StatusBadRequest, "not an HTTP request"})
}

// refuse answers a request that could not be read or was refused before
// routing, as net/http does, and ends the connection. A stream that failed
// or ended gets no answer.
func (c *h1Server) refuse(err error) {
	var re *requestError
	code, text := http.StatusBadRequest, ""
	switch {
	case errors.Is(err, errTooLarge):
		code = http.StatusRequestHeaderFieldsTooLarge
	case c.hl.err != nil && (errors.Is(err, c.hl.err) || c.hl.err == io.EOF && errors.Is(err, io.ErrUnexpectedEOF)):
		return
	case errors.As(err, &re):
		code, text = re.code, re.text
	case strings.Contains(err.Error(), "transfer encoding"): // http.ReadRequest's unsupportedTEError
		code, text = http.StatusNotImplemented, "Unsupported transfer encoding"
	}
	msg := strconv.Itoa(code) + " " + http.StatusText(code)
	if text != "" {
		msg += ": " + text
	}
	io.WriteString(c.st, "HTTP/1.1 "+msg+"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"+msg)
	c.linger()
}

// linger ends the sending side and reads what the client still sends for
// a little while, so that the answer written before is not lost to a
// reset (the caller then closes the stream).
func (c *h1Server) linger() {
	c.st.CloseWrite()
	c.st.SetReadDeadline(time.Now().Add(lingerTimeout))
	io.Copy(io.Discard, c.br)
}

// serve runs one request; it reports whether the connection goes on.
func (c *h1Server) serve(req *http.Request) bool {
	ctx := newRequestContext()
	c.mu.Lock()
	if c.left {
		ctx.cancel()
	}
	c.ctx = ctx
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.ctx = nil
		c.mu.Unlock()
		ctx.cancel()
	}()
	req = req.WithContext(ctx)
	w := &Response{c: c, req: req, length: -1}
	var body *h1Body
	if req.Body != http.NoBody {
		body = &h1Body{rc: req.Body, w: w}
		req.Body, w.body = body, body
	}
	c.wmu.Lock()
	c.headSent = false
	c.wmu.Unlock()
	if expect := req.Header.Get("Expect"); expect != "" {
		if !strings.EqualFold(strings.TrimSpace(expect), "100-continue") {
			w.close = true
			w.WriteHeader(http.StatusExpectationFailed)
			w.finish(false)
			c.flush()
			c.linger()
			return false
		}
		if body != nil && req.ProtoAtLeast(1, 1) {
			body.wantContinue = true
		}
	}
	aborted := c.cfg.Handler(w, req)
	if w.switched {
		return false // the tunnel ended: so does the connection
	}
	w.finish(aborted)
	if aborted {
		c.flush()
		return false
	}
	if err := c.flush(); err != nil {
		return false
	}
	// The rest of an unread body is skipped after the response is out: a
	// client may wait for it before it sends more.
	keep := !w.close && w.err == nil && (body == nil || body.skip())
	if !keep {
		c.linger()
	}
	return keep
}

// flush writes out the response bytes gathered so far.
func (c *h1Server) flush() error {
	if c.out == nil {
		return nil
	}
	c.wmu.Lock()
	c.headSent = true
	_, err := c.st.Write(c.out)
	c.wmu.Unlock()
	if cap(c.out) <= maxOut {
		*c.outp = c.out[:0] // keeps what append grew
		outBuffers.Put(c.outp)
	}
	c.out, c.outp = nil, nil
	return err
}

// buffer returns c.out, taking a pooled buffer when there is none.
func (c *h1Server) buffer() []byte {
	if c.out == nil {
		c.outp = outBuffers.Get().(*[]byte)
		c.out = *c.outp
	}
	return c.out
}

// h1Body is a request body: it sends 100 Continue on the first read when
// the client expects it, and records how reading ended. An HTTP/2
// upstream's body writer reads it in a goroutine of its own.
type h1Body struct {
	rc io.ReadCloser // http.ReadRequest's body
	w  *Response

	mu           sync.Mutex
	wantContinue bool  // guarded by mu
	read         int64 // guarded by mu: bytes read
	eof          bool  // guarded by mu: read to its end
	failed       bool  // guarded by mu: reading it failed: the connection is out of step
	closed       bool  // guarded by mu
}

func (b *h1Body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.wantContinue {
		b.wantContinue = false
		b.w.c.writeContinue()
	}
	n, err := b.rc.Read(p)
	b.read += int64(n)
	switch {
	case err == io.EOF:
		b.eof = true
	case err != nil:
		b.failed = true
	}
	return n, err
}

// Close stops reading; what is left is skipped once the response is done.
func (b *h1Body) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// skip reads and drops what the handler left unread, up to maxDiscard; it
// reports whether the next request can be read.
func (b *h1Body) skip() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	switch {
	case b.eof:
		return true
	case b.failed || b.wantContinue:
		// A client waiting for 100 Continue has not sent its body.
		return false
	}
	n, err := io.CopyN(io.Discard, b.rc, maxDiscard+1)
	return err == io.EOF && n <= maxDiscard
}

// tooBigToSkip reports whether more of the body is left unread than skip
// would read, by its declared length.
func (b *h1Body) tooBigToSkip(length int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.eof && length-b.read > maxDiscard
}

// writeContinue sends 100 Continue unless the response has begun.
func (c *h1Server) writeContinue() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.headSent {
		io.WriteString(c.st, "HTTP/1.1 100 Continue\r\n\r\n")
	}
}

// Response is the http.ResponseWriter of one request.
type Response struct {
	c      *h1Server
	req    *http.Request
	body   *h1Body // nil without a body
	header http.Header

	status   int
	head     bool  // the head is in c.out
	bodyless bool  // HEAD, 1xx, 204, 304
	chunked  bool  // body in chunks
	length   int64 // declared length; -1 if none
	written  int64
	pending  []byte   // body written before the head
	trailers []string // names announced in the Trailer header
	close    bool     // end the connection after this response
	switched bool     // the connection was handed over after a 101
	err      error    // writing to the stream failed
}

var _ http.Flusher = (*Response)(nil)

// Header returns the response's header, made when first asked for.
func (w *Response) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header)
	}
	return w.header
}

// AdoptHeader makes h the response's header in place of the one Header
// returned, with that one's fields that h lacks added: a proxy hands the
// upstream's header on rather than copying it field by field. Once the
// status is set it does nothing and reports false.
func (w *Response) AdoptHeader(h http.Header) bool {
	if w.head || w.status != 0 {
		return false
	}
	for k, vs := range w.header {
		if _, ok := h[k]; !ok {
			h[k] = vs
		}
	}
	w.header = h
	return true
}

func (w *Response) WriteHeader(code int) {
	if w.status != 0 || w.head {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// An interim response goes out at once; the final one follows.
		b := appendStatusLine(w.c.buffer(), code)
		b = appendHeader(b, w.header, nil)
		w.c.out = append(b, "\r\n"...)
		w.err = w.c.flush()
		w.c.wmu.Lock()
		w.c.headSent = false
		w.c.wmu.Unlock()
		return
	}
	w.status = code
}

func (w *Response) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if !w.head {
		if bodyless(w.req.Method, w.status) {
			if w.req.Method == "HEAD" {
				return len(p), nil
			}
			return 0, http.ErrBodyNotAllowed
		}
		if len(w.pending)+len(p) <= maxBufferedBody && w.header.Get("Content-Length") == "" {
			w.pending = append(w.pending, p...)
			return len(p), nil
		}
		w.writeHead(false)
	}
	if w.bodyless {
		if w.req.Method == "HEAD" {
			return len(p), nil
		}
		return 0, http.ErrBodyNotAllowed
	}
	n, err := len(p), error(nil)
	if w.length >= 0 && w.written+int64(n) > w.length {
		n, err = int(w.length-w.written), http.ErrContentLength
	}
	w.appendBody(p[:n])
	if err == nil && len(w.c.out) >= maxOut {
		err = w.flushOut()
	}
	return n, err
}

// Flush sends what the response has so far.
func (w *Response) Flush() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.head {
		w.writeHead(false)
	}
	w.flushOut()
}

func (w *Response) flushOut() error {
	if err := w.c.flush(); err != nil && w.err == nil {
		w.err = err
	}
	return w.err
}

func (w *Response) appendBody(p []byte) {
	if len(p) == 0 {
		return
	}
	b := w.c.buffer()
	if w.chunked {
		b = strconv.AppendInt(b, int64(len(p)), 16)
		b = append(b, "\r\n"...)
		b = append(b, p...)
		b = append(b, "\r\n"...)
	} else {
		b = append(b, p...)
	}
	w.c.out = b
	w.written += int64(len(p))
}

// writeHead decides the framing and puts the head in c.out, followed by
// the body written so far. At the end (done) a body that is all pending
// gets its length.
func (w *Response) writeHead(done bool) {
	w.head = true
	h := w.Header()
	req := w.req
	w.bodyless = bodyless(req.Method, w.status)
	if cl := h.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 {
			w.length = n
		} else {
			h.Del("Content-Length") // net/http drops an invalid one too
		}
	}
	for _, v := range h["Trailer"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				w.trailers = append(w.trailers, http.CanonicalHeaderKey(name))
			}
		}
	}
	hasTrailers := len(w.trailers) > 0
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			hasTrailers = true
		}
	}
	if w.length < 0 && done && !w.bodyless && !hasTrailers && (req.Method != "HEAD" || len(w.pending) > 0) {
		w.length = int64(len(w.pending))
		h.Set("Content-Length", strconv.Itoa(len(w.pending)))
	}
	if req.Close || w.body != nil && w.body.tooBigToSkip(req.ContentLength) {
		w.close = true
	}
	if !w.bodyless && w.length < 0 {
		if req.ProtoAtLeast(1, 1) {
			w.chunked = true
		} else {
			w.close = true // the end of the connection ends the body
		}
	}
	conn := ""
	switch {
	case w.close:
		conn = "close"
	case !req.ProtoAtLeast(1, 1):
		conn = "keep-alive"
	}
	b := appendStatusLine(w.c.buffer(), w.status)
	b = appendHeader(b, h, hopSkip)
	if _, ok := h["Date"]; !ok {
		b = append(b, "Date: "...)
		b = append(b, httpDate()...)
		b = append(b, "\r\n"...)
	}
	if w.chunked {
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	if conn != "" {
		b = append(b, "Connection: "...)
		b = append(b, conn...)
		b = append(b, "\r\n"...)
	}
	w.c.out = append(b, "\r\n"...)
	if !w.bodyless {
		w.appendBody(w.pending)
	}
	w.pending = nil
}

// finish completes the response once the handler returned: the head if
// nothing was written yet, the last chunk and trailers. A response that
// broke off (aborted) gets neither, and ends the connection.
func (w *Response) finish(aborted bool) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if aborted {
		w.close = true
		return
	}
	if !w.head {
		w.writeHead(true)
	}
	switch {
	case w.chunked:
		b := append(w.c.buffer(), "0\r\n"...)
		b = appendTrailers(b, w.header, w.trailers)
		w.c.out = append(b, "\r\n"...)
	case w.length >= 0 && w.written != w.length && !w.bodyless:
		w.close = true // short: the client waits for bytes that will not come
	}
}

// bodyless reports whether a response to method with status has no body.
func bodyless(method string, status int) bool {
	return method == "HEAD" || status >= 100 && status < 200 || status == http.StatusNoContent || status == http.StatusNotModified
}

// hopSkip are the header fields the server writes itself.
var hopSkip = map[string]bool{"Transfer-Encoding": true, "Connection": true}

func appendStatusLine(b []byte, code int) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	if text := http.StatusText(code); text != "" {
		b = append(b, text...)
	} else {
		b = append(b, "status code "...)
		b = strconv.AppendInt(b, int64(code), 10)
	}
	return append(b, "\r\n"...)
}

// appendHeader appends h's fields but those in skip and those named with
// http.TrailerPrefix, as net/http writes them (invalid names dropped, line
// breaks in values made spaces), and unlike net/http without values a
// client would refuse.
func appendHeader(b []byte, h http.Header, skip map[string]bool) []byte {
	for k, vs := range h {
		if skip[k] || strings.HasPrefix(k, http.TrailerPrefix) || !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range vs {
			b = appendField(b, k, v)
		}
	}
	return b
}

// appendField appends one field; a value with other control characters
// than line breaks (which become spaces) is dropped, as a client would
// refuse the whole response for it.
func appendField(b []byte, k, v string) []byte {
	if strings.ContainsAny(v, "\r\n") {
		v = strings.NewReplacer("\r\n", " ", "\r", " ", "\n", " ").Replace(v)
	}
	v = strings.TrimSpace(v)
	if !httpguts.ValidHeaderFieldValue(v) {
		return b
	}
	b = append(b, k...)
	b = append(b, ": "...)
	b = append(b, v...)
	return append(b, "\r\n"...)
}

// appendTrailers appends the trailers as net/http sends them: fields set
// with http.TrailerPrefix, and the announced ones set after the head.
func appendTrailers(b []byte, h http.Header, announced []string) []byte {
	for k, vs := range h {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && httpguts.ValidHeaderFieldName(name) {
			for _, v := range vs {
				b = appendField(b, name, v)
			}
		}
	}
	for _, k := range announced {
		for _, v := range h[k] {
			b = appendField(b, k, v)
		}
	}
	return b
}

// httpDate is the current time in the Date header's format, made once a
// second.
func httpDate() string {
	now := time.Now()
	if d := dateCache.Load(); d != nil && d.sec == now.Unix() {
		return d.s
	}
	d := &cachedDate{sec: now.Unix(), s: now.UTC().Format(http.TimeFormat)}
	dateCache.Store(d)
	return d.s
}

type cachedDate struct {
	sec int64
	s   string
}

var dateCache atomic.Pointer[cachedDate]

// SwitchProtocols writes the 101 with the response's header and hands over
// the client's connection (net/http's Hijack for the server of a stream).
func (w *Response) SwitchProtocols(token string) (*Tunnel, error) {
	w.status, w.head, w.bodyless, w.switched = http.StatusSwitchingProtocols, true, true, true
	b := appendStatusLine(w.c.buffer(), http.StatusSwitchingProtocols)
	w.header.Del("Content-Length")
	w.header.Del("Upgrade")
	b = appendHeader(b, w.header, hopSkip)
	b = append(b, "Connection: Upgrade\r\nUpgrade: "...)
	b = append(b, token...)
	w.c.out = append(b, "\r\n\r\n"...)
	if err := w.c.flush(); err != nil {
		return nil, err
	}
	return &Tunnel{br: w.c.br, st: w.c.st}, nil
}

// Tunnel is the client's side of a switched connection: what the server
// had buffered, then the stream.
type Tunnel struct {
	br io.Reader
	st interface {
		io.Writer
		CloseWrite() error
		SetReadDeadline(time.Time) error
	}
}

func (c *Tunnel) Read(p []byte) (int, error)        { return c.br.Read(p) }
func (c *Tunnel) Write(p []byte) (int, error)       { return c.st.Write(p) }
func (c *Tunnel) CloseWrite() error                 { return c.st.CloseWrite() }
func (c *Tunnel) SetReadDeadline(t time.Time) error { return c.st.SetReadDeadline(t) }

// SetLinger passes on to the connection, when it has one, what a relay
// whose other end failed asks: with 0, the connection is reset when it is
// closed (a TCP socket's SO_LINGER, an HBONE stream's RST_STREAM), so that
// the client learns the switched session broke rather than ended.
func (c *Tunnel) SetLinger(sec int) error {
	if l, ok := c.st.(interface{ SetLinger(int) error }); ok {
		return l.SetLinger(sec)
	}
	return nil
}
