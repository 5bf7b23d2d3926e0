package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// misdirectedFixture is the Gateway API conformance suite's gateway with
// four HTTPS listeners on one port: one without a hostname (routes for
// example.org), second-example.org, *.wildcard.org and
// fourth-example.wildcard.org, each answering with its own name; and a
// passthrough chain for pass.example.org.
type misdirectedFixture struct {
	*gatewayFixture
	port   uint16
	chains []*listenerv3.FilterChain
	routes map[string][]*routev3.VirtualHost
}

func newMisdirectedFixture(t *testing.T) *misdirectedFixture {
	g := newGatewayFixture(t)
	port := freePort(t)
	p := strconv.Itoa(int(port))
	names := []string{"example.org", "second-example.org", "unknown-example.org", "*.wildcard.org", "a.b.wildcard.org"}
	f := &misdirectedFixture{gatewayFixture: g, port: port,
		chains: []*listenerv3.FilterChain{
			g.tlsChain("https/"+p+"/https", nil, names, "https."+p+".https"),
			g.tlsChain("https/"+p+"/second", []string{"second-example.org"}, names, "https."+p+".second"),
			g.tlsChain("https/"+p+"/wild", []string{"*.wildcard.org"}, names, "https."+p+".wild"),
			g.tlsChain("https/"+p+"/fourth", []string{"fourth-example.wildcard.org"}, names, "https."+p+".fourth"),
			passChain(t, "tls/"+p+"/pass", backendCluster, "pass.example.org"),
		},
		routes: map[string][]*routev3.VirtualHost{
			"https." + p + ".https":  {direct("example.org", "v1")},
			"https." + p + ".second": {direct("second-example.org", "v2")},
			"https." + p + ".wild":   {direct("*.wildcard.org", "v3")},
			"https." + p + ".fourth": {direct("fourth-example.wildcard.org", "v4")},
		}}
	f.push()
	return f
}

func (f *misdirectedFixture) push() {
	f.apply([]*listenerv3.Listener{tlsListener(f.t, f.port, f.chains...)}, f.routes)
}

// conn opens a TLS connection with sni offering protos.
func (f *misdirectedFixture) conn(t *testing.T, sni string, protos ...string) *tls.Conn {
	t.Helper()
	c, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", f.port), &tls.Config{ServerName: sni, RootCAs: f.roots,
		InsecureSkipVerify: sni == "", NextProtos: protos})
	if err != nil {
		t.Fatalf("TLS with SNI %q: %v", sni, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// The conformance suite's cases and the ways around them, over HTTP/1.1
// and HTTP/2 alike (net/http's client, a new connection per request): the
// SNI picks the chain, a Host another chain takes is answered 421, one
// only the connection's chain (or none) takes is routed there.
func TestGatewayMisdirected(t *testing.T) {
	f := newMisdirectedFixture(t)
	cases := []struct{ sni, host, want string }{
		// The suite's.
		{"example.org", "example.org", "v1"},
		{"example.org", "second-example.org", "421"},
		{"example.org", "unknown-example.org", "404"},
		{"second-example.org", "second-example.org", "v2"},
		{"second-example.org", "example.org", "421"},
		{"second-example.org", "unknown-example.org", "421"},
		{"third-example.wildcard.org", "third-example.wildcard.org", "v3"},
		{"third-example.wildcard.org", "fith-example.wildcard.org", "v3"},
		{"third-example.wildcard.org", "fourth-example.wildcard.org", "421"},
		{"third-example.wildcard.org", "second-example.org", "421"},
		{"third-example.wildcard.org", "unknown-example.org", "421"},
		{"fourth-example.wildcard.org", "fourth-example.wildcard.org", "v4"},
		{"fourth-example.wildcard.org", "fith-example.wildcard.org", "421"},
		{"unknown-example.org", "example.org", "v1"},
		{"unknown-example.org", "unknown-example.org", "404"},
		// The Host's port, case and trailing dot do not hide the name.
		{"example.org", "second-example.org:443", "421"},
		{"example.org", "SECOND-Example.ORG", "421"},
		{"example.org", "second-example.org.", "421"},
		{"example.org", "Second-Example.org.:8443", "421"},
		{"example.org", "FOURTH-example.wildcard.org", "421"},
		{"second-example.org", "Second-Example.ORG:" + strconv.Itoa(int(f.port)), "v2"},
		{"fourth-example.wildcard.org", "FOURTH-EXAMPLE.WILDCARD.ORG", "v4"},
		{"SECOND-EXAMPLE.ORG", "second-example.org", "v2"},
		// The connection's own chain with a trailing dot: the route
		// table, like Envoy's, does not drop it.
		{"second-example.org", "second-example.org.", "404"},
		// Wildcard edges: the wildcard's own suffix is not under it; a
		// deeper name is.
		{"example.org", "wildcard.org", "404"},
		{"example.org", ".wildcard.org", "404"},
		{"example.org", "a.b.wildcard.org", "421"},
		{"a.b.wildcard.org", "a.b.wildcard.org", "v3"},
		{"x.wildcard.org", "fourth-example.wildcard.org.", "421"},
		// A name the passthrough chain takes belongs to another chain.
		{"example.org", "pass.example.org", "421"},
		// Without SNI the chain without names serves; names others take
		// are still theirs.
		{"", "example.org", "v1"},
		{"", "second-example.org", "421"},
		{"", "x.wildcard.org", "421"},
		{"", "unknown-example.org", "404"},
		// Addresses and oversized names.
		{"example.org", "127.0.0.1", "404"},
		{"example.org", "[::1]:443", "404"},
		{"second-example.org", "127.0.0.1:443", "421"},
		{"example.org", strings.Repeat("a", 200) + "." + strings.Repeat("b", 200) + ".wildcard.org", "421"},
	}
	for _, h2 := range []bool{false, true} {
		proto := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]
		t.Run(proto, func(t *testing.T) {
			for _, tc := range cases {
				c, _ := f.tlsClient(tc.sni, h2)
				resp := gwGet(t, c, "https", f.port, tc.host, nil)
				got := resp.body
				if resp.StatusCode != 200 {
					got = strconv.Itoa(resp.StatusCode)
				}
				if got != tc.want || resp.Proto != proto {
					t.Errorf("SNI %q Host %q: %s %d %q, want %s", tc.sni, tc.host, resp.Proto, resp.StatusCode, resp.body, tc.want)
				}
			}
		})
	}
}

// HTTP/2 connection coalescing, the reason 421 exists (RFC 9113 section
// 9.1.1): a client that reuses its connection for another name its
// certificate covers is told so with 421 on that stream alone; the
// connection goes on serving its own names, and a new connection with the
// other name's SNI reaches the other chain.
func TestGatewayMisdirectedCoalescing(t *testing.T) {
	f := newMisdirectedFixture(t)
	c := f.conn(t, "example.org", "h2")
	if got := c.ConnectionState().NegotiatedProtocol; got != "h2" {
		t.Fatalf("ALPN %q, want h2", got)
	}
	// x/net's client: an HTTP/2 peer independent of the proxy's server.
	//lint:ignore SA1019 x/net's client, independent of the waypoint's (net/http's)
	cc, err := (&http2.Transport{}).NewClientConn(c)
	if err != nil {
		t.Fatal(err)
	}
	do := func(host string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+host+"/detect-misdirected-requests", nil)
		resp, err := cc.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s on the example.org connection: %v", host, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	for i, tc := range []struct {
		host string
		code int
		body string
	}{
		{"example.org", 200, "v1"},
		{"second-example.org", 421, "misdirected request"},
		{"example.org", 200, "v1"},
		{"x.wildcard.org:443", 421, "misdirected request"},
		{"fourth-example.wildcard.org", 421, "misdirected request"},
		{"example.org:443", 200, "v1"},
	} {
		if code, body := do(tc.host); code != tc.code || body != tc.body {
			t.Errorf("request %d, %s: %d %q, want %d %q", i, tc.host, code, body, tc.code, tc.body)
		}
	}
	if st := cc.State(); st.Closed || st.Closing {
		t.Errorf("the connection ended after a 421: %+v", st)
	}
	// Concurrent streams of both kinds on the one connection.
	errs := make(chan error, 20)
	for i := range 20 {
		host, want := "example.org", 200
		if i%2 == 1 {
			host, want = "second-example.org", 421
		}
		go func() {
			req, _ := http.NewRequest("GET", "https://"+host+"/", nil)
			resp, err := cc.RoundTrip(req)
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				err = fmt.Errorf("%s: %d, want %d", host, resp.StatusCode, want)
			}
			errs <- err
		}()
	}
	for range 20 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	// The retry the 421 asks for: a new connection for the other name.
	c2 := f.conn(t, "second-example.org", "h2")
	//lint:ignore SA1019 x/net's client, as above
	cc2, err := (&http2.Transport{}).NewClientConn(c2)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "https://second-example.org/detect-misdirected-requests", nil)
	resp, err := cc2.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "v2" {
		t.Errorf("second-example.org on its own connection: %d %q, want 200 v2", resp.StatusCode, b)
	}
}

// The name that decides is the one routing uses: an HTTP/1.1 request in
// absolute form names its origin in the request line, whatever its Host
// header says, and a request with two Host headers is refused.
func TestGatewayMisdirectedRequestLine(t *testing.T) {
	f := newMisdirectedFixture(t)
	for _, tc := range []struct {
		head string
		want int
	}{
		{"GET https://second-example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n", 421},
		{"GET https://example.org/ HTTP/1.1\r\nHost: second-example.org\r\n\r\n", 200},
		{"GET / HTTP/1.1\r\nHost: example.org\r\nHost: second-example.org\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: second-example.org\r\nX-Forwarded-Host: example.org\r\n\r\n", 421},
		{"GET / HTTP/1.1\r\nHost: example.org\r\nX-Forwarded-Host: second-example.org\r\n:authority: second-example.org\r\n\r\n", 400},
	} {
		f.expectRaw(t, tc.head, tc.want)
	}
}

// The chains a Host is checked against are the listener's as it is now:
// a chain added while a connection is open takes its names from it.
func TestGatewayMisdirectedFollowsConfiguration(t *testing.T) {
	f := newMisdirectedFixture(t)
	c := f.conn(t, "example.org", "h2")
	//lint:ignore SA1019 x/net's client, independent of the waypoint's (net/http's)
	cc, err := (&http2.Transport{}).NewClientConn(c)
	if err != nil {
		t.Fatal(err)
	}
	get := func(host string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+host+"/", nil)
		resp, err := cc.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("late.example.org"); code != 404 {
		t.Fatalf("late.example.org before its chain: %d, want 404", code)
	}
	p := strconv.Itoa(int(f.port))
	f.chains = append(f.chains, f.tlsChain("https/"+p+"/late", []string{"late.example.org"}, []string{"late.example.org"}, "https."+p+".late"))
	f.routes["https."+p+".late"] = []*routev3.VirtualHost{direct("late.example.org", "late")}
	f.push()
	waitFor(t, "the new chain to take its name", func() bool { return get("late.example.org") == 421 })
	if code := get("example.org"); code != 200 {
		t.Errorf("example.org after the change: %d, want 200", code)
	}
}

// expectRaw sends head as written on a new HTTP/1.1 connection whose SNI
// is example.org and checks the answer's status.
func (f *misdirectedFixture) expectRaw(t *testing.T, head string, want int) {
	t.Helper()
	c := f.conn(t, "example.org", "http/1.1")
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, head)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Errorf("%q: %v", head, err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Errorf("%q: %d, want %d", head, resp.StatusCode, want)
	}
}

// The other forms a name takes in HTTP/1.1: in the request line (with
// userinfo, another scheme, a port, in any case), in a CONNECT's target,
// with whitespace around it; and the forms that are not a name at all
// (userinfo or non-ASCII in Host, refused) or that name no chain
// (percent-encoded: neither this check nor the route table decodes it).
func TestGatewayMisdirectedForms(t *testing.T) {
	f := newMisdirectedFixture(t)
	for _, tc := range []struct {
		head string
		want int
	}{
		{"GET https://user@second-example.org/ HTTP/1.1\r\nHost: example.org\r\n\r\n", 421},
		{"GET https://user:pw@example.org/ HTTP/1.1\r\nHost: second-example.org\r\n\r\n", 200},
		{"GET http://SECOND-example.org:443/ HTTP/1.1\r\nHost: example.org\r\n\r\n", 421},
		{"GET https://x.wildcard.org./ HTTP/1.1\r\nHost: example.org\r\n\r\n", 421},
		{"CONNECT second-example.org:443 HTTP/1.1\r\nHost: second-example.org:443\r\n\r\n", 421},
		{"CONNECT second-example.org:443 HTTP/1.1\r\nHost: example.org\r\n\r\n", 421},
		{"GET / HTTP/1.1\r\nHost:   second-example.org \t\r\n\r\n", 421},
		{"GET / HTTP/1.1\r\nHost: user@second-example.org\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: \u017fecond-example.org\r\n\r\n", 400},  // long s: folds to s, is no DNS name
		{"GET / HTTP/1.1\r\nHost: second-example.org\u212a\r\n\r\n", 400}, // Kelvin sign
		{"GET / HTTP/1.1\r\nHost: second%2Dexample.org\r\n\r\n", 404},
		// The chain's strip_any_host_port takes one port off and the check
		// another: a name followed by two ports is still the name's.
		{"GET / HTTP/1.1\r\nHost: second-example.org:443:443\r\n\r\n", 421},
		{"GET / HTTP/1.1\r\nHost: [second-example.org]:443\r\n\r\n", 404},
		{"GET / HTTP/1.0\r\n\r\n", 404},
	} {
		f.expectRaw(t, tc.head, tc.want)
	}
}

// HTTP/2 requests written field by field: the name that decides is
// :authority, the one routing uses, whatever a host field says (a host
// without :authority decides alone); CONNECT's :authority is checked as
// well.
func TestGatewayMisdirectedH2Fields(t *testing.T) {
	f := newMisdirectedFixture(t)
	for _, tc := range []struct {
		fields []string
		want   string // a status, or "reset"
	}{
		{[]string{":method", "GET", ":scheme", "https", ":authority", "second-example.org", ":path", "/", "host", "example.org"}, "421"},
		{[]string{":method", "GET", ":scheme", "https", ":authority", "example.org", ":path", "/", "host", "second-example.org"}, "200"},
		{[]string{":method", "GET", ":scheme", "https", ":path", "/", "host", "second-example.org"}, "421"},
		{[]string{":method", "GET", ":scheme", "https", ":authority", "SECOND-EXAMPLE.ORG.:443", ":path", "/"}, "421"},
		{[]string{":method", "CONNECT", ":authority", "second-example.org:443"}, "421"},
		{[]string{":method", "GET", ":scheme", "https", ":authority", "user@second-example.org", ":path", "/"}, "reset"},
		{[]string{":method", "GET", ":scheme", "https", ":authority", "\u017fecond-example.org", ":path", "/"}, "400"},
		{[]string{":method", "GET", ":scheme", "https", ":path", "/", "host", "second-example.org\u212a"}, "400"},
	} {
		c := f.conn(t, "example.org", "h2")
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, http2.ClientPreface)
		fr := http2.NewFramer(c, c)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		if err := fr.WriteSettings(); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: encodeHeaders(tc.fields...), EndHeaders: true, EndStream: true}); err != nil {
			t.Fatal(err)
		}
		got := ""
		for got == "" {
			fm, err := fr.ReadFrame()
			if err != nil {
				got = "read: " + err.Error()
				break
			}
			switch fm := fm.(type) {
			case *http2.MetaHeadersFrame:
				got = fm.PseudoValue("status")
			case *http2.RSTStreamFrame:
				got = "reset"
			case *http2.GoAwayFrame:
				got = "reset"
			}
		}
		if got != tc.want {
			t.Errorf("%q: %s, want %s", tc.fields, got, tc.want)
		}
	}
}

// A name held by a chain that serves nothing (the control plane's chain
// to BlackHoleCluster for a listener left unserved) is still that
// chain's: on a connection of a wildcard chain that would cover it, a
// request for it is misdirected, not routed by the wildcard's routes.
func TestGatewayMisdirectedHeldName(t *testing.T) {
	f := newMisdirectedFixture(t)
	p := strconv.Itoa(int(f.port))
	f.chains = append(f.chains, passChain(t, "tls/"+p+"/held", "BlackHoleCluster", "held.wildcard.org"))
	f.push()
	for _, h2 := range []bool{false, true} {
		c, _ := f.tlsClient("x.wildcard.org", h2)
		for host, want := range map[string]int{"held.wildcard.org": 421, "HELD.wildcard.org:443": 421, "other.wildcard.org": 200} {
			if resp := gwGet(t, c, "https", f.port, host, nil); resp.StatusCode != want {
				t.Errorf("h2 %v, Host %s on the wildcard's connection: %d %q, want %d", h2, host, resp.StatusCode, resp.body, want)
			}
		}
	}
}
