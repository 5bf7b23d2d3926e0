package controlplane_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/weftmesh/weft/controlplane"
)

// TestGRPCHealth checks the standard gRPC health service on both gRPC
// ports, as a grpc-go client sees it: SERVING while the control plane
// serves, NOT_SERVING to a watcher once it begins to drain, and no more
// watches held open at once than the bound, whoever asks.
func TestGRPCHealth(t *testing.T) {
	c := realAPI(t)
	cp := startControlPlane(t, c, "weft-health", nil)
	ctx := ctxFor(t, time.Minute)
	dial := func(addr string, creds credentials.TransportCredentials) healthpb.HealthClient {
		t.Helper()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return healthpb.NewHealthClient(conn)
	}
	secure := dial(cp.secureAddr(), credentials.NewTLS(cp.tlsConfig(t)))
	plain := dial(cp.cp.Addr("plaintext").String(), insecure.NewCredentials())
	for name, hc := range map[string]healthpb.HealthClient{"secure": secure, "plaintext": plain} {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s Check: %v, %v; want SERVING", name, resp.GetStatus(), err)
		}
	}
	// A service name the server does not know is NotFound, not SERVING.
	if _, err := secure.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"}); code(err).String() != "NotFound" {
		t.Errorf("Check of an unknown service: %v, want NotFound", err)
	}

	// Nobody holds the server's goroutines without a token: watches are
	// bounded across both ports, the rest refused at once, and Check still
	// answers.
	openWatch := func(wctx context.Context, hc healthpb.HealthClient) error {
		w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv() // open once it has answered
		}
		return err
	}
	// watchErr opens a watch and ends it once it has its first answer.
	watchErr := func(hc healthpb.HealthClient) error {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		return openWatch(wctx, hc)
	}
	hold, release := context.WithCancel(ctx)
	for i := range controlplane.MaxHealthWatches {
		hc := plain
		if i == 0 {
			hc = secure
		}
		if err := openWatch(hold, hc); err != nil {
			t.Fatalf("watch %d, within the bound: %v", i+1, err)
		}
	}
	for name, hc := range map[string]healthpb.HealthClient{"secure": secure, "plaintext": plain} {
		if err := watchErr(hc); code(err).String() != "ResourceExhausted" {
			t.Errorf("%s: a watch beyond the bound: %v, want ResourceExhausted", name, err)
		}
		if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s Check with the watches full: %v, %v", name, resp.GetStatus(), err)
		}
	}
	release()
	deadline := time.Now().Add(10 * time.Second)
	for code(watchErr(plain)).String() == "ResourceExhausted" {
		// A watch's slot is free once its server side has seen the cancel.
		if time.Now().After(deadline) {
			t.Fatal("watch slots were not freed after their callers left")
		}
		time.Sleep(10 * time.Millisecond)
	}

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watch, err := secure.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch: %v, %v; want SERVING first", resp.GetStatus(), err)
	}
	stopped := make(chan struct{})
	go func() { cp.stop(); close(stopped) }()
	resp, err := watch.Recv()
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("Watch while the control plane stops: %v, %v; want NOT_SERVING", resp.GetStatus(), err)
	}
	stopWatch() // the drain waits for the stream to end
	<-stopped
}
