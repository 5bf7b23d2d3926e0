package podnet

import "testing"

// TestIstioValues spells Istio's values independently: ztunnel's in-pod
// ports and the CNI's marks must match theirs, or a Weft ztunnel and an
// Istio CNI (or the reverse) would not understand each other's pods.
func TestIstioValues(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"OutboundPort", OutboundPort, 15001},
		{"InboundPlaintextPort", InboundPlaintextPort, 15006},
		{"HBONEPort", HBONEPort, 15008},
		{"DNSPort", DNSPort, 15053},
		{"ZtunnelMark", ZtunnelMark, 1337},
		{"ConnMark", ConnMark, 0x111},
		{"MarkMask", MarkMask, 0xfff},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if ZtunnelMark&MarkMask == ConnMark&MarkMask {
		t.Error("the marks are equal under their mask: the rules could not tell them apart")
	}
}
