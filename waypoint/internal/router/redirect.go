package router

import (
	"net"
	"net/http"
	"strconv"

	"github.com/weftmesh/weft/waypoint/route"
)

// Redirect answers r with rt's redirect (Envoy's RedirectAction): the
// request's scheme (https when it came over a gateway's TLS, r.TLS), host,
// port and path unless the redirect replaces them, the default port of the
// scheme left out, the query kept.
func Redirect(w http.ResponseWriter, r *http.Request, rt *route.Route) {
	rd := rt.Redirect
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if rd.Scheme != "" {
		scheme = rd.Scheme
	}
	host := r.Host
	hname, port := host, ""
	if h, p, err := net.SplitHostPort(host); err == nil {
		hname, port = h, p
	}
	if rd.Host != "" {
		hname = rd.Host
	}
	if rd.Port != 0 {
		port = strconv.Itoa(int(rd.Port))
	}
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") || (rd.Scheme != "" && rd.Port == 0) {
		port = ""
	}
	path := r.URL.EscapedPath()
	if rd.Path != "" {
		path = rd.Path
	} else if rd.PrefixRewrite != nil {
		cp := *rt
		cp.PrefixRewrite = rd.PrefixRewrite
		path = cp.RewritePath(path)
	}
	loc := scheme + "://" + hname
	if port != "" {
		loc += ":" + port
	}
	loc += path
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	rt.Response.Apply(w.Header())
	w.Header().Set("Location", loc)
	w.WriteHeader(rd.Code)
}
