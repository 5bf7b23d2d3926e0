package podnet

import (
	"net/netip"
	"testing"
)

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

func TestEndpointAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"10.244.1.5": true, "203.0.113.5": true, "2001:db8::5": true, "::ffff:10.0.0.1": true,
		"127.0.0.1": false, "127.8.9.1": false, "::1": false, "::ffff:127.0.0.1": false,
		"0.0.0.0": false, "0.1.2.3": false, "::": false, "224.0.0.1": false, "ff02::1": false,
		"169.254.169.254": false, "fe80::1": false, "255.255.255.255": false, "fe80::1%eth0": false,
		"8.8.8.8": true, "64:ff9b::7f00:1": true, // NAT64: the translator's, not ours
		"127.255.255.254": false, "::ffff:7f00:2": false, "::ffff:0.0.0.0": false, "239.255.255.250": false,
		"::ffff:224.0.0.1": false, "::ffff:169.254.169.254": false,
	} {
		if got := EndpointAddr(netip.MustParseAddr(addr)); got != want {
			t.Errorf("EndpointAddr(%s) = %v, want %v", addr, got, want)
		}
	}
	if EndpointAddr(netip.Addr{}) {
		t.Error("the zero Addr is an endpoint address")
	}
}
