package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// startError is a container start failure with the waiting reason the
// container's status shows (ErrImagePull, CreateContainerConfigError, ...).
type startError struct {
	reason string
	err    error
}

func (e *startError) Error() string { return e.err.Error() }
func (e *startError) Unwrap() error { return e.err }

// imageRE matches [registry/]weft/<name>[:tag][@digest].
var imageRE = regexp.MustCompile(`^(?:[^/]+/)*weft/([a-z0-9][a-z0-9._-]*)(?::[\w][\w.-]*)?(?:@sha256:[0-9a-f]{64})?$`)

// binaryFor maps an image to the binary that runs it: weft/<name>:<tag>
// (with any registry in front) runs dir/<name>.
func binaryFor(dir, image string) (string, error) {
	m := imageRE.FindStringSubmatch(image)
	if m == nil {
		return "", fmt.Errorf("image %q is not a weft/<name> image; the local cluster runs only images built from this repository", image)
	}
	bin := filepath.Join(dir, m[1])
	st, err := os.Stat(bin)
	if err != nil {
		return "", fmt.Errorf("image %q runs %s, which does not exist (build it: go build -o %s/ ./<part>/cmd/%s)", image, bin, dir, m[1])
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("image %q runs %s, which is not an executable file", image, bin)
	}
	return bin, nil
}

func sandboxID(uid types.UID) string { return strings.ReplaceAll(string(uid), "-", "") }

func containerID(uid types.UID, c *container) string {
	id := sandboxID(uid)
	if len(id) > 12 {
		id = id[:12]
	}
	return fmt.Sprintf("weft://%s-%s-%d", id, c.spec.Name, c.gen)
}

// commandLine is the container's argv: command[0] stands for the image's
// entrypoint (the binary runs with it as argv[0]), the rest of command and
// then args follow, with $(VAR) references expanded.
func commandLine(bin string, c *corev1.Container, env map[string]string) []string {
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	var argv []string
	if len(c.Command) > 0 {
		for _, a := range c.Command {
			argv = append(argv, expand(a, lookup))
		}
	} else {
		argv = []string{bin}
	}
	for _, a := range c.Args {
		argv = append(argv, expand(a, lookup))
	}
	return argv
}

// start launches a container: the pod init re-executed inside the pod's
// network namespace with new mount and UTS namespaces, which mounts the
// volumes and execs the container's binary.
func (w *podWorker) start(ctx context.Context, c *container) error {
	bin, err := binaryFor(w.r.cfg.ImageDir, c.spec.Image)
	if err != nil {
		return &startError{"ErrImagePull", err}
	}
	envList, envMap, err := w.env(ctx, &c.spec)
	if err != nil {
		return &startError{"CreateContainerConfigError", err}
	}
	mounts, keepNetns, err := w.mounts(&c.spec, envMap)
	if err != nil {
		return &startError{"CreateContainerConfigError", err}
	}
	gen := c.gen + 1
	stage := filepath.Join(w.dir, "stage", fmt.Sprintf("%s-%d", c.spec.Name, gen))
	if err := os.MkdirAll(stage, 0o700); err != nil {
		return err
	}
	hostname := w.pod.Name
	if w.pod.Spec.Hostname != "" {
		hostname = w.pod.Spec.Hostname
	}
	if w.pod.Spec.HostNetwork {
		hostname = w.r.cfg.Name
	}
	if len(hostname) > 63 {
		hostname = hostname[:63]
	}
	spec := initSpec{
		Path: bin, Argv: commandLine(bin, &c.spec, envMap), Env: envList, Dir: c.spec.WorkingDir,
		Hostname: hostname, Mounts: mounts, Stage: stage, KeepNetns: keepNetns,
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	specPath := filepath.Join(w.dir, fmt.Sprintf("init-%s.json", c.spec.Name))
	if err := writeFile(w.dir, filepath.Base(specPath), b, 0o600); err != nil {
		return err
	}
	logPath := w.r.LogPath(w.pod.Namespace, w.pod.Name, w.uid, c.spec.Name)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := &exec.Cmd{
		Path:   "/proc/self/exe",
		Args:   []string{"weft-pod-init", w.pod.Namespace + "/" + w.pod.Name + "/" + c.spec.Name},
		Env:    []string{initEnv + "=" + specPath},
		Stdout: logf,
		Stderr: logf,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
			Setpgid:    true,
			// Dies with the runner's process (the forking thread is a
			// pooled runtime thread that lives as long as the process).
			Pdeathsig: syscall.SIGKILL,
		},
	}
	if err := w.ns.Do(cmd.Start); err != nil {
		return fmt.Errorf("starting container %s: %w", c.spec.Name, err)
	}
	if w.r.cfg.OnStart != nil {
		w.r.cfg.OnStart(cmd.Process.Pid)
	}
	c.gen = gen
	c.proc, c.running, c.startedAt = cmd.Process, true, time.Now()
	c.ready, c.started = false, c.spec.StartupProbe == nil
	c.waitWhy, c.waitMsg = "", ""
	if c.term != nil {
		c.restarts++
	}
	w.log.Info("container started", "container", c.spec.Name, "pid", cmd.Process.Pid, "restarts", c.restarts)
	w.r.recorder.Eventf(w.pod, corev1.EventTypeNormal, "Started", "Started container %s", c.spec.Name)
	go w.wait(cmd, c.spec.Name, gen)
	w.startProbes(ctx, c)
	return nil
}

// wait reports the container's exit; it runs on its own goroutine.
func (w *podWorker) wait(cmd *exec.Cmd, name string, gen int) {
	err := cmd.Wait()
	ev := containerEvent{kind: evExit, name: name, gen: gen, at: time.Now()}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Signaled():
			ev.sig = ws.Signal()
			ev.code = 128 + int(ws.Signal())
		default:
			ev.code = ws.ExitStatus()
		}
	} else if err != nil {
		ev.code, ev.msg = 1, err.Error()
	}
	if ev.code == 127 && ev.msg == "" {
		ev.msg = "the pod init failed; see the container log"
	}
	w.events <- ev
}

// mounts resolves the container's volumeMounts to host paths.
func (w *podWorker) mounts(c *corev1.Container, env map[string]string) ([]initMount, bool, error) {
	var out []initMount
	keepNetns := false
	for _, vm := range c.VolumeMounts {
		v, ok := w.volumes.vols[vm.Name]
		if !ok {
			return nil, false, fmt.Errorf("volumeMount %q: no volume of that name in the pod", vm.Name)
		}
		src := v.path
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			sub = expand(vm.SubPathExpr, func(k string) (string, bool) { s, ok := env[k]; return s, ok })
		}
		if sub != "" {
			if filepath.IsAbs(sub) || strings.HasPrefix(filepath.Clean(sub), "..") {
				return nil, false, fmt.Errorf("volumeMount %q: subPath %q must be relative and stay inside the volume", vm.Name, sub)
			}
			src = filepath.Join(src, sub)
			if _, err := os.Stat(src); errors.Is(err, os.ErrNotExist) && !v.readOnly {
				if err := os.MkdirAll(src, 0o755); err != nil {
					return nil, false, err
				}
			}
		}
		if !filepath.IsAbs(vm.MountPath) {
			return nil, false, fmt.Errorf("volumeMount %q: mountPath %q must be absolute", vm.Name, vm.MountPath)
		}
		out = append(out, initMount{Source: src, Target: vm.MountPath, ReadOnly: vm.ReadOnly || v.readOnly})
		keepNetns = keepNetns || v.netns
	}
	for _, n := range w.volumes.names {
		taken := false
		for _, m := range out {
			taken = taken || filepath.Clean(m.Target) == n.Target
		}
		if !taken {
			out = append(out, n)
		}
	}
	return out, keepNetns, nil
}
