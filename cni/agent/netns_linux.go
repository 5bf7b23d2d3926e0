package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/netns"
)

// errNetnsNotFound means no namespace in the netns dir holds the pod's IPs.
var errNetnsNotFound = errors.New("no network namespace holds the pod's addresses")

// holdsAny reports whether one of ips is assigned to an interface in ns.
func holdsAny(ns *netns.NS, ips []netip.Addr) (bool, error) {
	h, err := ns.Netlink()
	if err != nil {
		return false, err
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, unix.AF_UNSPEC)
	if err != nil {
		return false, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		got, ok := netip.AddrFromSlice(a.IP)
		if !ok || got.IsLoopback() {
			continue
		}
		for _, want := range ips {
			if got.Unmap() == want.Unmap() {
				return true, nil
			}
		}
	}
	return false, nil
}

// findNetns finds the pod's network namespace among the named namespaces
// in dir by its IPs: on a node a pod IP is assigned in one namespace at a
// time. The node's own namespace (hostID) is never a match. When several
// namespaces hold the IPs (a machine that hosts several test clusters, or
// a stale namespace), only one wired to this node (node, or the agent's own
// netns when nil) by a link whose peer is in the node's namespace (a veth,
// macvlan or ipvlan) is taken. The caller closes the result.
func findNetns(dir string, ips []netip.Addr, hostID uint64, node *netns.NS) (*netns.NS, error) {
	if len(ips) == 0 {
		return nil, fmt.Errorf("%w: the pod has no IP yet", errNetnsNotFound)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the netns dir %s: %w", dir, err)
	}
	var cands []*netns.NS
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		ns, err := netns.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // not a mounted namespace (yet, or any more)
		}
		if id, err := ns.ID(); err != nil || id == hostID {
			ns.Close()
			continue
		}
		if ok, err := holdsAny(ns, ips); err != nil || !ok {
			ns.Close()
			continue
		}
		cands = append(cands, ns)
	}
	switch len(cands) {
	case 0:
		return nil, fmt.Errorf("%w (%v) in %s", errNetnsNotFound, ips, dir)
	case 1:
		return cands[0], nil
	}
	wired, err := wiredToNode(cands, node)
	var pick *netns.NS
	if err == nil && len(wired) == 1 {
		pick = wired[0]
	}
	for _, c := range cands {
		if c != pick {
			c.Close()
		}
	}
	if pick == nil {
		return nil, fmt.Errorf("%d namespaces in %s hold %v and %d of them are wired to this node (%v): cannot tell the pod's", len(cands), dir, ips, len(wired), err)
	}
	return pick, nil
}

// wiredToNode keeps the namespaces that one of the node's links points
// into (the node has a namespace id for them and a link using it).
func wiredToNode(cands []*netns.NS, node *netns.NS) ([]*netns.NS, error) {
	var h *netlink.Handle
	var err error
	if node != nil {
		h, err = node.Netlink()
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, err
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing the node's links: %w", err)
	}
	peers := map[int]bool{}
	for _, l := range links {
		if id := l.Attrs().NetNsID; id >= 0 {
			peers[id] = true
		}
	}
	var out []*netns.NS
	for _, c := range cands {
		if id, err := h.GetNetNsIdByFd(c.Fd()); err == nil && id >= 0 && peers[id] {
			out = append(out, c)
		}
	}
	return out, nil
}
