package echo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/coder/websocket"
	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

// isWebSocket reports whether r asks to switch to WebSocket (RFC 6455).
func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// serveWebSocket accepts a WebSocket session and answers each message with
// the pod's name and the message: "<pod>: <message>".
func (s *Server) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	prefix := []byte(s.cfg.Identity.Pod + ": ")
	for {
		typ, msg, err := c.Read(r.Context())
		if err != nil {
			return
		}
		if err := c.Write(r.Context(), typ, append(prefix[:len(prefix):len(prefix)], msg...)); err != nil {
			return
		}
	}
}

// WebSocketH2 is a client's WebSocket session over HTTP/2 (RFC 8441): an
// extended CONNECT stream, framed by an independent WebSocket
// implementation.
type WebSocketH2 struct {
	out  *io.PipeWriter
	in   io.ReadCloser
	once sync.Once
}

// DialWebSocketH2 opens a WebSocket session to url (http://host/path) on
// cc, an HTTP/2 connection whose server allows extended CONNECT. A refused
// session returns the response with an error.
func DialWebSocketH2(ctx context.Context, cc interface {
	RoundTrip(*http.Request) (*http.Response, error)
}, url string) (*WebSocketH2, *http.Response, error) {
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, http.MethodConnect, url, pr)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set(":protocol", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	resp, err := cc.RoundTrip(req)
	if err != nil {
		pw.Close()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		pw.Close()
		resp.Body.Close()
		return nil, resp, fmt.Errorf("WebSocket over HTTP/2: status %d", resp.StatusCode)
	}
	return &WebSocketH2{out: pw, in: resp.Body}, resp, nil
}

// Send sends a text message.
func (s *WebSocketH2) Send(msg string) error {
	return wsutil.WriteClientText(s.out, []byte(msg))
}

// Receive returns the next text message.
func (s *WebSocketH2) Receive() (string, error) {
	// A ping on the way is answered on the stream.
	b, err := wsutil.ReadServerText(struct {
		io.Reader
		io.Writer
	}{s.in, s.out})
	return string(b), err
}

// Close sends a normal close, ends the stream and waits for the server's
// end of the session.
func (s *WebSocketH2) Close() error {
	var err error
	s.once.Do(func() {
		err = wsutil.WriteClientMessage(s.out, ws.OpClose, ws.NewCloseFrameBody(ws.StatusNormalClosure, ""))
		s.out.Close()
		if err == nil {
			_, err = io.Copy(io.Discard, s.in)
		}
		s.in.Close()
	})
	return err
}
