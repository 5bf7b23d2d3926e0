package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/sockio"
	"github.com/weftmesh/weft/waypoint/config"
)

// The upstream HTTP client: HTTP/1.1 (RFC 9112) with persistent
// connections, or HTTP/2 (RFC 9113) streams on shared connections, over
// the connections of pool.go.

// h1conn is one upstream HTTP/1.1 connection. Its owner is the request
// using it, or the host's idle list.
type h1conn struct {
	nc     net.Conn
	sock   sockio.IO // nc's Read and Write: raw system calls on a socket
	h      *host     // nil: not pooled, closed after its request
	br     *bufio.Reader
	bw     *bufio.Writer
	nread  int64 // bytes read from nc, to tell "nothing came back"
	idleAt time.Time
	abort  func() // closes nc: what a request's context ending does
}

func newH1Conn(nc net.Conn, h *host) *h1conn {
	c := &h1conn{nc: nc, h: h}
	c.abort = func() { c.nc.Close() }
	c.sock.Init(nc)
	c.br = bufio.NewReaderSize(c, 4096)
	c.bw = bufio.NewWriterSize(&c.sock, 4096)
	return c
}

// Read feeds br, counting.
func (c *h1conn) Read(p []byte) (int, error) {
	n, err := c.sock.Read(p)
	c.nread += int64(n)
	return n, err
}

// discard closes the connection and gives back its slot.
func (c *h1conn) discard() {
	c.nc.Close()
	if c.h != nil {
		c.h.u.b.connFreed()
	}
}

// release returns the connection to its host's idle list after a complete
// exchange.
func (c *h1conn) release() {
	h := c.h
	if h == nil || c.br.Buffered() > 0 {
		// Bytes nobody asked for mean the connection is out of step.
		c.discard()
		return
	}
	c.idleAt = time.Now()
	h.mu.Lock()
	if h.retired {
		h.mu.Unlock()
		c.discard()
		return
	}
	h.idle = append(h.idle, c)
	h.mu.Unlock()
	h.u.b.notify()
}

// streamAlive reports whether an idle HBONE stream can still carry a
// request: its peer has neither ended nor reset it (an application behind
// HBONE closing an idle connection ends the stream). A zero-length Read of
// a Stream does not block; it returns the stream's state: io.EOF once the
// peer ended it, the reset error once it was reset.
func streamAlive(st *hbone.Stream) bool {
	_, err := st.Read(nil)
	return err == nil
}

// replayable reports whether req's body can be sent again.
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// idempotent reports whether req may be repeated when it is not known
// whether the peer acted on it (RFC 9110 section 9.2.2).
func idempotent(req *http.Request) bool {
	switch req.Method {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	return req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != ""
}

// maxUnprocessedAttempts bounds the attempts of a request that HTTP/2
// upstreams keep refusing unprocessed.
const maxUnprocessedAttempts = 4

// unprocessed reports whether an HTTP/2 round trip failed before the
// upstream processed the request (RFC 9113 section 8.7): its stream was
// above the last one a graceful GOAWAY kept, was refused, or the
// connection could not take it. net/http does not export these errors (its
// stream errors convert to x/net's StreamError); its Transport retries the
// same ones.
func unprocessed(err error) bool {
	var se http2.StreamError
	if errors.As(err, &se) {
		return se.Code == http2.ErrCodeRefusedStream
	}
	switch err.Error() {
	case "http2: Transport received Server's graceful shutdown GOAWAY",
		"http2: client conn not usable",
		"http2: client conn could not be established":
		return true
	}
	return false
}

// bufferBody reads req's body, of the length it declares, into memory,
// and makes req replayable from it.
func bufferBody(req *http.Request) error {
	body := req.Body
	defer body.Close()
	data := make([]byte, req.ContentLength)
	if _, err := io.ReadFull(body, data); err != nil {
		return fmt.Errorf("reading the request body (%d bytes declared): %w", req.ContentLength, err)
	}
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	req.Body, _ = req.GetBody()
	return nil
}

// recordBody makes req replayable when its body turns out to be at most
// limit bytes: the bytes read from it are kept, and GetBody serves them
// once the body was read to its end.
func recordBody(req *http.Request, limit int) {
	rb := &bodyRecord{ReadCloser: req.Body, limit: limit}
	req.Body = rb
	req.GetBody = func() (io.ReadCloser, error) {
		if !rb.eof || rb.over {
			return nil, errors.New("request body was not kept")
		}
		return io.NopCloser(bytes.NewReader(rb.buf)), nil
	}
}

// bodyRecord keeps the bytes read from a request body, up to limit.
type bodyRecord struct {
	io.ReadCloser
	limit int
	buf   []byte
	over  bool // more than limit bytes were read
	eof   bool // the body was read to its end
}

func (b *bodyRecord) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if !b.over {
		if len(b.buf)+n > b.limit {
			b.over, b.buf = true, nil
		} else {
			b.buf = append(b.buf, p[:n]...)
		}
	}
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// rewind makes req's body ready for another attempt.
func rewind(req *http.Request) bool {
	if req.GetBody == nil {
		return req.Body == nil || req.Body == http.NoBody
	}
	b, err := req.GetBody()
	if err != nil {
		return false
	}
	req.Body = b
	return true
}

// RoundTrip sends one attempt of req to an endpoint of cluster in snap,
// over HTTP/2 when h2 is set or the cluster asks for it, else over
// HTTP/1.1; target is the original destination, which the passthrough
// cluster connects to. picked is set to the endpoint as soon as one is
// chosen, so that a failed attempt names the endpoint it failed on. The
// request slot of the cluster's breaker is held until the response body
// is done (read to its end or closed). An HTTP/1.1 upgrade's 101 has a
// body that is the switched connection: it also writes, half-closes
// (CloseWrite) and takes a read deadline (SetReadDeadline).
//
// The errors: ErrOverloaded when a breaker threshold refuses the request,
// ErrNoHealthy when the cluster has no usable endpoint,
// context.DeadlineExceeded when ctx ended, else the dial's or the round
// trip's error.
func (c *Client) RoundTrip(ctx context.Context, snap *config.Snapshot, cluster string, req *http.Request, h2 bool, target netip.AddrPort, picked *Picked) (*http.Response, error) {
	if picked == nil {
		picked = new(Picked)
	}
	if passthrough(snap, cluster) {
		return c.roundTripPassthrough(ctx, snap, req, h2, target, picked)
	}
	pl := c.pool(snap, cluster)
	if pl == nil {
		return nil, ErrNoHealthy
	}
	h2 = h2 || pl.cluster.HTTP2
	if h2 {
		req.Header.Del("Upgrade") // HTTP/2 has no upgrade
	}
	b := &pl.u.b
	if !take(&b.requests, pl.cluster.MaxRequests) {
		return nil, ErrOverloaded
	}
	w := want{h2: h2, retryable: idempotent(req) && replayable(req)}
	if !replayable(req) {
		// A request that may go once more (its pooled connection was closed
		// before the upstream received any of it, or an HTTP/2 upstream
		// refused it unprocessed) needs its body again. One of a small
		// declared length is read whole first: an HTTP/2 refusal can come
		// before the transport read any of it, and the transport may still
		// hold the body it was given. Any other keeps what it sent while
		// it was sent.
		if n := req.ContentLength; n > 0 && n <= maxReplayBody {
			if err := bufferBody(req); err != nil {
				b.requests.Add(-1)
				return nil, err
			}
		} else {
			recordBody(req, maxReplayBody)
		}
	}
	for attempt := 0; ; attempt++ {
		l, err := c.checkout(ctx, pl, w)
		if err != nil {
			b.requests.Add(-1)
			return nil, err
		}
		ep := l.h.ep.Load()
		picked.Addr, picked.Endpoint = ep.Addr, ep
		l.h.active.Add(1)
		done := func() {
			l.h.active.Add(-1)
			b.requests.Add(-1)
			if h2 {
				b.notify() // a stream is free
			}
		}
		var resp *http.Response
		var again bool
		if h2 {
			resp, again, err = l.h2.roundTrip(withHost(req, ep.Addr), done)
		} else {
			resp, again, err = l.h1.roundTrip(ctx, req, done)
		}
		if err == nil {
			return resp, nil
		}
		l.h.active.Add(-1)
		// A pooled connection the peer had already given up on: once more
		// on a new one. A request an HTTP/2 upstream says it never
		// processed (a graceful GOAWAY below its stream, a refused stream)
		// goes again even on a new connection, a few times, as Go's HTTP/2
		// Transport does: an upstream's idle close can race a fresh
		// connection's first stream too.
		retry := l.reused && attempt == 0 || h2 && attempt < maxUnprocessedAttempts-1 && unprocessed(err)
		if again && retry && ctx.Err() == nil && rewind(req) {
			w.fresh = true
			continue
		}
		b.requests.Add(-1)
		if ctx.Err() != nil {
			return nil, context.DeadlineExceeded
		}
		return nil, err
	}
}

// roundTrip sends req and reads the response head. On error the connection
// is discarded and again says whether the peer cannot have acted on req.
// done runs once the response body is finished.
func (c *h1conn) roundTrip(ctx context.Context, req *http.Request, done func()) (*http.Response, bool, error) {
	stop := afterFunc(ctx, c.abort)
	fail := func(err error, again bool) (*http.Response, bool, error) {
		stop()
		c.discard()
		return nil, again, err
	}
	n0 := c.nread
	// For a request that may not be repeated blindly, what the upstream's
	// kernel acknowledged before it: a connection that closed without
	// acknowledging any of the request never delivered it.
	var acked0 uint64
	ackKnown := false
	if !idempotent(req) {
		acked0, ackKnown = bytesAcked(c.nc)
	}
	if err := writeRequest(c.bw, req); err != nil {
		return fail(err, replayable(req))
	}
	if err := c.bw.Flush(); err != nil {
		return fail(err, replayable(req))
	}
	resp, err := http.ReadResponse(c.br, req)
	// Interim responses (RFC 9110 section 15.2) are not forwarded.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(c.br, req)
	}
	if err != nil {
		again := c.nread == n0 && idempotent(req)
		if !again && c.nread == n0 && ackKnown {
			// Nothing came back; if the peer also acknowledged none of
			// the request, it closed before the request arrived (an idle
			// close racing the request) and cannot have acted on it.
			if acked, ok := bytesAcked(c.nc); ok && acked == acked0 {
				again = true
			}
		}
		return fail(err, again)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The connection is the tunnel's now, past the request's
		// context.
		stop()
		resp.Body = &tunnel{c: c, done: done}
		return resp, false, nil
	}
	body := &h1body{body: resp.Body, c: c, stop: stop, keep: !resp.Close && !req.Close, done: done}
	if resp.Body == http.NoBody {
		body.end(true)
		return resp, false, nil
	}
	resp.Body = body
	return resp, false, nil
}

// afterFunc is context.AfterFunc, with the context's own AfterFunc when it
// has one (h1server's request contexts): every request watches its
// context, and that way costs one allocation rather than several.
func afterFunc(ctx context.Context, f func()) (stop func() bool) {
	if a, ok := ctx.(interface{ AfterFunc(func()) func() bool }); ok {
		return a.AfterFunc(f)
	}
	return context.AfterFunc(ctx, f)
}

// writeRequest writes req for an upstream as net/http's Request.Write
// does (the same framing: Content-Length, or chunked with trailers when the
// length is unknown; the Host of req.Host or the URL), in one pass without
// its allocations, and without a User-Agent of its own: the client's, if
// any, goes through. It closes the body, as Request.Write does.
func writeRequest(bw *bufio.Writer, req *http.Request) (err error) {
	body := req.Body
	if body == http.NoBody {
		body = nil
	}
	if body != nil {
		defer func() {
			if cerr := body.Close(); err == nil {
				err = cerr
			}
		}()
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !httpguts.ValidHostHeader(host) {
		host = "" // as net/http: an invalid Host is not sent
	}
	ruri := req.URL.RequestURI()
	if req.Method == "CONNECT" && req.URL.Path == "" {
		ruri = host
		if req.URL.Opaque != "" {
			ruri = req.URL.Opaque
		}
	}
	if strings.ContainsFunc(ruri, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return errors.New("can't write a control character in the request target")
	}
	method := req.Method
	if method == "" {
		method = "GET"
	}
	length := req.ContentLength
	switch {
	case body == nil:
		length = 0
	case length == 0:
		length = -1 // a body of unknown length
	}
	chunked := length < 0 && method != "CONNECT"
	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(ruri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	switch {
	case chunked:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
		if len(req.Trailer) > 0 {
			names := make([]string, 0, len(req.Trailer))
			for k := range req.Trailer {
				names = append(names, http.CanonicalHeaderKey(k))
			}
			slices.Sort(names)
			bw.WriteString("Trailer: " + strings.Join(names, ",") + "\r\n")
		}
	case length > 0, length == 0 && (method == "POST" || method == "PUT" || method == "PATCH"):
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), length, 10))
		bw.WriteString("\r\n")
	}
	if _, ok := req.Header["Upgrade"]; ok {
		bw.WriteString("Connection: Upgrade\r\n") // an upgrade request (RFC 9110 section 7.8)
	}
	for k, vs := range req.Header {
		if reqSkip[k] || !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range vs {
			writeField(bw, k, v)
		}
	}
	if _, err := bw.WriteString("\r\n"); err != nil {
		return err
	}
	switch {
	case body == nil:
		return nil
	case chunked:
		return writeChunked(bw, body, req.Trailer)
	}
	n, err := sendBody(bw, nil, io.LimitReader(body, length))
	if err == nil && n < length {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return fmt.Errorf("sending the request body: %w", err)
	}
	// Reading on to the end lets the body reader see it.
	var one [1]byte
	if m, _ := body.Read(one[:]); m > 0 {
		return fmt.Errorf("request body longer than its Content-Length %d", length)
	}
	return nil
}

// reqSkip are the header fields writeRequest writes itself, or not at all.
var reqSkip = map[string]bool{"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Trailer": true, "Connection": true}

// writeField writes one header field as net/http does: line breaks in the
// value made spaces, a value with other control characters dropped.
func writeField(bw *bufio.Writer, k, v string) {
	if strings.ContainsAny(v, "\r\n") {
		v = strings.NewReplacer("\r\n", " ", "\r", " ", "\n", " ").Replace(v)
	}
	v = strings.TrimSpace(v)
	if !httpguts.ValidHeaderFieldValue(v) {
		return
	}
	bw.WriteString(k)
	bw.WriteString(": ")
	bw.WriteString(v)
	bw.WriteString("\r\n")
}

// writeChunked sends body in chunks as it is read, then the last chunk and
// trailer (whose values are set once body is read to its end).
func writeChunked(bw *bufio.Writer, body io.Reader, trailer http.Header) error {
	cw := httputil.NewChunkedWriter(bw)
	if _, err := sendBody(bw, cw, body); err != nil {
		return fmt.Errorf("sending the request body: %w", err)
	}
	if err := cw.Close(); err != nil {
		return err
	}
	for k, vs := range trailer {
		for _, v := range vs {
			writeField(bw, http.CanonicalHeaderKey(k), v)
		}
	}
	_, err := bw.WriteString("\r\n")
	return err
}

// sendBody sends a request body to bw as it comes, through w (the chunked
// framing) or, when w is nil, as it is: what one Read returns goes to the
// upstream before the next Read, so a body that trickles in (a stream, an
// upload its client paces) is never held in the buffer. The head is still
// in bw, so a small body leaves with it in one write.
func sendBody(bw *bufio.Writer, w io.Writer, body io.Reader) (int64, error) {
	var n int64
	var chunk []byte // w's input: w writes its framing into bw
	for {
		var p []byte
		if w == nil {
			if bw.Available() == 0 {
				if err := bw.Flush(); err != nil {
					return n, err
				}
			}
			p = bw.AvailableBuffer() // read straight into bw's free space
			p = p[:cap(p)]
		} else {
			if chunk == nil {
				chunk = make([]byte, 16<<10)
			}
			p = chunk
		}
		m, rerr := body.Read(p)
		if m > 0 {
			var err error
			if w == nil {
				_, err = bw.Write(p[:m])
			} else {
				_, err = w.Write(p[:m])
			}
			if err == nil {
				err = bw.Flush()
			}
			if err != nil {
				return n, err
			}
			n += int64(m)
		}
		switch {
		case rerr == io.EOF:
			return n, nil
		case rerr != nil:
			return n, rerr
		}
	}
}

// h1body is an HTTP/1.1 response body; reading it to the end returns the
// connection to the pool, closing it early discards the connection.
type h1body struct {
	body io.ReadCloser
	c    *h1conn
	stop func() bool
	keep bool
	done func()
	once sync.Once
	eof  bool
}

func (b *h1body) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	n, err := b.body.Read(p)
	if err != nil {
		b.eof = err == io.EOF
		b.end(b.eof)
	}
	return n, err
}

func (b *h1body) Close() error {
	b.end(false)
	return nil
}

func (b *h1body) end(complete bool) {
	b.once.Do(func() {
		live := b.stop()
		if complete && live && b.keep {
			b.c.release()
		} else {
			b.c.discard()
		}
		b.done()
	})
}

// tunnel is the upstream's side of a switched HTTP/1.1 connection, the
// response body of a 101; closing it closes the connection and ends the
// request.
type tunnel struct {
	c    *h1conn
	done func()
	once sync.Once
}

var _ interface {
	io.ReadWriteCloser
	CloseWrite() error
	SetReadDeadline(time.Time) error
} = (*tunnel)(nil)

func (u *tunnel) Read(p []byte) (int, error)  { return u.c.br.Read(p) }
func (u *tunnel) Write(p []byte) (int, error) { return u.c.nc.Write(p) }

func (u *tunnel) CloseWrite() error {
	if cw, ok := u.c.nc.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (u *tunnel) SetReadDeadline(t time.Time) error { return u.c.nc.SetReadDeadline(t) }

func (u *tunnel) Close() error {
	u.once.Do(func() {
		u.c.discard()
		u.done()
	})
	return nil
}

// roundTrip sends req as a stream of the shared connection.
func (c *h2conn) roundTrip(req *http.Request, done func()) (*http.Response, bool, error) {
	resp, err := c.cc.RoundTrip(req)
	if err != nil {
		if c.closeWhenIdle {
			c.close()
		}
		return nil, replayable(req), err
	}
	eb := &endBody{ReadCloser: resp.Body, remain: resp.ContentLength, done: done}
	if c.closeWhenIdle {
		eb.end = c.close
	}
	resp.Body = eb
	return resp, false, nil
}

// withHost returns req or, when it names no host (HTTP/1.0 without Host),
// a copy naming addr, the endpoint's address: net/http's HTTP/2 client sends
// no request without an authority.
func withHost(req *http.Request, addr netip.AddrPort) *http.Request {
	if req.URL.Host != "" {
		return req
	}
	r := *req
	u := *req.URL
	u.Host = addr.String()
	r.URL = &u
	return &r
}

// endBody runs done once the body has delivered its declared length, hits
// its end or is closed, and then end, when set, once it hits its end or is
// closed. The HTTP/2 client reports the end only on the read after the
// last DATA, when the client may already have the whole response: a
// request slot given back only then would still be held when the client's
// next request arrives.
type endBody struct {
	io.ReadCloser
	remain   int64 // declared length not yet read; -1 when unknown
	done     func()
	end      func()
	doneOnce sync.Once
	endOnce  sync.Once
}

func (b *endBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.remain > 0 {
		b.remain -= int64(n)
	}
	if b.remain == 0 || err != nil {
		b.doneOnce.Do(b.done)
	}
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *endBody) Close() error {
	err := b.ReadCloser.Close()
	b.doneOnce.Do(b.done)
	b.finish()
	return err
}

func (b *endBody) finish() {
	if b.end != nil {
		b.endOnce.Do(b.end)
	}
}

// roundTripPassthrough sends req to the original destination on a
// connection of its own.
func (c *Client) roundTripPassthrough(ctx context.Context, snap *config.Snapshot, req *http.Request, h2 bool, target netip.AddrPort, picked *Picked) (*http.Response, error) {
	nc, ep, err := c.dialPassthrough(ctx, snap, target)
	if err != nil {
		return nil, err
	}
	picked.Addr = ep
	if h2 {
		cc, err := c.newH2ClientConn(ctx, nc)
		if err != nil {
			return nil, err
		}
		resp, err := cc.RoundTrip(withHost(req, ep))
		if err != nil {
			cc.Close()
			return nil, err
		}
		resp.Body = &endBody{ReadCloser: resp.Body, remain: -1, done: func() {}, end: func() { cc.Close() }}
		return resp, nil
	}
	resp, _, err := newH1Conn(nc, nil).roundTrip(ctx, req, func() {})
	if err != nil && ctx.Err() != nil {
		return nil, context.DeadlineExceeded
	}
	return resp, err
}
