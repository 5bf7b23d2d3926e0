package proxy

import (
	"net"
	"syscall"
	"testing"
)

// TestSlotConnSocket: an inbound connection under the connection cap still
// offers its socket, which the HBONE engine reads and writes directly, and
// gives its slot back once however often it is closed.
func TestSlotConnSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			c.Read(make([]byte, 1))
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	s := &slots{}
	s.n.Add(1)
	sc := &slotConn{Conn: c, s: s}
	rc, err := sc.SyscallConn()
	if err != nil || rc == nil {
		t.Fatalf("SyscallConn = %v, %v", rc, err)
	}
	var fd uintptr
	if err := rc.Control(func(f uintptr) { fd = f }); err != nil || fd == 0 {
		t.Fatalf("Control: fd %d, %v", fd, err)
	}
	sc.Close()
	sc.Close()
	if n := s.n.Load(); n != 0 {
		t.Fatalf("%d slots held after close; want 0", n)
	}
	p1, p2 := net.Pipe()
	defer p2.Close()
	if _, err := (&slotConn{Conn: p1, s: &slots{}}).SyscallConn(); err == nil {
		t.Fatal("a pipe's slotConn offered a socket")
	}
	var _ syscall.Conn = sc
}
