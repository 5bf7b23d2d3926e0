package sockio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/nettest"
)

// TestSocketIOLikeNet: a IO over a TCP socket reads and writes as the
// net package's own conn does: all of a write larger than the socket's
// buffers (it waits for room), EOF at the peer's close, the deadline's
// timeout error, and a reset as a *net.OpError around the system call's
// error.
func TestIOLikeNet(t *testing.T) {
	a, b := nettest.TCPPair(t)
	var s IO
	s.Init(a)
	if s.rc == nil {
		t.Fatal("a TCP socket got no raw socket")
	}
	// Larger than loopback's buffers, so the write waits on the poller.
	msg := make([]byte, 16<<20)
	for i := range msg {
		msg[i] = byte(i * 13)
	}
	got := make(chan []byte, 1)
	go func() {
		buf := make([]byte, len(msg))
		_, err := io.ReadFull(b, buf)
		if err != nil {
			t.Error(err)
		}
		got <- buf
	}()
	if n, err := s.Write(msg); n != len(msg) || err != nil {
		t.Fatalf("write = %d, %v; want %d, nil", n, err, len(msg))
	}
	if !bytes.Equal(<-got, msg) {
		t.Fatal("the bytes arrived changed")
	}

	if _, err := b.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := s.Read(buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read = %q, %v", buf[:n], err)
	}

	a.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := s.Read(buf)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline = %v; want a net.Error timeout", err)
	}
	a.SetReadDeadline(time.Time{})

	b.CloseWrite()
	if n, err := s.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer's FIN = %d, %v; want 0, EOF", n, err)
	}

	b.SetLinger(0)
	b.Close() // RST
	time.Sleep(20 * time.Millisecond)
	var werr error
	for range 10 { // the first write may land before the reset is seen
		if _, werr = s.Write([]byte("x")); werr != nil {
			break
		}
	}
	var oe *net.OpError
	var se *os.SyscallError
	if !errors.As(werr, &oe) || oe.Op != "write" || !errors.As(werr, &se) || !errors.Is(werr, unix.ECONNRESET) && !errors.Is(werr, unix.EPIPE) {
		t.Fatalf("write to a reset socket = %#v; want a *net.OpError around ECONNRESET or EPIPE", werr)
	}

	a.Close()
	if _, err := s.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read of a closed conn = %v; want net.ErrClosed", err)
	}
}

// TestRawConnOnlyNonBlocking: a descriptor in blocking mode is never read
// with raw system calls (one would hold its thread's processor while it
// blocks); a conn without a socket has none.
func TestRawConnOnlyNonBlocking(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	blocking := os.NewFile(uintptr(fds[0]), "blocking")
	defer blocking.Close()
	defer unix.Close(fds[1])
	if _, ok := any(blocking).(syscall.Conn); !ok {
		t.Fatal("*os.File is not a syscall.Conn")
	}
	if RawConn(blocking) != nil {
		t.Error("RawConn took a blocking descriptor")
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	var pipeIO IO
	pipeIO.Init(p1)
	if RawConn(p1) != nil || pipeIO.rc != nil {
		t.Error("RawConn of a net.Pipe")
	}
	a, _ := nettest.TCPPair(t)
	if RawConn(a) == nil {
		t.Error("RawConn of a TCP socket is nil")
	}
}

// TestConn: a Conn over a TCP socket reads, writes and half-closes as the
// socket does, and keeps the socket reachable; anything else is returned
// as it is.
func TestConn(t *testing.T) {
	a, b := nettest.TCPPair(t)
	c := NewConn(a)
	if _, ok := c.(*Conn); !ok {
		t.Fatalf("NewConn of a TCP socket = %T; want *Conn", c)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("the peer read %q, %v", buf, err)
	}
	b.Write([]byte("pong"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("the peer's read after CloseWrite = %d, %v; want 0, EOF", n, err)
	}
	if RawConn(c) == nil {
		t.Error("a Conn hides its socket")
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if NewConn(p1) != p1 {
		t.Error("NewConn wrapped a net.Pipe")
	}
}
