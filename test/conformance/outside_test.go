package conformance

import (
	"context"
	"errors"
	"fmt"
	"net"
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
	confgrpc "sigs.k8s.io/gateway-api/conformance/utils/grpc"
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
