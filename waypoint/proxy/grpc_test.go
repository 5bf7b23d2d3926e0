package proxy

import (
	"context"
	"net"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// failDesc is a one-method service defined without protoc: it answers one
// message, then fails with PERMISSION_DENIED and a trailer of its own, so
// the status travels in real trailers after DATA.
var failDesc = grpc.ServiceDesc{
	ServiceName: "weft.test.Flaky",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{StreamName: "Fail", ServerStreams: true, Handler: func(_ any, st grpc.ServerStream) error {
		var in healthpb.HealthCheckRequest
		if err := st.RecvMsg(&in); err != nil {
			return err
		}
		st.SetTrailer(metadata.Pairs("x-why", "because"))
		if err := st.SendMsg(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
			return err
		}
		return status.Error(codes.PermissionDenied, "not today: "+in.GetService())
	}}},
}

// TestGRPC: a gRPC client on an HBONE stream to the waypoint (h2c prior
// knowledge) reaches a real gRPC server behind an HTTP/2 cluster; statuses
// and trailers come back unchanged and server streams flow message by
// message.
func TestGRPC(t *testing.T) {
	m := newMesh(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus("echo", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	gs.RegisterService(&failDesc, struct{}{})
	done := make(chan struct{})
	go func() { gs.Serve(ln); close(done) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	m.applyClusters([]*routev3.Route{{Match: prefix("/"), Action: toCluster("grpc")}},
		map[string]clusterSpec{"grpc": {eps: []endpointSpec{{addr: ln.Addr().(*net.TCPAddr).AddrPort()}}, http2: true}})

	cc, err := grpc.NewClient("passthrough:///"+svcHost+":80",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return m.dial(vip) }))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(cc)

	var trailer metadata.MD
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "echo"}, grpc.Trailer(&trailer))
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check: %v %v", resp, err)
	}

	// An error status before any message (a trailers-only response).
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "nope"})
	if st := status.Convert(err); st.Code() != codes.NotFound || st.Message() != "unknown service" {
		t.Errorf("Check of an unknown service: %v, want NotFound \"unknown service\"", err)
	}

	// An error status in trailers after a message.
	fs, err := cc.NewStream(ctx, &failDesc.Streams[0], "/weft.test.Flaky/Fail")
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.SendMsg(&healthpb.HealthCheckRequest{Service: "x"}); err != nil {
		t.Fatal(err)
	}
	fs.CloseSend()
	var msg healthpb.HealthCheckResponse
	if err := fs.RecvMsg(&msg); err != nil {
		t.Fatalf("first message: %v", err)
	}
	err = fs.RecvMsg(&msg)
	if st := status.Convert(err); st.Code() != codes.PermissionDenied || st.Message() != "not today: x" {
		t.Errorf("status after a message: %v, want PermissionDenied \"not today: x\"", err)
	}
	if got := fs.Trailer().Get("x-why"); len(got) != 1 || got[0] != "because" {
		t.Errorf("trailer x-why = %q, want [because]", got)
	}

	// Each status is counted under its code: OK, NOT_FOUND in a
	// trailers-only response, PERMISSION_DENIED in trailers after DATA.
	// (The waypoint records a request once its response has gone out,
	// which can be just after the client has it.)
	for code, want := range map[string]float64{"0": 1, "5": 1, "7": 1} {
		got := 0.0
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if got = m.counted(t, "grpc_response_status", code); got == want {
				break
			}
		}
		if got != want {
			t.Errorf("istio_requests_total{grpc_response_status=%q} = %v, want %v", code, got, want)
		}
	}
	// Messages each way: one request each; responses from the first Check
	// and from Fail, none from the trailers-only NOT_FOUND.
	if got := m.sum(t, "istio_request_messages_total"); got != 3 {
		t.Errorf("istio_request_messages_total = %v, want 3", got)
	}
	if got := m.sum(t, "istio_response_messages_total"); got != 2 {
		t.Errorf("istio_response_messages_total = %v, want 2", got)
	}

	// A server stream delivers each message as it is sent.
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch first: %v %v", r, err)
	}
	hs.SetServingStatus("echo", healthpb.HealthCheckResponse_NOT_SERVING)
	if r, err := w.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch update: %v %v", r, err)
	}
}
