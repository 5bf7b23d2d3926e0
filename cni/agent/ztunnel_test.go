package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/pb/zdspb"
	"github.com/weftmesh/weft/internal/zds"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// testState is a fixed snapshot: pure data for the ZDS server.
type testState struct {
	mu      sync.Mutex
	items   func() []snapshotItem
	refused []string
}

func (s *testState) snapshot() []snapshotItem { return s.items() }
func (s *testState) snapshotRefused(uid string, _ error) {
	s.mu.Lock()
	s.refused = append(s.refused, uid)
	s.mu.Unlock()
}

// selfNetns duplicates this process's netns descriptor: a real netns fd.
func selfNetns(t testing.TB) *os.File {
	t.Helper()
	f, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func fdInode(t testing.TB, f *os.File) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// testZtunnel is a ztunnel stand-in over the real ZDS socket: it says
// hello and answers every request, NACKing the uids in nack.
type testZtunnel struct {
	c    *zds.Conn
	mu   sync.Mutex
	reqs []string // "add uid netns-inode", "keep uid", "del uid", "snapshot_sent"
	nack map[string]string
	got  chan string
	done chan error
}

func dialZtunnel(t testing.TB, path string, nack map[string]string) *testZtunnel {
	t.Helper()
	c, err := zds.Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SendHello(); err != nil {
		t.Fatal(err)
	}
	z := &testZtunnel{c: c, nack: nack, got: make(chan string, 100), done: make(chan error, 1)}
	go z.serve(t)
	t.Cleanup(z.close)
	return z
}

func (z *testZtunnel) serve(t testing.TB) {
	for {
		req, f, err := z.c.RecvRequest()
		if err != nil {
			z.done <- err
			return
		}
		line := zds.Kind(req)
		uid := ""
		switch p := req.Payload.(type) {
		case *zdspb.WorkloadRequest_Add:
			uid = p.Add.Uid
			line = fmt.Sprintf("add %s %d", uid, fdInode(t, f))
			f.Close()
		case *zdspb.WorkloadRequest_Keep:
			uid = p.Keep.Uid
			line = "keep " + uid
		case *zdspb.WorkloadRequest_Del:
			uid = p.Del.Uid
			line = "del " + uid
		}
		var ackErr error
		z.mu.Lock()
		if msg, ok := z.nack[uid]; ok && uid != "" && !hasPrefix(line, "del") {
			ackErr = errors.New(msg)
		}
		z.reqs = append(z.reqs, line)
		z.mu.Unlock()
		if err := z.c.SendAck(ackErr); err != nil {
			z.done <- err
			return
		}
		z.got <- line
	}
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

func (z *testZtunnel) close() { z.c.Close() }

// next waits for the next request the test ztunnel answered.
func (z *testZtunnel) next(t testing.TB) string {
	t.Helper()
	select {
	case l := <-z.got:
		return l
	case err := <-z.done:
		t.Fatalf("test ztunnel stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("gave up waiting for the next ZDS request")
	}
	return ""
}

func startZDS(t *testing.T, uid int, state snapshotter, synced <-chan struct{}) (*ztunnelServer, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ztunnel", "ztunnel.sock")
	s := newZtunnelServer(path, uid, discard, newMetrics(prometheus.NewRegistry()), state, synced, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	<-s.listening
	return s, path
}

// waitConnected waits until n ztunnels have their snapshot.
func waitConnected(t *testing.T, s *ztunnelServer, n int, z ...*testZtunnel) {
	t.Helper()
	for _, zt := range z {
		for l := zt.next(t); l != "snapshot_sent"; l = zt.next(t) {
		}
	}
	if got := s.connected(); got != n {
		t.Fatalf("%d ztunnels connected, want %d", got, n)
	}
}

func TestZDSSnapshotThenAddsAndDels(t *testing.T) {
	netnsFile := selfNetns(t)
	defer netnsFile.Close()
	ino := fdInode(t, netnsFile)
	state := &testState{items: func() []snapshotItem {
		dup, err := dupFile(netnsFile)
		if err != nil {
			t.Error(err)
		}
		return []snapshotItem{
			{uid: "uid-a", info: &zdspb.WorkloadInfo{Name: "a", Namespace: "ns", ServiceAccount: "sa"}, netns: dup},
			{uid: "uid-b"},
		}
	}}
	synced := make(chan struct{})
	s, path := startZDS(t, os.Getuid(), state, synced)

	z1 := dialZtunnel(t, path, map[string]string{"uid-x": "no such workload"})
	// No snapshot before the agent's state is complete.
	select {
	case l := <-z1.got:
		t.Fatalf("got %q before the initial sync", l)
	default:
	}
	close(synced)
	for _, want := range []string{fmt.Sprintf("add uid-a %d", ino), "keep uid-b", "snapshot_sent"} {
		if got := z1.next(t); got != want {
			t.Fatalf("snapshot: got %q, want %q", got, want)
		}
	}

	ctx := context.Background()
	add := func(uid string) error {
		dup, err := dupFile(netnsFile)
		if err != nil {
			t.Fatal(err)
		}
		defer dup.Close()
		return s.PodAdded(ctx, uid, &zdspb.WorkloadInfo{Name: uid, Namespace: "ns", ServiceAccount: "sa"}, dup)
	}
	if err := add("uid-c"); err != nil {
		t.Fatal(err)
	}
	if got := z1.next(t); got != fmt.Sprintf("add uid-c %d", ino) {
		t.Fatalf("got %q", got)
	}
	var nack *zds.NackError
	if err := add("uid-x"); !errors.As(err, &nack) || nack.Message != "no such workload" {
		t.Fatalf("PodAdded of a refused pod = %v, want the NACK", err)
	}
	z1.next(t)

	// A second ztunnel (an upgrade): it gets the snapshot, then the Adds;
	// Dels go to both.
	z2 := dialZtunnel(t, path, nil)
	waitConnected(t, s, 2, z2)
	if err := add("uid-d"); err != nil {
		t.Fatal(err)
	}
	if got := z2.next(t); got != fmt.Sprintf("add uid-d %d", ino) {
		t.Fatalf("newest ztunnel got %q", got)
	}
	if err := s.PodDeleted(ctx, "uid-c"); err != nil {
		t.Fatal(err)
	}
	if a, b := z1.next(t), z2.next(t); a != "del uid-c" || b != "del uid-c" {
		t.Fatalf("dels: %q, %q", a, b)
	}
	z1.mu.Lock()
	for _, l := range z1.reqs {
		if l == fmt.Sprintf("add uid-d %d", ino) {
			t.Errorf("the older ztunnel got an Add after a newer one connected")
		}
	}
	z1.mu.Unlock()

	// The newest goes away: Adds go to the older one again. The first try
	// may be taken by the dying connection and fail; the retry must not.
	z2.close()
	if err := add("uid-e"); err != nil {
		if errors.As(err, &nack) {
			t.Fatalf("a transport failure looks like a NACK: %v", err)
		}
		if err := add("uid-e"); err != nil {
			t.Fatalf("retry after the newest ztunnel left: %v", err)
		}
	}
	if got := z1.next(t); got != fmt.Sprintf("add uid-e %d", ino) {
		t.Fatalf("got %q", got)
	}
}

func TestZDSNoZtunnel(t *testing.T) {
	synced := make(chan struct{})
	close(synced)
	s, _ := startZDS(t, os.Getuid(), &testState{items: func() []snapshotItem { return nil }}, synced)
	f := selfNetns(t)
	defer f.Close()
	if err := s.PodAdded(context.Background(), "u", &zdspb.WorkloadInfo{Name: "n", Namespace: "ns", ServiceAccount: "sa"}, f); !errors.Is(err, ErrNoZtunnel) {
		t.Fatalf("PodAdded = %v, want ErrNoZtunnel", err)
	}
	if err := s.PodDeleted(context.Background(), "u"); err != nil {
		t.Fatalf("PodDeleted with no ztunnel = %v, want nil", err)
	}
}

func TestZDSRefusesOtherUIDs(t *testing.T) {
	synced := make(chan struct{})
	close(synced)
	_, path := startZDS(t, os.Getuid()+4242, &testState{items: func() []snapshotItem { return nil }}, synced)
	c, err := zds.Dial(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SendHello()
	// The agent closes without reading: EOF, or a reset for the unread hello.
	if req, _, err := c.RecvRequest(); err == nil || errors.Is(err, zds.ErrInvalid) {
		t.Fatalf("a peer with another UID got %v, %v; want the connection closed", req, err)
	}
}

func TestZDSSnapshotNack(t *testing.T) {
	f := selfNetns(t)
	defer f.Close()
	state := &testState{items: func() []snapshotItem {
		dup, _ := dupFile(f)
		return []snapshotItem{{uid: "uid-bad", info: &zdspb.WorkloadInfo{Name: "n", Namespace: "ns", ServiceAccount: "sa"}, netns: dup}}
	}}
	synced := make(chan struct{})
	close(synced)
	s, path := startZDS(t, os.Getuid(), state, synced)
	z := dialZtunnel(t, path, map[string]string{"uid-bad": "refused"})
	waitConnected(t, s, 1, z)
	state.mu.Lock()
	defer state.mu.Unlock()
	if len(state.refused) != 1 || state.refused[0] != "uid-bad" {
		t.Fatalf("refused = %v", state.refused)
	}
}

// dupFile duplicates an *os.File's descriptor.
func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}
