package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// The HTTP/1.1 side of the waypoint as clients see it (RFC 9112): the
// tests speak raw HTTP/1.1 on a CONNECT stream.

// rawH1 is one CONNECT stream to the waypoint for hand-written HTTP/1.1.
type rawH1 struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func (m *mesh) raw(t *testing.T) *rawH1 {
	t.Helper()
	c, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawH1{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawH1) send(s string) {
	r.t.Helper()
	if _, err := io.WriteString(r.c, s); err != nil {
		r.t.Fatal(err)
	}
}

// response reads one response to a request with method and returns it with
// its body (and trailers) read.
func (r *rawH1) response(method string) (*http.Response, string) {
	r.t.Helper()
	resp, err := http.ReadResponse(r.br, &http.Request{Method: method})
	if err != nil {
		r.t.Fatalf("reading a response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("reading a response body: %v", err)
	}
	return resp, string(b)
}

// ended reports whether the waypoint ended the stream (EOF, nothing more).
func (r *rawH1) ended() bool {
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer r.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := r.br.Read(make([]byte, 1))
	return n == 0 && err != nil && !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// h1Upstream answers by path: /echo echoes the request (method, body,
// trailers), /chunked answers without a length in pieces, /trailers with
// trailers, /head-length with a length only, /nobody 204, /cached 304,
// /wait until its request is canceled (reporting that on canceled); anything
// else "ok <path>".
func h1Upstream(t *testing.T, canceled chan<- string) netip.AddrPort {
	return backend(t, "up", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/echo":
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			fmt.Fprintf(w, "%s %q trailer=%q", r.Method, b, r.Trailer.Get("X-Sum"))
		case "/chunked":
			for i := range 3 {
				if i > 0 {
					time.Sleep(20 * time.Millisecond) // each piece on its own
				}
				fmt.Fprintf(w, "part%d;", i)
				w.(http.Flusher).Flush()
			}
		case "/trailers":
			w.Header().Set("Trailer", "X-Announced")
			io.WriteString(w, "body")
			w.(http.Flusher).Flush()
			w.Header().Set("X-Announced", "a")
			w.Header().Set(http.TrailerPrefix+"X-Late", "b")
		case "/head-length":
			w.Header().Set("Content-Length", "5")
			if r.Method != "HEAD" {
				io.WriteString(w, "12345")
			}
		case "/nobody":
			w.WriteHeader(http.StatusNoContent)
		case "/cached":
			w.Header().Set("ETag", `"x"`)
			w.WriteHeader(http.StatusNotModified)
		case "/wait":
			select {
			case <-r.Context().Done():
				canceled <- r.URL.RawQuery
			case <-time.After(10 * time.Second):
			}
		default:
			io.WriteString(w, "ok "+r.URL.Path)
		}
	})
}

func h1Mesh(t *testing.T) (*mesh, chan string) {
	m := newMesh(t)
	canceled := make(chan string, 4)
	deny := &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{"deny-admin": {
		Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "/admin"}}}}}}},
		Principals:  []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}},
	}}}
	m.apply([]*routev3.Route{{Match: prefix("/"), Action: toCluster("up")}},
		map[string][]netip.AddrPort{"up": {h1Upstream(t, canceled)}},
		&hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rbacfilter.RBAC{Rules: deny})}})
	return m, canceled
}

const hostLine = "Host: " + svcHost + "\r\n"

// TestHTTP1KeepAliveAndPipelining: requests sent back to back in one write
// are answered in order on the same stream, which then serves more.
func TestHTTP1KeepAliveAndPipelining(t *testing.T) {
	m, _ := h1Mesh(t)
	c := m.raw(t)
	c.send("GET /a HTTP/1.1\r\n" + hostLine + "\r\n" +
		"POST /echo HTTP/1.1\r\n" + hostLine + "Content-Length: 5\r\n\r\nhello" +
		"GET /c HTTP/1.1\r\n" + hostLine + "\r\n")
	for _, want := range []struct{ method, body string }{{"GET", "ok /a"}, {"POST", `POST "hello" trailer=""`}, {"GET", "ok /c"}} {
		resp, b := c.response(want.method)
		if resp.StatusCode != 200 || b != want.body || resp.Close {
			t.Fatalf("pipelined %s: %d %q close=%v, want 200 %q, kept alive", want.method, resp.StatusCode, b, resp.Close, want.body)
		}
	}
	c.send("GET /later HTTP/1.1\r\n" + hostLine + "\r\n")
	if resp, b := c.response("GET"); resp.StatusCode != 200 || b != "ok /later" {
		t.Fatalf("request after the pipelined ones: %d %q", resp.StatusCode, b)
	}
}

// TestHTTP1Close: Connection: close, and HTTP/1.0 without keep-alive, end
// the stream after the response; HTTP/1.0 gets a body of unknown length
// delimited by the end of the stream; HTTP/1.0 with keep-alive stays open
// for a response with a length.
func TestHTTP1Close(t *testing.T) {
	m, _ := h1Mesh(t)
	c := m.raw(t)
	c.send("GET /a HTTP/1.1\r\n" + hostLine + "Connection: close\r\n\r\n")
	if resp, b := c.response("GET"); resp.StatusCode != 200 || b != "ok /a" || !resp.Close {
		t.Errorf("Connection: close: %d %q close=%v", resp.StatusCode, b, resp.Close)
	}
	if !c.ended() {
		t.Error("the stream stayed open after Connection: close")
	}

	c = m.raw(t)
	c.send("GET /chunked HTTP/1.0\r\n" + hostLine + "\r\n")
	resp, b := c.response("GET")
	if resp.StatusCode != 200 || b != "part0;part1;part2;" || len(resp.TransferEncoding) != 0 || resp.ContentLength != -1 {
		t.Errorf("HTTP/1.0, body of unknown length: %d %q te=%v length=%d", resp.StatusCode, b, resp.TransferEncoding, resp.ContentLength)
	}
	if !c.ended() {
		t.Error("the stream stayed open after an HTTP/1.0 response")
	}

	c = m.raw(t)
	for i := range 2 {
		c.send("GET /k HTTP/1.0\r\n" + hostLine + "Connection: keep-alive\r\n\r\n")
		resp, b := c.response("GET")
		if resp.StatusCode != 200 || b != "ok /k" || resp.Close {
			t.Fatalf("HTTP/1.0 keep-alive request %d: %d %q close=%v", i, resp.StatusCode, b, resp.Close)
		}
	}
}

// TestHTTP1Chunked: a chunked request body reaches the upstream with its
// trailers; an answer without a length comes back chunked, piece by piece.
func TestHTTP1Chunked(t *testing.T) {
	m, _ := h1Mesh(t)
	c := m.raw(t)
	c.send("POST /echo HTTP/1.1\r\n" + hostLine + "Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n" +
		"3\r\nabc\r\n2\r\nde\r\n0\r\nX-Sum: 5\r\n\r\n")
	if resp, b := c.response("POST"); resp.StatusCode != 200 || b != `POST "abcde" trailer="5"` {
		t.Errorf("chunked request: %d %q", resp.StatusCode, b)
	}
	c.send("GET /chunked HTTP/1.1\r\n" + hostLine + "\r\n")
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Errorf("answer without a length: transfer encoding %v, want chunked", resp.TransferEncoding)
	}
	// The first piece arrives before the upstream has finished.
	first := make([]byte, len("part0;"))
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "part0;" {
		t.Fatalf("first piece: %q %v", first, err)
	}
	if rest, _ := io.ReadAll(resp.Body); string(rest) != "part1;part2;" {
		t.Errorf("rest: %q", rest)
	}
}

// TestHTTP1ExpectContinue: the client's body waits for 100 Continue, sent
// once the body is needed; an expectation other than 100-continue is 417.
func TestHTTP1ExpectContinue(t *testing.T) {
	m, _ := h1Mesh(t)
	c := m.raw(t)
	c.send("POST /echo HTTP/1.1\r\n" + hostLine + "Content-Length: 4\r\nExpect: 100-continue\r\n\r\n")
	line, err := c.br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("before the body: %q %v, want 100 Continue", line, err)
	}
	if blank, _ := c.br.ReadString('\n'); blank != "\r\n" {
		t.Fatalf("100 Continue followed by %q", blank)
	}
	c.send("body")
	if resp, b := c.response("POST"); resp.StatusCode != 200 || b != `POST "body" trailer=""` {
		t.Errorf("after 100 Continue: %d %q", resp.StatusCode, b)
	}

	c.send("POST /echo HTTP/1.1\r\n" + hostLine + "Content-Length: 4\r\nExpect: something-else\r\n\r\n")
	if resp, _ := c.response("POST"); resp.StatusCode != http.StatusExpectationFailed {
		t.Errorf("Expect: something-else: %d, want 417", resp.StatusCode)
	}
}

// TestHTTP1Trailers: the upstream's trailers, announced or not, reach an
// HTTP/1.1 client after the body.
func TestHTTP1Trailers(t *testing.T) {
	m, _ := h1Mesh(t)
	c := m.raw(t)
	c.send("GET /trailers HTTP/1.1\r\n" + hostLine + "\r\n")
	resp, b := c.response("GET")
	if resp.StatusCode != 200 || b != "body" {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	if got := resp.Trailer.Get("X-Announced"); got != "a" {
		t.Errorf("announced trailer: %q, want a", got)
	}
	if got := resp.Trailer.Get("X-Late"); got != "b" {
		t.Errorf("unannounced trailer: %q, want b (trailers %v)", got, resp.Trailer)
	}
}

// TestHTTP1NoBody: HEAD keeps the upstream's length without a body; 204
// and 304 have no body; the stream serves the next request after each.
func TestHTTP1NoBody(t *testing.T) {
	m, _ := h1Mesh(t)
	c := m.raw(t)
	c.send("HEAD /head-length HTTP/1.1\r\n" + hostLine + "\r\n")
	if resp, b := c.response("HEAD"); resp.StatusCode != 200 || resp.ContentLength != 5 || b != "" {
		t.Errorf("HEAD: %d length %d body %q", resp.StatusCode, resp.ContentLength, b)
	}
	for _, tc := range []struct {
		path string
		code int
	}{{"/nobody", 204}, {"/cached", 304}} {
		c.send("GET " + tc.path + " HTTP/1.1\r\n" + hostLine + "\r\n")
		if resp, b := c.response("GET"); resp.StatusCode != tc.code || b != "" {
			t.Errorf("%s: %d %q, want %d without a body", tc.path, resp.StatusCode, b, tc.code)
		}
	}
	c.send("GET /after HTTP/1.1\r\n" + hostLine + "\r\n")
	if resp, b := c.response("GET"); resp.StatusCode != 200 || b != "ok /after" {
		t.Errorf("after: %d %q", resp.StatusCode, b)
	}
}

// TestHTTP1UnreadBody: a request refused before its body was read (RBAC)
// has the body skipped, so the next request on the stream is parsed right.
func TestHTTP1UnreadBody(t *testing.T) {
	m, _ := h1Mesh(t)
	c := m.raw(t)
	payload := strings.Repeat("z", 10<<10)
	c.send("POST /admin HTTP/1.1\r\n" + hostLine + "Content-Length: " + strconv.Itoa(len(payload)) + "\r\n\r\n" + payload)
	if resp, b := c.response("POST"); resp.StatusCode != 403 || b != "RBAC: access denied" {
		t.Fatalf("denied: %d %q", resp.StatusCode, b)
	}
	c.send("GET /next HTTP/1.1\r\n" + hostLine + "\r\n")
	if resp, b := c.response("GET"); resp.StatusCode != 200 || b != "ok /next" {
		t.Errorf("next request: %d %q", resp.StatusCode, b)
	}

	// Past 256 KiB the body is not skipped: the connection ends.
	big := strings.Repeat("z", 1<<20)
	c.send("POST /admin HTTP/1.1\r\n" + hostLine + "Content-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big)
	if resp, _ := c.response("POST"); resp.StatusCode != 403 || !resp.Close {
		t.Errorf("denied with 1 MiB unread: %d close=%v, want 403 and Connection: close", resp.StatusCode, resp.Close)
	}
	if !c.ended() {
		t.Error("the stream stayed open with 1 MiB of body unread")
	}
}

// TestHTTP1BadRequests: what the waypoint refuses before routing: 400 for
// a missing Host or a malformed header, 501 for an unknown transfer
// coding; each ends the stream.
func TestHTTP1BadRequests(t *testing.T) {
	m, _ := h1Mesh(t)
	for _, tc := range []struct {
		name, req string
		code      int
	}{
		{"no hostLine", "GET / HTTP/1.1\r\n\r\n", 400},
		{"bad header", "GET / HTTP/1.1\r\n" + hostLine + "Bad Header\r\n\r\n", 400},
		{"bad request line", "GET / HTTP/1.1 extra\r\n" + hostLine + "\r\n", 400},
		{"unknown transfer coding", "POST / HTTP/1.1\r\n" + hostLine + "Transfer-Encoding: gzip\r\n\r\n", 501},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := m.raw(t)
			c.send(tc.req)
			resp, _ := c.response("GET")
			if resp.StatusCode != tc.code {
				t.Errorf("%d, want %d", resp.StatusCode, tc.code)
			}
			if !c.ended() {
				t.Error("the stream stayed open")
			}
		})
	}
}

// TestHTTP1ClientLeaves: a client that ends its side of the stream while
// its request is in flight has the request canceled upstream.
func TestHTTP1ClientLeaves(t *testing.T) {
	m, canceled := h1Mesh(t)
	for _, how := range []string{"half-close", "close"} {
		t.Run(how, func(t *testing.T) {
			c := m.raw(t)
			c.send("GET /wait?" + how + " HTTP/1.1\r\n" + hostLine + "\r\n")
			time.Sleep(100 * time.Millisecond) // the request is upstream
			if how == "close" {
				c.c.Close()
			} else {
				c.c.(interface{ CloseWrite() error }).CloseWrite()
			}
			select {
			case got := <-canceled:
				if got != how {
					t.Errorf("canceled %q, want %q", got, how)
				}
			case <-time.After(5 * time.Second):
				t.Error("the upstream request was not canceled")
			}
		})
	}
}

// TestHTTP1ConcurrentStreams: many streams at once, each with requests in
// sequence, all answered right (the waypoint's HBONE side writes several
// streams' answers together).
func TestHTTP1ConcurrentStreams(t *testing.T) {
	m, _ := h1Mesh(t)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := m.dial(vip)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			br := bufio.NewReader(c)
			for j := range 50 {
				path := fmt.Sprintf("/s%d/r%d", i, j)
				body := bytes.Repeat([]byte{'a' + byte(j%26)}, j*97)
				fmt.Fprintf(c, "POST /echo HTTP/1.1\r\n"+hostLine+"Content-Length: %d\r\nX-Path: %s\r\n\r\n%s", len(body), path, body)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Errorf("%s: %v", path, err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				if want := fmt.Sprintf(`POST %q trailer=""`, body); string(b) != want {
					t.Errorf("%s: %q, want %q", path, b, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestSniff: the protocol is told from as few bytes as it takes (a short
// HTTP/1.0 request does not wait for more), the way it was from the
// preface's 24; any token is a method, empty lines before it are skipped.
func TestSniff(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want sniffed
		end  bool // the decision needs the end of the stream
	}{
		{in: http2Preface, want: sniffedH2},
		{in: "GET / HTTP/1.0\r\n\r\n", want: sniffedH1},
		{in: "PRI * HTTP/1.1\r\n\r\n", want: sniffedH1},
		{in: "PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", want: sniffedH1},
		{in: "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", want: sniffedH1},
		{in: "get / HTTP/1.1\r\n", want: sniffedH1},
		{in: "M-SEARCH * HTTP/1.1\r\n", want: sniffedH1},
		{in: "x!#$%&'*+.^_`|~9 / HTTP/1.1\r\n", want: sniffedH1},
		{in: "\r\n\r\nGET / HTTP/1.1\r\n", want: sniffedH1},
		{in: "\n\nget / HTTP/1.1\r\n", want: sniffedH1},
		{in: "PING", want: sniffedNone, end: true}, // a method, then the end
		{in: "HELLOTHISISALONGTOKENWITHOUTASPACE", want: sniffedNone, end: true},
		{in: "\r\n", want: sniffedNone, end: true},
		{in: "\r", want: sniffedNone, end: true},
		{in: "", want: sniffedNone, end: true},
		// Part of the preface, then the end: a request line to HTTP/1.
		{in: "PRI * HTTP/2", want: sniffedH1, end: true},
		{in: "PRI * HTTP/2.0\r\n\r\n", want: sniffedH1, end: true},
		{in: "PRI", want: sniffedNone, end: true},
		{in: "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", want: sniffedTCP},
		{in: "\rGET / HTTP/1.1\r\n", want: sniffedTCP},
		{in: "GET\t/ HTTP/1.1\r\n", want: sniffedTCP},
		{in: " GET / HTTP/1.1\r\n", want: sniffedTCP},
		{in: "G\xc9T / HTTP/1.1\r\n", want: sniffedTCP},
		{in: "GET/ HTTP/1.1\r\n", want: sniffedTCP},
		{in: "\x00\x00\x00\x08", want: sniffedTCP},
	} {
		r := &oneByte{s: tc.in}
		if got := sniff(bufio.NewReader(r)); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.in, got, tc.want)
		}
		if r.overrun && !tc.end {
			t.Errorf("%q: read past the bytes that decide", tc.in)
		}
	}
	// A method that fills the buffer is taken for one; so are empty lines
	// that do not.
	long := strings.Repeat("A", 5000) + " / HTTP/1.1\r\n"
	if got := sniff(bufio.NewReaderSize(strings.NewReader(long), 4096)); got != sniffedH1 {
		t.Errorf("a 5000-byte method: %v", got)
	}
	if got := sniff(bufio.NewReaderSize(strings.NewReader(strings.Repeat("\r\n", 3000)), 4096)); got != sniffedTCP {
		t.Errorf("a buffer of empty lines: %v", got)
	}
}

const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// oneByte reads its string one byte per Read, then EOF, noting a read past
// the string (where a stream would have waited for more).
type oneByte struct {
	s       string
	overrun bool
}

func (r *oneByte) Read(p []byte) (int, error) {
	if len(r.s) == 0 {
		r.overrun = true
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0], r.s = r.s[0], r.s[1:]
	return 1, nil
}

// FuzzSniff: any first bytes give an answer, HTTP/2 only for its preface,
// and whatever http.ReadRequest accepts as a request (which it does not
// after empty lines, which the HTTP/1 server skips too) is HTTP/1.x.
func FuzzSniff(f *testing.F) {
	for _, s := range []string{http2Preface, "GET / HTTP/1.1\r\n", "PRI * HTTP/1.1", "\x16\x03\x01", "",
		"get / HTTP/1.1\r\nHost: a\r\n\r\n", "\r\nM-SEARCH * HTTP/1.1\r\n\r\n", "GET\t/ HTTP/1.1\r\n\r\n",
		"CONNECT a:1 HTTP/1.1\r\n\r\n", "GET http://a/b HTTP/1.0\n\n", "PRI * HTTP/2.0\r\n\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := sniff(bufio.NewReader(&oneByte{s: s}))
		if got == sniffedH2 && !strings.HasPrefix(s, http2Preface) {
			t.Errorf("%q taken for HTTP/2", s)
		}
		if strings.HasPrefix(s, http2Preface) && got != sniffedH2 {
			t.Errorf("the preface taken for %v", got)
		}
		if _, err := http.ReadRequest(bufio.NewReader(strings.NewReader(s))); err == nil && got != sniffedH1 && got != sniffedH2 {
			t.Errorf("%q is a request to net/http but sniffed %v", s, got)
		}
		// What follows empty lines is sniffed as it would be alone.
		if got2 := sniff(bufio.NewReader(&oneByte{s: "\r\n\n" + s})); got == sniffedH1 && got2 != sniffedH1 {
			t.Errorf("%q after empty lines sniffed %v", s, got2)
		}
	})
}
