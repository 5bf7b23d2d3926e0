package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/cni/redirect"
	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/zdspb"
)

// Where an enrollment came from, for metrics and logs.
const (
	sourceCNI   = "cni"
	sourceWatch = "watch"
)

// ztunnels is what the mesh needs from the ZDS server.
type ztunnels interface {
	PodAdded(ctx context.Context, uid string, info *zdspb.WorkloadInfo, netns *os.File) error
	PodDeleted(ctx context.Context, uid string) error
	// connected is how many ztunnels have their snapshot.
	connected() int
}

// rules installs redirection in pod namespaces and probe IPs on the node.
type rules interface {
	apply(ns *netns.NS, o redirect.Options) error
	remove(ns *netns.NS) error
	check(ns *netns.NS, o redirect.Options) error
	addProbeIPs(uid string, ips []netip.Addr) error
	removeProbeIPs(ips []netip.Addr) error
}

// annotator sets (value != "") or removes the redirection annotation.
type annotator interface {
	annotate(ctx context.Context, ns, name, value string) error
}

// podState is one enrolled pod.
type podState struct {
	uid       types.UID
	namespace string
	name      string
	info      *zdspb.WorkloadInfo
	netns     *netns.NS // nil when the agent could not find it (a Keep)
	netnsID   uint64
	ips       []netip.Addr
	opts      redirect.Options
	// acked: ztunnel accepted the pod (or did before the agent restarted).
	acked   bool
	checked time.Time // last rule check
}

// enrollError carries the failure reason for the metric.
type enrollError struct {
	reason string
	err    error
}

func (e *enrollError) Error() string { return e.err.Error() }
func (e *enrollError) Unwrap() error { return e.err }

func failed(reason string, err error) error { return &enrollError{reason: reason, err: err} }

// mesh owns the set of enrolled pods and every transition of it: enroll
// (ztunnel's ack first, then the rules, so no pod is redirected to a
// ztunnel that did not accept it), adopt after a restart, repair, and
// un-enroll. Transitions of one pod are serialized by a per-pod lock.
type mesh struct {
	log      *slog.Logger
	zt       ztunnels
	rules    rules
	annot    annotator
	metrics  *metrics
	defaults redirect.Options
	hostID   uint64 // the node's netns, never a pod's

	locks keyedMutex

	mu   sync.Mutex // guards pods
	pods map[types.UID]*podState
}

func newMesh(log *slog.Logger, zt ztunnels, r rules, a annotator, m *metrics, defaults redirect.Options, hostID uint64) *mesh {
	return &mesh{log: log.With("component", "mesh"), zt: zt, rules: r, annot: a, metrics: m, defaults: defaults, hostID: hostID, pods: map[types.UID]*podState{}}
}

func (m *mesh) get(uid types.UID) *podState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pods[uid]
}

func (m *mesh) put(st *podState) {
	m.mu.Lock()
	m.pods[st.uid] = st
	n := 0
	for _, p := range m.pods {
		if p.acked {
			n++
		}
	}
	m.mu.Unlock()
	m.metrics.enrolled.Set(float64(n))
}

func (m *mesh) drop(uid types.UID) {
	m.mu.Lock()
	delete(m.pods, uid)
	n := 0
	for _, p := range m.pods {
		if p.acked {
			n++
		}
	}
	m.mu.Unlock()
	m.metrics.enrolled.Set(float64(n))
}

// byName finds the enrolled pods with this namespace and name (a deleted
// and re-created pod may briefly have two uids).
func (m *mesh) byName(ns, name string) []types.UID {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []types.UID
	for uid, p := range m.pods {
		if p.namespace == ns && p.name == name {
			out = append(out, uid)
		}
	}
	return out
}

func (m *mesh) uids() []types.UID {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]types.UID, 0, len(m.pods))
	for uid := range m.pods {
		out = append(out, uid)
	}
	return out
}

func workloadInfo(pod *corev1.Pod) *zdspb.WorkloadInfo {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	return &zdspb.WorkloadInfo{Name: pod.Name, Namespace: pod.Namespace, ServiceAccount: sa}
}

// podIPs lists a pod's status IPs.
func podIPs(pod *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil && !seen[a.Unmap()] {
			seen[a.Unmap()] = true
			out = append(out, a.Unmap())
		}
	}
	add(pod.Status.PodIP)
	for _, ip := range pod.Status.PodIPs {
		add(ip.IP)
	}
	return out
}

// Enroll puts a pod into the mesh through the netns at path: ztunnel gets
// the netns and must ack, then the rules go in, then the probe IPs, then
// the annotation. Any failure before the annotation undoes what was done,
// so the pod is either fully enrolled or not at all. Enrolling an enrolled
// pod again re-applies its rules; a new netns for the same pod (a
// re-created sandbox) replaces the old one.
func (m *mesh) Enroll(ctx context.Context, pod *corev1.Pod, path string, ips []netip.Addr, source string) (err error) {
	start := time.Now()
	log := m.log.With("pod", pod.Namespace+"/"+pod.Name, "pod_uid", pod.UID, "source", source)
	defer func() {
		if err != nil {
			reason := "other"
			var ee *enrollError
			if errors.As(err, &ee) {
				reason = ee.reason
			}
			m.metrics.failures.WithLabelValues(reason).Inc()
			return
		}
	}()
	unlock := m.locks.lock(string(pod.UID))
	defer unlock()

	opts, err := redirect.PodOptions(pod.Annotations, m.defaults)
	if err != nil {
		return failed("pod", fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	ns, err := netns.Open(path)
	if err != nil {
		return failed("netns", fmt.Errorf("pod %s/%s: %w (was the sandbox removed?)", pod.Namespace, pod.Name, err))
	}
	keep := false
	defer func() {
		if !keep {
			ns.Close()
		}
	}()
	id, err := ns.ID()
	if err != nil {
		return failed("netns", err)
	}
	if id == m.hostID {
		return failed("netns", fmt.Errorf("pod %s/%s: netns %s is the node's own network namespace", pod.Namespace, pod.Name, path))
	}
	if len(ips) > 0 {
		ok, err := holdsAny(ns, ips)
		if err != nil {
			return failed("netns", fmt.Errorf("pod %s/%s: reading addresses in netns %s: %w", pod.Namespace, pod.Name, path, err))
		}
		if !ok {
			return failed("netns", fmt.Errorf("pod %s/%s: netns %s holds none of the pod's addresses %v", pod.Namespace, pod.Name, path, ips))
		}
	}

	if old := m.get(pod.UID); old != nil {
		if old.netnsID == id && old.acked {
			// The same sandbox: make sure the rules are right.
			if err := m.rules.apply(old.netns, opts); err != nil {
				return failed("rules", fmt.Errorf("pod %s/%s: re-applying rules: %w", pod.Namespace, pod.Name, err))
			}
			old.opts = opts
			if err := m.annot.annotate(ctx, pod.Namespace, pod.Name, apinames.RedirectionEnabled); err != nil {
				log.Warn("annotating the pod failed; will retry", "error", err)
			}
			return nil
		}
		log.Info("pod has a new network namespace, replacing the old one")
		if err := m.unenrollLocked(ctx, old, false); err != nil {
			return failed("rules", fmt.Errorf("pod %s/%s: leaving the old netns: %w", pod.Namespace, pod.Name, err))
		}
	}

	if m.zt.connected() == 0 {
		// Refused before the pod is known: a ztunnel connecting now gets a
		// snapshot without it, then the retry's Add, never a pod whose Add
		// failed.
		if aerr := m.annot.annotate(ctx, pod.Namespace, pod.Name, apinames.RedirectionPending); aerr != nil {
			log.Warn("annotating the pod pending failed", "error", aerr)
		}
		return failed("ztunnel", fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, ErrNoZtunnel))
	}
	st := &podState{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, info: workloadInfo(pod), netns: ns, netnsID: id, ips: ips, opts: opts}
	// Known before the Add, so a ztunnel connecting meanwhile gets it in
	// its snapshot.
	m.put(st)
	undo := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := m.zt.PodDeleted(dctx, string(pod.UID)); err != nil {
			log.Warn("withdrawing the pod from ztunnel failed", "error", err)
		}
		m.drop(pod.UID)
	}
	dup, err := dupNetns(ns)
	if err != nil {
		m.drop(pod.UID)
		return failed("netns", err)
	}
	err = m.zt.PodAdded(ctx, string(pod.UID), st.info, dup)
	dup.Close()
	if err != nil {
		undo()
		if aerr := m.annot.annotate(ctx, pod.Namespace, pod.Name, apinames.RedirectionPending); aerr != nil {
			log.Warn("annotating the pod pending failed", "error", aerr)
		}
		return failed("ztunnel", fmt.Errorf("pod %s/%s: ztunnel did not take the pod: %w", pod.Namespace, pod.Name, err))
	}
	if err := m.rules.apply(ns, opts); err != nil {
		undo()
		return failed("rules", fmt.Errorf("pod %s/%s: installing the redirection: %w", pod.Namespace, pod.Name, err))
	}
	if err := m.rules.addProbeIPs(string(pod.UID), ips); err != nil {
		if rerr := m.rules.remove(ns); rerr != nil {
			log.Error("removing the rules after a failure failed", "error", rerr)
		}
		undo()
		return failed("probe_ips", fmt.Errorf("pod %s/%s: adding the probe addresses on the node: %w", pod.Namespace, pod.Name, err))
	}
	m.mu.Lock()
	st.acked, st.checked = true, time.Now()
	m.mu.Unlock()
	m.put(st)
	keep = true
	m.metrics.latency.WithLabelValues(source).Observe(time.Since(start).Seconds())
	if err := m.annot.annotate(ctx, pod.Namespace, pod.Name, apinames.RedirectionEnabled); err != nil {
		// The pod is enrolled; the watch retries the annotation.
		log.Warn("annotating the pod failed; will retry", "error", err)
	}
	log.Info("pod enrolled", "netns", path, "ips", ips, "duration", time.Since(start))
	return nil
}

// Adopt takes over a pod enrolled before the agent restarted (it carries
// the enabled annotation): its netns is found by IP, its rules re-checked
// and repaired, and it joins the snapshot every ztunnel gets. No Add is
// sent: ztunnel accepted it before, and gets it again in its snapshot.
// Adopt owns ns (nil when not found): it keeps it on success and closes it
// on failure.
func (m *mesh) Adopt(pod *corev1.Pod, ns *netns.NS) (err error) {
	defer func() {
		if err != nil && ns != nil {
			ns.Close()
		}
	}()
	unlock := m.locks.lock(string(pod.UID))
	defer unlock()
	log := m.log.With("pod", pod.Namespace+"/"+pod.Name, "pod_uid", pod.UID)
	opts, err := redirect.PodOptions(pod.Annotations, m.defaults)
	if err != nil {
		opts = m.defaults
		log.Warn("pod has an invalid redirection annotation; using the defaults", "error", err)
	}
	st := &podState{uid: pod.UID, namespace: pod.Namespace, name: pod.Name, info: workloadInfo(pod), ips: podIPs(pod), opts: opts, acked: true}
	if ns == nil {
		// Keep it in ztunnel until the netns turns up.
		m.put(st)
		log.Warn("netns of an enrolled pod not found; ztunnel keeps it", "ips", st.ips)
		return nil
	}
	id, err := ns.ID()
	if err != nil {
		return err
	}
	st.netns, st.netnsID = ns, id
	if err := m.rules.check(ns, opts); err != nil {
		if !errors.Is(err, redirect.ErrDrift) {
			return fmt.Errorf("pod %s/%s: checking rules: %w", pod.Namespace, pod.Name, err)
		}
		log.Warn("repairing the pod's rules", "drift", err)
		if err := m.rules.apply(ns, opts); err != nil {
			return fmt.Errorf("pod %s/%s: repairing rules: %w", pod.Namespace, pod.Name, err)
		}
		m.metrics.repairs.Inc()
	}
	st.checked = time.Now()
	if err := m.rules.addProbeIPs(string(pod.UID), st.ips); err != nil {
		log.Warn("adding probe addresses failed", "error", err)
	}
	m.put(st)
	log.Info("adopted an enrolled pod")
	return nil
}

// Check re-checks an enrolled pod's rules if they were last checked more
// than every ago, and repairs them.
func (m *mesh) Check(uid types.UID, every time.Duration) error {
	unlock := m.locks.lock(string(uid))
	defer unlock()
	st := m.get(uid)
	if st == nil || st.netns == nil || !st.acked || time.Since(st.checked) < every {
		return nil
	}
	err := m.rules.check(st.netns, st.opts)
	if errors.Is(err, redirect.ErrDrift) {
		m.log.Warn("repairing a pod's rules", "pod", st.namespace+"/"+st.name, "drift", err)
		if err = m.rules.apply(st.netns, st.opts); err == nil {
			m.metrics.repairs.Inc()
		}
	}
	if err == nil {
		m.mu.Lock()
		st.checked = time.Now()
		m.mu.Unlock()
	}
	return err
}

// Unenroll takes a pod out of the mesh. When the pod still exists (its
// label was removed) its rules and annotation are removed too; a deleted
// pod's netns is going away anyway.
func (m *mesh) Unenroll(ctx context.Context, uid types.UID, podExists bool) error {
	unlock := m.locks.lock(string(uid))
	defer unlock()
	st := m.get(uid)
	if st == nil {
		return nil
	}
	return m.unenrollLocked(ctx, st, podExists)
}

func (m *mesh) unenrollLocked(ctx context.Context, st *podState, podExists bool) error {
	log := m.log.With("pod", st.namespace+"/"+st.name, "pod_uid", st.uid)
	if st.netns != nil && podExists {
		// Rules first: traffic stops going to ztunnel before it lets go.
		if err := m.rules.remove(st.netns); err != nil {
			return fmt.Errorf("removing the rules of pod %s/%s: %w", st.namespace, st.name, err)
		}
	}
	if err := m.zt.PodDeleted(ctx, string(st.uid)); err != nil {
		log.Warn("telling ztunnel the pod left failed", "error", err)
	}
	if err := m.rules.removeProbeIPs(st.ips); err != nil {
		log.Warn("removing probe addresses failed", "error", err)
	}
	// Out of the map before the handle closes: a snapshot never sees a
	// closed descriptor.
	m.drop(st.uid)
	if st.netns != nil {
		st.netns.Close()
	}
	if podExists {
		if err := m.annot.annotate(ctx, st.namespace, st.name, ""); err != nil {
			log.Warn("removing the redirection annotation failed", "error", err)
		}
	}
	log.Info("pod left the mesh", "pod_exists", podExists)
	return nil
}

// snapshot implements snapshotter: every known pod, with a duplicate of its
// netns when the agent holds one.
func (m *mesh) snapshot() []snapshotItem {
	m.mu.Lock()
	defer m.mu.Unlock()
	items := make([]snapshotItem, 0, len(m.pods))
	for _, p := range m.pods {
		it := snapshotItem{uid: string(p.uid), info: p.info}
		if p.netns != nil {
			f, err := dupNetns(p.netns)
			if err != nil {
				m.log.Error("duplicating a netns for the snapshot failed; sending a keep", "pod_uid", p.uid, "error", err)
			} else {
				it.netns = f
			}
		}
		items = append(items, it)
	}
	slices.SortFunc(items, func(a, b snapshotItem) int {
		switch {
		case a.uid < b.uid:
			return -1
		case a.uid > b.uid:
			return 1
		}
		return 0
	})
	return items
}

// snapshotRefused takes a pod ztunnel refused out of the mesh: it must not
// stay redirected to a ztunnel that did not accept it. The watch enrolls
// it again.
func (m *mesh) snapshotRefused(uid string, cause error) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m.metrics.failures.WithLabelValues("ztunnel").Inc()
		if err := m.Unenroll(ctx, types.UID(uid), true); err != nil {
			m.log.Error("removing a pod ztunnel refused failed", "pod_uid", uid, "error", err)
		}
	}()
}

// RemoveAll takes every pod out (uninstall): rules and annotations go.
func (m *mesh) RemoveAll(ctx context.Context) error {
	var errs []error
	for _, uid := range m.uids() {
		if err := m.Unenroll(ctx, uid, true); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close releases the netns handles without touching any rule.
func (m *mesh) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.pods {
		if p.netns != nil {
			p.netns.Close()
		}
	}
	m.pods = map[types.UID]*podState{}
}

// dupNetns duplicates a netns descriptor (close-on-exec) for a ZDS send.
func dupNetns(ns *netns.NS) (*os.File, error) {
	fd, err := unix.FcntlInt(uintptr(ns.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicating netns %s: %w", ns.Path(), err)
	}
	return os.NewFile(uintptr(fd), ns.Path()), nil
}

// keyedMutex serializes work per key.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedEntry{}
	}
	e := k.locks[key]
	if e == nil {
		e = &keyedEntry{}
		k.locks[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
