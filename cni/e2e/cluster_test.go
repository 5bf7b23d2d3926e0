package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/weftmesh/weft/cni/redirect"
	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/zdspb"
	"github.com/weftmesh/weft/internal/zds"
	"github.com/weftmesh/weft/test/cluster"
)

// One node: the test brings its own ztunnel, on that node's ZDS socket.
var shared = cluster.NewShared(cluster.Config{Nodes: 1, Images: []string{"./test/cmd/echo", "./cni/cmd/weft-cni-agent", "./cni/cmd/weft-cni"}})

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

const (
	agentNS = "weft-system"
	appNS   = "cni-e2e"
)

// ztunnel is a stand-in ztunnel on the node's real ZDS socket: it acks
// every request and records the uids it holds. It reconnects when the
// agent goes away, as ztunnel does.
type ztunnel struct {
	mu   sync.Mutex
	pods map[string]bool // uid -> held (Add or Keep since the last snapshot)
	adds map[string]int
	dels map[string]int
}

func runZtunnel(ctx context.Context, t *testing.T, sock string) *ztunnel {
	z := &ztunnel{pods: map[string]bool{}, adds: map[string]int{}, dels: map[string]int{}}
	go func() {
		for ctx.Err() == nil {
			c, err := zds.Dial(ctx, sock)
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			z.serve(c)
			c.Close()
		}
	}()
	return z
}

func (z *ztunnel) serve(c *zds.Conn) {
	if c.SendHello() != nil {
		return
	}
	snapshot := map[string]bool{}
	inSnapshot := true
	for {
		req, f, err := c.RecvRequest()
		if err != nil {
			return
		}
		if f != nil {
			f.Close()
		}
		z.mu.Lock()
		switch p := req.Payload.(type) {
		case *zdspb.WorkloadRequest_Add:
			z.pods[p.Add.Uid] = true
			z.adds[p.Add.Uid]++
			snapshot[p.Add.Uid] = true
		case *zdspb.WorkloadRequest_Keep:
			snapshot[p.Keep.Uid] = true
		case *zdspb.WorkloadRequest_Del:
			delete(z.pods, p.Del.Uid)
			z.dels[p.Del.Uid]++
		case *zdspb.WorkloadRequest_SnapshotSent:
			if inSnapshot {
				for uid := range z.pods {
					if !snapshot[uid] {
						delete(z.pods, uid)
					}
				}
				inSnapshot = false
			}
		}
		z.mu.Unlock()
		if c.SendAck(nil) != nil {
			return
		}
	}
}

func (z *ztunnel) holds(uid types.UID) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.pods[string(uid)]
}

func (z *ztunnel) added(uid types.UID) int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.adds[string(uid)]
}

// poll waits for cond, failing after the context's deadline. It asserts an
// outcome, never a duration.
func poll(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting: %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func podRules(ctx context.Context, t *testing.T, c *cluster.Cluster, pod *corev1.Pod) (installed string, check error) {
	t.Helper()
	path, err := c.PodNetns(ctx, pod.Namespace, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := ns.Do(func() error {
		rs, err := redirect.Installed(redirect.NATTable, redirect.MangleTable, redirect.RawTable)
		if err != nil {
			return err
		}
		installed = rs.String()
		check = redirect.CheckPod(redirect.Options{DNSCapture: true, IPv6: true})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return installed, check
}

func onePod(ctx context.Context, t *testing.T, c *cluster.Cluster, app string) *corev1.Pod {
	t.Helper()
	pods, err := c.WaitPods(ctx, appNS, "app="+app, 1)
	if err != nil {
		t.Fatal(err)
	}
	return &pods[0]
}

func annotation(ctx context.Context, t *testing.T, c *cluster.Cluster, pod *corev1.Pod) string {
	t.Helper()
	p, err := c.Client().CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Annotations["ambient.istio.io/redirection"]
}

// TestCNIInLocalCluster installs the agent from the chart into the local
// cluster and checks the scenarios: labelling a namespace enrolls
// its running pods; new pods are enrolled before they start; with the
// agent stopped a new ambient pod does not start, and does once the agent
// is back; removing the label removes the rules; uninstall restores the
// node's CNI configuration.
func TestCNIInLocalCluster(t *testing.T) {
	c := shared.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	node := c.Nodes()[0]
	conf := filepath.Join(node.CNIConfDir(), "10-weft-bridge.conflist")
	origConf, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}

	// Only the agent's templates: this test's ztunnel stands in for the
	// chart's. hostPath volumes are node paths under node.Root here, so the
	// plugin (run by the node runner on the machine) finds the run dir there.
	manifests, err := c.Helm(ctx, "template", "weft", "charts/weft", "--namespace", agentNS, "--kube-version", "1.37.2",
		"--show-only", "templates/cni-rbac.yaml", "--show-only", "templates/cni-agent.yaml", "--show-only", "templates/cni-admission-policy.yaml",
		"--set", "cni.hostRunDir="+filepath.Join(node.Root, "var/run/weft-cni"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(ctx, cluster.NamespaceManifest(agentNS, nil)+"---\n"+manifests); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c.Client().CoreV1().Namespaces().Delete(cctx, appNS, metav1.DeleteOptions{})
		c.Client().CoreV1().Namespaces().Delete(cctx, agentNS, metav1.DeleteOptions{})
	})
	if _, err := c.WaitDaemonSet(ctx, agentNS, "weft-cni-agent"); err != nil {
		t.Fatal(err)
	}
	// The plugin gets no credential: the run dir on the node holds the
	// event socket only.
	if ents, err := os.ReadDir(filepath.Join(node.Root, "var/run/weft-cni")); err != nil || len(ents) != 1 || ents[0].Name() != "pluginevent.sock" {
		t.Fatalf("the agent's run dir on the node holds %v (%v), want only pluginevent.sock", ents, err)
	}
	zt := runZtunnel(ctx, t, filepath.Join(node.Root, "var/run/ztunnel/ztunnel.sock"))

	// A pod running before its namespace joins the mesh.
	if err := c.Apply(ctx, cluster.NamespaceManifest(appNS, nil)+"---\n"+cluster.EchoApp(appNS, "before", cluster.EchoOptions{})); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitDeployment(ctx, appNS, "before"); err != nil {
		t.Fatal(err)
	}
	before := onePod(ctx, t, c, "before")
	if zt.added(before.UID) != 0 || annotation(ctx, t, c, before) != "" {
		t.Fatal("a pod outside the mesh was enrolled")
	}

	t.Run("labelling the namespace enrolls its running pods", func(t *testing.T) {
		if err := c.Apply(ctx, cluster.NamespaceManifest(appNS, map[string]string{"istio.io/dataplane-mode": "ambient"})); err != nil {
			t.Fatal(err)
		}
		poll(ctx, t, "the running pod annotated enabled", func() bool { return annotation(ctx, t, c, before) == "enabled" })
		if !zt.holds(before.UID) {
			t.Fatal("ztunnel does not hold the enrolled pod")
		}
		if _, err := podRules(ctx, t, c, before); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a new pod is enrolled before it starts", func(t *testing.T) {
		w, err := c.Client().CoreV1().Pods(appNS).Watch(ctx, metav1.ListOptions{LabelSelector: "app=after"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		if err := c.Apply(ctx, cluster.EchoApp(appNS, "after", cluster.EchoOptions{})); err != nil {
			t.Fatal(err)
		}
		// Every state the API ever shows with a running container already
		// carries the annotation: the agent set it before CNI ADD returned.
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			started := false
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Running != nil {
					started = true
				}
			}
			if !started {
				continue
			}
			if p.Annotations["ambient.istio.io/redirection"] != "enabled" {
				t.Fatalf("pod %s ran before it was enrolled (annotation %q)", p.Name, p.Annotations["ambient.istio.io/redirection"])
			}
			if !zt.holds(p.UID) {
				t.Fatalf("pod %s runs but ztunnel does not hold it", p.Name)
			}
			if _, err := podRules(ctx, t, c, p); err != nil {
				t.Fatal(err)
			}
			break
		}
		if err := c.WaitDeployment(ctx, appNS, "after"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("with the agent stopped a new ambient pod waits, then starts", func(t *testing.T) {
		agents, err := c.WaitPods(ctx, agentNS, "app=weft-cni-agent", 1)
		if err != nil {
			t.Fatal(err)
		}
		// The DaemonSet stays (an upgrade), its pod goes.
		patch := []byte(`{"spec":{"template":{"spec":{"nodeSelector":{"weft.test/no-such-node":"x"}}}}}`)
		if _, err := c.Client().AppsV1().DaemonSets(agentNS).Patch(ctx, "weft-cni-agent", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitPodGone(ctx, agentNS, agents[0].Name); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(conf); !strings.Contains(string(b), `"weft-cni"`) {
			t.Fatal("the plugin was removed although the DaemonSet remains")
		}
		if err := c.Apply(ctx, cluster.EchoApp(appNS, "late", cluster.EchoOptions{})); err != nil {
			t.Fatal(err)
		}
		var late *corev1.Pod
		poll(ctx, t, "the late pod to be created", func() bool {
			l, err := c.Client().CoreV1().Pods(appNS).List(ctx, metav1.ListOptions{LabelSelector: "app=late"})
			if err != nil || len(l.Items) == 0 {
				return false
			}
			late = &l.Items[0]
			return true
		})
		poll(ctx, t, "the runtime to report the held-back sandbox", func() bool {
			evs, err := c.Client().CoreV1().Events(appNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + late.Name})
			if err != nil {
				return false
			}
			for _, e := range evs.Items {
				if e.Reason == "FailedCreatePodSandBox" && strings.Contains(e.Message, "cannot start until the node agent has enrolled it") {
					return true
				}
			}
			return false
		})
		p, err := c.Client().CoreV1().Pods(appNS).Get(ctx, late.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning {
			t.Fatal("an ambient pod started while the agent was down")
		}
		// The agent comes back.
		patch = []byte(`{"spec":{"template":{"spec":{"nodeSelector":null}}}}`)
		ds, err := c.Client().AppsV1().DaemonSets(agentNS).Patch(ctx, "weft-cni-agent", types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("DaemonSet after the patch: nodeSelector %v generation %d", ds.Spec.Template.Spec.NodeSelector, ds.Generation)
		if _, err := c.WaitDaemonSet(ctx, agentNS, "weft-cni-agent"); err != nil {
			ds, _ := c.Client().AppsV1().DaemonSets(agentNS).Get(ctx, "weft-cni-agent", metav1.GetOptions{})
			t.Fatalf("the agent did not come back: %v (status %+v)", err, ds.Status)
		}
		if err := c.WaitDeployment(ctx, appNS, "late"); err != nil {
			t.Fatal(err)
		}
		late = onePod(ctx, t, c, "late")
		if annotation(ctx, t, c, late) != "enabled" || !zt.holds(late.UID) {
			t.Fatal("the late pod started without being enrolled")
		}
		// The pods enrolled before the restart are still held (snapshot).
		if !zt.holds(before.UID) {
			t.Fatal("ztunnel lost a pod over the agent restart")
		}
	})

	t.Run("removing the label removes the rules", func(t *testing.T) {
		if err := c.Apply(ctx, cluster.NamespaceManifest(appNS, map[string]string{"istio.io/dataplane-mode": "none"})); err != nil {
			t.Fatal(err)
		}
		poll(ctx, t, "the pod's annotation removed", func() bool { return annotation(ctx, t, c, before) == "" })
		if rules, _ := podRules(ctx, t, c, before); rules != "" {
			t.Fatalf("rules left in an un-enrolled pod:\n%s", rules)
		}
		if zt.holds(before.UID) {
			t.Fatal("ztunnel still holds an un-enrolled pod")
		}
	})

	t.Run("uninstall restores the node's CNI configuration", func(t *testing.T) {
		if err := c.Client().AppsV1().DaemonSets(agentNS).Delete(ctx, "weft-cni-agent", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(ctx, t, "the conflist restored", func() bool {
			b, err := os.ReadFile(conf)
			return err == nil && string(b) == string(origConf)
		})
		if _, err := os.Stat(filepath.Join(node.CNIBinDir(), "weft-cni")); !os.IsNotExist(err) {
			t.Fatalf("plugin binary left: %v", err)
		}
	})
}
