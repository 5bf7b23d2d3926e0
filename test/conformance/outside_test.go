package conformance

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "sigs.k8s.io/gateway-api/conformance/echo-basic/grpcechoserver"
	"sigs.k8s.io/gateway-api/conformance/utils/config"
	confgrpc "sigs.k8s.io/gateway-api/conformance/utils/grpc"
	"sigs.k8s.io/gateway-api/conformance/utils/roundtripper"
)

// outsideGRPC is the suite's gRPC client (grpc-go, plaintext h2) with its
// connections opened from outside the nodes, as the HTTP requests are:
// one connection per address and authority, kept for the run. It is safe
// for concurrent calls (GRPCRouteWeight samples from several goroutines).
type outsideGRPC struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	mu    sync.Mutex
	conns map[[2]string]*grpc.ClientConn // guarded by mu: by address, authority
}

func newOutsideGRPC(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *outsideGRPC {
	return &outsideGRPC{dial: dial, conns: map[[2]string]*grpc.ClientConn{}}
}

func (g *outsideGRPC) conn(address, authority string) (*grpc.ClientConn, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	key := [2]string{address, authority}
	if c := g.conns[key]; c != nil {
		return c, nil
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return g.dial(ctx, "tcp", addr) }),
	}
	if authority != "" {
		opts = append(opts, grpc.WithAuthority(authority))
	}
	c, err := grpc.NewClient("passthrough:///"+address, opts...)
	if err != nil {
		return nil, err
	}
	g.conns[key] = c
	return c, nil
}

// forget closes and drops a connection, so that the next call dials anew
// (after an Internal error the connection may be the broken part).
func (g *outsideGRPC) forget(address, authority string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	key := [2]string{address, authority}
	if c := g.conns[key]; c != nil {
		c.Close()
		delete(g.conns, key)
	}
}

// SendRPC makes the call expected names and returns its code, headers,
// trailers and answer; an error only when the call could not be made.
func (g *outsideGRPC) SendRPC(t *testing.T, address string, expected confgrpc.ExpectedResponse, timeout time.Duration) (*confgrpc.Response, error) {
	t.Helper()
	var authority string
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if md := expected.RequestMetadata; md != nil {
		authority = md.Authority
		if len(md.Metadata) > 0 {
			ctx = metadata.NewOutgoingContext(ctx, metadata.New(md.Metadata))
		}
	}
	c, err := g.conn(address, authority)
	if err != nil {
		return &confgrpc.Response{}, err
	}
	resp := &confgrpc.Response{Headers: &metadata.MD{}, Trailers: &metadata.MD{}}
	stub := pb.NewGrpcEchoClient(c)
	opts := []grpc.CallOption{grpc.Header(resp.Headers), grpc.Trailer(resp.Trailers)}
	switch {
	case expected.EchoRequest != nil:
		resp.Response, err = stub.Echo(ctx, expected.EchoRequest, opts...)
	case expected.EchoTwoRequest != nil:
		resp.Response, err = stub.EchoTwo(ctx, expected.EchoTwoRequest, opts...)
	case expected.EchoThreeRequest != nil:
		resp.Response, err = stub.EchoThree(ctx, expected.EchoThreeRequest, opts...)
	default:
		return resp, errors.New("the expected response names no request")
	}
	resp.Code = status.Code(err)
	if err != nil {
		t.Logf("RPC to %s (authority %q): %v", address, authority, err)
		if resp.Code == codes.Internal {
			g.forget(address, authority)
		}
	}
	return resp, nil
}

// Close closes every connection.
func (g *outsideGRPC) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, c := range g.conns {
		c.Close()
		delete(g.conns, k)
	}
}

// outsideWebSocket is the suite's WebSocket dialer (x/net/websocket) with
// its connections opened from outside the nodes; ws:// only, as the
// suite's Gateway tests ask.
type outsideWebSocket struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (d outsideWebSocket) Dial(url, protocol, origin string) (*websocket.Conn, error) {
	cfg, err := websocket.NewConfig(url, origin)
	if err != nil {
		return nil, err
	}
	if cfg.Location.Scheme != "ws" {
		return nil, fmt.Errorf("WebSocket URL %s: only ws:// is dialed from outside", url)
	}
	if protocol != "" {
		cfg.Protocol = []string{protocol}
	}
	addr := cfg.Location.Host
	if cfg.Location.Port() == "" {
		addr = net.JoinHostPort(addr, "80")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := d.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	ws, err := websocket.NewClient(cfg, c)
	if err != nil {
		c.Close()
		return nil, err
	}
	return ws, nil
}

// outsideRoundTripper is the suite's RoundTripper with every request sent
// from outside the nodes. The suite's DefaultRoundTripper uses its
// CustomDialContext for HTTP/1.1 alone: its HTTP/2 transports (h2 over
// TLS, as the misdirected-request test asks, and h2c with prior
// knowledge) dial the address themselves, so those two are made here with
// net/http's HTTP/2 over the same dialer (HTTP/2 only, as the suite's
// x/net transports: no fallback to HTTP/1.1), and what they capture is
// read as the suite reads it.
type outsideRoundTripper struct {
	http1 *roundtripper.DefaultRoundTripper
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	// timeout bounds one request (the suite's RequestTimeout).
	timeout time.Duration
}

var _ roundtripper.RoundTripper = (*outsideRoundTripper)(nil)

func newOutsideRoundTripper(dial func(ctx context.Context, network, addr string) (net.Conn, error), timeouts config.TimeoutConfig) *outsideRoundTripper {
	return &outsideRoundTripper{http1: &roundtripper.DefaultRoundTripper{CustomDialContext: dial, TimeoutConfig: timeouts},
		dial: dial, timeout: timeouts.RequestTimeout}
}

func (o *outsideRoundTripper) CaptureRoundTrip(r roundtripper.Request) (*roundtripper.CapturedRequest, *roundtripper.CapturedResponse, error) {
	tr := &http.Transport{DialContext: o.dial, Protocols: new(http.Protocols)}
	switch r.Protocol {
	case roundtripper.H2CPriorKnowledgeProtocol:
		if r.ServerName != "" && len(r.ServerCertificate) > 0 {
			return nil, nil, errors.New("h2c with prior knowledge is not encrypted, yet the request names a server certificate")
		}
		tr.Protocols.SetUnencryptedHTTP2(true)
	case roundtripper.H2Protocol:
		conf, err := suiteTLSConfig(r)
		if err != nil {
			return nil, nil, err
		}
		tr.TLSClientConfig = conf
		tr.Protocols.SetHTTP2(true)
	default:
		return o.http1.CaptureRoundTrip(r)
	}
	defer tr.CloseIdleConnections()
	return o.capture(r, tr)
}

// suiteTLSConfig is the client TLS configuration the suite gives an h2
// request: its server name, its certificate as the only root, its client
// certificate hook.
func suiteTLSConfig(r roundtripper.Request) (*tls.Config, error) {
	if r.ServerName == "" || len(r.ServerCertificate) == 0 {
		return nil, errors.New("an h2 request needs a server name and a server certificate")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(r.ServerCertificate) {
		return nil, errors.New("the request's server certificate is not PEM")
	}
	return &tls.Config{ServerName: r.ServerName, RootCAs: roots, GetClientCertificate: r.GetClientCertificateHook}, nil
}

// capture sends r through tr and reads the answer as the suite's
// DefaultRoundTripper does: the echo server's JSON account of the request
// it saw, the response's status, protocol, headers, certificates and
// redirect.
func (o *outsideRoundTripper) capture(r roundtripper.Request, tr http.RoundTripper) (*roundtripper.CapturedRequest, *roundtripper.CapturedResponse, error) {
	client := &http.Client{Transport: tr}
	if r.UnfollowRedirect {
		client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	method := cmp.Or(r.Method, http.MethodGet)
	var body io.Reader
	if r.Body != "" {
		body = strings.NewReader(r.Body)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.URL.String(), body)
	if err != nil {
		return nil, nil, err
	}
	if r.Host != "" {
		req.Host = r.Host
	}
	for name, vs := range r.Headers {
		req.Header.Set(name, vs[0])
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	cReq := &roundtripper.CapturedRequest{}
	if resp.Header.Get("Content-Type") == "application/json" {
		if err := json.Unmarshal(b, cReq); err != nil {
			return nil, nil, fmt.Errorf("reading the echo server's answer: %w", err)
		}
	} else {
		cReq.Method = method // not the echo server: assume it saw what was sent
	}
	cRes := &roundtripper.CapturedResponse{StatusCode: resp.StatusCode, ContentLength: resp.ContentLength,
		Protocol: resp.Proto, Headers: resp.Header}
	if resp.TLS != nil {
		cRes.PeerCertificates = resp.TLS.PeerCertificates
	}
	if roundtripper.IsRedirect(resp.StatusCode) {
		loc, err := resp.Location()
		if err != nil {
			return nil, nil, err
		}
		cRes.RedirectRequest = &roundtripper.RedirectRequest{Scheme: loc.Scheme, Host: loc.Hostname(), Port: loc.Port(), Path: loc.Path}
	}
	return cReq, cRes, nil
}
