package cluster

import (
	"fmt"
	"sort"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/netns"
)

// rootState is what the root network namespace holds: links, addresses and
// routes (every table), one line each.
type rootState map[string]bool

// snapshotRoot reads the root network namespace (the process's own, the
// namespace of its main thread).
func snapshotRoot() (rootState, error) {
	ns, err := netns.Open("/proc/self/ns/net")
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := ns.Netlink()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	st := rootState{}
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing root links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		st[fmt.Sprintf("link %s (%s)", a.Name, l.Type())] = true
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("listing root addresses: %w", err)
	}
	for _, a := range addrs {
		st[fmt.Sprintf("address %s on %s", a.IPNet, names[a.LinkIndex])] = true
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing root routes: %w", err)
	}
	for _, r := range routes {
		st[fmt.Sprintf("route %s via %s dev %s table %d type %d", r.Dst, r.Gw, names[r.LinkIndex], r.Table, r.Type)] = true
	}
	return st, nil
}

// added lists the lines of s not in before, sorted.
func (s rootState) added(before rootState) []string {
	var out []string
	for k := range s {
		if !before[k] {
			out = append(out, "root netns: "+k)
		}
	}
	sort.Strings(out)
	return out
}
