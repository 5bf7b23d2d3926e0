// Package system is the whole-system test: in one local cluster it tells the
// demo's story with every step checked (the chart installed, pods enrolled,
// HBONE between nodes, webhook decisions, L4 policy, a waypoint routing by
// header and weight and denying a path, the audit log and metrics), then
// upgrades the release and uninstalls it, which must leave no pod
// redirected and no rule behind.
package system

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/demo"
)

var shared = cluster.NewShared(cluster.Config{Images: cluster.MeshImages()})

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

const (
	meshNS = "istio-system"
	appNS  = "demo"
)

// The tests build on each other, in file order: the story installs what
// the upgrade and the uninstall work on.
var (
	mu   sync.Mutex
	told error // the story's outcome; nil once it passed
	ran  bool
)

// story tells the demo's story once and returns its outcome.
func story(t *testing.T) *cluster.Cluster {
	t.Helper()
	c := shared.Get(t)
	mu.Lock()
	defer mu.Unlock()
	if !ran {
		ran = true
		told = tell(t, c)
	}
	if told != nil {
		t.Fatalf("the demo's story: %v", told)
	}
	return c
}

func tell(t *testing.T, c *cluster.Cluster) error {
	out := &lineLog{t: t}
	d, err := demo.New(demo.Config{ChartNamespace: meshNS, AppNamespace: appNS, Out: out}, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	if err := d.Tell(ctx, c); err != nil {
		c.Dump(t.Logf)
		return err
	}
	return nil
}

// lineLog writes the demo's progress lines to the test log.
type lineLog struct {
	t       *testing.T
	partial string
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.partial += string(p)
	for {
		line, rest, ok := strings.Cut(l.partial, "\n")
		if !ok {
			break
		}
		l.t.Log(line)
		l.partial = rest
	}
	return len(p), nil
}

// TestDemoStory runs the demo's story and fails at the first step whose
// outcome is not what the demo says.
func TestDemoStory(t *testing.T) {
	story(t)
}

// TestNotesCommands runs, on real nodes, what the chart's NOTES tell a user
// to run against the installed release: the audit log command as helm
// prints it, and a port-forward to a Weft pod, both through the kubelet's
// API.
func TestNotesCommands(t *testing.T) {
	c := story(t)
	if c.NodeMode() != cluster.NodeModeKubelet {
		t.Skip("kubectl logs and port-forward need real nodes (WEFT_NODES=kubelet, the default)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t.Run("audit log", func(t *testing.T) {
		notes, err := c.Helm(ctx, "get", "notes", "weft", "--namespace", meshNS)
		if err != nil {
			t.Fatal(err)
		}
		cmd := notesCommand(notes, "Read the admission audit log")
		if !strings.Contains(cmd, "kubectl") {
			t.Fatalf("NOTES show no kubectl command for the audit log:\n%s", notes)
		}
		out, err := c.Shell(ctx, cmd)
		if err != nil {
			t.Fatal(err)
		}
		var ours int
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var ev struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				ObjectRef  struct{ Namespace, Name string }
			}
			if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.APIVersion != "audit.k8s.io/v1" || ev.Kind != "Event" {
				t.Fatalf("%s\nprinted a line that is not an audit Event (%v): %q", cmd, err, l)
			}
			if ev.ObjectRef.Namespace == appNS || ev.ObjectRef.Name == appNS {
				ours++
			}
		}
		if ours == 0 {
			t.Errorf("%s\nprinted no record of namespace %s:\n%s", cmd, appNS, out)
		}
	})

	// The ingress example, with <ns> the demo's namespace: the Gateway is
	// deployed and its LoadBalancer Service gets an address.
	t.Run("ingress gateway", func(t *testing.T) {
		notes, err := c.Helm(ctx, "get", "notes", "weft", "--namespace", meshNS)
		if err != nil {
			t.Fatal(err)
		}
		cmd := notesCommand(notes, "Let traffic in from outside the cluster")
		if !strings.Contains(cmd, "kubectl apply") || !strings.Contains(cmd, "<ns>") {
			t.Fatalf("NOTES show no ingress command:\n%s", notes)
		}
		if out, err := c.Shell(ctx, strings.ReplaceAll(cmd, "<ns>", appNS)); err != nil {
			t.Fatalf("%s\n%v: %s", cmd, err, out)
		}
		defer func() {
			if out, err := c.Kubectl(context.Background(), "delete", "gateway", "-n", appNS, "ingress"); err != nil {
				t.Errorf("removing the NOTES' Gateway: %v: %s", err, out)
			}
		}()
		if err := c.WaitDeployment(ctx, appNS, "ingress-istio"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitLoadBalancer(ctx, appNS, "ingress-istio"); err != nil {
			t.Fatal(err)
		}
		err = c.WaitFor(ctx, "Gateway "+appNS+"/ingress Programmed", func(ctx context.Context) (bool, error) {
			out, err := c.Kubectl(ctx, "get", "gateway", "-n", appNS, "ingress", "-o", `jsonpath={.status.conditions[?(@.type=="Programmed")].status}`)
			return err == nil && strings.TrimSpace(out) == "True", nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	// Weft's images have no shell; their own binary answers -h.
	t.Run("exec into a Weft pod", func(t *testing.T) {
		out, err := c.Kubectl(ctx, "exec", "-n", meshNS, "deploy/weft-webhook", "--", "/usr/local/bin/weft-webhook", "-h")
		if !strings.Contains(out, "-cluster-domain") {
			t.Errorf("kubectl exec into the webhook: %v %q, want its usage", err, out)
		}
	})

	t.Run("port-forward", func(t *testing.T) {
		local, stop, err := c.PortForward(ctx, "-n", meshNS, "deploy/weft-webhook", ":15014")
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		resp, err := http.Get("http://" + local + "/metrics")
		if err != nil {
			t.Fatalf("GET /metrics through the port-forward: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "weft_webhook_") {
			t.Errorf("GET /metrics through the port-forward: %s, %d bytes without weft_webhook_ metrics", resp.Status, len(body))
		}
	})
}

// notesCommand returns the command NOTES show under the paragraph that
// starts with heading: the indented lines that follow it, continuation
// lines included, with the paragraph's two-space indentation removed.
func notesCommand(notes, heading string) string {
	_, rest, ok := strings.Cut(notes, heading)
	if !ok {
		return ""
	}
	var lines []string
	for _, l := range strings.Split(rest, "\n")[1:] {
		switch {
		case !strings.HasPrefix(l, "  ") && len(lines) == 0:
			continue // the rest of the paragraph's text, the blank line after it
		case strings.HasPrefix(l, "  "):
			// Only the paragraph's own indentation goes: a here-document's
			// YAML keeps its structure.
			lines = append(lines, strings.TrimRight(strings.TrimPrefix(l, "  "), " "))
		default:
			return strings.Join(lines, "\n")
		}
	}
	return strings.Join(lines, "\n")
}

// TestHelmUpgrade upgrades the release with a changed value: every part
// rolls, the pods stay enrolled and the waypoint still routes.
func TestHelmUpgrade(t *testing.T) {
	c := story(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	before := podUIDs(ctx, t, c, meshNS)
	// README's step for CRDs, which helm upgrade leaves as they were.
	if out, err := c.Kubectl(ctx, "apply", "--server-side", "-f", "charts/weft/crds/"); err != nil {
		t.Fatalf("applying the chart's CRDs as README says: %v\n%s", err, out)
	}
	out, err := c.Helm(ctx, "upgrade", "weft", c.RepoPath("charts/weft"), "--namespace", meshNS,
		"--reuse-values", "--set", "global.logLevel=debug", "--wait", "--timeout", "4m")
	if err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	for _, ds := range []string{"ztunnel", "weft-cni-agent"} {
		if _, err := c.WaitDaemonSet(ctx, meshNS, ds); err != nil {
			t.Fatal(err)
		}
	}
	// helm --wait returns once the new pods are ready; the old ones may
	// still be draining (the webhook takes up to its grace period). Each
	// must go, and none may be left once they have.
	after := podUIDs(ctx, t, c, meshNS)
	for uid, name := range after {
		if _, ok := before[uid]; ok {
			gctx, cancel := context.WithTimeout(ctx, 90*time.Second)
			err := c.WaitPodGone(gctx, meshNS, name)
			cancel()
			if err != nil {
				t.Errorf("pod %s was not replaced by the upgrade (its configuration changed): %v", name, err)
			}
		}
	}
	if err := c.WaitRedirected(ctx, appNS, 0); err != nil {
		t.Fatalf("after the upgrade: %v", err)
	}
	target := echoTarget(ctx, t, c)
	client := clientPod(ctx, t, c)
	err = c.WaitFor(ctx, "the waypoint routing x-canary after the upgrade", func(ctx context.Context) (bool, error) {
		rs, _ := c.Request(ctx, appNS, client, target, 1, "x-canary: yes")
		return len(rs) == 1 && rs[0].Response != nil && strings.HasPrefix(rs[0].Response.Pod, "echo-v2-"), nil
	})
	if err != nil {
		c.Dump(t.Logf)
		t.Fatal(err)
	}
	if rs, err := c.Request(ctx, appNS, client, target, 20); err != nil {
		t.Errorf("20 requests after the upgrade: %v (%d results)", err, len(rs))
	}
}

// TestHelmUninstall uninstalls the release: Weft's pods go, the apps keep
// talking directly, and no pod is left annotated as redirected or with
// redirection rules in its network namespace; the CNI plugin leaves every
// node's configuration.
func TestHelmUninstall(t *testing.T) {
	c := story(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	out, err := c.Helm(ctx, "uninstall", "weft", "--namespace", meshNS, "--wait", "--timeout", "4m")
	if err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	err = c.WaitFor(ctx, "Weft's pods gone", func(ctx context.Context) (bool, error) {
		pods, err := c.Client().CoreV1().Pods(meshNS).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pods, err := c.Client().CoreV1().Pods(appNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if v, ok := p.Annotations["ambient.istio.io/redirection"]; ok {
			t.Errorf("pod %s still annotated ambient.istio.io/redirection=%s", p.Name, v)
		}
		path, err := c.PodNetns(ctx, appNS, p.Name)
		if err != nil {
			t.Errorf("pod %s: %v", p.Name, err)
			continue
		}
		if left := redirectionLeft(t, path); left != "" {
			t.Errorf("pod %s: redirection left in its network namespace:\n%s", p.Name, left)
		}
	}
	for _, n := range c.Nodes() {
		entries, _ := os.ReadDir(n.CNIConfDir())
		for _, e := range entries {
			b, _ := os.ReadFile(n.CNIConfDir() + "/" + e.Name())
			if strings.Contains(string(b), "weft-cni") {
				t.Errorf("node %s: %s still chains weft-cni:\n%s", n.Name, e.Name(), b)
			}
		}
		if _, err := os.Stat(n.CNIBinDir() + "/weft-cni"); err == nil {
			t.Errorf("node %s: the weft-cni plugin binary is still installed", n.Name)
		}
	}
	// The apps talk directly again, without the mesh.
	target := echoTarget(ctx, t, c)
	client := clientPod(ctx, t, c)
	if err := c.WaitReachable(ctx, appNS, client, target); err != nil {
		t.Errorf("after the uninstall: %v", err)
	}
}

// redirectionLeft lists what of Istio's in-pod redirection is in a network
// namespace: its nftables tables and the policy rule to table 100.
func redirectionLeft(t *testing.T, path string) string {
	t.Helper()
	ns, err := netns.Open(path)
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	defer ns.Close()
	var out []string
	for _, argv := range [][]string{{"nft", "list", "tables"}, {"ip", "rule", "show"}, {"ip", "-6", "rule", "show"}} {
		cmd := exec.Command(argv[0], argv[1:]...)
		var b strings.Builder
		cmd.Stdout, cmd.Stderr = &b, &b
		if err := ns.Do(cmd.Run); err != nil {
			t.Fatalf("%s in %s: %v\n%s", strings.Join(argv, " "), path, err, b.String())
		}
		sc := bufio.NewScanner(strings.NewReader(b.String()))
		for sc.Scan() {
			if l := sc.Text(); strings.Contains(l, "istio") || strings.Contains(l, "lookup 100") {
				out = append(out, fmt.Sprintf("%s: %s", argv[0], l))
			}
		}
	}
	return strings.Join(out, "\n")
}

func podUIDs(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) map[string]string {
	t.Helper()
	pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		out[string(p.UID)] = p.Name
	}
	return out
}

func echoTarget(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	svc, err := c.Client().CoreV1().Services(appNS).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://%s:80/", svc.Spec.ClusterIP)
}

func clientPod(ctx context.Context, t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	pods, err := c.WaitPods(ctx, appNS, "app=client", 1)
	if err != nil {
		t.Fatal(err)
	}
	return pods[0].Name
}
