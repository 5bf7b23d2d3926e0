package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/weftmesh/weft/waypoint/internal/upstream"
)

// flag is an Envoy response flag: why a request did not get its
// upstream's response, as the access log's and istio_requests_total's
// response_flags say it ("-" when none).
type flag string

const (
	flagRBAC                 flag = "RBAC" // denied by an AuthorizationPolicy
	flagNoRoute              flag = "NR"   // no route, or a CONNECT
	flagDownstreamProtocol   flag = "DPE"  // not HTTP on an HTTP port
	flagUpstreamProtocol     flag = "UPE"  // the upstream switched protocols unasked
	flagUpstreamTimeout      flag = "UT"   // the route's or the attempt's timeout
	flagOverflow             flag = "UO"   // the cluster's circuit breaker
	flagNoHealthy            flag = "UH"   // no endpoint to send to
	flagConnectFailure       flag = "UF"   // the upstream could not be reached
	flagUpstreamReset        flag = "UR"   // the upstream broke off its response
	flagDownstreamConnection flag = "DC"   // the client left
)

// localReply is an answer the waypoint gives itself: its status, its body
// and the flag that says why.
type localReply struct {
	code int
	body string
	flag flag
	// header, when set, is added to the answer's.
	header http.Header
}

// The local replies that have one wording (Envoy's, where Envoy has one).
var (
	replyDenied          = localReply{code: http.StatusForbidden, body: "RBAC: access denied", flag: flagRBAC}
	replyNoRoute         = localReply{code: http.StatusNotFound, body: "route not found", flag: flagNoRoute}
	replyMisdirected     = localReply{code: http.StatusMisdirectedRequest, body: "misdirected request"}
	replyUpgradeRefused  = localReply{code: http.StatusForbidden, body: "upgrade not allowed"}
	replyBadBody         = localReply{code: http.StatusBadRequest, body: "reading request body"}
	replyUnaskedSwitch   = localReply{code: http.StatusBadGateway, body: "upstream switched protocols unasked", flag: flagUpstreamProtocol}
	replyNoWebSocket     = localReply{code: http.StatusBadGateway, body: "upstream did not open the WebSocket session", flag: flagUpstreamProtocol}
	replyUpstreamTimeout = localReply{code: http.StatusGatewayTimeout, body: "upstream request timeout", flag: flagUpstreamTimeout}
	replyOverflow        = localReply{code: http.StatusServiceUnavailable, flag: flagOverflow,
		body:   "upstream connect error or disconnect/reset before headers. reset reason: overflow",
		header: http.Header{"X-Envoy-Overloaded": {"true"}}}
	replyNoHealthy      = localReply{code: http.StatusServiceUnavailable, body: "no healthy upstream", flag: flagNoHealthy}
	replyConnectFailure = localReply{code: http.StatusServiceUnavailable, body: "upstream connect error or disconnect/reset before headers", flag: flagConnectFailure}
)

// reply answers the request with r in place of anything its header held,
// and records r's flag.
func reply(w http.ResponseWriter, info *reqInfo, r localReply) {
	h := w.Header()
	for k := range h {
		delete(h, k)
	}
	for k, vs := range r.header {
		h[k] = vs
	}
	info.flags = r.flag
	h.Set("content-type", "text/plain")
	w.WriteHeader(r.code)
	io.WriteString(w, r.body)
}

// upstreamFailure is the answer to a request no attempt got a response
// for.
func upstreamFailure(err error) localReply {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return replyUpstreamTimeout
	case errors.Is(err, upstream.ErrOverloaded):
		return replyOverflow
	case errors.Is(err, upstream.ErrNoHealthy):
		return replyNoHealthy
	}
	return replyConnectFailure
}

// brokenOff is the flag of a response whose body broke off: ctx is the
// request's.
func brokenOff(ctx context.Context) flag {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return flagUpstreamTimeout
	case ctx.Err() != nil:
		return flagDownstreamConnection
	}
	return flagUpstreamReset
}
