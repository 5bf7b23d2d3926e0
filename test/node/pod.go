package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/internal/netns"
)

// Restart back-off: a container that exits is restarted (per restartPolicy)
// after restartBase, doubling up to restartMax; a container that ran for
// restartReset starts over at restartBase.
const (
	restartBase  = time.Second
	restartMax   = 30 * time.Second
	restartReset = time.Minute
	// sandboxRetryMax caps the back-off between attempts to set up a pod's
	// network or volumes.
	sandboxRetryMax = 10 * time.Second
)

// podWorker owns one pod from the moment the runner sees it bound to its
// node until the pod is torn down. Only its run goroutine touches the pod's
// state; the informer hands it new pod objects through next, and container
// waiters and probers report through events.
type podWorker struct {
	r      *Runner
	log    *slog.Logger
	uid    types.UID
	exited chan struct{} // closed when run returns
	kick   chan struct{} // a new pod object or deletion is waiting
	events chan containerEvent

	mu   sync.Mutex // guards next and gone
	next *corev1.Pod
	gone bool

	// Owned by the run goroutine.
	pod          *corev1.Pod
	dir          string
	ns           *netns.NS // the pod's namespace (the node's for hostNetwork)
	ownNS        bool      // ns was made for this pod
	cniNetwork   []byte    // the network configuration ADD used
	ip           netip.Addr
	sandboxReady bool
	volumes      *volumeSet
	retryAt      time.Time // next attempt at network or volume setup
	retryDelay   time.Duration
	lastProblem  string
	inits        []*container
	containers   []*container
	startTime    metav1.Time
	reported     *corev1.PodStatus
	reportRetry  bool
	wake         time.Time
	warned       map[string]bool
}

// container is the state of one container of the pod.
type container struct {
	spec    corev1.Container
	init    bool
	sidecar bool // an init container with restartPolicy Always

	gen       int // starts so far; events carry it to drop stale ones
	proc      *os.Process
	running   bool
	startedAt time.Time
	restarts  int
	done      bool // an init container that exited 0 (or a started sidecar)
	term      *corev1.ContainerStateTerminated
	lastTerm  *corev1.ContainerStateTerminated
	waitWhy   string
	waitMsg   string
	nextStart time.Time
	backoff   time.Duration
	ready     bool
	started   bool // the startup probe passed (or there is none)
	stopProbe context.CancelFunc
}

type eventKind int

const (
	evExit eventKind = iota
	evReadiness
	evLiveness
	evStartup
)

// containerEvent reports a container's exit or a change in a probe's result.
type containerEvent struct {
	kind eventKind
	name string
	gen  int
	ok   bool
	code int
	sig  syscall.Signal
	at   time.Time
	msg  string
}

func newPodWorker(r *Runner, pod *corev1.Pod) *podWorker {
	w := &podWorker{
		r:         r,
		log:       r.log.With("pod", pod.Namespace+"/"+pod.Name),
		uid:       pod.UID,
		pod:       pod,
		exited:    make(chan struct{}),
		kick:      make(chan struct{}, 1),
		events:    make(chan containerEvent, 64),
		dir:       filepath.Join(r.cfg.PodsDir, string(pod.UID)),
		startTime: metav1.Now(),
		warned:    map[string]bool{},
	}
	for _, c := range pod.Spec.InitContainers {
		w.inits = append(w.inits, &container{spec: c, init: true,
			sidecar: c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways})
	}
	for _, c := range pod.Spec.Containers {
		w.containers = append(w.containers, &container{spec: c})
	}
	return w
}

// update hands the worker the latest pod object.
func (w *podWorker) update(pod *corev1.Pod) {
	w.mu.Lock()
	w.next = pod
	w.mu.Unlock()
	w.poke()
}

// deleted tells the worker the pod is gone from the API.
func (w *podWorker) deleted() {
	w.mu.Lock()
	w.gone = true
	w.mu.Unlock()
	w.poke()
}

func (w *podWorker) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *podWorker) take() (pod *corev1.Pod, gone bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	pod, w.next = w.next, nil
	return pod, w.gone
}

// run is the worker's goroutine body.
func (w *podWorker) run(ctx context.Context) {
	defer close(w.exited)
	defer w.teardown()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		pod, gone := w.take()
		if pod != nil {
			w.pod = pod
		}
		if gone {
			w.log.Info("pod deleted from the API; stopping it")
			w.stopAll(0)
			return
		}
		if w.pod.DeletionTimestamp != nil {
			w.terminate(ctx)
			return
		}
		w.sync(ctx)
		w.report(ctx)

		var wake <-chan time.Time
		if !w.wake.IsZero() {
			timer.Reset(max(time.Until(w.wake), time.Millisecond))
			wake = timer.C
		}
		select {
		case <-ctx.Done():
			w.stopAll(2 * time.Second)
			return
		case <-w.kick:
		case ev := <-w.events:
			w.handle(ev)
		case <-wake:
		}
		timer.Stop()
	}
}

func (w *podWorker) wakeAt(t time.Time) {
	if w.wake.IsZero() || t.Before(w.wake) {
		w.wake = t
	}
}

func (w *podWorker) problem(reason, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if msg != w.lastProblem {
		w.lastProblem = msg
		w.log.Warn("pod problem", "reason", reason, "msg", msg)
		w.r.recorder.Event(w.pod, corev1.EventTypeWarning, reason, msg)
	}
	w.retryDelay = min(max(2*w.retryDelay, 500*time.Millisecond), sandboxRetryMax)
	w.retryAt = time.Now().Add(w.retryDelay)
	w.wakeAt(w.retryAt)
}

// sync moves the pod one step closer to its spec: network, volumes, init
// containers in order, then containers; it never blocks on a container.
func (w *podWorker) sync(ctx context.Context) {
	w.wake = time.Time{}
	now := time.Now()
	if !w.sandboxReady || w.volumes == nil {
		if now.Before(w.retryAt) {
			w.wakeAt(w.retryAt)
			return
		}
	}
	if !w.sandboxReady {
		if err := w.setupSandbox(ctx); err != nil {
			w.problem("FailedCreatePodSandBox", "setting up the pod network: %v", err)
			return
		}
	}
	if w.volumes == nil {
		vs, err := w.prepareVolumes(ctx)
		if err != nil {
			w.problem("FailedMount", "preparing volumes: %v", err)
			return
		}
		w.volumes = vs
		w.retryDelay, w.lastProblem = 0, ""
	}
	if next := w.volumes.refresh(ctx, w); !next.IsZero() {
		w.wakeAt(next)
	}
	policy := w.pod.Spec.RestartPolicy
	for _, c := range w.inits {
		if c.done {
			if c.sidecar && !c.running && ctx.Err() == nil {
				w.maybeStart(ctx, c, now)
			}
			continue
		}
		if c.running {
			return
		}
		if c.term != nil && c.term.ExitCode == 0 {
			c.done = true
			continue
		}
		if c.term != nil && policy == corev1.RestartPolicyNever {
			return // the pod failed
		}
		w.maybeStart(ctx, c, now)
		if c.sidecar && c.running {
			c.done = true
			continue
		}
		return
	}
	for _, c := range w.containers {
		if c.running || (c.term != nil && !shouldRestart(policy, c.term.ExitCode)) {
			continue
		}
		w.maybeStart(ctx, c, now)
	}
}

func shouldRestart(policy corev1.RestartPolicy, code int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	default:
		return true
	}
}

func (w *podWorker) maybeStart(ctx context.Context, c *container, now time.Time) {
	if now.Before(c.nextStart) {
		w.wakeAt(c.nextStart)
		return
	}
	if err := w.start(ctx, c); err != nil {
		var se *startError
		if errors.As(err, &se) {
			c.waitWhy, c.waitMsg = se.reason, se.Error()
		} else {
			c.waitWhy, c.waitMsg = "CreateContainerError", err.Error()
		}
		w.r.recorder.Eventf(w.pod, corev1.EventTypeWarning, "Failed", "Error: %s: %v", c.waitWhy, err)
		w.log.Warn("container start failed", "container", c.spec.Name, "reason", c.waitWhy, "err", err)
		c.backoff = min(max(2*c.backoff, restartBase), restartMax)
		c.nextStart = now.Add(c.backoff)
		w.wakeAt(c.nextStart)
	}
}

// handle applies a container event.
func (w *podWorker) handle(ev containerEvent) {
	c := w.find(ev.name)
	if c == nil || ev.gen != c.gen {
		return
	}
	switch ev.kind {
	case evExit:
		if !c.running {
			return
		}
		c.running, c.ready, c.proc = false, false, nil
		if c.stopProbe != nil {
			c.stopProbe()
			c.stopProbe = nil
		}
		reason := "Completed"
		if ev.code != 0 {
			reason = "Error"
		}
		c.lastTerm = c.term
		c.term = &corev1.ContainerStateTerminated{
			ExitCode: int32(ev.code), Signal: int32(ev.sig), Reason: reason, Message: ev.msg,
			StartedAt: metav1.NewTime(c.startedAt), FinishedAt: metav1.NewTime(ev.at),
			ContainerID: containerID(w.uid, c),
		}
		w.log.Info("container exited", "container", c.spec.Name, "exit_code", ev.code, "signal", int(ev.sig))
		if ev.at.Sub(c.startedAt) > restartReset {
			c.backoff = 0
		}
		policy := w.pod.Spec.RestartPolicy
		willRestart := c.sidecar ||
			(!c.init && shouldRestart(policy, int32(ev.code))) ||
			(c.init && ev.code != 0 && policy != corev1.RestartPolicyNever)
		if willRestart {
			c.backoff = min(max(2*c.backoff, restartBase), restartMax)
			c.nextStart = ev.at.Add(c.backoff)
			if ev.code != 0 {
				w.r.recorder.Eventf(w.pod, corev1.EventTypeWarning, "BackOff", "Back-off %s restarting failed container %s", c.backoff, c.spec.Name)
			}
		}
	case evReadiness:
		c.ready = ev.ok
	case evStartup:
		c.started = ev.ok
		if !ev.ok {
			w.r.recorder.Eventf(w.pod, corev1.EventTypeWarning, "Unhealthy", "Startup probe failed: %s", ev.msg)
			w.kill(c, syscall.SIGKILL)
		}
	case evLiveness:
		if !ev.ok {
			w.r.recorder.Eventf(w.pod, corev1.EventTypeWarning, "Unhealthy", "Liveness probe failed: %s", ev.msg)
			w.r.recorder.Eventf(w.pod, corev1.EventTypeNormal, "Killing", "Container %s failed liveness probe, will be restarted", c.spec.Name)
			w.kill(c, syscall.SIGKILL)
		}
	}
}

func (w *podWorker) find(name string) *container {
	for _, c := range w.inits {
		if c.spec.Name == name {
			return c
		}
	}
	for _, c := range w.containers {
		if c.spec.Name == name {
			return c
		}
	}
	return nil
}

func (w *podWorker) all() []*container {
	return append(append([]*container(nil), w.inits...), w.containers...)
}

// kill signals a container's whole process group.
func (w *podWorker) kill(c *container, sig syscall.Signal) {
	if c.running && c.proc != nil {
		_ = syscall.Kill(-c.proc.Pid, sig)
	}
}

// stopAll sends SIGTERM to every running container, waits up to grace for
// them to exit, then kills what is left and waits for that.
func (w *podWorker) stopAll(grace time.Duration) {
	running := func() int {
		n := 0
		for _, c := range w.all() {
			if c.running {
				n++
			}
		}
		return n
	}
	if running() == 0 {
		return
	}
	sig := syscall.SIGTERM
	if grace <= 0 {
		sig = syscall.SIGKILL
	}
	for _, c := range w.all() {
		w.kill(c, sig)
	}
	deadline := time.NewTimer(max(grace, 0))
	defer deadline.Stop()
	hardDeadline := time.NewTimer(max(grace, 0) + 10*time.Second)
	defer hardDeadline.Stop()
	for running() > 0 {
		select {
		case ev := <-w.events:
			if ev.kind == evExit {
				w.handle(ev)
			}
		case <-deadline.C:
			for _, c := range w.all() {
				w.kill(c, syscall.SIGKILL)
			}
		case <-hardDeadline.C:
			w.log.Error("containers did not exit after SIGKILL", "running", running())
			return
		}
	}
}

// terminate stops a pod marked for deletion within its grace period, tears
// it down and confirms the deletion to the API server.
func (w *podWorker) terminate(ctx context.Context) {
	grace := w.r.cfg.MaxGrace
	if g := w.pod.DeletionGracePeriodSeconds; g != nil && time.Duration(*g)*time.Second < grace {
		grace = time.Duration(*g) * time.Second
	}
	for _, c := range w.all() {
		if c.running {
			w.r.recorder.Eventf(w.pod, corev1.EventTypeNormal, "Killing", "Stopping container %s", c.spec.Name)
		}
	}
	w.stopAll(grace)
	w.teardown()
	if ctx.Err() != nil {
		return
	}
	zero := int64(0)
	uid := w.uid
	err := retry(ctx, func() error {
		err := w.r.cfg.Client.CoreV1().Pods(w.pod.Namespace).Delete(ctx, w.pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	})
	if err != nil && ctx.Err() == nil {
		w.log.Error("confirming pod deletion failed", "err", err)
	}
	w.log.Info("pod deleted")
}

// teardown stops what is left of the pod and removes its network and
// files. It is safe to call twice.
func (w *podWorker) teardown() {
	w.stopAll(0)
	for _, c := range w.all() {
		if c.stopProbe != nil {
			c.stopProbe()
			c.stopProbe = nil
		}
	}
	if w.ownNS {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := w.r.cni.del(ctx, w.sandbox(), w.cniNetwork); err != nil {
			w.log.Warn("CNI DEL failed", "err", err)
			removeCache(w.r.cfg.CNICacheDir, w.sandbox())
		}
		cancel()
		w.ns.Close()
		if err := netns.Delete(w.r.netnsName(w.uid)); err != nil {
			w.log.Warn("deleting pod netns failed", "err", err)
		}
		w.ownNS = false
	}
	w.ns, w.sandboxReady = nil, false
	if w.dir != "" {
		if err := os.RemoveAll(w.dir); err != nil {
			w.log.Warn("removing pod dir failed", "err", err)
		}
	}
}

// setupSandbox makes the pod's network: a new namespace wired by the CNI
// chain, or the node's namespace for hostNetwork pods.
func (w *podWorker) setupSandbox(ctx context.Context) error {
	if err := os.MkdirAll(w.dir, 0o750); err != nil {
		return err
	}
	if w.pod.Spec.HostNetwork {
		w.ns, w.ip, w.sandboxReady = w.r.cfg.NS, w.r.cfg.Address, true
		return nil
	}
	name := w.r.netnsName(w.uid)
	_ = netns.Delete(name) // a previous failed attempt
	ns, err := netns.Create(name)
	if err != nil {
		return err
	}
	w.ns, w.ownNS = ns, true
	ip, conf, err := w.r.cni.add(ctx, w.sandbox())
	if err != nil {
		// Roll back like a runtime does: DEL, then drop the namespace.
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if derr := w.r.cni.del(dctx, w.sandbox(), conf); derr != nil {
			w.log.Warn("CNI DEL after failed ADD failed", "err", derr)
		}
		cancel()
		ns.Close()
		_ = netns.Delete(name)
		w.ns, w.ownNS = nil, false
		return err
	}
	w.ip, w.cniNetwork, w.sandboxReady = ip, conf, true
	w.log.Info("pod network ready", "ip", ip, "netns", ns.Path())
	return nil
}

func (w *podWorker) sandbox() sandbox {
	return sandbox{
		id: sandboxID(w.uid), netns: w.r.NetnsPath(w.uid),
		namespace: w.pod.Namespace, name: w.pod.Name, uid: w.uid,
	}
}

// report writes the pod's status when it changed.
func (w *podWorker) report(ctx context.Context) {
	st := w.status()
	if w.reported != nil && !w.reportRetry && apiequality.Semantic.DeepEqual(*w.reported, st) {
		return
	}
	b, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		w.log.Error("encoding pod status failed", "err", err)
		return
	}
	_, err = w.r.cfg.Client.CoreV1().Pods(w.pod.Namespace).Patch(ctx, w.pod.Name, types.MergePatchType, b, metav1.PatchOptions{}, "status")
	if err != nil {
		if ctx.Err() == nil && !apierrors.IsNotFound(err) {
			w.log.Warn("updating pod status failed", "err", err)
			w.reportRetry = true
			w.wakeAt(time.Now().Add(time.Second))
		}
		return
	}
	w.reported, w.reportRetry = &st, false
}
