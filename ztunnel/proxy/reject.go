package proxy

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/weftmesh/weft/internal/hbone"
)

// flag is a response flag: why a connection was not proxied, as
// istio_tcp_connections_failed_total's response_flags says it ("-" when
// none).
type flag string

const (
	flagNone    flag = ""        // refused before policy or a dial
	flagDenied  flag = "DENY"    // denied by an AuthorizationPolicy, here or at the peer
	flagConnect flag = "CONNECT" // the app, the upstream or the peer could not be reached
)

// rejection is why a connection is not proxied: the status answering an
// HBONE CONNECT (unused for a plain connection), the flag the metrics and
// the access log record, and the error the access log says.
type rejection struct {
	status int
	flag   flag
	err    error
}

// refuse answers an HBONE CONNECT with rej's status and records it.
func (p *Pod) refuse(r *hbone.Request, lbl *connLabels, dst netip.AddrPort, start time.Time, rej rejection) {
	lbl.flags = rej.flag
	r.Reject(rej.status)
	p.cfg.Metrics.failed.WithLabelValues(lbl.values()...).Inc()
	p.cfg.AccessLog.Warn("connection refused", p.accessAttrs(lbl, r.RemoteAddr, dst, start, 0, 0, rej.err)...)
}

// fail records a plain connection that could not be proxied and closes it
// with a reset, as a refused TCP connection would look.
func (p *Pod) fail(c net.Conn, lbl *connLabels, dst netip.AddrPort, start time.Time, rej rejection) {
	lbl.flags = rej.flag
	reset(c)
	p.cfg.Metrics.failed.WithLabelValues(lbl.values()...).Inc()
	p.cfg.AccessLog.Warn("connection failed", p.accessAttrs(lbl, c.RemoteAddr(), dst, start, 0, 0, rej.err)...)
}

// reset closes c with a TCP reset.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// tunnelFailure is the flag of an HBONE tunnel that could not be opened:
// the peer's 401 is its policy's denial.
func tunnelFailure(err error) flag {
	var se *hbone.StatusError
	if errors.As(err, &se) && se.Code == http.StatusUnauthorized {
		return flagDenied
	}
	return flagConnect
}
