package netns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestDialTCP: the socket is the namespace's (it reaches a listener there),
// control runs on it, it binds the local address asked for, and a refused
// connection or a local address of the other family is an error that says
// so.
func TestDialTCP(t *testing.T) {
	ns, ln := loopbackNS(t)
	peers := make(chan net.Addr, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			peers <- c.RemoteAddr()
			c.Write([]byte("inside"))
			c.Close()
		}
	}()
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	var marked bool
	mark := func(network, address string, c syscall.RawConn) error {
		if network != "tcp4" || address != dst.String() {
			t.Errorf("control got (%s, %s), want (tcp4, %s)", network, address, dst)
		}
		return c.Control(func(fd uintptr) {
			marked = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, 0x539) == nil
		})
	}
	c, err := ns.DialTCP(ctx, dst, netip.Addr{}, mark)
	if err != nil {
		t.Fatal(err)
	}
	if !marked {
		t.Error("control did not run on the socket")
	}
	if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); got != dst {
		t.Errorf("RemoteAddr %s, want %s", got, dst)
	}
	buf := make([]byte, 6)
	if _, err := c.Read(buf); err != nil || string(buf) != "inside" {
		t.Errorf("read %q (%v) from the listener inside", buf, err)
	}
	c.Close()
	<-peers

	c, err = ns.DialTCP(ctx, dst, netip.MustParseAddr("127.0.0.2"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if got := (<-peers).(*net.TCPAddr).AddrPort().Addr(); got != netip.MustParseAddr("127.0.0.2") {
		t.Errorf("the listener saw %s, want the bound 127.0.0.2", got)
	}

	ln.Close()
	_, err = ns.DialTCP(ctx, dst, netip.Addr{}, nil)
	var op *net.OpError
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &op) || op.Op != "dial" {
		t.Errorf("dialing a closed port: %v, want a dial error of ECONNREFUSED", err)
	}
	if _, err := ns.DialTCP(ctx, dst, netip.MustParseAddr("::1"), nil); err == nil || !strings.Contains(err.Error(), "family") {
		t.Errorf("an IPv6 local address for an IPv4 destination: %v, want an error about the family", err)
	}
}

// threads returns the number of the process's threads.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

// TestDialTCPHoldsNoThread: dials waiting for an answer that never comes
// hold no thread each (a dial run whole in the namespace does: the
// runtime starts a thread for every one in flight, and keeps them), and
// end with the context's error.
func TestDialTCPHoldsNoThread(t *testing.T) {
	ns := testNS(t, func() error {
		// Packets to 10.99.0.2 leave by a veth for a MAC address no one
		// has: its peer drops them.
		link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "hole0"}, PeerName: "hole1"}
		if err := netlink.LinkAdd(link); err != nil {
			return err
		}
		for _, name := range []string{"hole0", "hole1"} {
			l, err := netlink.LinkByName(name)
			if err == nil {
				err = netlink.LinkSetUp(l)
			}
			if err != nil {
				return err
			}
		}
		hole, err := netlink.LinkByName("hole0")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("10.99.0.1/24")
		if err := netlink.AddrAdd(hole, addr); err != nil {
			return err
		}
		mac, _ := net.ParseMAC("02:00:00:00:00:99")
		return netlink.NeighAdd(&netlink.Neigh{LinkIndex: hole.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT, IP: net.ParseIP("10.99.0.2"), HardwareAddr: mac})
	})
	const n = 40
	before := threads(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			c, err := ns.DialTCP(ctx, netip.MustParseAddrPort("10.99.0.2:80"), netip.Addr{}, nil)
			if err == nil {
				c.Close()
			}
			errs <- err
		})
	}
	time.Sleep(500 * time.Millisecond) // every dial is waiting by now
	if grown := threads(t) - before; grown >= n/4 {
		t.Errorf("%d dials in flight added %d threads", n, grown)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a dial that got no answer: %v, want the context's deadline", err)
		}
	}
}
