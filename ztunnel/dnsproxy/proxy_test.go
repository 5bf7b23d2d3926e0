package dnsproxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/ztunnel/state"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hostSockets opens plain sockets: the tests run in one network.
type hostSockets struct{}

func (hostSockets) Listen(ctx context.Context, addr netip.AddrPort) (net.Listener, error) {
	var lc net.ListenConfig
	return lc.Listen(ctx, "tcp", addr.String())
}

func (hostSockets) ListenPacket(ctx context.Context, addr netip.AddrPort) (net.PacketConn, error) {
	var lc net.ListenConfig
	return lc.ListenPacket(ctx, "udp", addr.String())
}

func (hostSockets) DialNetwork(ctx context.Context, network string, dst netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, dst.String())
}

func addrBytes(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

func svcAddr(ns, name, host string, fam workloadpb.IPFamilies, vips ...string) *workloadpb.Address {
	if host == "" {
		host = name + "." + ns + ".svc.cluster.local"
	}
	s := &workloadpb.Service{Name: name, Namespace: ns, Hostname: host, IpFamilies: fam}
	for _, v := range vips {
		s.Addresses = append(s.Addresses, &workloadpb.NetworkAddress{Address: addrBytes(v)})
	}
	return &workloadpb.Address{Type: &workloadpb.Address_Service{Service: s}}
}

func podAddr(ns, name string, healthy bool, svcKey string, ips ...string) *workloadpb.Address {
	w := &workloadpb.Workload{
		Uid: "Kubernetes//Pod/" + ns + "/" + name, Name: name, Namespace: ns, ServiceAccount: "default", Node: "node1",
		CanonicalName: name, CanonicalRevision: "v1",
		Services: map[string]*workloadpb.PortList{},
	}
	if healthy {
		w.Status = workloadpb.WorkloadStatus_HEALTHY
	} else {
		w.Status = workloadpb.WorkloadStatus_UNHEALTHY
	}
	if svcKey != "" {
		w.Services[svcKey] = &workloadpb.PortList{Ports: []*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}}}
	}
	for _, ip := range ips {
		w.Addresses = append(w.Addresses, addrBytes(ip))
	}
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: w}}
}

// testStore is a mesh with, in namespace demo: echo (one IPv4 VIP),
// dual (IPv4 and IPv6 VIPs), v4only (IPv4-only, dual-stack pods), db
// (headless, two healthy pods and one not), a ServiceEntry-like
// api.example.com with a VIP and ext.example.com without, *.wild.example
// with a VIP; in namespace other: echo.
func testStore(t testing.TB) *state.Store {
	s := state.NewStore()
	addrs := []*workloadpb.Address{
		svcAddr("demo", "echo", "", 0, "10.96.1.1"),
		svcAddr("demo", "dual", "", 0, "10.96.1.2", "fd00::2"),
		svcAddr("demo", "v4only", "", workloadpb.IPFamilies_IPV4_ONLY),
		svcAddr("demo", "db", "", 0),
		svcAddr("demo", "api", "api.example.com", 0, "240.240.0.1"),
		svcAddr("demo", "ext", "ext.example.com", 0),
		svcAddr("demo", "wild", "*.wild.example", 0, "240.240.0.2"),
		svcAddr("other", "echo", "", 0, "10.96.2.1"),
		podAddr("demo", "client", true, "", "10.1.0.2"),
		podAddr("demo", "db-0", true, "demo/db.demo.svc.cluster.local", "10.1.0.5", "fd00:1::5"),
		podAddr("demo", "db-1", true, "demo/db.demo.svc.cluster.local", "10.1.0.6"),
		podAddr("demo", "db-2", false, "demo/db.demo.svc.cluster.local", "10.1.0.7"),
		podAddr("demo", "v4-0", true, "demo/v4only.demo.svc.cluster.local", "10.1.0.8", "fd00:1::8"),
	}
	m := map[string]*workloadpb.Address{}
	for i, a := range addrs {
		m[fmt.Sprint(i)] = a
	}
	if err := s.ApplyAddresses(m, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

// upstream is a nameserver on loopback (UDP and TCP on one port): it
// answers 198.51.100.1 for known.example, NXDOMAIN for names under
// missing.example, 100 A records for big.example (truncated over UDP),
// echoes an NSID option back, and records the queries it got.
type upstream struct {
	addr    netip.AddrPort
	servers []*dns.Server
	mu      sync.Mutex
	got     []*dns.Msg    // guarded by mu
	delay   time.Duration // guarded by mu: how long each answer waits
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	u := &upstream{}
	var pc net.PacketConn
	var ln net.Listener
	for range 10 {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
	}
	if ln == nil {
		t.Fatal("no port free for both UDP and TCP")
	}
	u.addr = pc.LocalAddr().(*net.UDPAddr).AddrPort()
	h := dns.HandlerFunc(u.serve)
	var started sync.WaitGroup
	started.Add(2)
	u.servers = []*dns.Server{
		{PacketConn: pc, Handler: h, NotifyStartedFunc: started.Done, UDPSize: dns.MaxMsgSize},
		{Listener: ln, Handler: h, NotifyStartedFunc: started.Done},
	}
	for _, s := range u.servers {
		go s.ActivateAndServe()
	}
	started.Wait()
	t.Cleanup(func() {
		for _, s := range u.servers {
			s.Shutdown()
		}
	})
	return u
}

func (u *upstream) serve(w dns.ResponseWriter, req *dns.Msg) {
	u.mu.Lock()
	u.got = append(u.got, req.Copy())
	delay := u.delay
	u.mu.Unlock()
	time.Sleep(delay)
	m := new(dns.Msg)
	m.SetReply(req)
	name := strings.ToLower(req.Question[0].Name)
	switch {
	case name == "known.example." && req.Question[0].Qtype == dns.TypeA:
		m.Answer = append(m.Answer, &dns.A{Hdr: header(req.Question[0].Name, dns.TypeA), A: net.IPv4(198, 51, 100, 1)})
	case name == "big.example.":
		for i := range 100 {
			m.Answer = append(m.Answer, &dns.A{Hdr: header(req.Question[0].Name, dns.TypeA), A: net.IPv4(198, 51, 100, byte(i))})
		}
	case name == "known.example.":
	default:
		m.Rcode = dns.RcodeNameError
	}
	size := dns.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		size = int(opt.UDPSize())
		m.SetEdns0(opt.UDPSize(), false)
		for _, o := range opt.Option {
			if o.Option() == dns.EDNS0NSID {
				m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: "7570"})
			}
		}
	}
	if w.LocalAddr().Network() == "udp" {
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

func (u *upstream) queries() []*dns.Msg {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.got)
}

type testProxy struct {
	srv     *Server
	metrics *prometheus.Registry
	r       *Resolver
}

// startProxy runs the DNS proxy of pod demo/client on loopback.
func startProxy(t testing.TB, store *state.Store, upstreams []netip.AddrPort, timeout time.Duration) *testProxy {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := NewResolver(Config{Store: store, Node: "node1", Upstreams: upstreams, Timeout: timeout, Metrics: NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	srv, stop := serveProxy(t, r, hostSockets{}, netip.MustParseAddrPort("127.0.0.1:0"))
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &testProxy{srv: srv, metrics: reg, r: r}
}

// serveProxy runs a DNS proxy of pod demo/client with r on addr until
// stop, which returns what Serve did.
func serveProxy(t testing.TB, r *Resolver, sockets Sockets, addr netip.AddrPort) (srv *Server, stop func() error) {
	t.Helper()
	srv, err := NewServer(ServerConfig{
		Resolver: r, Sockets: sockets,
		Client: Client{Namespace: "demo", Name: "client", ServiceAccount: "default"},
		Addrs:  []netip.AddrPort{addr},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	return srv, func() error { cancel(); return <-done }
}

func (p *testProxy) query(t testing.TB, network string, m *dns.Msg) *dns.Msg {
	t.Helper()
	addr := p.srv.UDPAddr().String()
	if network == "tcp" {
		addr = p.srv.TCPAddr().String()
	}
	c := &dns.Client{Net: network, Timeout: 5 * time.Second, UDPSize: 65535}
	resp, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s query for %s: %v", network, m.Question[0].Name, err)
	}
	return resp
}

// answers renders the answer section as "name type value" lines, sorted.
func answers(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		h := rr.Header()
		v := strings.TrimPrefix(rr.String(), h.String())
		out = append(out, fmt.Sprintf("%s %s %s ttl=%d", h.Name, dns.TypeToString[h.Rrtype], v, h.Ttl))
	}
	sort.Strings(out)
	return out
}

func TestMeshNames(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, testStore(t), []netip.AddrPort{up.addr}, time.Second)
	const svcTTL = "ttl=30"
	cases := []struct {
		name  string
		qtype uint16
		want  []string // nil: forwarded (the upstream says NXDOMAIN)
	}{
		// The forms a pod's resolver sends: fully qualified after the
		// search list, or as written by a client without one.
		{"echo.demo.svc.cluster.local.", dns.TypeA, []string{"echo.demo.svc.cluster.local. A 10.96.1.1 " + svcTTL}},
		{"ECHO.Demo.svc.cluster.local.", dns.TypeA, []string{"ECHO.Demo.svc.cluster.local. A 10.96.1.1 " + svcTTL}},
		{"echo.", dns.TypeA, []string{"echo. A 10.96.1.1 " + svcTTL}},
		{"echo.demo.", dns.TypeA, []string{"echo.demo. A 10.96.1.1 " + svcTTL}},
		{"echo.demo.svc.", dns.TypeA, []string{"echo.demo.svc. A 10.96.1.1 " + svcTTL}},
		{"echo.other.", dns.TypeA, []string{"echo.other. A 10.96.2.1 " + svcTTL}},
		{"echo.other.svc.cluster.local.", dns.TypeA, []string{"echo.other.svc.cluster.local. A 10.96.2.1 " + svcTTL}},
		// "echo.other" with the pod's first search domain appended.
		{"echo.other.demo.svc.cluster.local.", dns.TypeA, []string{
			"echo.other. A 10.96.2.1 " + svcTTL,
			"echo.other.demo.svc.cluster.local. CNAME echo.other. " + svcTTL,
		}},
		{"echo.demo.svc.cluster.local.", dns.TypeAAAA, []string{}},
		{"dual.demo.svc.cluster.local.", dns.TypeAAAA, []string{"dual.demo.svc.cluster.local. AAAA fd00::2 " + svcTTL}},
		{"dual.demo.svc.cluster.local.", dns.TypeA, []string{"dual.demo.svc.cluster.local. A 10.96.1.2 " + svcTTL}},
		// Headless: the healthy pods, one address of the family each.
		{"db.demo.svc.cluster.local.", dns.TypeA, []string{
			"db.demo.svc.cluster.local. A 10.1.0.5 " + svcTTL, "db.demo.svc.cluster.local. A 10.1.0.6 " + svcTTL,
		}},
		{"db.demo.svc.cluster.local.", dns.TypeAAAA, []string{"db.demo.svc.cluster.local. AAAA fd00:1::5 " + svcTTL}},
		// IPv4-only headless Service with dual-stack pods: no AAAA.
		{"v4only.demo.svc.cluster.local.", dns.TypeAAAA, []string{}},
		{"v4only.demo.svc.cluster.local.", dns.TypeA, []string{"v4only.demo.svc.cluster.local. A 10.1.0.8 " + svcTTL}},
		{"api.example.com.", dns.TypeA, []string{"api.example.com. A 240.240.0.1 " + svcTTL}},
		{"x.wild.example.", dns.TypeA, []string{"x.wild.example. A 240.240.0.2 " + svcTTL}},
		// Not the mesh's: forwarded.
		{"ext.example.com.", dns.TypeA, nil},
		{"nope.demo.svc.cluster.local.", dns.TypeA, nil},
		{"echo.nope.svc.cluster.local.", dns.TypeA, nil},
		{"a.b.c.d.e.cluster.local.", dns.TypeA, nil},
		{".", dns.TypeA, nil},
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, tc := range cases {
			t.Run(network+"/"+tc.name+"/"+dns.TypeToString[tc.qtype], func(t *testing.T) {
				before := len(up.queries())
				m := new(dns.Msg).SetQuestion(tc.name, tc.qtype)
				resp := p.query(t, network, m)
				forwarded := len(up.queries()) > before
				if tc.want == nil {
					if !forwarded || resp.Rcode != dns.RcodeNameError {
						t.Fatalf("forwarded %v, rcode %s; want the upstream's NXDOMAIN", forwarded, dns.RcodeToString[resp.Rcode])
					}
					return
				}
				if forwarded {
					t.Error("a mesh name was forwarded")
				}
				if resp.Rcode != dns.RcodeSuccess || !resp.Authoritative || resp.Id != m.Id {
					t.Errorf("rcode %s, authoritative %v, id %d (sent %d)", dns.RcodeToString[resp.Rcode], resp.Authoritative, resp.Id, m.Id)
				}
				if diff := cmp.Diff(tc.want, answers(resp), cmp.Comparer(func(a, b []string) bool { return len(a) == 0 && len(b) == 0 || slices.Equal(a, b) })); diff != "" {
					t.Errorf("answers (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func TestOtherTypesForwarded(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, testStore(t), []netip.AddrPort{up.addr}, time.Second)
	// A mesh name, asked for another type: the upstream answers.
	resp := p.query(t, "udp", new(dns.Msg).SetQuestion("echo.demo.svc.cluster.local.", dns.TypeTXT))
	if resp.Rcode != dns.RcodeNameError || len(up.queries()) != 1 {
		t.Errorf("TXT for a mesh name: rcode %s after %d upstream queries; want forwarded", dns.RcodeToString[resp.Rcode], len(up.queries()))
	}
	resp = p.query(t, "udp", new(dns.Msg).SetQuestion("known.example.", dns.TypeA))
	if got := answers(resp); len(got) != 1 || !strings.Contains(got[0], "198.51.100.1") || resp.Rcode != dns.RcodeSuccess {
		t.Errorf("known.example: %s %v", dns.RcodeToString[resp.Rcode], got)
	}
	// An empty NOERROR answer from upstream stays one.
	resp = p.query(t, "udp", new(dns.Msg).SetQuestion("known.example.", dns.TypeAAAA))
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
		t.Errorf("known.example AAAA: %s %v", dns.RcodeToString[resp.Rcode], answers(resp))
	}
}

func TestUpstreamNXDOMAINRelayed(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, testStore(t), []netip.AddrPort{up.addr}, time.Second)
	for _, network := range []string{"udp", "tcp"} {
		start := time.Now()
		m := new(dns.Msg).SetQuestion("a.missing.example.", dns.TypeA)
		resp := p.query(t, network, m)
		if resp.Rcode != dns.RcodeNameError || resp.Id != m.Id || time.Since(start) > time.Second {
			t.Errorf("%s: rcode %s id %d (sent %d) after %s; want NXDOMAIN at once", network, dns.RcodeToString[resp.Rcode], resp.Id, m.Id, time.Since(start))
		}
		// The question went upstream as the client sent it.
		got := up.queries()
		if last := got[len(got)-1]; last.Id != m.Id || last.Question[0] != m.Question[0] || !last.RecursionDesired {
			t.Errorf("%s: upstream got %v", network, last)
		}
	}
}

func TestUpstreamDownServfail(t *testing.T) {
	// A closed port: the upstream refuses at once.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	pc.Close()
	// A silent one: it never answers.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	mute := silent.LocalAddr().(*net.UDPAddr).AddrPort()
	for _, tc := range []struct {
		name      string
		upstreams []netip.AddrPort
		within    time.Duration
	}{
		{"refused", []netip.AddrPort{closed}, 500 * time.Millisecond},
		{"silent", []netip.AddrPort{mute}, 900 * time.Millisecond},
		{"both", []netip.AddrPort{closed, mute}, 900 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startProxy(t, testStore(t), tc.upstreams, 300*time.Millisecond)
			start := time.Now()
			resp := p.query(t, "udp", new(dns.Msg).SetQuestion("known.example.", dns.TypeA))
			if took := time.Since(start); resp.Rcode != dns.RcodeServerFailure || took > tc.within {
				t.Errorf("rcode %s after %s; want SERVFAIL within %s", dns.RcodeToString[resp.Rcode], took, tc.within)
			}
			labels := []string{"a", "udp", "client", "v1"}
			if got := testutil.ToFloat64(p.r.cfg.Metrics.failures.WithLabelValues(labels...)); got != 1 {
				t.Errorf("istio_dns_upstream_failures_total = %v, want 1", got)
			}
		})
	}
	// A mesh name needs no upstream.
	p := startProxy(t, testStore(t), []netip.AddrPort{closed}, 300*time.Millisecond)
	if resp := p.query(t, "udp", new(dns.Msg).SetQuestion("echo.demo.svc.cluster.local.", dns.TypeA)); len(resp.Answer) != 1 {
		t.Errorf("mesh name with the upstream down: %v", resp)
	}
}

func TestNextUpstream(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	pc.Close()
	up := startUpstream(t)
	p := startProxy(t, testStore(t), []netip.AddrPort{closed, up.addr}, time.Second)
	resp := p.query(t, "udp", new(dns.Msg).SetQuestion("known.example.", dns.TypeA))
	if len(resp.Answer) != 1 {
		t.Errorf("second upstream not tried: %v", resp)
	}
}

func TestTruncationAndTCPRetry(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, testStore(t), []netip.AddrPort{up.addr}, time.Second)
	m := new(dns.Msg).SetQuestion("big.example.", dns.TypeA)
	resp := p.query(t, "udp", m)
	if !resp.Truncated || len(resp.Answer) >= 100 {
		t.Fatalf("UDP answer: truncated %v with %d records; want the upstream's truncated answer", resp.Truncated, len(resp.Answer))
	}
	resp = p.query(t, "tcp", m)
	if resp.Truncated || len(resp.Answer) != 100 {
		t.Errorf("TCP answer: truncated %v with %d records; want all 100", resp.Truncated, len(resp.Answer))
	}
	got := up.queries()
	if len(got) != 2 {
		t.Fatalf("upstream got %d queries", len(got))
	}
	// What a client does with it: miekg's client does not retry, the
	// resolver library does; check the whole cycle with Go's resolver.
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		if network == "tcp" {
			return d.DialContext(ctx, network, p.srv.TCPAddr().String())
		}
		return d.DialContext(ctx, network, p.srv.UDPAddr().String())
	}}
	addrs, err := r.LookupNetIP(t.Context(), "ip4", "big.example.")
	if err != nil || len(addrs) != 100 {
		t.Errorf("Go resolver: %d addresses, %v; want 100 after its TCP retry", len(addrs), err)
	}
}

func TestEDNS(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, testStore(t), []netip.AddrPort{up.addr}, time.Second)
	for _, network := range []string{"udp", "tcp"} {
		m := new(dns.Msg).SetQuestion("known.example.", dns.TypeA)
		m.SetEdns0(4096, true)
		m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID})
		resp := p.query(t, network, m)
		opt := resp.IsEdns0()
		if opt == nil || len(opt.Option) != 1 || opt.Option[0].Option() != dns.EDNS0NSID {
			t.Errorf("%s: answer's OPT %v; want the upstream's, with its NSID", network, opt)
		}
		got := up.queries()
		if qopt := got[len(got)-1].IsEdns0(); qopt == nil || qopt.UDPSize() != 4096 || !qopt.Do() || len(qopt.Option) != 1 {
			t.Errorf("%s: upstream got OPT %v; want the client's", network, qopt)
		}
		// A mesh answer to an EDNS query carries an OPT too.
		m = new(dns.Msg).SetQuestion("echo.demo.svc.cluster.local.", dns.TypeA)
		m.SetEdns0(1232, false)
		if resp := p.query(t, network, m); resp.IsEdns0() == nil || len(resp.Answer) != 1 {
			t.Errorf("%s: mesh answer to an EDNS query: %v", network, resp)
		}
	}
}

func TestMeshAnswerTruncated(t *testing.T) {
	// A headless Service with more pods than fit in 512 bytes.
	store := testStore(t)
	m := map[string]*workloadpb.Address{"big": svcAddr("demo", "many", "", 0)}
	for i := range 60 {
		m[fmt.Sprint("p", i)] = podAddr("demo", fmt.Sprint("many-", i), true, "demo/many.demo.svc.cluster.local", fmt.Sprintf("10.2.0.%d", i+1))
	}
	if err := store.ApplyAddresses(m, nil); err != nil {
		t.Fatal(err)
	}
	up := startUpstream(t)
	p := startProxy(t, store, []netip.AddrPort{up.addr}, time.Second)
	q := new(dns.Msg).SetQuestion("many.demo.svc.cluster.local.", dns.TypeA)
	udp := p.query(t, "udp", q)
	tcp := p.query(t, "tcp", q)
	udp.Compress = true
	if !udp.Truncated || len(udp.Answer) >= 60 || udp.Len() > dns.MinMsgSize || len(tcp.Answer) != 60 || tcp.Truncated {
		t.Errorf("UDP: truncated %v, %d bytes; TCP: %d records, truncated %v", udp.Truncated, udp.Len(), len(tcp.Answer), tcp.Truncated)
	}
}

func TestMalformed(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, testStore(t), []netip.AddrPort{up.addr}, time.Second)
	exch := func(raw []byte) []byte {
		return p.r.Handle(t.Context(), Query{Client: Client{Namespace: "demo", Name: "client"}, Network: "udp", Raw: raw, Exchange: p.srv.exchange})
	}
	ok := new(dns.Msg).SetQuestion("echo.demo.svc.cluster.local.", dns.TypeA)
	good, _ := ok.Pack()
	two := ok.Copy()
	two.Question = append(two.Question, two.Question[0])
	twoRaw, _ := two.Pack()
	notify := ok.Copy()
	notify.Opcode = dns.OpcodeNotify
	notifyRaw, _ := notify.Pack()
	resp := ok.Copy()
	resp.Response = true
	respRaw, _ := resp.Pack()
	for _, tc := range []struct {
		name  string
		raw   []byte
		rcode int // -1: no answer
	}{
		{"empty", nil, -1},
		{"short header", good[:11], -1},
		{"header only, qdcount 1", good[:12], dns.RcodeFormatError},
		{"cut in the question", good[:20], dns.RcodeFormatError},
		{"two questions", twoRaw, dns.RcodeFormatError},
		{"notify", notifyRaw, dns.RcodeNotImplemented},
		{"a response", respRaw, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := exch(tc.raw)
			if tc.rcode < 0 {
				if out != nil {
					t.Errorf("answered %x", out)
				}
				return
			}
			var m dns.Msg
			if err := m.Unpack(out); err != nil {
				t.Fatalf("answer does not parse: %v", err)
			}
			if m.Rcode != tc.rcode || !m.Response || m.Id != ok.Id {
				t.Errorf("rcode %s response %v id %d; want %s, id %d", dns.RcodeToString[m.Rcode], m.Response, m.Id, dns.RcodeToString[tc.rcode], ok.Id)
			}
		})
	}
	if n := len(up.queries()); n != 0 {
		t.Errorf("%d malformed queries were forwarded", n)
	}
}

// paddedQuery is a query for name of exactly size bytes: its OPT record
// carries padding (RFC 7830), and extra more records follow it.
func paddedQuery(t *testing.T, name string, size int, extra ...dns.RR) *dns.Msg {
	t.Helper()
	m := new(dns.Msg).SetQuestion(name, dns.TypeA).SetEdns0(1232, false)
	pad := &dns.EDNS0_PADDING{}
	m.IsEdns0().Option = append(m.IsEdns0().Option, pad)
	n := m.Len()
	pad.Padding = make([]byte, size-n)
	if m.Len() != size {
		t.Fatalf("query of %d bytes, want %d", m.Len(), size)
	}
	m.Extra = append(m.Extra, extra...)
	return m
}

// sendUDP sends raw to the proxy from a socket of its own and returns the
// answer, or nil when none came within wait.
func sendUDP(t *testing.T, p *testProxy, raw []byte, wait time.Duration) []byte {
	t.Helper()
	c, err := net.Dial("udp", p.srv.UDPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(raw); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, dns.MaxMsgSize)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// A UDP datagram larger than any query is answered with FORMERR and not
// forwarded, even when what fits of it would parse; one that just fits is
// forwarded whole.
func TestOversizedUDPQuery(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, testStore(t), []netip.AddrPort{up.addr}, time.Second)
	tail := &dns.A{Hdr: header("known.example.", dns.TypeA), A: net.IPv4(192, 0, 2, 1)}
	over := paddedQuery(t, "known.example.", maxUDPQuery, tail)
	overRaw, err := over.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if len(overRaw) <= maxUDPQuery {
		t.Fatalf("oversized query is only %d bytes", len(overRaw))
	}
	var cut dns.Msg
	if err := cut.Unpack(overRaw[:maxUDPQuery]); err != nil {
		t.Fatalf("the cut query does not parse (%v): the test would not tell FORMERR by size from FORMERR by parsing", err)
	}
	for _, tc := range []struct {
		name  string
		raw   []byte
		rcode int
	}{
		{"fits", mustPack(t, paddedQuery(t, "known.example.", maxUDPQuery)), dns.RcodeSuccess},
		{"one byte over", overRaw, dns.RcodeFormatError},
		{"largest datagram", mustPack(t, paddedQuery(t, "known.example.", 65000)), dns.RcodeFormatError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(up.queries())
			out := sendUDP(t, p, tc.raw, 5*time.Second)
			var m dns.Msg
			if err := m.Unpack(out); err != nil {
				t.Fatalf("answer %x does not parse: %v", out, err)
			}
			id := uint16(tc.raw[0])<<8 | uint16(tc.raw[1])
			if m.Rcode != tc.rcode || !m.Response || m.Id != id {
				t.Errorf("rcode %s response %v id %d; want %s, id %d", dns.RcodeToString[m.Rcode], m.Response, m.Id, dns.RcodeToString[tc.rcode], id)
			}
			forwarded := len(up.queries()) - before
			if want := tc.rcode == dns.RcodeSuccess; (forwarded == 1) != want {
				t.Errorf("%d queries forwarded; want forwarded %v", forwarded, want)
			}
		})
	}
	// The server still answers.
	if got := answers(p.query(t, "udp", new(dns.Msg).SetQuestion("echo.demo.svc.cluster.local.", dns.TypeA))); len(got) == 0 {
		t.Error("no answer after the oversized queries")
	}
}

func mustPack(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	raw, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestMetrics(t *testing.T) {
	up := startUpstream(t)
	p := startProxy(t, testStore(t), []netip.AddrPort{up.addr}, time.Second)
	p.query(t, "udp", new(dns.Msg).SetQuestion("echo.demo.svc.cluster.local.", dns.TypeA))
	p.query(t, "tcp", new(dns.Msg).SetQuestion("known.example.", dns.TypeAAAA))
	families, err := p.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue()
			if h := m.GetHistogram(); h != nil {
				v = float64(h.GetSampleCount())
			}
			got[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = fmt.Sprint(v)
		}
	}
	want := map[string]string{
		"istio_dns_requests_total{request_protocol=udp,request_query_type=a,source_canonical_revision=v1,source_canonical_service=client}":                       "1",
		"istio_dns_requests_total{request_protocol=tcp,request_query_type=aaaa,source_canonical_revision=v1,source_canonical_service=client}":                    "1",
		"istio_dns_upstream_requests_total{request_protocol=tcp,request_query_type=aaaa,source_canonical_revision=v1,source_canonical_service=client}":           "1",
		"istio_dns_upstream_request_duration_seconds{request_protocol=tcp,request_query_type=aaaa,source_canonical_revision=v1,source_canonical_service=client}": "1",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

func TestReadResolvConf(t *testing.T) {
	path := t.TempDir() + "/resolv.conf"
	writeFile(t, path, "search demo.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\nnameserver fd00::10\noptions ndots:5\n")
	got, err := ReadResolvConf(path)
	want := []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("[fd00::10]:53")}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("ReadResolvConf = %v, %v; want %v", got, err, want)
	}
	writeFile(t, path, "search x\n")
	if _, err := ReadResolvConf(path); err == nil {
		t.Error("a resolv.conf without nameserver is accepted")
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
