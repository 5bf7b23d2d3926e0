package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"istio.io/api/annotation"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/cni/enablement"
	"github.com/weftmesh/weft/cni/event"
	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/kubequeue"
	"github.com/weftmesh/weft/internal/netns"
)

// controller keeps the mesh in line with the API: it watches this node's
// pods and all namespaces, enrolls running pods that become ambient,
// un-enrolls pods that stop being ambient or go away, re-checks rules, and
// handles the plugin's events for new pods.
type controller struct {
	cfg       *Config
	log       *slog.Logger
	kube      kubernetes.Interface
	pods      corelisters.PodLister
	podsIdx   cache.Indexer
	nss       corelisters.NamespaceLister
	mesh      *mesh
	selectors []enablement.Selector
	hostID    uint64
	node      *netns.NS                // the node's netns; nil: the agent's own
	queue     *kubequeue.Queue[string] // of "<ns>/<name>"; its workers call reconcile
	synced    chan struct{}            // closed after the initial sync
	syncOnce  sync.Once

	// arrivals wakes the CNI events waiting for their pod to reach the
	// cache, by "<ns>/<name>" (podForEvent).
	arrivalsMu sync.Mutex
	arrivals   map[string][]chan struct{}
}

func (c *controller) key(obj any) (string, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return "", false
	}
	return pod.Namespace + "/" + pod.Name, true
}

// handlers are the informers' event handlers.
func (c *controller) podHandler() cache.ResourceEventHandler {
	enqueue := func(obj any) {
		if k, ok := c.key(obj); ok {
			c.queue.Add(k)
		}
	}
	arrived := func(obj any) {
		enqueue(obj)
		if k, ok := c.key(obj); ok {
			c.arrived(k)
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: arrived, UpdateFunc: func(_, obj any) { arrived(obj) }, DeleteFunc: enqueue}
}

// awaitArrival returns a channel closed when the pod key next reaches the
// cache (added or updated), and a function that stops waiting.
func (c *controller) awaitArrival(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	c.arrivalsMu.Lock()
	if c.arrivals == nil {
		c.arrivals = map[string][]chan struct{}{}
	}
	c.arrivals[key] = append(c.arrivals[key], ch)
	c.arrivalsMu.Unlock()
	return ch, func() {
		c.arrivalsMu.Lock()
		defer c.arrivalsMu.Unlock()
		waiting := c.arrivals[key]
		for i, w := range waiting {
			if w == ch {
				waiting = append(waiting[:i], waiting[i+1:]...)
				break
			}
		}
		if len(waiting) == 0 {
			delete(c.arrivals, key)
		} else {
			c.arrivals[key] = waiting
		}
	}
}

// arrived wakes those waiting for the pod key.
func (c *controller) arrived(key string) {
	c.arrivalsMu.Lock()
	waiting := c.arrivals[key]
	delete(c.arrivals, key)
	c.arrivalsMu.Unlock()
	for _, ch := range waiting {
		close(ch)
	}
}

func (c *controller) namespaceHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{UpdateFunc: func(oldObj, newObj any) {
		o, ok1 := oldObj.(*corev1.Namespace)
		n, ok2 := newObj.(*corev1.Namespace)
		if !ok1 || !ok2 || labels.Equals(o.Labels, n.Labels) {
			return
		}
		c.enqueueNamespace(n.Name)
	}}
}

func (c *controller) enqueueNamespace(ns string) {
	objs, err := c.podsIdx.ByIndex(cache.NamespaceIndex, ns)
	if err != nil {
		c.log.Error("listing a namespace's pods failed", "namespace", ns, "error", err)
		return
	}
	for _, o := range objs {
		if k, ok := c.key(o); ok {
			c.queue.Add(k)
		}
	}
}

func (c *controller) enqueueAll() {
	for _, o := range c.podsIdx.List() {
		if k, ok := c.key(o); ok {
			c.queue.Add(k)
		}
	}
}

// wanted reports whether pod should be in the mesh now.
func (c *controller) wanted(pod *corev1.Pod, nsLabels map[string]string) bool {
	if slices.Contains(c.cfg.ExcludedNamespaces, pod.Namespace) || pod.Spec.NodeName != c.cfg.NodeName || terminal(pod) {
		return false
	}
	return enablement.Enrolled(c.selectors, enablement.Pod{Labels: pod.Labels, Annotations: pod.Annotations, HostNetwork: pod.Spec.HostNetwork}, nsLabels)
}

func terminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// namespaceLabels reads a namespace's labels from the cache, else the API.
func (c *controller) namespaceLabels(ctx context.Context, name string) (map[string]string, error) {
	ns, err := c.nss.Get(name)
	if apierrors.IsNotFound(err) {
		ns, err = c.kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("getting namespace %s: %w", name, err)
	}
	return ns.Labels, nil
}

// probeSets lists and trims the node's probe addresses.
type probeSets interface {
	probeIPs() (map[netip.Addr]string, error)
	removeProbeIPs([]netip.Addr) error
}

// initialSync adopts the pods enrolled before a restart, drops stale probe
// addresses and opens the gate for ztunnel snapshots.
func (c *controller) initialSync(probes probeSets) {
	pods, err := c.pods.List(labels.Everything())
	if err != nil {
		c.log.Error("listing pods failed", "error", err)
	}
	for _, pod := range pods {
		if pod.Annotations[annotation.AmbientRedirection.Name] != apinames.RedirectionEnabled || terminal(pod) || pod.Spec.NodeName != c.cfg.NodeName {
			continue
		}
		ns, err := findNetns(c.cfg.NetnsDir, podIPs(pod), c.hostID, c.node)
		if err != nil {
			ns = nil
		}
		if err := c.mesh.Adopt(pod, ns); err != nil {
			c.log.Error("adopting an enrolled pod failed", "pod", pod.Namespace+"/"+pod.Name, "error", err)
		}
	}
	if probes != nil {
		if ips, err := probes.probeIPs(); err != nil {
			c.log.Warn("listing probe addresses failed", "error", err)
		} else {
			var stale []netip.Addr
			for ip, uid := range ips {
				if c.mesh.get(types.UID(uid)) == nil {
					stale = append(stale, ip)
				}
			}
			if len(stale) > 0 {
				if err := probes.removeProbeIPs(stale); err != nil {
					c.log.Warn("removing stale probe addresses failed", "error", err)
				}
			}
		}
	}
	c.syncOnce.Do(func() { close(c.synced) })
	c.log.Info("initial sync done", "adopted_pods", len(c.mesh.uids()))
	c.enqueueAll()
}

// reconcile brings one pod to its wanted state.
func (c *controller) reconcile(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := c.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		var errs []error
		for _, uid := range c.mesh.byName(ns, name) {
			errs = append(errs, c.mesh.Unenroll(ctx, uid, false))
		}
		return errors.Join(errs...)
	}
	if err != nil {
		return err
	}
	for _, uid := range c.mesh.byName(ns, name) {
		if uid != pod.UID {
			if err := c.mesh.Unenroll(ctx, uid, false); err != nil {
				return err
			}
		}
	}
	nsLabels, err := c.namespaceLabels(ctx, ns)
	if err != nil {
		return err
	}
	st := c.mesh.get(pod.UID)
	if !c.wanted(pod, nsLabels) {
		if st != nil {
			return c.mesh.Unenroll(ctx, pod.UID, !terminal(pod))
		}
		if _, ok := pod.Annotations[annotation.AmbientRedirection.Name]; ok && !terminal(pod) {
			return c.mesh.annot.annotate(ctx, ns, name, "")
		}
		return nil
	}
	if st != nil && st.acked {
		if st.netns == nil {
			// Adopted without its netns: look again.
			if found, err := findNetns(c.cfg.NetnsDir, podIPs(pod), c.hostID, c.node); err == nil {
				if err := c.mesh.Adopt(pod, found); err != nil {
					return err
				}
			}
		}
		if pod.Annotations[annotation.AmbientRedirection.Name] != apinames.RedirectionEnabled {
			if err := c.mesh.annot.annotate(ctx, ns, name, apinames.RedirectionEnabled); err != nil {
				return err
			}
		}
		return c.mesh.Check(pod.UID, c.cfg.ResyncPeriod/2)
	}
	if st != nil || pod.DeletionTimestamp != nil {
		return nil // being enrolled by a CNI event, or going away
	}
	ips := podIPs(pod)
	if len(ips) == 0 {
		return nil // no sandbox yet: the CNI event enrolls it
	}
	found, err := findNetns(c.cfg.NetnsDir, ips, c.hostID, c.node)
	if err != nil {
		return err
	}
	path := found.Path()
	found.Close()
	return c.mesh.Enroll(ctx, pod, path, ips, sourceWatch)
}

// handleCNIAdd decides for the plugin, which has no access to the API,
// whether a new pod is ambient, and enrolls it if so.
func (c *controller) handleCNIAdd(ctx context.Context, ev *event.Add) error {
	select {
	case <-c.synced:
	case <-ctx.Done():
		return fmt.Errorf("the node agent is still starting (%w); the runtime will retry", ctx.Err())
	}
	if slices.Contains(c.cfg.ExcludedNamespaces, ev.PodNamespace) {
		return nil
	}
	pod, err := c.podForEvent(ctx, ev.PodNamespace, ev.PodName)
	if err != nil {
		return err
	}
	nsLabels, err := c.namespaceLabels(ctx, pod.Namespace)
	if err != nil {
		return err
	}
	if !c.wanted(pod, nsLabels) {
		c.log.Debug("pod from a CNI event is not ambient (any more); nothing to do", "pod", ev.PodNamespace+"/"+ev.PodName)
		return nil
	}
	path := ev.Netns
	if c.cfg.NetnsPathPrefix != "" {
		path = filepath.Join(c.cfg.NetnsPathPrefix, ev.Netns)
	}
	return c.mesh.Enroll(ctx, pod, path, ev.Addrs(), sourceCNI)
}

// podForEvent finds the event's pod: from the cache, which may lag the
// API by a moment (it is woken the moment the pod arrives there), else
// from the API. It must be bound to this node.
func (c *controller) podForEvent(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	deadline := time.NewTimer(2 * time.Second)
	defer deadline.Stop()
	key := ns + "/" + name
	for {
		// Wait first, then look, so that an arrival between the look and
		// the wait is never missed.
		arrival, stop := c.awaitArrival(key)
		pod, err := c.pods.Pods(ns).Get(name)
		if err == nil && pod.Spec.NodeName == c.cfg.NodeName {
			stop()
			return pod, nil
		}
		select {
		case <-ctx.Done():
			stop()
			return nil, fmt.Errorf("waiting for pod %s/%s: %w", ns, name, ctx.Err())
		case <-arrival:
			continue
		case <-deadline.C:
			stop()
		}
		break
	}
	pod, err := c.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("getting pod %s/%s: %w", ns, name, err)
	}
	if pod.Spec.NodeName != c.cfg.NodeName {
		return nil, fmt.Errorf("pod %s/%s is bound to node %q, not this node %q", ns, name, pod.Spec.NodeName, c.cfg.NodeName)
	}
	return pod, nil
}
