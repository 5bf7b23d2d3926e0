package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/weftmesh/weft/waypoint/urlpath"
)

// The waypoint's HTTP/1.1 handling against net/http's server, the
// reference parser: the same bytes go to a net/http server and, on a
// CONNECT stream, to the waypoint (BASE path normalization) in front of a
// net/http upstream. Either both refuse the request, or the upstream
// receives the request net/http's server parsed: the same method, target
// (normalized as urlpath does), Host, header fields, body and trailers,
// but for what a proxy changes on purpose (hopHeader below). Whatever
// the upstream receives, the waypoint also authorized: it never receives
// the path or the header field a DENY policy names.
//
// Documented differences, which the comparison allows:
//   - An absolute-form target without a Host field: net/http's server
//     refuses it (RFC 9112 section 3.2); the waypoint takes the target's
//     authority, which http.ReadRequest gives it (it cannot tell an
//     absent Host field from an empty one), and forwards that as Host.
//   - An HTTP/1.1 request with an empty Host: net/http accepts it; the
//     waypoint refuses it (400), as it routes by authority.
//   - A path that normalization refuses (%00), or an absolute-form target
//     whose scheme is not http or https ("x:y", "a:/b", which net/url
//     takes): the waypoint answers 400.

// exchange is what a net/http server handler saw of one request.
type exchange struct {
	method, uri, host string
	header, trailer   http.Header
	body              []byte
	bodyErr           error
}

// sink gathers what a server's handler saw, per input: a request of an
// earlier input that arrives late goes to that input's channel.
type sink struct{ ch atomic.Pointer[chan exchange] }

func (k *sink) handler(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	select {
	case *k.ch.Load() <- exchange{r.Method, r.RequestURI, r.Host, r.Header.Clone(), r.Trailer.Clone(), b, err}:
	default:
	}
}

// next starts a new input.
func (k *sink) next() {
	ch := make(chan exchange, 16)
	k.ch.Store(&ch)
}

// seen returns what the handler saw of this input, once the connection
// that carried it is done.
func (k *sink) seen() []exchange {
	ch := *k.ch.Load()
	var out []exchange
	for {
		select {
		case e := <-ch:
			out = append(out, e)
		case <-time.After(10 * time.Millisecond):
			return out
		}
	}
}

// sendRaw writes in on c and reads the answers to the end. With wait,
// the first response is awaited before the sending side ends: the
// waypoint takes a client that ends its side for one that left, and
// cancels its request.
func sendRaw(c net.Conn, in []byte, wait bool) []byte {
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	c.Write(in)
	var out bytes.Buffer
	br := bufio.NewReader(io.TeeReader(c, &out))
	for wait {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		io.Copy(io.Discard, resp.Body)
		wait = resp.StatusCode < 200 // an interim response: the final one follows
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	io.Copy(io.Discard, br)
	return out.Bytes()
}

// hopHeader reports the fields a proxy may drop, add or rewrite: those of
// the hop (RFC 9110 section 7.6.1, and the ones Connection names), the
// framing, which the waypoint writes anew, the trace context it continues,
// the request id it adds when missing (TestRequestID checks it is kept),
// and the internal headers it strips.
func hopHeader(k string, connection []string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Te", "Transfer-Encoding", "Upgrade", "Proxy-Authenticate",
		"Proxy-Authorization", "Content-Length", "Trailer", "Traceparent", "X-Request-Id", "X-Forwarded-Client-Cert":
		return true
	}
	if strings.HasPrefix(k, "X-Envoy-") {
		return true
	}
	for _, f := range connection {
		for v := range strings.SplitSeq(f, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(v)) == k {
				return true
			}
		}
	}
	return false
}

func endToEnd(h http.Header) http.Header {
	out := http.Header{}
	for k, vs := range h {
		if !hopHeader(k, h["Connection"]) {
			out[k] = vs
		}
	}
	return out
}

// wantTarget is the target the upstream should receive for one net/http
// parsed: the origin form, its fragment cut, its path normalized (BASE);
// ok false when normalization refuses it.
func wantTarget(uri string) (string, bool) {
	if uri == "*" {
		return uri, true
	}
	if !strings.HasPrefix(uri, "/") {
		// The waypoint takes an absolute form of an http(s) URI only.
		scheme, _, ok := strings.Cut(uri, "://")
		if s := strings.ToLower(scheme); !ok || (s != "http" && s != "https") {
			return "", false
		}
		uri = originForm(uri)
	}
	uri, _, _ = strings.Cut(uri, "#")
	path, q, hasQ := strings.Cut(uri, "?")
	np, err := urlpath.Normalize(path, urlpath.Options{RFC3986: true})
	if err != nil {
		return "", false
	}
	if hasQ {
		np += "?" + q
	}
	return np, true
}

func FuzzHTTP1Differential(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /x/../deny HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /%64eny?q=1 HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-T: v\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-Deny: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-Deny : 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n folded\r\n\r\n",
		"GET / HTTP/1.1\nHost: a\nX-Deny: 1\n\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX\x00Deny: 1\r\n\r\n",
		"GET /a\x00b HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET http://a/deny HTTP/1.1\r\nHost: b\r\n\r\n",
		"GET http://a/x HTTP/1.1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: \r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: x-deny\r\nX-Deny: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-Client-Cert: URI=spiffe://x\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /deny HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /#/../deny HTTP/1.1\r\nHost: a\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
		"get / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
		"GET /\\deny HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc",
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc",
		"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n-3\r\nabc\r\n0\r\n\r\n",
		"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
		"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /?%00 HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /%00 HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /%2e%2E/deny?x HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-Deny:\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nx-deny: 1\r\nX-DENY: 2\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nPragma: no-cache\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
		"GET / HTTP/1.1\r\nHost: a\r\nExpect: nope\r\n\r\n",
		"A * HTTP/1.0\r\nHost:0\n\r\n",
		"GET a:/deny HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET x:deny HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET HTTP://a/%64eny HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET https://a?x HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	var refSink, upSink sink
	refSink.next()
	upSink.next()
	ref := serveHTTP(f, http.HandlerFunc(refSink.handler), func(s *http.Server) { s.MaxHeaderBytes = maxHeaderBytes })
	up := backend(f, "up", upSink.handler)
	m := newMesh(f)
	m.hcm = pathModes["BASE"]
	deny := rbacHTTP(f, &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{"deny": {
		Permissions: []*rbacv3.Permission{
			pathPerm(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "/deny"}}),
			{Rule: &rbacv3.Permission_Header{Header: &routev3.HeaderMatcher{Name: "x-deny", HeaderMatchSpecifier: &routev3.HeaderMatcher_PresentMatch{PresentMatch: true}}}},
		},
		Principals: anyone,
	}}})
	m.apply([]*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("up")}}, map[string][]netip.AddrPort{"up": {up}}, deny)

	f.Fuzz(func(t *testing.T, in []byte) {
		if sniff(bufio.NewReader(bytes.NewReader(in))) != sniffedH1 {
			// Not HTTP/1.x to the waypoint: its TCP fallback, not its
			// HTTP/1.1 server, takes these bytes.
			return
		}
		refSink.next()
		upSink.next()
		rc, err := net.Dial("tcp", ref.String())
		if err != nil {
			t.Fatal(err)
		}
		refResp := sendRaw(rc, in, false)
		refs := refSink.seen()
		wc, err := m.dial(vip)
		if err != nil {
			t.Fatal(err)
		}
		// When net/http read a whole request, or refused a whole head, the
		// waypoint answers it before the client ends its side.
		whole := len(refs) > 0 && refs[0].bodyErr == nil || len(refs) == 0 && (bytes.Contains(in, []byte("\n\n")) || bytes.Contains(in, []byte("\n\r\n")))
		wpResp := sendRaw(wc, in, whole)
		ups := upSink.seen()

		for _, u := range ups {
			if p, _, _ := strings.Cut(u.uri, "?"); p == "/deny" {
				t.Fatalf("the upstream received %q, which policy denies; input %q", u.uri, in)
			}
			if _, ok := u.header["X-Deny"]; ok {
				t.Fatalf("the upstream received X-Deny, which policy denies; input %q", in)
			}
		}
		if len(refs) == 0 {
			// net/http refused it (or read no request).
			if len(ups) > 0 && !absoluteWithoutHost(in, refResp) {
				t.Fatalf("net/http refused %q (%q) but the upstream received %+v", in, firstLine(refResp), ups[0])
			}
			return
		}
		r := refs[0]
		target, ok := wantTarget(r.uri)
		if !ok {
			if len(ups) > 0 {
				t.Fatalf("input %q: the waypoint should refuse the path %q but forwarded %+v", in, r.uri, ups[0])
			}
			return
		}
		if r.host == "" {
			return // the second documented difference
		}
		if r.method == "CONNECT" {
			return // the route does not tunnel; both sides' answers differ on purpose
		}
		if r.bodyErr != nil {
			return // a broken body: how far each side got differs
		}
		if len(ups) == 0 {
			if bytes.HasPrefix(wpResp, []byte("HTTP/1.1 403")) && denied(r) {
				return
			}
			if bytes.HasPrefix(wpResp, []byte("HTTP/1.1 404")) && !strings.HasPrefix(target, "/") {
				return // "*" is not under the route's prefix "/"
			}
			t.Fatalf("net/http accepted %q (%s %s) but the waypoint answered %q", in, r.method, r.uri, firstLine(wpResp))
		}
		u := ups[0]
		if u.bodyErr != nil {
			t.Fatalf("input %q: net/http read the body whole, the upstream got %v", in, u.bodyErr)
		}
		got := exchange{u.method, u.uri, u.host, endToEnd(u.header), u.trailer, u.body, nil}
		want := exchange{r.method, target, r.host, endToEnd(r.header), r.trailer, r.body, nil}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(exchange{}), cmp.Comparer(func(a, b error) bool { return a == b }), cmpEmpty); diff != "" {
			t.Fatalf("input %q: the upstream received (-net/http +upstream):\n%s", in, diff)
		}
	})
}

// cmpEmpty equates a nil and an empty header or body.
var cmpEmpty = cmp.FilterValues(func(a, b any) bool {
	return isEmpty(a) && isEmpty(b)
}, cmp.Comparer(func(_, _ any) bool { return true }))

func isEmpty(v any) bool {
	switch x := v.(type) {
	case http.Header:
		return len(x) == 0
	case []byte:
		return len(x) == 0
	}
	return false
}

// denied reports whether the DENY policy of the fuzz target matches r.
func denied(r exchange) bool {
	target, _ := wantTarget(r.uri)
	p, _, _ := strings.Cut(target, "?")
	_, hdr := r.header["X-Deny"]
	return p == "/deny" || hdr
}

// absoluteWithoutHost reports the first documented difference: an
// absolute-form target and no Host field, which net/http refuses.
func absoluteWithoutHost(in, refResp []byte) bool {
	line, _, _ := bytes.Cut(in, []byte("\n"))
	f := bytes.Fields(line)
	return len(f) >= 2 && !bytes.HasPrefix(f[1], []byte("/")) && bytes.Contains(refResp, []byte("missing required Host header"))
}

func firstLine(b []byte) string {
	l, _, _ := bytes.Cut(b, []byte("\r\n"))
	return string(l)
}
