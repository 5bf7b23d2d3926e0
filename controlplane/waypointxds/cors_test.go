package waypointxds

import (
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/waypoint/route"
)

// compiledCORS is what the waypoint makes of the CorsPolicy of f.
func compiledCORS(t testing.TB, f *gwv1.HTTPCORSFilter) *route.CORS {
	t.Helper()
	rc := &routev3.RouteConfiguration{Name: "rc", VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{{
		Name: "r", Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action:               &routev3.Route_Route{Route: defaultAction("c")},
		TypedPerFilterConfig: corsConfig(f),
	}}}}}
	tb, err := route.Compile(rc)
	if err != nil {
		t.Fatal(err)
	}
	return tb.Routes[0].CORS
}

func origins(o ...string) []gwv1.CORSOrigin {
	out := make([]gwv1.CORSOrigin, len(o))
	for i, s := range o {
		out[i] = gwv1.CORSOrigin(s)
	}
	return out
}

// TestCORSOrigins checks Gateway API's origin matching as the waypoint
// runs it: exact origins with the scheme's default port, a "*" in the host
// standing for labels to its left only, "*" for any http(s) origin but
// not "null", case ignored; and what is no origin at all.
func TestCORSOrigins(t *testing.T) {
	listed := compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins("https://www.foo.com", "https://*.example.com", "http://local.test:8080")})
	httpAny := compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins("http://*")})
	any := compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins("*")})
	for _, tc := range []struct {
		c      *route.CORS
		origin []string
		want   bool
	}{
		{listed, []string{"https://www.foo.com"}, true},
		{listed, []string{"HTTPS://WWW.FOO.COM"}, true},
		{listed, []string{"https://www.foo.com:443"}, true},
		{listed, []string{"https://www.foo.com:8443"}, false},
		{listed, []string{"http://www.foo.com"}, false},
		{listed, []string{"https://www.foo.com.evil.io"}, false},
		{listed, []string{"https://www.foo.com/"}, false},
		{listed, []string{"https://www.foo.comx"}, false},
		{listed, []string{"https://wwwxfoo.com"}, false}, // a dot is not any character
		{listed, []string{"https://a.example.com"}, true},
		{listed, []string{"https://a.b.c.example.com"}, true},
		{listed, []string{"https://example.com"}, false},
		{listed, []string{"https://.example.com"}, false},
		{listed, []string{"https://evil-example.com"}, false},
		{listed, []string{"https://evil.com/.example.com"}, false},
		{listed, []string{"https://evil.com?.example.com"}, false},
		{listed, []string{"https://user@a.example.com"}, false},
		{listed, []string{"https://a.example.com.evil.io"}, false},
		{listed, []string{"http://local.test:8080"}, true},
		{listed, []string{"http://local.test"}, false},
		{httpAny, []string{"http://anything.at.all"}, true},
		{httpAny, []string{"http://anything.at.all:80"}, true},
		{httpAny, []string{"http://anything.at.all:81"}, false},
		{httpAny, []string{"https://anything.at.all"}, false},
		{listed, []string{"null"}, false},
		{listed, []string{""}, false},
		// One origin only: a repeated field or a list is none.
		{listed, []string{"https://www.foo.com", "https://www.foo.com"}, false},
		{listed, []string{"https://www.foo.com, https://a.example.com"}, false},
		{listed, []string{"https://www.foo.com "}, false},
		{listed, nil, false},
		{listed, []string{"https://" + strings.Repeat("a.", 1<<15) + "example.com"}, false},
		{any, []string{"https://foobar.com:12345"}, true},
		{any, []string{"http://[::1]:8080"}, true},
		{any, []string{"null"}, false},
		{any, []string{"file://"}, false},
		{any, []string{"https://a.com/path"}, false},
		{any, []string{"javascript:alert(1)"}, false},
	} {
		h := http.Header{}
		for _, o := range tc.origin {
			h.Add("Origin", o)
		}
		o, ok := tc.c.Origin(h)
		if ok != tc.want {
			t.Errorf("origin %.80q allowed = %v, want %v", tc.origin, ok, tc.want)
		}
		if ok && o != tc.origin[0] {
			t.Errorf("origin %q: got %q, want it echoed", tc.origin, o)
		}
	}
}

// TestCORSPolicy checks the translation of the filter's other fields.
func TestCORSPolicy(t *testing.T) {
	yes := true
	c := compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins("*"), AllowCredentials: &yes,
		AllowMethods: []gwv1.HTTPMethodWithWildcard{"GET", "OPTIONS"}, AllowHeaders: []gwv1.HTTPHeaderName{"x-a", "X-B"},
		ExposeHeaders: []gwv1.HTTPHeaderName{"x-c"}, MaxAge: 3600})
	want := route.CORS{AllowMethods: "GET, OPTIONS", AllowHeaders: "x-a, X-B", ExposeHeaders: "x-c", MaxAge: "3600", Credentials: true}
	if diff := cmp.Diff(want, *c, cmpopts.IgnoreFields(route.CORS{}, "Origins")); diff != "" {
		t.Errorf("policy (-want +got):\n%s", diff)
	}
	d := compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins("https://a.com")})
	if d.MaxAge != "5" || d.Credentials || d.ForwardUnmatched {
		t.Errorf("defaults: got max age %q, credentials %v, forward unmatched %v; want 5, false, false", d.MaxAge, d.Credentials, d.ForwardUnmatched)
	}
}

// originPattern is the CRD's validation of a CORSOrigin.
var originPattern = regexp.MustCompile(`(^\*$)|(^(http(s)?):\/\/(((\*\.)?([a-zA-Z0-9\-]+\.)*[a-zA-Z0-9-]+|\*)(:([0-9]{1,5}))?)$)`)

// FuzzOriginMatcher: whatever valid allowOrigins entry, its pattern
// compiles in the waypoint, and what it allows is one serialized http(s)
// origin: no path, user, query, list or space.
func FuzzOriginMatcher(f *testing.F) {
	for _, s := range []string{"https://*.example.com|https://a.example.com", "*|http://[::1]:80", "http://a.b:8080|http://a.b:8080", "https://x|https://x:443"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		pattern, origin, _ := strings.Cut(in, "|")
		if !originPattern.MatchString(pattern) || len(pattern) > 253 {
			return
		}
		c := compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins(pattern)})
		got, ok := c.Origin(http.Header{"Origin": {origin}})
		if !ok {
			return
		}
		scheme, rest, found := strings.Cut(strings.ToLower(got), "://")
		if !found || (scheme != "http" && scheme != "https") || rest == "" || strings.ContainsAny(rest, "/?#@,; \t\r\n\\") {
			t.Errorf("pattern %q allows %q, which is not an origin", pattern, origin)
		}
		if !strings.Contains(pattern, "*") && !strings.EqualFold(strings.TrimSuffix(strings.TrimSuffix(got, ":443"), ":80"), pattern) {
			t.Errorf("pattern %q allows %q, another origin", pattern, origin)
		}
	})
}

// TestCORSConformanceCases runs the Gateway API conformance suite's
// HTTPRouteCORS cases (a Gateway test, which the Mesh profile does not
// run) against the translation of its routes, as the waypoint answers
// them: the header values the suite accepts, whitespace ignored.
func TestCORSConformanceCases(t *testing.T) {
	yes, no := true, false
	routes := map[string]*route.CORS{
		"/cors-1": compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins("https://www.foo.com", "https://*.bar.com"),
			AllowMethods: []gwv1.HTTPMethodWithWildcard{"GET", "OPTIONS"}, AllowHeaders: []gwv1.HTTPHeaderName{"x-header-1", "x-header-2"},
			ExposeHeaders: []gwv1.HTTPHeaderName{"x-header-3", "x-header-4"}, AllowCredentials: &yes, MaxAge: 3600}),
		"/cors-2":               compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins("https://www.foo.com"), AllowMethods: []gwv1.HTTPMethodWithWildcard{"*"}}),
		"/cors-wildcard-origin": compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins("*"), AllowMethods: []gwv1.HTTPMethodWithWildcard{"PUT"}, AllowCredentials: &no}),
		"/cors-wildcard-methods-headers": compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins("*"), AllowMethods: []gwv1.HTTPMethodWithWildcard{"*"},
			AllowHeaders: []gwv1.HTTPHeaderName{"*"}, AllowCredentials: &yes}),
		"/cors-wildcard-methods-headers-unauth": compiledCORS(t, &gwv1.HTTPCORSFilter{AllowOrigins: origins("*"), AllowMethods: []gwv1.HTTPMethodWithWildcard{"*"},
			AllowHeaders: []gwv1.HTTPHeaderName{"*"}, AllowCredentials: &no}),
	}
	const acrm, acrh = "Access-Control-Request-Method", "Access-Control-Request-Headers"
	for _, tc := range []struct {
		path, method string
		req          map[string]string
		valid        map[string][]string
		absent       []string
	}{
		{"/cors-1", "OPTIONS", map[string]string{"Origin": "https://www.foo.com", acrm: "GET", acrh: "x-header-1, x-header-2"},
			map[string][]string{"access-control-allow-origin": {"https://www.foo.com"}, "access-control-allow-methods": {"GET,OPTIONS", "OPTIONS,GET"},
				"access-control-allow-headers": {"x-header-1,x-header-2", "x-header-2,x-header-1"}, "access-control-expose-headers": {"x-header-3,x-header-4", "x-header-4,x-header-3"},
				"access-control-max-age": {"3600"}, "access-control-allow-credentials": {"true"}}, nil},
		{"/cors-1", "OPTIONS", map[string]string{"Origin": "https://www.bar.com", acrm: "GET", acrh: "x-header-1, x-header-2"},
			map[string][]string{"access-control-allow-origin": {"https://www.bar.com"}, "access-control-max-age": {"3600"}}, nil},
		{"/cors-1", "OPTIONS", map[string]string{"Origin": "https://xpto.www.bar.com", acrm: "GET", acrh: "x-header-1, x-header-2"},
			map[string][]string{"access-control-allow-origin": {"https://xpto.www.bar.com"}}, nil},
		{"/cors-1", "OPTIONS", map[string]string{"Origin": "https://foobar.com", acrm: "GET"}, nil, []string{"access-control-allow-origin"}},
		{"/cors-1", "GET", map[string]string{"Origin": "https://www.foo.com", acrm: "GET", acrh: "x-header-1, x-header-2"},
			map[string][]string{"access-control-allow-origin": {"https://www.foo.com"}}, nil},
		{"/cors-1", "GET", map[string]string{"Origin": "https://www.bar.com"}, map[string][]string{"access-control-allow-origin": {"https://www.bar.com"}}, nil},
		{"/cors-1", "GET", map[string]string{"Origin": "https://foobar.com", acrm: "GET"}, nil, []string{"access-control-allow-origin"}},
		{"/cors-2", "OPTIONS", map[string]string{"Origin": "https://www.foo.com", acrm: "POST"},
			map[string][]string{"access-control-allow-methods": {"POST", "*"}, "access-control-allow-origin": {"https://www.foo.com"}},
			[]string{"access-control-allow-credentials"}},
		{"/cors-wildcard-origin", "OPTIONS", map[string]string{"Origin": "https://foobar.com", acrm: "PUT"},
			map[string][]string{"access-control-allow-origin": {"https://foobar.com", "*"}, "access-control-allow-methods": {"PUT"}},
			[]string{"access-control-allow-credentials"}},
		{"/cors-wildcard-origin", "OPTIONS", map[string]string{"Origin": "https://foobar.com:12345", acrm: "PUT"},
			map[string][]string{"access-control-allow-origin": {"https://foobar.com:12345", "*"}, "access-control-allow-methods": {"PUT"}},
			[]string{"access-control-allow-credentials"}},
		{"/cors-wildcard-origin", "PUT", map[string]string{"Origin": "https://foobar.com:12345"},
			map[string][]string{"access-control-allow-origin": {"https://foobar.com:12345", "*"}}, []string{"access-control-allow-credentials"}},
		{"/cors-wildcard-origin", "PUT", map[string]string{"Origin": "https://foobar.com"},
			map[string][]string{"access-control-allow-origin": {"https://foobar.com", "*"}}, []string{"access-control-allow-credentials"}},
		{"/cors-wildcard-methods-headers", "OPTIONS", map[string]string{"Origin": "https://foobar.com", acrm: "PUT", acrh: "x-header-1, x-header-2"},
			map[string][]string{"access-control-allow-methods": {"PUT"}, "access-control-allow-headers": {"x-header-1,x-header-2", "x-header-2,x-header-1"},
				"access-control-allow-credentials": {"true"}, "access-control-allow-origin": {"https://foobar.com"}}, nil},
		{"/cors-wildcard-methods-headers-unauth", "OPTIONS", map[string]string{"Origin": "https://foobar.com", acrm: "PUT", acrh: "x-header-1, x-header-2"},
			map[string][]string{"access-control-allow-methods": {"PUT", "*"}, "access-control-allow-headers": {"x-header-1,x-header-2", "x-header-2,x-header-1", "*"}},
			[]string{"access-control-allow-credentials"}},
		{"/cors-wildcard-methods-headers", "GET", map[string]string{"Origin": "https://foobar.com"},
			map[string][]string{"access-control-allow-credentials": {"true"}}, nil},
		{"/cors-wildcard-methods-headers-unauth", "GET", map[string]string{"Origin": "https://foobar.com"}, nil, []string{"access-control-allow-credentials"}},
	} {
		c := routes[tc.path]
		r := &http.Request{Method: tc.method, Header: http.Header{}}
		for k, v := range tc.req {
			r.Header.Set(k, v)
		}
		h := http.Header{}
		if route.IsPreflight(r) {
			if !c.Preflight(r.Header, h) && c.ForwardUnmatched {
				t.Errorf("%s %s %v: an unmatched preflight would reach the backend", tc.method, tc.path, tc.req)
			}
		} else {
			c.Actual(r.Header, h)
		}
		for k, valid := range tc.valid {
			got := strings.ReplaceAll(h.Get(k), " ", "")
			if !slices.Contains(valid, got) {
				t.Errorf("%s %s %v: %s = %q, want one of %q", tc.method, tc.path, tc.req, k, got, valid)
			}
		}
		for _, k := range tc.absent {
			if v := h.Values(k); v != nil {
				t.Errorf("%s %s %v: %s = %q, want none", tc.method, tc.path, tc.req, k, v)
			}
		}
	}
}
