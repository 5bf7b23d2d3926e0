package redirect

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"istio.io/api/annotation"

	"github.com/weftmesh/weft/internal/podnet"
)

// The routing table and the rule priority (protocols.md §3.2); the ports
// and marks are podnet's.
const (
	// RouteTable holds the local default routes for podnet.ConnMark
	// traffic.
	RouteTable = 100
	// RulePriority is the priority of the fwmark policy rule.
	RulePriority = 32764
)

// Table and chain names, Istio's.
const (
	NATTable    = "istio-ambient-nat"
	MangleTable = "istio-ambient-mangle"
	RawTable    = "istio-ambient-raw"

	chainPrerouting      = "prerouting"
	chainOutput          = "output"
	chainPostrouting     = "postrouting"
	chainIstioPrerouting = "istio-prerouting"
	chainIstioOutput     = "istio-output"

	// ProbeSetV4 and ProbeSetV6 hold the enrolled pods' IPs in the node's
	// istio-ambient-nat table.
	ProbeSetV4 = "istio-inpod-probes-v4"
	ProbeSetV6 = "istio-inpod-probes-v6"
)

// The addresses kubelet probes are SNATed to on the node.
var (
	ProbeSNATv4 = netip.MustParseAddr("169.254.7.127")
	ProbeSNATv6 = netip.MustParseAddr("fd16:9254:7127:1337:ffff:ffff:ffff:ffff")
)

// Options select the variant of a pod's rule set.
type Options struct {
	// DNSCapture redirects DNS to 15053 and adds the raw table.
	DNSCapture bool
	// BypassInbound ("ingress mode") leaves inbound traffic uncaptured.
	BypassInbound bool
	// VirtualInterfaces are interfaces whose inbound TCP is treated as
	// outbound (sent to 15001), for VMs and nested containers.
	VirtualInterfaces []string
	// IPv6 adds the ip6 twins of the address-specific rules.
	IPv6 bool
}

var ifnameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}$`)

// PodOptions applies a pod's annotations to the node-wide defaults.
func PodOptions(annotations map[string]string, defaults Options) (Options, error) {
	o := defaults
	o.VirtualInterfaces = nil
	if v, ok := annotations[annotation.AmbientDnsCapture.Name]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Options{}, fmt.Errorf("annotation %s=%q: want true or false", annotation.AmbientDnsCapture.Name, v)
		}
		o.DNSCapture = b
	}
	if v, ok := annotations[annotation.AmbientBypassInboundCapture.Name]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return Options{}, fmt.Errorf("annotation %s=%q: want true or false", annotation.AmbientBypassInboundCapture.Name, v)
		}
		o.BypassInbound = b
	}
	if v := strings.TrimSpace(annotations[annotation.IoIstioRerouteVirtualInterfaces.Name]); v != "" {
		for name := range strings.SplitSeq(v, ",") {
			name = strings.TrimSpace(name)
			if !ifnameRE.MatchString(name) {
				return Options{}, fmt.Errorf("annotation %s: %q is not an interface name", annotation.IoIstioRerouteVirtualInterfaces.Name, name)
			}
			o.VirtualInterfaces = append(o.VirtualInterfaces, name)
		}
	}
	return o, nil
}

// Ruleset is a set of nftables tables to install as a whole.
type Ruleset struct {
	Tables []*Table
}

// Table is one inet table.
type Table struct {
	Name   string
	Sets   []*Set
	Chains []*Chain
}

// Chain is a base chain (Hook set) or a regular chain, with its rules.
type Chain struct {
	Name     string
	Type     nftables.ChainType
	Hook     *nftables.ChainHook
	Priority *nftables.ChainPriority
	Rules    [][]expr.Any
}

// Set is a named address set.
type Set struct {
	Name    string
	IPv6    bool
	Comment string
}

func (t *Table) chain(name string) *Chain {
	for _, c := range t.Chains {
		if c.Name == name {
			return c
		}
	}
	panic("redirect: no chain " + name)
}

func (t *Table) add(chain string, parts ...[]expr.Any) {
	c := t.chain(chain)
	var r []expr.Any
	for _, p := range parts {
		r = append(r, p...)
	}
	c.Rules = append(c.Rules, r)
}

// hookedTable makes a table whose prerouting and output base chains jump to
// istio-prerouting and istio-output.
func hookedTable(name string, pre, out nftables.ChainType, prio nftables.ChainPriority) *Table {
	t := &Table{Name: name, Chains: []*Chain{
		{Name: chainPrerouting, Type: pre, Hook: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(prio)},
		{Name: chainOutput, Type: out, Hook: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRef(prio)},
		{Name: chainIstioPrerouting},
		{Name: chainIstioOutput},
	}}
	t.add(chainPrerouting, jump(chainIstioPrerouting))
	t.add(chainOutput, jump(chainIstioOutput))
	return t
}

var (
	loopback4 = netip.MustParseAddr("127.0.0.1")
	loopback6 = netip.IPv6Loopback()
)

// Pod builds the in-pod rule set for opts, in Istio's rule order.
func Pod(opts Options) *Ruleset {
	nat := hookedTable(NATTable, nftables.ChainTypeNAT, nftables.ChainTypeNAT, *nftables.ChainPriorityNATDest)
	mangle := hookedTable(MangleTable, nftables.ChainTypeFilter, nftables.ChainTypeRoute, *nftables.ChainPriorityMangle)
	v6 := opts.IPv6
	notMarked := markMasked(expr.CmpOpNeq, podnet.MarkMask, podnet.ZtunnelMark)

	// nat istio-prerouting: virtual interfaces first, as short-circuits.
	for _, ifc := range opts.VirtualInterfaces {
		nat.add(chainIstioPrerouting, ifname(unix.NFT_META_IIFNAME, expr.CmpOpEq, ifc), l4proto(unix.IPPROTO_TCP), counter(), redirectTo(podnet.OutboundPort))
		nat.add(chainIstioPrerouting, ifname(unix.NFT_META_IIFNAME, expr.CmpOpEq, ifc), l4proto(unix.IPPROTO_TCP), counter(), verdict(expr.VerdictReturn))
	}
	// mangle istio-prerouting: packets ztunnel sends into the pod mark
	// their connection.
	mangle.add(chainIstioPrerouting, markMasked(expr.CmpOpEq, podnet.MarkMask, podnet.ZtunnelMark), counter(), ctMarkSet(^podnet.MarkMask, podnet.ConnMark))
	if !opts.BypassInbound {
		// Kubelet probes, SNATed on the node, go straight to the app.
		nat.add(chainIstioPrerouting, l4proto(unix.IPPROTO_TCP), addr(srcAddr, expr.CmpOpEq, ProbeSNATv4), counter(), accept())
		if v6 {
			nat.add(chainIstioPrerouting, l4proto(unix.IPPROTO_TCP), addr(srcAddr, expr.CmpOpEq, ProbeSNATv6), counter(), accept())
		}
	}
	nat.add(chainIstioOutput, l4proto(unix.IPPROTO_TCP), addr(dstAddr, expr.CmpOpEq, ProbeSNATv4), counter(), accept())
	if v6 {
		nat.add(chainIstioOutput, l4proto(unix.IPPROTO_TCP), addr(dstAddr, expr.CmpOpEq, ProbeSNATv6), counter(), accept())
	}
	if !opts.BypassInbound {
		// Inbound plaintext to 15006; HBONE reaches 15008 directly.
		nat.add(chainIstioPrerouting, addr(dstAddr, expr.CmpOpNeq, loopback4), port(unix.IPPROTO_TCP, dstPort, expr.CmpOpNeq, podnet.HBONEPort), notMarked, counter(), redirectTo(podnet.InboundPlaintextPort))
		if v6 {
			nat.add(chainIstioPrerouting, addr(dstAddr, expr.CmpOpNeq, loopback6), port(unix.IPPROTO_TCP, dstPort, expr.CmpOpNeq, podnet.HBONEPort), notMarked, counter(), redirectTo(podnet.InboundPlaintextPort))
		}
	}
	// mangle istio-output: restore the connection mark onto the app's
	// replies on ztunnel-originated connections.
	mangle.add(chainIstioOutput, ctMarkMasked(expr.CmpOpEq, podnet.MarkMask, podnet.ConnMark), counter(), metaMarkFromCt())

	tables := []*Table{nat, mangle}
	if opts.DNSCapture {
		nat.add(chainIstioOutput, ifname(unix.NFT_META_OIFNAME, expr.CmpOpNeq, "lo"), notMarked, port(unix.IPPROTO_UDP, dstPort, expr.CmpOpEq, 53), counter(), redirectTo(podnet.DNSPort))
		nat.add(chainIstioOutput, addr(dstAddr, expr.CmpOpNeq, loopback4), port(unix.IPPROTO_TCP, dstPort, expr.CmpOpEq, 53), notMarked, counter(), redirectTo(podnet.DNSPort))
		if v6 {
			nat.add(chainIstioOutput, addr(dstAddr, expr.CmpOpNeq, loopback6), port(unix.IPPROTO_TCP, dstPort, expr.CmpOpEq, 53), notMarked, counter(), redirectTo(podnet.DNSPort))
		}
		// ztunnel's upstream DNS and the replies to it get their own
		// conntrack zone (istio/istio#33469).
		raw := hookedTable(RawTable, nftables.ChainTypeFilter, nftables.ChainTypeFilter, *nftables.ChainPriorityRaw)
		raw.add(chainIstioOutput, port(unix.IPPROTO_UDP, dstPort, expr.CmpOpEq, 53), markMasked(expr.CmpOpEq, podnet.MarkMask, podnet.ZtunnelMark), counter(), ctZoneSet(1))
		raw.add(chainIstioPrerouting, port(unix.IPPROTO_UDP, srcPort, expr.CmpOpEq, 53), notMarked, counter(), ctZoneSet(1))
		tables = append(tables, raw)
	}
	// The app's replies on ztunnel-originated connections, and the app
	// talking to itself, are not captured again.
	nat.add(chainIstioOutput, l4proto(unix.IPPROTO_TCP), markMasked(expr.CmpOpEq, podnet.MarkMask, podnet.ConnMark), counter(), accept())
	nat.add(chainIstioOutput, ifname(unix.NFT_META_OIFNAME, expr.CmpOpEq, "lo"), addr(dstAddr, expr.CmpOpNeq, loopback4), counter(), accept())
	if v6 {
		nat.add(chainIstioOutput, ifname(unix.NFT_META_OIFNAME, expr.CmpOpEq, "lo"), addr(dstAddr, expr.CmpOpNeq, loopback6), counter(), accept())
	}
	// Everything else outbound goes to 15001.
	nat.add(chainIstioOutput, l4proto(unix.IPPROTO_TCP), addr(dstAddr, expr.CmpOpNeq, loopback4), notMarked, counter(), redirectTo(podnet.OutboundPort))
	if v6 {
		nat.add(chainIstioOutput, l4proto(unix.IPPROTO_TCP), addr(dstAddr, expr.CmpOpNeq, loopback6), notMarked, counter(), redirectTo(podnet.OutboundPort))
	}
	return &Ruleset{Tables: tables}
}

// AnySocket as HostOptions.ProbeUID matches probes from any local socket,
// the equivalent of iptables' "-m owner --socket-exists".
const AnySocket = -1

// HostOptions select the node-side probe rule.
type HostOptions struct {
	// ProbeUID is the UID of the process that sends kubelet probes (the
	// kubelet's), or AnySocket to match any locally originated packet.
	ProbeUID int
	// IPv6 adds the IPv6 set and rule.
	IPv6 bool
}

// Host builds the node-side rule set: TCP from a local socket (of ProbeUID)
// to an enrolled pod IP is SNATed to the probe address, so the pod's rules
// let it through uncaptured.
func Host(opts HostOptions) *Ruleset {
	t := &Table{Name: NATTable, Chains: []*Chain{{
		Name: chainPostrouting, Type: nftables.ChainTypeNAT, Hook: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityNATSource),
	}}}
	t.Sets = append(t.Sets, &Set{Name: ProbeSetV4, Comment: "IPs of the pods enrolled in the ambient mesh"})
	t.add(chainPostrouting, l4proto(unix.IPPROTO_TCP), socketUID(opts.ProbeUID), lookup(dstAddr, ProbeSetV4, false), counter(), snatTo(ProbeSNATv4))
	if opts.IPv6 {
		t.Sets = append(t.Sets, &Set{Name: ProbeSetV6, IPv6: true, Comment: "IPs of the pods enrolled in the ambient mesh"})
		t.add(chainPostrouting, l4proto(unix.IPPROTO_TCP), socketUID(opts.ProbeUID), lookup(dstAddr6, ProbeSetV6, false), counter(), snatTo(ProbeSNATv6))
	}
	return &Ruleset{Tables: []*Table{t}}
}

// Expression builders. Each emits what the nft tool emits for the same
// rule text, so `nft list ruleset` prints Istio's rules.

const reg = 1 // NFT_REG_1

type addrField int

const (
	srcAddr addrField = iota
	dstAddr
	dstAddr6 // dstAddr of an IPv6 address, for lookups
)

type portField uint32

const (
	srcPort portField = 0
	dstPort portField = 2
)

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{p}},
	}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{p}},
	}
}

// ipHeader loads the source or destination address of the IPv4 or IPv6
// header, guarded by the family as nft does in inet tables.
func ipHeader(f addrField, v6 bool) []expr.Any {
	if v6 {
		off := uint32(8)
		if f != srcAddr {
			off = 24
		}
		return append(nfproto(unix.NFPROTO_IPV6), &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 16})
	}
	off := uint32(12)
	if f != srcAddr {
		off = 16
	}
	return append(nfproto(unix.NFPROTO_IPV4), &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4})
}

func addr(f addrField, op expr.CmpOp, a netip.Addr) []expr.Any {
	return append(ipHeader(f, a.Is6()), &expr.Cmp{Op: op, Register: reg, Data: a.AsSlice()})
}

func port(proto byte, f portField, op expr.CmpOp, p uint16) []expr.Any {
	return append(l4proto(proto),
		&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: uint32(f), Len: 2},
		&expr.Cmp{Op: op, Register: reg, Data: binary.BigEndian.AppendUint16(nil, p)},
	)
}

func native32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func markMasked(op expr.CmpOp, mask, v uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: native32(mask), Xor: native32(0)},
		&expr.Cmp{Op: op, Register: reg, Data: native32(v)},
	}
}

func ctMarkMasked(op expr.CmpOp, mask, v uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyMARK, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: native32(mask), Xor: native32(0)},
		&expr.Cmp{Op: op, Register: reg, Data: native32(v)},
	}
}

// ctMarkSet is "ct mark set ct mark & keep | v".
func ctMarkSet(keep, v uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyMARK, Register: reg},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: native32(keep), Xor: native32(v)},
		&expr.Ct{Key: expr.CtKeyMARK, Register: reg, SourceRegister: true},
	}
}

// metaMarkFromCt is "meta mark set ct mark".
func metaMarkFromCt() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeyMARK, Register: reg},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg, SourceRegister: true},
	}
}

func ctZoneSet(zone uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg, Data: binary.NativeEndian.AppendUint16(nil, zone)},
		&expr.Ct{Key: expr.CtKeyZONE, Register: reg, SourceRegister: true},
	}
}

func ifname(key uint32, op expr.CmpOp, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKey(key), Register: reg},
		&expr.Cmp{Op: op, Register: reg, Data: b},
	}
}

// socketUID matches packets from a local socket owned by uid, or from any
// local socket for AnySocket: loading skuid ends the rule for packets
// without a full socket, so "skuid >= 0" means "a local socket exists".
func socketUID(uid int) []expr.Any {
	if uid == AnySocket {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeySKUID, Register: reg},
			&expr.Cmp{Op: expr.CmpOpGte, Register: reg, Data: native32(0)},
		}
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeySKUID, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: native32(uint32(uid))},
	}
}

func lookup(f addrField, set string, invert bool) []expr.Any {
	return append(ipHeader(dstAddr, f == dstAddr6), &expr.Lookup{SourceRegister: reg, SetName: set, Invert: invert})
}

func counter() []expr.Any { return []expr.Any{&expr.Counter{}} }

func accept() []expr.Any { return verdict(expr.VerdictAccept) }

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

func redirectTo(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg, Data: binary.BigEndian.AppendUint16(nil, p)},
		&expr.Redir{RegisterProtoMin: reg},
	}
}

func snatTo(a netip.Addr) []expr.Any {
	fam := uint32(unix.NFPROTO_IPV4)
	if a.Is6() {
		fam = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Immediate{Register: reg, Data: a.AsSlice()},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: fam, RegAddrMin: reg},
	}
}
