package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/echo"
)

// The restart tests put a steady load of new connections on the mesh while
// a part of it restarts the way an operator restarts it, and count what
// got through. Rates and windows shape the load; the pass criteria are
// counts.
const (
	// every is the pace of new connections: 50 a second.
	every = 20 * time.Millisecond
	// window is the least time the load runs; it goes on until the restart
	// has completed.
	window = 30 * time.Second
	// chunk is the length of one run of the echo client; the load is a
	// series of them.
	chunk = 10 * time.Second
)

// TestZtunnelRestart restarts the ztunnel DaemonSet (kubectl rollout
// restart) on both nodes while a client opens 50 new connections a second
// to a pod on the other node: at least 99.9% of them must succeed, and
// every old ztunnel must drain and exit by itself.
func TestZtunnelRestart(t *testing.T) {
	c := mesh(t)
	const ns = "zt-restart"
	client, _, target := crossNodeApp(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	old := podNames(t, c, meshNS, "app=ztunnel")

	results, restartedAt := loadDuringRestart(t, c, ns, client.Name, target, func(ctx context.Context) error {
		return rolloutRestart(ctx, c, "daemonsets", "ztunnel", "app=ztunnel")
	})
	checkLoad(t, c, "the ztunnel rollout restart", results, restartedAt)

	checkHandedOver(t, c, old)
	// The new ztunnels carry the traffic on both ends.
	if rs, err := c.Request(ctx, ns, client.Name, target, 20); err != nil {
		t.Errorf("after the rollout: %v (%s)", err, echo.Summary(rs))
	}
}

// TestZtunnelPodDeleted deletes the ztunnel pod of the client's node the
// way `kubectl delete pod` does (with its grace period) under the same
// load: the DaemonSet starts a replacement at once, and the old ztunnel
// keeps serving until the new one listens in every pod, so at least 99.9%
// of the new connections still succeed.
func TestZtunnelPodDeleted(t *testing.T) {
	c := mesh(t)
	const ns = "zt-delete"
	client, _, target := crossNodeApp(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	selector := "app=ztunnel"
	pods, err := c.Client().CoreV1().Pods(meshNS).List(ctx, metav1.ListOptions{LabelSelector: selector, FieldSelector: "spec.nodeName=" + client.Spec.NodeName})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("ztunnel on %s: %v (%d pods)", client.Spec.NodeName, err, len(pods.Items))
	}
	victim := pods.Items[0].Name
	results, restartedAt := loadDuringRestart(t, c, ns, client.Name, target, func(ctx context.Context) error {
		if err := c.Client().CoreV1().Pods(meshNS).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
			return err
		}
		if err := c.WaitPodGone(ctx, meshNS, victim); err != nil {
			return err
		}
		_, err := c.WaitDaemonSet(ctx, meshNS, "ztunnel")
		return err
	})
	checkLoad(t, c, "the ztunnel pod's deletion", results, restartedAt)
	checkHandedOver(t, c, map[string]bool{victim: true})
}

// TestWaypointRestart restarts a namespace's waypoint (kubectl rollout
// restart: the new pod starts, then the old one is told to stop) while a
// client opens 50 new connections a second to a Service behind it, by
// name: at least 99.9% of them must succeed. The old waypoint keeps taking
// connections until the ztunnels have learnt it is going.
func TestWaypointRestart(t *testing.T) {
	c := mesh(t)
	const ns = "zt-wprestart"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	manifest := cluster.NamespaceManifest(ns, map[string]string{"istio.io/dataplane-mode": "ambient", "istio.io/use-waypoint": "waypoint"}) +
		"---\n" + cluster.WaypointGateway(ns, "waypoint") +
		"---\n" + cluster.EchoApp(ns, "echo", cluster.EchoOptions{}) +
		"---\n" + cluster.EchoApp(ns, "client", cluster.EchoOptions{})
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	removeNamespaceAtEnd(t, c, ns)
	for _, d := range []string{"echo", "client", "waypoint"} {
		if err := c.WaitDeployment(ctx, ns, d); err != nil {
			c.Dump(t.Logf)
			t.Fatal(err)
		}
	}
	clients, err := c.WaitPods(ctx, ns, "app=client", 1)
	if err != nil {
		t.Fatal(err)
	}
	// By name, as an app calls a Service: every connection resolves it.
	target := "http://echo." + ns + ".svc.cluster.local/"
	const selector = "gateway.networking.k8s.io/gateway-name=waypoint"
	viaWaypoint := func() error {
		return c.WaitFor(ctx, "requests through the waypoint", func(ctx context.Context) (bool, error) {
			wps, err := c.WaitPods(ctx, ns, selector, 1)
			if err != nil || len(wps) != 1 {
				return false, nil
			}
			rs, _ := c.Request(ctx, ns, clients[0].Name, target, 1)
			if len(rs) != 1 || rs[0].Response == nil {
				return false, nil
			}
			host, _, _ := net.SplitHostPort(rs[0].Response.Peer)
			return host == wps[0].Status.PodIP, nil
		})
	}
	if err := viaWaypoint(); err != nil {
		t.Fatal(err)
	}
	results, restartedAt := loadDuringRestart(t, c, ns, clients[0].Name, target, func(ctx context.Context) error {
		return rolloutRestartIn(ctx, c, ns, "deployments", "waypoint", selector)
	})
	checkLoad(t, c, "the waypoint's rollout restart", results, restartedAt)
	if err := viaWaypoint(); err != nil {
		t.Errorf("after the rollout: %v", err)
	}
}

// crossNodeApp deploys the echo app and a client in the ambient namespace
// ns (removed at the end) and waits until the client reaches the server on
// the other node: it returns the client, that server and its URL.
func crossNodeApp(t *testing.T, c *cluster.Cluster, ns string) (client, remote corev1.Pod, target string) {
	t.Helper()
	servers, client := app(t, c, ns, true)
	removeNamespaceAtEnd(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	remote = otherNode(servers, client)
	target = fmt.Sprintf("http://%s:8080/", remote.Status.PodIP)
	if err := c.WaitReachable(ctx, ns, client.Name, target); err != nil {
		t.Fatal(err)
	}
	return client, remote, target
}

// checkLoad checks that at least 99.9% of the new connections opened
// during what (a restart, started restartedAt into the load) succeeded,
// logs the count and the failures, and returns how many succeeded.
func checkLoad(t *testing.T, c *cluster.Cluster, what string, results []echo.Result, restartedAt time.Duration) int {
	t.Helper()
	ok, n := succeeded(results)
	t.Logf("%s: %d/%d new connections succeeded (%.2f%%), started %s into the load",
		what, ok, n, 100*float64(ok)/float64(n), restartedAt.Round(time.Millisecond))
	logFailures(t, results)
	if ok*1000 < n*999 {
		t.Errorf("%d of %d new connections failed during %s; want at least 99.9%% to succeed", n-ok, n, what)
		dumpZtunnels(t, c)
	}
	return ok
}

// checkHandedOver checks that each old ztunnel is gone, saw its successor
// listen in all its pods, and drained and exited by itself within its grace
// period (a killed one never logs that it stopped).
func checkHandedOver(t *testing.T, c *cluster.Cluster, old map[string]bool) {
	t.Helper()
	now := podNames(t, c, meshNS, "app=ztunnel")
	for name := range old {
		if now[name] {
			t.Errorf("ztunnel %s was not replaced", name)
			continue
		}
		logs, err := c.Logs(meshNS, name, "ztunnel")
		if err != nil {
			t.Errorf("log of the old ztunnel %s: %v", name, err)
			continue
		}
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, `"msg":"pods handed over"`) || strings.Contains(line, "without a successor") {
				t.Logf("old %s: %s", name, line)
			}
		}
		if !strings.Contains(logs, `"msg":"pods handed over"`) {
			t.Errorf("the old ztunnel %s stopped before its successor listened in all its pods:\n%s", name, lastN(logs, 20))
		}
		if !strings.Contains(logs, `"msg":"ztunnel stopped"`) {
			t.Errorf("the old ztunnel %s did not stop by itself (killed at the end of its grace period?):\n%s", name, lastN(logs, 20))
		}
	}
}

// TestCNIAgentRestart restarts the CNI agent DaemonSet while an enrolled
// client sends requests with a plaintext canary header to a pod on the
// other node, capturing the client node's underlay throughout: the canary
// never crosses the wire, the traffic keeps flowing, and a pod created
// after the restart is enrolled and talks HBONE.
func TestCNIAgentRestart(t *testing.T) {
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Fatal("tcpdump is needed (apt-get install tcpdump; make test installs it)")
	}
	c := mesh(t)
	const ns, plainNS = "zt-cni-restart", "zt-cni-restart-plain"
	servers, client := app(t, c, ns, true)
	removeNamespaceAtEnd(t, c, ns)
	plainServers, plainClient := app(t, c, plainNS, false)
	removeNamespaceAtEnd(t, c, plainNS)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	remote := otherNode(servers, client)
	target := fmt.Sprintf("http://%s:8080/", remote.Status.PodIP)
	plainTarget := fmt.Sprintf("http://%s:8080/", otherNode(plainServers, plainClient).Status.PodIP)
	for _, p := range []struct{ ns, pod, target string }{{ns, client.Name, target}, {plainNS, plainClient.Name, plainTarget}} {
		if err := c.WaitReachable(ctx, p.ns, p.pod, p.target); err != nil {
			t.Fatal(err)
		}
	}
	node, _ := nodeNamed(c, client.Spec.NodeName)
	plainNode, _ := nodeNamed(c, plainClient.Spec.NodeName)
	pcap := filepath.Join(t.TempDir(), "underlay.pcap")
	controlPcap := filepath.Join(t.TempDir(), "control.pcap")
	stop := capture(t, node.Netns, pcap)
	stopControl := capture(t, plainNode.Netns, controlPcap)

	const canary, control = "plaintext-canary-3d81e7", "control-canary-a40c96"
	results, restartedAt := loadDuringRestart(t, c, ns, client.Name, target, func(ctx context.Context) error {
		return rolloutRestart(ctx, c, "daemonsets", "weft-cni-agent", "app=weft-cni-agent")
	}, "X-Weft-Canary: "+canary)
	ok, n := succeeded(results)
	t.Logf("CNI agent rollout restart: %d/%d requests succeeded, restart started %s into the load", ok, n, restartedAt.Round(time.Millisecond))
	logFailures(t, results)
	if ok != n {
		t.Errorf("%d of %d requests of an enrolled pod failed while the CNI agent restarted; its traffic does not need the agent", n-ok, n)
	}

	// A pod created after the restart is enrolled and talks HBONE; put it
	// on the captured node.
	newPod := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: late, namespace: %s, labels: {app: late}}
spec:
  nodeName: %s
  serviceAccountName: client
  terminationGracePeriodSeconds: 2
  containers:
  - name: echo
    image: weft/echo:latest
    imagePullPolicy: IfNotPresent
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    readinessProbe:
      httpGet: {path: /ready, port: 8080}
      periodSeconds: 1
`, ns, client.Spec.NodeName)
	if err := c.Apply(ctx, newPod); err != nil {
		t.Fatal(err)
	}
	late, err := c.WaitPods(ctx, ns, "app=late", 1)
	if err != nil {
		c.Dump(t.Logf)
		t.Fatal(err)
	}
	if err := c.WaitRedirected(ctx, ns, 4); err != nil {
		c.Dump(t.Logf)
		t.Fatalf("the pod created after the CNI agent restarted: %v", err)
	}
	if rs, err := c.Request(ctx, ns, late[0].Name, target, 5, "X-Weft-Canary: "+canary); err != nil {
		t.Errorf("from the pod created after the restart: %v (%s)", err, echo.Summary(rs))
	}
	if _, err := c.Request(ctx, plainNS, plainClient.Name, plainTarget, 5, "X-Weft-Canary: "+control); err != nil {
		t.Fatal(err)
	}
	stop()
	stopControl()

	raw, err := os.ReadFile(pcap)
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.Index(raw, []byte(canary)); i >= 0 {
		t.Errorf("the plaintext of an enrolled pod's request crossed the link between the nodes (offset %d of the capture)", i)
	}
	if rawControl, _ := os.ReadFile(controlPcap); !bytes.Contains(rawControl, []byte(control)) {
		t.Fatal("the capture does not show the plaintext of traffic outside the mesh either; it proves nothing")
	}
	out, err := exec.Command("tcpdump", "-nn", "-r", pcap).CombinedOutput()
	if err != nil {
		t.Fatalf("reading the capture: %v\n%s", err, out)
	}
	hbone := fmt.Sprintf(" %s.", late[0].Status.PodIP)
	found := false
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, hbone) && strings.Contains(line, "> "+remote.Status.PodIP+".15008:") {
			found = true
			break
		}
	}
	if !found {
		t.Errorf("no HBONE packet from the new pod %s to %s:15008 in the capture:\n%s", late[0].Status.PodIP, remote.Status.PodIP, lastN(string(out), 40))
	}
	if bad := remote.Status.PodIP + ".8080"; strings.Contains(string(out), bad) {
		t.Errorf("packets to the app port %s crossed the link unencrypted", bad)
	}
}

// TestControlPlaneRestart takes the control plane away for a while with
// traffic flowing: ztunnel keeps its last configuration and certificates,
// so an open connection and new ones all succeed; a DENY policy written
// while it is away takes effect once it is back.
func TestControlPlaneRestart(t *testing.T) {
	c := mesh(t)
	const ns = "zt-cp-restart"
	client, _, target := crossNodeApp(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	deploys := c.Client().AppsV1().Deployments(meshNS)
	d, err := deploys.Get(ctx, "weft-controlplane", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	scale := func(n int32) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
		if _, err := deploys.Patch(ctx, "weft-controlplane", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			scale(replicas)
		}
	})

	// Two loads for the whole outage: new connections, and one kept-alive
	// connection that must survive it.
	const outage = 20 * time.Second
	type loadResult struct {
		rs  []echo.Result
		err error
	}
	newConns, kept := make(chan loadResult, 1), make(chan loadResult, 1)
	span := outage + 40*time.Second
	go func() {
		rs, err := load(ctx, c, ns, client.Name, target, every*5, span, false)
		newConns <- loadResult{rs, err}
	}()
	go func() {
		rs, err := load(ctx, c, ns, client.Name, target, 100*time.Millisecond, span, true)
		kept <- loadResult{rs, err}
	}()
	time.Sleep(3 * time.Second)
	scale(0)
	if err := c.WaitFor(ctx, "no control plane pod", func(ctx context.Context) (bool, error) {
		pods, err := c.Client().CoreV1().Pods(meshNS).List(ctx, metav1.ListOptions{LabelSelector: "app=weft-controlplane"})
		return err == nil && len(pods.Items) == 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	gone := time.Now()
	t.Logf("control plane gone")
	// Written while the control plane is away: nothing enforces it yet.
	deny := fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-client, namespace: %s}
spec:
  selector: {matchLabels: {app: echo}}
  action: DENY
  rules:
  - from:
    - source: {principals: ["cluster.local/ns/%s/sa/client"]}
`, ns, ns)
	if err := c.Apply(ctx, deny); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(gone.Add(outage)))
	// The loads go on after the control plane returns, and requests fail by
	// design once the DENY reaches ztunnel: those started before it was
	// scaled up count.
	returning := time.Now()
	scale(replicas)
	restored = true
	if err := c.WaitDeployment(ctx, meshNS, "weft-controlplane"); err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane back, %s after it was gone", time.Since(gone).Round(time.Second))
	nc, kc := <-newConns, <-kept
	for _, l := range []struct {
		name string
		lr   loadResult
	}{{"new connections", nc}, {"kept-alive connection", kc}} {
		if len(l.lr.rs) == 0 {
			t.Fatalf("%s: no results: %v", l.name, l.lr.err)
		}
		var during []echo.Result
		for _, r := range l.lr.rs {
			if r.Start.Before(returning) {
				during = append(during, r)
			}
		}
		ok, n := succeeded(during)
		t.Logf("%s until the control plane was scaled up again: %d/%d succeeded", l.name, ok, n)
		if ok != n {
			logFailures(t, during)
			t.Errorf("%s: %d of %d requests failed without the control plane", l.name, n-ok, n)
		}
		if l.name == "kept-alive connection" {
			if conns := echo.Connections(during); len(conns) != 1 {
				t.Errorf("the kept-alive connection did not survive the outage: requests went over %d connections: %v", len(conns), conns)
			}
		}
	}
	// For the record, not a criterion: whether the DENY also ends the
	// connection that was open before it arrived.
	var after []echo.Result
	for _, r := range kc.rs {
		if !r.Start.Before(returning) {
			after = append(after, r)
		}
	}
	ok, n := succeeded(after)
	t.Logf("kept-alive connection after the control plane was scaled up (the DENY arrives meanwhile): %d/%d succeeded, successes per connection %v", ok, n, echo.Connections(after))
	logFailures(t, after)
	// The policy written during the outage is enforced now.
	waitRefused(t, c, ns, client.Name, target)
	if err := c.Delete(ctx, deny); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReachable(ctx, ns, client.Name, target); err != nil {
		t.Errorf("after the policy was deleted: %v", err)
	}
}

// loadDuringRestart runs the paced load from pod to target in chunks for
// at least window, calls restart a few seconds in, and keeps the load up
// until restart has returned. It returns every result and when the restart
// began, relative to the start of the load.
func loadDuringRestart(t *testing.T, c *cluster.Cluster, ns, pod, target string, restart func(context.Context) error, headers ...string) ([]echo.Result, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	var restartedAt time.Duration
	done := make(chan error, 1)
	go func() {
		time.Sleep(3 * time.Second) // some load before the restart
		restartedAt = time.Since(start)
		err := restart(ctx)
		t.Logf("restart done %s into the load", time.Since(start).Round(time.Millisecond))
		done <- err
	}()
	var all []echo.Result
	var restartErr error
	restarted := false
	for i := 0; ; i++ {
		rs, err := load(ctx, c, ns, pod, target, every, chunk, false, headers...)
		if len(rs) == 0 {
			t.Fatalf("load: %v", err)
		}
		all = append(all, rs...)
		if !restarted {
			select {
			case restartErr = <-done:
				restarted = true
			default:
			}
		}
		if restarted && time.Since(start) >= window {
			break
		}
		if i > 20 {
			t.Fatal("the restart did not complete within 20 runs of the load")
		}
	}
	if restartErr != nil {
		c.Dump(t.Logf)
		t.Fatalf("restart: %v", restartErr)
	}
	return all, restartedAt
}

// load runs the echo client in a pod: a request every interval for span,
// each on a new connection unless keepAlive, and returns the results (the
// error only says the client could not be run or decoded).
func load(ctx context.Context, c *cluster.Cluster, ns, pod, target string, interval, span time.Duration, keepAlive bool, headers ...string) ([]echo.Result, error) {
	argv := []string{c.BinPath("echo"), "client", "-json", "-every", interval.String(), "-for", span.String(), "-timeout", "5s"}
	if keepAlive {
		argv = append(argv, "-keepalive")
	}
	for _, h := range headers {
		argv = append(argv, "-H", h)
	}
	argv = append(argv, target)
	out, _, execErr := c.Exec(ctx, ns, pod, argv...)
	var results []echo.Result
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r echo.Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return results, fmt.Errorf("decoding %q: %w", sc.Text(), err)
		}
		results = append(results, r)
	}
	if len(results) == 0 {
		return nil, fmt.Errorf("load from %s/%s: no results: %v", ns, pod, execErr)
	}
	return results, nil
}

func succeeded(rs []echo.Result) (ok, n int) {
	for _, r := range rs {
		if r.Response != nil {
			ok++
		}
	}
	return ok, len(rs)
}

// logFailures logs the first failed requests, with when they started.
func logFailures(t *testing.T, rs []echo.Result) {
	t.Helper()
	if len(rs) == 0 {
		return
	}
	t0 := rs[0].Start
	shown := 0
	for _, r := range rs {
		if r.Response != nil {
			continue
		}
		if shown++; shown > 20 {
			t.Logf("... and more")
			return
		}
		t.Logf("failed at +%s after %s: %s", r.Start.Sub(t0).Round(time.Millisecond), r.Duration.Round(time.Millisecond), r.Error)
	}
}

// rolloutRestart does what `kubectl rollout restart` does to a DaemonSet
// or Deployment in the mesh namespace, then waits until every pod matching
// selector is of the new template, ready, and the old ones are gone.
func rolloutRestart(ctx context.Context, c *cluster.Cluster, resource, name, selector string) error {
	return rolloutRestartIn(ctx, c, meshNS, resource, name, selector)
}

// rolloutRestartIn restarts a DaemonSet or Deployment of namespace ns as
// kubectl rollout restart does and waits until every pod of selector is
// a new one and ready, and the old ones are gone.
func rolloutRestartIn(ctx context.Context, c *cluster.Cluster, ns, resource, name, selector string) error {
	stamp := time.Now().Format(time.RFC3339Nano)
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, stamp)
	var want int32
	switch resource {
	case "daemonsets":
		ds, err := c.Client().AppsV1().DaemonSets(ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			return fmt.Errorf("restarting daemonset %s: %w", name, err)
		}
		want = ds.Status.DesiredNumberScheduled
	case "deployments":
		d, err := c.Client().AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			return fmt.Errorf("restarting deployment %s: %w", name, err)
		}
		want = *d.Spec.Replicas
	default:
		return fmt.Errorf("rolloutRestart: unsupported resource %q", resource)
	}
	return c.WaitFor(ctx, "rollout of "+name, func(ctx context.Context) (bool, error) {
		pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, nil
		}
		n := int32(0)
		for _, p := range pods.Items {
			if p.Annotations["kubectl.kubernetes.io/restartedAt"] != stamp || p.DeletionTimestamp != nil || !ready(&p) {
				return false, nil
			}
			n++
		}
		return n == want, nil
	})
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podNames returns the names of the pods matching selector in namespace.
func podNames(t *testing.T, c *cluster.Cluster, namespace, selector string) map[string]bool {
	t.Helper()
	pods, err := c.Client().CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range pods.Items {
		out[p.Name] = true
	}
	return out
}

// removeNamespaceAtEnd deletes a namespace when the test ends and waits
// until it is gone, so its pods do not linger into the next test.
func removeNamespaceAtEnd(t *testing.T, c *cluster.Cluster, ns string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := c.Client().CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", ns, err)
			return
		}
		err := c.WaitFor(ctx, "namespace "+ns+" gone", func(ctx context.Context) (bool, error) {
			_, err := c.Client().CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Errorf("namespace %s: %v", ns, err)
		}
	})
}

// TestNodeRestart stops and starts the kubelet and containerd of the
// client's node, as an operator restarting a node's services does, while
// the client opens 50 new connections a second to a pod on the other
// node: the pods keep running (no container restarts), at least 99.9% of
// the connections succeed, and they stay in HBONE, mTLS from the client's
// identity as the server's ztunnel counts them. A pod created after the
// restart is enrolled before it starts, through the restarted runtime's
// CNI chain. Real nodes only.
func TestNodeRestart(t *testing.T) {
	c := mesh(t)
	if c.NodeMode() != cluster.NodeModeKubelet {
		t.Skip("the stand-in's nodes have no kubelet or containerd to restart (WEFT_NODES=standin)")
	}
	const ns = "zt-node-restart"
	client, remote, target := crossNodeApp(t, c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	restarts := func() map[string]int32 {
		out := map[string]int32{}
		for _, sel := range []string{"app=ztunnel", "app=weft-cni-agent"} {
			pods, err := c.Client().CoreV1().Pods(meshNS).List(ctx, metav1.ListOptions{LabelSelector: sel, FieldSelector: "spec.nodeName=" + client.Spec.NodeName})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pods.Items {
				for _, s := range p.Status.ContainerStatuses {
					out[p.Name+"/"+s.Name] = s.RestartCount
				}
			}
		}
		p, err := c.Client().CoreV1().Pods(ns).Get(ctx, client.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range p.Status.ContainerStatuses {
			out[p.Name+"/"+s.Name] = s.RestartCount
		}
		return out
	}
	before := restarts()
	// The kubelet reports each start of its own as a Node event.
	starts := func() int {
		evs, err := c.Client().CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + client.Spec.NodeName + ",reason=Starting"})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range evs.Items {
			n += int(max(e.Count, 1))
		}
		return n
	}
	startsBefore := starts()
	mtls := func() float64 {
		return cluster.SumSeries(ztunnelMetrics(t, c, remote.Spec.NodeName), "istio_tcp_connections_opened_total", `reporter="destination"`,
			fmt.Sprintf(`source_principal="spiffe://cluster.local/ns/%s/sa/%s"`, ns, client.Spec.ServiceAccountName), `connection_security_policy="mutual_tls"`)
	}
	mtlsBefore := mtls()

	results, restartedAt := loadDuringRestart(t, c, ns, client.Name, target, func(ctx context.Context) error {
		return c.RestartNode(ctx, client.Spec.NodeName)
	})
	ok := checkLoad(t, c, "node "+client.Spec.NodeName+"'s kubelet and containerd restart", results, restartedAt)
	if got := mtlsBefore + float64(ok); mtls() < got {
		t.Errorf("the server's ztunnel counted %v mTLS connections from the client, want at least %v (every one that succeeded)", mtls(), got)
	}
	err := c.WaitFor(ctx, "the restarted kubelet's Starting event", func(ctx context.Context) (bool, error) { return starts() > startsBefore, nil })
	if err != nil {
		t.Errorf("%v: the node's kubelet did not start again (%d Starting events before, %d now)", err, startsBefore, starts())
	}
	if after := restarts(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("container restart counts %v after the node restart, want %v: the containers should have kept running", after, before)
	}

	// Pods created now, one on each node (so one through the restarted
	// runtime), are enrolled before they start.
	if err := c.Apply(ctx, cluster.EchoApp(ns, "after", cluster.EchoOptions{Replicas: 2, Spread: true})); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeployment(ctx, ns, "after"); err != nil {
		t.Fatal(err)
	}
	pods, err := c.WaitPods(ctx, ns, "app=after", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if a := p.Annotations["ambient.istio.io/redirection"]; a != "enabled" {
			t.Errorf("pod %s on %s, created after the restart: redirection %q, want enabled", p.Name, p.Spec.NodeName, a)
		}
		if rs, err := c.Request(ctx, ns, p.Name, target, 5); err != nil {
			t.Errorf("from %s on %s, created after the restart: %v (%s)", p.Name, p.Spec.NodeName, err, echo.Summary(rs))
		}
	}
}
