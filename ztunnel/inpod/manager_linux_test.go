package inpod

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/zdspb"
	"github.com/weftmesh/weft/internal/zds"
)

func rootOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("WEFT_ROOT_TESTS") == "" {
		t.Skip("set WEFT_ROOT_TESTS=1 (make test does) to run network-namespace tests")
	}
	if os.Geteuid() != 0 {
		t.Skip("network-namespace tests need root")
	}
}

// podNS makes a pod netns with loopback up, deleted at the end of the test.
func podNS(t *testing.T, name string) *netns.NS {
	t.Helper()
	name = fmt.Sprintf("weft-inpod-%d-%s", os.Getpid(), name)
	ns, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.Delete(name); err != nil {
			t.Errorf("deleting %s: %v", name, err)
		}
	})
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// echoProxy listens on 15001 inside the pod and answers with the pod name.
type echoProxy struct {
	info  PodInfo
	s     Sockets
	ready chan struct{}
}

func (p *echoProxy) Ready() <-chan struct{} { return p.ready }
func (p *echoProxy) Health() error          { return nil }

func (p *echoProxy) Run(ctx context.Context) error {
	ln, err := p.s.Listen(ctx, netip.MustParseAddrPort("0.0.0.0:15001"))
	if err != nil {
		return err
	}
	close(p.ready)
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil
		}
		fmt.Fprintln(c, p.info.Name)
		c.Close()
	}
}

// askPod connects to 127.0.0.1:15001 inside ns and returns the answer.
func askPod(ns *netns.NS) (string, error) {
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", "127.0.0.1:15001", 2*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	return string(b), err
}

type fixture struct {
	t       *testing.T
	ln      *zds.Listener
	m       *Manager
	cancel  context.CancelFunc
	done    chan error
	mu      sync.Mutex
	release map[string]int
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "ztunnel.sock")
	ln, err := zds.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ln: ln, release: map[string]int{}}
	f.m, err = New(Config{
		SocketPath: sock,
		MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewProxy: func(info PodInfo, ns *netns.NS) (Proxy, func(), error) {
			if info.Name == "broken" {
				return nil, nil, errors.New("no certificate for this identity")
			}
			return &echoProxy{info: info, s: Sockets{NS: ns}, ready: make(chan struct{})}, func() {
				f.mu.Lock()
				f.release[info.Name]++
				f.mu.Unlock()
			}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel, f.done = cancel, make(chan error, 1)
	go func() { f.done <- f.m.Run(ctx) }()
	t.Cleanup(func() {
		f.cancel()
		if err := <-f.done; err != nil {
			t.Error(err)
		}
		ln.Close()
	})
	return f
}

// accept takes ztunnel's connection and its hello, as the node agent does.
func (f *fixture) accept() *zds.Conn {
	f.t.Helper()
	c, err := f.ln.Accept()
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := c.RecvHello(5 * time.Second); err != nil {
		f.t.Fatal(err)
	}
	return c
}

func add(uid, name string) *zdspb.WorkloadRequest {
	return zds.AddRequest(uid, &zdspb.WorkloadInfo{Name: name, Namespace: "demo", ServiceAccount: "default"})
}

func nsFile(t *testing.T, ns *netns.NS) *os.File {
	f, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestZDSSessionLifecycle(t *testing.T) {
	rootOnly(t)
	a, b := podNS(t, "a"), podNS(t, "b")
	f := newFixture(t)
	c := f.accept()
	defer c.Close()

	if err := f.m.Ready(); err == nil {
		t.Error("ready before the snapshot")
	}
	if err := c.Request(add("uid-a", "pod-a"), nsFile(t, a), 5*time.Second); err != nil {
		t.Fatalf("add a: %v", err)
	}
	// Adding the same pod again (same netns) is acknowledged and changes nothing.
	if err := c.Request(add("uid-a", "pod-a"), nsFile(t, a), 5*time.Second); err != nil {
		t.Fatalf("add a again: %v", err)
	}
	if err := c.Request(zds.SnapshotSentRequest(), nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Ready(); err != nil {
		t.Errorf("not ready after the snapshot: %v", err)
	}
	if got, err := askPod(a); err != nil || got != "pod-a\n" {
		t.Fatalf("listener inside pod a: %q %v", got, err)
	}
	// The listener is in the pod's namespace, not in ours.
	if c, err := net.DialTimeout("tcp", "127.0.0.1:15001", 200*time.Millisecond); err == nil {
		c.Close()
		t.Error("the pod's listener is reachable from the root namespace")
	}
	if err := c.Request(add("uid-b", "pod-b"), nsFile(t, b), 5*time.Second); err != nil {
		t.Fatalf("add b: %v", err)
	}
	// Keep after the snapshot and a second SnapshotSent are protocol errors: NACKed.
	var nack *zds.NackError
	if err := c.Request(zds.KeepRequest("uid-a"), nil, 5*time.Second); !errors.As(err, &nack) {
		t.Errorf("keep after snapshot: %v, want a NACK", err)
	}
	if err := c.Request(zds.SnapshotSentRequest(), nil, 5*time.Second); !errors.As(err, &nack) {
		t.Errorf("second snapshot: %v, want a NACK", err)
	}
	// A pod whose proxy cannot start is NACKed with the reason.
	if err := c.Request(add("uid-x", "broken"), nsFile(t, b), 5*time.Second); !errors.As(err, &nack) {
		t.Errorf("broken pod: %v, want a NACK", err)
	}
	// Del stops the proxy: its listener closes and its credentials are released.
	if err := c.Request(zds.DelRequest("uid-a"), nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := askPod(a); return err != nil })
	waitFor(t, func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.release["pod-a"] == 1 })

	// Reconnect: pod b survives the lost session and is kept by the new
	// snapshot; a pod the new snapshot does not name would be dropped.
	c.Close()
	c2 := f.accept()
	defer c2.Close()
	if got, err := askPod(b); err != nil || got != "pod-b\n" {
		t.Fatalf("pod b across the reconnect: %q %v", got, err)
	}
	if err := c2.Request(zds.KeepRequest("uid-b"), nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c2.Request(zds.SnapshotSentRequest(), nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, err := askPod(b); err != nil || got != "pod-b\n" {
		t.Fatalf("kept pod b: %q %v", got, err)
	}
	c2.Close()
	c3 := f.accept()
	defer c3.Close()
	if err := c3.Request(zds.SnapshotSentRequest(), nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := askPod(b); return err != nil })
	if st := f.m.Stats(); st.Started != 2 || st.Failed != 1 || st.Connects != 3 {
		t.Errorf("stats %+v", st)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWaitTakenOver: a pod counts as taken over once a second socket (the
// next ztunnel's) listens on its ports next to this ztunnel's.
func TestWaitTakenOver(t *testing.T) {
	rootOnly(t)
	a := podNS(t, "handoff")
	f := newFixture(t)
	c := f.accept()
	defer c.Close()
	if err := c.Request(add("uid-a", "pod-a"), nsFile(t, a), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	ports := []uint16{15001}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if left := f.m.WaitTakenOver(ctx, ports); len(left) != 1 || left[0].Name != "pod-a" {
		t.Fatalf("WaitTakenOver with no successor = %v, want pod-a left", left)
	}
	successor, err := Sockets{NS: a}.Listen(context.Background(), netip.MustParseAddrPort("0.0.0.0:15001"))
	if err != nil {
		t.Fatalf("a second listener with SO_REUSEPORT: %v", err)
	}
	defer successor.Close()
	if n, err := Listeners(a); err != nil || n[15001] != 2 {
		t.Fatalf("Listeners = %v, %v; want 2 on 15001", n, err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if left := f.m.WaitTakenOver(ctx, ports); len(left) != 0 {
		t.Fatalf("WaitTakenOver with a successor = %v, want none left", left)
	}
}

// TestMigrateOnClose: connections waiting in the accept queue of a closing
// listener move to the other listener of its SO_REUSEPORT group instead of
// being reset, once MigrateOnClose is on; without it some are reset, which
// is what an old ztunnel closing its listeners would do to a rollout.
func TestMigrateOnClose(t *testing.T) {
	rootOnly(t)
	for _, tc := range []struct {
		name    string
		migrate bool
	}{{"off", false}, {"on", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := podNS(t, "migrate-"+tc.name)
			if tc.migrate {
				if err := MigrateOnClose(ns); err != nil {
					t.Fatal(err)
				}
			}
			s := Sockets{NS: ns}
			addr := netip.MustParseAddrPort("127.0.0.1:15001")
			old, err := s.Listen(context.Background(), addr)
			if err != nil {
				t.Fatal(err)
			}
			next, err := s.Listen(context.Background(), addr)
			if err != nil {
				t.Fatal(err)
			}
			defer next.Close()
			// Connections hash over both listeners; old never accepts, so
			// its share waits in its queue.
			const n = 40
			var clients []net.Conn
			defer func() {
				for _, c := range clients {
					c.Close()
				}
			}()
			for range n {
				c, err := s.Dial(context.Background(), addr, netip.AddrPort{})
				if err != nil {
					t.Fatal(err)
				}
				clients = append(clients, c)
			}
			old.Close()
			accepted := 0
			next.(*net.TCPListener).SetDeadline(time.Now().Add(time.Second))
			for {
				c, err := next.Accept()
				if err != nil {
					break
				}
				accepted++
				c.Close()
			}
			switch {
			case tc.migrate && accepted != n:
				t.Errorf("the remaining listener accepted %d of %d connections; the closed one's were not migrated", accepted, n)
			case !tc.migrate && accepted == n:
				t.Errorf("all %d connections reached the remaining listener without migration; the test shows nothing", n)
			}
		})
	}
}

// sickProxy is a proxy whose listener died.
type sickProxy struct{ err error }

func (sickProxy) Run(context.Context) error { return nil }
func (sickProxy) Ready() <-chan struct{}    { return nil }
func (p sickProxy) Health() error           { return p.err }

func TestReadyFailsWithAnUnhealthyPod(t *testing.T) {
	m, err := New(Config{NewProxy: func(PodInfo, *netns.NS) (Proxy, func(), error) { return nil, nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	m.connected, m.snapshot = true, true
	m.pods["ok"] = &pod{info: PodInfo{Namespace: "demo", Name: "ok"}, px: sickProxy{}}
	if err := m.Ready(); err != nil {
		t.Fatalf("healthy pods: %v", err)
	}
	died := errors.New("pod demo/sick: listener on 15006 stopped: accept: listener broke")
	m.pods["sick"] = &pod{info: PodInfo{Namespace: "demo", Name: "sick"}, px: sickProxy{died}}
	if err := m.Ready(); !errors.Is(err, died) {
		t.Errorf("Ready with a dead listener = %v, want it reported", err)
	}
}
