package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

// farNS holds a backend that routes of appNS may use only with its
// namespace's leave: a ReferenceGrant there.
const farNS = "wp-far"

// farRoute sends /far of the echo Service to echo-far in farNS.
const farRoute = `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: echo-far
  namespace: ` + appNS + `
spec:
  parentRefs:
  - {group: "", kind: Service, name: echo, port: 80}
  rules:
  - matches:
    - path: {type: PathPrefix, value: /far}
    backendRefs: [{name: echo-far, namespace: ` + farNS + `, port: 80}]
`

// grant returns a ReferenceGrant in ns from routes of kind in fromNS to
// the Service name (every Service when name is "").
func grant(ns, name, kind, fromNS, to string) string {
	toName := ""
	if to != "" {
		toName = ", name: " + to
	}
	return fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata:
  name: %s
  namespace: %s
spec:
  from: [{group: gateway.networking.k8s.io, kind: %s, namespace: %s}]
  to: [{group: "", kind: Service%s}]
`, name, ns, kind, fromNS, toName)
}

// TestCrossNamespaceBackend: a route's backend in another namespace is
// refused (RefNotPermitted, and the rule answers 500) until a ReferenceGrant
// there lets the route's namespace refer to it; grants for another kind,
// another Service, another namespace's routes, or placed in the route's own
// namespace do not. Deleting the grant takes the backend away again.
func TestCrossNamespaceBackend(t *testing.T) {
	m := setup(t)
	c := m.c
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gw := m.gw
	wait := func(want map[string]string) {
		t.Helper()
		waitConditions(ctx, t, c, "HTTPRoute echo-far", want, func(ctx context.Context) (map[string]string, error) {
			got, _, err := routeConditions(ctx, gw, "echo-far")
			return got, err
		})
	}
	// answers counts who answered n requests to /far: "far", or
	// byVersion's "HTTP <code>"/"error".
	answers := func(n int) map[string]int {
		out := map[string]int{}
		for _, r := range m.send(t, "/far", n) {
			if r.Response != nil && strings.HasPrefix(r.Response.Pod, "echo-far-") {
				out["far"]++
				continue
			}
			for k, v := range byVersion([]echo.Result{r}) {
				out[k] += v
			}
		}
		return out
	}

	// Grants that must not open echo-far to routes of appNS.
	useless := grant(farNS, "for-grpc", "GRPCRoute", appNS, "echo-far") + "---\n" +
		grant(farNS, "other-service", "HTTPRoute", appNS, "echo-v9") + "---\n" +
		grant(farNS, "other-namespace", "HTTPRoute", "default", "") + "---\n" +
		grant(appNS, "misplaced", "HTTPRoute", appNS, "")
	right := grant(farNS, "echo-far", "HTTPRoute", appNS, "echo-far")
	manifest := cluster.NamespaceManifest(farNS, map[string]string{"istio.io/dataplane-mode": "ambient"}) + "---\n" +
		cluster.EchoApp(farNS, "echo-far", cluster.EchoOptions{}) + "---\n" + useless
	t.Cleanup(func() {
		bg := context.Background()
		_ = c.Delete(bg, farRoute)
		_ = c.Delete(bg, right)
		_ = c.Delete(bg, useless)
		_ = c.Delete(bg, manifest)
	})
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeployment(ctx, farNS, "echo-far"); err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(ctx, farRoute); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"Accepted": "True/Accepted", "ResolvedRefs": "False/RefNotPermitted"})
	if got := answers(10); got["HTTP 500"] != 10 {
		t.Errorf("without a ReferenceGrant for it: %v, want all 10 answered 500 by the waypoint", got)
	}

	if err := c.Apply(ctx, right); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"Accepted": "True/Accepted", "ResolvedRefs": "True/ResolvedRefs"})
	err := c.WaitFor(ctx, "/far answered by echo-far", func(ctx context.Context) (bool, error) {
		return answers(1)["far"] == 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := answers(10); got["far"] != 10 {
		t.Errorf("with the ReferenceGrant: %v, want all 10 answered by echo-far", got)
	}

	// Taking the grant back takes the backend away.
	if err := c.Delete(ctx, right); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"Accepted": "True/Accepted", "ResolvedRefs": "False/RefNotPermitted"})
	err = c.WaitFor(ctx, "/far refused again", func(ctx context.Context) (bool, error) {
		return answers(1)["HTTP 500"] == 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := answers(10); got["HTTP 500"] != 10 {
		t.Errorf("after the ReferenceGrant was deleted: %v, want all 10 answered 500", got)
	}
}
