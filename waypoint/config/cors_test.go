package config

import (
	"strings"
	"testing"

	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	rbacfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func httpFilter(t *testing.T, name string, m proto.Message) *hcmv3.HttpFilter {
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return &hcmv3.HttpFilter{Name: name, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: a}}
}

// TestCORSFilter: the CORS filter turns on the routes' CORS policies; the
// waypoint runs it after the policies, so it refuses a chain that puts an
// RBAC filter after it, and one naming it otherwise (the name is what a
// route's per-filter config refers to) or twice.
func TestCORSFilter(t *testing.T) {
	rbac := httpFilter(t, "envoy.filters.http.rbac", &rbacfilter.RBAC{Rules: &rbacv3.RBAC{Action: rbacv3.RBAC_DENY}})
	cors := httpFilter(t, "envoy.filters.http.cors", &corsv3.Cors{})
	router := httpFilter(t, "envoy.filters.http.router", &routerv3.Router{})
	rc := &routev3.RouteConfiguration{Name: "rc"}
	for _, tc := range []struct {
		name    string
		filters []*hcmv3.HttpFilter
		cors    bool
		err     string
	}{
		{"rbac then cors", []*hcmv3.HttpFilter{rbac, cors, router}, true, ""},
		{"no cors", []*hcmv3.HttpFilter{rbac, router}, false, ""},
		{"cors then rbac", []*hcmv3.HttpFilter{cors, rbac, router}, false, "an RBAC filter after the CORS filter is not supported"},
		{"misnamed", []*hcmv3.HttpFilter{httpFilter(t, "cors", &corsv3.Cors{}), router}, false, "must be named envoy.filters.http.cors"},
		{"twice", []*hcmv3.HttpFilter{cors, cors, router}, false, "must be named envoy.filters.http.cors, once"},
	} {
		h, err := compileHCM(&hcmv3.HttpConnectionManager{StatPrefix: "x", RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: rc},
			HttpFilters: tc.filters}, "hcm")
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case err == nil && h.CORS != tc.cors:
			t.Errorf("%s: CORS %v, want %v", tc.name, h.CORS, tc.cors)
		}
	}
}
