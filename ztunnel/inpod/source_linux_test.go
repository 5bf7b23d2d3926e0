package inpod

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/podnet"
	"github.com/weftmesh/weft/ztunnel/proxy"
)

// returnRoute installs what the pod's redirection rules do for replies to
// a connection ztunnel made into the pod: a connection whose packets carry
// ztunnel's mark gets connmark 0x111; the app's packets of it get the mark
// back and policy rule 32764 sends them to table 100, whose local default
// route hands them to ztunnel's socket whatever their destination. A dummy
// link with a default route stands for the pod's eth0.
func returnRoute(t *testing.T, ns *netns.NS) {
	t.Helper()
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0-peer"}
	if err := h.LinkAdd(eth); err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.254.1.2/24")
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = errors.Join(h.AddrAdd(eth, addr), h.LinkSetUp(eth))
	}
	if err == nil {
		err = h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP("10.254.1.1"), Scope: netlink.SCOPE_UNIVERSE})
	}
	if err == nil {
		_, all, _ := net.ParseCIDR("0.0.0.0/0")
		err = h.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: all, Table: 100, Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST})
	}
	if err == nil {
		rule := netlink.NewRule()
		rule.Mark, rule.Mask, rule.Table, rule.Priority, rule.Family = 0x111, ptrTo(uint32(0xfff)), 100, 32764, unix.AF_INET
		err = h.RuleAdd(rule)
	}
	if err != nil {
		t.Fatalf("routing: %v", err)
	}
	reg := uint32(1)
	native32 := func(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
	masked := func(v uint32) []expr.Any {
		return []expr.Any{
			&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: native32(0xfff), Xor: native32(0)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: native32(v)},
		}
	}
	err = ns.Do(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "origsrc-test"})
		ch := c.AddChain(&nftables.Chain{Name: "output", Table: tbl, Type: nftables.ChainTypeRoute,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityMangle})
		// meta mark & 0xfff == 0x539 ct mark set 0x111
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: append(append([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg}}, masked(podnet.ZtunnelMark)...),
			&expr.Immediate{Register: reg, Data: native32(0x111)},
			&expr.Ct{Key: expr.CtKeyMARK, Register: reg, SourceRegister: true},
		)})
		// ct mark & 0xfff == 0x111 meta mark set ct mark
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: append(append([]expr.Any{
			&expr.Ct{Key: expr.CtKeyMARK, Register: reg}}, masked(0x111)...),
			&expr.Ct{Key: expr.CtKeyMARK, Register: reg},
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg, SourceRegister: true},
		)})
		return c.Flush()
	})
	if err != nil {
		t.Fatalf("installing the connmark rules: %v", err)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestDialKeepsSourceAddress dials an app in a pod's network namespace
// from an address the pod does not have, as ztunnel does on inbound: the
// app must see that address, and the connection must carry data both ways.
func TestDialKeepsSourceAddress(t *testing.T) {
	rootOnly(t)
	ns := podNS(t, "origsrc")
	addPodIP(t, ns)
	returnRoute(t, ns)
	var ln net.Listener
	err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(podIP, 8080).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", c.RemoteAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	}()
	s := Sockets{NS: ns}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	client := netip.MustParseAddrPort("10.244.9.7:0")
	c, err := s.Dial(ctx, netip.AddrPortFrom(podIP, 8080), client)
	if err != nil {
		t.Fatalf("dial from %s: %v", client.Addr(), err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != client.Addr().String()+"\n" {
		t.Fatalf("the app saw %q (%v), want %s", got, err, client.Addr())
	}
	// Without a source, the pod's own address, as before.
	c2, err := s.Dial(ctx, netip.AddrPortFrom(podIP, 8080), netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := bufio.NewReader(c2).ReadString('\n'); err != nil || got != podIP.String()+"\n" {
		t.Errorf("without a source the app saw %q (%v), want %s", got, err, podIP)
	}
	// A source of the other family cannot be bound: the caller may retry.
	_, err = s.Dial(ctx, netip.AddrPortFrom(podIP, 8080), netip.MustParseAddrPort("[fd00::7]:0"))
	if !errors.Is(err, proxy.ErrSourceNotBound) {
		t.Errorf("dial from an IPv6 source to an IPv4 app: %v, want ErrSourceNotBound", err)
	}
}
