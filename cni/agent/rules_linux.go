package agent

import (
	"net/netip"

	"github.com/weftmesh/weft/cni/redirect"
	"github.com/weftmesh/weft/internal/netns"
)

// kernelRules programs the kernel: pod rules inside each pod's netns, probe
// addresses in the node's (node, or the agent's own netns when nil).
type kernelRules struct {
	node *netns.NS
	v6   bool
}

var _ rules = kernelRules{}

func (k kernelRules) apply(ns *netns.NS, o redirect.Options) error {
	return ns.Do(func() error { return redirect.ApplyPod(o) })
}

func (k kernelRules) remove(ns *netns.NS) error {
	return ns.Do(redirect.RemovePod)
}

func (k kernelRules) check(ns *netns.NS, o redirect.Options) error {
	return ns.Do(func() error { return redirect.CheckPod(o) })
}

func (k kernelRules) inNode(fn func() error) error {
	if k.node == nil {
		return fn()
	}
	return k.node.Do(fn)
}

func (k kernelRules) addProbeIPs(uid string, ips []netip.Addr) error {
	return k.inNode(func() error { return redirect.AddProbeIPs(uid, ips, k.v6) })
}

func (k kernelRules) removeProbeIPs(ips []netip.Addr) error {
	return k.inNode(func() error { return redirect.RemoveProbeIPs(ips, k.v6) })
}

func (k kernelRules) applyHost(o redirect.HostOptions) error {
	return k.inNode(func() error { return redirect.ApplyHost(o) })
}

func (k kernelRules) removeHost() error {
	return k.inNode(redirect.RemoveHost)
}

func (k kernelRules) probeIPs() (map[netip.Addr]string, error) {
	var out map[netip.Addr]string
	err := k.inNode(func() (err error) {
		out, err = redirect.ProbeIPs(k.v6)
		return err
	})
	return out, err
}
