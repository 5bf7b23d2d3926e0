package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/ztunnel/state"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// loopSockets stands in for a pod's netns on loopback: the pod's IP is a
// 127.0.0.x address, listeners bind it, upstream connections leave from it
// (or from src, when given: every 127.0.0.x is local).
type loopSockets struct{ ip netip.Addr }

func (s loopSockets) Listen(_ context.Context, addr netip.AddrPort) (net.Listener, error) {
	return net.Listen("tcp", netip.AddrPortFrom(s.ip, addr.Port()).String())
}

func (s loopSockets) Dial(ctx context.Context, dst, src netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: s.ip.AsSlice()}}
	if src.Addr().IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(src)
	}
	return d.DialContext(ctx, "tcp", dst.String())
}

// origDst is what the redirect would have recorded: set by the test before
// each connection.
type origDst struct {
	mu  sync.Mutex
	dst netip.AddrPort
}

func (o *origDst) set(s string) { o.mu.Lock(); o.dst = netip.MustParseAddrPort(s); o.mu.Unlock() }
func (o *origDst) get(net.Conn) (netip.AddrPort, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.dst, nil
}

type creds struct {
	cert func() (*tls.Certificate, error)
	ca   *spiffe.CA
}

func (c creds) Certificate() (*tls.Certificate, error) { return c.cert() }
func (c creds) Roots() *x509.CertPool                  { return c.ca.Roots() }

type mesh struct {
	t       *testing.T
	ca      *spiffe.CA
	store   *state.Store
	reg     *prometheus.Registry
	metrics *Metrics
	cancel  []context.CancelFunc
	done    []chan error
}

func newMesh(t *testing.T) *mesh {
	ca, err := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := &mesh{t: t, ca: ca, store: state.NewStore(), reg: reg, metrics: NewMetrics(reg)}
	t.Cleanup(m.stop)
	return m
}

func (m *mesh) stop() {
	for _, c := range m.cancel {
		c()
	}
	for _, d := range m.done {
		if err := <-d; err != nil {
			m.t.Errorf("pod Run: %v", err)
		}
	}
	m.cancel, m.done = nil, nil
}

func (m *mesh) apply(addrs ...*workloadpb.Address) {
	m.t.Helper()
	up := map[string]*workloadpb.Address{}
	for _, a := range addrs {
		if w := a.GetWorkload(); w != nil {
			up[w.GetUid()] = a
		} else {
			up[a.GetService().GetNamespace()+"/"+a.GetService().GetHostname()] = a
		}
	}
	if err := m.store.ApplyAddresses(up, nil); err != nil {
		m.t.Fatal(err)
	}
}

func workload(ns, name, sa, ip string, svcs ...string) *workloadpb.Address {
	w := &workloadpb.Workload{
		Uid: "Kubernetes//Pod/" + ns + "/" + name, Name: name, Namespace: ns, ServiceAccount: sa, Node: "n1",
		Addresses: [][]byte{netip.MustParseAddr(ip).AsSlice()}, TunnelProtocol: workloadpb.TunnelProtocol_HBONE,
		Services: map[string]*workloadpb.PortList{},
	}
	for _, s := range svcs {
		w.Services[s] = &workloadpb.PortList{Ports: []*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}}}
	}
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: w}}
}

// testPod is a running pod proxy: the test sets its original destination
// and counts the connections it opens.
type testPod struct {
	*origDst
	pod   *Pod
	dials *atomic.Int64
	stop  context.CancelFunc // begins the pod's drain
}

// startPod runs the proxy of a workload already in the store.
func (m *mesh) startPod(ns, name, sa, ip string, tweak ...func(*PodConfig)) *testPod {
	m.t.Helper()
	id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, ns, sa)
	svid, err := m.ca.IssueSVID(id, time.Hour)
	if err != nil {
		m.t.Fatal(err)
	}
	od := &origDst{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sockets := &testSockets{loopSockets: loopSockets{netip.MustParseAddr(ip)}}
	cfg := PodConfig{
		Namespace: ns, Name: name, ServiceAccount: sa, Node: "n1", Store: m.store,
		Sockets: sockets, OrigDst: od.get,
		Credentials: creds{spiffe.StaticCertificate(svid), m.ca}, Metrics: m.metrics,
		Logger: quiet, AccessLog: quiet, DrainTimeout: time.Second,
		loopbackPods: true,
	}
	for _, f := range tweak {
		f(&cfg)
	}
	if l, ok := cfg.Sockets.(*testSockets); ok && l != sockets {
		sockets = l // a tweak brought its own
		sockets.loopSockets = loopSockets{netip.MustParseAddr(ip)}
	}
	p, err := NewPod(cfg)
	if err != nil {
		m.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-p.Ready():
	case err := <-done:
		cancel()
		m.t.Fatalf("pod %s: %v", name, err)
	}
	m.cancel = append(m.cancel, cancel)
	m.done = append(m.done, done)
	return &testPod{origDst: od, pod: p, dials: &sockets.dials, stop: cancel}
}

// app is a TCP server that answers each line with who it is and who called.
func app(t *testing.T, addr, tag string) *int64 {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	accepted := new(int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			*accepted++
			mu.Unlock()
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "%s from %s: %s\n", tag, c.RemoteAddr().(*net.TCPAddr).IP, sc.Text())
				}
			}()
		}
	}()
	return accepted
}

func call(t *testing.T, addr, msg string) (string, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintln(c, msg)
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestOutboundThroughHBONE(t *testing.T) {
	m := newMesh(t)
	svc := &workloadpb.Address{Type: &workloadpb.Address_Service{Service: &workloadpb.Service{
		Name: "echo", Namespace: "demo", Hostname: "echo.demo.svc.cluster.local",
		Addresses: []*workloadpb.NetworkAddress{{Address: netip.MustParseAddr("10.96.0.20").AsSlice()}},
		Ports:     []*workloadpb.Port{{ServicePort: 80, TargetPort: 8080}},
	}}}
	m.apply(workload("demo", "client", "client", "127.0.0.10"),
		workload("demo", "echo", "echo", "127.0.0.20", "demo/echo.demo.svc.cluster.local"), svc)
	app(t, "127.0.0.20:8080", "echo")
	app(t, "127.0.0.30:9000", "outside")
	client := m.startPod("demo", "client", "client", "127.0.0.10")
	m.startPod("demo", "echo", "echo", "127.0.0.20")

	// Pod IP, over HBONE: the app sees the connection from ztunnel inside its pod.
	client.set("127.0.0.20:8080")
	got, err := call(t, "127.0.0.10:15001", "hello")
	if err != nil || got != "echo from 127.0.0.20: hello" {
		t.Fatalf("pod IP through HBONE: %q, %v", got, err)
	}
	// Service VIP: translated to an endpoint and its target port.
	client.set("10.96.0.20:80")
	if got, err := call(t, "127.0.0.10:15001", "via service"); err != nil || !strings.HasPrefix(got, "echo from") {
		t.Fatalf("service VIP: %q, %v", got, err)
	}
	// Not in the mesh: passthrough.
	client.set("127.0.0.30:9000")
	if got, err := call(t, "127.0.0.10:15001", "out"); err != nil || got != "outside from 127.0.0.10: out" {
		t.Fatalf("passthrough: %q, %v", got, err)
	}
	m.stop()
	if n := testutil.CollectAndCount(m.metrics.opened); n < 2 {
		t.Errorf("istio_tcp_connections_opened_total has %d series", n)
	}
	dstLabels := (&connLabels{reporter: "destination", mtls: true,
		src: m.store.WorkloadByIP(netip.MustParseAddr("127.0.0.10")), srcPrincipal: "spiffe://cluster.local/ns/demo/sa/client",
		dst: m.store.WorkloadByIP(netip.MustParseAddr("127.0.0.20")), dstPrincipal: "spiffe://cluster.local/ns/demo/sa/echo"}).values()
	opened := testutil.ToFloat64(m.metrics.opened.WithLabelValues(dstLabels...))
	if opened != 2 {
		t.Errorf("destination-side opened connections from client to echo = %v, want 2", opened)
	}
	// The bytes the client sent and those it got back, each way once.
	request := len("hello\n") + len("via service\n")
	response := len("echo from 127.0.0.20: hello\n") + len("echo from 127.0.0.20: via service\n")
	sent, recv := testutil.ToFloat64(m.metrics.sent.WithLabelValues(dstLabels...)), testutil.ToFloat64(m.metrics.received.WithLabelValues(dstLabels...))
	if sent != float64(request) || recv != float64(response) {
		t.Errorf("destination-side bytes sent %v, received %v; want %d, %d", sent, recv, request, response)
	}
}

func TestInboundPolicy(t *testing.T) {
	m := newMesh(t)
	m.apply(workload("demo", "client", "client", "127.0.0.11"), workload("demo", "other", "other", "127.0.0.12"),
		workload("demo", "echo", "echo", "127.0.0.21"))
	accepted := app(t, "127.0.0.21:8080", "echo")
	client := m.startPod("demo", "client", "client", "127.0.0.11")
	other := m.startPod("demo", "other", "other", "127.0.0.12")
	echo := m.startPod("demo", "echo", "echo", "127.0.0.21")
	allowClient := &securitypb.Authorization{Name: "allow-client", Namespace: "demo", Scope: securitypb.Scope_NAMESPACE,
		Rules: []*securitypb.Rule{{Clauses: []*securitypb.Clause{{Matches: []*securitypb.Match{{
			Principals: []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Exact{Exact: "cluster.local/ns/demo/sa/client"}}}}}}}}}}
	if err := m.store.ApplyPolicies(map[string]*securitypb.Authorization{"demo/allow-client": allowClient}, nil); err != nil {
		t.Fatal(err)
	}
	client.set("127.0.0.21:8080")
	if got, err := call(t, "127.0.0.11:15001", "a"); err != nil || got != "echo from 127.0.0.21: a" {
		t.Fatalf("allowed identity: %q, %v", got, err)
	}
	before := *accepted
	other.set("127.0.0.21:8080")
	if got, err := call(t, "127.0.0.12:15001", "b"); err == nil {
		t.Fatalf("denied identity got %q", got)
	}
	// Plaintext to 15006 has no identity: the ALLOW policy does not admit it.
	echo.set("127.0.0.21:8080")
	if got, err := call(t, "127.0.0.21:15006", "c"); err == nil {
		t.Fatalf("plaintext got through an identity policy: %q", got)
	}
	m.stop()
	if *accepted != before {
		t.Errorf("the app saw %d connections it should never have seen", *accepted-before)
	}
	denied := testutil.ToFloat64(m.metrics.failed.WithLabelValues((&connLabels{reporter: "destination", mtls: true, flags: flagDenied,
		src: m.store.WorkloadByIP(netip.MustParseAddr("127.0.0.12")), srcPrincipal: "spiffe://cluster.local/ns/demo/sa/other",
		dst: m.store.WorkloadByIP(netip.MustParseAddr("127.0.0.21")), dstPrincipal: "spiffe://cluster.local/ns/demo/sa/echo"}).values()...))
	if denied != 1 {
		t.Errorf("denied connections counted %v, want 1", denied)
	}
}

func TestPlaintextInboundAllowedWithoutPolicy(t *testing.T) {
	m := newMesh(t)
	m.apply(workload("demo", "echo", "echo", "127.0.0.22"))
	app(t, "127.0.0.22:8080", "echo")
	echo := m.startPod("demo", "echo", "echo", "127.0.0.22")
	echo.set("127.0.0.22:8080")
	if got, err := call(t, "127.0.0.22:15006", "p"); err != nil || got != "echo from 127.0.0.22: p" {
		t.Fatalf("plaintext inbound: %q, %v", got, err)
	}
}

func TestRefusesLoopsAndWrongTargets(t *testing.T) {
	m := newMesh(t)
	m.apply(workload("demo", "client", "client", "127.0.0.13"), workload("demo", "echo", "echo", "127.0.0.23"))
	app(t, "127.0.0.23:8080", "echo")
	client := m.startPod("demo", "client", "client", "127.0.0.13")
	m.startPod("demo", "echo", "echo", "127.0.0.23")
	client.set("127.0.0.13:15001")
	if _, err := call(t, "127.0.0.13:15001", "loop"); err == nil {
		t.Error("a connection to ztunnel's own capture port was proxied")
	}
}
