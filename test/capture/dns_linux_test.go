// Package capture holds root tests of ztunnel's in-pod listeners behind
// the CNI's real in-pod redirection rules, in network namespaces made for
// the test: what the two parts do together, without a cluster.
package capture

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/weftmesh/weft/cni/redirect"
	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/ztunnel/dnsproxy"
	"github.com/weftmesh/weft/ztunnel/inpod"
	"github.com/weftmesh/weft/ztunnel/proxy"
	"github.com/weftmesh/weft/ztunnel/state"
)

const (
	podIP = "10.250.9.1"
	// dnsIP is the pod's nameserver, in a namespace of its own.
	dnsIP = "10.250.9.2"
)

func rootOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("WEFT_ROOT_TESTS") == "" {
		t.Skip("set WEFT_ROOT_TESTS=1 (make test does) to run network-namespace tests")
	}
	if os.Geteuid() != 0 {
		t.Skip("network-namespace tests need root")
	}
}

// newNS makes a network namespace with lo up and eth0 (one end of veth)
// at addr, deleted at the end of the test.
func newNS(t *testing.T, tag string) *netns.NS {
	t.Helper()
	name := fmt.Sprintf("weft-capture-%d-%s", os.Getpid(), tag)
	ns, err := netns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.Delete(name); err != nil {
			t.Errorf("deleting %s: %v", name, err)
		}
	})
	return ns
}

// wire joins pod and server with a veth pair and brings everything up.
func wire(t *testing.T, pod, server *netns.NS) {
	t.Helper()
	h, err := pod.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(server.Fd())}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	for _, side := range []struct {
		ns   *netns.NS
		addr string
	}{{pod, podIP}, {server, dnsIP}} {
		h, err := side.ns.Netlink()
		if err != nil {
			t.Fatal(err)
		}
		for _, ifname := range []string{"lo", "eth0"} {
			l, err := h.LinkByName(ifname)
			if err == nil && ifname == "eth0" {
				pfx := netip.MustParsePrefix(side.addr + "/24")
				err = h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: pfx.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}})
			}
			if err == nil {
				err = h.LinkSetUp(l)
			}
			if err != nil {
				h.Close()
				t.Fatalf("%s: %v", ifname, err)
			}
		}
		h.Close()
	}
}

// nameserver serves, in ns on dnsIP:53 (UDP and TCP), 198.51.100.7 for
// known.example and NXDOMAIN for anything else, and records the source of
// each query.
type nameserver struct {
	mu      sync.Mutex
	sources []netip.Addr // guarded by mu
}

func startNameserver(t *testing.T, ns *netns.NS) *nameserver {
	t.Helper()
	n := &nameserver{}
	var pc net.PacketConn
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		if pc, err = net.ListenPacket("udp", dnsIP+":53"); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", dnsIP+":53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		src, _ := netip.ParseAddrPort(w.RemoteAddr().String())
		n.mu.Lock()
		n.sources = append(n.sources, src.Addr())
		n.mu.Unlock()
		m := new(dns.Msg).SetReply(req)
		if strings.EqualFold(req.Question[0].Name, "known.example.") && req.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.IPv4(198, 51, 100, 7)})
		} else {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})
	var started sync.WaitGroup
	started.Add(2)
	servers := []*dns.Server{
		{PacketConn: pc, Handler: h, NotifyStartedFunc: started.Done},
		{Listener: ln, Handler: h, NotifyStartedFunc: started.Done},
	}
	for _, s := range servers {
		go s.ActivateAndServe()
	}
	started.Wait()
	t.Cleanup(func() {
		for _, s := range servers {
			s.Shutdown()
		}
	})
	return n
}

func (n *nameserver) seen() []netip.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]netip.Addr(nil), n.sources...)
}

type creds struct {
	cert func() (*tls.Certificate, error)
	ca   *spiffe.CA
}

func (c creds) Certificate() (*tls.Certificate, error) { return c.cert() }
func (c creds) Roots() *x509.CertPool                  { return c.ca.Roots() }

// startPodProxy runs the pod proxy of demo/app with its DNS proxy.
func startPodProxy(t *testing.T, ns *netns.NS, store *state.Store) {
	t.Helper()
	ca, err := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "app")
	svid, err := ca.IssueSVID(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	resolver, err := dnsproxy.NewResolver(dnsproxy.Config{
		Store: store, Node: "n1", Upstreams: []netip.AddrPort{netip.MustParseAddrPort(dnsIP + ":53")},
		Timeout: time.Second, Metrics: dnsproxy.NewMetrics(prometheus.NewRegistry()), Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	sockets := inpod.Sockets{NS: ns}
	p, err := proxy.NewPod(proxy.PodConfig{
		Namespace: "demo", Name: "app", ServiceAccount: "app", Node: "n1", Store: store,
		Sockets: sockets, OrigDst: inpod.OrigDst, Credentials: creds{spiffe.StaticCertificate(svid), ca},
		Metrics: proxy.NewMetrics(prometheus.NewRegistry()), Logger: quiet, AccessLog: quiet, DrainTimeout: time.Second,
		DNS: resolver, DNSSockets: sockets,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pod proxy: %v", err)
		}
	})
	select {
	case <-p.Ready():
	case err := <-done:
		t.Fatal(err)
	}
}

// ask sends a question from inside ns, as the app would (no mark), to the
// pod's nameserver.
func ask(t *testing.T, ns *netns.NS, network, name string) (*dns.Msg, time.Duration) {
	t.Helper()
	var resp *dns.Msg
	var rtt time.Duration
	err := ns.Do(func() error {
		c := &dns.Client{Net: network, Timeout: 3 * time.Second}
		var err error
		resp, rtt, err = c.Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), dnsIP+":53")
		return err
	})
	if err != nil {
		t.Fatalf("%s %s: %v", network, name, err)
	}
	return resp, rtt
}

// TestDNSThroughTheRedirection resolves from a pod whose DNS the CNI's real
// rules send to ztunnel's DNS proxy: mesh names are answered by the proxy,
// others by the pod's nameserver through the proxy, whose own queries leave
// the pod (from the pod's address) without being captured again. With
// capture off, the same questions reach the nameserver directly.
func TestDNSThroughTheRedirection(t *testing.T) {
	rootOnly(t)
	pod, server := newNS(t, "pod"), newNS(t, "dns")
	wire(t, pod, server)
	ns := startNameserver(t, server)
	store := state.NewStore()
	svc := &workloadpb.Service{Name: "echo", Namespace: "demo", Hostname: "echo.demo.svc.cluster.local",
		Addresses: []*workloadpb.NetworkAddress{{Address: netip.MustParseAddr("10.96.7.7").AsSlice()}}}
	if err := store.ApplyAddresses(map[string]*workloadpb.Address{"echo": {Type: &workloadpb.Address_Service{Service: svc}}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := pod.Do(func() error { return redirect.ApplyPod(redirect.Options{DNSCapture: true}) }); err != nil {
		t.Fatal(err)
	}
	startPodProxy(t, pod, store)

	for _, network := range []string{"udp", "tcp"} {
		before := len(ns.seen())
		resp, _ := ask(t, pod, network, "echo.demo.svc.cluster.local.")
		if len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "10.96.7.7" || !resp.Authoritative {
			t.Errorf("%s: mesh name answered %v; want the proxy's 10.96.7.7", network, resp.Answer)
		}
		if len(ns.seen()) != before {
			t.Errorf("%s: a mesh name reached the nameserver", network)
		}
		resp, _ = ask(t, pod, network, "known.example.")
		if len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "198.51.100.7" {
			t.Errorf("%s: known.example answered %v; want the nameserver's", network, resp.Answer)
		}
		resp, rtt := ask(t, pod, network, "missing.example.")
		if resp.Rcode != dns.RcodeNameError || rtt > time.Second {
			t.Errorf("%s: missing.example: %s after %s; want NXDOMAIN at once", network, dns.RcodeToString[resp.Rcode], rtt)
		}
		seen := ns.seen()[before:]
		if len(seen) != 2 || seen[0].String() != podIP || seen[1].String() != podIP {
			t.Errorf("%s: the nameserver got queries from %v; want two, from the pod (%s)", network, seen, podIP)
		}
	}

	// Capture off (the annotation's or the chart's false): the app's DNS
	// goes to the nameserver itself.
	if err := pod.Do(func() error { return redirect.ApplyPod(redirect.Options{DNSCapture: false}) }); err != nil {
		t.Fatal(err)
	}
	before := len(ns.seen())
	if resp, _ := ask(t, pod, "udp", "echo.demo.svc.cluster.local."); resp.Rcode != dns.RcodeNameError || len(ns.seen()) != before+1 {
		t.Errorf("capture off: %s, nameserver got %d queries; want its NXDOMAIN", dns.RcodeToString[resp.Rcode], len(ns.seen())-before)
	}
	if err := pod.Do(redirect.RemovePod); err != nil {
		t.Fatal(err)
	}
}
