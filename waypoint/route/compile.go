package route

import (
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

	"github.com/weftmesh/weft/waypoint/internal/pbcheck"
)

// Table is a compiled RouteConfiguration: its virtual hosts, each with its
// routes in order, and the index that picks one by the request's host
// (vhost.go).
type Table struct {
	Name         string
	VirtualHosts []*VirtualHost
	// Routes are every virtual host's routes, virtual hosts in order: what
	// the configuration holds, for inspection. Matching goes through the
	// virtual hosts (Match).
	Routes []*Route
	// IgnorePort (ignore_port_in_host_matching): a virtual host is chosen
	// by the host without its port (StripPort); the request keeps it.
	IgnorePort bool
	domains    domains
}

// HeaderOp is one header to add.
type HeaderOp struct {
	Name, Value string
	Append      bool // APPEND_IF_EXISTS_OR_ADD; otherwise overwrite
}

// Headers is a set of header modifications.
type Headers struct {
	Add    []HeaderOp
	Remove []string
}

// Apply modifies h.
func (m *Headers) Apply(h http.Header) {
	for _, n := range m.Remove {
		h.Del(n)
	}
	for _, op := range m.Add {
		if op.Append {
			h.Add(op.Name, op.Value)
		} else {
			h.Set(op.Name, op.Value)
		}
	}
}

// WeightedCluster is one backend of a route.
type WeightedCluster struct {
	Name   string
	Weight uint32
	// Request and Response are this backend's own header changes.
	Request, Response Headers
}

// Retry is a compiled retry policy.
type Retry struct {
	On5xx, OnGatewayError, OnConnectFailure, OnReset, OnStatus bool
	NumRetries                                                 int
	PerTryTimeout                                              time.Duration
	StatusCodes                                                []int
	BaseInterval, MaxInterval                                  time.Duration
}

// Mirror is a request mirror target.
type Mirror struct {
	Cluster string
	// Percent of requests mirrored, 0..100.
	Percent float64
}

// Redirect is a redirect action.
type Redirect struct {
	Scheme, Host  string
	Port          uint32
	Path          string
	PrefixRewrite *string
	Code          int
}

// Route is one compiled route.
type Route struct {
	Name          string
	PathKind      PathKind
	Path          string
	PathRegex     *regexp.Regexp
	CaseSensitive bool
	Headers       []*HeaderMatcher
	Query         []*QueryMatcher

	Request, Response Headers
	// CORS is the route's CORS policy, or nil; it applies on a chain
	// with the CORS filter.
	CORS *CORS

	// Exactly one of Clusters (non-empty), Redirect, Direct is set.
	Clusters      []WeightedCluster
	TotalWeight   uint32
	Timeout       time.Duration
	Retry         *Retry
	Mirrors       []Mirror
	PrefixRewrite *string
	RegexRewrite  *regexp.Regexp
	RegexSubst    string
	HostRewrite   string

	Redirect *Redirect

	Direct     bool
	DirectCode int
	DirectBody string
}

// The fields the router supports in each message; Fields checks the names
// against the descriptors when the package loads.
var (
	routeConfigFields = pbcheck.Fields[*routev3.RouteConfiguration]("name", "virtual_hosts", "validate_clusters", "ignore_port_in_host_matching")
	virtualHostFields = pbcheck.Fields[*routev3.VirtualHost]("name", "domains", "routes")
	routeFields       = pbcheck.Fields[*routev3.Route]("name", "match", "route", "redirect", "direct_response",
		"request_headers_to_add", "request_headers_to_remove", "response_headers_to_add", "response_headers_to_remove",
		"typed_per_filter_config")
	routeMatchFields     = pbcheck.Fields[*routev3.RouteMatch]("prefix", "path", "safe_regex", "path_separated_prefix", "case_sensitive", "headers", "query_parameters")
	queryFields          = pbcheck.Fields[*routev3.QueryParameterMatcher]("name", "string_match", "present_match")
	directResponseFields = pbcheck.Fields[*routev3.DirectResponseAction]("status", "body")
	dataSourceFields     = pbcheck.Fields[*corev3.DataSource]("inline_string")
	headerOptionFields   = pbcheck.Fields[*corev3.HeaderValueOption]("header", "append_action")
	headerValueFields    = pbcheck.Fields[*corev3.HeaderValue]("key", "value")
	actionFields         = pbcheck.Fields[*routev3.RouteAction]("cluster", "weighted_clusters", "timeout", "retry_policy", "request_mirror_policies",
		"prefix_rewrite", "regex_rewrite", "host_rewrite_literal")
	weightedFields      = pbcheck.Fields[*routev3.WeightedCluster]("clusters", "total_weight")
	clusterWeightFields = pbcheck.Fields[*routev3.WeightedCluster_ClusterWeight]("name", "weight", "request_headers_to_add", "request_headers_to_remove",
		"response_headers_to_add", "response_headers_to_remove")
	retryFields    = pbcheck.Fields[*routev3.RetryPolicy]("retry_on", "num_retries", "per_try_timeout", "retriable_status_codes", "retry_back_off")
	backOffFields  = pbcheck.Fields[*routev3.RetryPolicy_RetryBackOff]("base_interval", "max_interval")
	mirrorFields   = pbcheck.Fields[*routev3.RouteAction_RequestMirrorPolicy]("cluster", "runtime_fraction")
	redirectFields = pbcheck.Fields[*routev3.RedirectAction]("scheme_redirect", "host_redirect", "port_redirect", "path_redirect", "prefix_rewrite", "response_code", "https_redirect")
)

// Compile compiles a RouteConfiguration; errors name the configuration and field.
func Compile(rc *routev3.RouteConfiguration) (*Table, error) {
	where := fmt.Sprintf("route %q", rc.GetName())
	if err := routeConfigFields.Check(rc, where); err != nil {
		return nil, err
	}
	t := &Table{Name: rc.GetName(), IgnorePort: rc.GetIgnorePortInHostMatching()}
	for i, vh := range rc.GetVirtualHosts() {
		vw := fmt.Sprintf("%s: virtual_hosts[%d]", where, i)
		if err := virtualHostFields.Check(vh, vw); err != nil {
			return nil, err
		}
		cv := &VirtualHost{Name: vh.GetName(), Domains: vh.GetDomains()}
		for j, r := range vh.GetRoutes() {
			rw := fmt.Sprintf("%s: route[%d]", where, j)
			if i > 0 {
				rw = fmt.Sprintf("%s: virtual_hosts[%d].route[%d]", where, i, j)
			}
			cr, err := compileRoute(r, rw)
			if err != nil {
				return nil, err
			}
			cv.Routes = append(cv.Routes, cr)
			t.Routes = append(t.Routes, cr)
		}
		t.VirtualHosts = append(t.VirtualHosts, cv)
	}
	d, err := compileDomains(t.VirtualHosts, where)
	if err != nil {
		return nil, err
	}
	t.domains = d
	return t, nil
}

func compileRoute(r *routev3.Route, where string) (*Route, error) {
	if err := routeFields.Check(r, where); err != nil {
		return nil, err
	}
	m := r.GetMatch()
	if m == nil {
		return nil, fmt.Errorf("%s.match is required", where)
	}
	if err := routeMatchFields.Check(m, where+".match"); err != nil {
		return nil, err
	}
	out := &Route{Name: r.GetName(), CaseSensitive: m.GetCaseSensitive() == nil || m.GetCaseSensitive().GetValue()}
	switch p := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		out.PathKind, out.Path = PathPrefix, p.Prefix
	case *routev3.RouteMatch_Path:
		out.PathKind, out.Path = PathExact, p.Path
	case *routev3.RouteMatch_PathSeparatedPrefix:
		if strings.HasSuffix(p.PathSeparatedPrefix, "/") || strings.ContainsAny(p.PathSeparatedPrefix, "?#") {
			return nil, fmt.Errorf("%s.match.path_separated_prefix %q must not end in '/' or hold '?' or '#'", where, p.PathSeparatedPrefix)
		}
		out.PathKind, out.Path = PathSeparatedPrefix, p.PathSeparatedPrefix
	case *routev3.RouteMatch_SafeRegex:
		re, err := compileRegex(p.SafeRegex, where+".match.safe_regex")
		if err != nil {
			return nil, err
		}
		out.PathKind, out.PathRegex = PathRegex, re
	default:
		return nil, fmt.Errorf("%s.match has no path specifier", where)
	}
	for i, h := range m.GetHeaders() {
		hm, err := CompileHeader(h, fmt.Sprintf("%s.match.headers[%d]", where, i))
		if err != nil {
			return nil, err
		}
		out.Headers = append(out.Headers, hm)
	}
	for i, q := range m.GetQueryParameters() {
		qw := fmt.Sprintf("%s.match.query_parameters[%d]", where, i)
		if err := queryFields.Check(q, qw); err != nil {
			return nil, err
		}
		qm := &QueryMatcher{Name: q.GetName()}
		if q.GetPresentMatch() {
			qm.Present = true
		} else if q.GetStringMatch() != nil {
			s, err := CompileString(q.GetStringMatch(), qw+".string_match")
			if err != nil {
				return nil, err
			}
			qm.String = s
		} else {
			qm.Present = true
		}
		out.Query = append(out.Query, qm)
	}
	var err error
	if out.Request, err = compileHeaders(r.GetRequestHeadersToAdd(), r.GetRequestHeadersToRemove(), where+".request_headers_to_add"); err != nil {
		return nil, err
	}
	if out.Response, err = compileHeaders(r.GetResponseHeadersToAdd(), r.GetResponseHeadersToRemove(), where+".response_headers_to_add"); err != nil {
		return nil, err
	}
	if err := compilePerFilter(r, out, where); err != nil {
		return nil, err
	}
	switch a := r.GetAction().(type) {
	case *routev3.Route_Route:
		err = compileAction(out, a.Route, where+".route")
	case *routev3.Route_Redirect:
		err = compileRedirect(out, a.Redirect, where+".redirect")
	case *routev3.Route_DirectResponse:
		if err := directResponseFields.Check(a.DirectResponse, where+".direct_response"); err != nil {
			return nil, err
		}
		if s := a.DirectResponse.GetStatus(); s < 200 || s > 599 {
			return nil, fmt.Errorf("%s.direct_response.status %d is outside 200..599", where, s)
		}
		if b := a.DirectResponse.GetBody(); b != nil {
			if err := dataSourceFields.Check(b, where+".direct_response.body"); err != nil {
				return nil, err
			}
			out.DirectBody = b.GetInlineString()
		}
		out.Direct, out.DirectCode = true, int(a.DirectResponse.GetStatus())
	default:
		return nil, fmt.Errorf("%s has no action (route, redirect or direct_response)", where)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

func compileHeaders(add []*corev3.HeaderValueOption, rm []string, where string) (Headers, error) {
	var h Headers
	for i, o := range add {
		w := fmt.Sprintf("%s[%d]", where, i)
		if err := headerOptionFields.Check(o, w); err != nil {
			return h, err
		}
		if err := headerValueFields.Check(o.GetHeader(), w+".header"); err != nil {
			return h, err
		}
		name := o.GetHeader().GetKey()
		if name == "" || strings.HasPrefix(name, ":") || strings.ContainsAny(name, " \r\n:") {
			return h, fmt.Errorf("%s.header.key %q is not a header name", w, name)
		}
		if strings.ContainsAny(o.GetHeader().GetValue(), "\r\n\x00") {
			return h, fmt.Errorf("%s.header.value holds a control character", w)
		}
		var app bool
		switch o.GetAppendAction() {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			app = true
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD:
		default:
			return h, fmt.Errorf("%s.append_action %s is not supported", w, o.GetAppendAction())
		}
		h.Add = append(h.Add, HeaderOp{Name: name, Value: o.GetHeader().GetValue(), Append: app})
	}
	h.Remove = rm
	return h, nil
}

func compileAction(out *Route, a *routev3.RouteAction, where string) error {
	if err := actionFields.Check(a, where); err != nil {
		return err
	}
	switch c := a.GetClusterSpecifier().(type) {
	case *routev3.RouteAction_Cluster:
		if c.Cluster == "" {
			return fmt.Errorf("%s.cluster is empty", where)
		}
		out.Clusters = []WeightedCluster{{Name: c.Cluster, Weight: 1}}
	case *routev3.RouteAction_WeightedClusters:
		if err := weightedFields.Check(c.WeightedClusters, where+".weighted_clusters"); err != nil {
			return err
		}
		for i, wc := range c.WeightedClusters.GetClusters() {
			w := fmt.Sprintf("%s.weighted_clusters.clusters[%d]", where, i)
			if err := clusterWeightFields.Check(wc, w); err != nil {
				return err
			}
			if wc.GetName() == "" {
				return fmt.Errorf("%s.name is empty", w)
			}
			h, err := compileHeaders(wc.GetRequestHeadersToAdd(), wc.GetRequestHeadersToRemove(), w+".request_headers_to_add")
			if err != nil {
				return err
			}
			rh, err := compileHeaders(wc.GetResponseHeadersToAdd(), wc.GetResponseHeadersToRemove(), w+".response_headers_to_add")
			if err != nil {
				return err
			}
			out.Clusters = append(out.Clusters, WeightedCluster{Name: wc.GetName(), Weight: wc.GetWeight().GetValue(), Request: h, Response: rh})
		}
		if len(out.Clusters) == 0 {
			return fmt.Errorf("%s.weighted_clusters.clusters is empty", where)
		}
	default:
		return fmt.Errorf("%s has no cluster or weighted_clusters", where)
	}
	var total uint64
	for _, c := range out.Clusters {
		total += uint64(c.Weight)
	}
	if total > math.MaxUint32 {
		return fmt.Errorf("%s.weighted_clusters: the weights add up to %d, more than %d", where, total, uint64(math.MaxUint32))
	}
	out.TotalWeight = uint32(total)
	out.Timeout = a.GetTimeout().AsDuration()
	if rp := a.GetRetryPolicy(); rp != nil {
		w := where + ".retry_policy"
		if err := retryFields.Check(rp, w); err != nil {
			return err
		}
		r := &Retry{NumRetries: 1, PerTryTimeout: rp.GetPerTryTimeout().AsDuration(), BaseInterval: 25 * time.Millisecond}
		if rp.GetNumRetries() != nil {
			r.NumRetries = int(rp.GetNumRetries().GetValue())
		}
		for on := range strings.SplitSeq(rp.GetRetryOn(), ",") {
			switch strings.TrimSpace(on) {
			case "5xx":
				r.On5xx = true
			case "gateway-error":
				r.OnGatewayError = true
			case "connect-failure":
				r.OnConnectFailure = true
			case "reset":
				r.OnReset = true
			case "retriable-status-codes":
				r.OnStatus = true
			case "":
			default:
				return fmt.Errorf("%s.retry_on %q is not supported", w, on)
			}
		}
		for _, c := range rp.GetRetriableStatusCodes() {
			if c < 100 || c > 599 {
				return fmt.Errorf("%s.retriable_status_codes %d is not a status", w, c)
			}
			r.StatusCodes = append(r.StatusCodes, int(c))
		}
		if b := rp.GetRetryBackOff(); b != nil {
			if err := backOffFields.Check(b, w+".retry_back_off"); err != nil {
				return err
			}
			r.BaseInterval = b.GetBaseInterval().AsDuration()
			r.MaxInterval = b.GetMaxInterval().AsDuration()
		}
		if r.MaxInterval == 0 {
			r.MaxInterval = 10 * r.BaseInterval
		}
		out.Retry = r
	}
	for i, m := range a.GetRequestMirrorPolicies() {
		w := fmt.Sprintf("%s.request_mirror_policies[%d]", where, i)
		if err := mirrorFields.Check(m, w); err != nil {
			return err
		}
		pct := 100.0
		if rf := m.GetRuntimeFraction(); rf != nil {
			d := rf.GetDefaultValue()
			den := map[int32]float64{0: 100, 1: 10000, 2: 1000000}[int32(d.GetDenominator())]
			pct = float64(d.GetNumerator()) * 100 / den
		}
		out.Mirrors = append(out.Mirrors, Mirror{Cluster: m.GetCluster(), Percent: pct})
	}
	if a.GetPrefixRewrite() != "" {
		p := a.GetPrefixRewrite()
		out.PrefixRewrite = &p
	}
	if rr := a.GetRegexRewrite(); rr != nil {
		re, err := compileRegex(rr.GetPattern(), where+".regex_rewrite.pattern")
		if err != nil {
			return err
		}
		out.RegexRewrite, out.RegexSubst = regexp.MustCompile(strings.TrimSuffix(strings.TrimPrefix(re.String(), "^(?:"), ")$")), rr.GetSubstitution()
	}
	out.HostRewrite = a.GetHostRewriteLiteral()
	return nil
}

func compileRedirect(out *Route, r *routev3.RedirectAction, where string) error {
	if err := redirectFields.Check(r, where); err != nil {
		return err
	}
	rd := &Redirect{Scheme: r.GetSchemeRedirect(), Host: r.GetHostRedirect(), Port: r.GetPortRedirect(), Path: r.GetPathRedirect()}
	if r.GetHttpsRedirect() {
		rd.Scheme = "https"
	}
	if _, ok := r.GetPathRewriteSpecifier().(*routev3.RedirectAction_PrefixRewrite); ok {
		p := r.GetPrefixRewrite()
		rd.PrefixRewrite = &p
	}
	switch r.GetResponseCode() {
	case routev3.RedirectAction_MOVED_PERMANENTLY:
		rd.Code = 301
	case routev3.RedirectAction_FOUND:
		rd.Code = 302
	case routev3.RedirectAction_SEE_OTHER:
		rd.Code = 303
	case routev3.RedirectAction_TEMPORARY_REDIRECT:
		rd.Code = 307
	case routev3.RedirectAction_PERMANENT_REDIRECT:
		rd.Code = 308
	default:
		return fmt.Errorf("%s.response_code %v is not supported", where, r.GetResponseCode())
	}
	out.Redirect = rd
	return nil
}

// RewritePath applies the route's prefix or regex rewrite to path (no query).
func (rt *Route) RewritePath(path string) string {
	switch {
	case rt.PrefixRewrite != nil && rt.PathKind != PathRegex:
		rest := path[min(len(rt.Path), len(path)):]
		np := *rt.PrefixRewrite + rest
		if *rt.PrefixRewrite == "/" && strings.HasPrefix(rest, "/") {
			np = rest
		}
		if np == "" {
			np = "/"
		}
		return np
	case rt.RegexRewrite != nil:
		return rt.RegexRewrite.ReplaceAllString(path, rt.RegexSubst)
	}
	return path
}

// Pick chooses a backend for a number n drawn uniformly from [0, TotalWeight).
func (rt *Route) Pick(n uint32) *WeightedCluster {
	for i := range rt.Clusters {
		if n < rt.Clusters[i].Weight {
			return &rt.Clusters[i]
		}
		n -= rt.Clusters[i].Weight
	}
	if len(rt.Clusters) == 0 {
		return nil
	}
	return &rt.Clusters[len(rt.Clusters)-1]
}
