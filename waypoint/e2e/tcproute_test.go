package e2e

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/test/cluster"
)

// otherNS holds a TCPRoute that names a Service of appNS as its parent.
const otherNS = "wp-tcp-other"

// tcpWaypoint serves echo-tcp: the namespace's waypoint carries a DENY on
// paths, which on TCP chains denies every stream (Istio's rule for the
// fields a stream does not have).
var tcpWaypoint = cluster.WaypointGateway(appNS, "waypoint-tcp")

// tcpService is a TCP-only port (appProtocol tcp: the waypoint relays its
// bytes, never parses them) to the echo's TCP port, whose server speaks
// first (a JSON line naming its pod), in front of echo v1 only, so that an
// answer of v2 can only come from a TCPRoute.
const tcpService = `apiVersion: v1
kind: Service
metadata:
  name: echo-tcp
  namespace: ` + appNS + `
  labels: {istio.io/use-waypoint: waypoint-tcp}
spec:
  selector: {svc: echo, version: v1}
  ports:
  - {name: data, port: 9000, targetPort: tcp, appProtocol: tcp}
`

// tcpRoute splits echo-tcp's connections between the versions' Services.
func tcpRoute(w1, w2 int) string {
	return fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata:
  name: echo-tcp
  namespace: %s
spec:
  parentRefs:
  - {group: "", kind: Service, name: echo-tcp, port: 9000}
  rules:
  - backendRefs:
    - {name: echo-v1, port: 9090, weight: %d}
    - {name: echo-v2, port: 9090, weight: %d}
`, appNS, w1, w2)
}

// consumerTCPRoute is another namespace's TCPRoute for echo-tcp (a
// consumer route, which waypoints do not apply), to a Service of its own
// namespace without endpoints: were it applied, connections would fail.
const consumerTCPRoute = `apiVersion: v1
kind: Service
metadata:
  name: sink
  namespace: ` + otherNS + `
spec:
  ports:
  - {name: data, port: 9000}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata:
  name: steal
  namespace: ` + otherNS + `
spec:
  parentRefs:
  - {group: "", kind: Service, name: echo-tcp, namespace: ` + appNS + `, port: 9000}
  rules:
  - backendRefs: [{name: sink, port: 9000}]
`

// tcpRouteConditions returns the conditions the waypoint controller wrote
// on a TCPRoute for its parentRef to echo-tcp, as
// "<type>=<status>/<reason>".
func tcpRouteConditions(ctx context.Context, gw gwclient.Interface, ns, name string) (map[string]string, error) {
	r, err := gw.GatewayV1().TCPRoutes(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return parentConditions(r.Status.Parents, "echo-tcp", r.Generation), nil
}

// tcpAnswers opens n connections from the client pod to addr and counts
// who answered: "v1", "v2", or "error" (refused, reset or no answer).
func (m *mesh) tcpAnswers(t *testing.T, addr string, n int) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rs, err := m.c.Request(ctx, appNS, m.client.Name, "tcp://"+addr, n)
	got := byVersion(rs)
	if missing := n - len(rs); missing > 0 {
		got["error"] += missing
		t.Logf("%d connections to %s: %d results (%v)", n, addr, len(rs), err)
	}
	return got
}

// logWaypoint logs the tail of the log of appNS's waypoint name, for a
// failure.
func (m *mesh) logWaypoint(t *testing.T, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := m.c.WaitPods(ctx, appNS, "gateway.networking.k8s.io/gateway-name="+name, 1)
	if err != nil {
		return
	}
	logs, _ := m.c.Logs(appNS, pods[0].Name, pods[0].Spec.Containers[0].Name)
	if len(logs) > 4000 {
		logs = logs[len(logs)-4000:]
	}
	t.Logf("waypoint log (tail):\n%s", logs)
}

// TestTCPRouteSplit: a TCPRoute on a TCP port of a Service bound to the
// waypoint splits its connections by weight (1:1 reaches both versions,
// 0:1 only v2) and shows Accepted. A TCPRoute of another namespace naming
// the same Service is not applied, says so in its status, and redirects
// none of the Service's connections.
func TestTCPRouteSplit(t *testing.T) {
	m := setup(t)
	c := m.c
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gw := m.gw
	t.Cleanup(func() {
		if t.Failed() {
			m.logWaypoint(t, "waypoint-tcp")
		}
	})
	wait := func(ns, name string, want map[string]string) {
		t.Helper()
		waitConditions(ctx, t, c, "TCPRoute "+ns+"/"+name, want, func(ctx context.Context) (map[string]string, error) {
			return tcpRouteConditions(ctx, gw, ns, name)
		})
	}
	// waitAll waits until k connections in a row are answered by version.
	waitAll := func(addr, version string, k int) {
		t.Helper()
		var last map[string]int
		err := c.WaitFor(ctx, fmt.Sprintf("%d connections in a row to %s answered by %s", k, addr, version), func(ctx context.Context) (bool, error) {
			last = m.tcpAnswers(t, addr, k)
			return last[version] == k, nil
		})
		if err != nil {
			t.Fatalf("%v; last seen %v", err, last)
		}
	}

	manifest := tcpWaypoint + "---\n" + tcpService + "---\n" + cluster.NamespaceManifest(otherNS, nil) + "---\n" + consumerTCPRoute
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), tcpRoute(1, 1))
		_ = c.Delete(context.Background(), manifest)
	})
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeployment(ctx, appNS, "waypoint-tcp"); err != nil {
		t.Fatal(err)
	}
	if err := waitProgrammed(ctx, c, appNS, "waypoint-tcp"); err != nil {
		t.Fatal(err)
	}
	svc, err := c.Client().CoreV1().Services(appNS).Get(ctx, "echo-tcp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "9000")

	// The consumer route: not applied, and its status says why.
	wait(otherNS, "steal", map[string]string{"Accepted": "False/UnsupportedValue", "ResolvedRefs": "True/ResolvedRefs"})
	waitAll(addr, "v1", 5)
	if got := m.tcpAnswers(t, addr, 20); got["v1"] != 20 {
		t.Errorf("with only another namespace's TCPRoute: %v, want all 20 connections to the Service itself (v1)", got)
	}

	// The producer route, 1:1.
	if err := c.Apply(ctx, tcpRoute(1, 1)); err != nil {
		t.Fatal(err)
	}
	wait(appNS, "echo-tcp", map[string]string{"Accepted": "True/Accepted", "ResolvedRefs": "True/ResolvedRefs"})
	err = c.WaitFor(ctx, "a connection to echo-tcp answered by v2", func(ctx context.Context) (bool, error) {
		return m.tcpAnswers(t, addr, 1)["v2"] == 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	got := m.tcpAnswers(t, addr, n)
	if got["v1"]+got["v2"] != n || got["v1"] == 0 || got["v2"] == 0 {
		t.Errorf("1:1 over %d connections: %v, want both versions and no failure", n, got)
	}
	t.Logf("TCPRoute 1:1 over %d connections: %v", n, got)

	// 0:1: everything to v2.
	if err := c.Apply(ctx, tcpRoute(0, 1)); err != nil {
		t.Fatal(err)
	}
	waitAll(addr, "v2", 5)
	if got := m.tcpAnswers(t, addr, 20); got["v2"] != 20 {
		t.Errorf("0:1: %v, want all 20 connections to v2", got)
	}
	wait(appNS, "echo-tcp", map[string]string{"Accepted": "True/Accepted", "ResolvedRefs": "True/ResolvedRefs"})
	// The consumer route still redirects nothing and is still refused.
	wait(otherNS, "steal", map[string]string{"Accepted": "False/UnsupportedValue", "ResolvedRefs": "True/ResolvedRefs"})
}
