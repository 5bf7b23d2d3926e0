package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/test/cluster"
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
	return parentConditions(r.Status.Parents, "echo", r.Generation), r, nil
}

// parentConditions returns the conditions the waypoint controller wrote
// for a route's parentRef to the Service parent, as
// "<type>=<status>/<reason>", naming a generation other than the route's.
func parentConditions(parents []gwv1.RouteParentStatus, parent string, generation int64) map[string]string {
	out := map[string]string{}
	for _, p := range parents {
		if p.ControllerName != apinames.WaypointController || string(p.ParentRef.Name) != parent {
			continue
		}
		for _, c := range p.Conditions {
			out[c.Type] = fmt.Sprintf("%s/%s", c.Status, c.Reason)
			if c.ObservedGeneration != generation {
				out[c.Type] += fmt.Sprintf(" (generation %d of %d)", c.ObservedGeneration, generation)
			}
		}
	}
	return out
}

// waitConditions waits until get returns want (parentConditions' form),
// failing the test with what it last saw of what.
func waitConditions(ctx context.Context, t *testing.T, c *cluster.Cluster, what string, want map[string]string, get func(context.Context) (map[string]string, error)) {
	t.Helper()
	var last map[string]string
	err := c.WaitFor(ctx, what+" status "+fmt.Sprint(want), func(ctx context.Context) (bool, error) {
		got, err := get(ctx)
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

// TestRouteStatus: the route the waypoint applies shows Accepted and
// ResolvedRefs True under Weft's controller name; a route to a Service that
// does not exist shows ResolvedRefs False with BackendNotFound.
func TestRouteStatus(t *testing.T) {
	m := setup(t)
	c := m.c
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gw := m.gw
	wait := func(name string, want map[string]string) {
		t.Helper()
		waitConditions(ctx, t, c, "HTTPRoute "+name, want, func(ctx context.Context) (map[string]string, error) {
			got, _, err := routeConditions(ctx, gw, name)
			return got, err
		})
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

// probeService is a Service of the app namespace, which is bound to the
// waypoint, with its own waypoint label (none: the namespace's).
func probeService(useWaypoint string) string {
	labels := ""
	if useWaypoint != "" {
		labels = "\n  labels: {istio.io/use-waypoint: " + useWaypoint + "}"
	}
	return `apiVersion: v1
kind: Service
metadata:
  name: status-probe
  namespace: ` + appNS + labels + `
spec:
  ports:
  - {name: http, port: 80}
`
}

// TestWaypointStatus: what a user reads with kubectl about the waypoint.
// The Services bound to it show istio.io/WaypointBound True, one that asks
// for a waypoint that does not exist shows it False with WaypointIsNotReady,
// and one that opts out shows none; the policy bound to the waypoint shows
// WaypointAccepted; the waypoint's listener counts no attached route, as
// istiod's does (routes attach to the Services).
func TestWaypointStatus(t *testing.T) {
	m := setup(t)
	c := m.c
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gw := m.gw
	istio, err := istioclient.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	bound := "True/WaypointAccepted: Successfully attached to waypoint " + appNS + "/waypoint"
	serviceCond := func(name, want string) {
		t.Helper()
		last := ""
		err := c.WaitFor(ctx, "Service "+name+" istio.io/WaypointBound "+want, func(ctx context.Context) (bool, error) {
			svc, err := c.Client().CoreV1().Services(appNS).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			last = "<none>"
			if cond := meta.FindStatusCondition(svc.Status.Conditions, "istio.io/WaypointBound"); cond != nil {
				last = fmt.Sprintf("%s/%s: %s", cond.Status, cond.Reason, cond.Message)
			}
			return last == want, nil
		})
		if err != nil {
			t.Fatalf("%v; last seen %s", err, last)
		}
	}
	serviceCond("echo", bound)

	err = c.WaitFor(ctx, "AuthorizationPolicy deny-admin WaypointAccepted", func(ctx context.Context) (bool, error) {
		p, err := istio.SecurityV1().AuthorizationPolicies(appNS).Get(ctx, "deny-admin", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range p.Status.GetConditions() {
			if cond.GetType() == "WaypointAccepted" {
				return cond.GetStatus() == "True" && cond.GetReason() == "Accepted" && cond.GetMessage() == "bound to "+appNS+"/waypoint", nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}

	g, err := gw.GatewayV1().Gateways(appNS).Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range g.Status.Listeners {
		if l.AttachedRoutes != 0 {
			t.Errorf("listener %s attachedRoutes %d, want 0 (routes attach to Services)", l.Name, l.AttachedRoutes)
		}
	}

	t.Cleanup(func() { _ = c.Delete(context.Background(), probeService("")) })
	for _, step := range []struct{ label, want string }{
		{"", bound},
		{"ghost", `False/WaypointIsNotReady: waypoint "` + appNS + `/ghost" is not ready`},
		{"none", "<none>"},
		{"waypoint", bound},
	} {
		if err := c.Apply(ctx, probeService(step.label)); err != nil {
			t.Fatal(err)
		}
		serviceCond("status-probe", step.want)
	}
}
