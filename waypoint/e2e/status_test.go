package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/internal/apinames"
)

// missingBackendRoute sends one path of the echo Service to a Service that
// does not exist.
const missingBackendRoute = `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: echo-missing
  namespace: ` + appNS + `
spec:
  parentRefs:
  - {group: "", kind: Service, name: echo, port: 80}
  rules:
  - matches:
    - path: {type: PathPrefix, value: /route-status-missing}
    backendRefs: [{name: nowhere, port: 80}]
`

// routeConditions returns the conditions the waypoint controller wrote on
// a route for its first parentRef, as "<type>=<status>/<reason>".
func routeConditions(ctx context.Context, gw gwclient.Interface, name string) (map[string]string, *gwv1.HTTPRoute, error) {
	r, err := gw.GatewayV1().HTTPRoutes(appNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	out := map[string]string{}
	for _, p := range r.Status.Parents {
		if p.ControllerName != apinames.WaypointController || p.ParentRef.Name != "echo" {
			continue
		}
		for _, c := range p.Conditions {
			out[c.Type] = fmt.Sprintf("%s/%s", c.Status, c.Reason)
			if c.ObservedGeneration != r.Generation {
				out[c.Type] += fmt.Sprintf(" (generation %d of %d)", c.ObservedGeneration, r.Generation)
			}
		}
	}
	return out, r, nil
}

// TestRouteStatus: the route the waypoint applies shows Accepted and
// ResolvedRefs True under Weft's controller name; a route to a Service that
// does not exist shows ResolvedRefs False with BackendNotFound.
func TestRouteStatus(t *testing.T) {
	m := setup(t)
	c := m.c
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gw, err := gwclient.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	wait := func(name string, want map[string]string) {
		t.Helper()
		var last map[string]string
		err := c.WaitFor(ctx, "HTTPRoute "+name+" status "+fmt.Sprint(want), func(ctx context.Context) (bool, error) {
			got, _, err := routeConditions(ctx, gw, name)
			if err != nil {
				return false, nil
			}
			last = got
			return fmt.Sprint(got) == fmt.Sprint(want), nil
		})
		if err != nil {
			t.Fatalf("%v; last seen %v", err, last)
		}
	}
	wait("echo", map[string]string{"Accepted": "True/Accepted", "ResolvedRefs": "True/ResolvedRefs"})

	if err := c.Apply(ctx, missingBackendRoute); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), missingBackendRoute) })
	wait("echo-missing", map[string]string{"Accepted": "True/Accepted", "ResolvedRefs": "False/BackendNotFound"})
	_, r, err := routeConditions(ctx, gw, "echo-missing")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range r.Status.Parents {
		if c := meta.FindStatusCondition(p.Conditions, "ResolvedRefs"); c != nil {
			t.Logf("HTTPRoute echo-missing ResolvedRefs: %s", c.Message)
		}
	}
	// The route still applies where it can: its rule answers 500, as
	// Gateway API asks of a rule without a usable backend.
	if got := byVersion(m.send(t, "/route-status-missing", 1)); got["HTTP 500"] != 1 {
		t.Errorf("a request to the rule without a backend: %v, want HTTP 500", got)
	}
}
