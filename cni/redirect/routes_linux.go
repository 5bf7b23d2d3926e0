package redirect

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/podnet"
)

// ErrConflict is wrapped by errors about routing state in the pod that is
// not ours and that the rules would clash with. Nothing is changed when it
// is returned.
var ErrConflict = errors.New("conflicting redirection state in the pod")

// route is one of the local default routes in RouteTable.
type route struct {
	family int
	dst    *net.IPNet
}

func podRoutes(v6 bool) []route {
	rs := []route{{unix.AF_INET, &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}}
	if v6 {
		rs = append(rs, route{unix.AF_INET6, &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}})
	}
	return rs
}

func (r route) netlink(lo int) *netlink.Route {
	return &netlink.Route{
		Family:    r.family,
		Dst:       r.dst,
		LinkIndex: lo,
		Table:     RouteTable,
		Type:      unix.RTN_LOCAL,
		Scope:     netlink.SCOPE_HOST,
	}
}

func markRule(family int) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = family
	r.Priority = RulePriority
	r.Table = RouteTable
	r.Mark = podnet.ConnMark
	mask := podnet.MarkMask
	r.Mask = &mask
	return r
}

func isOurRule(r netlink.Rule) bool {
	return r.Priority == RulePriority && r.Table == RouteTable && r.Mark == podnet.ConnMark &&
		r.Mask != nil && *r.Mask == podnet.MarkMask && r.Src == nil && r.Dst == nil && r.IifName == "" && r.OifName == "" && !r.Invert
}

func isOurRoute(r netlink.Route, lo int) bool {
	ones := 0
	if r.Dst != nil {
		ones, _ = r.Dst.Mask.Size()
	}
	return r.Table == RouteTable && r.Type == unix.RTN_LOCAL && r.LinkIndex == lo && ones == 0 && r.Gw == nil
}

// loopback finds lo and whether it has ::1 (IPv6 works in the pod).
func loopback() (idx int, hasV6 bool, err error) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return 0, false, fmt.Errorf("finding lo: %w", err)
	}
	addrs, err := netlink.AddrList(lo, unix.AF_INET6)
	if err != nil {
		return 0, false, fmt.Errorf("listing lo's IPv6 addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IP.Equal(net.IPv6loopback) {
			hasV6 = true
		}
	}
	return lo.Attrs().Index, hasV6, nil
}

// routingState is what exists of ours, and what conflicts with it.
type routingState struct {
	rules  map[int]bool // family -> our rule present
	routes map[int]bool // family -> our route present
}

// readRouting inspects the policy rules at RulePriority and the routes in
// RouteTable. Anything there that is not ours is a conflict.
func readRouting(lo int) (routingState, error) {
	st := routingState{rules: map[int]bool{}, routes: map[int]bool{}}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rules, err := netlink.RuleList(fam)
		if err != nil {
			if fam == unix.AF_INET6 && errors.Is(err, unix.EAFNOSUPPORT) {
				continue
			}
			return st, fmt.Errorf("listing policy rules: %w", err)
		}
		for _, r := range rules {
			switch {
			case isOurRule(r):
				st.rules[fam] = true
			case r.Priority == RulePriority:
				return st, fmt.Errorf("%w: policy rule %s already holds priority %d", ErrConflict, r, RulePriority)
			case r.Table == RouteTable && r.Priority < RulePriority:
				return st, fmt.Errorf("%w: policy rule %s already uses table %d", ErrConflict, r, RouteTable)
			}
		}
		routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: RouteTable}, netlink.RT_FILTER_TABLE)
		if err != nil {
			if fam == unix.AF_INET6 && errors.Is(err, unix.EAFNOSUPPORT) {
				continue
			}
			return st, fmt.Errorf("listing routes in table %d: %w", RouteTable, err)
		}
		for _, r := range routes {
			if !isOurRoute(r, lo) {
				return st, fmt.Errorf("%w: table %d already holds route %s", ErrConflict, RouteTable, r)
			}
			st.routes[fam] = true
		}
	}
	return st, nil
}

// addRouting installs what is missing of the routes and policy rules and
// returns an undo that removes exactly what it added.
func addRouting(lo int, v6 bool, st routingState) (undo func(), err error) {
	var undos []func()
	undo = func() {
		for i := len(undos) - 1; i >= 0; i-- {
			undos[i]()
		}
	}
	for _, r := range podRoutes(v6) {
		if st.routes[r.family] {
			continue
		}
		nr := r.netlink(lo)
		if err := netlink.RouteAdd(nr); err != nil && !errors.Is(err, unix.EEXIST) {
			undo()
			return nil, fmt.Errorf("adding local route %s via lo to table %d: %w", r.dst, RouteTable, err)
		}
		undos = append(undos, func() { _ = netlink.RouteDel(nr) })
	}
	fams := []int{unix.AF_INET}
	if v6 {
		fams = append(fams, unix.AF_INET6)
	}
	for _, fam := range fams {
		if st.rules[fam] {
			continue
		}
		rule := markRule(fam)
		if err := netlink.RuleAdd(rule); err != nil && !errors.Is(err, unix.EEXIST) {
			undo()
			return nil, fmt.Errorf("adding policy rule fwmark %#x/%#x lookup %d: %w", podnet.ConnMark, podnet.MarkMask, RouteTable, err)
		}
		undos = append(undos, func() { _ = netlink.RuleDel(rule) })
	}
	return undo, nil
}

// removeRouting deletes our rules and routes; absent ones are fine.
func removeRouting() error {
	var errs []error
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rules, err := netlink.RuleList(fam)
		if err != nil {
			if fam == unix.AF_INET6 && errors.Is(err, unix.EAFNOSUPPORT) {
				continue
			}
			errs = append(errs, fmt.Errorf("listing policy rules: %w", err))
			continue
		}
		for _, r := range rules {
			if isOurRule(r) {
				if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("deleting policy rule %s: %w", r, err))
				}
			}
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("finding lo: %w", err))...)
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: RouteTable}, netlink.RT_FILTER_TABLE)
		if err != nil {
			if fam == unix.AF_INET6 && errors.Is(err, unix.EAFNOSUPPORT) {
				continue
			}
			errs = append(errs, fmt.Errorf("listing routes in table %d: %w", RouteTable, err))
			continue
		}
		for _, r := range routes {
			if isOurRoute(r, lo.Attrs().Index) {
				if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
					errs = append(errs, fmt.Errorf("deleting route %s: %w", r, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}
