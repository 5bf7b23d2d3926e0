// Package e2e runs a waypoint in the local cluster with the rest of the mesh,
// all installed by the chart: a namespace that uses a waypoint, an HTTPRoute
// that routes by header and weight, retries and times out, and an L7
// AuthorizationPolicy, checked request by request and in the waypoint's
// metrics.
package e2e

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

var shared = cluster.NewShared(cluster.Config{Images: cluster.MeshImages()})

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

const (
	meshNS = "weft-system"
	appNS  = "wp-demo"
)

// mesh installs the chart, a waypoint and the apps once per test binary.
type mesh struct {
	c      *cluster.Cluster
	gw     gwclient.Interface // the Gateway API, for routes' status
	client corev1.Pod
	target string // the echo Service, http://<VIP>:80
}

var (
	theMesh  *mesh
	setupErr error // the first setup's failure: later tests fail at once
)

func setup(t *testing.T) *mesh {
	t.Helper()
	if theMesh != nil {
		return theMesh
	}
	if setupErr != nil {
		t.Fatalf("the waypoint setup failed earlier: %v", setupErr)
	}
	c := shared.Get(t)
	m, err := install(t, c)
	if err != nil {
		setupErr = err
		c.Dump(t.Logf)
		t.Fatal(err)
	}
	theMesh = m
	return m
}

// install installs the chart, the waypoint, the route, the policy and the
// apps, and waits until the waypoint routes.
func install(t *testing.T, c *cluster.Cluster) (*mesh, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if err := c.InstallMesh(ctx, meshNS); err != nil {
		return nil, err
	}
	manifest := cluster.NamespaceManifest(appNS, map[string]string{
		"istio.io/dataplane-mode": "ambient",
		"istio.io/use-waypoint":   "waypoint",
	}) + "---\n" + waypointGateway + "---\n" +
		cluster.EchoApp(appNS, "echo-v1", cluster.EchoOptions{Labels: map[string]string{"svc": "echo", "version": "v1"}}) + "---\n" +
		cluster.EchoApp(appNS, "echo-v2", cluster.EchoOptions{Labels: map[string]string{"svc": "echo", "version": "v2"}}) + "---\n" +
		cluster.EchoApp(appNS, "client", cluster.EchoOptions{}) + "---\n" +
		parentService + "---\n" + route + "---\n" + denyAdmin
	if err := c.Apply(ctx, manifest); err != nil {
		return nil, err
	}
	for _, d := range []string{"echo-v1", "echo-v2", "client", "waypoint"} {
		if err := c.WaitDeployment(ctx, appNS, d); err != nil {
			return nil, err
		}
	}
	if err := waitProgrammed(ctx, c, appNS, "waypoint"); err != nil {
		return nil, err
	}
	clients, err := c.WaitPods(ctx, appNS, "app=client", 1)
	if err != nil {
		return nil, err
	}
	svc, err := c.Client().CoreV1().Services(appNS).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	gw, err := gwclient.NewForConfig(c.RESTConfig())
	if err != nil {
		return nil, err
	}
	m := &mesh{c: c, gw: gw, client: clients[0], target: fmt.Sprintf("http://%s:80/", svc.Spec.ClusterIP)}
	// The route is in force once a canary request reaches v2: that answer
	// can only come from the waypoint. The tests also need v1 behind the
	// waypoint (a Ready pod reaches the waypoint's endpoints a moment
	// later), which /retry, routed to v1 alone, shows.
	for _, w := range []struct{ what, path, header, pod string }{
		{"x-canary to v2", "", "x-canary: yes", "echo-v2-"},
		{"/retry to v1", "retry/ready", "", "echo-v1-"},
	} {
		err = c.WaitFor(ctx, "the waypoint routing "+w.what, func(ctx context.Context) (bool, error) {
			var headers []string
			if w.header != "" {
				headers = append(headers, w.header)
			}
			rs, _ := c.Request(ctx, appNS, m.client.Name, m.target+w.path, 1, headers...)
			return len(rs) == 1 && rs[0].Response != nil && strings.HasPrefix(rs[0].Response.Pod, w.pod), nil
		})
		if err != nil {
			return nil, err
		}
	}
	t.Logf("the waypoint routes: Gateway %s/waypoint Programmed, x-canary reaches v2, /retry v1", appNS)
	return m, nil
}

var waypointGateway = cluster.WaypointGateway(appNS, "waypoint")

// parentService is what clients call; the route splits it over the two
// versions' own Services.
const parentService = `apiVersion: v1
kind: Service
metadata:
  name: echo
  namespace: ` + appNS + `
spec:
  selector: {svc: echo}
  ports:
  - {name: http, port: 80, targetPort: http}
`

const route = `apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: echo
  namespace: ` + appNS + `
spec:
  parentRefs:
  - {group: "", kind: Service, name: echo, port: 80}
  rules:
  - matches:
    - headers: [{name: x-canary, value: "yes"}]
    backendRefs: [{name: echo-v2, port: 80}]
  - matches:
    - path: {type: PathPrefix, value: /retry}
    backendRefs: [{name: echo-v1, port: 80}]
    retry: {codes: [503], attempts: 2, backoff: 10ms}
  - matches:
    - path: {type: PathPrefix, value: /slow}
    backendRefs: [{name: echo-v1, port: 80}]
    timeouts: {request: 500ms}
  - backendRefs:
    - {name: echo-v1, port: 80, weight: 90}
    - {name: echo-v2, port: 80, weight: 10}
`

const denyAdmin = `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: deny-admin
  namespace: ` + appNS + `
spec:
  targetRefs:
  - {group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}
  action: DENY
  rules:
  - to:
    - operation: {paths: ["/admin", "/admin/*"]}
`

var gatewayGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}

// waitProgrammed waits for the deployer to report a waypoint Gateway
// Programmed with an address.
func waitProgrammed(ctx context.Context, c *cluster.Cluster, ns, name string) error {
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	return c.WaitFor(ctx, "Gateway "+ns+"/"+name+" Programmed", func(ctx context.Context) (bool, error) {
		gw, err := dyn.Resource(gatewayGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		addrs, _, _ := unstructured.NestedSlice(gw.Object, "status", "addresses")
		conds, _, _ := unstructured.NestedSlice(gw.Object, "status", "conditions")
		for _, cond := range conds {
			m, _ := cond.(map[string]any)
			if m["type"] == "Programmed" && m["status"] == "True" && len(addrs) > 0 {
				return true, nil
			}
		}
		return false, nil
	})
}

// send makes n requests from the client to path with headers and returns
// the results.
func (m *mesh) send(t *testing.T, path string, n int, headers ...string) []echo.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rs, err := m.c.Request(ctx, appNS, m.client.Name, strings.TrimSuffix(m.target, "/")+path, n, headers...)
	if len(rs) != n {
		t.Fatalf("%d requests to %s: %d results (%v)", n, path, len(rs), err)
	}
	return rs
}

// byVersion counts who answered: "v1", "v2", or "HTTP <code>"/"error".
func byVersion(rs []echo.Result) map[string]int {
	out := map[string]int{}
	for _, r := range rs {
		switch {
		case r.Response != nil && strings.HasPrefix(r.Response.Pod, "echo-v1-"):
			out["v1"]++
		case r.Response != nil && strings.HasPrefix(r.Response.Pod, "echo-v2-"):
			out["v2"]++
		case r.Status != 0:
			out[fmt.Sprintf("HTTP %d", r.Status)]++
		default:
			out["error"]++
		}
	}
	return out
}

func TestHeaderRouting(t *testing.T) {
	m := setup(t)
	if got := byVersion(m.send(t, "/", 20, "x-canary: yes")); got["v2"] != 20 {
		t.Errorf("x-canary: yes answered %v, want all 20 by v2", got)
	}
}

// TestPeerIsTheWaypoint: through a waypoint, the application sees the
// waypoint's address as its peer (the connection it accepts is the
// waypoint's, kept as the source by the destination's ztunnel), as in
// Istio.
func TestPeerIsTheWaypoint(t *testing.T) {
	m := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wps, err := m.c.WaitPods(ctx, appNS, "gateway.networking.k8s.io/gateway-name=waypoint", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range m.send(t, "/", 5) {
		if r.Response == nil {
			t.Fatalf("no answer: %d %s", r.Status, r.Error)
		}
		host, _, err := net.SplitHostPort(r.Response.Peer)
		if err != nil || host != wps[0].Status.PodIP {
			t.Errorf("the application saw its peer as %q, want the waypoint's %s", r.Response.Peer, wps[0].Status.PodIP)
		}
	}
}

// TestWeightedSplit checks the 90/10 split over 1,000 requests: the count
// of v2 is binomial(1000, 0.1), mean 100 and standard deviation 9.5; the
// bound of 5 deviations fails a correct split with probability below 1e-6.
func TestWeightedSplit(t *testing.T) {
	m := setup(t)
	const n = 1000
	got := byVersion(m.send(t, "/", n))
	if got["v1"]+got["v2"] != n {
		t.Fatalf("%d requests answered %v, want all by v1 or v2", n, got)
	}
	mean, sd := n*0.1, math.Sqrt(n*0.1*0.9)
	if d := math.Abs(float64(got["v2"]) - mean); d > 5*sd {
		t.Errorf("v2 answered %d of %d, want %.0f ± %.0f (90/10 split)", got["v2"], n, mean, 5*sd)
	}
	t.Logf("90/10 split over %d requests: %v", n, got)
}

func TestRetryTurns503Into200(t *testing.T) {
	m := setup(t)
	for i := range 5 {
		rs := m.send(t, "/retry", 1, fmt.Sprintf("%s: retry-%d-%d", echo.HeaderFailOnce, time.Now().UnixNano(), i))
		if rs[0].Status != 200 {
			t.Errorf("request %d to /retry (first attempt answered 503): got %d %s, want 200 after a retry", i, rs[0].Status, rs[0].Error)
		}
	}
	// The same failure on a route without retries reaches the client.
	rs := m.send(t, "/plain", 1, fmt.Sprintf("%s: plain-%d", echo.HeaderFailOnce, time.Now().UnixNano()), "x-canary: yes")
	if rs[0].Status != 503 {
		t.Errorf("request to a route without retries: got %d %s, want the backend's 503", rs[0].Status, rs[0].Error)
	}
}

func TestTimeoutIs504(t *testing.T) {
	m := setup(t)
	rs := m.send(t, "/slow", 1, echo.HeaderDelay+": 3s")
	if rs[0].Status != 504 {
		t.Errorf("/slow with a 3s backend and a 500ms route timeout: got %d %s, want 504", rs[0].Status, rs[0].Error)
	}
	if rs := m.send(t, "/slow", 1); rs[0].Status != 200 {
		t.Errorf("/slow with a fast backend: got %d %s, want 200", rs[0].Status, rs[0].Error)
	}
}

func TestL7DenyPath(t *testing.T) {
	m := setup(t)
	// The chart's default path normalization (BASE) reaches the waypoint:
	// encoded and dot-segment spellings of /admin are /admin to policy.
	for _, p := range []string{"/admin", "/admin/users", "/%61dmin", "/x/../admin", "/public/%2e%2e/admin/users"} {
		if rs := m.send(t, p, 3); byVersion(rs)["HTTP 403"] != 3 {
			t.Errorf("%s answered %v, want 403 from the DENY policy", p, byVersion(rs))
		}
	}
	for _, p := range []string{"/", "/administrator", "/public"} {
		if rs := m.send(t, p, 3); rs[0].Status != 200 || rs[1].Status != 200 || rs[2].Status != 200 {
			t.Errorf("%s answered %v, want 200s: the policy denies /admin only", p, byVersion(rs))
		}
	}
}

// TestMetricsCountEachCase reads the waypoint's metrics after the other
// tests: each outcome above is counted with reporter="waypoint".
func TestMetricsCountEachCase(t *testing.T) {
	m := setup(t)
	m.send(t, "/admin", 1)
	m.send(t, "/slow", 1, echo.HeaderDelay+": 2s")
	m.send(t, "/", 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods, err := m.c.WaitPods(ctx, appNS, "gateway.networking.k8s.io/gateway-name=waypoint", 1)
	if err != nil {
		t.Fatal(err)
	}
	text, err := m.c.HTTPGet(ctx, appNS, pods[0].Name, "http://127.0.0.1:15020/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, code := range []string{"200", "403", "504"} {
		found := false
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, "istio_requests_total{") && strings.Contains(l, `reporter="waypoint"`) &&
				strings.Contains(l, `response_code="`+code+`"`) && strings.Contains(l, `destination_service="echo.`+appNS+`.svc.cluster.local"`) {
				found = true
			}
		}
		if !found {
			t.Errorf("no istio_requests_total with reporter=waypoint and response_code=%s for the echo Service:\n%s", code, grep(text, "istio_requests_total"))
		}
	}
	if !strings.Contains(text, "istio_request_duration_milliseconds_bucket{") {
		t.Errorf("no istio_request_duration_milliseconds histogram")
	}
}

func grep(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestGatewayLifecycle: a waypoint Gateway with a parametersRef gets its
// objects patched as the ConfigMap says, and deleting the Gateway deletes
// them (they are owned by it).
func TestGatewayLifecycle(t *testing.T) {
	m := setup(t)
	c := m.c
	const ns = "wp-life"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	manifest := cluster.NamespaceManifest(ns, nil) + `---
apiVersion: v1
kind: ConfigMap
metadata: {name: edge-params, namespace: ` + ns + `}
data:
  deployment: |
    spec:
      replicas: 2
  service: |
    metadata:
      annotations: {example.com/team: edge}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: ` + ns + `}
spec:
  gatewayClassName: istio-waypoint
  infrastructure:
    parametersRef: {group: "", kind: ConfigMap, name: edge-params}
  listeners:
  - {name: mesh, port: 15008, protocol: HBONE}
`
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Delete(context.Background(), cluster.NamespaceManifest(ns, nil)) })
	if err := waitProgrammed(ctx, c, ns, "edge"); err != nil {
		c.Dump(t.Logf)
		t.Fatal(err)
	}
	if err := c.WaitDeployment(ctx, ns, "edge"); err != nil {
		t.Fatal(err)
	}
	d, err := c.Client().AppsV1().Deployments(ns).Get(ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 || d.Status.ReadyReplicas != 2 {
		t.Errorf("Deployment edge: replicas %v, ready %d; want 2 and 2 (the ConfigMap's patch)", d.Spec.Replicas, d.Status.ReadyReplicas)
	}
	svc, err := c.Client().CoreV1().Services(ns).Get(ctx, "edge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Annotations["example.com/team"] != "edge" {
		t.Errorf("Service edge annotations %v, want example.com/team=edge from the ConfigMap", svc.Annotations)
	}

	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := dyn.Resource(gatewayGVR).Namespace(ns).Delete(ctx, "edge", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = c.WaitFor(ctx, "the waypoint's objects deleted with its Gateway", func(ctx context.Context) (bool, error) {
		_, derr := c.Client().AppsV1().Deployments(ns).Get(ctx, "edge", metav1.GetOptions{})
		_, serr := c.Client().CoreV1().Services(ns).Get(ctx, "edge", metav1.GetOptions{})
		_, aerr := c.Client().CoreV1().ServiceAccounts(ns).Get(ctx, "edge", metav1.GetOptions{})
		return apierrors.IsNotFound(derr) && apierrors.IsNotFound(serr) && apierrors.IsNotFound(aerr), nil
	})
	if err != nil {
		t.Error(err)
	}
}

// TestGatewayNoTakeover: a waypoint Gateway named like an application's
// Service leaves that Service as it is, says so in its status, and
// deleting the Gateway does not garbage-collect the Service (while the
// objects of a Gateway deleted with it are collected).
func TestGatewayNoTakeover(t *testing.T) {
	m := setup(t)
	c := m.c
	const ns = "wp-takeover"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	manifest := cluster.NamespaceManifest(ns, nil) + `---
apiVersion: v1
kind: Service
metadata: {name: shop, namespace: ` + ns + `, labels: {app: shop}}
spec:
  selector: {app: shop}
  ports: [{name: http, port: 8080}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: shop, namespace: ` + ns + `}
spec:
  gatewayClassName: istio-waypoint
  listeners:
  - {name: mesh, port: 15008, protocol: HBONE}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: sentinel, namespace: ` + ns + `}
spec:
  gatewayClassName: istio-waypoint
  listeners:
  - {name: mesh, port: 15008, protocol: HBONE}
`
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Delete(context.Background(), cluster.NamespaceManifest(ns, nil)) })
	before, err := c.Client().CoreV1().Services(ns).Get(ctx, "shop", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	err = c.WaitFor(ctx, "Gateway shop Accepted=False naming Service "+ns+"/shop", func(ctx context.Context) (bool, error) {
		gw, err := dyn.Resource(gatewayGVR).Namespace(ns).Get(ctx, "shop", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(gw.Object, "status", "conditions")
		for _, cond := range conds {
			m, _ := cond.(map[string]any)
			msg, _ := m["message"].(string)
			if m["type"] == "Accepted" && m["status"] == "False" && strings.Contains(msg, "Service "+ns+"/shop exists and is not managed") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitProgrammed(ctx, c, ns, "sentinel"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"shop", "sentinel"} {
		if err := dyn.Resource(gatewayGVR).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Once the collector has removed the sentinel's Service, it has seen
	// both deletions.
	err = c.WaitFor(ctx, "the sentinel's Service collected", func(ctx context.Context) (bool, error) {
		_, err := c.Client().CoreV1().Services(ns).Get(ctx, "sentinel", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	after, err := c.Client().CoreV1().Services(ns).Get(ctx, "shop", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the application's Service after its namesake Gateway was deleted: %v", err)
	}
	if after.ResourceVersion != before.ResourceVersion || len(after.OwnerReferences) > 0 {
		t.Errorf("the application's Service was written: resourceVersion %s -> %s, owners %v, selector %v",
			before.ResourceVersion, after.ResourceVersion, after.OwnerReferences, after.Spec.Selector)
	}
	for _, get := range []func() error{
		func() error {
			_, err := c.Client().AppsV1().Deployments(ns).Get(ctx, "shop", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := c.Client().CoreV1().ServiceAccounts(ns).Get(ctx, "shop", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); !apierrors.IsNotFound(err) {
			t.Errorf("an object of the blocked Gateway: %v, want none made", err)
		}
	}
}
