package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

// meshStory tells the ambient part of the demo once Weft is installed: the
// namespace is enrolled, traffic goes over HBONE with the peer identities
// ztunnel saw, the webhook turns away a bad waypoint Gateway and a sidecar
// label, an L4 policy refuses a client, a waypoint deployed from a bare
// Gateway (defaulted by the webhook) routes an HTTPRoute by header and
// weight and enforces an L7 policy, and the audit log and metrics show what
// happened. It returns at the first outcome that is not the expected one.
func (d *Demo) meshStory(ctx context.Context, c *cluster.Cluster) error {
	ns := d.cfg.AppNamespace
	d.step("kubectl label namespace %s istio.io/dataplane-mode=ambient", ns)
	patch := []byte(`{"metadata":{"labels":{"istio.io/dataplane-mode":"ambient"}}}`)
	if _, err := c.Client().CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling namespace %s: %w", ns, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.WaitRedirected(wctx, ns, 0); err != nil {
		return err
	}
	pods, _ := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	for _, p := range pods.Items {
		d.say("%s: ambient.istio.io/redirection=%s", p.Name, p.Annotations["ambient.istio.io/redirection"])
	}

	svc, err := c.Client().CoreV1().Services(ns).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		return err
	}
	clients, err := c.WaitPods(wctx, ns, "app=client", 1)
	if err != nil {
		return err
	}
	client := clients[0]
	target := fmt.Sprintf("http://%s:80/", svc.Spec.ClusterIP)
	d.step("from %s: echo client -n 10 %s — now through ztunnel, over HBONE between the nodes", client.Name, target)
	if err := c.WaitReachable(wctx, ns, client.Name, target); err != nil {
		return err
	}
	results, err := c.Request(wctx, ns, client.Name, target, 10)
	d.say("%s", echo.Summary(results))
	if err != nil {
		return err
	}
	if n := d.showAccess(ctx, c, "inbound", 2); n == 0 {
		return fmt.Errorf("no ztunnel logged an inbound HBONE connection to namespace %s", ns)
	}

	if err := d.webhookStory(ctx, c); err != nil {
		return err
	}
	if err := d.policyStory(ctx, c, client.Name, target); err != nil {
		return err
	}
	if err := d.waypointStory(ctx, c, client.Name, target); err != nil {
		return err
	}
	if err := d.ingressStory(ctx, c); err != nil {
		return err
	}
	if n := d.showAudit(c, 8); n == 0 {
		return fmt.Errorf("the webhook's audit log has no record of namespace %s", ns)
	}
	if err := d.showMetrics(ctx, c, client.Spec.NodeName); err != nil {
		return err
	}
	return d.showWaypointMetrics(ctx, c)
}

// accessRecords returns the last n access-log records of a log whose lines
// contain every one of match.
func accessRecords(logs string, n int, match ...string) []map[string]any {
	var recs []map[string]any
	for _, l := range strings.Split(logs, "\n") {
		if !strings.Contains(l, `"log":"access"`) {
			continue
		}
		ok := true
		for _, m := range match {
			ok = ok && strings.Contains(l, m)
		}
		var rec map[string]any
		if ok && json.Unmarshal([]byte(l), &rec) == nil {
			recs = append(recs, rec)
		}
	}
	if len(recs) > n {
		recs = recs[len(recs)-n:]
	}
	return recs
}

// ztunnelPods returns the ztunnel pods, optionally only the one on node.
func (d *Demo) ztunnelPods(ctx context.Context, c *cluster.Cluster, node string) []string {
	opts := metav1.ListOptions{LabelSelector: "app=ztunnel"}
	if node != "" {
		opts.FieldSelector = "spec.nodeName=" + node
	}
	pods, err := c.Client().CoreV1().Pods(d.cfg.ChartNamespace).List(ctx, opts)
	if err != nil {
		return nil
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	return names
}

// showAccess prints the last n access-log lines of a direction from every
// ztunnel and returns how many it printed.
func (d *Demo) showAccess(ctx context.Context, c *cluster.Cluster, direction string, n int) int {
	shown := 0
	for _, z := range d.ztunnelPods(ctx, c, "") {
		logs, err := c.Logs(d.cfg.ChartNamespace, z, "ztunnel")
		if err != nil {
			continue
		}
		for _, rec := range accessRecords(logs, n, `"direction":"`+direction+`"`, `"dst_namespace":"`+d.cfg.AppNamespace+`"`) {
			d.say("%s access log: %v %v  %v (%v) -> %v (%v)  sent=%v recv=%v%s", z, rec["msg"], rec["direction"],
				rec["src_workload"], rec["src_identity"], rec["dst_workload"], rec["dst_identity"], rec["bytes_sent"], rec["bytes_recv"],
				errSuffix(rec["error"]))
			shown++
		}
	}
	return shown
}

func errSuffix(v any) string {
	if v == nil {
		return ""
	}
	return fmt.Sprintf("  error=%v", v)
}

// webhookStory shows the webhook denying a waypoint Gateway that cannot
// work and a sidecar label, with their messages.
func (d *Demo) webhookStory(ctx context.Context, c *cluster.Cluster) error {
	ns := d.cfg.AppNamespace
	bad := fmt.Sprintf(`apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: %s}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: http, port: 80, protocol: HTTP}]
`, ns)
	d.step("kubectl apply: a waypoint Gateway listening on 80/HTTP (a waypoint takes HBONE on 15008)")
	if err := c.Apply(ctx, bad); err == nil {
		c.Delete(ctx, bad)
		return errors.New("the webhook accepted a waypoint Gateway without the HBONE listener")
	} else {
		d.say("denied by the webhook: %s", firstLine(err.Error()))
	}
	d.step("kubectl label namespace %s istio.io/dataplane-mode=sidecar", ns)
	patch := []byte(`{"metadata":{"labels":{"istio.io/dataplane-mode":"sidecar"}}}`)
	if _, err := c.Client().CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
		return errors.New("the webhook accepted istio.io/dataplane-mode=sidecar")
	} else {
		d.say("denied by the webhook: %s", firstLine(err.Error()))
	}
	return nil
}

// policyStory shows an L4 ALLOW policy refusing a client ztunnel, then
// lifts it.
func (d *Demo) policyStory(ctx context.Context, c *cluster.Cluster, client, target string) error {
	ns := d.cfg.AppNamespace
	policy := fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: only-frontend, namespace: %s}
spec:
  selector: {matchLabels: {app: echo}}
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/%s/sa/frontend"]}}]
`, ns, ns)
	d.step("kubectl apply: an AuthorizationPolicy that lets only service account frontend reach echo")
	if err := c.Apply(ctx, policy); err != nil {
		return fmt.Errorf("applying the policy: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := c.WaitFor(wctx, "the policy in force", func(ctx context.Context) (bool, error) {
		_, err := c.Request(ctx, ns, client, target, 1)
		return err != nil, nil
	})
	if err != nil {
		return err
	}
	results, _ := c.Request(ctx, ns, client, target, 5)
	d.say("from %s (service account client): %s", client, echo.Summary(results))
	for _, r := range results {
		if r.Response != nil {
			return fmt.Errorf("a request from %s passed the policy: %s", client, echo.Summary(results))
		}
	}
	d.showAccess(ctx, c, "inbound", 1)
	d.step("kubectl delete authorizationpolicy only-frontend")
	if err := c.Delete(ctx, policy); err != nil {
		return err
	}
	if err := c.WaitReachable(wctx, ns, client, target); err != nil {
		return err
	}
	d.say("requests from %s succeed again", client)
	return nil
}

// showAudit prints the webhook's last n audit records of the app namespace
// in one line each and returns how many it printed.
func (d *Demo) showAudit(c *cluster.Cluster, n int) int {
	d.step("the webhook's audit log (kubectl -n %s logs -l app=weft-webhook --tail=-1 --prefix=false | grep '\"apiVersion\":\"audit.k8s.io/v1\"'), last %d records:", d.cfg.ChartNamespace, n)
	pods, err := c.Client().CoreV1().Pods(d.cfg.ChartNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=weft-webhook"})
	if err != nil {
		return 0
	}
	type rec struct {
		when string
		line string
	}
	var recs []rec
	for _, p := range pods.Items {
		logs, err := c.Logs(d.cfg.ChartNamespace, p.Name, p.Spec.Containers[0].Name)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(logs, "\n") {
			if !strings.Contains(l, `"apiVersion":"audit.k8s.io/v1"`) {
				continue
			}
			var ev struct {
				Verb      string                    `json:"verb"`
				User      struct{ Username string } `json:"user"`
				ObjectRef struct {
					Resource, Namespace, Name string
				} `json:"objectRef"`
				Stage       string            `json:"stageTimestamp"`
				Annotations map[string]string `json:"annotations"`
			}
			if json.Unmarshal([]byte(l), &ev) != nil || ev.ObjectRef.Namespace != d.cfg.AppNamespace && ev.ObjectRef.Name != d.cfg.AppNamespace {
				continue
			}
			a := ev.Annotations
			recs = append(recs, rec{ev.Stage, fmt.Sprintf("%s %s %s/%s by %s: %s (%s)", ev.Stage, ev.Verb, ev.ObjectRef.Resource, ev.ObjectRef.Name,
				ev.User.Username, a["admission.weft.dev/decision"], a["admission.weft.dev/reason"])})
		}
	}
	// Records of both replicas, oldest first.
	for i := 1; i < len(recs); i++ {
		for j := i; j > 0 && recs[j].when < recs[j-1].when; j-- {
			recs[j], recs[j-1] = recs[j-1], recs[j]
		}
	}
	if len(recs) > n {
		recs = recs[len(recs)-n:]
	}
	for _, r := range recs {
		d.say("%s", r.line)
	}
	return len(recs)
}

// showMetrics prints an excerpt of a ztunnel's Istio metrics.
func (d *Demo) showMetrics(ctx context.Context, c *cluster.Cluster, node string) error {
	z := d.ztunnelPods(ctx, c, node)
	if len(z) == 0 {
		return fmt.Errorf("no ztunnel on node %s", node)
	}
	d.step("ztunnel %s metrics (curl localhost:15020/metrics), excerpt:", z[0])
	body, err := c.HTTPGet(ctx, d.cfg.ChartNamespace, z[0], "http://127.0.0.1:15020/metrics")
	if err != nil {
		return err
	}
	if d.excerpt(body, "istio_tcp_", 4) == 0 {
		return fmt.Errorf("ztunnel %s has no istio_tcp_* series for namespace %s", z[0], d.cfg.AppNamespace)
	}
	return nil
}

// excerpt prints up to n lines of a metrics page that start with prefix
// and name the app namespace, and returns how many there were.
func (d *Demo) excerpt(body, prefix string, n int) int {
	found := 0
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) && strings.Contains(l, d.cfg.AppNamespace) {
			if found < n {
				d.say("%s", l)
			}
			found++
		}
	}
	return found
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
