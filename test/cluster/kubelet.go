package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/internal/netns"
)

// Real-node mode (Config.NodeMode "kubelet"): every node runs the kubelet
// with its own containerd (and runc under it) inside the node's network
// namespace, each with its own state directories, sockets and cgroup
// parent, all under the node's Root. Processes enter the node's namespace
// with setns on the network namespace alone (as `nsenter --net` does):
// `ip netns exec` would also remount /sys in a new mount namespace, which
// hides the cgroup mounts the kubelet needs.

// Node modes.
const (
	// NodeModeStandIn runs each node's pods with the node runner of
	// package node.
	NodeModeStandIn = "standin"
	// NodeModeKubelet runs the kubelet, containerd and runc on each node.
	NodeModeKubelet = "kubelet"
)

// realNode is one node's kubelet and containerd.
type realNode struct {
	node       Node
	ns         *netns.NS
	cgroup     string // the kubelet's cgroupRoot, "/<run>-<node>"
	containerd *process
	kubelet    *process
	// kubeletConfig is the kubelet's configuration file, once written.
	kubeletConfig string
}

func (r *realNode) sock() string       { return filepath.Join(r.node.Root, "run/containerd.sock") }
func (r *realNode) kubeletDir() string { return filepath.Join(r.node.Root, "var/lib/kubelet") }

// kubeletSysctls are the machine-wide sysctls the kubelet sets when
// protectKernelDefaults is false (it refuses to start with true on a
// machine whose values differ). Start records them and Close restores them.
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// sysctlFile is the run's record of kubeletSysctls before the first
// kubelet started, so that a later clean restores them after a kill. It
// lives beside the run's lock, not in its directory: a cleaner that cannot
// unmount what the run left may remove the directory only in part.
func sysctlFile(id string) string { return filepath.Join(LockDir, id+".sysctls") }

// cgroupMount is where cgroup v1 controllers (and cgroup2 at unified) are.
const cgroupMount = "/sys/fs/cgroup"

// sandboxImage is the pause image every pod's sandbox runs.
const sandboxImage = "weft/pause:latest"

// startRuntime starts node n's containerd and imports the images.
func (c *Cluster) startRuntime(ctx context.Context, n Node, ns *netns.NS) (*realNode, error) {
	r := &realNode{node: n, ns: ns, cgroup: "/" + c.run.id + "-" + n.Name}
	for _, d := range []string{"run", "containerd/root", "containerd/state", "runc", "var/log/pods", "var/lib/kubelet/pki"} {
		if err := os.MkdirAll(filepath.Join(n.Root, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := makeCgroup(r.cgroup); err != nil {
		return nil, fmt.Errorf("making cgroup %s: %w", r.cgroup, err)
	}
	conf := filepath.Join(n.Root, "containerd.toml")
	if err := os.WriteFile(conf, []byte(containerdConfig(r)), 0o644); err != nil {
		return nil, err
	}
	if err := c.makeMountPoints(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(n.Root, "var"), 0o755); err != nil {
		return nil, err
	}
	if err := os.Symlink("../run", filepath.Join(n.Root, "var/run")); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	script, args := nodeMountScript(n, conf)
	var err error
	r.containerd, err = startProcess(ns, "containerd-"+n.Name, c.path("logs"), "unshare",
		append([]string{"--mount", "--propagation", "slave", "--", "sh", "-euc", script, "node-mounts"}, args...))
	if err != nil {
		return nil, err
	}
	c.track(r.containerd)
	return r, c.importImages(ctx, r)
}

// nodePaths are the machine paths that, in a node's mount namespace, are
// the node's own directories under its root: the CNI directories, the
// CNI result cache and /run (pods' network namespaces, shim sockets, and
// what pods share through hostPath volumes under /var/run, such as the
// chart's CNI agent and ztunnel). A pod's hostPath there thus means the
// same on a node here as on a real one, and as with the stand-in, it is
// under the node's root (Root/var/run links to Root/run); two nodes never
// share them. The kubelet's device plugin socket is also one: the kubelet
// puts it in /var/lib/kubelet/device-plugins whatever its --root-dir, so
// kubelets starting at once (two nodes, two clusters) removed each
// other's socket and one failed to bind its own.
var nodePaths = []string{"/opt", "/etc/cni/net.d", "/var/lib/cni", "/run", "/var/lib/kubelet/device-plugins"}

// nodeMountScript is the shell script (and its arguments) that, run by
// `unshare --mount --propagation slave` (mounts of the machine still show
// in the node, the node's stay in it), bind-mounts the node's directories
// on nodePaths and then executes containerd. The kubelet joins that mount
// namespace: its mounts, containerd's and the shims' live and die with it.
// The node's mounts are then made shared among themselves (a slave of a
// private mount stays private, and containerd refuses mountPropagation
// for a hostPath below a private mount). /sys is left as it is, so cgroup
// mounts stay visible.
func nodeMountScript(n Node, conf string) (string, []string) {
	var args []string
	for _, p := range nodePaths {
		args = append(args, filepath.Join(n.Root, p), p)
	}
	script := `mount --make-rshared /
while [ $# -gt 0 ]; do mkdir -p "$1"; mount --bind "$1" "$2"; shift 2; done
exec containerd --config=` + shellQuote(conf)
	return script, args
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// makeMountPoints makes the nodePaths missing on the machine (a bind mount
// needs its target), recording them beside the run's lock so that Close,
// or the clean of a killed run, removes them again when empty.
func (c *Cluster) makeMountPoints() error {
	c.mountPointsOnce.Do(func() {
		var made []string
		for _, p := range nodePaths {
			for d := p; d != "/"; d = filepath.Dir(d) {
				if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
					made = append(made, d)
				}
			}
			if err := os.MkdirAll(p, 0o755); err != nil {
				c.mountPointsErr = err
				return
			}
		}
		if len(made) > 0 {
			c.mountPointsErr = os.WriteFile(madeDirsFile(c.run.id), []byte(strings.Join(made, "\n")+"\n"), 0o600)
		}
	})
	return c.mountPointsErr
}

// madeDirsFile lists the machine directories run id made as mount points,
// deepest first.
func madeDirsFile(id string) string { return filepath.Join(LockDir, id+".dirs") }

// removeMadeDirs removes the directories run id made, if empty. While
// another run lives they stay, handed over to it: its nodes' mount
// namespaces bind their own directories onto them, and removing a
// directory that is a mount point only in another mount namespace
// succeeds and detaches those mounts (Linux 3.18 and later), so that the
// other run's pods would then see the machine's directories instead.
func removeMadeDirs(id string) {
	b, err := os.ReadFile(madeDirsFile(id))
	if err != nil {
		return
	}
	if other := liveRun(id); other != "" {
		if f, err := os.OpenFile(madeDirsFile(other), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			_, err = f.Write(b)
			if cerr := f.Close(); err == nil && cerr == nil {
				os.Remove(madeDirsFile(id))
				return
			}
		}
	}
	for _, d := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if filepath.IsAbs(d) && !strings.Contains(d, "..") {
			os.Remove(d) // only when empty
		}
	}
	os.Remove(madeDirsFile(id))
}

// liveRun returns a run other than id that holds its lock, or "".
func liveRun(id string) string {
	locks, _ := filepath.Glob(filepath.Join(LockDir, "wft*.lock"))
	for _, l := range locks {
		other := strings.TrimSuffix(filepath.Base(l), ".lock")
		if other == id || !runIDRE.MatchString(other) {
			continue
		}
		f, err := os.Open(l)
		if err != nil {
			continue
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
		f.Close() // releases a lock taken just now
		if err != nil {
			return other
		}
	}
	return ""
}

// startKubelet starts the node's kubelet. Every node's images must be
// imported by then: cAdvisor, as the kubelet starts, maps its root
// directory's file system through the mount table and fails the start on
// a mount that vanished meanwhile, like those of an image unpacking on the
// same tmpfs.
func (c *Cluster) startKubelet(r *realNode, cr *creds) error {
	kc, err := c.writeKubeletFiles(r, cr)
	if err != nil {
		return err
	}
	r.kubeletConfig = kc
	return c.launchKubelet(r)
}

// launchKubelet runs the node's kubelet, with its files written, in
// containerd's mount namespace.
func (c *Cluster) launchKubelet(r *realNode) error {
	n := r.node
	var err error
	mnt := fmt.Sprintf("--mount=/proc/%d/ns/mnt", r.containerd.cmd.Process.Pid)
	r.kubelet, err = startProcess(r.ns, "kubelet-"+n.Name, c.path("logs"), "nsenter", []string{
		mnt, "--", filepath.Join(c.cfg.BinDir, "kubelet"),
		"--config=" + r.kubeletConfig,
		"--kubeconfig=" + filepath.Join(n.Root, "kubelet.kubeconfig"),
		"--root-dir=" + r.kubeletDir(),
		"--cert-dir=" + filepath.Join(r.kubeletDir(), "pki"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.Address.String(),
		"--v=1",
	})
	if err != nil {
		return err
	}
	c.track(r.kubelet)
	return nil
}

// containerdConfig is a node's containerd configuration (version 2): its
// own root, state and sockets, and the CRI plugin with the pause image,
// the node's CNI directories, runc with a per-node state root, no AppArmor
// (absent here) and restrict_oom_score_adj (the machine may lack
// CAP_SYS_RESOURCE, without which runc cannot lower oom_score_adj).
func containerdConfig(r *realNode) string {
	root := r.node.Root
	return fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  disable_apparmor = true
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    max_conf_num = 1
`, filepath.Join(root, "containerd/root"), filepath.Join(root, "containerd/state"),
		r.sock(), r.sock()+".ttrpc", filepath.Join(root, "containerd/opt"),
		sandboxImage, filepath.Join(root, "runc"), "/opt/cni/bin", "/etc/cni/net.d")
}

// lockImages takes a lock on the image directory, which every cluster of
// the repository shares: exclusive (syscall.LOCK_EX) while one writes the
// binaries and archives, shared (LOCK_SH) while nodes import them, so that
// a cluster starting in another test process never reads a half-written
// archive. It returns the unlock function.
func (c *Config) lockImages(how int) (func(), error) {
	if err := os.MkdirAll(c.imageDir(), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(c.imageDir(), ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", c.imageDir(), err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// importImages waits for containerd and imports every archive of
// BinDir/images and Config.ExtraImages into its k8s.io namespace, tagged
// also :latest (pods naming either tag find it; IfNotPresent then never
// pulls).
func (c *Cluster) importImages(ctx context.Context, r *realNode) error {
	unlock, err := c.cfg.lockImages(syscall.LOCK_SH)
	if err != nil {
		return err
	}
	defer unlock()
	archives, err := filepath.Glob(filepath.Join(c.cfg.imageDir(), "*.tar"))
	if err != nil || len(archives) == 0 {
		return fmt.Errorf("no image archives in %s (the cluster writes them at start): %v", c.cfg.imageDir(), err)
	}
	archives = append(archives, c.cfg.ExtraImages...)
	if err := c.poll(ctx, "containerd on "+r.node.Name, func(ctx context.Context) (bool, string, error) {
		if ok, perr := r.containerd.exited(); ok {
			return false, "", fmt.Errorf("%w", errors.Join(perr, r.containerd.failure()))
		}
		_, err := c.ctr(ctx, r, "version")
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		return err
	}
	for _, a := range archives {
		out, err := c.ctr(ctx, r, "images", "import", "--no-unpack=false", a)
		if err != nil {
			return fmt.Errorf("importing %s on %s: %w", a, r.node.Name, err)
		}
		for _, ref := range importedRefs(out) {
			if i := strings.LastIndexByte(ref, ':'); i > 0 && !strings.HasSuffix(ref, ":latest") {
				if _, err := c.ctr(ctx, r, "images", "tag", "--force", ref, ref[:i]+":latest"); err != nil {
					return fmt.Errorf("tagging %s on %s: %w", ref, r.node.Name, err)
				}
			}
		}
	}
	return nil
}

// importedRefs reads the references `ctr images import` printed
// ("unpacking docker.io/weft/echo:0.1.0 (sha256:...)...done").
func importedRefs(out string) []string {
	var refs []string
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "unpacking "); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				refs = append(refs, f[0])
			}
		}
	}
	return refs
}

// ctr runs ctr against the node's containerd in its k8s.io namespace.
func (c *Cluster) ctr(ctx context.Context, r *realNode, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", r.sock(), "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// writeKubeletFiles writes the node's kubeconfig (client certificate
// system:node:<name> in group system:nodes, which the Node authorizer
// knows), its serving certificate for its InternalIP (signed by the
// cluster CA, which the API server checks) and its KubeletConfiguration;
// it returns the configuration's path.
func (c *Cluster) writeKubeletFiles(r *realNode, cr *creds) (string, error) {
	n := r.node
	client, err := cr.ca.client("kubelet-"+n.Name, "system:node:"+n.Name, "system:nodes")
	if err != nil {
		return "", err
	}
	server := fmt.Sprintf("https://%s:%d", cpAddr, apiPort)
	if err := writeKubeconfig(filepath.Join(n.Root, "kubelet.kubeconfig"), server, cr.ca.caPEM(), client); err != nil {
		return "", err
	}
	serving, err := cr.ca.serving("kubelet-serving-"+n.Name, n.Name, []net.IP{n.Address.AsSlice()}, []string{n.Name})
	if err != nil {
		return "", err
	}
	path := filepath.Join(n.Root, "kubelet.yaml")
	return path, os.WriteFile(path, []byte(kubeletConfig(r, cr.ca.caFile(), serving)), 0o644)
}

// kubeletConfig is the node's KubeletConfiguration. cgroup v1 is allowed
// (this kind of machine has it), with the cgroupfs driver and a cgroup root
// of the node's own; protectKernelDefaults is false, so the kubelet sets
// kubeletSysctls (restored at Close). The API server authenticates with a
// client certificate of the cluster CA and is authorized through
// SubjectAccessReviews (it is in system:masters). Eviction thresholds are
// low: the node shares a tmpfs with the machine.
func kubeletConfig(r *realNode, caFile string, serving certFiles) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
failSwapOn: false
protectKernelDefaults: false
resolvConf: ""
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %s
tlsPrivateKeyFile: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization:
  mode: Webhook
clusterDNS: [%s]
clusterDomain: %s
serializeImagePulls: false
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 4s
fileCheckFrequency: 2s
syncFrequency: 10s
`, r.cgroup, r.sock(), filepath.Join(r.node.Root, "var/log/pods"), r.node.Address,
		serving.cert, serving.key, caFile, clusterDNSIP, clusterDomain)
}

// cgroupControllers lists the cgroup v1 hierarchies under cgroupMount
// (every directory but unified, which is cgroup2).
func cgroupControllers() []string {
	entries, _ := os.ReadDir(cgroupMount)
	var out []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != "unified" {
			out = append(out, e.Name())
		}
	}
	return out
}

// makeCgroup makes the cgroup in every v1 hierarchy, systemd's included
// (the kubelet checks them all), with cpuset.cpus and cpuset.mems copied
// from the root (a new cpuset is empty, and no task may join it).
func makeCgroup(name string) error {
	for _, ctrl := range cgroupControllers() {
		dir := filepath.Join(cgroupMount, ctrl, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if ctrl != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(cgroupMount, ctrl, f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0); err != nil {
				return fmt.Errorf("writing %s: %w", f, err)
			}
		}
	}
	return nil
}

// runCgroups lists the cgroup roots of run id's nodes ("/<id>-<node>").
func runCgroups(id string) []string {
	seen := map[string]bool{}
	for _, ctrl := range append(cgroupControllers(), "unified") {
		entries, _ := os.ReadDir(filepath.Join(cgroupMount, ctrl))
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), id+"-") {
				seen["/"+e.Name()] = true
			}
		}
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	return out
}

// killCgroup kills every process in the cgroup tree (pids from every
// hierarchy) until none is left or the timeout passes.
func killCgroup(name string, timeout time.Duration) int {
	killed := map[int]bool{}
	deadline := time.Now().Add(timeout)
	for {
		pids := cgroupPIDs(name)
		if len(pids) == 0 || time.Now().After(deadline) {
			return len(killed)
		}
		for _, pid := range pids {
			killed[pid] = true
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cgroupPIDs lists the processes in the cgroup tree in any hierarchy.
func cgroupPIDs(name string) []int {
	seen := map[int]bool{}
	for _, ctrl := range append(cgroupControllers(), "unified") {
		root := filepath.Join(cgroupMount, ctrl, name)
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				var pid int
				if _, err := fmt.Sscan(f, &pid); err == nil && pid != os.Getpid() {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	var out []int
	for p := range seen {
		out = append(out, p)
	}
	return out
}

// removeCgroup removes the cgroup tree from every hierarchy, deepest
// first; a cgroup dir is removed with rmdir, its files go with it.
func removeCgroup(name string) error {
	var errs []error
	for _, ctrl := range append(cgroupControllers(), "unified") {
		root := filepath.Join(cgroupMount, ctrl, name)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// readSysctls reads the keys of /proc/sys.
func readSysctls(keys []string) map[string]string {
	out := map[string]string{}
	for _, k := range keys {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			out[k] = strings.TrimSpace(string(b))
		}
	}
	return out
}

// saveSysctls records kubeletSysctls in the run's directory.
func (c *Cluster) saveSysctls() error {
	var b strings.Builder
	for k, v := range readSysctls(kubeletSysctls) {
		fmt.Fprintf(&b, "%s=%s\n", k, v)
	}
	return os.WriteFile(sysctlFile(c.run.id), []byte(b.String()), 0o600)
}

// restoreSysctls writes back the values run id recorded, then forgets them.
func restoreSysctls(id string) error {
	b, err := os.ReadFile(sysctlFile(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "vm/") && !strings.HasPrefix(k, "kernel/") || strings.Contains(k, "..") {
			continue
		}
		if cur := readSysctls([]string{k})[k]; cur == v {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0); err != nil {
			errs = append(errs, fmt.Errorf("restoring %s: %w", k, err))
		}
	}
	if len(errs) == 0 {
		os.Remove(sysctlFile(id))
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) error {
	var errs []error
	for range 3 { // mounts stacked on mounts show up again
		mounts := mountsMentioning(dir + "/")
		if len(mounts) == 0 {
			return nil
		}
		for i := len(mounts) - 1; i >= 0; i-- {
			if err := unix.Unmount(mounts[i], unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", mounts[i], err))
			}
		}
	}
	if m := mountsMentioning(dir + "/"); len(m) > 0 {
		return errors.Join(append(errs, fmt.Errorf("still mounted: %s", strings.Join(m, " ")))...)
	}
	return nil
}

// cleanRuntimeLeftovers removes what the runtimes of a run in runDir keep
// outside it (real-node mode): processes in its cgroups, mounts under its
// directory, its cgroups, the sysctls the kubelet changed, the kubelet's
// /var/log/containers links into it, the mount points it made on the
// machine and shim sockets nobody listens on. A run of the stand-in has none of them;
// it is a no-op then.
func cleanRuntimeLeftovers(runDir, id string) error {
	var errs []error
	cgroups := runCgroups(id)
	for _, cg := range cgroups {
		killCgroup(cg, 10*time.Second)
	}
	if err := unmountUnder(runDir); err != nil {
		errs = append(errs, err)
	}
	for _, cg := range cgroups {
		if err := removeCgroup(cg); err != nil {
			errs = append(errs, err)
		}
	}
	if err := restoreSysctls(id); err != nil {
		errs = append(errs, err)
	}
	removeLinksInto("/var/log/containers", runDir)
	os.Remove("/var/log/containers") // the kubelet makes it; only when empty
	removeMadeDirs(id)
	removeDeadSockets("/run/containerd/s")
	for _, d := range []string{"/run/containerd/s", "/run/containerd/runc", "/run/containerd"} {
		os.Remove(d) // only when empty
	}
	return errors.Join(errs...)
}

// removeLinksInto removes the symlinks of dir that point below target.
func removeLinksInto(dir, target string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if dst, err := os.Readlink(p); err == nil && strings.HasPrefix(dst, target+"/") {
			os.Remove(p)
		}
	}
}

// removeDeadSockets removes the unix sockets in dir that nobody listens
// on (shims killed with their node leave theirs behind).
func removeDeadSockets(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.Type()&os.ModeSocket == 0 {
			continue
		}
		conn, err := net.DialTimeout("unix", p, time.Second)
		if err == nil {
			conn.Close()
			continue
		}
		os.Remove(p)
	}
}

// stopRealNodes stops every node's kubelet, then its containerd, then what
// runs in its cgroup (containers and shims outlive containerd), and cleans
// what they leave outside the run's directory.
func (c *Cluster) stopRealNodes() error {
	var wg sync.WaitGroup
	for _, r := range c.realNodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r.kubelet != nil {
				r.kubelet.stop(2 * time.Second)
			}
			if r.containerd != nil {
				r.containerd.stop(2 * time.Second)
			}
		}()
	}
	wg.Wait()
	// Shims live in the node's network namespace, containers in the
	// node's cgroup or their pod's namespace.
	inodes := map[uint64]bool{}
	for _, r := range c.realNodes {
		if ino, err := r.ns.ID(); err == nil {
			inodes[ino] = true
		}
	}
	for _, pid := range processesIn(inodes) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return cleanRuntimeLeftovers(c.run.dir, c.run.id)
}

// addDefaultRoute gives a node's namespace a default route through the
// control plane: the kubelet refuses to start without one.
func addDefaultRoute(ns *netns.NS) error {
	h, err := ns.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	r := &netlink.Route{Dst: nil, Gw: cpAddr.AsSlice()}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("adding a default route in %s: %w", ns.Path(), err)
	}
	return nil
}

// imageDir holds the image archives of real-node mode.
func (c *Config) imageDir() string { return filepath.Join(c.BinDir, "images") }

// buildImageArchives builds, as `make images` does, static binaries of
// every image package (the mesh's, the pause image's and Config.Images)
// into BinDir/images/bin and writes their OCI archives into BinDir/images.
func (c *Config) buildImageArchives(ctx context.Context) error {
	unlock, err := c.lockImages(syscall.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	pkgs := append(MeshImages(), "./test/cmd/pause")
	for _, p := range c.Images {
		if !containsString(pkgs, p) {
			pkgs = append(pkgs, p)
		}
	}
	binDir := filepath.Join(c.imageDir(), "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	build := exec.CommandContext(ctx, c.Go, append([]string{"build", "-buildvcs=false", "-trimpath", "-o", binDir + "/"}, pkgs...)...)
	build.Dir = c.RepoDir
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building image binaries: %w\n%s", err, out)
	}
	tool := filepath.Join(c.imageDir(), "weft-images")
	steps := [][]string{
		{c.Go, "build", "-buildvcs=false", "-o", tool, "./test/cmd/weft-images"},
		{tool, "-bin", binDir, "-out", c.imageDir(), "-chart", filepath.Join(c.RepoDir, "charts/weft")},
	}
	for _, s := range steps {
		cmd := exec.CommandContext(ctx, s[0], s[1:]...)
		cmd.Dir = c.RepoDir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("writing image archives (%s): %w\n%s", strings.Join(s, " "), err, out)
		}
	}
	return nil
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// setPodCIDRs gives every registered node without a pod CIDR its own, as
// the stand-in's nodes have (kube-controller-manager's IPAM is off).
func (c *Cluster) setPodCIDRs(ctx context.Context, nodes []corev1.Node) {
	for _, n := range nodes {
		if n.Spec.PodCIDR != "" {
			continue
		}
		for _, mine := range c.nodes {
			if mine.Name == n.Name {
				_, err := c.client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, nodePodCIDRPatch(mine.PodCIDR), metav1.PatchOptions{})
				if err != nil {
					c.log.Warn("setting a node's pod CIDR failed", "node", n.Name, "err", err)
				}
			}
		}
	}
}

// nodePodCIDRPatch sets a node's spec.podCIDR (the kubelet registers the
// Node without; the node's CNI configuration already uses the range).
func nodePodCIDRPatch(p netip.Prefix) []byte {
	return []byte(fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, p, p))
}

// NodeMode is what runs the nodes' pods (Config.NodeMode).
func (c *Cluster) NodeMode() string { return c.cfg.NodeMode }

// SameFile reports whether path, as the processes of node see it, and
// hostPath, as this process sees it, are one file (the same device and
// inode): a netns path a runtime handed to a CNI plugin against a pod's
// /proc/<pid>/ns/net, say. On real nodes path is looked up in the node's
// mount namespace, where the runtime's /var/run/netns lives; on stand-in
// nodes the machine's paths are the node's.
func (c *Cluster) SameFile(ctx context.Context, node, path, hostPath string) (bool, error) {
	var want unix.Stat_t
	if err := unix.Stat(hostPath, &want); err != nil {
		return false, fmt.Errorf("stat %s: %w", hostPath, err)
	}
	r, ok := c.realNodeOf(node)
	if !ok {
		var got unix.Stat_t
		if err := unix.Stat(path, &got); err != nil {
			return false, fmt.Errorf("stat %s: %w", path, err)
		}
		return got.Dev == want.Dev && got.Ino == want.Ino, nil
	}
	// stat(1) in the node's mount namespace: an absolute symbolic link
	// (Debian's /var/run) met under /proc/<pid>/root would be followed in
	// the machine's namespace instead.
	mnt := fmt.Sprintf("--mount=/proc/%d/ns/mnt", r.containerd.cmd.Process.Pid)
	out, err := exec.CommandContext(ctx, "nsenter", mnt, "--", "stat", "-L", "-c", "%d %i", path).CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("stat %s on node %s: %v: %s", path, node, err, strings.TrimSpace(string(out)))
	}
	var dev, ino uint64
	if _, err := fmt.Sscanf(string(out), "%d %d", &dev, &ino); err != nil {
		return false, fmt.Errorf("stat %s on node %s: reading %q: %v", path, node, out, err)
	}
	return dev == uint64(want.Dev) && ino == want.Ino, nil
}

// podCgroup finds the cgroup directory of pod uid on a real node in the
// pids hierarchy (kubepods/[burstable|besteffort/]pod<uid>).
func (r *realNode) podCgroup(uid string) (string, error) {
	root := filepath.Join(cgroupMount, "pids", r.cgroup, "kubepods")
	for _, dir := range []string{"", "burstable", "besteffort"} {
		p := filepath.Join(root, dir, "pod"+uid)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("no cgroup for pod %s under %s", uid, root)
}

// podProcess returns a process of the pod on a real node: the one of
// container id (its ID without the runtime's scheme), or, for id "", the
// sandbox's pause process, which holds the pod's namespaces while the pod
// lives.
func (r *realNode) podProcess(uid, id string) (int, error) {
	cg, err := r.podCgroup(uid)
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir(cg)
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		if !e.IsDir() || (id != "" && e.Name() != id) {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(cg, e.Name(), "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err != nil {
				continue
			}
			if id != "" || filepath.Base(strings.SplitN(cmdline(pid), " ", 2)[0]) == "pause" {
				return pid, nil
			}
		}
	}
	if id == "" {
		return 0, fmt.Errorf("no sandbox process in %s", cg)
	}
	return 0, fmt.Errorf("no process of container %s in %s", id, cg)
}

// realPodNetns is PodNetns on real nodes: the network namespace of the
// pod's sandbox process.
func (c *Cluster) realPodNetns(r *realNode, p *corev1.Pod) (string, error) {
	pid, err := r.podProcess(string(p.UID), "")
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("/proc/%d/ns/net", pid), nil
}

// realExec is ExecContainer on real nodes. It runs argv in every namespace
// of the container's process but its user namespace, with the container's
// environment, as `kubectl exec` does; a binary of BinDir is run from the
// machine through a file descriptor (the static build of it in
// BinDir/images/bin, which the images hold, when there is one), so a test
// runs this repository's tools in any container.
func (c *Cluster) realExec(ctx context.Context, r *realNode, p *corev1.Pod, container string, argv []string, stdout, stderr io.Writer) error {
	if container == "" && len(p.Spec.Containers) > 0 {
		container = p.Spec.Containers[0].Name
	}
	id := ""
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == container {
			_, id, _ = strings.Cut(s.ContainerID, "://")
		}
	}
	if id == "" {
		return fmt.Errorf("container %q of pod %s/%s is not running", container, p.Namespace, p.Name)
	}
	pid, err := r.podProcess(string(p.UID), id)
	if err != nil {
		return err
	}
	env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	args := []string{fmt.Sprintf("--target=%d", pid), "--mount", "--uts", "--ipc", "--net", "--pid", "--"}
	var extra []*os.File
	if len(argv) > 0 && strings.HasPrefix(argv[0], c.cfg.BinDir+"/") {
		bin := argv[0]
		if static := filepath.Join(c.cfg.imageDir(), "bin", filepath.Base(bin)); fileExists(static) {
			bin = static
		}
		f, err := os.Open(bin)
		if err != nil {
			return err
		}
		defer f.Close()
		extra = append(extra, f)
		argv = append([]string{"/proc/self/fd/3"}, argv[1:]...)
	}
	cmd := exec.CommandContext(ctx, "nsenter", append(args, argv...)...)
	cmd.Env = strings.Split(strings.TrimRight(string(env), "\x00"), "\x00")
	cmd.ExtraFiles = extra
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return cmd.Run()
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// realNodeOf returns the real node named name.
func (c *Cluster) realNodeOf(name string) (*realNode, bool) {
	for _, r := range c.realNodes {
		if r.node.Name == name {
			return r, true
		}
	}
	return nil, false
}

// keptLogsDir is where the harness keeps hard links to the kubelet's pod
// log files of a node, so that Logs reads a pod's log after the kubelet
// removed the pod's directory (as the stand-in keeps it).
func keptLogsDir(n Node) string { return filepath.Join(n.Root, "var/log/pods-kept") }

// keepLogs links every new pod log file of the real nodes into
// keptLogsDir until ctx ends.
func (c *Cluster) keepLogs(ctx context.Context) error {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		for _, r := range c.realNodes {
			linkLogs(filepath.Join(r.node.Root, "var/log/pods"), keptLogsDir(r.node))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// linkLogs hard-links the files of <src>/<pod>/<container>/<n>.log into
// the same place under dst, where missing.
func linkLogs(src, dst string) {
	files, _ := filepath.Glob(filepath.Join(src, "*", "*", "*.log"))
	for _, f := range files {
		rel, err := filepath.Rel(src, f)
		if err != nil {
			continue
		}
		target := filepath.Join(dst, rel)
		if _, err := os.Lstat(target); err == nil {
			continue
		}
		if os.MkdirAll(filepath.Dir(target), 0o755) == nil {
			_ = os.Link(f, target)
		}
	}
}

// RestartNode stops a real node's kubelet and containerd and starts them
// again, as an operator restarting a node's services does: the pods'
// containers, their shims and network namespaces stay, and the new
// containerd joins the node's mount namespace, which the shims keep
// alive. It returns once the node reports Ready from a heartbeat after the
// restart.
func (c *Cluster) RestartNode(ctx context.Context, name string) error {
	if c.cfg.NodeMode != NodeModeKubelet {
		return fmt.Errorf("restarting node %s: only real nodes restart (NodeMode %q)", name, c.cfg.NodeMode)
	}
	var r *realNode
	for _, rn := range c.realNodes {
		if rn.node.Name == name {
			r = rn
		}
	}
	if r == nil {
		return fmt.Errorf("restarting node %s: no such node", name)
	}
	start := time.Now()
	r.kubelet.stop(10 * time.Second)
	r.containerd.stop(10 * time.Second)
	holder, err := nodeMountHolder(r)
	if err != nil {
		return fmt.Errorf("restarting node %s: %w", name, err)
	}
	r.containerd, err = startProcess(r.ns, "containerd-"+name, c.path("logs"), "nsenter", []string{
		fmt.Sprintf("--mount=/proc/%d/ns/mnt", holder), "--", "containerd", "--config=" + filepath.Join(r.node.Root, "containerd.toml"),
	})
	if err != nil {
		return fmt.Errorf("restarting node %s: %w", name, err)
	}
	c.track(r.containerd)
	// The runtime answers, and still knows the node's containers.
	err = c.poll(ctx, "node "+name+"'s containerd answering after its restart", func(ctx context.Context) (bool, string, error) {
		out, err := c.ctr(ctx, r, "containers", "list", "--quiet")
		if err != nil {
			return false, err.Error(), nil
		}
		n := len(strings.Fields(out))
		return n > 0, fmt.Sprintf("%d containers", n), nil
	})
	if err != nil {
		return err
	}
	if err := c.launchKubelet(r); err != nil {
		return fmt.Errorf("restarting node %s: %w", name, err)
	}
	c.log.Info("node services restarted", "node", name)
	return c.poll(ctx, "node "+name+" Ready after its restart", func(ctx context.Context) (bool, string, error) {
		n, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				fresh := cond.LastHeartbeatTime.After(start)
				return cond.Status == corev1.ConditionTrue && fresh, fmt.Sprintf("Ready=%s, heartbeat %s", cond.Status, cond.LastHeartbeatTime), nil
			}
		}
		return false, "no Ready condition", nil
	})
}

// nodeMountHolder finds a process that still holds a stopped containerd's
// mount namespace: one of its shims, in the node's network namespace with
// a mount namespace other than the machine's.
func nodeMountHolder(r *realNode) (int, error) {
	ino, err := r.ns.ID()
	if err != nil {
		return 0, err
	}
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return 0, err
	}
	for _, pid := range processesIn(map[uint64]bool{ino: true}) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		mnt, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if err == nil && mnt != own && strings.HasPrefix(strings.TrimSpace(string(comm)), "containerd-shim") {
			return pid, nil
		}
	}
	return 0, errors.New("no shim holds the node's mount namespace (no pod runs there)")
}
