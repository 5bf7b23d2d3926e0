package demo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

var gatewayGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}

// Split of the demo's HTTPRoute: the share of echo-v2 among requests
// without the canary header, in percent, and how many requests show it.
const (
	canaryPercent = 10
	splitRequests = 200
)

// waypointStory deploys a waypoint from a bare Gateway, sends the namespace
// through it, and shows an HTTPRoute routing by header and weight and an
// L7 AuthorizationPolicy denying a path.
func (d *Demo) waypointStory(ctx context.Context, c *cluster.Cluster, client, target string) error {
	ns := d.cfg.AppNamespace
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	bare := fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: %s}
spec:
  gatewayClassName: istio-waypoint
`, ns)
	d.step("kubectl apply: a bare waypoint Gateway (class istio-waypoint, no listeners)")
	if err := c.Apply(ctx, bare); err != nil {
		return fmt.Errorf("applying the waypoint Gateway: %w", err)
	}
	dc, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	gw, err := dc.Resource(gatewayGVR).Namespace(ns).Get(ctx, "waypoint", metav1.GetOptions{})
	if err != nil {
		return err
	}
	listeners, _, _ := unstructured.NestedSlice(gw.Object, "spec", "listeners")
	if len(listeners) != 1 {
		return fmt.Errorf("the webhook did not default the waypoint's listener: %v", listeners)
	}
	d.say("defaulted by the webhook: listeners=%v istio.io/waypoint-for=%s", listeners, gw.GetLabels()["istio.io/waypoint-for"])
	var addrs []any
	err = c.WaitFor(wctx, "Gateway "+ns+"/waypoint Programmed", func(ctx context.Context) (bool, error) {
		gw, err := dc.Resource(gatewayGVR).Namespace(ns).Get(ctx, "waypoint", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		addrs, _, _ = unstructured.NestedSlice(gw.Object, "status", "addresses")
		conds, _, _ := unstructured.NestedSlice(gw.Object, "status", "conditions")
		for _, cond := range conds {
			if m, _ := cond.(map[string]any); m["type"] == "Programmed" && m["status"] == "True" {
				return len(addrs) > 0, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	if err := c.WaitDeployment(wctx, ns, "waypoint"); err != nil {
		return err
	}
	d.say("the control plane deployed it (ServiceAccount, Deployment and Service waypoint); status Programmed, addresses %v", addrs)

	d.step("deploying echo-v2, the canary version of echo, on its own Service")
	if err := c.Apply(ctx, cluster.EchoApp(ns, "echo-v2", cluster.EchoOptions{})); err != nil {
		return err
	}
	if err := c.WaitDeployment(wctx, ns, "echo-v2"); err != nil {
		return err
	}
	if err := c.WaitRedirected(wctx, ns, 0); err != nil {
		return err
	}

	d.step("kubectl label namespace %s istio.io/use-waypoint=waypoint", ns)
	patch := []byte(`{"metadata":{"labels":{"istio.io/use-waypoint":"waypoint"}}}`)
	if _, err := c.Client().CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling namespace %s: %w", ns, err)
	}
	route := fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: echo, namespace: %s}
spec:
  parentRefs:
  - {group: "", kind: Service, name: echo, port: 80}
  rules:
  - matches:
    - headers: [{name: x-canary, value: "yes"}]
    backendRefs: [{name: echo-v2, port: 80}]
  - backendRefs:
    - {name: echo, port: 80, weight: %d}
    - {name: echo-v2, port: 80, weight: %d}
`, ns, 100-canaryPercent, canaryPercent)
	d.step("kubectl apply: an HTTPRoute on Service echo — x-canary: yes goes to echo-v2, the rest %d%% echo, %d%% echo-v2", 100-canaryPercent, canaryPercent)
	if err := c.Apply(ctx, route); err != nil {
		return fmt.Errorf("applying the HTTPRoute: %w", err)
	}
	// The canary header reaching echo-v2 can only be the waypoint's doing.
	err = c.WaitFor(wctx, "the waypoint routing x-canary to echo-v2", func(ctx context.Context) (bool, error) {
		rs, _ := c.Request(ctx, ns, client, target, 1, "x-canary: yes")
		return len(rs) == 1 && rs[0].Response != nil && version(rs[0]) == "echo-v2", nil
	})
	if err != nil {
		return err
	}
	d.step("from %s: 10 requests with x-canary: yes", client)
	rs, err := c.Request(wctx, ns, client, target, 10, "x-canary: yes")
	counts := byVersion(rs)
	d.say("answered by: %s", counts)
	if err != nil || counts["echo-v2"] != 10 {
		return fmt.Errorf("x-canary: yes answered %s (%v), want all 10 by echo-v2", counts, err)
	}
	d.step("from %s: %d requests without it", client, splitRequests)
	rs, err = c.Request(wctx, ns, client, target, splitRequests)
	counts = byVersion(rs)
	d.say("answered by: %s (expected about %d%% / %d%%)", counts, 100-canaryPercent, canaryPercent)
	if err != nil || counts["echo"]+counts["echo-v2"] != splitRequests {
		return fmt.Errorf("the split answered %s (%v), want all %d by echo or echo-v2", counts, err, splitRequests)
	}
	// echo-v2's count is binomial; 5 standard deviations fail a correct
	// split with probability below 1e-6.
	p := float64(canaryPercent) / 100
	mean, sd := splitRequests*p, math.Sqrt(splitRequests*p*(1-p))
	if math.Abs(float64(counts["echo-v2"])-mean) > 5*sd {
		return fmt.Errorf("echo-v2 answered %d of %d, want %.0f ± %.0f", counts["echo-v2"], splitRequests, mean, 5*sd)
	}
	d.showProxyAccess(ctx, c, "waypoint", 2)
	return d.l7PolicyStory(ctx, c, client, target)
}

// l7PolicyStory denies a path at the waypoint and shows 403s there while
// other paths pass.
func (d *Demo) l7PolicyStory(ctx context.Context, c *cluster.Cluster, client, target string) error {
	ns := d.cfg.AppNamespace
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	policy := fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: %s}
spec:
  targetRefs:
  - {group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}
  action: DENY
  rules:
  - to: [{operation: {paths: ["/admin", "/admin/*"]}}]
`, ns)
	d.step("kubectl apply: an AuthorizationPolicy on the waypoint that denies /admin and /admin/*")
	if err := c.Apply(ctx, policy); err != nil {
		return fmt.Errorf("applying the policy: %w", err)
	}
	admin := strings.TrimSuffix(target, "/") + "/admin/users"
	err := c.WaitFor(wctx, "the L7 policy in force", func(ctx context.Context) (bool, error) {
		rs, _ := c.Request(ctx, ns, client, admin, 1)
		return len(rs) == 1 && rs[0].Status == 403, nil
	})
	if err != nil {
		return err
	}
	for _, u := range []string{admin, strings.TrimSuffix(target, "/") + "/public"} {
		rs, _ := c.Request(wctx, ns, client, u, 3)
		counts := byVersion(rs)
		d.say("from %s: GET %s ×3 → %s", client, u, counts)
		denied := strings.Contains(u, "/admin")
		for _, r := range rs {
			if denied && r.Status != 403 || !denied && r.Response == nil {
				return fmt.Errorf("GET %s answered %s, want %s", u, counts, map[bool]string{true: "403s", false: "200s"}[denied])
			}
		}
	}
	return nil
}

// version names the Deployment of the pod that answered, "HTTP <code>" for
// an error status, or "error".
func version(r echo.Result) string {
	switch {
	case r.Response != nil && strings.HasPrefix(r.Response.Pod, "echo-v2-"):
		return "echo-v2"
	case r.Response != nil && strings.HasPrefix(r.Response.Pod, "echo-"):
		return "echo"
	case r.Status != 0:
		return fmt.Sprintf("HTTP %d", r.Status)
	default:
		return "error"
	}
}

// counts are answers by version.
type counts map[string]int

func byVersion(rs []echo.Result) counts {
	out := counts{}
	for _, r := range rs {
		out[version(r)]++
	}
	return out
}

func (c counts) String() string {
	var parts []string
	for _, k := range []string{"echo", "echo-v2", "HTTP 403", "HTTP 503", "HTTP 504", "error"} {
		if c[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, c[k]))
		}
	}
	for k, v := range c {
		if !strings.Contains("echo echo-v2 HTTP 403 HTTP 503 HTTP 504 error", k) {
			parts = append(parts, fmt.Sprintf("%s=%d", k, v))
		}
	}
	return strings.Join(parts, " ")
}

// proxyPod returns the name of the pod of the app namespace's Gateway
// gateway (a waypoint or an ingress gateway).
func (d *Demo) proxyPod(ctx context.Context, c *cluster.Cluster, gateway string) (string, error) {
	pods, err := c.Client().CoreV1().Pods(d.cfg.AppNamespace).List(ctx, metav1.ListOptions{LabelSelector: "gateway.networking.k8s.io/gateway-name=" + gateway})
	if err != nil {
		return "", err
	}
	if len(pods.Items) == 0 {
		return "", errors.New("no pod of Gateway " + gateway)
	}
	return pods.Items[0].Name, nil
}

// showProxyAccess prints the last n access-log lines of the Gateway
// gateway's proxy and returns how many it printed.
func (d *Demo) showProxyAccess(ctx context.Context, c *cluster.Cluster, gateway string, n int) int {
	pod, err := d.proxyPod(ctx, c, gateway)
	if err != nil {
		return 0
	}
	logs, err := c.Logs(d.cfg.AppNamespace, pod, "waypoint")
	if err != nil {
		return 0
	}
	recs := accessRecords(logs, n)
	for _, rec := range recs {
		d.say("%s access log: %v %v %v → %v  route=%v upstream=%v  from %v", pod, rec["method"], rec["path"], rec["status"],
			rec["cluster"], rec["route"], rec["upstream"], orDefault(rec["src_identity"], rec["src_addr"]))
	}
	return len(recs)
}

// orDefault is v, or def when v is missing or empty.
func orDefault(v, def any) any {
	if v == nil || v == "" {
		return def
	}
	return v
}

// showWaypointMetrics prints the waypoint's request counts of the story.
func (d *Demo) showWaypointMetrics(ctx context.Context, c *cluster.Cluster) error {
	pod, err := d.proxyPod(ctx, c, "waypoint")
	if err != nil {
		return err
	}
	d.step("waypoint %s metrics (curl localhost:15020/metrics), istio_requests_total:", pod)
	body, err := c.HTTPGet(ctx, d.cfg.AppNamespace, pod, "http://127.0.0.1:15020/metrics")
	if err != nil {
		return err
	}
	if d.excerpt(body, "istio_requests_total{", 6) == 0 {
		return fmt.Errorf("the waypoint has no istio_requests_total series for namespace %s", d.cfg.AppNamespace)
	}
	for _, code := range []string{`response_code="200"`, `response_code="403"`} {
		if !strings.Contains(body, code) {
			return fmt.Errorf("the waypoint's istio_requests_total has no %s", code)
		}
	}
	return nil
}
