package route

import (
	"math"
	"net/http"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func rt(name string, m *routev3.RouteMatch) *routev3.Route {
	return &routev3.Route{Name: name, Match: m, Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: name}}}}
}

func exact(v string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v}}
}

func table(t *testing.T) *Table {
	// Gateway API precedence, already ordered: exact path, longest prefix, method, header, query, catch-all.
	rc := &routev3.RouteConfiguration{Name: "svc:80", VirtualHosts: []*routev3.VirtualHost{{Name: "svc:80", Domains: []string{"*"}, Routes: []*routev3.Route{
		rt("exact", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Path{Path: "/api/v1"}}),
		rt("long-prefix", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/api/v1"}}),
		rt("post", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/api"},
			Headers: []*routev3.HeaderMatcher{{Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: exact("POST")}}}}),
		rt("header", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/api"},
			Headers: []*routev3.HeaderMatcher{{Name: "x-canary", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: exact("yes")}}}}),
		rt("query", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: "/api"},
			QueryParameters: []*routev3.QueryParameterMatcher{{Name: "v", QueryParameterMatchSpecifier: &routev3.QueryParameterMatcher_StringMatch{StringMatch: exact("2")}}}}),
		rt("regex-ci", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "/img/[0-9]+"}}}),
		rt("ci", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/CASE"}, CaseSensitive: wrapperspb.Bool(false)}),
		rt("all", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}),
	}}}}
	tb, err := Compile(rc)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestMatchPrecedence(t *testing.T) {
	tb := table(t)
	for _, tc := range []struct {
		method, path string
		hdr          http.Header
		want         string
	}{
		{"GET", "/api/v1", nil, "exact"},
		{"GET", "/api/v1/x", nil, "long-prefix"},
		{"GET", "/api/v10", nil, "all"},
		{"POST", "/api/x", nil, "post"},
		{"GET", "/api/x", http.Header{"X-Canary": {"yes"}}, "header"},
		{"GET", "/api/x", http.Header{"X-Canary": {"no"}}, "all"},
		{"GET", "/api/x?v=2", nil, "query"},
		{"GET", "/img/42", nil, "regex-ci"},
		{"GET", "/img/42x", nil, "all"},
		{"GET", "/case/a", nil, "ci"},
		{"GET", "/", nil, "all"},
	} {
		h := tc.hdr
		if h == nil {
			h = http.Header{}
		}
		r := tb.Match(&Request{Method: tc.method, Path: tc.path, Header: h})
		if r == nil || r.Name != tc.want {
			t.Errorf("%s %s %v: got %v, want %s", tc.method, tc.path, tc.hdr, r, tc.want)
		}
	}
}

func TestRejectsUnsupported(t *testing.T) {
	r := rt("x", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}})
	r.GetRoute().HashPolicy = []*routev3.RouteAction_HashPolicy{{}}
	_, err := Compile(&routev3.RouteConfiguration{Name: "echo:80", VirtualHosts: []*routev3.VirtualHost{{Domains: []string{"*"}, Routes: []*routev3.Route{rt("ok", r.Match), r}}}})
	if err == nil || err.Error() != `route "echo:80": route[1].route.hash_policy is not supported` {
		t.Fatalf("got %v", err)
	}
}

func TestRewrite(t *testing.T) {
	p := "/new"
	r := &Route{PathKind: PathSeparatedPrefix, Path: "/old", PrefixRewrite: &p}
	if got := r.RewritePath("/old/x"); got != "/new/x" {
		t.Fatal(got)
	}
	s := "/"
	r.PrefixRewrite = &s
	if got := r.RewritePath("/old/x"); got != "/x" {
		t.Fatal(got)
	}
}

func FuzzMatch(f *testing.F) {
	b, _ := proto.Marshal(&routev3.RouteConfiguration{Name: "a", VirtualHosts: []*routev3.VirtualHost{{Domains: []string{"*"}, Routes: []*routev3.Route{rt("x", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}})}}}})
	f.Add(b, "GET", "/a?b=c", "x-canary", "yes")
	f.Fuzz(func(t *testing.T, cfg []byte, method, path, hk, hv string) {
		var rc routev3.RouteConfiguration
		if proto.Unmarshal(cfg, &rc) != nil {
			return
		}
		tb, err := Compile(&rc)
		if err != nil {
			return
		}
		tb.Match(&Request{Method: method, Path: path, Header: http.Header{http.CanonicalHeaderKey(hk): {hv}}})
	})
}

// TestWeightsBounded: weighted clusters whose weights add up past 2^32 are
// refused with the total named, never wrapped into a skewed split; up to
// 2^32 they compile with the exact total.
func TestWeightsBounded(t *testing.T) {
	split := func(weights ...uint32) *routev3.RouteConfiguration {
		r := rt("split", &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}})
		wc := &routev3.WeightedCluster{}
		for i, w := range weights {
			wc.Clusters = append(wc.Clusters, &routev3.WeightedCluster_ClusterWeight{Name: string(rune('a' + i)), Weight: wrapperspb.UInt32(w)})
		}
		r.GetRoute().ClusterSpecifier = &routev3.RouteAction_WeightedClusters{WeightedClusters: wc}
		return &routev3.RouteConfiguration{Name: "echo:80", VirtualHosts: []*routev3.VirtualHost{{Domains: []string{"*"}, Routes: []*routev3.Route{r}}}}
	}
	_, err := Compile(split(math.MaxUint32, 1))
	if want := "the weights add up to 4294967296, more than 4294967295"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("weights 2^32-1 and 1: got %v, want an error containing %q", err, want)
	}
	tb, err := Compile(split(math.MaxUint32-1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if got := tb.VirtualHosts[0].Routes[0].TotalWeight; got != math.MaxUint32 {
		t.Errorf("total weight %d, want %d", got, uint64(math.MaxUint32))
	}
}
