package cluster

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/weftmesh/weft/internal/netns"
)

// The address plan. Every address lives inside the run's own namespaces,
// so every run uses the same plan and runs never collide.
var (
	// underlayNet joins the control plane and the nodes (bridge br0 in the
	// underlay namespace).
	underlayNet = netip.MustParsePrefix("10.99.0.0/24")
	// cpAddr is the control-plane node's address; the API server
	// advertises it, so the kubernetes Service's endpoint is cpAddr:6443.
	cpAddr = netip.MustParseAddr("10.99.0.2")
	// clusterCIDR holds every node's pod CIDR (node i: 10.244.i.0/24).
	clusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
	// serviceCIDR is the API server's service range; its first address is
	// the kubernetes Service.
	serviceCIDR         = netip.MustParsePrefix("10.96.0.0/16")
	kubernetesServiceIP = netip.MustParseAddr("10.96.0.1")
	// loadBalancerPool holds the addresses the harness's load balancer
	// gives Services of type LoadBalancer; every member of the underlay
	// but the nodes routes it to the nodes, whose kube-proxy serves it.
	loadBalancerPool = netip.MustParsePrefix("10.98.0.0/24")
	// outsideAddr is the underlay address of the outside namespace: a
	// client that is no node (DialOutside).
	outsideAddr = netip.MustParseAddr("10.99.0.250")
)

// apiPort is the API server's port inside the control-plane namespace.
const apiPort = 6443

const maxNodes = 50

// nodeAddr is node i's (1-based) underlay address: 10.99.0.(10+i).
func nodeAddr(i int) netip.Addr {
	b := underlayNet.Addr().As4()
	b[3] = byte(10 + i)
	return netip.AddrFrom4(b)
}

// nodePodCIDR is node i's pod range: 10.244.i.0/24.
func nodePodCIDR(i int) netip.Prefix {
	b := clusterCIDR.Addr().As4()
	b[2] = byte(i)
	return netip.PrefixFrom(netip.AddrFrom4(b), 24)
}

// gateway is the first address of a pod CIDR, the bridge's address.
func gateway(p netip.Prefix) netip.Addr { return p.Addr().Next() }

func nodeName(i int) string { return fmt.Sprintf("node%d", i) }

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// topology is the run's network namespaces: the underlay switch, the
// control plane, the nodes and the outside client, wired together.
type topology struct {
	prefix      string
	ul, cp, out *netns.NS   // out: the outside client's
	nodes       []*netns.NS // nodes[i-1] is node i
	names       []string    // every namespace made, for teardown
}

// buildTopology makes the namespaces and links. On error it removes what it
// made.
func buildTopology(prefix string, n int) (t *topology, err error) {
	t = &topology{prefix: prefix}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	if t.ul, err = t.create("ul"); err != nil {
		return nil, err
	}
	ul, err := t.ul.Netlink()
	if err != nil {
		return nil, err
	}
	defer ul.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := ul.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("adding the underlay bridge: %w", err)
	}
	if err := ul.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("bringing up the underlay bridge: %w", err)
	}
	// The underlay is a plain switch: no netfilter on bridged frames.
	if err := sysctl(t.ul, "net/bridge/bridge-nf-call-iptables", "0"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}

	if t.cp, err = t.create("cp"); err != nil {
		return nil, err
	}
	if err := t.attach(ul, br, t.cp, "cp", cpAddr); err != nil {
		return nil, err
	}
	for i := 1; i <= n; i++ {
		ns, err := t.create(fmt.Sprintf("n%d", i))
		if err != nil {
			return nil, err
		}
		t.nodes = append(t.nodes, ns)
		if err := t.attach(ul, br, ns, nodeName(i), nodeAddr(i)); err != nil {
			return nil, err
		}
		for _, kv := range [][2]string{
			{"net/ipv4/ip_forward", "1"},
			{"net/bridge/bridge-nf-call-iptables", "1"}, // kube-proxy sees same-node pod traffic
		} {
			if err := sysctl(ns, kv[0], kv[1]); err != nil {
				return nil, err
			}
		}
	}
	// Routes to each node's pod CIDR via that node: from the control plane
	// (webhooks, aggregated APIs) and from every other node.
	if err := addRoutes(t.cp, n, 0); err != nil {
		return nil, err
	}
	// The outside: a client on the underlay, no node, with a route to the
	// load balancers' addresses through the nodes.
	if t.out, err = t.create("out"); err != nil {
		return nil, err
	}
	// The outside stands for a cloud's load balancer, which takes no ICMP
	// redirect from a node: a node that has not yet synced a load balancer
	// address forwards a packet for it to its default gateway, the control
	// plane, on the link it came by, and redirects the sender there; a
	// sender that took it would send every later packet for that address
	// to the control plane, which drops them, for the five minutes the
	// kernel keeps a redirect.
	for _, key := range []string{"net/ipv4/conf/all/accept_redirects", "net/ipv4/conf/default/accept_redirects"} {
		if err := sysctl(t.out, key, "0"); err != nil {
			return nil, err
		}
	}
	if err := t.attach(ul, br, t.out, "out", outsideAddr); err != nil {
		return nil, err
	}
	if err := addLoadBalancerRoute(t.out, n); err != nil {
		return nil, err
	}
	for i, ns := range t.nodes {
		if err := addRoutes(ns, n, i+1); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// create makes prefix+name with loopback up.
func (t *topology) create(name string) (*netns.NS, error) {
	full := t.prefix + name
	ns, err := netns.Create(full)
	if err != nil {
		return nil, err
	}
	t.names = append(t.names, full)
	h, err := ns.Netlink()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		return nil, fmt.Errorf("bringing up lo in %s: %w", full, err)
	}
	return ns, nil
}

// attach plugs a namespace into the underlay: a veth whose bridge end
// (named port) is in the underlay and whose other end is the member's eth0
// with addr.
func (t *topology) attach(ul *netlink.Handle, br *netlink.Bridge, member *netns.NS, port string, addr netip.Addr) error {
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: port, MasterIndex: br.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(member.Fd()),
	}
	if err := ul.LinkAdd(veth); err != nil {
		return fmt.Errorf("adding underlay link %s: %w", port, err)
	}
	if err := ul.LinkSetUp(veth); err != nil {
		return fmt.Errorf("bringing up underlay link %s: %w", port, err)
	}
	h, err := member.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("finding eth0 in %s: %w", member.Path(), err)
	}
	if err := h.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(addr, underlayNet.Bits()))}); err != nil {
		return fmt.Errorf("adding %s to eth0 in %s: %w", addr, member.Path(), err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("bringing up eth0 in %s: %w", member.Path(), err)
	}
	return nil
}

// addRoutes adds, in ns, a route to every node's pod CIDR except node self's,
// and on a node (self > 0) a route for the service CIDR: kube-proxy
// rewrites ClusterIPs in OUTPUT, after the routing decision, so traffic the
// node itself sends (hostNetwork pods, probes) needs some route for them.
func addRoutes(ns *netns.NS, n, self int) error {
	h, err := ns.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	if self > 0 {
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		r := &netlink.Route{Dst: ipNet(serviceCIDR), LinkIndex: eth0.Attrs().Index, Scope: netlink.SCOPE_LINK}
		if err := h.RouteAdd(r); err != nil {
			return fmt.Errorf("adding the service CIDR route in %s: %w", ns.Path(), err)
		}
	}
	for i := 1; i <= n; i++ {
		if i == self {
			continue
		}
		r := &netlink.Route{Dst: ipNet(nodePodCIDR(i)), Gw: nodeAddr(i).AsSlice()}
		if err := h.RouteAdd(r); err != nil {
			return fmt.Errorf("adding route %s via %s in %s: %w", nodePodCIDR(i), nodeAddr(i), ns.Path(), err)
		}
	}
	return nil
}

// addLoadBalancerRoute routes loadBalancerPool through every node (equal-
// cost paths, one flow per node): any node's kube-proxy forwards a load
// balancer's address to the Service's endpoints, as a cloud's load
// balancer sends to any node.
func addLoadBalancerRoute(ns *netns.NS, n int) error {
	h, err := ns.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	r := &netlink.Route{Dst: ipNet(loadBalancerPool)}
	for i := 1; i <= n; i++ {
		r.MultiPath = append(r.MultiPath, &netlink.NexthopInfo{Gw: nodeAddr(i).AsSlice()})
	}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("adding the route to the load balancers %s in %s: %w", loadBalancerPool, ns.Path(), err)
	}
	return nil
}

// sysctl writes a /proc/sys/net key inside ns (net sysctls are per
// namespace, resolved by the writing thread's namespace).
func sysctl(ns *netns.NS, key, value string) error {
	return ns.Do(func() error {
		if err := os.WriteFile("/proc/sys/"+key, []byte(value), 0); err != nil {
			return fmt.Errorf("setting %s in %s: %w", strings.ReplaceAll(key, "/", "."), ns.Path(), err)
		}
		return nil
	})
}

// close deletes every namespace the topology made.
func (t *topology) close() error {
	var errs []error
	for _, ns := range append([]*netns.NS{t.ul, t.cp, t.out}, t.nodes...) {
		if ns != nil {
			ns.Close()
		}
	}
	for _, name := range t.names {
		if err := netns.Delete(name); err != nil {
			errs = append(errs, err)
		}
	}
	t.names = nil
	return errors.Join(errs...)
}
