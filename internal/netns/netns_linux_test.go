package netns

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// rootOnly skips tests that change the machine's namespaces unless they may.
func rootOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("WEFT_ROOT_TESTS") == "" {
		t.Skip("creates network namespaces; set WEFT_ROOT_TESTS=1 (make test does) to run")
	}
	if os.Geteuid() != 0 {
		t.Skip("creates network namespaces; needs root")
	}
}

func testName(t *testing.T) string {
	return fmt.Sprintf("weft-netns-test-%d-%s", os.Getpid(), strings.ToLower(t.Name()))
}

// testNS creates a namespace for the test, removed at its end, and runs
// setup (when not nil) inside it.
func testNS(t *testing.T, setup func() error) *NS {
	t.Helper()
	rootOnly(t)
	name := testName(t)
	ns, err := Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close(); Delete(name) })
	if setup != nil {
		if err := ns.Do(setup); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

func threadNetnsID(t *testing.T) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestCreateDoDelete(t *testing.T) {
	ns := testNS(t, nil)
	name := testName(t)
	if _, err := Create(name); err == nil {
		t.Fatal("Create of an existing name succeeded")
	}
	id, err := ns.ID()
	if err != nil {
		t.Fatal(err)
	}
	if id == threadNetnsID(t) {
		t.Fatal("new namespace is the caller's own")
	}

	// Inside Do the thread is in the namespace; a listener opened there
	// belongs to it and is unreachable from the original namespace.
	var inside uint64
	var ln net.Listener
	err = ns.Do(func() error {
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
			return err
		}
		inside = st.Ino
		var err error
		ln, err = listenLoopback()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if inside != id {
		t.Fatalf("inside Do: netns %d, want %d", inside, id)
	}
	if got := threadNetnsID(t); got == id {
		t.Fatal("caller's thread is in the namespace after Do")
	}
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("listener inside the namespace reachable from outside")
	}
	var c net.Conn
	if err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", ln.Addr().String(), time.Second)
		return err
	}); err != nil {
		t.Fatalf("dialing inside the namespace: %v", err)
	}
	c.Close()

	// Netlink's socket lives in the namespace: it sees lo and nothing else.
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	links, err := h.LinkList()
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Fatalf("links in new namespace = %v, want only lo", links)
	}

	names, err := Names()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, name) {
		t.Fatalf("Names() = %v, missing %s", names, name)
	}

	ns.Close()
	if err := Delete(name); err != nil {
		t.Fatal(err)
	}
	if err := Delete(name); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if _, err := os.Stat(Path(name)); !os.IsNotExist(err) {
		t.Fatalf("netns file still there after Delete: %v", err)
	}
	if _, err := OpenName(name); err == nil {
		t.Fatal("OpenName after Delete succeeded")
	}
}

func TestDoReturnsFnError(t *testing.T) {
	ns := testNS(t, nil)
	want := fmt.Errorf("boom")
	if err := ns.Do(func() error { return want }); err != want {
		t.Fatalf("Do = %v, want %v", err, want)
	}
}

func TestOpenRejectsPlainFile(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "notns")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := Open(f.Name()); err == nil {
		t.Fatal("Open of a regular file succeeded")
	}
}

func TestInvalidNames(t *testing.T) {
	for _, name := range []string{"", ".", "..", "a/b"} {
		if _, err := Create(name); err == nil {
			t.Errorf("Create(%q) succeeded", name)
		}
		if err := Delete(name); err == nil {
			t.Errorf("Delete(%q) succeeded", name)
		}
	}
}

// TestDialContext: a connection DialContext opens is the namespace's: it
// reaches a listener inside, which the caller's namespace cannot.
func TestDialContext(t *testing.T) {
	ns, ln := loopbackNS(t)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("inside"))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ns.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("dialing from inside: %v", err)
	}
	defer c.Close()
	b, _ := io.ReadAll(c)
	if string(b) != "inside" {
		t.Errorf("read %q from the listener inside", b)
	}
	// The same address from the caller's namespace is another loopback:
	// whatever answers there (most likely nothing) is not the listener.
	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	if c, err := (&net.Dialer{}).DialContext(short, "tcp", ln.Addr().String()); err == nil {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		b, _ := io.ReadAll(c)
		c.Close()
		if string(b) == "inside" {
			t.Error("the caller's own namespace reached the listener inside")
		}
	}
}

// loopbackNS is testNS with its lo up and a listener on it, closed at the
// test's end.
func loopbackNS(t *testing.T) (*NS, net.Listener) {
	t.Helper()
	var ln net.Listener
	ns := testNS(t, func() error {
		var err error
		ln, err = listenLoopback()
		return err
	})
	t.Cleanup(func() { ln.Close() })
	return ns, ln
}

// listenLoopback brings up the current namespace's lo and listens on it;
// it runs inside Do.
func listenLoopback() (net.Listener, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return nil, err
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// TestCloseDuringDo closes an NS while goroutines keep entering it and
// reading its ID, as a cluster's teardown does while background lookups
// still dial from a node's namespace: no use reads the descriptor as it
// closes (the race detector checks), and every use after Close fails
// saying so instead of using whatever file reuses the number.
func TestCloseDuringDo(t *testing.T) {
	rootOnly(t)
	ns, err := Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var wg, started sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				if n == 1 {
					started.Done()
				}
				var err error
				if i%2 == 0 {
					err = ns.Do(func() error { return nil })
				} else {
					_, err = ns.ID()
				}
				if err != nil {
					if n == 0 {
						started.Done()
					}
					errs <- err
					return
				}
			}
		}()
	}
	started.Wait() // every goroutine is busy using the NS
	if err := ns.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !strings.Contains(err.Error(), "already closed") {
			t.Errorf("a use after Close: %v, want it refused as closed", err)
		}
	}
	if err := ns.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}
