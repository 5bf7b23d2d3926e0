package rbac

import (
	"net/http"
	"testing"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	"github.com/weftmesh/weft/waypoint/route"
)

func TestEvaluate(t *testing.T) {
	nsA := &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{Authenticated: &rbacv3.Principal_Authenticated{PrincipalName: &matcherv3.StringMatcher{
		MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "spiffe://[^/]+/ns/a/sa/[^/]+"}}}}}}
	admin := &rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "/admin"}}}}}}
	mk := func(action rbacv3.RBAC_Action, pols map[string]*rbacv3.Policy) *Filter {
		f, err := Compile(&rbacv3.RBAC{Action: action, Policies: pols}, false, "rbac")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	allowA := mk(rbacv3.RBAC_ALLOW, map[string]*rbacv3.Policy{"a": {Permissions: []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}}, Principals: []*rbacv3.Principal{nsA}}})
	denyAdmin := mk(rbacv3.RBAC_DENY, map[string]*rbacv3.Policy{"d": {Permissions: []*rbacv3.Permission{admin}, Principals: []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}}}})
	allowNone := mk(rbacv3.RBAC_ALLOW, nil)
	req := func(p, path string) *Request {
		return &Request{Principal: p, HTTP: &route.Request{Method: "GET", Path: path, Header: http.Header{}}}
	}
	for _, tc := range []struct {
		f    *Filter
		r    *Request
		deny bool
	}{
		{allowA, req("spiffe://cluster.local/ns/a/sa/x", "/"), false},
		{allowA, req("spiffe://cluster.local/ns/b/sa/x", "/"), true},
		{allowA, req("", "/"), true},
		{denyAdmin, req("spiffe://cluster.local/ns/a/sa/x", "/admin/1?q"), true},
		{denyAdmin, req("spiffe://cluster.local/ns/a/sa/x", "/user"), false},
		{allowNone, req("spiffe://cluster.local/ns/a/sa/x", "/"), true},
	} {
		if got := tc.f.Evaluate(tc.r).Denied; got != tc.deny {
			t.Errorf("%+v %s: denied=%v want %v", tc.r.Principal, tc.r.HTTP.Path, got, tc.deny)
		}
	}
}
