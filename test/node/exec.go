package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"

	corev1 "k8s.io/api/core/v1"

	"github.com/weftmesh/weft/internal/netns"
)

var execSeq atomic.Uint64

// Exec runs argv in a running container of a pod on this node, the way
// `kubectl exec` does: in the pod's network namespace (the node's for
// hostNetwork pods), with the container's environment, volumes, /etc/hosts
// and /etc/resolv.conf in a mount namespace of its own, and the pod's host
// name. argv[0] is a path or a name looked up in the container's PATH; it is
// a file of the machine (images are binaries of the machine). container ""
// is the pod's first container. It returns when the command exits.
func (r *Runner) Exec(ctx context.Context, pod *corev1.Pod, container string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(argv) == 0 {
		return errors.New("exec: no command")
	}
	if container == "" && len(pod.Spec.Containers) > 0 {
		container = pod.Spec.Containers[0].Name
	}
	dir := filepath.Join(r.cfg.PodsDir, string(pod.UID))
	b, err := os.ReadFile(filepath.Join(dir, "init-"+container+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("exec: container %s of pod %s/%s has not started on %s", container, pod.Namespace, pod.Name, r.cfg.Name)
	}
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	var spec initSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("exec: decoding the container's spec: %w", err)
	}
	n := execSeq.Add(1)
	spec.Path, spec.Argv = argv[0], argv
	spec.Stage = filepath.Join(dir, "stage", fmt.Sprintf("exec-%d", n))
	if err := os.MkdirAll(spec.Stage, 0o700); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	defer os.RemoveAll(spec.Stage)
	specPath := filepath.Join(dir, fmt.Sprintf("exec-%d.json", n))
	if b, err = json.Marshal(spec); err == nil {
		err = os.WriteFile(specPath, b, 0o600)
	}
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	defer os.Remove(specPath)

	ns := r.cfg.NS
	if !pod.Spec.HostNetwork {
		if ns, err = netns.Open(r.NetnsPath(pod.UID)); err != nil {
			return fmt.Errorf("exec: %w", err)
		}
		defer ns.Close()
	}
	cmd := exec.CommandContext(ctx, "/proc/self/exe")
	cmd.Args = []string{"weft-pod-exec", pod.Namespace + "/" + pod.Name + "/" + container}
	cmd.Env = []string{initEnv + "=" + specPath}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := ns.Do(cmd.Start); err != nil {
		return fmt.Errorf("exec in %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if r.cfg.OnStart != nil {
		r.cfg.OnStart(cmd.Process.Pid)
	}
	return cmd.Wait()
}
