package dnsproxy

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// FuzzHandle feeds raw messages to the resolver: it must not panic, and
// whatever it answers is a response with the query's ID (FORMERR for what
// does not parse). The upstream mirrors the query back as its answer, or
// fails, so garbage reaches the forwarding path too.
func FuzzHandle(f *testing.F) {
	for _, m := range []*dns.Msg{
		new(dns.Msg).SetQuestion("echo.demo.svc.cluster.local.", dns.TypeA),
		new(dns.Msg).SetQuestion("echo.other.demo.svc.cluster.local.", dns.TypeAAAA),
		new(dns.Msg).SetQuestion("db.demo.svc.cluster.local.", dns.TypeA).SetEdns0(4096, true),
		new(dns.Msg).SetQuestion("x.wild.example.", dns.TypeA),
		new(dns.Msg).SetQuestion("known.example.", dns.TypeTXT),
		new(dns.Msg).SetQuestion(".", dns.TypeNS),
	} {
		raw, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw, "udp")
		f.Add(raw, "tcp")
	}
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c}, "udp") // a pointer loop
	r, err := NewResolver(Config{
		Store: testStore(f), Node: "node1", Metrics: NewMetrics(prometheus.NewRegistry()),
		Upstreams: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:53")},
	})
	if err != nil {
		f.Fatal(err)
	}
	mirror := func(_ context.Context, _ string, _ netip.AddrPort, raw []byte) ([]byte, error) {
		if len(raw) > 3 && raw[3]&1 == 1 {
			return nil, errors.New("upstream down")
		}
		out := append([]byte(nil), raw...)
		out[2] |= 0x80
		return out, nil
	}
	f.Fuzz(func(t *testing.T, raw []byte, network string) {
		if network != "tcp" {
			network = "udp"
		}
		in := append([]byte(nil), raw...)
		out := r.Handle(context.Background(), Query{Client: Client{Namespace: "demo", Name: "client", ServiceAccount: "default"}, Network: network, Raw: in, Exchange: mirror})
		if out == nil {
			return
		}
		if len(out) < 12 || out[0] != raw[0] || out[1] != raw[1] || out[2]&0x80 == 0 {
			t.Fatalf("answer %x to %x is not a response with the query's ID", out, raw)
		}
		if network == "udp" && len(out) > dns.MaxMsgSize {
			t.Fatalf("answer of %d bytes", len(out))
		}
	})
}
