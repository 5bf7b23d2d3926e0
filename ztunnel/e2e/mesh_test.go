// Package e2e runs ztunnel in the local cluster with the rest of the mesh,
// all installed by the chart: pods enrolled by the CNI agent, workload state
// and certificates from the control plane, traffic between pods on two
// nodes carried over HBONE.
package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	if _, err := c.Client().AppsV1().DaemonSets(meshNS).Get(ctx, "ztunnel", metav1.GetOptions{}); err != nil {
		if out, err := c.HelmInstall(ctx, "weft", c.RepoPath("charts/weft"), meshNS, "--wait", "--timeout", "4m"); err != nil {
			c.Dump(t.Logf)
			t.Fatalf("helm install: %v\n%s", err, out)
		}
	}
	for _, ds := range []string{"ztunnel", "weft-cni-agent"} {
		if _, err := c.WaitDaemonSet(ctx, meshNS, ds); err != nil {
			c.Dump(t.Logf)
			t.Fatal(err)
		}
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
		err := c.WaitFor(ctx, "pods of "+ns+" annotated as redirected", func(ctx context.Context) (bool, error) {
			pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, p := range pods.Items {
				if p.Annotations["ambient.istio.io/redirection"] != "enabled" {
					return false, nil
				}
			}
			return len(pods.Items) == 3, nil
		})
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
	var remote corev1.Pod
	for _, s := range servers {
		if s.Spec.NodeName != client.Spec.NodeName {
			remote = s
		}
	}
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
