package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/weftmesh/weft/cni/redirect"
	"github.com/weftmesh/weft/internal/netns"
	localcluster "github.com/weftmesh/weft/test/cluster"
)

// pluginBin is the weft-cni binary, built once for the tests that install
// and exec it.
var pluginBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "weft-cni-agent-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pluginBin = filepath.Join(dir, "weft-cni")
	// As the image holds it: the runtime execs it for every pod.
	if err := localcluster.Build("./cni/cmd/weft-cni", pluginBin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Getenv("WEFT_ROOT_TESTS") == "" {
		t.Skip("root-only test: set WEFT_ROOT_TESTS=1 and run as root (make test does)")
	}
	if os.Geteuid() != 0 {
		t.Skip("root-only test: WEFT_ROOT_TESTS is set but this process is not root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("root-only test needs iproute2's ip: run make deps")
	}
}

// repoCNIBin is where scripts/tools.sh puts the bridge, host-local and
// loopback plugins.
func repoCNIBin(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs("../../bin/cni")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Skipf("the CNI plugins are not built (%v): run make tools (scripts/tools.sh cni)", err)
		}
	}
	return dir
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// testNetns creates a named netns (lo up), deleted when the test ends.
func testNetns(t testing.TB, tag string) *netns.NS {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := "weft-a-" + tag + "-" + hex.EncodeToString(b)
	ns, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.Delete(name); err != nil {
			t.Errorf("deleting netns %s: %v", name, err)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return ns
}

// openNS opens a netns by path for the test.
func openNS(t testing.TB, path string) *netns.NS {
	t.Helper()
	ns, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// podWithIP gives a pod netns an eth0 (peer in the node netns) holding ip.
func podWithIP(t testing.TB, node, pod *netns.NS, ip netip.Addr, peer string) {
	t.Helper()
	run(t, "ip", "link", "add", "eth0", "netns", filepath.Base(pod.Path()), "type", "veth", "peer", "name", peer, "netns", filepath.Base(node.Path()))
	run(t, "ip", "-n", filepath.Base(pod.Path()), "addr", "add", ip.String()+"/24", "dev", "eth0")
	run(t, "ip", "-n", filepath.Base(pod.Path()), "link", "set", "eth0", "up")
}

// eventually polls cond until it holds, failing after a generous limit.
// It asserts an outcome, never a duration.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cluster is the agent's world in a test: a fake API (client-go's fake
// clientset), a node netns, CNI dirs.
type cluster struct {
	t        testing.TB
	kube     *fake.Clientset
	node     *netns.NS
	netnsDir string // symlinks to this test's pod netns only
	cfg      Config
	cniBin   string
	cacheDir string
	origConf string // the primary conflist before install
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	requireRoot(t)
	c := &cluster{t: t, kube: fake.NewClientset()}
	c.kube.AppsV1().DaemonSets("weft-system").Create(context.Background(), &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "weft-cni-agent", Namespace: "weft-system"}}, metav1.CreateOptions{})
	c.node = testNetns(t, "node")
	dir := t.TempDir()
	c.netnsDir = filepath.Join(dir, "netns")
	c.cacheDir = filepath.Join(dir, "cni-cache")
	for _, d := range []string{"netns", "bin", "net.d", "run", "ztunnel", "ipam"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	c.origConf = `{
  "cniVersion": "1.0.0",
  "name": "test-net",
  "plugins": [
    {"type": "bridge", "bridge": "wt0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "dataDir": "` + filepath.Join(dir, "ipam") + `",
              "ranges": [[{"subnet": "10.78.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}
  ]
}
`
	os.WriteFile(filepath.Join(dir, "net.d", "10-test.conflist"), []byte(c.origConf), 0o644)

	cfg := Defaults()
	cfg.NodeName, cfg.PodName, cfg.PodNamespace = "node1", "weft-cni-agent-abcde", "weft-system"
	cfg.CNIBinDir, cfg.CNIConfDir = filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	cfg.PluginBinary = pluginBin
	cfg.InstallInterval = 50 * time.Millisecond
	cfg.RunDir = filepath.Join(dir, "run")
	cfg.ZtunnelSocket = filepath.Join(dir, "ztunnel", "ztunnel.sock")
	cfg.ZtunnelUID = os.Getuid()
	cfg.NetnsDir = c.netnsDir
	cfg.NodeNetns = c.node.Path()
	cfg.MetricsAddr, cfg.ReadyAddr = "off", "off"
	c.cfg = cfg
	for _, ns := range []string{"kube-system", "weft-system"} {
		c.addNamespace(ns, nil)
	}
	return c
}

func (c *cluster) addNamespace(name string, labels map[string]string) {
	c.t.Helper()
	if _, err := c.kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) labelNamespace(name string, ambient bool) {
	c.t.Helper()
	ns, err := c.kube.CoreV1().Namespaces().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	ns = ns.DeepCopy()
	if ambient {
		ns.Labels = map[string]string{"istio.io/dataplane-mode": "ambient"}
	} else {
		ns.Labels = nil
	}
	if _, err := c.kube.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// addPod creates a pod bound to node1; a valid ip makes it Running.
func (c *cluster) addPod(ns, name string, ip netip.Addr) *corev1.Pod {
	c.t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: k8stypes.UID("uid-" + ns + "-" + name)},
		Spec:       corev1.PodSpec{NodeName: "node1", ServiceAccountName: "sa-" + name, Containers: []corev1.Container{{Name: "app", Image: "weft/echo:test"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
	if ip.IsValid() {
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP = ip.String()
		pod.Status.PodIPs = []corev1.PodIP{{IP: ip.String()}}
	}
	p, err := c.kube.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return p
}

func (c *cluster) annotation(ns, name string) string {
	c.t.Helper()
	p, err := c.kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return p.Annotations["ambient.istio.io/redirection"]
}

// podNetns makes a pod netns, visible in the agent's netns dir as a
// runtime's are in /var/run/netns.
func (c *cluster) podNetns(tag string) *netns.NS {
	c.t.Helper()
	ns := testNetns(c.t, tag)
	if err := os.Symlink(ns.Path(), filepath.Join(c.netnsDir, filepath.Base(ns.Path()))); err != nil {
		c.t.Fatal(err)
	}
	return ns
}

// runningAgent is an agent running in the test.
type runningAgent struct {
	a      *Agent
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

func (c *cluster) startAgent() *runningAgent {
	c.t.Helper()
	reg := prometheus.NewRegistry()
	a, err := New(c.cfg, c.kube, reg, discard)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ra := &runningAgent{a: a, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { ra.done <- a.Run(ctx) }()
	c.t.Cleanup(func() { ra.stop(c.t) })
	eventually(c.t, "the agent to become ready", a.Ready)
	return ra
}

func (ra *runningAgent) stop(t testing.TB) {
	if ra.cancel == nil {
		return
	}
	ra.cancel()
	if err := <-ra.done; err != nil {
		t.Errorf("agent Run: %v", err)
	}
	ra.cancel = nil
}

// connectZtunnel connects a test ztunnel and waits for its snapshot.
func (c *cluster) connectZtunnel(nack map[string]string) (*testZtunnel, []string) {
	c.t.Helper()
	z := dialZtunnel(c.t, c.cfg.ZtunnelSocket, nack)
	var snap []string
	for l := z.next(c.t); l != "snapshot_sent"; l = z.next(c.t) {
		snap = append(snap, l)
	}
	return z, snap
}

// nsExec runs CNI plugins inside the node netns, as the runtime does.
type nsExec struct {
	node *netns.NS
	raw  *invoke.RawExec
}

func (e *nsExec) ExecPlugin(ctx context.Context, path string, stdin []byte, env []string) ([]byte, error) {
	var out []byte
	var err error
	if derr := e.node.Do(func() error { out, err = e.raw.ExecPlugin(ctx, path, stdin, env); return nil }); derr != nil {
		return nil, derr
	}
	return out, err
}

func (e *nsExec) FindInPath(p string, paths []string) (string, error) {
	return invoke.FindInPath(p, paths)
}
func (e *nsExec) Decode(b []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(b)
}

// cniDel tears a pod's network down, as a runtime does after a failed ADD
// before it tries again with a new sandbox.
func (c *cluster) cniDel(pod *corev1.Pod, podNS *netns.NS) {
	c.t.Helper()
	list, err := libcni.ConfListFromFile(filepath.Join(c.cfg.CNIConfDir, "10-test.conflist"))
	if err != nil {
		c.t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{c.cfg.CNIBinDir, c.cniBin}, c.cacheDir, &nsExec{node: c.node, raw: &invoke.RawExec{Stderr: os.Stderr}})
	if err := cni.DelNetworkList(context.Background(), list, c.runtimeConf(pod, podNS)); err != nil {
		c.t.Fatalf("CNI DEL: %v", err)
	}
}

// addList runs one network configuration list for a pod through libcni in
// the node's netns.
func (c *cluster) addList(list *libcni.NetworkConfigList, pod *corev1.Pod, podNS *netns.NS) (types.Result, error) {
	cni := libcni.NewCNIConfigWithCacheDir([]string{c.cfg.CNIBinDir, c.cniBin}, c.cacheDir, &nsExec{node: c.node, raw: &invoke.RawExec{Stderr: os.Stderr}})
	return cni.AddNetworkList(context.Background(), list, c.runtimeConf(pod, podNS))
}

func (c *cluster) runtimeConf(pod *corev1.Pod, podNS *netns.NS) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: string(pod.UID), NetNS: podNS.Path(), IfName: "eth0", Args: [][2]string{
		{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", pod.Namespace}, {"K8S_POD_NAME", pod.Name},
		{"K8S_POD_INFRA_CONTAINER_ID", string(pod.UID)}, {"K8S_POD_UID", string(pod.UID)},
	}}
}

// cniAdd runs the node's (chained) network configuration for a pod, as a
// runtime does, and returns the result.
func (c *cluster) cniAdd(pod *corev1.Pod, podNS *netns.NS) (types.Result, error) {
	c.t.Helper()
	list, err := libcni.ConfListFromFile(filepath.Join(c.cfg.CNIConfDir, "10-test.conflist"))
	if err != nil {
		c.t.Fatal(err)
	}
	res, err := c.addList(list, pod, podNS)
	if err != nil {
		return nil, err
	}
	// The runtime reports the pod running with its IP, as a kubelet does.
	cur, err := types100.NewResultFromResult(res)
	if err != nil {
		c.t.Fatal(err)
	}
	p, err := c.kube.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	p = p.DeepCopy()
	for _, ip := range cur.IPs {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip.Address.IP.String()})
	}
	if len(p.Status.PodIPs) > 0 {
		p.Status.PodIP = p.Status.PodIPs[0].IP
	}
	p.Status.Phase = corev1.PodRunning
	if _, err := c.kube.CoreV1().Pods(pod.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	return res, nil
}

// rulesIn renders the pod tables installed in ns.
func rulesIn(t testing.TB, ns *netns.NS) string {
	t.Helper()
	var rs *redirect.Ruleset
	if err := ns.Do(func() (err error) {
		rs, err = redirect.Installed(redirect.NATTable, redirect.MangleTable, redirect.RawTable)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return rs.String()
}

func checkRules(t testing.TB, ns *netns.NS) error {
	t.Helper()
	return ns.Do(func() error { return redirect.CheckPod(redirect.Options{DNSCapture: true, IPv6: true}) })
}

func probeIPsIn(t testing.TB, node *netns.NS) map[netip.Addr]string {
	t.Helper()
	var ips map[netip.Addr]string
	if err := node.Do(func() (err error) { ips, err = redirect.ProbeIPs(true); return err }); err != nil {
		t.Fatal(err)
	}
	return ips
}

func nsInode(t testing.TB, ns *netns.NS) uint64 {
	t.Helper()
	id, err := ns.ID()
	if err != nil {
		t.Fatal(err)
	}
	return id
}
