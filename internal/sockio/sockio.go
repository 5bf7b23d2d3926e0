// Package sockio reads and writes non-blocking sockets with raw system
// calls, waiting for them on the runtime's poller as the net package does.
// A read(2) or write(2) on a non-blocking socket returns at once, so the
// scheduler need not know of it; told of every call, as syscall.Syscall
// does, the runtime also wakes its monitor thread (sysmon) from its deep
// sleep whenever the process had gone idle, as it does between the
// requests of a light load, and the monitor then naps 20 µs at a time
// until it sees the process idle again: a futex wake-up and a few context
// switches per request, a fifth of a node proxy's CPU at 1000 requests a
// second.
//
// The HBONE engine uses it for the tunnel's socket (under TLS) and the
// application's a stream pumps; the waypoint for its plain upstream
// connections.
package sockio

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// RawConn returns w's socket, or nil when w is not a non-blocking socket
// (a pipe in a test, a file descriptor someone made blocking).
func RawConn(w any) syscall.RawConn {
	sc, ok := w.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	switch w.(type) {
	case *net.TCPConn, *net.UnixConn:
		return rc // the net package makes its sockets non-blocking
	}
	nonblocking := false
	if err := rc.Control(func(fd uintptr) {
		fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		nonblocking = err == nil && fl&unix.O_NONBLOCK != 0
	}); err != nil || !nonblocking {
		return nil
	}
	return rc
}

// Read is read(2) on the non-blocking socket fd.
func Read(fd int, p []byte) (int, error) { return rw(unix.SYS_READ, fd, p) }

// Write is write(2) on the non-blocking socket fd.
func Write(fd int, p []byte) (int, error) { return rw(unix.SYS_WRITE, fd, p) }

// IO is a net.Conn's Read and Write over its socket with raw system
// calls, honouring the connection's deadlines and wrapping errors as the
// net package does; a conn that is not a non-blocking socket keeps its
// own. One goroutine reads and one writes at a time. The zero IO is not
// usable: set it up with Init.
type IO struct {
	c  net.Conn
	rc syscall.RawConn // nil: c's own Read and Write

	rp      []byte
	rn      int
	rerr    error
	readFn  func(uintptr) bool
	wp      []byte
	wn      int
	werr    error
	writeFn func(uintptr) bool
}

// Init sets s up for c, in place (for an IO held by value).
func (s *IO) Init(c net.Conn) {
	s.c, s.rc = c, RawConn(c)
	s.readFn, s.writeFn = s.readOnce, s.writeOnce
}

// Read is net.Conn.Read.
func (s *IO) Read(p []byte) (int, error) {
	if s.rc == nil {
		return s.c.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	s.rp = p
	cerr := s.rc.Read(s.readFn)
	n, err := s.rn, s.rerr
	s.rp, s.rn, s.rerr = nil, 0, nil
	switch {
	case cerr != nil:
		return n, s.opError("read", cerr)
	case err != nil:
		return n, s.opError("read", os.NewSyscallError("read", err))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (s *IO) readOnce(fd uintptr) bool {
	s.rn, s.rerr = Read(int(fd), s.rp)
	return s.rerr != unix.EAGAIN
}

// Write is net.Conn.Write: all of p, or an error.
func (s *IO) Write(p []byte) (int, error) {
	if s.rc == nil {
		return s.c.Write(p)
	}
	s.wp = p
	cerr := s.rc.Write(s.writeFn)
	n, err := s.wn, s.werr
	s.wp, s.wn, s.werr = nil, 0, nil
	switch {
	case cerr != nil:
		return n, s.opError("write", cerr)
	case err != nil:
		return n, s.opError("write", os.NewSyscallError("write", err))
	}
	return n, nil
}

func (s *IO) writeOnce(fd uintptr) bool {
	for s.wn < len(s.wp) {
		n, err := Write(int(fd), s.wp[s.wn:])
		s.wn += n
		switch {
		case err == unix.EAGAIN:
			return false
		case err != nil:
			s.werr = err
			return true
		case n == 0:
			s.werr = io.ErrUnexpectedEOF
			return true
		}
	}
	return true
}

// opError wraps err as the net package wraps its connections' errors.
func (s *IO) opError(op string, err error) error {
	la := s.c.LocalAddr()
	return &net.OpError{Op: op, Net: la.Network(), Source: la, Addr: s.c.RemoteAddr(), Err: err}
}

// Conn is a net.Conn whose Read and Write are an IO's, for a connection
// handed to code that reads and writes it itself (net/http's HTTP/2
// transport, a TLS server). Its socket stays reachable (SyscallConn), as
// do a TCP connection's CloseWrite and SetLinger.
type Conn struct {
	net.Conn
	io IO
}

// NewConn returns c with Read and Write as raw system calls, or c itself
// when it is not a non-blocking socket.
func NewConn(c net.Conn) net.Conn {
	if RawConn(c) == nil {
		return c
	}
	w := &Conn{Conn: c}
	w.io.Init(c)
	return w
}

func (c *Conn) Read(p []byte) (int, error)  { return c.io.Read(p) }
func (c *Conn) Write(p []byte) (int, error) { return c.io.Write(p) }

// SyscallConn is the socket's.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.Conn.(syscall.Conn).SyscallConn() }

// SetLinger sets the socket's SO_LINGER, when it has one.
func (c *Conn) SetLinger(sec int) error {
	if l, ok := c.Conn.(interface{ SetLinger(int) error }); ok {
		return l.SetLinger(sec)
	}
	return errors.ErrUnsupported
}

// CloseWrite shuts the socket's sending side, when it has one.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
