package echo

import (
	"net/http"
	"strings"

	"github.com/coder/websocket"
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
