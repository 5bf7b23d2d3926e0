package redirect

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/podnet"
)

// pod and peer addresses of the test topology: one veth between two
// namespaces the test creates.
var (
	podV4  = netip.MustParseAddr("10.99.0.2")
	peerV4 = netip.MustParseAddr("10.99.0.1")
	podV6  = netip.MustParseAddr("fd00:99::2")
	peerV6 = netip.MustParseAddr("fd00:99::1")
)

type topo struct {
	pod, peer string // netns paths
}

func newTopo(t *testing.T) topo {
	t.Helper()
	requireRoot(t)
	tp := topo{pod: newNetns(t, "pod"), peer: newNetns(t, "peer")}
	vethPair(t, tp.pod, tp.peer, []string{podV4.String() + "/24", podV6.String() + "/64"}, []string{peerV4.String() + "/24", peerV6.String() + "/64"})
	return tp
}

// listen opens a TCP listener inside ns.
func listen(t *testing.T, ns, network, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	mustInNetns(t, ns, func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	t.Cleanup(func() { l.Close() })
	return l
}

// dialer dials from inside ns, optionally with SO_MARK and a source address.
func dial(t *testing.T, ns, network, addr string, mark int, src netip.Addr) (net.Conn, error) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	if mark != 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark) }); err != nil {
				return err
			}
			return serr
		}
	}
	var c net.Conn
	err := inNetns(ns, func() (err error) {
		c, err = d.Dial(network, addr)
		return err
	})
	if c != nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// origDst reads SO_ORIGINAL_DST (IPv4) or IP6T_SO_ORIGINAL_DST (IPv6).
func origDst(t *testing.T, c net.Conn) netip.AddrPort {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ap netip.AddrPort
	var serr error
	local := c.LocalAddr().(*net.TCPAddr)
	rc.Control(func(fd uintptr) {
		if local.IP.To4() != nil {
			var mreq *unix.IPv6Mreq
			mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
			if serr == nil {
				b := mreq.Multiaddr
				ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4]))
			}
			return
		}
		var info *unix.IPv6MTUInfo
		info, serr = unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, ip6tSOOriginalDst)
		if serr == nil {
			// Port holds the network-order bytes in memory.
			p := binary.NativeEndian.AppendUint16(nil, info.Addr.Port)
			ap = netip.AddrPortFrom(netip.AddrFrom16(info.Addr.Addr), binary.BigEndian.Uint16(p))
		}
	})
	if serr != nil {
		t.Fatalf("reading the original destination: %v", serr)
	}
	return ap
}

// accept waits for one connection on l and echoes a greeting naming l.
func acceptOne(t *testing.T, l net.Listener) <-chan net.Conn {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(ch)
			return
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "%s\n", l.Addr())
		ch <- c
	}()
	return ch
}

func readLine(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 128)
	n, err := c.Read(b)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("reading from %s: %v", c.RemoteAddr(), err)
	}
	return strings.TrimSpace(string(b[:n]))
}

func TestApplyPodRedirects(t *testing.T) {
	tp := newTopo(t)
	mustInNetns(t, tp.pod, func() error { return ApplyPod(defaults) })

	out := listen(t, tp.pod, "tcp", "[::]:15001")
	in := listen(t, tp.pod, "tcp", "[::]:15006")
	hbone := listen(t, tp.pod, "tcp", "[::]:15008")
	app := listen(t, tp.pod, "tcp", "[::]:8081")
	peerApp := listen(t, tp.peer, "tcp", "[::]:9091")

	t.Run("outbound to 15001 with the original destination", func(t *testing.T) {
		for _, dst := range []netip.AddrPort{netip.AddrPortFrom(peerV4, 9090), netip.AddrPortFrom(peerV6, 9090)} {
			got := acceptOne(t, out)
			c, err := dial(t, tp.pod, "tcp", dst.String(), 0, netip.Addr{})
			if err != nil {
				t.Fatalf("dial %s: %v", dst, err)
			}
			sc := <-got
			if line := readLine(t, c); !strings.HasSuffix(line, ":15001") {
				t.Fatalf("dial %s answered by %q, want the 15001 listener", dst, line)
			}
			if od := origDst(t, sc); od != dst {
				t.Fatalf("original destination %s, want %s", od, dst)
			}
		}
	})
	t.Run("inbound plaintext to 15006 with the original destination", func(t *testing.T) {
		for _, dst := range []netip.AddrPort{netip.AddrPortFrom(podV4, 8080), netip.AddrPortFrom(podV6, 8080)} {
			got := acceptOne(t, in)
			c, err := dial(t, tp.peer, "tcp", dst.String(), 0, netip.Addr{})
			if err != nil {
				t.Fatalf("dial %s: %v", dst, err)
			}
			sc := <-got
			if line := readLine(t, c); !strings.HasSuffix(line, ":15006") {
				t.Fatalf("dial %s answered by %q, want the 15006 listener", dst, line)
			}
			if od := origDst(t, sc); od != dst {
				t.Fatalf("original destination %s, want %s", od, dst)
			}
		}
	})
	t.Run("inbound HBONE reaches 15008 directly", func(t *testing.T) {
		got := acceptOne(t, hbone)
		c, err := dial(t, tp.peer, "tcp", netip.AddrPortFrom(podV4, podnet.HBONEPort).String(), 0, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		<-got
		if line := readLine(t, c); !strings.HasSuffix(line, ":15008") {
			t.Fatalf("answered by %q, want the 15008 listener", line)
		}
	})
	t.Run("ztunnel-marked sockets bypass capture", func(t *testing.T) {
		got := acceptOne(t, peerApp)
		c, err := dial(t, tp.pod, "tcp", netip.AddrPortFrom(peerV4, 9091).String(), int(podnet.ZtunnelMark), netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		<-got
		if line := readLine(t, c); !strings.HasSuffix(line, ":9091") {
			t.Fatalf("answered by %q, want the peer's app", line)
		}
	})
	t.Run("loopback is not captured", func(t *testing.T) {
		got := acceptOne(t, app)
		c, err := dial(t, tp.pod, "tcp", "127.0.0.1:8081", 0, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		<-got
		if line := readLine(t, c); !strings.HasSuffix(line, ":8081") {
			t.Fatalf("answered by %q, want the pod's app", line)
		}
	})
	t.Run("probes from the SNAT address reach the app", func(t *testing.T) {
		run(t, "ip", "-n", nsName(tp.peer), "addr", "add", ProbeSNATv4.String()+"/32", "dev", "eth0")
		run(t, "ip", "-n", nsName(tp.pod), "route", "add", ProbeSNATv4.String()+"/32", "dev", "eth0")
		got := acceptOne(t, app)
		c, err := dial(t, tp.peer, "tcp", netip.AddrPortFrom(podV4, 8081).String(), 0, ProbeSNATv4)
		if err != nil {
			t.Fatal(err)
		}
		<-got
		if line := readLine(t, c); !strings.HasSuffix(line, ":8081") {
			t.Fatalf("answered by %q, want the pod's app", line)
		}
	})
	t.Run("replies on ztunnel's spoofed connections come back locally", func(t *testing.T) {
		// ztunnel's inbound path: a marked, transparent socket in the pod
		// connects to the app with the remote client's address as source.
		// The app's reply must be routed back to it (fwmark 0x111 → table
		// 100), not out of eth0 to the real peer.
		got := acceptOne(t, app)
		c, err := dialTransparent(t, tp.pod, netip.AddrPortFrom(peerV4, 0), netip.AddrPortFrom(podV4, 8081))
		if err != nil {
			t.Fatal(err)
		}
		sc := <-got
		if line := readLine(t, c); !strings.HasSuffix(line, ":8081") {
			t.Fatalf("answered by %q, want the pod's app", line)
		}
		if ra := sc.RemoteAddr().(*net.TCPAddr); !ra.IP.Equal(peerV4.AsSlice()) {
			t.Fatalf("the app saw source %s, want the spoofed %s", ra, peerV4)
		}
	})
	t.Run("DNS goes to 15053", func(t *testing.T) {
		var pc net.PacketConn
		mustInNetns(t, tp.pod, func() (err error) {
			pc, err = net.ListenPacket("udp4", "127.0.0.1:15053")
			return err
		})
		defer pc.Close()
		c, err := dial(t, tp.pod, "udp4", netip.AddrPortFrom(peerV4, 53).String(), 0, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("query")); err != nil {
			t.Fatal(err)
		}
		pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 16)
		n, _, err := pc.ReadFrom(b)
		if err != nil || string(b[:n]) != "query" {
			t.Fatalf("15053 read %q, %v", b[:n], err)
		}
	})
}

// dialTransparent connects from a spoofed source with SO_MARK 0x539 and
// IP_TRANSPARENT, as ztunnel does inside a pod.
func dialTransparent(t *testing.T, ns string, src, dst netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{
		Timeout:   5 * time.Second,
		LocalAddr: net.TCPAddrFromAddrPort(src),
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			c.Control(func(fd uintptr) {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(podnet.ZtunnelMark)); serr != nil {
					return
				}
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
			})
			return serr
		},
	}
	var c net.Conn
	err := inNetns(ns, func() (err error) {
		c, err = d.Dial("tcp4", dst.String())
		return err
	})
	if c != nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

func installed(t *testing.T, ns string) string {
	t.Helper()
	var rs *Ruleset
	mustInNetns(t, ns, func() (err error) {
		rs, err = Installed(podTables...)
		return err
	})
	return rs.String()
}

func TestApplyPodIdempotentAndRemovable(t *testing.T) {
	for _, tt := range podCases {
		t.Run(tt.name, func(t *testing.T) {
			tp := newTopo(t)
			for range 2 {
				mustInNetns(t, tp.pod, func() error { return ApplyPod(tt.opts) })
				// What the kernel holds is exactly the golden rule set.
				golden(t, "pod_"+tt.name+".golden", installed(t, tp.pod))
				mustInNetns(t, tp.pod, func() error { return CheckPod(tt.opts) })
			}
			routing := run(t, "ip", "-n", nsName(tp.pod), "rule", "show", "priority", fmt.Sprint(RulePriority))
			if n := strings.Count(routing, "lookup 100"); n != 1 {
				t.Fatalf("%d policy rules at priority %d after two applies, want 1:\n%s", n, RulePriority, routing)
			}
			mustInNetns(t, tp.pod, RemovePod)
			mustInNetns(t, tp.pod, RemovePod)
			assertClean(t, tp.pod)
		})
	}
}

// assertClean checks that nothing of ours is left in ns.
func assertClean(t *testing.T, ns string) {
	t.Helper()
	if got := installed(t, ns); got != "" {
		t.Fatalf("tables left after RemovePod:\n%s", got)
	}
	for _, fam := range []string{"-4", "-6"} {
		if out := run(t, "ip", fam, "-n", nsName(ns), "rule", "show", "priority", fmt.Sprint(RulePriority)); strings.TrimSpace(out) != "" {
			t.Fatalf("policy rule left after RemovePod: %s", out)
		}
		// An IPv6 table that never held a route does not exist at all.
		out, _ := exec.Command("ip", fam, "-n", nsName(ns), "route", "show", "table", fmt.Sprint(RouteTable)).CombinedOutput()
		if s := strings.TrimSpace(string(out)); s != "" && !strings.Contains(s, "FIB table does not exist") {
			t.Fatalf("routes left in table %d after RemovePod: %s", RouteTable, s)
		}
	}
}

func TestApplyPodRepairsDrift(t *testing.T) {
	tp := newTopo(t)
	mustInNetns(t, tp.pod, func() error { return ApplyPod(defaults) })
	// A rogue chain and a rogue rule in our table, and a missing rule.
	mustInNetns(t, tp.pod, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tbl := &nftables.Table{Name: NATTable, Family: nftables.TableFamilyINet}
		c.AddChain(&nftables.Chain{Name: "rogue", Table: tbl})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: &nftables.Chain{Name: chainIstioOutput, Table: tbl}, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
		c.FlushChain(&nftables.Chain{Name: chainIstioPrerouting, Table: &nftables.Table{Name: MangleTable, Family: nftables.TableFamilyINet}})
		return c.Flush()
	})
	err := inNetns(tp.pod, func() error { return CheckPod(defaults) })
	if !errors.Is(err, ErrDrift) {
		t.Fatalf("CheckPod after tampering = %v, want ErrDrift", err)
	}
	for _, want := range []string{"+\tchain rogue {", "+\t\taccept", "-\t\tmeta mark & 0x00000fff == 0x00000539"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("drift report lacks %q:\n%v", want, err)
		}
	}
	mustInNetns(t, tp.pod, func() error { return ApplyPod(defaults) })
	mustInNetns(t, tp.pod, func() error { return CheckPod(defaults) })
	golden(t, "pod_default.golden", installed(t, tp.pod))
}

func TestApplyPodConflict(t *testing.T) {
	tp := newTopo(t)
	// Someone else's route in table 100.
	run(t, "ip", "-n", nsName(tp.pod), "route", "add", "10.50.0.0/16", "via", peerV4.String(), "table", fmt.Sprint(RouteTable))
	err := inNetns(tp.pod, func() error { return ApplyPod(defaults) })
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("ApplyPod = %v, want ErrConflict", err)
	}
	if got := installed(t, tp.pod); got != "" {
		t.Fatalf("tables installed despite the conflict:\n%s", got)
	}
	if out := run(t, "ip", "-n", nsName(tp.pod), "rule", "show", "priority", fmt.Sprint(RulePriority)); strings.TrimSpace(out) != "" {
		t.Fatalf("policy rule added despite the conflict: %s", out)
	}
	// Someone else's rule at our priority.
	tp2 := newTopo(t)
	run(t, "ip", "-n", nsName(tp2.pod), "rule", "add", "priority", fmt.Sprint(RulePriority), "from", "10.1.0.0/16", "lookup", "200")
	if err := inNetns(tp2.pod, func() error { return ApplyPod(defaults) }); !errors.Is(err, ErrConflict) {
		t.Fatalf("ApplyPod = %v, want ErrConflict", err)
	}
	if got := installed(t, tp2.pod); got != "" {
		t.Fatalf("tables installed despite the conflict:\n%s", got)
	}
}

func TestApplyPodWithoutIPv6(t *testing.T) {
	requireRoot(t)
	ns := newNetns(t, "nov6")
	run(t, "ip", "netns", "exec", nsName(ns), "sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1")
	mustInNetns(t, ns, func() error { return ApplyPod(defaults) })
	mustInNetns(t, ns, func() error { return CheckPod(defaults) })
	if out := run(t, "ip", "-4", "-n", nsName(ns), "route", "show", "table", "100"); !strings.Contains(out, "local default dev lo") {
		t.Fatalf("IPv4 local route missing: %q", out)
	}
	mustInNetns(t, ns, RemovePod)
	assertClean(t, ns)
}

// TestIstioRuleTextEquivalence loads Istio's rule text with the nft tool
// (when installed) and checks that the kernel then holds exactly what
// ApplyPod and ApplyHost install: the same expressions, rule for rule.
func TestIstioRuleTextEquivalence(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (apt-get install nftables): the cross-check against Istio's rule text is skipped")
	}
	for _, tt := range []struct {
		file   string
		tables []string
		want   *Ruleset
	}{
		{"istio_pod_default.nft", podTables, Pod(defaults)},
		{"istio_host_uid.nft", []string{NATTable}, Host(HostOptions{ProbeUID: 1000, IPv6: true})},
	} {
		t.Run(tt.file, func(t *testing.T) {
			ns := newNetns(t, "nft")
			run(t, "ip", "netns", "exec", nsName(ns), "nft", "-f", "testdata/"+tt.file)
			var got *Ruleset
			mustInNetns(t, ns, func() (err error) { got, err = Installed(tt.tables...); return err })
			if diff := lineDiff(tt.want.String(), got.String()); diff != "" {
				t.Fatalf("the kernel reads Istio's rule text differently from ours (-ours +Istio's):\n%s", diff)
			}
		})
	}
}

func TestHostRules(t *testing.T) {
	requireRoot(t)
	node := newNetns(t, "node")
	opts := HostOptions{ProbeUID: AnySocket, IPv6: true}
	pod := netip.MustParseAddr("10.99.0.2")
	pod6 := netip.MustParseAddr("fd00:99::2")
	mustInNetns(t, node, func() error { return ApplyHost(opts) })
	mustInNetns(t, node, func() error { return AddProbeIPs("uid-1", []netip.Addr{pod, pod6}, true) })
	mustInNetns(t, node, func() error { return AddProbeIPs("uid-1", []netip.Addr{pod}, true) })
	// Re-applying keeps the elements.
	mustInNetns(t, node, func() error { return ApplyHost(opts) })
	var rs *Ruleset
	var ips map[netip.Addr]string
	mustInNetns(t, node, func() (err error) {
		if rs, err = Installed(NATTable); err != nil {
			return err
		}
		ips, err = ProbeIPs(true)
		return err
	})
	golden(t, "host_any_socket.golden", rs.String())
	if len(ips) != 2 || ips[pod] != "uid-1" || ips[pod6] != "uid-1" {
		t.Fatalf("probe set = %v", ips)
	}
	mustInNetns(t, node, func() error { return RemoveProbeIPs([]netip.Addr{pod, netip.MustParseAddr("10.99.0.9")}, true) })
	mustInNetns(t, node, func() (err error) { ips, err = ProbeIPs(true); return err })
	if len(ips) != 1 {
		t.Fatalf("probe set after removal = %v", ips)
	}
	mustInNetns(t, node, RemoveHost)
	mustInNetns(t, node, RemoveHost)
	mustInNetns(t, node, func() (err error) { rs, err = Installed(NATTable); return err })
	if s := rs.String(); s != "" {
		t.Fatalf("host table left: %s", s)
	}
}

// TestHostProbeSNAT sends a probe from the node namespace to a pod and sees
// it arrive from the SNAT address, while forwarded traffic keeps its source.
func TestHostProbeSNAT(t *testing.T) {
	tp := newTopo(t) // peer plays the node
	mustInNetns(t, tp.peer, func() error { return ApplyHost(HostOptions{ProbeUID: AnySocket}) })
	mustInNetns(t, tp.peer, func() error { return AddProbeIPs("uid-1", []netip.Addr{podV4}, false) })
	run(t, "ip", "-n", nsName(tp.pod), "route", "add", ProbeSNATv4.String()+"/32", "via", peerV4.String())
	l := listen(t, tp.pod, "tcp", "0.0.0.0:8081")
	got := acceptOne(t, l)
	c, err := dial(t, tp.peer, "tcp", netip.AddrPortFrom(podV4, 8081).String(), 0, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	sc := <-got
	readLine(t, c)
	if ra := sc.RemoteAddr().(*net.TCPAddr); !ra.IP.Equal(ProbeSNATv4.AsSlice()) {
		t.Fatalf("the pod saw the probe from %s, want %s", ra, ProbeSNATv4)
	}
}

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h.
const ip6tSOOriginalDst = 80
