package zds

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/weftmesh/weft/internal/pb/zdspb"
)

// pair returns a connected agent-side and ztunnel-side Conn over a real
// socket file made by Listen and Dial.
func pair(t testing.TB) (agent, ztunnel *Conn) {
	t.Helper()
	l, err := Listen(filepath.Join(t.TempDir(), "ztunnel", "ztunnel.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	ztunnel, err = Dial(context.Background(), l.Path())
	if err != nil {
		t.Fatal(err)
	}
	agent = <-accepted
	if agent == nil {
		t.FailNow()
	}
	t.Cleanup(func() { agent.Close(); ztunnel.Close() })
	return agent, ztunnel
}

// openNetns opens this process's network namespace: a real netns
// descriptor, without needing root.
func openNetns(t testing.TB) *os.File {
	t.Helper()
	f, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func inode(t testing.TB, f *os.File) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// openFDs counts this process's open descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func info(name string) *zdspb.WorkloadInfo {
	return &zdspb.WorkloadInfo{Name: name, Namespace: "default", ServiceAccount: "sa"}
}

func TestSessionOverSocket(t *testing.T) {
	agent, zt := pair(t)
	netns := openNetns(t)

	if err := zt.SendHello(); err != nil {
		t.Fatal(err)
	}
	h, err := agent.RecvHello(HelloTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if h.GetVersion() != zdspb.Version_V1 {
		t.Fatalf("hello version = %v", h.GetVersion())
	}

	type step struct {
		req   *zdspb.WorkloadRequest
		netns *os.File
		nack  error // what the test ztunnel answers
	}
	steps := []step{
		{req: AddRequest("uid-1", info("a")), netns: netns},
		{req: KeepRequest("uid-2")},
		{req: SnapshotSentRequest()},
		{req: AddRequest("uid-3", info("c")), netns: netns, nack: errors.New("no workload for uid-3")},
		{req: DelRequest("uid-1")},
	}
	done := make(chan error, 1)
	go func() {
		// The test ztunnel: check every request arrives as sent, then answer.
		for _, s := range steps {
			got, f, err := zt.RecvRequest()
			if err != nil {
				done <- err
				return
			}
			if diff := cmp.Diff(s.req, got, protocmp.Transform()); diff != "" {
				done <- errors.New("request mismatch (-want +got):\n" + diff)
				return
			}
			if (f != nil) != (s.netns != nil) {
				done <- errors.New("netns presence mismatch for " + Kind(got))
				return
			}
			if f != nil {
				if inode(t, f) != inode(t, s.netns) {
					done <- errors.New("received a different netns")
				}
				f.Close()
			}
			if err := zt.SendAck(s.nack); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for _, s := range steps {
		err := agent.Request(s.req, s.netns, RequestTimeout)
		switch {
		case s.nack == nil && err != nil:
			t.Fatalf("%s: %v", Kind(s.req), err)
		case s.nack != nil:
			var nack *NackError
			if !errors.As(err, &nack) || nack.Message != s.nack.Error() {
				t.Fatalf("%s: got %v, want NACK %q", Kind(s.req), err, s.nack)
			}
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// rawSend writes a crafted datagram with the given descriptors, bypassing
// the sender-side checks.
func rawSend(t testing.TB, c *Conn, b []byte, fds []int) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.uc.WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatal(err)
	}
}

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRecvRequestRejects(t *testing.T) {
	netns := openNetns(t)
	regular, err := os.Create(filepath.Join(t.TempDir(), "not-a-netns"))
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	ns, reg := int(netns.Fd()), int(regular.Fd())
	add := marshal(t, AddRequest("uid-1", info("a")))

	tests := []struct {
		name  string
		data  []byte
		fds   []int
		fatal bool // connection unusable afterwards (truncation)
		want  string
	}{
		{name: "add without fd", data: add, want: "want exactly 1"},
		{name: "add with two fds", data: add, fds: []int{ns, ns}, want: "carries 2 file descriptors"},
		{name: "add with non-netns fd", data: add, fds: []int{reg}, want: "not a network namespace"},
		{name: "del with fd", data: marshal(t, DelRequest("uid-1")), fds: []int{ns}, want: "want none"},
		{name: "keep with fd", data: marshal(t, KeepRequest("uid-1")), fds: []int{ns}, want: "want none"},
		{name: "snapshot_sent with fd", data: marshal(t, SnapshotSentRequest()), fds: []int{ns}, want: "want none"},
		{name: "add without workload info", data: marshal(t, AddRequest("uid-1", nil)), fds: []int{ns}, want: "without workload_info"},
		{name: "del without uid", data: marshal(t, DelRequest("")), want: "without a uid"},
		{name: "no payload", data: []byte{0x20, 0x01}, want: "without a payload"},
		{name: "garbage", data: []byte{0xff, 0xff, 0xff}, want: "decoding WorkloadRequest"},
		{name: "too many fds", data: add, fds: []int{ns, ns, ns, ns, ns, ns, ns, ns, ns}, fatal: true, want: "ancillary data truncated"},
		{name: "datagram over 1 KiB", data: append([]byte{0x0a, 0x90, 0x0f}, make([]byte, 1936)...), fatal: true, want: "longer than 1024 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agent, zt := pair(t)
			before := openFDs(t)
			rawSend(t, agent, tt.data, tt.fds)
			req, f, err := zt.RecvRequest()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("RecvRequest = %v, %v, %v; want an error containing %q", req, f, err, tt.want)
			}
			if f != nil {
				t.Errorf("a file came with the error")
			}
			if errors.Is(err, ErrInvalid) == tt.fatal {
				t.Errorf("errors.Is(err, ErrInvalid) = %v, want %v", !tt.fatal, !tt.fatal)
			}
			if got := openFDs(t); got != before {
				t.Errorf("open descriptors %d after the bad message, %d before: a received fd leaked", got, before)
			}
			if tt.fatal {
				return
			}
			// The connection still works: a valid request follows.
			rawSend(t, agent, marshal(t, DelRequest("uid-9")), nil)
			req, _, err = zt.RecvRequest()
			if err != nil || req.GetDel().GetUid() != "uid-9" {
				t.Fatalf("next request = %v, %v", req, err)
			}
		})
	}
}

func TestSendChecks(t *testing.T) {
	agent, _ := pair(t)
	netns := openNetns(t)
	tests := []struct {
		name  string
		req   *zdspb.WorkloadRequest
		netns *os.File
		want  string
	}{
		{"add without netns", AddRequest("u", info("a")), nil, "want exactly 1"},
		{"del with netns", DelRequest("u"), netns, "want none"},
		{"oversized add", AddRequest("u", info(strings.Repeat("x", 1100))), netns, "exceed the 1024-byte"},
	}
	for _, tt := range tests {
		if err := agent.SendRequest(tt.req, tt.netns); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: SendRequest = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
}

func TestHello(t *testing.T) {
	t.Run("wrong version", func(t *testing.T) {
		agent, zt := pair(t)
		rawSend(t, zt, marshal(t, &zdspb.ZdsHello{Version: 7}), nil)
		if _, err := agent.RecvHello(HelloTimeout); !errors.Is(err, ErrInvalid) {
			t.Fatalf("RecvHello = %v, want ErrInvalid", err)
		}
	})
	t.Run("silent peer", func(t *testing.T) {
		agent, _ := pair(t)
		if _, err := agent.RecvHello(20 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("RecvHello = %v, want a deadline error", err)
		}
	})
	t.Run("peer gone", func(t *testing.T) {
		agent, zt := pair(t)
		zt.Close()
		if _, err := agent.RecvHello(HelloTimeout); !errors.Is(err, io.EOF) {
			t.Fatalf("RecvHello = %v, want EOF", err)
		}
	})
}

func TestRequestDeadline(t *testing.T) {
	agent, _ := pair(t) // the peer never answers
	err := agent.Request(DelRequest("u"), nil, 20*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Request = %v, want a deadline error", err)
	}
}

func TestSendAckLongOrInvalidError(t *testing.T) {
	agent, zt := pair(t)
	for _, msg := range []string{strings.Repeat("é", 2000), "bad \xff utf-8"} {
		if err := zt.SendAck(errors.New(msg)); err != nil {
			t.Fatalf("SendAck(%.20q...): %v", msg, err)
		}
		var nack *NackError
		if err := agent.RecvAck(); !errors.As(err, &nack) || nack.Message == "" {
			t.Fatalf("RecvAck = %v, want a NACK", err)
		}
	}
}

func TestRecvAckRejects(t *testing.T) {
	agent, zt := pair(t)
	rawSend(t, zt, []byte{0x10, 0x01}, nil) // only an unknown field: no ack
	if err := agent.RecvAck(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("RecvAck of a response without ack = %v, want ErrInvalid", err)
	}
}

func TestProbe(t *testing.T) {
	t.Run("alive", func(t *testing.T) {
		agent, _ := pair(t)
		if err := agent.Probe(ProbeWait); err != nil {
			t.Fatalf("Probe = %v", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		agent, zt := pair(t)
		zt.Close()
		if err := agent.Probe(ProbeWait); !errors.Is(err, io.EOF) {
			t.Fatalf("Probe = %v, want EOF", err)
		}
	})
	t.Run("unsolicited data", func(t *testing.T) {
		agent, zt := pair(t)
		if err := zt.SendAck(nil); err != nil {
			t.Fatal(err)
		}
		if err := agent.Probe(ProbeWait); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Probe = %v, want ErrInvalid", err)
		}
	})
}

func TestPeerCred(t *testing.T) {
	agent, _ := pair(t)
	cred, err := agent.PeerCred()
	if err != nil {
		t.Fatal(err)
	}
	if int(cred.Uid) != os.Getuid() || int(cred.Pid) != os.Getpid() {
		t.Fatalf("peer cred = %+v, want uid %d pid %d", cred, os.Getuid(), os.Getpid())
	}
}

func TestListen(t *testing.T) {
	dir := t.TempDir()
	t.Run("stale socket replaced", func(t *testing.T) {
		path := filepath.Join(dir, "stale.sock")
		ul, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		ul.SetUnlinkOnClose(false)
		ul.Close()
		l, err := Listen(path)
		if err != nil {
			t.Fatalf("Listen over a stale socket: %v", err)
		}
		l.Close()
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket file left after Close: %v", err)
		}
	})
	t.Run("not a socket", func(t *testing.T) {
		path := filepath.Join(dir, "file")
		if err := os.WriteFile(path, []byte("keep me"), 0o600); err != nil {
			t.Fatal(err)
		}
		if l, err := Listen(path); err == nil {
			l.Close()
			t.Fatal("Listen replaced a regular file")
		}
		if b, _ := os.ReadFile(path); string(b) != "keep me" {
			t.Fatal("the regular file was changed")
		}
	})
}

func TestCheckNetns(t *testing.T) {
	if err := CheckNetns(int(openNetns(t).Fd())); err != nil {
		t.Errorf("netns: %v", err)
	}
	uts, err := os.Open("/proc/self/ns/uts")
	if err != nil {
		t.Fatal(err)
	}
	defer uts.Close()
	if err := CheckNetns(int(uts.Fd())); !errors.Is(err, ErrInvalid) {
		t.Errorf("uts namespace: %v, want ErrInvalid", err)
	}
	if err := CheckNetns(int(os.Stdin.Fd())); err == nil {
		t.Errorf("stdin accepted as a netns")
	}
}
