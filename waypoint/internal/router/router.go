// Package router is what the waypoint does with an admitted HTTP request
// once its route is known: Match finds the route (Gateway API HTTPRoute
// and GRPCRoute rules compiled by waypoint/route), Redirect answers a
// redirect route, and a forwarding route becomes a Call: Pick chooses its
// weighted cluster, NewCall readies the upstream request (hop-by-hop
// fields dropped, the route's and the cluster's header changes, the path
// and host rewrites; a small body kept for retries and mirrors), Mirror
// sends the route's mirrors without waiting, and Send makes the attempts
// of the route's retry policy (Envoy's retry_on conditions, exponential
// back-off with jitter, the per-try timeout, the cluster's retry budget)
// through an upstream.Client, returning the response the policy keeps.
//
// Relaying the response (and a protocol switch) to the client, local
// replies and what is logged stay with the caller.
package router

import (
	"context"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/internal/upstream"
	"github.com/weftmesh/weft/waypoint/route"
)

const (
	// maxRetryBody is the largest request body kept for retries and
	// mirrors; a larger one goes once, and its mirrors go without it.
	maxRetryBody = 64 << 10
	// maxMirrors bounds the mirrored requests in flight; past it a mirror
	// is dropped.
	maxMirrors = 64
)

// Router sends routed requests to their clusters.
type Router struct {
	up *upstream.Client
}

// New returns a router sending through up.
func New(up *upstream.Client) *Router {
	return &Router{up: up}
}

// Match returns r's route in hc's route table in snap, or nil. A CONNECT
// (inside the stream) matches no route: the waypoint opens no tunnel of
// its own, as Envoy without a connect_matcher.
func Match(snap *config.Snapshot, hc *config.HTTP, r *http.Request) *route.Route {
	if r.Method == http.MethodConnect {
		return nil
	}
	rq := route.FromHTTP(r)
	return snap.RouteTable(hc).Match(&rq)
}

// Timeout is the time a request on rt may take in all: the route's
// timeout, else hc's request timeout; 0 for none.
func Timeout(rt *route.Route, hc *config.HTTP) time.Duration {
	if rt.Timeout != 0 {
		return rt.Timeout
	}
	return hc.RequestTimeout
}

// Pick chooses one of rt's weighted clusters at random by weight.
func Pick(rt *route.Route) *route.WeightedCluster {
	return rt.Pick(uint32(mrand.Uint64N(uint64(max(rt.TotalWeight, 1)))))
}

// Call is one request on its way to a route's cluster.
type Call struct {
	Snap    *config.Snapshot
	Route   *route.Route
	Cluster string
	// Backend is the weighted cluster picked, with its own header changes.
	Backend *route.WeightedCluster
	// Out is what goes upstream.
	Out *http.Request
	// H2: to the upstream over HTTP/2 (else HTTP/1.1, unless the cluster
	// asks for HTTP/2).
	H2 bool
	// Upgrade is the protocol Out asks to switch to, or "".
	Upgrade string
	// Target is the original destination, where the passthrough cluster
	// connects.
	Target netip.AddrPort

	body     []byte // Out's body, kept for retries and mirrors; nil when not kept
	attempts int    // the attempts Send may make
	h2Down   bool   // NewCall's h2: mirrors go upstream so too
}

// NewCall readies r, routed to rt and its weighted cluster wc, for its
// upstream under ctx, the request's context with its timeout. h2 says r
// goes upstream over HTTP/2 even to a cluster that does not ask for it
// (a waypoint's client spoke HTTP/2); upgrade is the protocol r switches to, or "" (an
// HTTP/2 WebSocket's upgrade goes upstream over HTTP/1.1). r's header is
// edited in place: the caller's server reads it no more once the handler
// runs. A small body is read and kept when the route retries or mirrors;
// the error is that read's.
func NewCall(ctx context.Context, snap *config.Snapshot, rt *route.Route, wc *route.WeightedCluster, r *http.Request, h2 bool, upgrade string) (*Call, error) {
	c := &Call{Snap: snap, Route: rt, Cluster: wc.Name, Backend: wc, H2: h2 && upgrade == "", Upgrade: upgrade, h2Down: h2, attempts: 1}
	out := r.WithContext(ctx)
	out.RequestURI = ""
	out.Close = false // the upstream connection is ours to keep
	StripHop(out.Header)
	if upgrade != "" {
		out.Header.Set("Upgrade", upgrade)
	}
	rt.Request.Apply(out.Header)
	wc.Request.Apply(out.Header)
	out.URL = upstreamURL(r.URL, rt)
	out.URL.Scheme, out.URL.Host = "http", r.Host
	if rt.HostRewrite != "" {
		out.Host = rt.HostRewrite
	}
	c.Out = out
	retryable := rt.Retry != nil && rt.Retry.NumRetries > 0
	hasBody := r.Body != nil && r.Body != http.NoBody
	switch {
	case (retryable || len(rt.Mirrors) > 0) && hasBody && r.ContentLength >= 0 && r.ContentLength <= maxRetryBody:
		b, err := io.ReadAll(io.LimitReader(r.Body, maxRetryBody+1))
		if err != nil {
			return nil, err
		}
		c.body = b
	case retryable && hasBody:
		retryable = false // a body too large to keep goes once
	}
	if retryable {
		c.attempts += rt.Retry.NumRetries
	}
	return c, nil
}

// upstreamURL is the request's URL with the route's path rewrite applied;
// the caller sets its scheme and host.
func upstreamURL(in *url.URL, rt *route.Route) *url.URL {
	path, q, _ := strings.Cut(in.RequestURI(), "?")
	np := rt.RewritePath(path)
	if np == path && in.Opaque == "" && in.Scheme == "" && in.Host == "" && in.User == nil && !in.ForceQuery && in.Fragment == "" {
		u := *in // an origin-form target, unchanged: what parsing it again would give
		return &u
	}
	if q != "" {
		np += "?" + q
	}
	if u, err := in.Parse(np); err == nil {
		return u
	}
	u := *in
	u.Opaque = ""
	return &u
}

// asksTrailers reports whether the Te field value v lists the "trailers"
// member (RFC 9110 section 10.1.4: a comma-separated list of codings, each
// with optional parameters), in any case; "notrailers" or a parameter
// named trailers does not count.
func asksTrailers(v string) bool {
	for m := range strings.SplitSeq(v, ",") {
		name, _, _ := strings.Cut(m, ";")
		if strings.EqualFold(strings.TrimSpace(name), "trailers") {
			return true
		}
	}
	return false
}

// hopHeader reports whether the canonical field name k is one of the
// standard hop-by-hop fields.
func hopHeader(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Te", "Transfer-Encoding", "Upgrade", "Proxy-Authenticate", "Proxy-Authorization":
		return true
	}
	return false
}

// StripHop removes h's hop-by-hop fields (RFC 9110 section 7.6.1): those
// Connection names and the standard ones, keeping "Te: trailers". It runs
// twice per request, so it walks h once rather than deleting each
// standard name (and canonicalizing it) in turn.
func StripHop(h http.Header) {
	te := false
	for _, v := range h["Te"] {
		te = te || asksTrailers(v)
	}
	for _, f := range h["Connection"] {
		for v := range strings.SplitSeq(f, ",") {
			h.Del(strings.TrimSpace(v))
		}
	}
	for k := range h {
		if hopHeader(k) {
			delete(h, k)
		}
	}
	if te {
		h["Te"] = []string{"trailers"}
	}
}
