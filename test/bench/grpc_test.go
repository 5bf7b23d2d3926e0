package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weftmesh/weft/internal/hbone"
)

// The HTTP/2 throughput benchmark's gRPC backend: a gRPC server in pod B,
// its Service (bound to the waypoint, HTTP/2 upstream) and nginx's h2c
// port in the waypoint's namespace.
const (
	grpcHost     = "grpc." + benchNS + ".svc.cluster.local"
	grpcVIP      = "10.96.0.12"
	grpcPort     = 9090
	nginxH2Port  = 8082
	kibGetMethod = "/weft.bench.KiB/Get"
)

// kibService is a one-method gRPC service defined without protoc: Get
// answers any BytesValue with 1 KiB in one, the gRPC counterpart of the
// server app's HTTP answer.
var kibService = func() grpc.ServiceDesc {
	kib := wrapperspb.Bytes(bytes.Repeat([]byte("w"), 1024))
	return grpc.ServiceDesc{
		ServiceName: "weft.bench.KiB",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Get", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var in wrapperspb.BytesValue
			if err := dec(&in); err != nil {
				return nil, err
			}
			return kib, nil
		}}},
	}
}()

// serveGRPC runs the gRPC server (kibService, h2c) in pod B on grpcPort
// until the benchmark ends.
func (p *podPair) serveGRPC(b *testing.B) {
	var ln net.Listener
	err := p.b.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", grpcPort))
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(&kibService, struct{}{})
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	b.Cleanup(func() { srv.Stop(); <-done })
}

// grpcLoad is the HTTP/2 load: 4 connections, each a grpc-go client with
// 4 unary Get calls in flight at all times (16 in all, as many as the
// HTTP/1.1 load's), each answered with 1 KiB. Every connection is open and
// has carried a call before the clock starts, and none may be replaced
// while it runs.
func grpcLoad(b *testing.B, dial func() (net.Conn, error), pids []int, d time.Duration) (rps, cores float64) {
	const conns, streams = 4, 4
	var dials atomic.Int32
	ccs := make([]*grpc.ClientConn, 0, conns)
	defer func() {
		for _, cc := range ccs {
			cc.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	for range conns {
		cc, err := grpc.NewClient("passthrough:///"+grpcHost,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
				dials.Add(1)
				return dial()
			}))
		if err != nil {
			b.Fatal(err)
		}
		ccs = append(ccs, cc)
		if err := getKiB(ctx, cc); err != nil {
			b.Fatal(err)
		}
	}
	rps, cores = drive(b, conns*streams, pids, d, func(i int) error { return getKiB(ctx, ccs[i%conns]) })
	if n := dials.Load(); n != conns {
		b.Fatalf("the gRPC clients dialed %d connections, want %d: one was closed under the load", n, conns)
	}
	return rps, cores
}

// getKiB makes one Get call and checks its answer.
func getKiB(ctx context.Context, cc *grpc.ClientConn) error {
	var out wrapperspb.BytesValue
	if err := cc.Invoke(ctx, kibGetMethod, &wrapperspb.BytesValue{}, &out); err != nil {
		return fmt.Errorf("gRPC Get: %w", err)
	}
	if n := len(out.GetValue()); n != 1024 {
		return fmt.Errorf("gRPC Get answered %d bytes, want 1024", n)
	}
	return nil
}

// waypointH2RPS compares the waypoint's HTTP/2 throughput per core with
// nginx's, as waypointRPS does for HTTP/1.1 and with the same asymmetry:
// the load generator reaches the waypoint as a mesh client does (HBONE,
// h2c with prior knowledge inside each stream) and nginx over plain TCP
// (h2c with prior knowledge); both proxy to the gRPC server in pod B over
// HTTP/2 on plain TCP.
func waypointH2RPS(b *testing.B, p *podPair, wp *waypointProc, nginxBin string) {
	p.setRedirect(b, false) // the load generator in pod A talks to both proxies itself
	p.serveGRPC(b)
	ng := startNginx(b, p, nginxBin, nginxServer{
		listen:  fmt.Sprintf("%s:%d http2", podW, nginxH2Port),
		backend: fmt.Sprintf("%s:%d", podB, grpcPort),
		pass:    "\t\t\tgrpc_pass grpc://backend;",
	})
	hb, src := p.hboneClient(b)
	wpID := benchID("waypoint")
	viaWaypoint := func() (net.Conn, error) {
		return hb.Dial(context.Background(), hbone.Target{Source: src, Peers: []spiffeid.ID{wpID},
			Addr: netip.MustParseAddrPort(podW + ":15008"), Authority: grpcVIP + ":80"})
	}
	viaNginx := func() (net.Conn, error) { return p.dialFromA(fmt.Sprintf("%s:%d", podW, nginxH2Port)) }
	rpsVersusNginx(b, "waypoint_h2", "nginx_h2", grpcLoad, wp, viaWaypoint, ng, viaNginx)
}
