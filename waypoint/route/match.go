// Package route is the waypoint's request router: a compiled Envoy
// RouteConfiguration (the subset Weft's control plane emits) and the
// matcher that picks the virtual host by the request's host, with Envoy's
// domain rules (vhost.go), then, in order, the first of its routes the
// request satisfies.
package route

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	"github.com/weftmesh/weft/waypoint/internal/pbcheck"
)

// The fields the matchers support in each message; Fields checks the names
// against the descriptors when the package loads.
var (
	stringMatcherFields = pbcheck.Fields[*matcherv3.StringMatcher]("exact", "prefix", "suffix", "contains", "safe_regex", "ignore_case")
	regexFields         = pbcheck.Fields[*matcherv3.RegexMatcher]("regex", "google_re2")
	headerMatcherFields = pbcheck.Fields[*routev3.HeaderMatcher]("name", "string_match", "present_match", "invert_match")
)

// StringMatcher is a compiled envoy.type.matcher.v3.StringMatcher.
type StringMatcher struct {
	Exact, Prefix, Suffix, Contains *string
	Regex                           *regexp.Regexp
	IgnoreCase                      bool
}

// CompileString compiles m; where names it in errors.
func CompileString(m *matcherv3.StringMatcher, where string) (*StringMatcher, error) {
	if m == nil {
		return nil, fmt.Errorf("%s is required", where)
	}
	if err := stringMatcherFields.Check(m, where); err != nil {
		return nil, err
	}
	s := &StringMatcher{IgnoreCase: m.GetIgnoreCase()}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		s.Exact = &p.Exact
	case *matcherv3.StringMatcher_Prefix:
		s.Prefix = &p.Prefix
	case *matcherv3.StringMatcher_Suffix:
		s.Suffix = &p.Suffix
	case *matcherv3.StringMatcher_Contains:
		s.Contains = &p.Contains
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := compileRegex(p.SafeRegex, where+".safe_regex")
		if err != nil {
			return nil, err
		}
		s.Regex = re
	default:
		return nil, fmt.Errorf("%s has no match pattern", where)
	}
	return s, nil
}

func compileRegex(m *matcherv3.RegexMatcher, where string) (*regexp.Regexp, error) {
	if err := regexFields.Check(m, where); err != nil {
		return nil, err
	}
	re, err := regexp.Compile("^(?:" + m.GetRegex() + ")$")
	if err != nil {
		return nil, fmt.Errorf("%s.regex %q: %v", where, m.GetRegex(), err)
	}
	return re, nil
}

// Match reports whether v satisfies the matcher.
func (s *StringMatcher) Match(v string) bool {
	fold := func(a string) string {
		if s.IgnoreCase {
			return strings.ToLower(a)
		}
		return a
	}
	switch {
	case s.Exact != nil:
		if s.IgnoreCase {
			return strings.EqualFold(v, *s.Exact)
		}
		return v == *s.Exact
	case s.Prefix != nil:
		return strings.HasPrefix(fold(v), fold(*s.Prefix))
	case s.Suffix != nil:
		return strings.HasSuffix(fold(v), fold(*s.Suffix))
	case s.Contains != nil:
		return strings.Contains(fold(v), fold(*s.Contains))
	case s.Regex != nil:
		return s.Regex.MatchString(v)
	}
	return false
}

// HeaderMatcher is a compiled envoy.config.route.v3.HeaderMatcher. Name may
// be a pseudo-header (:method, :authority, :path, :scheme).
type HeaderMatcher struct {
	Name    string
	Present *bool
	String  *StringMatcher
	Invert  bool
}

// CompileHeader compiles m.
func CompileHeader(m *routev3.HeaderMatcher, where string) (*HeaderMatcher, error) {
	if err := headerMatcherFields.Check(m, where); err != nil {
		return nil, err
	}
	if m.GetName() == "" {
		return nil, fmt.Errorf("%s.name is empty", where)
	}
	h := &HeaderMatcher{Name: strings.ToLower(m.GetName()), Invert: m.GetInvertMatch()}
	switch p := m.GetHeaderMatchSpecifier().(type) {
	case *routev3.HeaderMatcher_StringMatch:
		s, err := CompileString(p.StringMatch, where+".string_match")
		if err != nil {
			return nil, err
		}
		h.String = s
	case *routev3.HeaderMatcher_PresentMatch:
		h.Present = &p.PresentMatch
	case nil:
		t := true
		h.Present = &t
	default:
		return nil, fmt.Errorf("%s: header match specifier %T is not supported", where, p)
	}
	return h, nil
}

// Request is what matching looks at.
type Request struct {
	Method    string
	Authority string
	Scheme    string
	// Path is the request target's path with its query.
	Path   string
	Header http.Header
}

// FromHTTP builds a Request from a server-side net/http request; its
// :scheme is https when the request came over TLS (r.TLS set).
func FromHTTP(r *http.Request) Request {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return Request{Method: r.Method, Authority: r.Host, Scheme: scheme, Path: r.URL.RequestURI(), Header: r.Header}
}

// header returns the joined values of name, and whether it is present.
func (r *Request) header(name string) (string, bool) {
	switch name {
	case ":method":
		return r.Method, true
	case ":authority", "host":
		return r.Authority, r.Authority != ""
	case ":path":
		return r.Path, true
	case ":scheme":
		return r.Scheme, true
	}
	vs, ok := r.Header[http.CanonicalHeaderKey(name)]
	if !ok {
		return "", false
	}
	return strings.Join(vs, ","), true
}

// Match reports whether the request satisfies h.
func (h *HeaderMatcher) Match(r *Request) bool {
	v, ok := r.header(h.Name)
	var m bool
	switch {
	case h.Present != nil:
		m = ok == *h.Present
	case !ok:
		return false // an absent header matches no value matcher, inverted or not
	default:
		m = h.String.Match(v)
	}
	return m != h.Invert
}

// QueryMatcher is a compiled QueryParameterMatcher.
type QueryMatcher struct {
	Name    string
	Present bool
	String  *StringMatcher
}

// Match reports whether q satisfies m.
func (m *QueryMatcher) Match(q url.Values) bool {
	vs, ok := q[m.Name]
	if m.Present {
		return ok
	}
	if !ok {
		return false
	}
	return m.String.Match(vs[0])
}

// PathKind is how a route matches the path.
type PathKind int

// Path match kinds.
const (
	PathPrefix PathKind = iota
	PathExact
	PathRegex
	PathSeparatedPrefix
)

// splitPath splits a request target into path and raw query.
func splitPath(target string) (string, string) {
	p, q, _ := strings.Cut(target, "?")
	if i := strings.IndexByte(p, '#'); i >= 0 {
		p = p[:i]
	}
	return p, q
}

func (rt *Route) matchPath(path string) bool {
	want := rt.Path
	if !rt.CaseSensitive && rt.PathKind != PathRegex {
		path, want = strings.ToLower(path), strings.ToLower(want)
	}
	switch rt.PathKind {
	case PathExact:
		return path == want
	case PathPrefix:
		return strings.HasPrefix(path, want)
	case PathSeparatedPrefix:
		if !strings.HasPrefix(path, want) {
			return false
		}
		return len(path) == len(want) || path[len(want)] == '/'
	case PathRegex:
		return rt.PathRegex.MatchString(path)
	}
	return false
}

// Matches reports whether r satisfies every condition of rt.
func (rt *Route) Matches(r *Request) bool {
	path, rawq := splitPath(r.Path)
	if !rt.matchPath(path) {
		return false
	}
	for _, h := range rt.Headers {
		if !h.Match(r) {
			return false
		}
	}
	if len(rt.Query) > 0 {
		q, err := url.ParseQuery(rawq)
		if err != nil && q == nil {
			return false
		}
		for _, m := range rt.Query {
			if !m.Match(q) {
				return false
			}
		}
	}
	return true
}

// VirtualHost returns the virtual host whose domains take host (a Host or
// :authority value as the request has it; without its port when the table
// ignores ports), or nil.
func (t *Table) VirtualHost(host string) *VirtualHost {
	if t == nil {
		return nil
	}
	if t.IgnorePort {
		host = StripPort(host)
	}
	return t.domains.find(host)
}

// Match returns the first route r satisfies in the virtual host its
// authority selects, or nil: no virtual host takes the authority, or none
// of its routes takes r.
func (t *Table) Match(r *Request) *Route {
	vh := t.VirtualHost(r.Authority)
	if vh == nil {
		return nil
	}
	for _, rt := range vh.Routes {
		if rt.Matches(r) {
			return rt
		}
	}
	return nil
}
