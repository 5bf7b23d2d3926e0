package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DialTCP connects to dst with a socket made inside the namespace, bound to
// local's address when it is valid (its port is left to the kernel). control
// runs on the socket before it is bound, as net.Dialer's Control does.
//
// Only making the socket holds a thread in the namespace; the connection is
// then made like any other. A dial run whole in Do would hold its locked
// thread for as long as the connect waits, and the runtime starts another
// thread to run everything else meanwhile: a burst of connections would
// leave the process a thread (and its stacks) for every connection in
// flight, threads it never ends.
func (n *NS) DialTCP(ctx context.Context, dst netip.AddrPort, local netip.Addr, control func(network, address string, c syscall.RawConn) error) (*net.TCPConn, error) {
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	network := "tcp6"
	if dst.Addr().Is4() {
		network = "tcp4"
	}
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: network, Addr: net.TCPAddrFromAddrPort(dst), Err: err}
	}
	if local.IsValid() && local.Unmap().Is4() != dst.Addr().Is4() {
		return nil, opErr(fmt.Errorf("local address %s is not of %s's family", local, dst.Addr()))
	}
	var fd int
	err := n.Do(func() error {
		var err error
		fd, err = newSocket(network, dst, local, control)
		return err
	})
	if err != nil {
		return nil, opErr(err)
	}
	c, err := connect(ctx, fd, dst)
	if err != nil {
		return nil, opErr(err)
	}
	return c, nil
}

// newSocket makes a non-blocking TCP socket for network, runs control on it
// and binds it to local when that is valid.
func newSocket(network string, dst netip.AddrPort, local netip.Addr, control func(network, address string, c syscall.RawConn) error) (int, error) {
	family := unix.AF_INET6
	if network == "tcp4" {
		family = unix.AF_INET
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	if control != nil {
		if err := control(network, dst.String(), fdControl(fd)); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	if local.IsValid() {
		if err := unix.Bind(fd, sockaddr(netip.AddrPortFrom(local.Unmap(), 0), family)); err != nil {
			unix.Close(fd)
			return -1, os.NewSyscallError("bind", err)
		}
	}
	return fd, nil
}

// connect connects fd (which it owns) to dst, waiting in the runtime's
// poller, and returns it as a connection once established.
func connect(ctx context.Context, fd int, dst netip.AddrPort) (*net.TCPConn, error) {
	family := unix.AF_INET6
	if dst.Addr().Is4() {
		family = unix.AF_INET
	}
	err := unix.Connect(fd, sockaddr(dst, family))
	if err != nil && err != unix.EINPROGRESS && err != unix.EINTR {
		unix.Close(fd)
		return nil, os.NewSyscallError("connect", err)
	}
	f := os.NewFile(uintptr(fd), "tcp") // non-blocking: the poller waits for it
	defer f.Close()
	if err != nil {
		if err := awaitConnect(ctx, f); err != nil {
			return nil, err
		}
	}
	c, err := net.FileConn(f) // a copy of fd, now with its addresses
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// awaitConnect waits until f's connect ends (or ctx does) and returns its
// outcome.
func awaitConnect(ctx context.Context, f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	var soErr error
	werr := rc.Write(func(fd uintptr) bool {
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		switch {
		case err != nil:
			soErr = os.NewSyscallError("getsockopt", err)
		case v == int(unix.EINPROGRESS) || v == int(unix.EALREADY) || v == int(unix.EINTR):
			return false
		case v != 0:
			soErr = os.NewSyscallError("connect", syscall.Errno(v))
		default:
			// Writable with no error can still be a connect not yet
			// done on some kernels; the peer's address tells.
			if _, err := unix.Getpeername(int(fd)); errors.Is(err, unix.ENOTCONN) {
				return false
			}
		}
		return true
	})
	if werr != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return werr
	}
	return soErr
}

func sockaddr(ap netip.AddrPort, family int) unix.Sockaddr {
	if family == unix.AF_INET {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// fdControl is a syscall.RawConn for a socket not yet handed to the
// runtime: only Control, which control functions use, works.
type fdControl int

func (fd fdControl) Control(f func(fd uintptr)) error {
	f(uintptr(fd))
	return nil
}

func (fdControl) Read(func(fd uintptr) bool) error {
	return errors.New("netns: no reads on a socket being made")
}

func (fdControl) Write(func(fd uintptr) bool) error {
	return errors.New("netns: no writes on a socket being made")
}
