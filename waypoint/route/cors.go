package route

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/weftmesh/weft/waypoint/internal/pbcheck"
)

// CORSFilter is the name of Envoy's CORS HTTP filter: a route's policy is
// its typed_per_filter_config under this name, and takes effect on a chain
// that has the filter.
const CORSFilter = "envoy.filters.http.cors"

// maxOrigin bounds the Origin a policy looks at: a serialized origin is a
// scheme, a host name of at most 253 bytes and a port. A longer one
// matches nothing.
const maxOrigin = 512

var corsPolicyFields = pbcheck.Fields[*corsv3.CorsPolicy]("allow_origin_string_match", "allow_methods", "allow_headers",
	"expose_headers", "max_age", "allow_credentials", "forward_not_matching_preflights")

// CORS is a compiled envoy.extensions.filters.http.cors.v3.CorsPolicy: the
// Fetch standard's CORS protocol, answered by the proxy.
type CORS struct {
	Origins []*StringMatcher
	// AllowMethods and AllowHeaders are the preflight's answers, as
	// configured; "*" echoes what the preflight asks for (the Gateway API
	// reading, which a credentialed request needs).
	AllowMethods, AllowHeaders string
	// ExposeHeaders is what an actual response exposes; "*" with
	// credentials lists the response's own header names.
	ExposeHeaders string
	MaxAge        string
	Credentials   bool
	// ForwardUnmatched sends a preflight from an origin not allowed
	// upstream (Envoy's default); otherwise the proxy answers it 200
	// without CORS headers.
	ForwardUnmatched bool
}

// compilePerFilter compiles a route's typed_per_filter_config: only the
// CORS filter's policy is known.
func compilePerFilter(r *routev3.Route, out *Route, where string) error {
	for name, a := range r.GetTypedPerFilterConfig() {
		w := fmt.Sprintf("%s.typed_per_filter_config[%q]", where, name)
		if name != CORSFilter {
			return fmt.Errorf("%s: only %s is supported", w, CORSFilter)
		}
		c, err := compileCORS(a, w)
		if err != nil {
			return err
		}
		out.CORS = c
	}
	return nil
}

func compileCORS(a *anypb.Any, where string) (*CORS, error) {
	var p corsv3.CorsPolicy
	if !a.MessageIs(&p) {
		return nil, fmt.Errorf("%s: type %s is not a CorsPolicy", where, a.GetTypeUrl())
	}
	if err := a.UnmarshalTo(&p); err != nil {
		return nil, fmt.Errorf("%s: %v", where, err)
	}
	if err := corsPolicyFields.Check(&p, where); err != nil {
		return nil, err
	}
	c := &CORS{AllowMethods: p.GetAllowMethods(), AllowHeaders: p.GetAllowHeaders(), ExposeHeaders: p.GetExposeHeaders(),
		MaxAge: p.GetMaxAge(), Credentials: p.GetAllowCredentials().GetValue(),
		ForwardUnmatched: p.GetForwardNotMatchingPreflights() == nil || p.GetForwardNotMatchingPreflights().GetValue()}
	for i, m := range p.GetAllowOriginStringMatch() {
		s, err := CompileString(m, fmt.Sprintf("%s.allow_origin_string_match[%d]", where, i))
		if err != nil {
			return nil, err
		}
		c.Origins = append(c.Origins, s)
	}
	for _, f := range []struct{ name, v string }{{"allow_methods", c.AllowMethods}, {"allow_headers", c.AllowHeaders}, {"expose_headers", c.ExposeHeaders}} {
		if !fieldList(f.v) {
			return nil, fmt.Errorf("%s.%s %q is not a comma-separated list of tokens", where, f.name, f.v)
		}
	}
	if c.MaxAge != "" {
		if n, err := strconv.ParseUint(c.MaxAge, 10, 31); err != nil || strconv.FormatUint(n, 10) != c.MaxAge {
			return nil, fmt.Errorf("%s.max_age %q is not a number of seconds", where, c.MaxAge)
		}
	}
	return c, nil
}

// Origin returns the request's origin if the policy allows it. A request
// has one origin: an Origin field given twice, or holding a list, is no
// origin (RFC 6454 section 7.3 lets a user agent send one only); nor is
// one with spaces, controls or non-ASCII bytes (a serialized origin has
// none), or one longer than maxOrigin.
func (c *CORS) Origin(req http.Header) (string, bool) {
	vs := req.Values("Origin")
	if len(vs) != 1 {
		return "", false
	}
	o := vs[0]
	if o == "" || len(o) > maxOrigin || strings.IndexFunc(o, func(r rune) bool { return r <= ' ' || r >= 0x7f || r == ',' }) >= 0 {
		return "", false
	}
	for _, m := range c.Origins {
		if m.Match(o) {
			return o, true
		}
	}
	return "", false
}

// IsPreflight reports whether r is a CORS preflight: an OPTIONS request
// with an Origin and an Access-Control-Request-Method.
func IsPreflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != ""
}

// Preflight sets in h the headers of the answer to a preflight whose
// request header is req, and reports whether its origin is allowed. The
// answer lists the allowed methods and headers; the user agent, not the
// proxy, refuses an actual request that asks for others.
func (c *CORS) Preflight(req, h http.Header) bool {
	o, ok := c.Origin(req)
	if !ok {
		return false
	}
	h.Set("Access-Control-Allow-Origin", o)
	addVary(h)
	if c.Credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
	switch {
	case c.AllowMethods == "*":
		if m := req.Get("Access-Control-Request-Method"); isToken(m) {
			h.Set("Access-Control-Allow-Methods", m)
		}
	case c.AllowMethods != "":
		h.Set("Access-Control-Allow-Methods", c.AllowMethods)
	}
	switch {
	case c.AllowHeaders == "*":
		if v := strings.Join(req.Values("Access-Control-Request-Headers"), ","); v != "" && len(v) <= maxOrigin*8 && fieldList(v) {
			h.Set("Access-Control-Allow-Headers", v)
		}
	case c.AllowHeaders != "":
		h.Set("Access-Control-Allow-Headers", c.AllowHeaders)
	}
	if c.ExposeHeaders != "" && (c.ExposeHeaders != "*" || !c.Credentials) {
		h.Set("Access-Control-Expose-Headers", c.ExposeHeaders)
	}
	if c.MaxAge != "" {
		h.Set("Access-Control-Max-Age", c.MaxAge)
	}
	return true
}

// Actual adds to h, the header of the response to a request whose header
// is req, what the policy shares with the request's origin; for an origin
// not allowed, nothing. The response's own Access-Control-Allow-Origin is
// replaced, as Envoy does.
func (c *CORS) Actual(req, h http.Header) {
	if req.Get("Origin") != "" {
		addVary(h)
	}
	o, ok := c.Origin(req)
	if !ok {
		return
	}
	h.Set("Access-Control-Allow-Origin", o)
	if c.Credentials {
		h.Set("Access-Control-Allow-Credentials", "true")
	}
	switch {
	case c.ExposeHeaders == "*" && c.Credentials:
		// "*" means no wildcard to a credentialed request (Fetch): name
		// the response's own headers.
		var names []string
		for k := range h {
			if !strings.HasPrefix(k, "Access-Control-") {
				names = append(names, k)
			}
		}
		slices.Sort(names)
		if len(names) > 0 {
			h.Set("Access-Control-Expose-Headers", strings.Join(names, ", "))
		}
	case c.ExposeHeaders != "":
		h.Set("Access-Control-Expose-Headers", c.ExposeHeaders)
	}
}

// addVary says in h that the response depends on the request's Origin, so
// that a cache does not hand one origin's answer to another.
func addVary(h http.Header) {
	for _, v := range h.Values("Vary") {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f == "*" || strings.EqualFold(f, "Origin") {
				return
			}
		}
	}
	h.Add("Vary", "Origin")
}

// fieldList reports whether v is empty or a comma-separated list of
// RFC 9110 tokens (method or field names), "*" included.
func fieldList(v string) bool {
	for f := range strings.SplitSeq(v, ",") {
		if f = strings.Trim(f, " \t"); f != "" && !isToken(f) {
			return false
		}
	}
	return true
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
