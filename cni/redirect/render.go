package redirect

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// String renders the rule set as nft-style text: tables, sets and chains
// sorted by name, rules in order. Rules read back from the kernel render the
// same way, which is how installed rules are compared with generated ones.
func (r *Ruleset) String() string {
	var b strings.Builder
	tables := slices.Clone(r.Tables)
	slices.SortFunc(tables, func(x, y *Table) int { return strings.Compare(x.Name, y.Name) })
	for i, t := range tables {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "table inet %s {\n", t.Name)
		sets := slices.Clone(t.Sets)
		slices.SortFunc(sets, func(x, y *Set) int { return strings.Compare(x.Name, y.Name) })
		for _, s := range sets {
			typ := "ipv4_addr"
			if s.IPv6 {
				typ = "ipv6_addr"
			}
			// The comment is not rendered: the kernel keeps it, but the
			// netlink library does not read it back.
			fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n\t}\n", s.Name, typ)
		}
		chains := slices.Clone(t.Chains)
		slices.SortFunc(chains, func(x, y *Chain) int { return strings.Compare(x.Name, y.Name) })
		for _, c := range chains {
			fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
			if c.Hook != nil {
				prio := 0
				if c.Priority != nil {
					prio = int(*c.Priority)
				}
				fmt.Fprintf(&b, "\t\ttype %s hook %s priority %d; policy accept;\n", c.Type, hookName(*c.Hook), prio)
			}
			for _, rule := range c.Rules {
				fmt.Fprintf(&b, "\t\t%s\n", RenderRule(rule))
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

func hookName(h nftables.ChainHook) string {
	switch h {
	case *nftables.ChainHookPrerouting:
		return "prerouting"
	case *nftables.ChainHookInput:
		return "input"
	case *nftables.ChainHookForward:
		return "forward"
	case *nftables.ChainHookOutput:
		return "output"
	case *nftables.ChainHookPostrouting:
		return "postrouting"
	}
	return fmt.Sprintf("hook%d", h)
}

// valueKind says how to print the bytes compared with a loaded value.
type valueKind int

const (
	kindHex valueKind = iota
	kindProto
	kindFamily
	kindNative32
	kindDecimal32
	kindAddr
	kindPort
	kindIfname
	kindZone
)

type operand struct {
	text string
	kind valueKind
	data []byte // an immediate's value
}

// RenderRule renders one rule's expressions as nft-style text. It knows the
// expression shapes this package emits; anything else is printed raw, so a
// foreign rule still shows up (and differs) in a comparison.
func RenderRule(exprs []expr.Any) string {
	var out []string
	regs := map[uint32]operand{}
	l4 := "th"
	for _, e := range exprs {
		switch e := e.(type) {
		case *expr.Meta:
			name, kind := metaName(e.Key)
			if e.SourceRegister {
				out = append(out, fmt.Sprintf("meta %s set %s", name, regs[e.Register].text))
				continue
			}
			regs[e.Register] = operand{text: "meta " + name, kind: kind}
		case *expr.Ct:
			name, kind := ctName(e.Key)
			if !e.SourceRegister && e.Register == unix.NFT_REG_VERDICT {
				// The netlink library reads a "ct set" back without its
				// source register: a ct load into the verdict register
				// cannot exist, so this is a set, and this package only
				// ever sets from register 1.
				e = &expr.Ct{Key: e.Key, Register: reg, SourceRegister: true}
			}
			if e.SourceRegister {
				src := regs[e.Register]
				val := src.text
				if src.data != nil {
					val = formatValue(kind, src.data)
				}
				out = append(out, fmt.Sprintf("ct %s set %s", name, val))
				continue
			}
			regs[e.Register] = operand{text: "ct " + name, kind: kind}
		case *expr.Payload:
			if e.OperationType != expr.PayloadLoad {
				out = append(out, fmt.Sprintf("<payload %+v>", *e))
				continue
			}
			regs[e.DestRegister] = payloadOperand(e, l4)
		case *expr.Bitwise:
			src := regs[e.SourceRegister]
			text := fmt.Sprintf("%s & %s", src.text, hex32(e.Mask))
			if !allZero(e.Xor) {
				text += " | " + hex32(e.Xor)
			}
			regs[e.DestRegister] = operand{text: text, kind: src.kind}
		case *expr.Cmp:
			src := regs[e.Register]
			if src.kind == kindProto && e.Op == expr.CmpOpEq && src.text == "meta l4proto" {
				l4 = protoName(e.Data)
			}
			out = append(out, fmt.Sprintf("%s %s %s", src.text, cmpOp(e.Op), formatValue(src.kind, e.Data)))
		case *expr.Immediate:
			if e.Register == unix.NFT_REG_VERDICT {
				out = append(out, fmt.Sprintf("<immediate verdict %x>", e.Data))
				continue
			}
			regs[e.Register] = operand{text: fmt.Sprintf("%x", e.Data), kind: kindHex, data: e.Data}
		case *expr.Lookup:
			op := ""
			if e.Invert {
				op = "!= "
			}
			out = append(out, fmt.Sprintf("%s %s@%s", regs[e.SourceRegister].text, op, e.SetName))
		case *expr.Counter:
			out = append(out, "counter")
		case *expr.Verdict:
			out = append(out, verdictText(e))
		case *expr.Redir:
			p := regs[e.RegisterProtoMin]
			out = append(out, "redirect to :"+formatValue(kindPort, p.data))
		case *expr.NAT:
			a := regs[e.RegAddrMin]
			kind := "snat"
			if e.Type == expr.NATTypeDestNAT {
				kind = "dnat"
			}
			fam := "ip"
			if e.Family == unix.NFPROTO_IPV6 {
				fam = "ip6"
			}
			out = append(out, fmt.Sprintf("%s %s to %s", kind, fam, formatValue(kindAddr, a.data)))
		default:
			out = append(out, fmt.Sprintf("<%T %+v>", e, e))
		}
	}
	return strings.Join(out, " ")
}

func metaName(k expr.MetaKey) (string, valueKind) {
	switch k {
	case expr.MetaKeyL4PROTO:
		return "l4proto", kindProto
	case expr.MetaKeyNFPROTO:
		return "nfproto", kindFamily
	case expr.MetaKeyMARK:
		return "mark", kindNative32
	case expr.MetaKeyIIFNAME:
		return "iifname", kindIfname
	case expr.MetaKeyOIFNAME:
		return "oifname", kindIfname
	case expr.MetaKeySKUID:
		return "skuid", kindDecimal32
	}
	return fmt.Sprintf("key%d", k), kindHex
}

func ctName(k expr.CtKey) (string, valueKind) {
	switch k {
	case expr.CtKeyMARK:
		return "mark", kindNative32
	case expr.CtKeyZONE:
		return "zone", kindZone
	}
	return fmt.Sprintf("key%d", k), kindHex
}

func payloadOperand(e *expr.Payload, l4 string) operand {
	switch {
	case e.Base == expr.PayloadBaseNetworkHeader && e.Len == 4 && e.Offset == 12:
		return operand{text: "ip saddr", kind: kindAddr}
	case e.Base == expr.PayloadBaseNetworkHeader && e.Len == 4 && e.Offset == 16:
		return operand{text: "ip daddr", kind: kindAddr}
	case e.Base == expr.PayloadBaseNetworkHeader && e.Len == 16 && e.Offset == 8:
		return operand{text: "ip6 saddr", kind: kindAddr}
	case e.Base == expr.PayloadBaseNetworkHeader && e.Len == 16 && e.Offset == 24:
		return operand{text: "ip6 daddr", kind: kindAddr}
	case e.Base == expr.PayloadBaseTransportHeader && e.Len == 2 && e.Offset == 0:
		return operand{text: l4 + " sport", kind: kindPort}
	case e.Base == expr.PayloadBaseTransportHeader && e.Len == 2 && e.Offset == 2:
		return operand{text: l4 + " dport", kind: kindPort}
	}
	return operand{text: fmt.Sprintf("payload base %d offset %d len %d", e.Base, e.Offset, e.Len), kind: kindHex}
}

func cmpOp(op expr.CmpOp) string {
	switch op {
	case expr.CmpOpEq:
		return "=="
	case expr.CmpOpNeq:
		return "!="
	case expr.CmpOpLt:
		return "<"
	case expr.CmpOpLte:
		return "<="
	case expr.CmpOpGt:
		return ">"
	case expr.CmpOpGte:
		return ">="
	}
	return fmt.Sprintf("op%d", op)
}

func formatValue(k valueKind, b []byte) string {
	switch {
	case k == kindProto && len(b) == 1:
		return protoName(b)
	case k == kindFamily && len(b) == 1:
		switch b[0] {
		case unix.NFPROTO_IPV4:
			return "ipv4"
		case unix.NFPROTO_IPV6:
			return "ipv6"
		}
	case k == kindNative32 && len(b) == 4:
		return hex32(b)
	case k == kindDecimal32 && len(b) == 4:
		return fmt.Sprint(binary.NativeEndian.Uint32(b))
	case k == kindAddr:
		if a, ok := netip.AddrFromSlice(b); ok {
			return a.String()
		}
	case k == kindPort && len(b) == 2:
		return fmt.Sprint(binary.BigEndian.Uint16(b))
	case k == kindZone && len(b) == 2:
		return fmt.Sprint(binary.NativeEndian.Uint16(b))
	case k == kindIfname:
		return fmt.Sprintf("%q", string(bytes.TrimRight(b, "\x00")))
	}
	return fmt.Sprintf("0x%x", b)
}

func protoName(b []byte) string {
	switch b[0] {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	}
	return fmt.Sprint(b[0])
}

func hex32(b []byte) string {
	if len(b) != 4 {
		return fmt.Sprintf("0x%x", b)
	}
	return fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(b))
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func verdictText(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictContinue:
		return "continue"
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictGoto:
		return "goto " + v.Chain
	}
	return fmt.Sprintf("verdict %d", v.Kind)
}
