package router

import (
	"crypto/tls"
	"net/http/httptest"
	"testing"

	"github.com/weftmesh/weft/waypoint/route"
)

// TestRedirectKeepsScheme: a redirect that sets no scheme keeps the
// request's, https for a request that came over TLS (a gateway's HTTPS
// listener), and drops that scheme's default port; one that sets a scheme
// uses it whatever the connection, and a client's X-Forwarded-Proto or
// absolute URI decides nothing.
func TestRedirectKeepsScheme(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tls    bool
		host   string
		rd     route.Redirect
		header string
		want   string
	}{
		{"plain", false, "example.org", route.Redirect{Code: 302}, "", "http://example.org/p"},
		{"tls", true, "example.org", route.Redirect{Code: 302}, "", "https://example.org/p"},
		{"tls default port", true, "example.org:443", route.Redirect{Code: 302}, "", "https://example.org/p"},
		{"tls other port", true, "example.org:8443", route.Redirect{Code: 302}, "", "https://example.org:8443/p"},
		{"tls port 443 set", true, "example.org", route.Redirect{Port: 443, Code: 302}, "", "https://example.org/p"},
		{"tls port 8443 set", true, "example.org", route.Redirect{Port: 8443, Code: 302}, "", "https://example.org:8443/p"},
		{"tls to http", true, "example.org", route.Redirect{Scheme: "http", Code: 302}, "", "http://example.org/p"},
		{"plain to https", false, "example.org:80", route.Redirect{Scheme: "https", Code: 302}, "", "https://example.org/p"},
		{"spoofed proto", false, "example.org", route.Redirect{Code: 302}, "https", "http://example.org/p"},
		{"spoofed proto over tls", true, "example.org", route.Redirect{Code: 302}, "http", "https://example.org/p"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "http://other.example/p", nil)
			r.Host = tc.host
			if tc.tls {
				r.TLS = &tls.ConnectionState{ServerName: "example.org"}
			} else {
				r.TLS = nil
			}
			if tc.header != "" {
				r.Header.Set("X-Forwarded-Proto", tc.header)
			}
			rd := tc.rd
			w := httptest.NewRecorder()
			Redirect(w, r, &route.Route{Redirect: &rd})
			if w.Code != 302 {
				t.Errorf("status %d, want 302", w.Code)
			}
			if got := w.Header().Get("Location"); got != tc.want {
				t.Errorf("Location %q, want %q", got, tc.want)
			}
		})
	}
}
