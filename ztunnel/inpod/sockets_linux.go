package inpod

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/podnet"
	"github.com/weftmesh/weft/ztunnel/proxy"
)

// Sockets opens ztunnel's sockets inside a pod's network namespace:
// listeners with SO_REUSEPORT (so an old and a new ztunnel can overlap) and
// upstream connections, all with the packet mark.
type Sockets struct {
	NS *netns.NS
}

// Listen listens on addr inside the pod.
func (s Sockets) Listen(ctx context.Context, addr netip.AddrPort) (net.Listener, error) {
	var ln net.Listener
	err := s.NS.Do(func() error {
		lc := net.ListenConfig{Control: control(true)}
		var err error
		ln, err = lc.Listen(ctx, "tcp", addr.String())
		return err
	})
	return ln, err
}

// ListenPacket opens a UDP socket on addr inside the pod (the DNS proxy's).
func (s Sockets) ListenPacket(ctx context.Context, addr netip.AddrPort) (net.PacketConn, error) {
	var pc net.PacketConn
	err := s.NS.Do(func() error {
		lc := net.ListenConfig{Control: control(true)}
		var err error
		pc, err = lc.ListenPacket(ctx, "udp", addr.String())
		return err
	})
	return pc, err
}

// DialNetwork connects to dst over network ("tcp" or "udp") from inside
// the pod, with the mark: the DNS proxy's upstream queries, which the
// pod's rules then neither redirect nor mix with the app's own DNS flows.
func (s Sockets) DialNetwork(ctx context.Context, network string, dst netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := s.NS.Do(func() error {
		d := net.Dialer{Control: control(false)}
		var err error
		c, err = d.DialContext(ctx, network, dst.String())
		return err
	})
	return c, err
}

// Dial connects to dst from inside the pod. With src valid, the socket is
// IP_TRANSPARENT and bound to src's address (its port is left to the
// kernel), so the app sees the original client's address: the pod's rules
// mark the connection (0x539 → connmark 0x111) and route the app's replies
// back to this socket. A thread is in the pod's namespace only while the
// socket is made, not while it connects.
func (s Sockets) Dial(ctx context.Context, dst, src netip.AddrPort) (net.Conn, error) {
	ctl := control(false)
	var local netip.Addr
	if src.Addr().IsValid() {
		local = src.Addr().Unmap()
		if local.Is4() != dst.Addr().Unmap().Is4() {
			return nil, fmt.Errorf("%w: %s and %s are of different families", proxy.ErrSourceNotBound, local, dst.Addr())
		}
		ctl = transparentControl(local.Is4())
	}
	c, err := s.NS.DialTCP(ctx, dst, local, ctl)
	if err != nil {
		if local.IsValid() && bindRefused(err) {
			err = fmt.Errorf("%w: %w", proxy.ErrSourceNotBound, err)
		}
		return nil, err
	}
	return c, nil
}

// bindRefused reports whether a dial failed making or binding its socket,
// before any packet left: what a retry without the source address fixes.
func bindRefused(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		var se *os.SyscallError
		if errors.As(err, &se) {
			switch se.Syscall {
			case "setsockopt", "bind":
				return true
			}
		}
	}
	return errors.Is(err, unix.EADDRNOTAVAIL)
}

// transparentControl sets the mark and IP_TRANSPARENT, which lets the
// socket bind an address the pod does not have (CAP_NET_ADMIN).
func transparentControl(v4 bool) func(network, address string, c syscall.RawConn) error {
	mark := control(false)
	return func(network, address string, c syscall.RawConn) error {
		if err := mark(network, address, c); err != nil {
			return err
		}
		var serr error
		err := c.Control(func(fd uintptr) {
			if v4 {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
			}
			if serr != nil {
				serr = os.NewSyscallError("setsockopt", fmt.Errorf("IP_TRANSPARENT (needs CAP_NET_ADMIN): %w", serr))
			}
		})
		if err != nil {
			return err
		}
		return serr
	}
}

// control sets the mark (and SO_REUSEPORT on listeners).
func control(listener bool) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(podnet.ZtunnelMark)); serr != nil {
				serr = fmt.Errorf("setting SO_MARK %#x (needs CAP_NET_ADMIN): %w", podnet.ZtunnelMark, serr)
				return
			}
			if listener {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}
}

// OrigDst returns the destination a REDIRECTed connection was sent to
// (SO_ORIGINAL_DST, or IP6T_SO_ORIGINAL_DST for IPv6).
func OrigDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: %T is not a TCP connection", c)
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	local := tc.LocalAddr().(*net.TCPAddr).AddrPort().Addr()
	var out netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		if local.Is4() || local.Is4In6() {
			var sa unix.RawSockaddrInet4
			size := uint32(unsafe.Sizeof(sa))
			serr = getsockopt(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST, unsafe.Pointer(&sa), &size)
			if serr == nil {
				out = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:]))
			}
			return
		}
		var sa unix.RawSockaddrInet6
		size := uint32(unsafe.Sizeof(sa))
		serr = getsockopt(int(fd), unix.SOL_IPV6, ip6tSOOriginalDst, unsafe.Pointer(&sa), &size)
		if serr == nil {
			out = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:]))
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w (was the connection redirected?)", err)
	}
	return out, nil
}

func getsockopt(fd, level, name int, val unsafe.Pointer, size *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(name), uintptr(val), uintptr(unsafe.Pointer(size)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h.
const ip6tSOOriginalDst = 80

// migrateReqSysctl is net.ipv4.tcp_migrate_req (Linux 5.14), per network
// namespace.
const migrateReqSysctl = "/proc/sys/net/ipv4/tcp_migrate_req"

// MigrateOnClose turns on net.ipv4.tcp_migrate_req in ns: when a listener
// of a SO_REUSEPORT group closes, the connections in its accept queue and
// the handshakes in progress move to another listener of the group instead
// of being reset. When an old ztunnel closes its listeners after a new one
// has bound its own, no connection that reached the old one is lost. It
// needs /proc/sys writable and CAP_NET_ADMIN; without it a connection that
// arrives in the instant the old listener closes is reset.
func MigrateOnClose(ns *netns.NS) error {
	return ns.Do(func() error {
		// /proc/sys/net resolves to the namespace of the thread that opens it.
		b, err := os.ReadFile(migrateReqSysctl)
		if err == nil && strings.TrimSpace(string(b)) == "1" {
			return nil
		}
		if err := os.WriteFile(migrateReqSysctl, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("setting net.ipv4.tcp_migrate_req: %w", err)
		}
		return nil
	})
}

// Listeners counts the TCP sockets listening in ns by local port (IPv4 and
// IPv6, any process), from the namespace's /proc/net/tcp and tcp6 as the
// thread that entered it sees them.
func Listeners(ns *netns.NS) (map[uint16]int, error) {
	counts := map[uint16]int{}
	err := ns.Do(func() error {
		for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
			if err := countListeners(f, counts); err != nil {
				return err
			}
		}
		return nil
	})
	return counts, err
}

// tcpListen is TCP_LISTEN in the st column of /proc/net/tcp.
const tcpListen = "0A"

func countListeners(path string, counts map[uint16]int) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) && strings.HasSuffix(path, "6") {
		return nil // no IPv6 in this kernel
	}
	if err != nil {
		return fmt.Errorf("counting listeners: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st ...; local_address is HEXIP:HEXPORT.
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != tcpListen {
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil {
			continue
		}
		counts[uint16(port)]++
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("counting listeners in %s: %w", path, err)
	}
	return nil
}
