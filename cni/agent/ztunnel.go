package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/weftmesh/weft/internal/pb/zdspb"
	"github.com/weftmesh/weft/internal/zds"
)

// ErrNoZtunnel means no ztunnel is connected to take a pod.
var ErrNoZtunnel = errors.New("no ztunnel is connected")

// snapshotItem is one pod of the snapshot a new ztunnel gets: an Add with
// the netns when the agent holds it, else a Keep.
type snapshotItem struct {
	uid   string
	info  *zdspb.WorkloadInfo
	netns *os.File // a duplicate the sender closes; nil for a Keep
}

// snapshotter is what the ZDS server needs from the pod state.
type snapshotter interface {
	// snapshot lists every pod the agent knows, after the initial sync.
	snapshot() []snapshotItem
	// snapshotRefused reports an Add of the snapshot that ztunnel NACKed.
	snapshotRefused(uid string, err error)
}

// ztunnelServer is the node agent's side of ZDS: it accepts ztunnel
// connections on the ZDS socket, sends each a snapshot and then the Adds
// (to the newest connection) and Dels (to all).
type ztunnelServer struct {
	path       string
	allowedUID uint32
	log        *slog.Logger
	metrics    *metrics
	state      snapshotter
	synced     <-chan struct{} // closed once the pod state is complete
	onConnect  func()          // called once a ztunnel has its snapshot

	mu    sync.Mutex
	conns []*ztunnelConn // in connection order, newest last

	listening chan struct{}
}

type ztunnelConn struct {
	id   int
	c    *zds.Conn
	reqs chan *ztunnelReq
	done chan struct{} // closed when the connection's goroutine exits
}

type ztunnelReq struct {
	req    *zdspb.WorkloadRequest
	netns  *os.File
	result chan error
}

func newZtunnelServer(path string, uid int, log *slog.Logger, m *metrics, state snapshotter, synced <-chan struct{}, onConnect func()) *ztunnelServer {
	return &ztunnelServer{path: path, allowedUID: uint32(uid), log: log.With("component", "zds"), metrics: m, state: state, synced: synced, onConnect: onConnect, listening: make(chan struct{})}
}

// Run serves ZDS until ctx ends, accepting at most 5 connections a second.
func (s *ztunnelServer) Run(ctx context.Context) error {
	l, err := zds.Listen(s.path)
	if err != nil {
		return err
	}
	close(s.listening)
	s.log.Info("serving ZDS", "socket", s.path)
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	limit := rate.NewLimiter(rate.Every(200*time.Millisecond), 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	for id := 1; ; id++ {
		if err := limit.Wait(ctx); err != nil {
			return nil
		}
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Error("accepting a ZDS connection failed", "error", err)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, id, c)
		}()
	}
}

// serveConn owns one connection: hello, snapshot, then requests in order.
func (s *ztunnelServer) serveConn(ctx context.Context, id int, c *zds.Conn) {
	log := s.log.With("ztunnel_conn", id)
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	cred, err := c.PeerCred()
	if err != nil {
		log.Error("refusing a ZDS connection", "error", err)
		return
	}
	if cred.Uid != s.allowedUID {
		log.Warn("refusing a ZDS connection from an unexpected UID", "peer_uid", cred.Uid, "peer_pid", cred.Pid, "allowed_uid", s.allowedUID)
		return
	}
	if _, err := c.RecvHello(zds.HelloTimeout); err != nil {
		log.Warn("ZDS hello failed", "peer_pid", cred.Pid, "error", err)
		return
	}
	select {
	case <-s.synced:
	case <-ctx.Done():
		return
	}
	zc := &ztunnelConn{id: id, c: c, reqs: make(chan *ztunnelReq), done: make(chan struct{})}
	defer close(zc.done)
	// Registering and snapshotting under one lock: a pod added after the
	// snapshot is taken goes to this (now newest) connection's queue.
	s.mu.Lock()
	s.conns = append(s.conns, zc)
	items := s.state.snapshot()
	s.mu.Unlock()
	defer s.remove(zc)
	log.Info("ztunnel connected", "peer_pid", cred.Pid, "snapshot_pods", len(items))

	if err := s.sendSnapshot(log, c, items); err != nil {
		log.Warn("sending the ZDS snapshot failed; dropping the connection", "error", err)
		return
	}
	s.metrics.ztunnels.Inc()
	defer s.metrics.ztunnels.Dec()
	if s.onConnect != nil {
		s.onConnect()
	}

	idle := time.NewTimer(zds.LivenessInterval)
	defer idle.Stop()
	for {
		select {
		case r := <-zc.reqs:
			err := c.Request(r.req, r.netns, zds.RequestTimeout)
			var nack *zds.NackError
			if err != nil && !errors.As(err, &nack) {
				// Out of the routing before answering, so the caller's
				// retry goes to another ztunnel.
				s.remove(zc)
				r.result <- err
				log.Warn("ZDS connection failed", "error", err)
				return
			}
			r.result <- err
		case <-idle.C:
			if err := c.Probe(zds.ProbeWait); err != nil {
				log.Info("ztunnel disconnected", "reason", err)
				return
			}
		case <-ctx.Done():
			return
		}
		idle.Reset(zds.LivenessInterval)
	}
}

func (s *ztunnelServer) sendSnapshot(log *slog.Logger, c *zds.Conn, items []snapshotItem) error {
	defer func() {
		for _, it := range items {
			if it.netns != nil {
				it.netns.Close()
			}
		}
	}()
	for _, it := range items {
		req := zds.KeepRequest(it.uid)
		if it.netns != nil {
			req = zds.AddRequest(it.uid, it.info)
		}
		err := c.Request(req, it.netns, zds.RequestTimeout)
		var nack *zds.NackError
		switch {
		case errors.As(err, &nack):
			log.Warn("ztunnel refused a pod of the snapshot", "pod_uid", it.uid, "error", err)
			if it.netns != nil {
				s.state.snapshotRefused(it.uid, err)
			}
		case err != nil:
			return err
		}
	}
	return c.Request(zds.SnapshotSentRequest(), nil, zds.RequestTimeout)
}

func (s *ztunnelServer) remove(zc *ztunnelConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range s.conns {
		if c == zc {
			s.conns = append(s.conns[:i], s.conns[i+1:]...)
			return
		}
	}
}

// errConnGone means the connection closed before it took the request,
// which can then go to another one.
var errConnGone = errors.New("ztunnel connection closed")

// send queues a request on zc and waits for ztunnel's answer.
func (zc *ztunnelConn) send(ctx context.Context, req *zdspb.WorkloadRequest, netns *os.File) error {
	r := &ztunnelReq{req: req, netns: netns, result: make(chan error, 1)}
	select {
	case zc.reqs <- r:
	case <-zc.done:
		return fmt.Errorf("%w: %w %d", ErrNoZtunnel, errConnGone, zc.id)
	case <-ctx.Done():
		return fmt.Errorf("waiting to send ZDS %s: %w", zds.Kind(req), ctx.Err())
	}
	select {
	case err := <-r.result:
		return err
	case <-zc.done:
		// The goroutine answers before exiting when it took the request.
		select {
		case err := <-r.result:
			return err
		default:
			return fmt.Errorf("%w: ztunnel connection %d closed before it answered", ErrNoZtunnel, zc.id)
		}
	}
}

// PodAdded hands a pod's netns to the newest ztunnel and waits for its ack.
// A connection that closed before taking the Add is skipped for the next
// newest.
func (s *ztunnelServer) PodAdded(ctx context.Context, uid string, info *zdspb.WorkloadInfo, netns *os.File) error {
	for {
		s.mu.Lock()
		var newest *ztunnelConn
		if n := len(s.conns); n > 0 {
			newest = s.conns[n-1]
		}
		s.mu.Unlock()
		if newest == nil {
			return fmt.Errorf("%w on %s", ErrNoZtunnel, s.path)
		}
		err := newest.send(ctx, zds.AddRequest(uid, info), netns)
		if !errors.Is(err, errConnGone) {
			return err
		}
		s.remove(newest)
	}
}

// PodDeleted tells every connected ztunnel that the pod is gone.
func (s *ztunnelServer) PodDeleted(ctx context.Context, uid string) error {
	s.mu.Lock()
	conns := append([]*ztunnelConn(nil), s.conns...)
	s.mu.Unlock()
	var errs []error
	for _, zc := range conns {
		if err := zc.send(ctx, zds.DelRequest(uid), nil); err != nil && !errors.Is(err, ErrNoZtunnel) {
			errs = append(errs, fmt.Errorf("ztunnel connection %d: %w", zc.id, err))
		}
	}
	return errors.Join(errs...)
}

// connected reports how many ztunnels have their snapshot.
func (s *ztunnelServer) connected() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}
