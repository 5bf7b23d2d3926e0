// Package grpcwire is a small gRPC client (the "gRPC over HTTP2" protocol,
// github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md) on net/http's
// HTTP/2 transport, for the data plane's two calls to the control plane:
// the CA's unary CreateCertificate and the delta ADS stream.
//
// It exists so that ztunnel does not link google.golang.org/grpc: the
// node proxy's memory is mostly its binary's pages and the heap its
// packages build at start-up, and net/http, which ztunnel serves its admin
// and metrics with, already carries an HTTP/2 client. It speaks only what
// those calls need: identity encoding (a compressed message is refused),
// metadata as request headers, the status in the trailers (or in a
// Trailers-Only response), and a bound on the size of a message received.
package grpcwire

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Config configures a Conn.
type Config struct {
	// Address is the server's host:port. Required.
	Address string
	// TLS secures the connection (HTTP/2 is negotiated with ALPN); nil
	// means HTTP/2 over cleartext with prior knowledge (tests).
	TLS *tls.Config
	// Dial, when set, opens the TCP connection (network namespaces, tests).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// MaxRecvSize bounds one message received; default 4 MiB, gRPC's.
	MaxRecvSize int
}

// DefaultMaxRecvSize is gRPC's default bound on a message received.
const DefaultMaxRecvSize = 4 << 20

// Conn is an HTTP/2 connection to one server, made on first use and again
// after it fails. It is safe for concurrent use.
type Conn struct {
	cfg    Config
	scheme string
	rt     *http.Transport
}

// New returns a Conn; it connects on the first call.
func New(cfg Config) (*Conn, error) {
	host, port, err := net.SplitHostPort(cfg.Address)
	if err == nil && host == "" {
		err = errors.New("no host")
	}
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		return nil, fmt.Errorf("grpc address %q is not host:port: %w", cfg.Address, err)
	}
	if cfg.MaxRecvSize <= 0 {
		cfg.MaxRecvSize = DefaultMaxRecvSize
	}
	// No HTTP/2 pings: gRPC servers by default answer a client that pings
	// more often than every five minutes with GOAWAY (too_many_pings), as
	// gRPC's own client, which does not ping either, expects. A dead peer is
	// found by TCP keepalive, which the dialer turns on.
	rt := &http.Transport{
		Protocols:           new(http.Protocols),
		MaxIdleConnsPerHost: 1,
		ForceAttemptHTTP2:   true,
	}
	dial := cfg.Dial
	if dial == nil {
		d := &net.Dialer{Timeout: 10 * time.Second}
		dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	rt.DialContext = func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) }
	c := &Conn{cfg: cfg, rt: rt, scheme: "https"}
	if cfg.TLS != nil {
		tc := cfg.TLS.Clone()
		tc.NextProtos = []string{"h2"}
		rt.TLSClientConfig = tc
		rt.Protocols.SetHTTP2(true)
	} else {
		c.scheme = "http"
		rt.Protocols.SetUnencryptedHTTP2(true)
	}
	return c, nil
}

// Close closes the idle connection; calls in flight end with their contexts.
func (c *Conn) Close() error {
	c.rt.CloseIdleConnections()
	return nil
}

// newRequest builds the POST that carries a call of method
// ("/package.Service/Method") with metadata md and body.
func (c *Conn) newRequest(ctx context.Context, method string, md map[string]string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.scheme+"://"+c.cfg.Address+method, body)
	if err != nil {
		return nil, err
	}
	h := req.Header
	for k, v := range md {
		h.Set(k, v)
	}
	h.Set("content-type", "application/grpc")
	h.Set("te", "trailers")
	h.Set("user-agent", "weft-grpcwire")
	if dl, ok := ctx.Deadline(); ok {
		h.Set("grpc-timeout", timeout(time.Until(dl)))
	}
	return req, nil
}

// timeout is a grpc-timeout value: at most 8 digits and a unit.
func timeout(d time.Duration) string {
	if d <= 0 {
		return "1n"
	}
	for _, u := range []struct {
		unit string
		d    time.Duration
	}{{"n", time.Nanosecond}, {"u", time.Microsecond}, {"m", time.Millisecond}, {"S", time.Second}, {"M", time.Minute}} {
		if v := d / u.d; v < 1e8 {
			return fmt.Sprintf("%d%s", v, u.unit)
		}
	}
	return fmt.Sprintf("%dH", min(d/time.Hour, 1e8-1))
}

// errNoHTTP2 is returned when the server answered over HTTP/1.
var errNoHTTP2 = errors.New("the server did not speak HTTP/2")

// checkResponse turns an HTTP response into the call's error, if its
// headers already end the call.
func checkResponse(resp *http.Response) error {
	if resp.ProtoMajor != 2 {
		return errNoHTTP2
	}
	// A Trailers-Only response carries the status in its headers.
	if resp.Header.Get("grpc-status") != "" {
		return statusFrom(resp.Header)
	}
	if resp.StatusCode != http.StatusOK {
		return &Error{Code: httpCode(resp.StatusCode), Message: fmt.Sprintf("HTTP status %d", resp.StatusCode)}
	}
	if ct := resp.Header.Get("content-type"); !strings.HasPrefix(ct, "application/grpc") {
		return &Error{Code: Unknown, Message: fmt.Sprintf("the response's content-type is %q, not application/grpc", ct)}
	}
	if enc := resp.Header.Get("grpc-encoding"); enc != "" && enc != "identity" {
		return &Error{Code: Internal, Message: fmt.Sprintf("the server chose encoding %q, which was not offered", enc)}
	}
	return nil
}
