package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

// grpcRoute sends the echo app's streaming service, called through the
// echo-grpc Service, to v2 and everything else to v1: an answer from v2
// can only come through the waypoint.
const grpcRoute = `apiVersion: v1
kind: Service
metadata:
  name: echo-grpc
  namespace: ` + appNS + `
spec:
  selector: {svc: echo}
  ports:
  - {name: grpc, port: 7070, targetPort: grpc, appProtocol: grpc}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: echo-grpc
  namespace: ` + appNS + `
spec:
  parentRefs:
  - {group: "", kind: Service, name: echo-grpc, port: 7070}
  rules:
  - matches:
    - method: {service: weft.echo.v1.Stream}
    backendRefs: [{name: echo-v2, port: 7070}]
  - backendRefs: [{name: echo-v1, port: 7070}]
`

// stream makes one streaming call from the client pod with the echo app.
func (m *mesh) stream(ctx context.Context, t *testing.T, target, mode string, n int) echo.StreamResult {
	t.Helper()
	out, _, err := m.c.Exec(ctx, appNS, m.client.Name, m.c.BinPath("echo"), "stream", "-mode", mode, "-n", fmt.Sprint(n), target)
	var r echo.StreamResult
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		t.Fatalf("stream %s: %v; output %q", mode, err, out)
	}
	return r
}

// TestGRPCStreaming makes a client-streaming, a server-streaming and a
// bidirectional gRPC call through the waypoint, routed by a GRPCRoute:
// every message arrives, in order, both ways; each call ends with status
// OK; and the waypoint counts them as gRPC with grpc_response_status 0.
func TestGRPCStreaming(t *testing.T) {
	m := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := m.c.Apply(ctx, grpcRoute); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.c.Delete(context.Background(), grpcRoute) })
	svc, err := m.c.Client().CoreV1().Services(appNS).Get(ctx, "echo-grpc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	target := fmt.Sprintf("grpc://%s:7070", svc.Spec.ClusterIP)
	err = m.c.WaitFor(ctx, "the waypoint routing the streaming service to v2", func(ctx context.Context) (bool, error) {
		r := m.stream(ctx, t, target, echo.StreamBidi, 1)
		return r.Code == "OK" && strings.HasPrefix(r.Pod, "echo-v2-"), nil
	})
	if err != nil {
		t.Fatal(err)
	}

	const series = "istio_requests_total"
	labels := []string{`reporter="waypoint"`, `request_protocol="grpc"`, `response_code="200"`, `grpc_response_status="0"`}
	before := cluster.SumSeries(m.waypointMetrics(ctx, t), series, labels...)
	const n = 200
	var want []string
	for i := range n {
		want = append(want, echo.StreamMessage(i))
	}
	modes := []string{echo.StreamClient, echo.StreamServer, echo.StreamBidi}
	for _, mode := range modes {
		r := m.stream(ctx, t, target, mode, n)
		if r.Code != "OK" {
			t.Errorf("%s streaming: status %s %s, want OK", mode, r.Code, r.Error)
			continue
		}
		if !slices.Equal(r.Received, want) {
			t.Errorf("%s streaming: received %d messages, %.200q...; want m0 to m%d in order", mode, len(r.Received), r.Received, n-1)
		}
		if mode != echo.StreamServer && !slices.Equal(r.Sent, want) {
			t.Errorf("%s streaming: sent %d messages, want %d", mode, len(r.Sent), n)
		}
		if !strings.HasPrefix(r.Pod, "echo-v2-") {
			t.Errorf("%s streaming: answered by %q, want a v2 pod (the GRPCRoute)", mode, r.Pod)
		}
		t.Logf("%s streaming: sent %d, received %d, status %s, answered by %s", mode, len(r.Sent), len(r.Received), r.Code, r.Pod)
	}
	// The waypoint records a call when it ends; wait for all three.
	var after float64
	err = m.c.WaitFor(ctx, "the waypoint counting the three streams with grpc_response_status 0", func(ctx context.Context) (bool, error) {
		after = cluster.SumSeries(m.waypointMetrics(ctx, t), series, labels...)
		return after >= before+float64(len(modes)), nil
	})
	t.Logf("%s{%s}: %v -> %v", series, strings.Join(labels, ","), before, after)
	if err != nil {
		t.Errorf("%s{%s}: %v -> %v: %v\n%s", series, strings.Join(labels, ","), before, after, err, grep(m.waypointMetrics(ctx, t), series+`{`))
	}
}
