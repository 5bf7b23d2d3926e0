package redirect

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weftmesh/weft/internal/netns"
)

// Test topology helpers: namespaces come from internal/netns; links and
// addresses are set with iproute2. They never touch the root namespace's
// links, routes or addresses.

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Getenv("WEFT_ROOT_TESTS") == "" {
		t.Skip("root-only test: set WEFT_ROOT_TESTS=1 and run as root (make test does)")
	}
	if os.Geteuid() != 0 {
		t.Skip("root-only test: WEFT_ROOT_TESTS is set but this process is not root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("root-only test needs iproute2's ip: run make deps")
	}
}

// newNetns creates a named netns with lo up and returns its path; it is
// deleted when the test ends.
func newNetns(t testing.TB, tag string) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := "weft-t-" + tag + "-" + hex.EncodeToString(b)
	ns, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	t.Cleanup(func() {
		if err := netns.Delete(name); err != nil {
			t.Errorf("deleting netns %s: %v", name, err)
		}
	})
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return netns.Path(name)
}

func nsName(path string) string { return filepath.Base(path) }

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// inNetns runs fn on a thread switched into the netns at path.
func inNetns(path string, fn func() error) error {
	ns, err := netns.Open(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	return ns.Do(fn)
}

func mustInNetns(t testing.TB, path string, fn func() error) {
	t.Helper()
	if err := inNetns(path, fn); err != nil {
		t.Fatal(err)
	}
}

// vethPair links two namespaces with eth0 in each and gives them the
// addresses (CIDR notation, IPv4 and IPv6 allowed).
func vethPair(t testing.TB, a, b string, addrsA, addrsB []string) {
	t.Helper()
	run(t, "ip", "link", "add", "eth0", "netns", nsName(a), "type", "veth", "peer", "name", "eth0", "netns", nsName(b))
	for ns, addrs := range map[string][]string{a: addrsA, b: addrsB} {
		for _, ad := range addrs {
			args := []string{"ip", "-n", nsName(ns), "addr", "add", ad, "dev", "eth0"}
			if strings.Contains(ad, ":") {
				args = append(args, "nodad")
			}
			run(t, args...)
		}
		run(t, "ip", "-n", nsName(ns), "link", "set", "eth0", "up")
	}
}
