package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/weftmesh/weft/cni/event"
)

// socketNotifier POSTs the event to the agent over its unix socket: one
// HTTP/1.0 request, the answer read to the connection's end. It is a client
// of its own, not net/http's: the runtime starts the plugin for every pod
// the node runs, and net/http (with crypto/tls, which it brings) more than
// doubled the binary and added about 4 ms to every start. HTTP/1.0 keeps
// the answer simple to read: the server closes the connection after it and
// never chunks it.
type socketNotifier struct{}

// maxAnswer bounds what is read of the agent's answer; its body is an
// error's text.
const maxAnswer = 64 << 10

// Notify sends ev and returns the agent's error text for a non-200 answer.
func (socketNotifier) Notify(ctx context.Context, socket string, ev *event.Add) error {
	body, err := ev.Marshal()
	if err != nil {
		return err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("the node agent at %s is unreachable (%w); is weft-cni-agent running on this node?", socket, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := fmt.Appendf(nil, "POST %s HTTP/1.0\r\nHost: unix\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", event.Path, len(body))
	if _, err := c.Write(append(req, body...)); err != nil {
		return fmt.Errorf("sending the event to the node agent at %s: %w", socket, err)
	}
	raw, err := io.ReadAll(io.LimitReader(c, maxAnswer))
	if err != nil {
		return fmt.Errorf("reading the node agent's answer from %s: %w", socket, err)
	}
	a, err := parseAnswer(raw)
	if err != nil {
		return fmt.Errorf("the node agent at %s answered: %w", socket, err)
	}
	if a.code != 200 {
		msg := a.body
		if len(msg) > 4096 {
			msg = msg[:4096]
		}
		return fmt.Errorf("the node agent refused the pod (%d %s): %s", a.code, a.reason, bytes.TrimSpace(msg))
	}
	return nil
}

// answer is an HTTP/1.x response.
type answer struct {
	code   int
	reason string
	body   []byte
}

// parseAnswer parses a whole HTTP/1.x response (RFC 9112): the status line,
// the header fields, and the body, as long as Content-Length says or to the
// end. A chunked body is refused: a server does not send one to an HTTP/1.0
// request.
func parseAnswer(raw []byte) (answer, error) {
	head, body, ok := bytes.Cut(raw, []byte("\r\n\r\n"))
	if !ok {
		if len(raw) >= maxAnswer {
			return answer{}, fmt.Errorf("its header is longer than %d bytes", maxAnswer)
		}
		return answer{}, errors.New("its header ended early (no empty line after it)")
	}
	status, fields, _ := bytes.Cut(head, []byte("\r\n"))
	// HTTP/1.x SP 3DIGIT SP [reason]
	if len(status) < 12 || !bytes.HasPrefix(status, []byte("HTTP/1.")) || status[7] < '0' || status[7] > '9' || status[8] != ' ' ||
		(len(status) > 12 && status[12] != ' ') {
		return answer{}, fmt.Errorf("its status line %q is not HTTP/1.x's", clip(status))
	}
	code := 0
	for _, c := range status[9:12] {
		if c < '0' || c > '9' {
			return answer{}, fmt.Errorf("its status line %q has no three-digit status code", clip(status))
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 {
		return answer{}, fmt.Errorf("its status code %d is not one", code)
	}
	a := answer{code: code, body: body}
	if len(status) > 13 {
		a.reason = string(status[13:])
	}
	length := -1
	for len(fields) > 0 {
		var line []byte
		line, fields, _ = bytes.Cut(fields, []byte("\r\n"))
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 || bytes.ContainsAny(name, " \t") {
			return answer{}, fmt.Errorf("its header line %q is not a field", clip(line))
		}
		value = bytes.Trim(value, " \t")
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, err := strconv.Atoi(string(value))
			if err != nil || n < 0 || (length >= 0 && n != length) {
				return answer{}, fmt.Errorf("its Content-Length %q is not one length", clip(value))
			}
			length = n
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return answer{}, fmt.Errorf("it has Transfer-Encoding %q, which an answer to HTTP/1.0 cannot", clip(value))
		}
	}
	if length >= 0 {
		if length > len(a.body) {
			if len(raw) >= maxAnswer {
				return a, nil // the rest was not read
			}
			return answer{}, fmt.Errorf("its body ended after %d of its %d bytes", len(a.body), length)
		}
		a.body = a.body[:length]
	}
	return a, nil
}

// clip shortens what an error quotes.
func clip(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}
