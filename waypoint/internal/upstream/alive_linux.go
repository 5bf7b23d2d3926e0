package upstream

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/hbone"
)

// alive reports whether an idle connection can still carry a request: the
// peer has neither closed it nor sent bytes nobody asked for. It peeks at
// the socket without blocking; HBONE streams are asked for their state;
// other connections are taken to be alive, the retry on a fresh connection
// covers them.
func alive(c net.Conn) bool {
	if st, ok := c.(*hbone.Stream); ok {
		return streamAlive(st)
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ok = false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		// 0 bytes is the peer's FIN, more is unsolicited data; only
		// "nothing yet" means alive.
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = errors.Is(err, syscall.EAGAIN)
		return true
	})
	return ok && err == nil
}

// bytesAcked returns how many bytes the peer of a TCP connection has
// acknowledged (tcpi_bytes_acked); false for other connections.
func bytesAcked(c net.Conn) (uint64, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	cerr := rc.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if cerr != nil || err != nil {
		return 0, false
	}
	return info.Bytes_acked, true
}
