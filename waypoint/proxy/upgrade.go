package proxy

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/weftmesh/weft/waypoint/internal/h1server"

	"github.com/weftmesh/weft/internal/relay"
)

// Protocol upgrades (RFC 9110 section 7.8) through the waypoint. An
// HTTP/1.1 request asking to switch to WebSocket (RFC 6455: Connection:
// upgrade and Upgrade: websocket), the one upgrade Istio enables in
// Envoy's upgrade_configs, is routed and authorized like any request, and
// goes upstream with its Upgrade header. When the upstream answers 101 the
// 101 goes back to the client, and from then on the bytes of both
// directions are relayed as they are, each direction's end passed on as a
// half-close, until both ended, either failed, or neither carried a byte
// for the chain's idle timeout. Any other answer is an ordinary response.
// Other upgrades (h2c among them), an Upgrade listing several protocols, an
// upgrade request with a body, and HTTP/1.0 requests go upstream as
// ordinary requests without their Upgrade header; so does every upgrade
// to an HTTP/2 upstream. A 101 the waypoint did not ask for, or switching
// to another protocol than asked, is answered 502 (flag UPE). The route's
// timeout bounds the wait for the 101, not the session.

//
// An HTTP/2 client opens a WebSocket with an extended CONNECT (RFC 8441):
// the waypoint advertises SETTINGS_ENABLE_CONNECT_PROTOCOL when its process
// runs with GODEBUG=http2xconnect=1, which the deployer sets on every
// waypoint. Such a request, :protocol websocket, is made the HTTP/1.1
// upgrade it stands for before anything looks at it, as Envoy does: a GET
// with Upgrade: websocket and a Sec-WebSocket-Key of the waypoint's own,
// routed, authorized and logged as that GET, and sent to the upstream over
// HTTP/1.1 whatever the downstream protocol. The upstream's 101, once its
// Sec-WebSocket-Accept proves it answered that key, becomes the client's
// 200 and the stream carries the session's bytes both ways; an upstream's
// end of the session ends the stream. Any other 2xx is answered 502 (flag
// UPE): the client would take it for an open session. An extended CONNECT
// for another protocol is refused 403, as Envoy refuses an upgrade it is
// not configured for.

// upgradeWebSocket is the upgrade token the waypoint passes.
const upgradeWebSocket = "websocket"

// wsGUID is the GUID RFC 6455 section 1.3 appends to a key to accept it.
const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// wsStream is an HTTP/2 WebSocket request's stream: the client's bytes
// once the session is open, and the key the waypoint asked the upstream to
// accept.
type wsStream struct {
	body io.ReadCloser
	key  string
}

// fromExtendedConnect makes r, an HTTP/2 extended CONNECT, the HTTP/1.1
// WebSocket upgrade it stands for and returns its stream; it returns nil
// for another protocol.
func fromExtendedConnect(r *http.Request) *wsStream {
	proto := r.Header.Get(":protocol")
	delete(r.Header, ":protocol")
	if !strings.EqualFold(proto, upgradeWebSocket) {
		return nil
	}
	var k [16]byte
	rand.Read(k[:])
	st := &wsStream{body: r.Body, key: base64.StdEncoding.EncodeToString(k[:])}
	r.Method = http.MethodGet
	r.Body, r.ContentLength = http.NoBody, 0
	r.Header.Set("Sec-WebSocket-Key", st.key)
	return st
}

// wsAccept is the Sec-WebSocket-Accept that answers key.
func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + wsGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

// switchedStream answers an HTTP/2 WebSocket request whose upstream
// answered resp, a 101 or another 2xx, and relays the session; w's header
// already holds resp's. The caller closes resp.Body.
func (s *session) switchedStream(w http.ResponseWriter, resp *http.Response, st *wsStream, info *reqInfo) {
	up, okUp := resp.Body.(tunnelEnd)
	cw, _ := w.(*countingWriter)
	if resp.StatusCode != http.StatusSwitchingProtocols || !okUp || cw == nil ||
		!strings.EqualFold(strings.TrimSpace(resp.Header.Get("Upgrade")), upgradeWebSocket) ||
		resp.Header.Get("Sec-WebSocket-Accept") != wsAccept(st.key) {
		reply(w, info, replyNoWebSocket)
		return
	}
	w.Header().Del("Sec-WebSocket-Accept")
	w.WriteHeader(http.StatusOK)
	down := &streamTunnel{body: st.body, w: cw.ResponseWriter}
	if err := down.flush(); err != nil {
		info.flags = flagDownstreamConnection
		return
	}
	recv, sent, err := relay.Join(down, up, idle(s.chain.HTTP.IdleTimeout))
	cw.n += sent
	info.reqBytes.Add(recv)
	// A session that broke (not one that idled out) resets the client's
	// stream, as its HTTP/1 and HBONE peers are reset, rather than ending
	// it as if it were whole.
	info.aborted = err != nil && !errors.Is(err, relay.ErrIdle)
}

// streamTunnel is the client's side of an HTTP/2 WebSocket: the request
// body one way, the response the other. Its write side ends with the
// handler, so CloseWrite ends the reads too: the session is over.
type streamTunnel struct {
	body   io.Reader
	w      http.ResponseWriter
	mu     sync.Mutex // held while setting the read deadline
	closed atomic.Bool
}

func (t *streamTunnel) Read(p []byte) (int, error) {
	n, err := t.body.Read(p)
	if err != nil && t.closed.Load() {
		err = io.EOF
	}
	return n, err
}

func (t *streamTunnel) Write(p []byte) (int, error) {
	n, err := t.w.Write(p)
	if err == nil {
		err = t.flush()
	}
	return n, err
}

func (t *streamTunnel) flush() error { return http.NewResponseController(t.w).Flush() }

func (t *streamTunnel) CloseWrite() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed.Store(true)
	return http.NewResponseController(t.w).SetReadDeadline(time.Unix(1, 0))
}

func (t *streamTunnel) SetReadDeadline(d time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Load() {
		return nil
	}
	return http.NewResponseController(t.w).SetReadDeadline(d)
}

// upgradeToken returns the protocol an HTTP/1.1 request asks to switch to
// when the waypoint passes it, or "".
func upgradeToken(r *http.Request, h2 bool) string {
	if h2 || !r.ProtoAtLeast(1, 1) || r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		return ""
	}
	if !httpguts.HeaderValuesContainsToken(r.Header["Connection"], "upgrade") {
		return ""
	}
	if up := r.Header.Values("Upgrade"); len(up) == 1 && strings.EqualFold(strings.TrimSpace(up[0]), upgradeWebSocket) {
		return upgradeWebSocket
	}
	return ""
}

// switcher is a downstream response that can hand over its connection
// after a 101: the HTTP/1.1 server's (h1server.Response).
type switcher interface {
	SwitchProtocols(token string) (*h1server.Tunnel, error)
}

// tunnelEnd is one side of a switched connection: the downstream's
// h1server.Tunnel or streamTunnel, the upstream's the body of the 101 that
// upstream.Client.RoundTrip returns.
type tunnelEnd interface {
	io.ReadWriter
	CloseWrite() error
	SetReadDeadline(time.Time) error
}

// switched relays a switched connection once the upstream answered 101
// (its header already in w's); when the switch was not asked for, or is
// to another protocol than asked, it answers 502 instead. The caller
// closes resp.Body, the upstream connection.
func (s *session) switched(w http.ResponseWriter, resp *http.Response, token string, info *reqInfo) {
	up, okUp := resp.Body.(tunnelEnd)
	cw, _ := w.(*countingWriter)
	var sw switcher
	if cw != nil {
		sw, _ = cw.ResponseWriter.(switcher)
	}
	if token == "" || !okUp || sw == nil || !strings.EqualFold(strings.TrimSpace(resp.Header.Get("Upgrade")), token) {
		reply(w, info, replyUnaskedSwitch)
		return
	}
	down, err := sw.SwitchProtocols(token)
	cw.status = http.StatusSwitchingProtocols
	if err != nil {
		info.flags = flagDownstreamConnection
		return
	}
	recv, sent, _ := relay.Join(down, up, idle(s.chain.HTTP.IdleTimeout))
	cw.n += sent
	info.reqBytes.Add(recv)
}
