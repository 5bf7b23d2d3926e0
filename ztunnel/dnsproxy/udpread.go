package dnsproxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
)

// maxUDPQuery bounds a query read over UDP. RFC 1035 §2.3.4 limits a UDP
// message to 512 bytes; EDNS (RFC 6891 §6.2.3) lets a client advertise a
// larger size for the responses it accepts, not for its queries, and
// §6.2.5 recommends 4096 bytes as the size to start from. A query holds one
// question and an OPT record, so 4096 is ample; Istio's ztunnel reads its
// UDP queries into 4096 bytes too. A datagram that does not fit is answered
// with FORMERR, never parsed cut short: the parser trusts a section count
// only as far as the message goes, so a cut query could still parse.
const maxUDPQuery = 4096

// queryBufs are the buffers queries are read into, shared by every pod's
// server: a server waits for a datagram in the poller without one and takes
// one only for the time of a read, so an idle pod holds none.
var queryBufs = sync.Pool{New: func() any { b := make([]byte, maxUDPQuery); return &b }}

// udpReader reads the queries of one UDP socket; one goroutine owns it.
type udpReader struct {
	rc syscall.RawConn
}

func newUDPReader(pc net.PacketConn) (udpReader, error) {
	sc, ok := pc.(syscall.Conn)
	if !ok {
		return udpReader{}, fmt.Errorf("udp socket %T has no file descriptor", pc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return udpReader{}, err
	}
	return udpReader{rc: rc}, nil
}

// read waits for the next datagram and returns a copy of it, its sender,
// and whether it was larger than maxUDPQuery (then raw is its first
// maxUDPQuery bytes). Its errors are the socket's (net.ErrClosed once
// closed).
func (r udpReader) read() (raw []byte, from netip.AddrPort, truncated bool, err error) {
	raw, from, truncated, _, err = r.recv(true)
	return raw, from, truncated, err
}

// readQueued is read without waiting: ok is false when nothing is queued.
func (r udpReader) readQueued() (raw []byte, from netip.AddrPort, truncated, ok bool, err error) {
	return r.recv(false)
}

func (r udpReader) recv(wait bool) (raw []byte, from netip.AddrPort, truncated, ok bool, err error) {
	var rerr error
	read := func(fd uintptr) bool {
		bp := queryBufs.Get().(*[]byte)
		defer queryBufs.Put(bp)
		for {
			n, _, flags, sa, err := syscall.Recvmsg(int(fd), *bp, nil, 0)
			switch {
			case errors.Is(err, syscall.EINTR):
				continue
			case errors.Is(err, syscall.EAGAIN):
				// Nothing yet: wait in the poller, holding no buffer.
				return !wait
			case err != nil:
				rerr = os.NewSyscallError("recvmsg", err)
				return true
			}
			raw = append([]byte(nil), (*bp)[:n]...)
			from = sockaddrPort(sa)
			truncated = flags&syscall.MSG_TRUNC != 0
			ok = true
			return true
		}
	}
	if wait {
		err = r.rc.Read(read)
	} else {
		// Control, not Read: a read deadline that has passed (how the
		// server stops reading) would refuse even to look.
		err = r.rc.Control(func(fd uintptr) { read(fd) })
	}
	if err == nil {
		err = rerr
	}
	return raw, from, truncated, ok, err
}

func sockaddrPort(sa syscall.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *syscall.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *syscall.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

// leaveGroup takes a UDP socket bound with SO_REUSEPORT out of its
// group's share of new datagrams: connected to its own address, it matches
// only datagrams from that address, which nothing sends, so the kernel
// gives every new query to the group's other sockets; what the socket has
// queued stays to be read, and it can still answer anyone.
func leaveGroup(pc net.PacketConn) error {
	sc, ok := pc.(syscall.Conn)
	if !ok {
		return fmt.Errorf("udp socket %T has no file descriptor", pc)
	}
	la, ok := pc.LocalAddr().(*net.UDPAddr)
	if !ok {
		return fmt.Errorf("udp socket with local address %v", pc.LocalAddr())
	}
	ap := la.AddrPort()
	var sa syscall.Sockaddr
	if ap.Addr().Unmap().Is4() {
		sa = &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	} else {
		sa = &syscall.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	if err := rc.Control(func(fd uintptr) { cerr = syscall.Connect(int(fd), sa) }); err != nil {
		return err
	}
	if cerr != nil {
		return os.NewSyscallError("connect", cerr)
	}
	return nil
}
