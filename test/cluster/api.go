package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/test/echo"
)

// FieldManager is the server-side apply field manager of Apply.
const FieldManager = "weft-e2e"

// applier holds the dynamic client and REST mapper Apply uses.
type applier struct {
	once   sync.Once
	err    error
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func (c *Cluster) applier() (*applier, error) {
	a := &c.apply
	a.once.Do(func() {
		a.dyn, a.err = dynamic.NewForConfig(c.rest)
		if a.err == nil {
			a.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.client.Discovery()))
		}
	})
	return a, a.err
}

// decodeManifest splits multi-document YAML (or JSON) into objects.
func decodeManifest(manifest string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("decoding manifest: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("decoding manifest: object without apiVersion, kind or metadata.name: %v", m)
		}
		objs = append(objs, u)
	}
}

// resourceFor finds an object's resource, refreshing discovery (for CRDs
// applied just before) for up to 30s.
func (c *Cluster) resourceFor(ctx context.Context, a *applier, u *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := u.GroupVersionKind()
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			if m.Scope.Name() == meta.RESTScopeNameNamespace {
				ns := u.GetNamespace()
				if ns == "" {
					ns = "default"
				}
				return a.dyn.Resource(m.Resource).Namespace(ns), nil
			}
			return a.dyn.Resource(m.Resource), nil
		}
		if !meta.IsNoMatchError(err) || time.Now().After(deadline) {
			return nil, fmt.Errorf("finding the resource of %s: %w", gvk, err)
		}
		a.mapper.Reset()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Apply server-side-applies every object of a YAML (or JSON) manifest, in
// order. Objects without a namespace go to "default" if namespaced.
func (c *Cluster) Apply(ctx context.Context, manifest string) error {
	objs, err := decodeManifest(manifest)
	if err != nil {
		return err
	}
	a, err := c.applier()
	if err != nil {
		return err
	}
	force := true
	for _, u := range objs {
		ri, err := c.resourceFor(ctx, a, u)
		if err != nil {
			return err
		}
		data, err := json.Marshal(u.Object)
		if err != nil {
			return err
		}
		if _, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: &force}); err != nil {
			return fmt.Errorf("applying %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
	return nil
}

// Delete deletes every object of a manifest (missing ones are fine), in
// reverse order, without waiting for them to go.
func (c *Cluster) Delete(ctx context.Context, manifest string) error {
	objs, err := decodeManifest(manifest)
	if err != nil {
		return err
	}
	a, err := c.applier()
	if err != nil {
		return err
	}
	bg := metav1.DeletePropagationBackground
	for i := len(objs) - 1; i >= 0; i-- {
		u := objs[i]
		ri, err := c.resourceFor(ctx, a, u)
		if err != nil {
			return err
		}
		if err := ri.Delete(ctx, u.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
	return nil
}

// WaitFor polls cond every 100ms until it returns true, returns an error,
// ctx ends or a part of the cluster fails. what names the awaited
// condition in the error.
func (c *Cluster) WaitFor(ctx context.Context, what string, cond func(ctx context.Context) (bool, error)) error {
	return c.poll(ctx, what, func(ctx context.Context) (bool, string, error) {
		ok, err := cond(ctx)
		return ok, "", err
	})
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// describePods summarizes pods for error messages.
func describePods(pods []corev1.Pod) string {
	var parts []string
	for _, p := range pods {
		s := fmt.Sprintf("%s(%s on %q ready=%v", p.Name, p.Status.Phase, p.Spec.NodeName, podReady(&p))
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				s += fmt.Sprintf(" %s:%s %s", cs.Name, w.Reason, w.Message)
			}
			if cs.RestartCount > 0 {
				s += fmt.Sprintf(" %s:restarts=%d", cs.Name, cs.RestartCount)
				if l := cs.LastTerminationState.Terminated; l != nil {
					s += fmt.Sprintf(" last %s exit %d at %s", l.Reason, l.ExitCode, l.FinishedAt.UTC().Format(time.RFC3339))
				}
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status != corev1.ConditionTrue && !cond.LastTransitionTime.IsZero() {
				s += fmt.Sprintf(" not ready since %s", cond.LastTransitionTime.UTC().Format(time.RFC3339))
			}
		}
		parts = append(parts, s+")")
	}
	if len(parts) == 0 {
		return "no pods"
	}
	return strings.Join(parts, ", ")
}

// WaitPods waits until n pods matching the label selector in namespace are
// Ready and returns them (sorted by name).
func (c *Cluster) WaitPods(ctx context.Context, namespace, selector string, n int) ([]corev1.Pod, error) {
	var ready []corev1.Pod
	err := c.poll(ctx, fmt.Sprintf("%d ready pods %q in %s", n, selector, namespace), func(ctx context.Context) (bool, string, error) {
		list, err := c.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error(), nil
		}
		ready = ready[:0]
		for _, p := range list.Items {
			if podReady(&p) {
				ready = append(ready, p)
			}
		}
		return len(ready) >= n, describePods(list.Items), nil
	})
	sort.Slice(ready, func(i, j int) bool { return ready[i].Name < ready[j].Name })
	return ready, err
}

// WaitDeployment waits until a Deployment's replicas are all updated and
// available.
func (c *Cluster) WaitDeployment(ctx context.Context, namespace, name string) error {
	return c.poll(ctx, "deployment "+namespace+"/"+name+" available", func(ctx context.Context) (bool, string, error) {
		d, err := c.client.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		s := d.Status
		return d.Status.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.AvailableReplicas == want && s.Replicas == want,
			fmt.Sprintf("replicas %d updated %d available %d of %d", s.Replicas, s.UpdatedReplicas, s.AvailableReplicas, want), nil
	})
}

// WaitDaemonSet waits until a DaemonSet runs a ready pod on every node it
// should.
func (c *Cluster) WaitDaemonSet(ctx context.Context, namespace, name string) (*appsv1.DaemonSet, error) {
	var ds *appsv1.DaemonSet
	err := c.poll(ctx, "daemonset "+namespace+"/"+name+" ready", func(ctx context.Context) (bool, string, error) {
		var err error
		ds, err = c.client.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		s := ds.Status
		return s.ObservedGeneration >= ds.Generation && s.DesiredNumberScheduled > 0 && s.NumberReady == s.DesiredNumberScheduled && s.UpdatedNumberScheduled == s.DesiredNumberScheduled,
			fmt.Sprintf("desired %d ready %d updated %d", s.DesiredNumberScheduled, s.NumberReady, s.UpdatedNumberScheduled), nil
	})
	return ds, err
}

// WaitPodGone waits until a pod no longer exists.
func (c *Cluster) WaitPodGone(ctx context.Context, namespace, name string) error {
	return c.poll(ctx, "pod "+namespace+"/"+name+" gone", func(ctx context.Context) (bool, string, error) {
		p, err := c.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, err.Error(), nil
		}
		return false, describePods([]corev1.Pod{*p}), nil
	})
}

// Helm runs bin/helm against the cluster, with its state in the run's
// directory, and returns its combined output.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	home := c.path("helm")
	return c.runTool(ctx, "helm", []string{"HOME=" + home,
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"),
	}, args...)
}

// Kubectl runs bin/kubectl against the cluster from the repository's root,
// as a user follows README, and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.runTool(ctx, "kubectl", []string{"HOME=" + c.path("kubectl")}, args...)
}

// KubectlCommand is Kubectl as a command not yet started, for one that
// keeps running (port-forward, logs -f): the caller starts, reads and
// stops it.
func (c *Cluster) KubectlCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.BinPath("kubectl"), args...)
	cmd.Env = []string{"KUBECONFIG=" + c.kubeconfig, "PATH=" + os.Getenv("PATH"), "HOME=" + c.path("kubectl")}
	cmd.Dir = c.cfg.RepoDir
	return cmd
}

// PortForward runs `kubectl port-forward <args>` (args name the namespace,
// the target and ":<port>"), as a user would, and returns the local
// address it listens on once kubectl says so, and a stop function.
func (c *Cluster) PortForward(ctx context.Context, args ...string) (local string, stop func(), err error) {
	pf := c.KubectlCommand(ctx, append([]string{"port-forward"}, args...)...)
	stdout, err := pf.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	var stderr strings.Builder
	pf.Stderr = &stderr
	if err := pf.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { _ = pf.Process.Kill(); _ = pf.Wait() }
	// "Forwarding from 127.0.0.1:<port> -> <port>"
	sc := bufio.NewScanner(stdout)
	for local == "" && sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "Forwarding" && strings.HasPrefix(f[2], "127.0.0.1:") {
			local = f[2]
		}
	}
	if local == "" {
		stop()
		return "", nil, fmt.Errorf("kubectl port-forward %s printed no local address: %v %s", strings.Join(args, " "), sc.Err(), stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return local, stop, nil
}

// runTool runs bin/<name> from the repository's root with the cluster's
// kubeconfig, PATH and env.
func (c *Cluster) runTool(ctx context.Context, name string, env []string, args ...string) (string, error) {
	bin := filepath.Join(c.cfg.BinDir, name)
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("%s not found at %s; build it with `make tools`", name, bin)
	}
	return c.runCommand(exec.CommandContext(ctx, bin, args...), "PATH="+os.Getenv("PATH"), env)
}

// Shell runs a command line with sh -c as a user at a terminal of the
// cluster would: from the repository's root, with the cluster's kubeconfig
// and this repository's tools (kubectl, helm) first on PATH. It is for the
// commands README and the chart's NOTES show, run as written.
func (c *Cluster) Shell(ctx context.Context, script string) (string, error) {
	path := c.cfg.BinDir + string(os.PathListSeparator) + os.Getenv("PATH")
	return c.runCommand(exec.CommandContext(ctx, "sh", "-c", script), "PATH="+path, []string{"HOME=" + c.path("kubectl")})
}

func (c *Cluster) runCommand(cmd *exec.Cmd, path string, env []string) (string, error) {
	cmd.Env = append([]string{"KUBECONFIG=" + c.kubeconfig, path}, env...)
	cmd.Dir = c.cfg.RepoDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return string(out), nil
}

// HelmInstall installs chart (a path, relative to the repository, or a
// chart reference) as release in namespace, creating the namespace; extra
// arguments (--set, --wait, ...) follow.
func (c *Cluster) HelmInstall(ctx context.Context, release, chart, namespace string, extra ...string) (string, error) {
	return c.Helm(ctx, append([]string{"install", release, chart, "--namespace", namespace, "--create-namespace"}, extra...)...)
}

// PodNetns returns the network namespace file a pod runs in (its node's
// for hostNetwork pods).
func (c *Cluster) PodNetns(ctx context.Context, namespace, name string) (string, error) {
	p, err := c.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for i, n := range c.nodes {
		if n.Name != p.Spec.NodeName {
			continue
		}
		if p.Spec.HostNetwork {
			return n.Netns, nil
		}
		if r, ok := c.realNodeOf(n.Name); ok {
			return c.realPodNetns(r, p)
		}
		return c.runners[i].NetnsPath(p.UID), nil
	}
	return "", fmt.Errorf("pod %s/%s is not on a node of this cluster (node %q)", namespace, name, p.Spec.NodeName)
}

// Exec runs a command in a pod's first container, the way `kubectl exec`
// does (see ExecContainer), and returns its stdout and stderr.
func (c *Cluster) Exec(ctx context.Context, namespace, pod string, argv ...string) (stdout, stderr []byte, err error) {
	return c.ExecContainer(ctx, namespace, pod, "", argv...)
}

// ExecContainer runs a command in a container of a pod: in the pod's
// network namespace, with the container's environment, volumes,
// /etc/resolv.conf (cluster DNS) and host name. argv[0] is a path or a name
// on the container's PATH; the container sees the machine's files with its
// volumes on top, so BinPath names this repository's binaries. container ""
// is the first container.
func (c *Cluster) ExecContainer(ctx context.Context, namespace, pod, container string, argv ...string) (stdout, stderr []byte, err error) {
	p, err := c.client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	for i, n := range c.nodes {
		if n.Name != p.Spec.NodeName {
			continue
		}
		var out, errb bytes.Buffer
		if r, ok := c.realNodeOf(n.Name); ok {
			err = c.realExec(ctx, r, p, container, argv, &out, &errb)
		} else {
			err = c.runners[i].Exec(ctx, p, container, argv, nil, &out, &errb)
		}
		if err != nil {
			err = fmt.Errorf("exec %s in %s/%s: %w (stderr: %s)", strings.Join(argv, " "), namespace, pod, err, strings.TrimSpace(errb.String()))
		}
		return out.Bytes(), errb.Bytes(), err
	}
	return nil, nil, fmt.Errorf("pod %s/%s is not on a node of this cluster (node %q)", namespace, pod, p.Spec.NodeName)
}

// BinPath is the path of a binary in BinDir.
func (c *Cluster) BinPath(name string) string { return filepath.Join(c.cfg.BinDir, name) }

// Request sends count requests from inside a pod's network namespace to
// target (http://, h2c://, grpc:// or tcp://host:port, see echo.ClientConfig)
// with the echo client, and returns each result. headers are "Name: value".
// The error is nil when every request succeeded.
func (c *Cluster) Request(ctx context.Context, namespace, pod, target string, count int, headers ...string) ([]echo.Result, error) {
	argv := []string{c.BinPath("echo"), "client", "-json", "-n", strconv.Itoa(count)}
	for _, h := range headers {
		argv = append(argv, "-H", h)
	}
	argv = append(argv, target)
	out, _, execErr := c.Exec(ctx, namespace, pod, argv...)
	var results []echo.Result
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r echo.Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return results, fmt.Errorf("request from %s/%s: decoding %q: %w", namespace, pod, sc.Text(), err)
		}
		results = append(results, r)
	}
	if len(results) == 0 && execErr != nil {
		return nil, execErr
	}
	if execErr != nil {
		return results, fmt.Errorf("request from %s/%s to %s: %s", namespace, pod, target, echo.Summary(results))
	}
	return results, nil
}

// WaitReachable waits until one request from a pod to target succeeds (a
// new Service works once kube-proxy on the client's node has synced it).
func (c *Cluster) WaitReachable(ctx context.Context, namespace, pod, target string) error {
	var last error
	return c.poll(ctx, fmt.Sprintf("%s reachable from %s/%s", target, namespace, pod), func(ctx context.Context) (bool, string, error) {
		_, last = c.Request(ctx, namespace, pod, target, 1)
		if last != nil {
			return false, last.Error(), nil
		}
		return true, "", nil
	})
}

// WaitAnsweredBy sends requests from a pod to target until each of the
// named pods has answered at least once: after Pods or a Service change,
// kube-proxy (or a mesh) on the client's node programs new endpoints a
// moment after they are Ready.
func (c *Cluster) WaitAnsweredBy(ctx context.Context, namespace, pod, target string, pods ...string) error {
	seen := map[string]bool{}
	return c.poll(ctx, fmt.Sprintf("answers from %v to %s requests from %s/%s", pods, target, namespace, pod), func(ctx context.Context) (bool, string, error) {
		results, err := c.Request(ctx, namespace, pod, target, 10)
		for who := range echo.Answered(results) {
			seen[who] = true
		}
		for _, p := range pods {
			if !seen[p] {
				state := fmt.Sprintf("answered so far: %v", seen)
				if err != nil {
					state += "; " + err.Error()
				}
				return false, state, nil
			}
		}
		return true, "", nil
	})
}

// PodPIDs lists the processes running in a pod's network namespace (its
// containers). /proc/<pid>/root shows a container's file system as it sees
// it, volumes mounted; /proc/<pid>/environ its environment.
func (c *Cluster) PodPIDs(ctx context.Context, namespace, pod string) ([]int, error) {
	p, err := c.client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if p.Spec.HostNetwork {
		return nil, fmt.Errorf("pod %s/%s uses the node's network namespace; its processes cannot be told apart by it", namespace, pod)
	}
	path, err := c.PodNetns(ctx, namespace, pod)
	if err != nil {
		return nil, err
	}
	ns, err := netns.Open(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	ino, err := ns.ID()
	if err != nil {
		return nil, err
	}
	pids := processesIn(map[uint64]bool{ino: true})
	if _, ok := c.realNodeOf(p.Spec.NodeName); ok {
		// The sandbox's pause process is the runtime's, not the pod's.
		pids = slices.DeleteFunc(pids, func(pid int) bool {
			return filepath.Base(strings.SplitN(cmdline(pid), " ", 2)[0]) == "pause"
		})
	}
	return pids, nil
}

// OpenInPod opens a file as a pod's (first) container sees it: in its mount
// namespace, with volumes mounted and symlinks resolved inside its root.
// flag and perm are as for os.OpenFile.
func (c *Cluster) OpenInPod(ctx context.Context, namespace, pod, path string, flag int, perm os.FileMode) (*os.File, error) {
	pids, err := c.PodPIDs(ctx, namespace, pod)
	if err != nil {
		return nil, err
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("pod %s/%s has no running process", namespace, pod)
	}
	root, err := os.Open(fmt.Sprintf("/proc/%d/root", pids[0]))
	if err != nil {
		return nil, err
	}
	defer root.Close()
	fd, err := unix.Openat2(int(root.Fd()), path, &unix.OpenHow{
		Flags:   uint64(flag) | unix.O_CLOEXEC,
		Mode:    uint64(perm.Perm()),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open in pod " + namespace + "/" + pod, Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Logs returns a container's log (stdout and stderr, across restarts) of
// the newest pod with that name, also after the pod was deleted. On real
// nodes it holds the restarts the kubelet keeps (the latest two).
func (c *Cluster) Logs(namespace, pod, container string) (string, error) {
	var best string
	var bestTime time.Time
	for _, n := range c.nodes {
		dir := filepath.Join(n.Root, "var/log/pods", namespace+"_"+pod+"_*")
		matches, _ := filepath.Glob(filepath.Join(dir, container+".log"))
		// The kubelet's layout: <container>/<restart count>.log, kept
		// beyond the pod's removal in keptLogsDir.
		real, _ := filepath.Glob(filepath.Join(keptLogsDir(n), namespace+"_"+pod+"_*", container, "*.log"))
		for _, m := range append(matches, real...) {
			if st, err := os.Stat(m); err == nil && st.ModTime().After(bestTime) {
				best, bestTime = m, st.ModTime()
			}
		}
	}
	if best == "" {
		return "", fmt.Errorf("no log for container %s of pod %s/%s", container, namespace, pod)
	}
	if filepath.Base(filepath.Dir(best)) != container {
		b, err := os.ReadFile(best)
		return string(b), err
	}
	files, _ := filepath.Glob(filepath.Join(filepath.Dir(best), "*.log"))
	restart := func(f string) int {
		n, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(f), ".log"))
		return n
	}
	slices.SortFunc(files, func(a, b string) int { return restart(a) - restart(b) })
	var out []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		out = append(out, stripCRILog(b)...)
	}
	return string(out), nil
}

// stripCRILog turns a CRI log file ("<time> <stream> <P|F> <text>" lines,
// P a partial line) into the text the container wrote.
func stripCRILog(b []byte) []byte {
	var out []byte
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		f := strings.SplitN(line, " ", 4)
		if len(f) < 4 {
			continue
		}
		out = append(out, f[3]...)
		if f[2] != "P" {
			out = append(out, '\n')
		}
	}
	return out
}

// LogPath returns a control-plane or kube-proxy log file: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy-node1...
func (c *Cluster) LogPath(process string) string { return c.path("logs", process+".log") }

// Dump writes what a failed test needs to the log: pods, recent events,
// the tails of not-ready containers' logs and of the control plane's logs.
func (c *Cluster) Dump(logf func(format string, args ...any)) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Err(); err != nil {
		logf("cluster failure: %v", err)
	}
	pods, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, p := range pods.Items {
			logf("pod %s/%s: %s", p.Namespace, p.Name, describePods([]corev1.Pod{p}))
			if !podReady(&p) {
				for _, cs := range p.Spec.Containers {
					if l, err := c.Logs(p.Namespace, p.Name, cs.Name); err == nil {
						logf("log of %s/%s %s (tail):\n%s", p.Namespace, p.Name, cs.Name, lastLines(l, 20))
					}
				}
			}
		}
	}
	events, err := c.client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err == nil {
		items := events.Items
		sort.Slice(items, func(i, j int) bool { return items[i].LastTimestamp.Before(&items[j].LastTimestamp) })
		if len(items) > 40 {
			items = items[len(items)-40:]
		}
		for _, e := range items {
			logf("event %s %s/%s %s: %s", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
	for _, p := range append([]*process{c.etcd, c.apiserver, c.kcm, c.scheduler}, c.proxies...) {
		if p != nil {
			logf("%s log (tail):\n%s", p.name, tail(p.logPath, 15))
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// HTTPGet fetches url from inside a pod's network namespace (a plain HTTP
// GET, for metrics and admin pages that listen on the pod's loopback) and
// returns the body; a status other than 200 is an error.
func (c *Cluster) HTTPGet(ctx context.Context, namespace, pod, url string) (string, error) {
	path, err := c.PodNetns(ctx, namespace, pod)
	if err != nil {
		return "", err
	}
	ns, err := netns.Open(path)
	if err != nil {
		return "", err
	}
	defer ns.Close()
	tr := &http.Transport{DisableKeepAlives: true, DialContext: ns.DialContext}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return "", fmt.Errorf("GET %s in %s/%s: %w", url, namespace, pod, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s in %s/%s: %s: %s", url, namespace, pod, resp.Status, lastLines(string(body), 5))
	}
	return string(body), err
}

// RepoPath is a path inside the repository the cluster builds images from.
func (c *Cluster) RepoPath(rel string) string { return filepath.Join(c.cfg.RepoDir, rel) }

// WaitRedirected waits until namespace has n pods that belong in the mesh
// (any number but none when n is 0) and every one is annotated
// ambient.istio.io/redirection: enabled, as the CNI agent does once a pod's
// traffic goes through ztunnel. Pods labelled istio.io/dataplane-mode=none
// (waypoints, say) do not belong in the mesh and are not counted.
func (c *Cluster) WaitRedirected(ctx context.Context, namespace string, n int) error {
	return c.WaitFor(ctx, "pods of "+namespace+" annotated as redirected", func(ctx context.Context) (bool, error) {
		pods, err := c.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "istio.io/dataplane-mode!=none"})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.Annotations["ambient.istio.io/redirection"] != "enabled" {
				return false, nil
			}
		}
		return len(pods.Items) > 0 && (n == 0 || len(pods.Items) == n), nil
	})
}

// InstallMesh installs Weft's chart as release weft into namespace unless
// its ztunnel DaemonSet is already there, and waits until ztunnel and the
// CNI agent run on every node. The error carries helm's output.
func (c *Cluster) InstallMesh(ctx context.Context, namespace string) error {
	if _, err := c.client.AppsV1().DaemonSets(namespace).Get(ctx, "ztunnel", metav1.GetOptions{}); err != nil {
		if out, err := c.HelmInstall(ctx, "weft", c.RepoPath("charts/weft"), namespace, "--wait", "--timeout", "4m"); err != nil {
			return fmt.Errorf("helm install: %w\n%s", err, out)
		}
	}
	for _, ds := range []string{"ztunnel", "weft-cni-agent"} {
		if _, err := c.WaitDaemonSet(ctx, namespace, ds); err != nil {
			return err
		}
	}
	return nil
}

// AddDNSRecord makes the cluster DNS answer name (outside cluster.local)
// with addrs, as a resolver beyond the cluster would: for tests of names
// that only the upstream knows. Every other name outside the cluster stays
// NXDOMAIN. The answer's TTL is the cluster DNS's own (5 s).
func (c *Cluster) AddDNSRecord(name string, addrs ...netip.Addr) error {
	return c.dns.add(name, addrs)
}
