package pbcheck

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
)

func TestCheck(t *testing.T) {
	header := Fields[*corev3.HeaderValue]("key", "value")
	match := Fields[*routev3.RouteMatch]("prefix", "path", "headers")
	tests := []struct {
		name string
		err  error
		want string // "" for no error
	}{
		{"nil message", header.Check(nil, "h"), ""},
		{"empty message", header.Check(&corev3.HeaderValue{}, "h"), ""},
		{"supported fields", header.Check(&corev3.HeaderValue{Key: "k", Value: "v"}, "h"), ""},
		{"unsupported field", header.Check(&corev3.HeaderValue{Key: "k", RawValue: []byte("v")}, "route[0].header"),
			"route[0].header.raw_value is not supported"},
		{"supported oneof member", match.Check(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}}, "m"), ""},
		{"unsupported oneof member", match.Check(&routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_SafeRegex{}}, "m"),
			"m.safe_regex is not supported"},
		{"repeated field", match.Check(&routev3.RouteMatch{QueryParameters: []*routev3.QueryParameterMatcher{{Name: "q"}}}, "m"),
			"m.query_parameters is not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if tt.err != nil {
				got = tt.err.Error()
			}
			if got != tt.want {
				t.Errorf("Check: %q, want %q", got, tt.want)
			}
		})
	}
}

// An empty set refuses every field: the messages whose presence is all the
// waypoint supports (the router, the HTTP inspector).
func TestCheckEmptySet(t *testing.T) {
	none := Fields[*corev3.HeaderValue]()
	if err := none.Check(&corev3.HeaderValue{}, "h"); err != nil {
		t.Errorf("empty message: %v", err)
	}
	if err := none.Check(&corev3.HeaderValue{Value: "v"}, "h"); err == nil || err.Error() != "h.value is not supported" {
		t.Errorf("Check: %v, want h.value is not supported", err)
	}
}

// A name the descriptor does not hold is a typo: Fields refuses it, naming
// the message and the name, instead of leaving a supported field refused.
func TestFieldsRejectsUnknownName(t *testing.T) {
	for _, name := range []string{"kye", "Key", "rawValue", "key ", ""} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				r := recover()
				msg, _ := r.(string)
				want := `pbcheck: envoy.config.core.v3.HeaderValue has no field "` + name + `"`
				if !strings.Contains(msg, want) {
					t.Errorf("panic %v, want %q", r, want)
				}
			}()
			Fields[*corev3.HeaderValue]("key", name)
		})
	}
}
