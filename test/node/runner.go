package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/netns"
)

// Config configures a Runner.
type Config struct {
	// Name is the Node's name. Required.
	Name string
	// NS is the node's network namespace: hostNetwork pods and the CNI
	// plugins run in it and probes are sent from it. Required.
	NS *netns.NS
	// Address is the node's InternalIP. Required.
	Address netip.Addr
	// PodCIDR is the node's pod range, reported as spec.podCIDR. Required.
	PodCIDR netip.Prefix
	// Root is the node's file-system root: a hostPath volume's path maps
	// under it, except /proc, /sys, /dev and /run/netns (/var/run/netns),
	// which are the machine's. Required.
	Root string
	// ImageDir holds the binaries images map to (weft/<name> runs
	// ImageDir/<name>). Required.
	ImageDir string
	// NetnsPrefix names pod namespaces NetnsPrefix + pod UID. Required; make
	// it unique per cluster.
	NetnsPrefix string
	// Client talks to the API server. Required.
	Client kubernetes.Interface

	// CNIConfDir is read for the pod network at each pod start.
	// Default Root/etc/cni/net.d.
	CNIConfDir string
	// CNIBinDir holds the CNI plugins. Default Root/opt/cni/bin.
	CNIBinDir string
	// CNICacheDir is libcni's result cache. Default Root/var/lib/cni.
	CNICacheDir string
	// PodsDir holds a directory per pod (volumes, init specs).
	// Default Root/var/lib/kubelet/pods.
	PodsDir string
	// LogDir holds a directory per pod with a log file per container.
	// Default Root/var/log/pods.
	LogDir string
	// ServiceHost and ServicePort are the kubernetes Service's address,
	// given to containers as KUBERNETES_SERVICE_HOST and _PORT.
	// Default 10.96.0.1 and 443.
	ServiceHost string
	ServicePort int
	// ClusterDNS is the nameserver of pods with dnsPolicy ClusterFirst (the
	// kube-dns Service). Unset: pods get no /etc/resolv.conf of their own.
	ClusterDNS netip.Addr
	// ClusterDomain is the cluster's DNS domain. Default cluster.local.
	ClusterDomain string
	// Heartbeat is how often the Ready condition is renewed. Default 10s.
	Heartbeat time.Duration
	// MaxGrace caps a deleted pod's termination grace period. Default 10s.
	MaxGrace time.Duration
	// Labels are added to the Node's labels.
	Labels map[string]string
	// Version is reported as the node's kubelet version. Default "v0.0.0-weft".
	Version string
	// OnStart, if set, is called with the PID of every container process
	// started (a harness uses it to check that teardown leaves none).
	OnStart func(pid int)
}

func (c *Config) setDefaults() {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.CNIConfDir, filepath.Join(c.Root, "etc/cni/net.d"))
	def(&c.CNIBinDir, filepath.Join(c.Root, "opt/cni/bin"))
	def(&c.CNICacheDir, filepath.Join(c.Root, "var/lib/cni"))
	def(&c.PodsDir, filepath.Join(c.Root, "var/lib/kubelet/pods"))
	def(&c.LogDir, filepath.Join(c.Root, "var/log/pods"))
	def(&c.ServiceHost, "10.96.0.1")
	def(&c.Version, "v0.0.0-weft")
	def(&c.ClusterDomain, "cluster.local")
	if c.ServicePort == 0 {
		c.ServicePort = 443
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 10 * time.Second
	}
	if c.MaxGrace == 0 {
		c.MaxGrace = 10 * time.Second
	}
}

// Validate reports a missing or unusable setting.
func (c *Config) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("node: Name is required")
	case c.NS == nil:
		return errors.New("node: NS is required")
	case !c.Address.IsValid():
		return errors.New("node: Address is required")
	case !c.PodCIDR.IsValid():
		return errors.New("node: PodCIDR is required")
	case c.Root == "" || !filepath.IsAbs(c.Root):
		return errors.New("node: Root must be an absolute path")
	case c.ImageDir == "":
		return errors.New("node: ImageDir is required")
	case c.NetnsPrefix == "":
		return errors.New("node: NetnsPrefix is required")
	case c.Client == nil:
		return errors.New("node: Client is required")
	}
	return nil
}

// Runner runs the pods bound to one node. Build it with New, start it with Run.
type Runner struct {
	cfg      Config
	log      *slog.Logger
	cni      *cniNet
	recorder record.EventRecorder

	hostMu    sync.Mutex        // guards hostPaths
	hostPaths map[string]string // machine path -> node path, of hostPath volumes

	mu      sync.Mutex // guards the fields below
	workers map[types.UID]*podWorker
	done    map[types.UID]time.Time // pods already torn down, so late events are ignored
	running bool
}

// New checks cfg, applies the defaults and returns a runner. It starts nothing.
func New(cfg Config, log *slog.Logger) (*Runner, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Runner{
		cfg:       cfg,
		log:       log.With("node", cfg.Name),
		workers:   map[types.UID]*podWorker{},
		done:      map[types.UID]time.Time{},
		hostPaths: map[string]string{},
	}
	r.cni = newCNINet(cfg.NS, cfg.CNIConfDir, cfg.CNIBinDir, cfg.CNICacheDir, r.log)
	r.cni.exec.view = r.hostView
	r.cni.exec.scratch = filepath.Join(cfg.Root, "var/lib/weft-node/cni-exec")
	return r, nil
}

// addHostPath records that a hostPath volume made the machine path p the
// node path np.
func (r *Runner) addHostPath(p, np string) {
	r.hostMu.Lock()
	r.hostPaths[p] = np
	r.hostMu.Unlock()
}

// hostView is how CNI plugins see the node's file system: the machine's,
// with every directory a hostPath volume mapped into the node's root
// mounted back at its path, and the node's CNI directories at
// /etc/cni/net.d and /opt/cni/bin. A plugin reads what the node's agents
// wrote through their hostPath volumes (say a kubeconfig or a socket) at
// the paths they wrote it to. It is empty while no hostPath volume is in
// use, and plugins then run as they are.
func (r *Runner) hostView() []initMount {
	r.hostMu.Lock()
	defer r.hostMu.Unlock()
	if len(r.hostPaths) == 0 {
		return nil
	}
	view := map[string]string{"/etc/cni/net.d": r.cfg.CNIConfDir, "/opt/cni/bin": r.cfg.CNIBinDir}
	for p, np := range r.hostPaths {
		view[p] = np
	}
	mounts := make([]initMount, 0, len(view))
	for p, np := range view {
		mounts = append(mounts, initMount{Source: np, Target: p})
	}
	return mounts
}

// NetnsPath returns the network namespace file of a pod with this UID,
// whether or not it exists. hostNetwork pods use the node's namespace.
func (r *Runner) NetnsPath(uid types.UID) string { return netns.Path(r.netnsName(uid)) }

func (r *Runner) netnsName(uid types.UID) string { return r.cfg.NetnsPrefix + string(uid) }

// LogPath returns the log file of a container of a pod.
func (r *Runner) LogPath(namespace, name string, uid types.UID, container string) string {
	return filepath.Join(r.cfg.LogDir, fmt.Sprintf("%s_%s_%s", namespace, name, uid), container+".log")
}

// Run registers the node, runs the pods bound to it until ctx ends, then
// stops every container, tears down every pod network and returns once all
// of that is done.
func (r *Runner) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return errors.New("node: Run called twice")
	}
	r.running = true
	r.mu.Unlock()

	for _, d := range []string{r.cfg.CNIConfDir, r.cfg.CNIBinDir, r.cfg.CNICacheDir, r.cfg.PodsDir, r.cfg.LogDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("node %s: %w", r.cfg.Name, err)
		}
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.cfg.Client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	r.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "weft-node", Host: r.cfg.Name})

	if err := r.register(ctx); err != nil {
		return err
	}

	factory := informers.NewSharedInformerFactoryWithOptions(r.cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", r.cfg.Name).String()
		}))
	podInformer := factory.Core().V1().Pods().Informer()
	podCtx, stopPods := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPods()
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.dispatch(podCtx, obj) },
		UpdateFunc: func(_, obj any) { r.dispatch(podCtx, obj) },
		DeleteFunc: func(obj any) { r.dispatchDelete(obj) },
	}); err != nil {
		return fmt.Errorf("node %s: watching pods: %w", r.cfg.Name, err)
	}
	factory.Start(ctx.Done())
	r.heartbeat(ctx)

	// ctx is done: stop watching, then stop every pod.
	factory.Shutdown()
	stopPods()
	r.mu.Lock()
	workers := make([]*podWorker, 0, len(r.workers))
	for _, w := range r.workers {
		workers = append(workers, w)
	}
	r.mu.Unlock()
	for _, w := range workers {
		<-w.exited
	}
	return nil
}

// dispatch hands the latest state of a pod to its worker, starting one for
// a pod it has not seen.
func (r *Runner) dispatch(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Err() != nil {
		return // stopping; Run no longer waits for new workers
	}
	if _, finished := r.done[pod.UID]; finished {
		return
	}
	w := r.workers[pod.UID]
	if w == nil {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			if pod.DeletionTimestamp == nil {
				return // finished before this runner started
			}
		}
		w = newPodWorker(r, pod)
		r.workers[pod.UID] = w
		go func() {
			w.run(ctx)
			r.mu.Lock()
			delete(r.workers, pod.UID)
			r.done[pod.UID] = time.Now()
			for uid, t := range r.done {
				if time.Since(t) > 10*time.Minute {
					delete(r.done, uid)
				}
			}
			r.mu.Unlock()
		}()
	}
	w.update(pod)
}

func (r *Runner) dispatchDelete(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	w := r.workers[pod.UID]
	r.mu.Unlock()
	if w != nil {
		w.deleted()
	}
}

// register creates or updates the Node object and reports it Ready.
func (r *Runner) register(ctx context.Context) error {
	labels := map[string]string{
		"kubernetes.io/hostname": r.cfg.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     runtime.GOARCH,
	}
	for k, v := range r.cfg.Labels {
		labels[k] = v
	}
	want := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: r.cfg.Name, Labels: labels},
		Spec:       corev1.NodeSpec{PodCIDR: r.cfg.PodCIDR.String(), PodCIDRs: []string{r.cfg.PodCIDR.String()}},
	}
	nodes := r.cfg.Client.CoreV1().Nodes()
	var node *corev1.Node
	err := retry(ctx, func() error {
		n, err := nodes.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			n, err = nodes.Get(ctx, r.cfg.Name, metav1.GetOptions{})
			if err == nil {
				n.Labels, n.Spec.PodCIDR, n.Spec.PodCIDRs = labels, want.Spec.PodCIDR, want.Spec.PodCIDRs
				n, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
			}
		}
		node = n
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s: registering: %w", r.cfg.Name, err)
	}
	node.Status = r.nodeStatus(nil)
	if err := retry(ctx, func() error {
		_, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if n, gerr := nodes.Get(ctx, r.cfg.Name, metav1.GetOptions{}); gerr == nil {
				n.Status = node.Status
				node = n
			}
		}
		return err
	}); err != nil {
		return fmt.Errorf("node %s: reporting status: %w", r.cfg.Name, err)
	}
	if err := retry(ctx, func() error { return r.untaint(ctx) }); err != nil {
		return fmt.Errorf("node %s: removing condition taints: %w", r.cfg.Name, err)
	}
	r.log.Info("node registered", "address", r.cfg.Address, "pod_cidr", r.cfg.PodCIDR)
	return nil
}

// conditionTaints are the taints the API server puts on a new Node
// (TaintNodesByCondition) and the node lifecycle controller removes once the
// node reports Ready. The local cluster runs without that controller (no
// kubelet leases), so the runner removes them itself.
var conditionTaints = map[string]bool{
	"node.kubernetes.io/not-ready":           true,
	"node.kubernetes.io/unreachable":         true,
	"node.kubernetes.io/memory-pressure":     true,
	"node.kubernetes.io/disk-pressure":       true,
	"node.kubernetes.io/pid-pressure":        true,
	"node.kubernetes.io/network-unavailable": true,
}

// untaint removes condition taints from the Node.
func (r *Runner) untaint(ctx context.Context) error {
	nodes := r.cfg.Client.CoreV1().Nodes()
	n, err := nodes.Get(ctx, r.cfg.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	kept := n.Spec.Taints[:0]
	for _, t := range n.Spec.Taints {
		if !conditionTaints[t.Key] {
			kept = append(kept, t)
		}
	}
	if len(kept) == len(n.Spec.Taints) {
		return nil
	}
	n.Spec.Taints = kept
	_, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
	return err
}

func (r *Runner) nodeStatus(prev []corev1.NodeCondition) corev1.NodeStatus {
	now := metav1.Now()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("8"),
		corev1.ResourceMemory:           resource.MustParse("16Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		c := corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
		for _, p := range prev {
			if p.Type == t && p.Status == s {
				c.LastTransitionTime = p.LastTransitionTime
			}
		}
		return c
	}
	kernel := ""
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		kernel = unix.ByteSliceToString(uts.Release[:])
	}
	return corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "weft node runner"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "weft node runner"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "weft node runner"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "weft node runner is posting ready status"),
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: r.cfg.Address.String()},
			{Type: corev1.NodeHostName, Address: r.cfg.Name},
		},
		NodeInfo: corev1.NodeSystemInfo{
			KernelVersion:           kernel,
			OSImage:                 "weft local cluster",
			ContainerRuntimeVersion: "weft-node://" + r.cfg.Version,
			KubeletVersion:          r.cfg.Version,
			OperatingSystem:         "linux",
			Architecture:            runtime.GOARCH,
		},
	}
}

// heartbeat renews the node's conditions every Heartbeat until ctx ends.
func (r *Runner) heartbeat(ctx context.Context) {
	t := time.NewTicker(r.cfg.Heartbeat)
	defer t.Stop()
	nodes := r.cfg.Client.CoreV1().Nodes()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := nodes.Get(ctx, r.cfg.Name, metav1.GetOptions{})
		if err == nil {
			n.Status = r.nodeStatus(n.Status.Conditions)
			_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		}
		if err == nil {
			err = r.untaint(ctx)
		}
		if err != nil && ctx.Err() == nil {
			r.log.Warn("node heartbeat failed", "err", err)
		}
	}
}

// retry calls fn until it succeeds, ctx ends or a minute passes.
func retry(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(time.Minute)
	delay := 100 * time.Millisecond
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}
