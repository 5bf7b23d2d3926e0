// Package inpod is ztunnel's side of ZDS: it connects to the CNI node
// agent, receives each enrolled pod's network namespace and runs a proxy
// for the pod inside it, following the snapshot protocol (Add or Keep per
// known pod, SnapshotSent, then Add and Del) and acknowledging every
// request. Proxies outlive a lost connection: after a reconnect the new
// snapshot says which to keep. When ztunnel is replaced, WaitTakenOver
// tells when the next one listens in every pod, so the old one can close
// its listeners without a moment when a pod has none.
package inpod

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/zdspb"
	"github.com/weftmesh/weft/internal/reconnect"
	"github.com/weftmesh/weft/internal/zds"
)

// PodInfo names a pod as the node agent reports it.
type PodInfo struct {
	UID, Namespace, Name, ServiceAccount string
}

func (p PodInfo) String() string { return p.Namespace + "/" + p.Name }

// Proxy is one pod's proxy.
type Proxy interface {
	// Run serves until ctx ends, then drains; it returns once stopped.
	Run(ctx context.Context) error
	// Ready is closed once the pod's listeners are open.
	Ready() <-chan struct{}
	// Health reports nil while the proxy serves, else why not (a listener
	// that stopped).
	Health() error
}

// Factory builds the proxy of a pod inside ns. release is called after the
// proxy's Run returned (to give back its certificate, for instance).
type Factory func(info PodInfo, ns *netns.NS) (p Proxy, release func(), err error)

// Config configures a Manager.
type Config struct {
	// SocketPath is the node agent's ZDS socket; default zdspb.DefaultSocketPath.
	SocketPath string
	// NewProxy builds pod proxies. Required.
	NewProxy Factory
	// MinBackoff and MaxBackoff bound reconnects (see package reconnect);
	// defaults 10 ms and 15 s.
	MinBackoff, MaxBackoff time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Manager runs the proxies of the pods the node agent hands over.
type Manager struct {
	cfg     Config
	running sync.WaitGroup // proxy goroutines

	mu        sync.Mutex
	pods      map[string]*pod // guarded by mu: by pod uid
	connected bool            // guarded by mu: a ZDS session is up
	snapshot  bool            // guarded by mu: its snapshot was received
	stats     Stats           // guarded by mu
}

// Stats counts the manager's work, for metrics and tests.
type Stats struct {
	Connects, Started, Stopped, Failed int
}

type pod struct {
	info    PodInfo
	px      Proxy
	ns      *netns.NS // the manager's own handle, closed (under mu) when the pod is forgotten
	nsID    uint64
	cancel  context.CancelFunc
	stopped chan struct{}
}

// New returns a manager; it starts nothing.
func New(cfg Config) (*Manager, error) {
	if cfg.NewProxy == nil {
		return nil, errors.New("inpod: NewProxy is required")
	}
	if cfg.SocketPath == "" {
		cfg.SocketPath = zdspb.DefaultSocketPath
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Manager{cfg: cfg, pods: map[string]*pod{}}, nil
}

// Ready reports nil once the node agent's snapshot has been received on the
// current connection, while every pod's proxy is healthy.
func (m *Manager) Ready() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !m.connected:
		return errors.New("not connected to the CNI node agent")
	case !m.snapshot:
		return errors.New("waiting for the CNI node agent's snapshot")
	}
	var failed []error
	for _, p := range m.pods {
		if err := p.px.Health(); err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		sort.Slice(failed, func(i, j int) bool { return failed[i].Error() < failed[j].Error() })
		return fmt.Errorf("%d pod proxies unhealthy, first: %w", len(failed), failed[0])
	}
	return nil
}

// Pods returns the pods being proxied, sorted, for the admin page.
func (m *Manager) Pods() []PodInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PodInfo, 0, len(m.pods))
	for _, p := range m.pods {
		out = append(out, p.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// Stats returns the counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

// Run keeps a ZDS session with the node agent until ctx ends, then drains
// every proxy and returns once they stopped.
func (m *Manager) Run(ctx context.Context) error {
	backoff := reconnect.NewBackoff(m.cfg.MinBackoff, m.cfg.MaxBackoff)
	for ctx.Err() == nil {
		start := time.Now()
		err := m.session(ctx)
		m.mu.Lock()
		m.connected, m.snapshot = false, false
		m.mu.Unlock()
		if ctx.Err() != nil {
			break
		}
		delay := backoff.Delay(time.Since(start))
		m.cfg.Logger.Warn("ZDS session ended", "socket", m.cfg.SocketPath, "error", err.Error(), "retry_in", delay.String())
		reconnect.Sleep(ctx, delay)
	}
	m.mu.Lock()
	for uid := range m.pods {
		m.stopLocked(uid)
	}
	m.mu.Unlock()
	m.running.Wait()
	return nil
}

// session runs one connection: hello, then requests until it fails.
func (m *Manager) session(ctx context.Context) error {
	conn, err := zds.Dial(ctx, m.cfg.SocketPath)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := conn.SendHello(); err != nil {
		return fmt.Errorf("sending hello: %w", err)
	}
	m.mu.Lock()
	m.connected = true
	m.stats.Connects++
	m.mu.Unlock()
	named := map[string]bool{} // uids the snapshot named
	for {
		req, nsf, err := conn.RecvRequest()
		if err != nil {
			if errors.Is(err, zds.ErrInvalid) {
				if aerr := conn.SendAck(err); aerr != nil {
					return aerr
				}
				continue
			}
			return fmt.Errorf("receiving a request: %w", err)
		}
		herr := m.handle(req, nsf, named)
		if herr != nil {
			m.cfg.Logger.Warn("ZDS request refused", "request", zds.Kind(req), "error", herr.Error())
		}
		if err := conn.SendAck(herr); err != nil {
			return fmt.Errorf("acknowledging: %w", err)
		}
	}
}

// handle applies one request; the returned error is sent as a NACK.
func (m *Manager) handle(req *zdspb.WorkloadRequest, nsf *os.File, named map[string]bool) error {
	m.mu.Lock()
	snapshot := m.snapshot
	m.mu.Unlock()
	switch p := req.GetPayload().(type) {
	case *zdspb.WorkloadRequest_Add:
		defer nsf.Close()
		info := p.Add.GetWorkloadInfo()
		if info == nil {
			return errors.New("AddWorkload without workload_info")
		}
		pi := PodInfo{UID: p.Add.GetUid(), Namespace: info.GetNamespace(), Name: info.GetName(), ServiceAccount: info.GetServiceAccount()}
		if !snapshot {
			named[pi.UID] = true
		}
		return m.add(pi, nsf)
	case *zdspb.WorkloadRequest_Keep:
		if snapshot {
			return errors.New("KeepWorkload after the snapshot")
		}
		named[p.Keep.GetUid()] = true
		return nil
	case *zdspb.WorkloadRequest_Del:
		m.mu.Lock()
		defer m.mu.Unlock()
		if !snapshot {
			delete(named, p.Del.GetUid())
			return nil // the snapshot's end drops it if it runs
		}
		m.stopLocked(p.Del.GetUid())
		return nil
	case *zdspb.WorkloadRequest_SnapshotSent:
		m.mu.Lock()
		defer m.mu.Unlock()
		if snapshot {
			return errors.New("a second SnapshotSent")
		}
		for uid := range m.pods {
			if !named[uid] {
				m.stopLocked(uid)
			}
		}
		m.snapshot = true
		return nil
	}
	return errors.New("request without payload")
}

// add starts the proxy of a pod, or keeps the one running for the same netns.
func (m *Manager) add(info PodInfo, nsf *os.File) error {
	ns, err := netns.Open(fmt.Sprintf("/proc/self/fd/%d", nsf.Fd()))
	if err != nil {
		return fmt.Errorf("pod %s: %w", info, err)
	}
	id, err := ns.ID()
	if err != nil {
		ns.Close()
		return fmt.Errorf("pod %s: %w", info, err)
	}
	m.mu.Lock()
	if old := m.pods[info.UID]; old != nil {
		if old.nsID == id {
			m.mu.Unlock()
			ns.Close()
			return nil // the same pod again: nothing to do
		}
		m.stopLocked(info.UID) // the sandbox was re-created with a new netns
	}
	m.mu.Unlock()

	px, release, err := m.cfg.NewProxy(info, ns)
	if err != nil {
		ns.Close()
		m.count(func(s *Stats) { s.Failed++ })
		return fmt.Errorf("pod %s: %w", info, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &pod{info: info, px: px, nsID: id, cancel: cancel, stopped: make(chan struct{})}
	runErr := make(chan error, 1)
	m.running.Add(1)
	go func() {
		defer m.running.Done()
		defer close(p.stopped)
		err := px.Run(ctx)
		if release != nil {
			release()
		}
		ns.Close()
		m.count(func(s *Stats) { s.Stopped++ })
		runErr <- err
	}()
	select {
	case <-px.Ready():
	case err := <-runErr:
		cancel()
		m.count(func(s *Stats) { s.Failed++ })
		return fmt.Errorf("pod %s: proxy did not start: %w", info, err)
	}
	// A handle of the manager's own, for WaitTakenOver: the proxy's is
	// closed by its goroutine whenever the proxy ends.
	own, err := netns.Open(fmt.Sprintf("/proc/self/fd/%d", nsf.Fd()))
	if err != nil {
		cancel()
		<-p.stopped
		m.count(func(s *Stats) { s.Failed++ })
		return fmt.Errorf("pod %s: %w", info, err)
	}
	p.ns = own
	m.mu.Lock()
	m.pods[info.UID] = p
	m.stats.Started++
	m.mu.Unlock()
	m.cfg.Logger.Info("pod proxy started", "pod", info.String(), "uid", info.UID)
	return nil
}

// stopLocked drains a pod's proxy (asynchronously) and forgets it.
func (m *Manager) stopLocked(uid string) {
	p := m.pods[uid]
	if p == nil {
		return
	}
	delete(m.pods, uid)
	p.cancel()
	p.ns.Close()
	m.cfg.Logger.Info("pod proxy stopping", "pod", p.info.String(), "uid", uid)
}

// WaitTakenOver waits until, in every pod's network namespace, another
// socket listens next to this ztunnel's on each of ports (the next ztunnel,
// bound with SO_REUSEPORT), or until ctx ends. It returns the pods not
// taken over. A pod that arrives or leaves meanwhile is counted as it
// stands at each check.
func (m *Manager) WaitTakenOver(ctx context.Context, ports []uint16) []PodInfo {
	done := map[string]bool{} // uids seen taken over
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var left []PodInfo
		m.mu.Lock()
		for uid, p := range m.pods {
			if done[uid] {
				continue
			}
			if takenOver(p.ns, ports) {
				done[uid] = true
				continue
			}
			left = append(left, p.info)
		}
		m.mu.Unlock()
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			sort.Slice(left, func(i, j int) bool { return left[i].String() < left[j].String() })
			return left
		case <-tick.C:
		}
	}
}

// takenOver reports whether at least two sockets listen on each port in ns:
// ours and a successor's.
func takenOver(ns *netns.NS, ports []uint16) bool {
	n, err := Listeners(ns)
	if err != nil {
		return false
	}
	for _, port := range ports {
		if n[port] < 2 {
			return false
		}
	}
	return true
}

func (m *Manager) count(f func(*Stats)) {
	m.mu.Lock()
	f(&m.stats)
	m.mu.Unlock()
}
