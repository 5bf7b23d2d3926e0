package hbone

import (
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The engine reads and writes its sockets (the tunnel's, under TLS, and the
// application's a stream pumps) with raw system calls, waiting for them on
// the runtime's poller as the net package does. A read(2) or write(2) on a
// non-blocking socket returns at once, so the scheduler need not know of
// it; told of every call, as syscall.Syscall does, the runtime also wakes
// its monitor thread (sysmon) from its deep sleep whenever the process had
// gone idle, as it does between the requests of a light load, and the
// monitor then naps 20 µs at a time until it sees the process idle again:
// a futex wake-up and a few context switches per request, a fifth of a
// node proxy's CPU at 1000 requests a second.

// rawConn returns w's socket, or nil when w is not a non-blocking socket
// (a pipe in a test, a file descriptor someone made blocking).
func rawConn(w any) syscall.RawConn {
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

// rawRead is read(2) on the non-blocking socket fd.
func rawRead(fd int, p []byte) (int, error) { return rawRW(unix.SYS_READ, fd, p) }

// rawWrite is write(2) on the non-blocking socket fd.
func rawWrite(fd int, p []byte) (int, error) { return rawRW(unix.SYS_WRITE, fd, p) }

// socketIO is a net.Conn's Read and Write over its socket with raw system
// calls, honouring the connection's deadlines and wrapping errors as the
// net package does. One goroutine reads and one writes at a time
// (crypto/tls holds its input and output locks around them).
type socketIO struct {
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

func newSocketIO(c net.Conn) *socketIO {
	s := &socketIO{}
	s.init(c)
	return s
}

// init sets s up for c, in place (a batchConn holds its socketIO).
func (s *socketIO) init(c net.Conn) {
	s.c, s.rc = c, rawConn(c)
	s.readFn, s.writeFn = s.readOnce, s.writeOnce
}

// read is net.Conn.Read.
func (s *socketIO) read(p []byte) (int, error) {
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

func (s *socketIO) readOnce(fd uintptr) bool {
	s.rn, s.rerr = rawRead(int(fd), s.rp)
	return s.rerr != unix.EAGAIN
}

// write is net.Conn.Write: all of p, or an error.
func (s *socketIO) write(p []byte) (int, error) {
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

func (s *socketIO) writeOnce(fd uintptr) bool {
	for s.wn < len(s.wp) {
		n, err := rawWrite(int(fd), s.wp[s.wn:])
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
func (s *socketIO) opError(op string, err error) error {
	la := s.c.LocalAddr()
	return &net.OpError{Op: op, Net: la.Network(), Source: la, Addr: s.c.RemoteAddr(), Err: err}
}
