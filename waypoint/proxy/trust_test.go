package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/netip"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbacfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weftmesh/weft/internal/hbone"
)

// What the waypoint trusts of a request: the path only once normalized,
// the source address only from the connection, no client-sent internal
// header.

// pathModes are Istio's meshConfig.pathNormalization settings as the
// control plane writes them on the http_connection_manager.
var pathModes = map[string]func(*hcmv3.HttpConnectionManager){
	"NONE": func(m *hcmv3.HttpConnectionManager) {
		m.NormalizePath = wrapperspb.Bool(false)
		m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_KEEP_UNCHANGED
	},
	"BASE": func(m *hcmv3.HttpConnectionManager) {
		m.NormalizePath = wrapperspb.Bool(true)
		m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_KEEP_UNCHANGED
	},
	"MERGE_SLASHES": func(m *hcmv3.HttpConnectionManager) {
		m.NormalizePath = wrapperspb.Bool(true)
		m.MergeSlashes = true
		m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_KEEP_UNCHANGED
	},
	"DECODE_AND_MERGE_SLASHES": func(m *hcmv3.HttpConnectionManager) {
		m.NormalizePath = wrapperspb.Bool(true)
		m.MergeSlashes = true
		m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_UNESCAPE_AND_FORWARD
	},
}

func pathPerm(m *matcherv3.StringMatcher) *rbacv3.Permission {
	return &rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: m}}}}
}

func rbacHTTP(t testing.TB, r *rbacv3.RBAC) *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rbacfilter.RBAC{Rules: r})}}
}

var anyone = []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}}

// denyAdmin is AuthorizationPolicy DENY paths ["/admin"].
func denyAdmin(t testing.TB) *hcmv3.HttpFilter {
	return rbacHTTP(t, &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{"deny-admin": {
		Permissions: []*rbacv3.Permission{pathPerm(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "/admin"}})},
		Principals:  anyone,
	}}})
}

// allowPublic is AuthorizationPolicy ALLOW paths ["/public/*"].
func allowPublic(t testing.TB) *hcmv3.HttpFilter {
	return rbacHTTP(t, &rbacv3.RBAC{Action: rbacv3.RBAC_ALLOW, Policies: map[string]*rbacv3.Policy{"allow-public": {
		Permissions: []*rbacv3.Permission{pathPerm(&matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "/public/"}})},
		Principals:  anyone,
	}}})
}

// uriBackend answers with the request target it received.
func uriBackend(t testing.TB) netip.AddrPort {
	return backend(t, "uri", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.RequestURI) })
}

// outcome is a request's expected status and, when 200, the target the
// upstream received.
type outcome struct {
	code   int
	target string
}

func deny() outcome              { return outcome{code: 403} }
func bad() outcome               { return outcome{code: 400} }
func pass(target string) outcome { return outcome{200, target} }

// byMode gives the outcome under NONE, BASE, MERGE_SLASHES and
// DECODE_AND_MERGE_SLASHES.
type byMode [4]outcome

var modeNames = [4]string{"NONE", "BASE", "MERGE_SLASHES", "DECODE_AND_MERGE_SLASHES"}

func TestPathNormalizationPolicy(t *testing.T) {
	up := uriBackend(t)
	routes := []*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("up")}}
	tables := []struct {
		name   string
		filter func(testing.TB) *hcmv3.HttpFilter
		cases  map[string]byMode
	}{{
		name:   "deny /admin",
		filter: denyAdmin,
		cases: map[string]byMode{
			"/admin":           {deny(), deny(), deny(), deny()},
			"/admin?x=1":       {deny(), deny(), deny(), deny()},
			"/admin#frag":      {deny(), deny(), deny(), deny()},
			"/%61dmin":         {pass("/%61dmin"), deny(), deny(), deny()},
			"/%61%64%6D%69%6E": {pass("/%61%64%6D%69%6E"), deny(), deny(), deny()},
			"/./admin":         {pass("/./admin"), deny(), deny(), deny()},
			"/x/../admin":      {pass("/x/../admin"), deny(), deny(), deny()},
			"/x/%2e%2e/admin":  {pass("/x/%2e%2e/admin"), deny(), deny(), deny()},
			"/x/.%2E/admin":    {pass("/x/.%2E/admin"), deny(), deny(), deny()},
			"/../../admin":     {pass("/../../admin"), deny(), deny(), deny()},
			// NONE: net/url keeps no raw "\" in a path; policy and upstream
			// both see %5C.
			`/x\..\admin`:              {pass("/x%5C..%5Cadmin"), deny(), deny(), deny()},
			"//admin":                  {pass("//admin"), pass("//admin"), deny(), deny()},
			"/x/..//admin":             {pass("/x/..//admin"), pass("//admin"), deny(), deny()},
			"/%2fadmin":                {pass("/%2fadmin"), pass("/%2Fadmin"), pass("/%2Fadmin"), deny()},
			"/x%2F..%2Fadmin":          {pass("/x%2F..%2Fadmin"), pass("/x%2F..%2Fadmin"), pass("/x%2F..%2Fadmin"), deny()},
			"/x%5C..%5Cadmin":          {pass("/x%5C..%5Cadmin"), pass("/x%5C..%5Cadmin"), pass("/x%5C..%5Cadmin"), deny()},
			"/ADMIN%2F..":              {pass("/ADMIN%2F.."), pass("/ADMIN%2F.."), pass("/ADMIN%2F.."), pass("/")},
			"/admin/":                  {pass("/admin/"), pass("/admin/"), pass("/admin/"), pass("/admin/")},
			"/%00admin":                {pass("/%00admin"), bad(), bad(), bad()},
			"/a/../b?q=/../c%2F&d=%61": {pass("/a/../b?q=/../c%2F&d=%61"), pass("/b?q=/../c%2F&d=%61"), pass("/b?q=/../c%2F&d=%61"), pass("/b?q=/../c%2F&d=%61")},
			"/caf%c3%a9/%7euser":       {pass("/caf%c3%a9/%7euser"), pass("/caf%C3%A9/~user"), pass("/caf%C3%A9/~user"), pass("/caf%C3%A9/~user")},
		},
	}, {
		name:   "allow /public/*",
		filter: allowPublic,
		cases: map[string]byMode{
			"/public/x":             {pass("/public/x"), pass("/public/x"), pass("/public/x"), pass("/public/x")},
			"/public/../secret":     {pass("/public/../secret"), deny(), deny(), deny()},
			"/public/%2e%2e/secret": {pass("/public/%2e%2e/secret"), deny(), deny(), deny()},
			"/public/./x":           {pass("/public/./x"), pass("/public/x"), pass("/public/x"), pass("/public/x")},
			"/public//x":            {pass("/public//x"), pass("/public//x"), pass("/public/x"), pass("/public/x")},
			"/public%2fx":           {deny(), deny(), deny(), pass("/public/x")},
			"/secret":               {deny(), deny(), deny(), deny()},
		},
	}}
	for i, mode := range modeNames {
		t.Run(mode, func(t *testing.T) {
			m := newMesh(t)
			m.hcm = pathModes[mode]
			for _, tb := range tables {
				m.apply(routes, map[string][]netip.AddrPort{"up": {up}}, tb.filter(t))
				for target, want := range tb.cases {
					c := m.raw(t)
					c.send("GET " + target + " HTTP/1.1\r\nHost: " + svcHost + "\r\nConnection: close\r\n\r\n")
					resp, got := c.response("GET")
					w := want[i]
					if resp.StatusCode != w.code || w.code == 200 && got != w.target {
						t.Errorf("%s: GET %s: got %d %q, want %d %q", tb.name, target, resp.StatusCode, got, w.code, w.target)
					}
				}
			}
		})
	}
}

// TestPathNormalizationHTTP2: an HTTP/2 request's :path is normalized the
// same way before policy and routing.
func TestPathNormalizationHTTP2(t *testing.T) {
	up := uriBackend(t)
	m := newMesh(t)
	m.hcm = pathModes["BASE"]
	m.apply([]*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("up")}}, map[string][]netip.AddrPort{"up": {up}}, denyAdmin(t))
	cc := m.h2client(vip)
	for target, want := range map[string]outcome{
		"/%61dmin":    deny(),
		"/x/../admin": deny(),
		"/%00":        bad(),
		"/a/./b/../c": pass("/a/c"),
	} {
		req, _ := http.NewRequest("GET", "http://"+svcHost+"/", nil)
		req.URL.Opaque = target // sent as the :path as written
		resp, err := cc.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want.code || want.code == 200 && string(b) != want.target {
			t.Errorf("GET %s over HTTP/2: got %d %q, want %d %q", target, resp.StatusCode, b, want.code, want.target)
		}
	}
}

// ipPrincipal is an ipBlocks (direct) or remoteIpBlocks source.
func ipPrincipal(prefix string, direct bool) *rbacv3.Principal {
	p := netip.MustParsePrefix(prefix)
	c := &corev3.CidrRange{AddressPrefix: p.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(p.Bits()))}
	if direct {
		return &rbacv3.Principal{Identifier: &rbacv3.Principal_DirectRemoteIp{DirectRemoteIp: c}}
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_RemoteIp{RemoteIp: c}}
}

// TestSourceIPFromConnection: the source address that IP policy sees is the
// connection's peer; the CONNECT's Forwarded header and the request's
// X-Forwarded-For, X-Real-IP or X-Envoy-External-Address, which any holder
// of a mesh certificate writes, decide nothing.
func TestSourceIPFromConnection(t *testing.T) {
	up := uriBackend(t)
	routes := []*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("up")}}
	const allowed = "10.1.2.3"
	spoof := http.Header{
		"X-Forwarded-For":          {allowed},
		"X-Real-Ip":                {allowed},
		"X-Envoy-External-Address": {allowed},
	}
	for _, tc := range []struct {
		name      string
		action    rbacv3.RBAC_Action
		principal *rbacv3.Principal
		forwarded string
		want      int
	}{
		{"ipBlocks ALLOW, Forwarded for= an allowed IP", rbacv3.RBAC_ALLOW, ipPrincipal(allowed+"/32", true), `for="` + allowed + `:4000"`, 403},
		{"remoteIpBlocks ALLOW, Forwarded for= an allowed IP", rbacv3.RBAC_ALLOW, ipPrincipal(allowed+"/32", false), `for="` + allowed + `:4000"`, 403},
		{"remoteIpBlocks ALLOW, X-Forwarded-For an allowed IP", rbacv3.RBAC_ALLOW, ipPrincipal(allowed+"/32", false), "", 403},
		{"ipBlocks DENY of the peer, Forwarded for= another IP", rbacv3.RBAC_DENY, ipPrincipal("127.0.0.1/32", true), `for="` + allowed + `:4000"`, 403},
		{"remoteIpBlocks DENY of the peer, Forwarded for= another IP", rbacv3.RBAC_DENY, ipPrincipal("127.0.0.1/32", false), `for="` + allowed + `:4000"`, 403},
		{"ipBlocks ALLOW of the peer, Forwarded for= another IP", rbacv3.RBAC_ALLOW, ipPrincipal("127.0.0.0/8", true), `for="` + allowed + `:4000"`, 200},
		{"remoteIpBlocks ALLOW of the peer, X-Forwarded-For another IP", rbacv3.RBAC_ALLOW, ipPrincipal("127.0.0.0/8", false), "", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMesh(t)
			m.apply(routes, map[string][]netip.AddrPort{"up": {up}}, rbacHTTP(t, &rbacv3.RBAC{Action: tc.action, Policies: map[string]*rbacv3.Policy{"ip": {
				Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}},
				Principals:  []*rbacv3.Principal{tc.principal},
			}}}))
			h := http.Header{}
			if tc.forwarded != "" {
				h.Set(hbone.HeaderForwarded, tc.forwarded)
			}
			c, err := m.client.Dial(context.Background(), hbone.Target{Source: m.src, Peers: []spiffeid.ID{m.wpID}, Addr: m.wpAddr, Authority: vip.String(), Header: h})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			d := &downstream{t: t, c: c, br: bufio.NewReader(c)}
			req := get("/")
			for k, vs := range spoof {
				req.Header[k] = vs
			}
			if r := d.do(req); r.StatusCode != tc.want {
				t.Errorf("got %d %q, want %d", r.StatusCode, body(r), tc.want)
			}
		})
	}
}

// TestClientInternalHeadersStripped: a client's x-forwarded-client-cert
// and x-envoy-* headers neither reach the upstream nor satisfy a policy.
func TestClientInternalHeadersStripped(t *testing.T) {
	seen := make(chan http.Header, 4)
	up := backend(t, "hdr", func(w http.ResponseWriter, r *http.Request) { seen <- r.Header.Clone() })
	routes := []*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("up")}}
	const xfcc = `By=spiffe://cluster.local/ns/demo/sa/echo;URI=spiffe://cluster.local/ns/admin/sa/root`
	hdrs := []string{"X-Forwarded-Client-Cert", xfcc, "X-Envoy-Original-Path", "/public", "X-Envoy-Internal", "true", "X-Envoy-Upstream-Rq-Timeout-Ms", "1", "X-Kept", "yes"}

	m := newMesh(t)
	m.apply(routes, map[string][]netip.AddrPort{"up": {up}})
	if r := m.do(get("/", hdrs...)); r.StatusCode != 200 {
		t.Fatalf("got %d %q", r.StatusCode, body(r))
	}
	h := <-seen
	for _, k := range []string{"X-Forwarded-Client-Cert", "X-Envoy-Original-Path", "X-Envoy-Internal", "X-Envoy-Upstream-Rq-Timeout-Ms"} {
		if v, ok := h[k]; ok {
			t.Errorf("the upstream received the client's %s: %q", k, v)
		}
	}
	if h.Get("X-Kept") != "yes" {
		t.Errorf("an ordinary header was lost: %v", h)
	}

	// A policy on the header sees the request as the upstream would.
	m.apply(routes, map[string][]netip.AddrPort{"up": {up}}, rbacHTTP(t, &rbacv3.RBAC{Action: rbacv3.RBAC_ALLOW, Policies: map[string]*rbacv3.Policy{"xfcc": {
		Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Header{Header: &routev3.HeaderMatcher{Name: "x-forwarded-client-cert",
			HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Contains{Contains: "/ns/admin/"}}}}}}},
		Principals: anyone,
	}}}))
	if r := m.do(get("/", hdrs...)); r.StatusCode != 403 {
		t.Errorf("a policy matched the client's x-forwarded-client-cert: got %d, want 403", r.StatusCode)
	}
}

// TestPathNormalizationForms: an absolute-form target is normalized like
// an origin-form one; REJECT_REQUEST refuses an escaped slash and
// UNESCAPE_AND_REDIRECT sends the client to the decoded path.
func TestPathNormalizationForms(t *testing.T) {
	up := uriBackend(t)
	routes := []*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("up")}}
	for _, tc := range []struct {
		mode     func(*hcmv3.HttpConnectionManager)
		target   string
		code     int
		got, loc string
	}{
		{pathModes["BASE"], "http://" + svcHost + "/%61dmin", 403, "", ""},
		{pathModes["BASE"], "http://" + svcHost + "/x/../admin?q=1", 403, "", ""},
		{pathModes["BASE"], "http://" + svcHost + "/x/./y/%2e%2e/z?q=/../", 200, "/x/z?q=/../", ""},
		{pathModes["BASE"], "http://" + svcHost, 200, "/", ""},
		{pathModes["BASE"], "http://" + svcHost + "?a=b", 200, "/?a=b", ""},
		{pathModes["MERGE_SLASHES"], "http://" + svcHost + "//admin#x", 403, "", ""},
		{func(m *hcmv3.HttpConnectionManager) {
			m.NormalizePath = wrapperspb.Bool(true)
			m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_REJECT_REQUEST
		}, "/a%2fb", 400, "", ""},
		{func(m *hcmv3.HttpConnectionManager) {
			m.NormalizePath = wrapperspb.Bool(true)
			m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_REJECT_REQUEST
		}, "/a%252fb", 200, "/a%252fb", ""},
		{func(m *hcmv3.HttpConnectionManager) {
			m.NormalizePath, m.MergeSlashes = wrapperspb.Bool(true), true
			m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT
		}, "/x%2F..%2Fadmin?q=%2F", 307, "", "/admin?q=%2F"},
		{func(m *hcmv3.HttpConnectionManager) {
			m.NormalizePath, m.MergeSlashes = wrapperspb.Bool(true), true
			m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT
		}, "/x/../public", 200, "/public", ""},
	} {
		m := newMesh(t)
		m.hcm = tc.mode
		m.apply(routes, map[string][]netip.AddrPort{"up": {up}}, denyAdmin(t))
		c := m.raw(t)
		c.send("GET " + tc.target + " HTTP/1.1\r\nHost: " + svcHost + "\r\nConnection: close\r\n\r\n")
		resp, got := c.response("GET")
		if resp.StatusCode != tc.code || tc.code == 200 && got != tc.got || resp.Header.Get("Location") != tc.loc {
			t.Errorf("GET %s: got %d %q Location %q, want %d %q Location %q", tc.target, resp.StatusCode, got, resp.Header.Get("Location"), tc.code, tc.got, tc.loc)
		}
	}
}

// TestNonHTTPBytesDoNotPassHTTPPolicy: bytes the waypoint does not take
// for HTTP (here a lower-case method, which applications' servers accept)
// are not relayed past a chain's HTTP policy to the Service.
func TestNonHTTPBytesDoNotPassHTTPPolicy(t *testing.T) {
	up := uriBackend(t)
	m := newMesh(t)
	m.hcm = pathModes["BASE"]
	fallback := "outbound|80||" + svcHost
	routes := []*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster(fallback)}}
	for _, f := range []*hcmv3.HttpFilter{denyAdmin(t), allowPublic(t)} {
		m.apply(routes, map[string][]netip.AddrPort{fallback: {up}}, f)
		c := m.raw(t)
		c.send("get /admin HTTP/1.1\r\nHost: " + svcHost + "\r\nConnection: close\r\n\r\n")
		// A lower-case method is HTTP: the policy answers it (403 from the
		// DENY, or from the ALLOW that names only /public). What must never
		// come back is the backend's answer.
		if resp, err := http.ReadResponse(c.br, &http.Request{Method: "GET"}); err == nil {
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s: a lower-case request for /admin got through: %d %q", f.GetName(), resp.StatusCode, b)
			}
		}
	}
}
