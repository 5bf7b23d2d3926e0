package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/podnet"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/ztunnel/state"
)

// testSockets counts the connections a pod's proxy opens and lets a test
// wrap its listeners. Past maxDials it fails every dial, so that a proxy
// that loops on itself stops instead of exhausting the test's files.
type testSockets struct {
	loopSockets
	dials atomic.Int64
	wrap  func(port uint16, ln net.Listener) net.Listener
	// refuseSource fails every dial from a given source, as a kernel
	// that refuses IP_TRANSPARENT would.
	refuseSource bool
}

const maxDials = 50

func (s *testSockets) Listen(ctx context.Context, addr netip.AddrPort) (net.Listener, error) {
	ln, err := s.loopSockets.Listen(ctx, addr)
	if err == nil && s.wrap != nil {
		ln = s.wrap(addr.Port(), ln)
	}
	return ln, err
}

func (s *testSockets) Dial(ctx context.Context, dst, src netip.AddrPort) (net.Conn, error) {
	if s.dials.Add(1) > maxDials {
		return nil, errors.New("test: too many dials (a loop?)")
	}
	if s.refuseSource && src.Addr().IsValid() {
		return nil, fmt.Errorf("dial tcp %s: %w: setsockopt: operation not permitted", dst, ErrSourceNotBound)
	}
	return s.loopSockets.Dial(ctx, dst, src)
}

// failingListener returns errs, one per Accept, before accepting.
type failingListener struct {
	net.Listener
	errs chan error
}

func failWith(ln net.Listener, errs ...error) *failingListener {
	f := &failingListener{Listener: ln, errs: make(chan error, len(errs))}
	for _, err := range errs {
		f.errs <- err
	}
	return f
}

func (l *failingListener) Accept() (net.Conn, error) {
	select {
	case err := <-l.errs:
		return nil, err
	default:
		return l.Listener.Accept()
	}
}

// acceptErr is the error accept(2) failing with errno looks like.
func acceptErr(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
}

// callQuick is call with a short deadline, for connections expected to be
// refused.
func callQuick(addr, msg string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintln(c, msg)
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

func TestPlaintextSelfCallRefused(t *testing.T) {
	m := newMesh(t)
	m.apply(workload("demo", "echo", "echo", "127.0.0.24"))
	app(t, "127.0.0.24:8080", "echo")
	echo := m.startPod("demo", "echo", "echo", "127.0.0.24")
	// A connection that reaches 15006 without redirection (or one sent to
	// a ztunnel port and redirected) reads its own listener as the
	// original destination; connecting there would start a loop.
	for _, dst := range []string{
		"127.0.0.24:15006", "127.0.0.24:15001", "127.0.0.24:15008", "127.0.0.24:15053",
		"127.0.0.1:9", "[::1]:9", "[::ffff:127.0.0.1]:9", "0.0.0.0:9", "[::]:9", "224.0.0.1:9", "[ff02::1]:9",
	} {
		echo.set(dst)
		if got, err := callQuick("127.0.0.24:15006", "x"); err == nil {
			t.Errorf("plaintext to original destination %s answered %q", dst, got)
		}
	}
	if n := echo.dials.Load(); n != 0 {
		t.Errorf("ztunnel opened %d connections for targets it must refuse", n)
	}
	echo.set("127.0.0.24:8080")
	if got, err := call(t, "127.0.0.24:15006", "ok"); err != nil || got != "echo from 127.0.0.24: ok" {
		t.Errorf("after refusals, plaintext to the app: %q, %v", got, err)
	}
}

// hboneClient dials HBONE with the identity demo/<sa>.
func (m *mesh) hboneClient(sa string) (*hbone.Dialer, spiffe.Identity) {
	m.t.Helper()
	id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", sa)
	svid, err := m.ca.IssueSVID(id, time.Hour)
	if err != nil {
		m.t.Fatal(err)
	}
	cert := spiffe.StaticCertificate(svid)
	d, err := hbone.NewDialer(hbone.DialerConfig{
		TLS: func(_ spiffeid.ID, peers []spiffeid.ID) (*tls.Config, error) {
			return spiffe.ClientConfig(cert, m.ca.Roots(), peers), nil
		},
	})
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { d.Close() })
	return d, id
}

func TestHBONEToOwnPortsRefused(t *testing.T) {
	m := newMesh(t)
	m.apply(workload("demo", "echo", "echo", "127.0.0.25"))
	app(t, "127.0.0.25:8080", "echo")
	echo := m.startPod("demo", "echo", "echo", "127.0.0.25")
	echo.set("127.0.0.25:15006") // what an unredirected connection reads
	d, src := m.hboneClient("client")
	echoID, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "echo")
	target := func(authority string) hbone.Target {
		return hbone.Target{Source: src.ID(), Peers: []spiffeid.ID{echoID.ID()},
			Addr: netip.MustParseAddrPort("127.0.0.25:15008"), Authority: authority}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, authority := range []string{
		"127.0.0.25:15008", "127.0.0.25:15006", "127.0.0.25:15001", "127.0.0.25:15053",
		"127.0.0.1:8080", "[::1]:8080", "0.0.0.0:8080", "224.0.0.1:8080",
	} {
		st, err := d.Dial(ctx, target(authority))
		var se *hbone.StatusError
		if !errors.As(err, &se) || se.Code < 400 || se.Code >= 500 {
			t.Errorf("CONNECT %s: %v, want a 4xx refusal", authority, err)
		}
		if st != nil {
			st.Close()
		}
	}
	if n := echo.dials.Load(); n != 0 {
		t.Errorf("ztunnel opened %d connections for CONNECTs it must refuse", n)
	}
	st, err := d.Dial(ctx, target("127.0.0.25:8080"))
	if err != nil {
		t.Fatalf("CONNECT to the app after refusals: %v", err)
	}
	st.Close()
}

// portWorkload is a workload whose service port 80 goes to targetPort.
func portWorkload(name, ip, svc string, targetPort uint32) *workloadpb.Address {
	a := workload("demo", name, name, ip)
	a.GetWorkload().Services = map[string]*workloadpb.PortList{
		"demo/" + svc + ".demo.svc.cluster.local": {Ports: []*workloadpb.Port{{ServicePort: 80, TargetPort: targetPort}}},
	}
	return a
}

func portService(name, vip string, targetPort uint32) *workloadpb.Address {
	return &workloadpb.Address{Type: &workloadpb.Address_Service{Service: &workloadpb.Service{
		Name: name, Namespace: "demo", Hostname: name + ".demo.svc.cluster.local",
		Addresses: []*workloadpb.NetworkAddress{{Address: netip.MustParseAddr(vip).AsSlice()}},
		Ports:     []*workloadpb.Port{{ServicePort: 80, TargetPort: targetPort}},
	}}}
}

func TestOutboundToOwnPortsRefused(t *testing.T) {
	m := newMesh(t)
	// "to-echo" maps port 80 to echo's 15006, "to-self" to the client's
	// own 15008.
	m.apply(portWorkload("client", "127.0.0.15", "to-self", 15008), portWorkload("echo", "127.0.0.26", "to-echo", 15006),
		portService("to-echo", "10.96.0.26", 15006), portService("to-self", "10.96.0.15", 15008))
	app(t, "127.0.0.26:8080", "echo")
	client := m.startPod("demo", "client", "client", "127.0.0.15")
	echo := m.startPod("demo", "echo", "echo", "127.0.0.26")
	echo.set("127.0.0.26:15006")
	for _, dst := range []string{
		"127.0.0.15:15008", "127.0.0.15:15006", "127.0.0.15:15053", // itself
		"127.0.0.26:15006", "127.0.0.26:15008", "127.0.0.26:15001", "127.0.0.26:15053", // another pod's ztunnel ports
		"10.96.0.26:80", "10.96.0.15:80", // a Service VIP whose target port is one
		"127.0.0.1:9", "[::1]:9", "0.0.0.0:9", "224.0.0.1:9",
	} {
		client.set(dst)
		if got, err := callQuick("127.0.0.15:15001", "x"); err == nil {
			t.Errorf("outbound to %s answered %q", dst, got)
		}
	}
	if n, e := client.dials.Load(), echo.dials.Load(); n != 0 || e != 0 {
		t.Errorf("ztunnel opened %d connections from the client and %d from echo for targets it must refuse", n, e)
	}
	client.set("127.0.0.26:8080")
	if got, err := call(t, "127.0.0.15:15001", "ok"); err != nil || got != "echo from 127.0.0.26: ok" {
		t.Errorf("after refusals, outbound to the app: %q, %v", got, err)
	}
}

func TestAcceptLoopsSurviveTemporaryErrors(t *testing.T) {
	m := newMesh(t)
	m.apply(workload("demo", "client", "client", "127.0.0.16"), workload("demo", "echo", "echo", "127.0.0.27"))
	app(t, "127.0.0.27:8080", "echo")
	flaky := func(cfg *PodConfig) {
		cfg.Sockets = &testSockets{wrap: func(_ uint16, ln net.Listener) net.Listener {
			return failWith(ln, acceptErr(syscall.EMFILE), acceptErr(syscall.ENFILE), acceptErr(syscall.ENOBUFS),
				acceptErr(syscall.ENOMEM), acceptErr(syscall.ECONNABORTED), acceptErr(syscall.EMFILE))
		}}
	}
	client := m.startPod("demo", "client", "client", "127.0.0.16", flaky)
	echo := m.startPod("demo", "echo", "echo", "127.0.0.27", flaky)
	client.set("127.0.0.27:8080")
	echo.set("127.0.0.27:8080")
	for i := range 2 {
		if got, err := call(t, "127.0.0.16:15001", "hbone"); err != nil || got != "echo from 127.0.0.27: hbone" {
			t.Errorf("round %d: outbound over HBONE after accept errors: %q, %v", i, got, err)
		}
		if got, err := call(t, "127.0.0.27:15006", "plain"); err != nil || got != "echo from 127.0.0.27: plain" {
			t.Errorf("round %d: plaintext inbound after accept errors: %q, %v", i, got, err)
		}
	}
	for _, p := range []*testPod{client, echo} {
		if err := p.pod.Health(); err != nil {
			t.Errorf("health after temporary errors: %v", err)
		}
	}
}

// heldListener hands each accepted connection out only once release is
// closed, announcing it on accepted first.
type heldListener struct {
	net.Listener
	accepted chan struct{}
	release  chan struct{}
}

func (l *heldListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted <- struct{}{}
		<-l.release
	}
	return c, err
}

// TestDrainServesConnectionsAcceptedAsItBegins holds a connection between
// accept(2) and the accept loop while the pod begins to drain, as a
// restart can catch one: it must be served, not closed (which resets a
// client that has sent its request).
func TestDrainServesConnectionsAcceptedAsItBegins(t *testing.T) {
	m := newMesh(t)
	m.apply(workload("demo", "echo", "echo", "127.0.0.28"))
	app(t, "127.0.0.28:8080", "echo")
	held := &heldListener{accepted: make(chan struct{}, 1), release: make(chan struct{})}
	echo := m.startPod("demo", "echo", "echo", "127.0.0.28", func(cfg *PodConfig) {
		cfg.Sockets = &testSockets{wrap: func(p uint16, ln net.Listener) net.Listener {
			if p != podnet.InboundPlaintextPort {
				return ln
			}
			held.Listener = ln
			return held
		}}
	})
	echo.set("127.0.0.28:8080")
	type answer struct {
		got string
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		got, err := call(t, "127.0.0.28:15006", "late")
		answered <- answer{got, err}
	}()
	<-held.accepted
	echo.stop()
	for {
		echo.pod.mu.Lock()
		draining := echo.pod.draining
		echo.pod.mu.Unlock()
		if draining {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(held.release)
	if a := <-answered; a.err != nil || a.got != "echo from 127.0.0.28: late" {
		t.Errorf("a connection accepted as the drain began: %q, %v", a.got, a.err)
	}
}

func TestDeadListenerFailsHealth(t *testing.T) {
	for i, port := range []uint16{podnet.OutboundPort, podnet.InboundPlaintextPort, podnet.HBONEPort} {
		t.Run(fmt.Sprint(port), func(t *testing.T) {
			m := newMesh(t)
			ip := fmt.Sprintf("127.0.0.%d", 40+i)
			m.apply(workload("demo", "echo", "echo", ip))
			app(t, ip+":8080", "echo")
			echo := m.startPod("demo", "echo", "echo", ip, func(cfg *PodConfig) {
				cfg.Sockets = &testSockets{wrap: func(p uint16, ln net.Listener) net.Listener {
					if p != port {
						return ln
					}
					return failWith(ln, &net.OpError{Op: "accept", Net: "tcp", Err: errors.New("listener broke")})
				}}
			})
			deadline := time.Now().Add(5 * time.Second)
			for echo.pod.Health() == nil && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if err := echo.pod.Health(); err == nil {
				t.Fatalf("a listener on %d died and the pod still reports healthy", port)
			}
			// The dead listener is closed: connections are refused, not queued.
			addr := netip.AddrPortFrom(netip.MustParseAddr(ip), port).String()
			if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
				c.Close()
				t.Errorf("%s still takes connections after its listener died", addr)
			}
		})
	}
}

func TestPodConnectionLimit(t *testing.T) {
	m := newMesh(t)
	m.apply(workload("demo", "busy", "busy", "127.0.0.17"), workload("demo", "calm", "calm", "127.0.0.18"),
		workload("demo", "client", "client", "127.0.0.19"))
	app(t, "127.0.0.17:8080", "busy")
	app(t, "127.0.0.18:8080", "calm")
	busy := m.startPod("demo", "busy", "busy", "127.0.0.17", func(cfg *PodConfig) { cfg.MaxConnections = 2 })
	calm := m.startPod("demo", "calm", "calm", "127.0.0.18")
	client := m.startPod("demo", "client", "client", "127.0.0.19")
	busy.set("127.0.0.17:8080")
	calm.set("127.0.0.18:8080")
	// Two connections held open take busy's two inbound slots.
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", "127.0.0.17:15006")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintln(c, "hold")
		if _, err := c.Read(make([]byte, 64)); err != nil {
			t.Fatalf("connection within the limit: %v", err)
		}
		held = append(held, c)
	}
	if got, err := callQuick("127.0.0.17:15006", "over"); err == nil {
		t.Errorf("a third plaintext connection got through a limit of 2: %q", got)
	}
	client.set("127.0.0.17:8080")
	if got, err := callQuick("127.0.0.19:15001", "over"); err == nil {
		t.Errorf("an HBONE connection got through busy's limit: %q", got)
	}
	// The other pods are not affected.
	if got, err := call(t, "127.0.0.18:15006", "calm"); err != nil || got != "calm from 127.0.0.18: calm" {
		t.Errorf("another pod, while busy is at its limit: %q, %v", got, err)
	}
	client.set("127.0.0.18:8080")
	if got, err := call(t, "127.0.0.19:15001", "calm"); err != nil || got != "calm from 127.0.0.18: calm" {
		t.Errorf("another pod over HBONE, while busy is at its limit: %q, %v", got, err)
	}
	// busy's own outbound connections have their own slots.
	busy.set("127.0.0.18:8080")
	if got, err := call(t, "127.0.0.17:15001", "out"); err != nil || got != "calm from 127.0.0.18: out" {
		t.Errorf("busy connecting out while its inbound slots are full: %q, %v", got, err)
	}
	busy.set("127.0.0.17:8080")
	if n := testutil.ToFloat64(m.metrics.limited); n < 2 {
		t.Errorf("refusals counted: %v, want at least 2", n)
	}
	// A slot freed is a slot usable again.
	held[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := callQuick("127.0.0.17:15006", "again")
		if err == nil && got == "busy from 127.0.0.17: again\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("busy after a connection closed: %q, %v", got, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Every slot comes back once the connections are gone (HBONE
	// connections and tunnels included).
	held[1].Close()
	m.stop()
	for name, p := range map[string]*testPod{"busy": busy, "calm": calm, "client": client} {
		if in, out := p.pod.in.n.Load(), p.pod.out.n.Load(); in != 0 || out != 0 {
			t.Errorf("%s holds %d inbound and %d outbound slots after stopping", name, in, out)
		}
	}
}

func TestCheckTarget(t *testing.T) {
	prod, harness := &Pod{}, &Pod{cfg: PodConfig{loopbackPods: true}}
	for _, tt := range []struct {
		dst            string
		ports, refused bool
	}{
		{"10.244.1.5:8080", true, false},
		{"10.244.1.5:15001", true, true},
		{"10.244.1.5:15006", true, true},
		{"10.244.1.5:15008", true, true},
		{"10.244.1.5:15053", true, true},
		{"10.244.1.5:15006", false, false}, // another pod's port, not a tunnel target
		{"10.244.1.5:15000", true, false},  // ztunnel's admin is in its own netns
		{"10.244.1.5:15020", true, false},
		{"10.244.1.5:15021", true, false},
		{"[fd00::5]:15008", true, true},
		{"[::ffff:10.244.1.5]:15006", true, true},
		{"169.254.169.254:80", true, false},
		{"127.0.0.1:8080", false, true},
		{"127.0.0.2:8080", false, true},
		{"127.255.255.254:8080", false, true},
		{"[::1]:8080", false, true},
		{"[::ffff:127.0.0.1]:8080", false, true},
		{"0.0.0.0:8080", false, true},
		{"0.1.2.3:8080", false, true},
		{"[::]:8080", false, true},
		{"[::ffff:0.0.0.0]:8080", false, true},
		{"224.0.0.1:8080", false, true},
		{"239.255.255.250:8080", false, true},
		{"[ff02::1]:8080", false, true},
		{"[ff05::2]:8080", false, true},
		{"255.255.255.255:8080", false, true},
	} {
		err := prod.checkTarget(netip.MustParseAddrPort(tt.dst), tt.ports)
		if (err != nil) != tt.refused {
			t.Errorf("checkTarget(%s, ports=%v) = %v, want refused=%v", tt.dst, tt.ports, err, tt.refused)
		}
	}
	// The loopback harness of these tests still refuses 127.0.0.1.
	if harness.checkTarget(netip.MustParseAddrPort("127.0.0.1:8080"), false) == nil ||
		harness.checkTarget(netip.MustParseAddrPort("127.0.0.20:8080"), false) != nil {
		t.Error("the test harness's loopback pods are not what the tests assume")
	}
}

func TestCheckOutboundRoutes(t *testing.T) {
	p := &Pod{}
	self := &state.Workload{IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}}
	ap := netip.MustParseAddrPort
	svc := &state.Service{Hostname: "echo.demo.svc.cluster.local"}
	for _, tt := range []struct {
		name    string
		route   state.Route
		refused bool
	}{
		{"passthrough out", state.Route{Kind: state.Passthrough, Addr: ap("203.0.113.7:443")}, false},
		{"passthrough to another address's 15006", state.Route{Kind: state.Passthrough, Addr: ap("203.0.113.7:15006")}, false},
		{"passthrough to itself on 15006", state.Route{Kind: state.Passthrough, Addr: ap("10.244.1.5:15006")}, true},
		{"plain to loopback (a WorkloadEntry at 127.0.0.1)", state.Route{Kind: state.Plain, Addr: ap("127.0.0.1:8080")}, true},
		{"tunnel", state.Route{Kind: state.Tunnel, Addr: ap("10.244.2.9:15008"), Authority: ap("10.244.2.9:8080")}, false},
		{"tunnel to another pod's 15006", state.Route{Kind: state.Tunnel, Addr: ap("10.244.2.9:15008"), Authority: ap("10.244.2.9:15006")}, true},
		{"tunnel to itself on 15008", state.Route{Kind: state.Tunnel, Addr: ap("10.244.1.5:15008"), Authority: ap("10.244.1.5:15008")}, true},
		{"tunnel via loopback", state.Route{Kind: state.Tunnel, Addr: ap("127.0.0.1:15008"), Authority: ap("127.0.0.1:8080")}, true},
		{"waypoint for a service port 15008", state.Route{Kind: state.Waypoint, Addr: ap("10.244.3.3:15008"), Authority: ap("10.96.0.9:15008"), Service: svc}, false},
		{"waypoint for a workload's 15006", state.Route{Kind: state.Waypoint, Addr: ap("10.244.3.3:15008"), Authority: ap("10.244.2.9:15006")}, true},
		{"waypoint at loopback", state.Route{Kind: state.Waypoint, Addr: ap("127.0.0.1:15008"), Authority: ap("10.96.0.9:80"), Service: svc}, true},
		// A WorkloadEntry or ServiceEntry endpoint at a link-local address
		// that slipped past the webhook: never dialled, in any form.
		{"plain to link-local (metadata)", state.Route{Kind: state.Plain, Addr: ap("169.254.169.254:80")}, true},
		{"plain to link-local, mapped", state.Route{Kind: state.Plain, Addr: ap("[::ffff:169.254.169.254]:80")}, true},
		{"plain to IPv6 link-local", state.Route{Kind: state.Plain, Addr: ap("[fe80::1]:80")}, true},
		{"tunnel to link-local", state.Route{Kind: state.Tunnel, Addr: ap("169.254.1.1:15008"), Authority: ap("169.254.1.1:8080")}, true},
		{"waypoint at link-local", state.Route{Kind: state.Waypoint, Addr: ap("169.254.1.1:15008"), Authority: ap("10.96.0.9:80"), Service: svc}, true},
		{"plain to a WorkloadEntry", state.Route{Kind: state.Plain, Addr: ap("192.0.2.10:8080")}, false},
		{"plain to the pod itself on 15001", state.Route{Kind: state.Plain, Addr: ap("10.244.1.5:15001")}, true},
		{"plain to the pod itself, mapped, on 15053", state.Route{Kind: state.Plain, Addr: ap("[::ffff:10.244.1.5]:15053")}, true},
		{"plain to unspecified", state.Route{Kind: state.Plain, Addr: ap("0.0.0.0:8080")}, true},
		// The pod dialling the metadata service itself still reaches it.
		{"passthrough to link-local", state.Route{Kind: state.Passthrough, Addr: ap("169.254.169.254:80")}, false},
		{"a DNS ServiceEntry host that resolves link-local", state.Route{Kind: state.Plain, Host: "metadata.example", Addr: ap("169.254.169.254:80")}, false},
	} {
		err := p.checkOutbound(self, ap("10.96.0.9:80"), &tt.route)
		if (err != nil) != tt.refused {
			t.Errorf("%s: %v, want refused=%v", tt.name, err, tt.refused)
		}
	}
}

func TestPlaintextToAnotherAddressRefused(t *testing.T) {
	m := newMesh(t)
	m.apply(workload("demo", "echo", "echo", "127.0.0.29"))
	app(t, "127.0.0.29:8080", "echo")
	accepted := app(t, "127.0.0.99:8080", "elsewhere")
	echo := m.startPod("demo", "echo", "echo", "127.0.0.29")
	// The inbound rule redirects whatever TCP enters the pod, whatever its
	// destination: a neighbour can send the pod packets for another
	// address. ztunnel must not connect there from inside the pod, with the
	// pod's source address and past its outbound capture.
	echo.set("127.0.0.99:8080")
	if got, err := callQuick("127.0.0.29:15006", "relay"); err == nil {
		t.Errorf("plaintext for another address was relayed: %q", got)
	}
	if n := echo.dials.Load(); n != 0 || *accepted != 0 {
		t.Errorf("ztunnel opened %d connections (%d reached the other address)", n, *accepted)
	}
}

func TestMissingPolicyDenies(t *testing.T) {
	m := newMesh(t)
	echoW := workload("demo", "echo", "echo", "127.0.0.31")
	echoW.GetWorkload().AuthorizationPolicies = []string{"demo/not-yet"}
	m.apply(workload("demo", "client", "client", "127.0.0.32"), echoW)
	accepted := app(t, "127.0.0.31:8080", "echo")
	client := m.startPod("demo", "client", "client", "127.0.0.32")
	echo := m.startPod("demo", "echo", "echo", "127.0.0.31")
	client.set("127.0.0.31:8080")
	echo.set("127.0.0.31:8080")
	// The policy the workload names has not arrived: nothing gets in.
	if got, err := callQuick("127.0.0.32:15001", "hbone"); err == nil {
		t.Errorf("HBONE got in before the named policy arrived: %q", got)
	}
	if got, err := callQuick("127.0.0.31:15006", "plain"); err == nil {
		t.Errorf("plaintext got in before the named policy arrived: %q", got)
	}
	if n := echo.dials.Load(); n != 0 {
		t.Errorf("ztunnel connected to the app %d times before the policy arrived", n)
	}
	allowAll := &securitypb.Authorization{Name: "not-yet", Namespace: "demo", Scope: securitypb.Scope_WORKLOAD_SELECTOR,
		Rules: []*securitypb.Rule{{}}}
	if err := m.store.ApplyPolicies(map[string]*securitypb.Authorization{"demo/not-yet": allowAll}, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := call(t, "127.0.0.32:15001", "hbone"); err != nil || got != "echo from 127.0.0.31: hbone" {
		t.Errorf("HBONE once the policy arrived: %q, %v", got, err)
	}
	m.stop()
	if *accepted != 1 {
		t.Errorf("the app saw %d connections, want 1", *accepted)
	}
}
