package agent

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFindNetns finds a running pod's netns by IP, and when another
// namespace holds the same IP (a second cluster on the machine), takes the
// one wired to this node.
func TestFindNetns(t *testing.T) {
	requireRoot(t)
	node, elsewhere := testNetns(t, "fnode"), testNetns(t, "fother")
	nodeID := nsInode(t, node)
	dir := t.TempDir()
	link := func(tag string) string {
		ns := testNetns(t, tag)
		if err := os.Symlink(ns.Path(), filepath.Join(dir, filepath.Base(ns.Path()))); err != nil {
			t.Fatal(err)
		}
		return ns.Path()
	}
	ip := netip.MustParseAddr("10.88.0.5")

	ours := link("fours")
	oursNS := openNS(t, ours)
	podWithIP(t, node, oursNS, ip, "vours")
	if _, err := findNetns(dir, []netip.Addr{netip.MustParseAddr("10.88.0.9")}, nodeID, node); !errors.Is(err, errNetnsNotFound) {
		t.Fatalf("findNetns of an unknown IP = %v", err)
	}
	got, err := findNetns(dir, []netip.Addr{ip}, nodeID, node)
	if err != nil {
		t.Fatal(err)
	}
	if nsInode(t, got) != nsInode(t, oursNS) {
		t.Fatal("found the wrong namespace")
	}
	got.Close()

	// The same IP in a namespace wired to another "node".
	theirs := openNS(t, link("ftheirs"))
	podWithIP(t, elsewhere, theirs, ip, "vtheirs")
	got, err = findNetns(dir, []netip.Addr{ip}, nodeID, node)
	if err != nil {
		t.Fatal(err)
	}
	if nsInode(t, got) != nsInode(t, oursNS) {
		t.Fatal("took the namespace wired to another node")
	}
	got.Close()

	// Seen from a third namespace, neither is wired to the node: refuse.
	if _, err := findNetns(dir, []netip.Addr{ip}, nodeID, testNetns(t, "fthird")); err == nil || !strings.Contains(err.Error(), "cannot tell the pod's") {
		t.Fatalf("ambiguous findNetns = %v", err)
	}
}
