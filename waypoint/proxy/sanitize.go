package proxy

import (
	"cmp"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/route"
	"github.com/weftmesh/weft/waypoint/urlpath"
)

// What the waypoint takes from a client's request, before policy and
// routing look at it. It runs once per request; policy, routing, the
// access log and the upstream all see its result.
//
//   - The path is normalized as the chain's http_connection_manager asks
//     (package urlpath), and the normalized path is the one forwarded. A
//     fragment is removed from the target in every mode, as Envoy does
//     (RFC 9110 section 7.1: a client does not send one). The query is
//     left as it is.
//   - A Host (HTTP/2's :authority) that is not a valid host is refused
//     with 400, as the HTTP/1 server refuses it: net/http's HTTP/2 server
//     passes a non-ASCII :authority on, which neither a 421 nor a route
//     would compare with the names it resembles (a long s folds to s) and
//     which no upstream would be sent.
//   - x-forwarded-client-cert is removed (Envoy's default
//     forward_client_cert_details, SANITIZE): only a proxy that verified a
//     certificate may write it, and the waypoint writes none.
//   - Every x-envoy-* field is removed: those are Envoy's internal
//     headers (retry and timeout controls, x-envoy-internal,
//     x-envoy-original-path, x-envoy-external-address, ...), which Envoy
//     strips from requests it does not trust; the waypoint acts on none of
//     them, and no application behind it should take a mesh client's
//     word for them.
//
// The source address that IP policy sees is not the request's: it is the
// HBONE connection's peer (see serveConnect), or a gateway connection's TCP
// peer. X-Forwarded-For, X-Real-IP and Forwarded decide nothing; they are
// passed on untouched unless the chain's http_connection_manager says
// otherwise (forwarded).

// sanitized is the outcome of sanitize for a request refused or
// redirected.
type sanitized struct {
	code     int    // 0: go on
	location string // for a redirect
	text     string
}

// sanitize rewrites r's target and header in place; see above.
func sanitize(r *http.Request, o urlpath.Options) sanitized {
	if r.Host != "" && !httpguts.ValidHostHeader(r.Host) {
		return sanitized{code: http.StatusBadRequest, text: "malformed Host header"}
	}
	for k := range r.Header {
		if k == "X-Forwarded-Client-Cert" || strings.HasPrefix(k, "X-Envoy-") {
			delete(r.Header, k)
		}
	}
	target := r.RequestURI
	if target == "*" || r.Method == "CONNECT" {
		return sanitized{}
	}
	if !strings.HasPrefix(target, "/") {
		// Absolute form (HTTP/1.1; RFC 9112 section 3.2.2) of an http or
		// https URI only: net/url also takes "x:y", "mailto:a" or "a:/b",
		// which name no path to normalize or authorize (Envoy refuses them
		// too).
		if s := strings.ToLower(r.URL.Scheme); r.URL.Opaque != "" || (s != "http" && s != "https") || !strings.Contains(target, "://") {
			return sanitized{code: http.StatusBadRequest, text: "invalid request target"}
		}
		target = originForm(target)
	}
	target, _, _ = strings.Cut(target, "#")
	path, query, hasQuery := strings.Cut(target, "?")
	np, err := urlpath.Normalize(path, o)
	switch {
	case errors.Is(err, urlpath.ErrEscapedSlash):
		return sanitized{code: http.StatusBadRequest, text: "escaped slash in the path"}
	case err != nil:
		return sanitized{code: http.StatusBadRequest, text: "invalid path"}
	}
	if o.EscapedSlashes == urlpath.UnescapeAndRedirect && urlpath.HasEscapedSlash(path) {
		// Envoy answers a gRPC call 400 rather than a redirect it cannot
		// follow.
		if strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			return sanitized{code: http.StatusBadRequest, text: "escaped slash in the path"}
		}
		loc := np
		if hasQuery {
			loc += "?" + query
		}
		return sanitized{code: http.StatusTemporaryRedirect, location: loc}
	}
	decoded, err := url.PathUnescape(np)
	if err != nil {
		// Only without RFC 3986 normalization, of a path http.ReadRequest
		// would not have let through.
		return sanitized{code: http.StatusBadRequest, text: "invalid path"}
	}
	r.URL.Path, r.URL.RawPath = decoded, np
	r.URL.RawQuery, r.URL.ForceQuery = query, hasQuery && query == ""
	r.URL.Fragment, r.URL.RawFragment = "", ""
	r.RequestURI = r.URL.RequestURI()
	return sanitized{}
}

// originForm is the path and query of an absolute-form target (HTTP/1.1
// only; http.ReadRequest accepted it), as written.
func originForm(target string) string {
	_, rest, ok := strings.Cut(target, "://")
	if !ok {
		return "/"
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[i:]
	} else {
		rest = ""
	}
	if !strings.HasPrefix(rest, "/") {
		rest = "/" + rest
	}
	return rest
}

// forwarded applies the http_connection_manager's host and forwarding
// settings to r, once sanitized:
//
//   - strip_any_host_port: the port leaves the Host (:authority), so that
//     virtual hosts match the name alone and the upstream sees it too, as
//     in Envoy (a CONNECT's authority keeps it).
//   - use_remote_address: the TCP peer (peer, its address; "" when
//     unknown) is appended to X-Forwarded-For
//     (after what the client sent, which is kept and decides nothing), and
//     X-Forwarded-Proto is the connection's scheme, whatever the client
//     said.
func forwarded(r *http.Request, hc *config.HTTP, peer string, scheme string) {
	if hc.StripAnyHostPort && r.Method != http.MethodConnect {
		r.Host = route.StripPort(r.Host)
	}
	if !hc.UseRemoteAddress {
		return
	}
	if peer != "" {
		xff := strings.Join(r.Header["X-Forwarded-For"], ", ")
		if xff != "" {
			xff += ", "
		}
		r.Header["X-Forwarded-For"] = []string{xff + peer}
	}
	r.Header["X-Forwarded-Proto"] = []string{cmp.Or(scheme, "http")}
}

// ownFields are the request fields the proxy sets itself: the trace
// context, the request id and the forwarding fields.
var ownFields = [...]string{"Traceparent", "X-Request-Id", "X-Forwarded-For", "X-Forwarded-Proto"}

// unnominate keeps the client's Connection from naming ownFields. A field
// Connection names is the client's for its own hop (RFC 9110 section
// 7.6.1): its value goes now, and so does its name, which would otherwise
// have the hop-by-hop strip on the way upstream (router.StripHop) take the
// value the proxy set in its place.
func unnominate(h http.Header) {
	conn := h["Connection"]
	for i, f := range conn {
		if !namesOwnField(f) {
			continue
		}
		var kept []string
		for v := range strings.SplitSeq(f, ",") {
			if k := ownField(strings.TrimSpace(v)); k != "" {
				delete(h, k)
				continue
			}
			kept = append(kept, v)
		}
		conn[i] = strings.Join(kept, ",")
	}
}

// namesOwnField reports whether the Connection value f names one of
// ownFields.
func namesOwnField(f string) bool {
	for v := range strings.SplitSeq(f, ",") {
		if ownField(strings.TrimSpace(v)) != "" {
			return true
		}
	}
	return false
}

// ownField returns the one of ownFields that name is, in any case, or "".
func ownField(name string) string {
	for _, k := range ownFields {
		if strings.EqualFold(name, k) {
			return k
		}
	}
	return ""
}
