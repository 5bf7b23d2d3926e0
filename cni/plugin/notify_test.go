package plugin

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weftmesh/weft/cni/event"
)

// agentSocket serves h on a unix socket with net/http's server, as the
// node agent does, and returns the socket's path.
func agentSocket(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), event.SocketName)
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return path
}

// rawSocket answers every connection on a unix socket with fn.
func rawSocket(t *testing.T, fn func(c net.Conn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), event.SocketName)
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); fn(c) }()
		}
	}()
	return path
}

func testEvent() *event.Add {
	return &event.Add{Netns: "/var/run/netns/p1", PodName: "web", PodNamespace: "shop"}
}

// TestNotifyNetHTTPServer: the event reaches net/http's server as a POST
// of the event's JSON to /cmdadd, and its answers come back: nothing for
// 200, the status and text of any other, however the server sends it.
func TestNotifyNetHTTPServer(t *testing.T) {
	long := strings.Repeat("x", 10000)
	for _, tt := range []struct {
		name    string
		handler http.HandlerFunc
		want    string // "" for success
	}{
		{"ok", func(w http.ResponseWriter, r *http.Request) {}, ""},
		{"ok with a body", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "enrolled\n") }, ""},
		{"refused", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "ztunnel did not take the pod", http.StatusInternalServerError)
		}, "the node agent refused the pod (500 Internal Server Error): ztunnel did not take the pod"},
		{"bad event", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad event", http.StatusBadRequest)
		}, "(400 Bad Request): bad event"},
		{"flushed in pieces", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "part one, ")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part two")
		}, "(503 Service Unavailable): part one, part two"},
		{"long text is cut", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, long, http.StatusInternalServerError)
		}, "(500 Internal Server Error): " + long[:4096]},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan *event.Add, 1)
			path := agentSocket(t, func(w http.ResponseWriter, r *http.Request) {
				ev, err := event.Decode(r.Body)
				if err != nil || r.Method != http.MethodPost || r.URL.Path != event.Path || r.Header.Get("Content-Type") != "application/json" {
					http.Error(w, fmt.Sprintf("unexpected request %s %s: %v", r.Method, r.URL.Path, err), http.StatusTeapot)
					return
				}
				got <- ev
				tt.handler(w, r)
			})
			err := socketNotifier{}.Notify(context.Background(), path, testEvent())
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Notify: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Notify = %v; want an error with %q", err, tt.want)
			case tt.want != "" && strings.Contains(tt.name, "cut") && strings.Contains(err.Error(), long[:4097]):
				t.Fatal("the error carries more than 4096 bytes of the answer")
			}
			if ev := <-got; ev.PodName != "web" || ev.Netns != "/var/run/netns/p1" {
				t.Fatalf("the agent got %+v", ev)
			}
		})
	}
}

// TestNotifyBadAgents: an agent that is not there, says nothing, answers
// something that is not HTTP, or never answers gets a clear error, within
// the context's time.
func TestNotifyBadAgents(t *testing.T) {
	drain := func(c net.Conn) { c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); io.Copy(io.Discard, c) }
	for _, tt := range []struct {
		name string
		path func(t *testing.T) string
		want string
	}{
		{"no agent", func(t *testing.T) string { return filepath.Join(t.TempDir(), "none.sock") }, "is weft-cni-agent running on this node?"},
		{"closes at once", func(t *testing.T) string { return rawSocket(t, drain) }, "its header ended early"},
		{"not HTTP", func(t *testing.T) string {
			return rawSocket(t, func(c net.Conn) { drain(c); io.WriteString(c, "SSH-2.0-OpenSSH\r\n\r\n") })
		}, `its status line "SSH-2.0-OpenSSH" is not HTTP/1.x's`},
		{"chunked", func(t *testing.T) string {
			return rawSocket(t, func(c net.Conn) {
				drain(c)
				io.WriteString(c, "HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
			})
		}, "Transfer-Encoding"},
		{"short body", func(t *testing.T) string {
			return rawSocket(t, func(c net.Conn) { drain(c); io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\nabc") })
		}, "its body ended after 3 of its 10 bytes"},
		{"never answers", func(t *testing.T) string {
			return rawSocket(t, func(c net.Conn) { c.Read(make([]byte, 1)); time.Sleep(5 * time.Second) })
		}, "i/o timeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := socketNotifier{}.Notify(ctx, tt.path(t), testEvent())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Notify = %v; want an error with %q", err, tt.want)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("Notify took %v past its context", d)
			}
		})
	}
}

func TestParseAnswer(t *testing.T) {
	for _, tt := range []struct {
		raw        string
		code       int
		reason     string
		body, fail string
	}{
		{raw: "HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", code: 200, reason: "OK"},
		{raw: "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nboom and more", code: 500, reason: "Internal Server Error", body: "boom"},
		{raw: "HTTP/1.0 404\r\n\r\nnot found", code: 404, body: "not found"},
		{raw: "HTTP/1.0 204 \r\n\r\n", code: 204},
		{raw: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab", code: 200, reason: "OK", body: "ab"},
		{raw: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc", fail: "is not one length"},
		{raw: "HTTP/1.0 200 OK\r\nContent-Length: -1\r\n\r\n", fail: "is not one length"},
		{raw: "HTTP/1.0 200 OK\r\nContent-Length: +2\r\n\r\nab", code: 200, reason: "OK", body: "ab"},
		{raw: "HTTP/1.0 200 OK\r\nno colon\r\n\r\n", fail: `its header line "no colon" is not a field`},
		{raw: "HTTP/1.0 200 OK\r\nBad Name: x\r\n\r\n", fail: "is not a field"},
		{raw: "HTTP/1.0 200 OK\r\n", fail: "ended early"},
		{raw: "HTTP/2 200 OK\r\n\r\n", fail: "is not HTTP/1.x's"},
		{raw: "HTTP/1.0 2x0 OK\r\n\r\n", fail: "no three-digit status code"},
		{raw: "HTTP/1.0 099 Low\r\n\r\n", fail: "is not one"},
		{raw: "HTTP/1.0 2000 OK\r\n\r\n", fail: "is not HTTP/1.x's"},
		{raw: "", fail: "ended early"},
	} {
		a, err := parseAnswer([]byte(tt.raw))
		if tt.fail != "" {
			if err == nil || !strings.Contains(err.Error(), tt.fail) {
				t.Errorf("parseAnswer(%q) = %+v, %v; want an error with %q", tt.raw, a, err, tt.fail)
			}
			continue
		}
		if err != nil || a.code != tt.code || a.reason != tt.reason || string(a.body) != tt.body {
			t.Errorf("parseAnswer(%q) = %d %q %q, %v; want %d %q %q", tt.raw, a.code, a.reason, a.body, err, tt.code, tt.reason, tt.body)
		}
	}
	big := append([]byte("HTTP/1.0 200 OK\r\nX: "), bytes.Repeat([]byte("y"), maxAnswer)...)
	if _, err := parseAnswer(big[:maxAnswer]); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("an endless header: %v", err)
	}
}

// FuzzParseAnswer: any bytes give an answer or an error, never a panic; an
// answer has a status code and a body from within the input, and what
// net/http's client reads of the same bytes agrees on the status code.
func FuzzParseAnswer(f *testing.F) {
	f.Add([]byte("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nboom\n"))
	f.Add([]byte("HTTP/1.0 400 Bad Request\r\n\r\nbad event"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		a, err := parseAnswer(raw)
		if err != nil {
			return
		}
		if a.code < 100 || a.code > 999 || !bytes.Contains(raw, a.body) {
			t.Fatalf("parseAnswer(%q) = %+v", raw, a)
		}
		resp, herr := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
		if herr == nil && resp.StatusCode != a.code {
			t.Fatalf("parseAnswer(%q) read status %d, net/http %d", raw, a.code, resp.StatusCode)
		}
	})
}
