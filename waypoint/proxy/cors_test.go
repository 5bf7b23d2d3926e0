package proxy

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	rbacfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// corsMesh is a waypoint whose chain has a DENY policy on /private and
// the CORS filter (the control plane's order), with routes: /cors (a
// credentialed policy for https://*.example.com), /any ("*" methods and
// headers), /forward (unmatched preflights go upstream), /private (a
// policy, but denied), /split (a backend's response header changes) and
// /plain (none). seen counts the requests the backend got.
func corsMesh(t *testing.T, withFilter bool) (m *mesh, seen *atomic.Int32) {
	m = newMesh(t)
	seen = new(atomic.Int32)
	up := backend(t, "v1", func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		w.Header().Set("Server", "up")
		w.Header().Set("Access-Control-Allow-Origin", "https://upstream.example")
		w.Header().Set("X-Own", "1")
		fmt.Fprintf(w, "%s %s", r.Method, r.URL.Path)
	})
	policy := func(p *corsv3.CorsPolicy) map[string]*anypb.Any {
		return map[string]*anypb.Any{"envoy.filters.http.cors": mustAny(t, p)}
	}
	origin := func(re string) []*matcherv3.StringMatcher {
		return []*matcherv3.StringMatcher{{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}}}
	}
	strict := &corsv3.CorsPolicy{AllowOriginStringMatch: origin(`(?i)https://[a-z0-9-]+(?:\.[a-z0-9-]+)*\.example\.com(?::443)?`),
		AllowMethods: "GET, PUT", AllowHeaders: "x-a, x-b", ExposeHeaders: "x-own", MaxAge: "3600",
		AllowCredentials: wrapperspb.Bool(true), ForwardNotMatchingPreflights: wrapperspb.Bool(false)}
	wild := &corsv3.CorsPolicy{AllowOriginStringMatch: origin(`(?i)https?://[a-z0-9.-]+(?::[0-9]+)?`), AllowMethods: "*", AllowHeaders: "*",
		ExposeHeaders: "*", AllowCredentials: wrapperspb.Bool(true), MaxAge: "5", ForwardNotMatchingPreflights: wrapperspb.Bool(false)}
	forward := &corsv3.CorsPolicy{AllowOriginStringMatch: origin(`https://a\.com`), MaxAge: "5"}
	split := &routev3.WeightedCluster{Clusters: []*routev3.WeightedCluster_ClusterWeight{{
		Name: "v1", Weight: wrapperspb.UInt32(1),
		ResponseHeadersToAdd:    []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-backend-set", Value: "v1"}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}},
		ResponseHeadersToRemove: []string{"server"},
	}}}
	routes := []*routev3.Route{
		{Name: "cors", Match: prefix("/cors"), Action: toCluster("v1"), TypedPerFilterConfig: policy(strict)},
		{Name: "any", Match: prefix("/any"), Action: toCluster("v1"), TypedPerFilterConfig: policy(wild)},
		{Name: "forward", Match: prefix("/forward"), Action: toCluster("v1"), TypedPerFilterConfig: policy(forward)},
		{Name: "private", Match: prefix("/private"), Action: toCluster("v1"), TypedPerFilterConfig: policy(strict)},
		{Name: "direct", Match: prefix("/direct"), Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 500}}, TypedPerFilterConfig: policy(strict)},
		{Name: "split", Match: prefix("/split"), Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_WeightedClusters{WeightedClusters: split}}},
			ResponseHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-route", Value: "r"}, AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}}},
		{Name: "plain", Match: prefix("/"), Action: toCluster("v1")},
	}
	deny := &rbacv3.RBAC{Action: rbacv3.RBAC_DENY, Policies: map[string]*rbacv3.Policy{"deny-private": {
		Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "/private"}}}}}}},
		Principals:  []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}},
	}}}
	filters := []*hcmv3.HttpFilter{{Name: "envoy.filters.http.rbac", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &rbacfilter.RBAC{Rules: deny})}}}
	if withFilter {
		filters = append(filters, &hcmv3.HttpFilter{Name: "envoy.filters.http.cors", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &corsv3.Cors{})}})
	}
	m.apply(routes, map[string][]netip.AddrPort{"v1": {up}}, filters...)
	return m, seen
}

func request(method, path string, hdr ...string) *http.Request {
	r := get(path)
	r.Method = method
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	return r
}

// TestCORS checks Gateway API's CORS at the waypoint: preflights answered
// without the upstream, actual responses given the Access-Control headers
// for an allowed origin only, and the AuthorizationPolicy applied to a
// preflight as to any OPTIONS request (Istio runs RBAC before CORS).
func TestCORS(t *testing.T) {
	m, seen := corsMesh(t, true)
	const (
		acao = "Access-Control-Allow-Origin"
		acac = "Access-Control-Allow-Credentials"
		acam = "Access-Control-Allow-Methods"
		acah = "Access-Control-Allow-Headers"
		aceh = "Access-Control-Expose-Headers"
		acma = "Access-Control-Max-Age"
	)
	preflight := func(path, origin, method string, more ...string) *http.Request {
		return request("OPTIONS", path, append([]string{"Origin", origin, "Access-Control-Request-Method", method}, more...)...)
	}
	huge := strings.Repeat("a", 50<<10)
	for _, tc := range []struct {
		name     string
		req      *http.Request
		code     int
		upstream bool              // the backend saw it
		want     map[string]string // "" : absent
	}{
		{"preflight", preflight("/cors/x", "https://app.example.com", "PUT", "Access-Control-Request-Headers", "x-a"), 200, false,
			map[string]string{acao: "https://app.example.com", acac: "true", acam: "GET, PUT", acah: "x-a, x-b", aceh: "x-own", acma: "3600"}},
		{"preflight for a method not allowed: the list, not the method", preflight("/cors/x", "https://app.example.com", "DELETE"), 200, false,
			map[string]string{acao: "https://app.example.com", acam: "GET, PUT"}},
		{"preflight, origin in capitals", preflight("/cors/x", "HTTPS://APP.EXAMPLE.COM", "GET"), 200, false,
			map[string]string{acao: "HTTPS://APP.EXAMPLE.COM"}},
		{"preflight, suffix-only origin", preflight("/cors/x", "https://evil-example.com", "GET"), 200, false,
			map[string]string{acao: "", acac: "", acam: "", acma: ""}},
		{"preflight, null origin", preflight("/cors/x", "null", "GET"), 200, false, map[string]string{acao: "", acam: ""}},
		{"preflight, huge origin", preflight("/cors/x", "https://"+huge+".example.com", "GET"), 200, false, map[string]string{acao: ""}},
		{"preflight, huge requested headers on *", preflight("/any", "https://a.com", "PATCH", "Access-Control-Request-Headers", huge), 200, false,
			map[string]string{acao: "https://a.com", acam: "PATCH", acah: "", aceh: ""}},
		{"preflight, bad requested method on *", preflight("/any", "https://a.com", "GET, DELETE"), 200, false, map[string]string{acao: "https://a.com", acam: ""}},
		{"preflight on * with credentials echoes", preflight("/any", "https://a.com", "PATCH", "Access-Control-Request-Headers", "x-1, x-2"), 200, false,
			map[string]string{acao: "https://a.com", acam: "PATCH", acah: "x-1, x-2", acac: "true"}},
		{"preflight, origin repeated", preflight("/cors/x", "https://app.example.com", "GET", "Origin", "https://app.example.com"), 200, false,
			map[string]string{acao: ""}},
		{"unmatched preflight forwarded", preflight("/forward", "https://b.com", "GET"), 200, true, map[string]string{acao: "https://upstream.example"}},
		{"matched preflight on a forwarding policy", preflight("/forward", "https://a.com", "GET"), 200, false, map[string]string{acao: "https://a.com"}},
		{"preflight denied by policy", preflight("/private/x", "https://app.example.com", "GET"), 403, false, map[string]string{acao: ""}},
		{"OPTIONS without the requested method is no preflight", request("OPTIONS", "/cors/x", "Origin", "https://app.example.com"), 200, true,
			map[string]string{acao: "https://app.example.com", acam: ""}},
		{"actual request", request("GET", "/cors/x", "Origin", "https://app.example.com"), 200, true,
			map[string]string{acao: "https://app.example.com", acac: "true", aceh: "x-own", acam: "", acma: "", "Vary": "Origin"}},
		{"actual request, origin not allowed", request("GET", "/cors/x", "Origin", "https://evil-example.com"), 200, true,
			map[string]string{acao: "https://upstream.example", acac: "", aceh: ""}},
		{"actual request, origin repeated", request("GET", "/cors/x", "Origin", "https://app.example.com", "Origin", "https://evil.com"), 200, true,
			map[string]string{acao: "https://upstream.example", acac: ""}},
		{"actual request, expose * with credentials names the headers", request("GET", "/any", "Origin", "https://a.com"), 200, true,
			map[string]string{acao: "https://a.com", aceh: "Content-Length, Content-Type, Date, Server, Vary, X-Own"}},
		{"direct response", request("GET", "/direct", "Origin", "https://app.example.com"), 500, false, map[string]string{acao: "https://app.example.com"}},
		{"no policy", request("GET", "/plain", "Origin", "https://app.example.com"), 200, true, map[string]string{acao: "https://upstream.example", "Vary": ""}},
		{"no policy, preflight forwarded", preflight("/plain", "https://app.example.com", "GET"), 200, true, map[string]string{acao: "https://upstream.example"}},
		{"actual request denied", request("GET", "/private/x", "Origin", "https://app.example.com"), 403, false, map[string]string{acao: ""}},
	} {
		before := seen.Load()
		r := m.do(tc.req)
		if r.StatusCode != tc.code {
			t.Errorf("%s: status %d, want %d", tc.name, r.StatusCode, tc.code)
		}
		if got := seen.Load() != before; got != tc.upstream {
			t.Errorf("%s: reached the upstream: %v, want %v", tc.name, got, tc.upstream)
		}
		for k, v := range tc.want {
			if got := strings.Join(r.Header.Values(k), ","); got != v {
				t.Errorf("%s: %s = %q, want %q", tc.name, k, got, v)
			}
		}
	}
}

// TestCORSNeedsFilter: a route's policy does nothing on a chain without
// the CORS filter, as in Envoy.
func TestCORSNeedsFilter(t *testing.T) {
	m, seen := corsMesh(t, false)
	r := m.do(request("OPTIONS", "/cors/x", "Origin", "https://app.example.com", "Access-Control-Request-Method", "GET"))
	if r.StatusCode != 200 || seen.Load() != 1 || r.Header.Get("Access-Control-Allow-Origin") != "https://upstream.example" {
		t.Errorf("preflight: %d, upstream saw %d, ACAO %q; want it forwarded untouched", r.StatusCode, seen.Load(), r.Header.Get("Access-Control-Allow-Origin"))
	}
}

// TestBackendResponseHeaders: a weighted cluster's response header
// changes apply to its responses, before the route's.
func TestBackendResponseHeaders(t *testing.T) {
	m, _ := corsMesh(t, true)
	r := m.do(get("/split"))
	if r.Header.Get("X-Backend-Set") != "v1" || r.Header.Get("Server") != "" || r.Header.Get("X-Route") != "r" {
		t.Errorf("headers %v: want X-Backend-Set v1, X-Route r, no Server", r.Header)
	}
	r = m.do(get("/plain"))
	if r.Header.Get("X-Backend-Set") != "" || r.Header.Get("Server") != "up" {
		t.Errorf("another route's response got the backend's changes: %v", r.Header)
	}
}

// TestCORSHTTP2: over HTTP/2, where field names arrive in lower case, a
// preflight is answered the same and an actual response gets its headers;
// two origin fields are still no origin.
func TestCORSHTTP2(t *testing.T) {
	m, seen := corsMesh(t, true)
	c := m.h2client(vip)
	pre := request("OPTIONS", "/cors/x", "origin", "https://app.example.com", "access-control-request-method", "PUT")
	resp, err := c.RoundTrip(pre)
	if err != nil {
		t.Fatal(err)
	}
	body(resp)
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example.com" || seen.Load() != 0 {
		t.Errorf("preflight: %d %v, upstream saw %d; want 200 from the waypoint", resp.StatusCode, resp.Header, seen.Load())
	}
	for _, tc := range []struct {
		origins []string
		want    string
	}{
		{[]string{"https://app.example.com"}, "https://app.example.com"},
		{[]string{"https://app.example.com", "https://app.example.com"}, "https://upstream.example"},
	} {
		req := get("/cors/x")
		req.Header["Origin"] = tc.origins
		resp, err := c.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		body(resp)
		if got := resp.Header.Get("Access-Control-Allow-Origin"); got != tc.want {
			t.Errorf("origins %q: Access-Control-Allow-Origin %q, want %q", tc.origins, got, tc.want)
		}
	}
}
