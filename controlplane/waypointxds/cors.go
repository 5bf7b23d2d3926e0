package waypointxds

import (
	"strconv"
	"strings"

	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// corsFilterName is Envoy's CORS filter: in every HTTP chain after the
// RBAC filters, as in Istio's, so that a preflight is authorized as the
// OPTIONS request it is; a route's CorsPolicy is its per-filter config.
const corsFilterName = "envoy.filters.http.cors"

// defaultMaxAge is Gateway API's maxAge when it is not set.
const defaultMaxAge = 5

func corsFilter() *hcmv3.HttpFilter {
	return &hcmv3.HttpFilter{Name: corsFilterName, ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: mustAny(&corsv3.Cors{})}}
}

// corsConfig is a route's typed_per_filter_config for Gateway API's CORS
// filter. A preflight from an origin not allowed is answered 200 without
// CORS headers, not forwarded: Gateway API's first choice.
func corsConfig(f *gwv1.HTTPCORSFilter) map[string]*anypb.Any {
	p := &corsv3.CorsPolicy{
		AllowMethods:                 joinNames(f.AllowMethods),
		AllowHeaders:                 joinNames(f.AllowHeaders),
		ExposeHeaders:                joinNames(f.ExposeHeaders),
		MaxAge:                       strconv.Itoa(defaultMaxAge),
		ForwardNotMatchingPreflights: wrapperspb.Bool(false),
	}
	if f.MaxAge > 0 {
		p.MaxAge = strconv.Itoa(int(f.MaxAge))
	}
	if f.AllowCredentials != nil && *f.AllowCredentials {
		p.AllowCredentials = wrapperspb.Bool(true)
	}
	for _, o := range f.AllowOrigins {
		p.AllowOriginStringMatch = append(p.AllowOriginStringMatch, originMatcher(string(o)))
	}
	return map[string]*anypb.Any{corsFilterName: mustAny(p)}
}

func joinNames[T ~string](names []T) string {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	return strings.Join(s, ", ")
}

// Parts of an origin pattern (RFC 6454 serialization), in RE2.
const (
	// labels is one or more DNS labels: what a "*" in a host stands for.
	labels = `[a-z0-9-]+(?:\.[a-z0-9-]+)*`
	// anyHost is a host of any origin: labels or an IPv6 literal.
	anyHost = `(?:` + labels + `|\[[0-9a-f:.]+\])`
	anyPort = `(?::[0-9]{1,5})?`
)

// originMatcher matches Gateway API allowOrigins entry o against an Origin
// header, ignoring case (scheme and host are case-insensitive). "*" is any
// http or https origin, never "null"; a "*" in the host stands for one or
// more labels to the left of the rest ("https://*.example.com" does not
// match "https://evil-example.com"); a port left out is the scheme's
// default, which an origin may also spell out.
func originMatcher(o string) *matcherv3.StringMatcher {
	var re string
	if o == "*" {
		re = `https?://` + anyHost + anyPort
	} else {
		scheme, rest, _ := strings.Cut(o, "://")
		host, port, hasPort := strings.Cut(rest, ":")
		if host == "*" {
			host = anyHost
		} else {
			host = strings.ReplaceAll(quoteRE(host), `\*`, labels)
		}
		re = quoteRE(scheme) + "://" + host
		switch {
		case hasPort:
			re += ":" + quoteRE(port)
		case scheme == "https":
			re += `(?::443)?`
		case scheme == "http":
			re += `(?::80)?`
		}
	}
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "(?i)" + re}}}
}
