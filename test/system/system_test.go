// Package system is the whole-system test: in one local cluster it tells the
// demo's story with every step checked (the chart installed, pods enrolled,
// HBONE between nodes, webhook decisions, L4 policy, a waypoint routing by
// header and weight and denying a path, the audit log and metrics), then
// upgrades the release.
package system

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/test/cluster"
	"github.com/weftmesh/weft/test/demo"
)

var shared = cluster.NewShared(cluster.Config{Images: []string{
	"./test/cmd/echo", "./ztunnel/cmd/ztunnel", "./controlplane/cmd/weft-controlplane",
	"./cni/cmd/weft-cni", "./cni/cmd/weft-cni-agent", "./webhook/cmd/weft-webhook",
	"./waypoint/cmd/waypoint",
}})

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

// TestHelmUpgrade upgrades the release with a changed value: every part
// rolls, the pods stay enrolled and the waypoint still routes.
func TestHelmUpgrade(t *testing.T) {
	c := story(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	before := podUIDs(ctx, t, c, meshNS)
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
	after := podUIDs(ctx, t, c, meshNS)
	for uid, name := range after {
		if _, ok := before[uid]; ok {
			t.Errorf("pod %s was not replaced by the upgrade (its configuration changed)", name)
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
