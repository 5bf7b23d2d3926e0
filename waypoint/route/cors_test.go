package route

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func compileWithPolicy(t testing.TB, key string, a *anypb.Any) (*Route, error) {
	t.Helper()
	r := rt("r", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}})
	r.TypedPerFilterConfig = map[string]*anypb.Any{key: a}
	tb, err := Compile(&routev3.RouteConfiguration{Name: "rc", VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{r}}}})
	if err != nil {
		return nil, err
	}
	return tb.VirtualHosts[0].Routes[0], nil
}

func anyOf(t testing.TB, p *corsv3.CorsPolicy) *anypb.Any {
	a, err := anypb.New(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func originRE(re string) []*matcherv3.StringMatcher {
	return []*matcherv3.StringMatcher{{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}}}
}

// TestCompileCORS: the policy's supported fields compile; anything else
// of it, another filter's config, or values that would break a response
// header are refused, naming the field.
func TestCompileCORS(t *testing.T) {
	ok := &corsv3.CorsPolicy{AllowOriginStringMatch: originRE(`https://a\.com`), AllowMethods: "GET, PUT", AllowHeaders: "x-a,x-b", ExposeHeaders: "*",
		MaxAge: "60", AllowCredentials: wrapperspb.Bool(true), ForwardNotMatchingPreflights: wrapperspb.Bool(false)}
	r, err := compileWithPolicy(t, CORSFilter, anyOf(t, ok))
	if err != nil {
		t.Fatal(err)
	}
	if c := r.CORS; c == nil || len(c.Origins) != 1 || c.AllowMethods != "GET, PUT" || c.MaxAge != "60" || !c.Credentials || c.ForwardUnmatched {
		t.Errorf("compiled %+v", r.CORS)
	}
	if r, _ := compileWithPolicy(t, CORSFilter, anyOf(t, &corsv3.CorsPolicy{})); r == nil || !r.CORS.ForwardUnmatched {
		t.Error("forward_not_matching_preflights unset: want Envoy's default, true")
	}
	pct := &corev3.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{Numerator: 100}}
	for _, tc := range []struct {
		key  string
		a    *anypb.Any
		want string
	}{
		{CORSFilter, anyOf(t, &corsv3.CorsPolicy{FilterEnabled: pct}), "filter_enabled is not supported"},
		{CORSFilter, anyOf(t, &corsv3.CorsPolicy{ShadowEnabled: pct}), "shadow_enabled is not supported"},
		{CORSFilter, anyOf(t, &corsv3.CorsPolicy{AllowPrivateNetworkAccess: wrapperspb.Bool(true)}), "allow_private_network_access is not supported"},
		{"envoy.filters.http.fault", anyOf(t, &corsv3.CorsPolicy{}), "only envoy.filters.http.cors is supported"},
		{CORSFilter, func() *anypb.Any { a, _ := anypb.New(&corsv3.Cors{}); return a }(), "is not a CorsPolicy"},
		{CORSFilter, anyOf(t, &corsv3.CorsPolicy{MaxAge: "-1"}), "max_age"},
		{CORSFilter, anyOf(t, &corsv3.CorsPolicy{MaxAge: "05"}), "max_age"},
		{CORSFilter, anyOf(t, &corsv3.CorsPolicy{MaxAge: "99999999999"}), "max_age"},
		{CORSFilter, anyOf(t, &corsv3.CorsPolicy{AllowMethods: "GET\r\nSet-Cookie: x"}), "allow_methods"},
		{CORSFilter, anyOf(t, &corsv3.CorsPolicy{AllowHeaders: "x-a; x-b"}), "allow_headers"},
		{CORSFilter, anyOf(t, &corsv3.CorsPolicy{ExposeHeaders: "x\x00"}), "expose_headers"},
		{CORSFilter, anyOf(t, &corsv3.CorsPolicy{AllowOriginStringMatch: originRE(`(`)}), "allow_origin_string_match[0]"},
	} {
		if _, err := compileWithPolicy(t, tc.key, tc.a); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s: error %v, want one naming %q", tc.key, tc.a.GetTypeUrl(), err, tc.want)
		}
	}
}

// TestCORSHeaders checks the answers against the conformance suite's
// wire values, and what is left out.
func TestCORSHeaders(t *testing.T) {
	c := &CORS{AllowMethods: "GET, OPTIONS", AllowHeaders: "x-header-1, x-header-2", ExposeHeaders: "x-header-3, x-header-4", MaxAge: "3600", Credentials: true}
	c.Origins = []*StringMatcher{{Regex: mustRE(`(?i)https://www\.foo\.com`)}}
	req := http.Header{"Origin": {"https://www.foo.com"}, "Access-Control-Request-Method": {"GET"}, "Access-Control-Request-Headers": {"x-header-1, x-header-2"}}
	h := http.Header{}
	if !c.Preflight(req, h) {
		t.Fatal("origin not allowed")
	}
	want := http.Header{"Access-Control-Allow-Origin": {"https://www.foo.com"}, "Access-Control-Allow-Credentials": {"true"},
		"Access-Control-Allow-Methods": {"GET, OPTIONS"}, "Access-Control-Allow-Headers": {"x-header-1, x-header-2"},
		"Access-Control-Expose-Headers": {"x-header-3, x-header-4"}, "Access-Control-Max-Age": {"3600"}, "Vary": {"Origin"}}
	for k := range want {
		if h.Get(k) != want.Get(k) {
			t.Errorf("%s = %q, want %q", k, h.Get(k), want.Get(k))
		}
	}
	// Without credentials, no Allow-Credentials; no Vary added twice.
	c.Credentials = false
	h = http.Header{"Vary": {"Accept-Encoding, origin"}}
	c.Actual(http.Header{"Origin": {"https://www.foo.com"}}, h)
	if h.Get("Access-Control-Allow-Credentials") != "" || len(h.Values("Vary")) != 1 || h.Get("Access-Control-Expose-Headers") != "x-header-3, x-header-4" {
		t.Errorf("actual without credentials: %v", h)
	}
	// A preflight without Access-Control-Request-Method is no preflight;
	// one whose origin is not allowed gets nothing.
	if IsPreflight(&http.Request{Method: "OPTIONS", Header: http.Header{"Origin": {"https://www.foo.com"}}}) {
		t.Error("OPTIONS without Access-Control-Request-Method taken for a preflight")
	}
	h = http.Header{}
	if c.Preflight(http.Header{"Origin": {"https://www.foo.com.evil"}, "Access-Control-Request-Method": {"GET"}}, h) || len(h) != 0 {
		t.Errorf("unallowed origin answered %v", h)
	}
}

func mustRE(s string) *regexp.Regexp { return regexp.MustCompile("^(?:" + s + ")$") }

// FuzzCORS: whatever the request's Origin and Access-Control-Request-*
// fields, the answer's headers are valid field values, and an echoed
// method or header list is one of tokens.
func FuzzCORS(f *testing.F) {
	f.Add("https://a.com", "GET", "x-a, x-b", false)
	f.Add("https://a.com, https://b.com", "G\x00", "", true)
	f.Add("null", "", "x-a,,x-b", true)
	f.Fuzz(func(t *testing.T, origin, method, headers string, creds bool) {
		c := &CORS{Origins: []*StringMatcher{{Regex: mustRE(`(?i)https?://[^/]*`)}}, AllowMethods: "*", AllowHeaders: "*", ExposeHeaders: "*", MaxAge: "5", Credentials: creds}
		req := http.Header{"Origin": {origin}, "Access-Control-Request-Method": {method}, "Access-Control-Request-Headers": {headers}}
		for _, h := range []http.Header{{}, {"X-Up": {"1"}}} {
			if c.Preflight(req, h) {
				c.Actual(req, h)
			}
			for k, vs := range h {
				for _, v := range vs {
					if strings.ContainsAny(v, "\r\n\x00") || len(v) > maxOrigin*8+len(k)+64 && k != "Access-Control-Allow-Origin" {
						t.Errorf("%s: %q is no field value", k, v)
					}
				}
			}
			if m := h.Get("Access-Control-Allow-Methods"); m != "" && !isToken(m) {
				t.Errorf("echoed method %q", m)
			}
			if v := h.Get("Access-Control-Allow-Headers"); v != "" && !fieldList(v) {
				t.Errorf("echoed headers %q", v)
			}
			if creds && h.Get("Access-Control-Allow-Origin") == "*" {
				t.Error("* with credentials")
			}
		}
	})
}
