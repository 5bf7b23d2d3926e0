// Package e2e runs ztunnel in the local cluster with the rest of the mesh,
// all installed by the chart: pods enrolled by the CNI agent, workload state
// and certificates from the control plane, traffic between pods on two
// nodes carried over HBONE.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/test/cluster"
)

var shared = cluster.NewShared(cluster.Config{Images: []string{
	"./test/cmd/echo", "./ztunnel/cmd/ztunnel", "./controlplane/cmd/weft-controlplane",
	"./cni/cmd/weft-cni", "./cni/cmd/weft-cni-agent", "./webhook/cmd/weft-webhook",
}})

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

const meshNS = "weft-system"

// mesh installs the chart once per test binary and waits for every part.
func mesh(t *testing.T) *cluster.Cluster {
	t.Helper()
	c := shared.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.InstallMesh(ctx, meshNS); err != nil {
		c.Dump(t.Logf)
		t.Fatal(err)
	}
	return c
}

// app deploys echo servers (spread over the nodes) and a client in an
// ambient namespace and waits until the pods are enrolled.
func app(t *testing.T, c *cluster.Cluster, ns string, ambient bool) (servers []corev1.Pod, client corev1.Pod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	labels := map[string]string{}
	if ambient {
		labels["istio.io/dataplane-mode"] = "ambient"
	}
	manifest := cluster.NamespaceManifest(ns, labels) + "---\n" +
		cluster.EchoApp(ns, "echo", cluster.EchoOptions{Replicas: 2, Spread: true}) + "---\n" +
		cluster.EchoApp(ns, "client", cluster.EchoOptions{})
	if err := c.Apply(ctx, manifest); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"echo", "client"} {
		if err := c.WaitDeployment(ctx, ns, d); err != nil {
			c.Dump(t.Logf)
			t.Fatal(err)
		}
	}
	servers, err := c.WaitPods(ctx, ns, "app=echo", 2)
	if err != nil {
		t.Fatal(err)
	}
	clients, err := c.WaitPods(ctx, ns, "app=client", 1)
	if err != nil {
		t.Fatal(err)
	}
	if ambient {
		err := c.WaitRedirected(ctx, ns, 3)
		if err != nil {
			c.Dump(t.Logf)
			t.Fatal(err)
		}
	}
	return servers, clients[0]
}

// ztunnelMetrics returns the metrics of the ztunnel on node.
func ztunnelMetrics(t *testing.T, c *cluster.Cluster, node string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := c.Client().CoreV1().Pods(meshNS).List(ctx, metav1.ListOptions{LabelSelector: "app=ztunnel", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("ztunnel on %s: %v (%d pods)", node, err, len(pods.Items))
	}
	out, err := c.HTTPGet(ctx, meshNS, pods.Items[0].Name, "http://127.0.0.1:15020/metrics")
	if err != nil {
		t.Fatalf("reading ztunnel metrics on %s: %v", node, err)
	}
	return out
}

func TestPodToPodOverHBONE(t *testing.T) {
	c := mesh(t)
	servers, client := app(t, c, "zt-hbone", true)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	remote := otherNode(servers, client)
	target := fmt.Sprintf("http://%s:8080/", remote.Status.PodIP)
	if err := c.WaitReachable(ctx, "zt-hbone", client.Name, target); err != nil {
		c.Dump(t.Logf)
		t.Fatal(err)
	}
	results, err := c.Request(ctx, "zt-hbone", client.Name, target, 5)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Response == nil || r.Response.Pod != remote.Name {
			t.Errorf("answer %+v, want one from %s", r, remote.Name)
		}
		// The server's ztunnel keeps the client's address (ENABLE_ORIG_SRC).
		if r.Response != nil && peerIP(r.Response.Peer) != client.Status.PodIP {
			t.Errorf("the server saw the connection from %s, want the client's address %s", r.Response.Peer, client.Status.PodIP)
		}
	}
	m := ztunnelMetrics(t, c, remote.Spec.NodeName)
	want := fmt.Sprintf(`source_principal="spiffe://cluster.local/ns/zt-hbone/sa/%s"`, client.Spec.ServiceAccountName)
	found := false
	for _, line := range strings.Split(m, "\n") {
		if strings.HasPrefix(line, "istio_tcp_connections_opened_total{") && strings.Contains(line, `reporter="destination"`) &&
			strings.Contains(line, want) && strings.Contains(line, `connection_security_policy="mutual_tls"`) {
			found = true
		}
	}
	if !found {
		t.Errorf("the server's ztunnel did not count an mTLS connection from %s:\n%s", want, grepLines(m, "istio_tcp_connections_opened_total"))
		dumpZtunnels(t, c)
	}
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// dumpZtunnels logs every ztunnel's log tail, for failures.
func dumpZtunnels(t *testing.T, c *cluster.Cluster) {
	pods, err := c.Client().CoreV1().Pods(meshNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, p := range pods.Items {
		if !strings.HasPrefix(p.Name, "ztunnel") && !strings.HasPrefix(p.Name, "weft-cni") {
			continue
		}
		logs, _ := c.Logs(meshNS, p.Name, p.Spec.Containers[0].Name)
		if len(logs) > 6000 {
			logs = logs[len(logs)-6000:]
		}
		t.Logf("%s on %s:\n%s", p.Name, p.Spec.NodeName, logs)
	}
}

// TestEncryptedOnTheWire captures the link between the nodes while a client
// sends a recognisable header to a pod on the other node: the capture must
// show HBONE on 15008 and never the plaintext.
func TestEncryptedOnTheWire(t *testing.T) {
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Fatal("tcpdump is needed (apt-get install tcpdump; make test installs it)")
	}
	c := mesh(t)
	servers, client := app(t, c, "zt-wire", true)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	remote := otherNode(servers, client)
	target := fmt.Sprintf("http://%s:8080/", remote.Status.PodIP)
	if err := c.WaitReachable(ctx, "zt-wire", client.Name, target); err != nil {
		t.Fatal(err)
	}
	// A control pair outside the mesh proves the capture sees plaintext.
	plainServers, plainClient := app(t, c, "zt-wire-plain", false)
	plainTarget := fmt.Sprintf("http://%s:8080/", otherNode(plainServers, plainClient).Status.PodIP)
	if err := c.WaitReachable(ctx, "zt-wire-plain", plainClient.Name, plainTarget); err != nil {
		t.Fatal(err)
	}
	node, _ := nodeNamed(c, client.Spec.NodeName)
	plainNode, _ := nodeNamed(c, plainClient.Spec.NodeName)
	pcap := filepath.Join(t.TempDir(), "underlay.pcap")
	controlPcap := filepath.Join(t.TempDir(), "control.pcap")
	stop := capture(t, node.Netns, pcap)
	stopControl := capture(t, plainNode.Netns, controlPcap)
	const canary, control = "plaintext-canary-7f3a9c", "control-canary-51be02"
	if _, err := c.Request(ctx, "zt-wire", client.Name, target, 5, "X-Weft-Canary: "+canary); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Request(ctx, "zt-wire-plain", plainClient.Name, plainTarget, 5, "X-Weft-Canary: "+control); err != nil {
		t.Fatal(err)
	}
	stop()
	stopControl()
	raw, err := os.ReadFile(pcap)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(canary)) {
		t.Error("the request's plaintext crossed the link between the nodes")
	}
	if rawControl, _ := os.ReadFile(controlPcap); !bytes.Contains(rawControl, []byte(control)) {
		t.Fatal("the capture does not show the plaintext of traffic outside the mesh either; it proves nothing")
	}
	out, err := exec.Command("tcpdump", "-nn", "-r", pcap).CombinedOutput()
	if err != nil {
		t.Fatalf("reading the capture: %v\n%s", err, out)
	}
	if want := remote.Status.PodIP + ".15008"; !strings.Contains(string(out), want) {
		t.Errorf("no packet to %s in the capture:\n%s", want, lastN(string(out), 60))
	}
	if bad := remote.Status.PodIP + ".8080"; strings.Contains(string(out), bad) {
		t.Errorf("packets to the app port %s crossed the link unencrypted", bad)
	}
}

// capture runs tcpdump on eth0 (the underlay) inside a node's netns until
// the returned stop is called.
func capture(t *testing.T, nodeNetns, file string) (stop func()) {
	t.Helper()
	ns, err := netns.Open(nodeNetns)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	cmd := exec.Command("tcpdump", "-Z", "root", "--immediate-mode", "-i", "eth0", "-U", "-s", "0", "-w", file, "tcp")
	stderr, _ := cmd.StderrPipe()
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatalf("starting tcpdump: %v", err)
	}
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			t.Logf("tcpdump: %s", sc.Text())
			if !once && strings.Contains(sc.Text(), "listening on") {
				close(listening)
				once = true
			}
		}
	}()
	select {
	case <-listening:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("tcpdump did not start")
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}
	t.Cleanup(stop)
	return stop
}

// TestL4Policy: an ALLOW policy for one service account lets only it in;
// a DENY on the port then blocks it too; the app never sees refused peers.
func TestL4Policy(t *testing.T) {
	c := mesh(t)
	const ns = "zt-policy"
	servers, _ := app(t, c, ns, true)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if err := c.Apply(ctx, cluster.EchoApp(ns, "other", cluster.EchoOptions{})); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeployment(ctx, ns, "other"); err != nil {
		t.Fatal(err)
	}
	others, err := c.WaitPods(ctx, ns, "app=other", 1)
	if err != nil {
		t.Fatal(err)
	}
	clients, _ := c.WaitPods(ctx, ns, "app=client", 1)
	client, other := clients[0].Name, others[0].Name
	target := fmt.Sprintf("http://%s:8080/", servers[0].Status.PodIP)
	for _, p := range []string{client, other} {
		if err := c.WaitReachable(ctx, ns, p, target); err != nil {
			t.Fatal(err)
		}
	}
	allow := fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-client, namespace: %s}
spec:
  selector: {matchLabels: {app: echo}}
  action: ALLOW
  rules:
  - from:
    - source: {principals: ["cluster.local/ns/%s/sa/client"]}
`, ns, ns)
	if err := c.Apply(ctx, allow); err != nil {
		t.Fatal(err)
	}
	waitRefused(t, c, ns, other, target)
	if _, err := c.Request(ctx, ns, client, target, 3); err != nil {
		t.Errorf("the allowed service account was refused: %v", err)
	}
	deny := fmt.Sprintf(`apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-http, namespace: %s}
spec:
  selector: {matchLabels: {app: echo}}
  action: DENY
  rules:
  - to:
    - operation: {ports: ["8080"]}
`, ns)
	if err := c.Apply(ctx, deny); err != nil {
		t.Fatal(err)
	}
	waitRefused(t, c, ns, client, target)
	if err := c.Delete(ctx, allow+"---\n"+deny); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReachable(ctx, ns, other, target); err != nil {
		t.Errorf("after the policies were deleted: %v", err)
	}
}

// waitRefused waits until requests from pod to target fail (policy pushed).
func waitRefused(t *testing.T, c *cluster.Cluster, ns, pod, target string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := c.WaitFor(ctx, pod+" refused by policy", func(ctx context.Context) (bool, error) {
		_, err := c.Request(ctx, ns, pod, target, 1)
		return err != nil, nil
	})
	if err != nil {
		c.Dump(t.Logf)
		t.Fatal(err)
	}
}

// TestServiceAndPassthrough: a Service VIP is balanced over endpoints on both
// nodes, and a destination outside the mesh is reached by passthrough.
func TestServiceAndPassthrough(t *testing.T) {
	c := mesh(t)
	servers, client := app(t, c, "zt-svc", true)
	plain, _ := app(t, c, "zt-plain", false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	svc, err := c.Client().CoreV1().Services("zt-svc").Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := fmt.Sprintf("http://%s:80/", svc.Spec.ClusterIP)
	if err := c.WaitAnsweredBy(ctx, "zt-svc", client.Name, vip, servers[0].Name, servers[1].Name); err != nil {
		t.Error(err)
	}
	// Outside the mesh: by pod IP and through its Service.
	if err := c.WaitReachable(ctx, "zt-svc", client.Name, fmt.Sprintf("http://%s:8080/", plain[0].Status.PodIP)); err != nil {
		t.Errorf("pod outside the mesh: %v", err)
	}
	psvc, err := c.Client().CoreV1().Services("zt-plain").Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WaitAnsweredBy(ctx, "zt-svc", client.Name, fmt.Sprintf("http://%s:80/", psvc.Spec.ClusterIP), plain[0].Name, plain[1].Name); err != nil {
		t.Errorf("service outside the mesh: %v", err)
	}
	m := ztunnelMetrics(t, c, client.Spec.NodeName)
	if !strings.Contains(grepLines(m, "istio_tcp_connections_opened_total"), `destination_service="echo.zt-svc.svc.cluster.local"`) {
		t.Errorf("the client's ztunnel did not label connections with the destination service:\n%s", grepLines(m, "istio_tcp_connections_opened_total"))
	}
}

func otherNode(servers []corev1.Pod, client corev1.Pod) corev1.Pod {
	for _, s := range servers {
		if s.Spec.NodeName != client.Spec.NodeName {
			return s
		}
	}
	return servers[0]
}

func nodeNamed(c *cluster.Cluster, name string) (cluster.Node, bool) {
	for _, n := range c.Nodes() {
		if n.Name == name {
			return n, true
		}
	}
	return cluster.Node{}, false
}

func lastN(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
