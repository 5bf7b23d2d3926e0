package inpod

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/podnet"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/ztunnel/proxy"
	"github.com/weftmesh/weft/ztunnel/state"
)

// podIP is the test pod's address, on its netns's lo.
var podIP = netip.MustParseAddr("10.254.0.10")

// redirectApp sends the pod's own TCP to podIP:8080, unless ztunnel
// opened it, to 15006, as the inbound rule does for traffic entering a
// pod. Its NAT chain also turns on conntrack in the netns, so that a
// connection made straight to a ztunnel port has an original destination
// (the port itself), as in a real pod.
func redirectApp(t *testing.T, ns *netns.NS) {
	t.Helper()
	reg := uint32(1)
	native32 := func(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
	err := ns.Do(func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "selfcall-test"})
		ch := c.AddChain(&nftables.Chain{Name: "output", Table: tbl, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg},
			&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: native32(0xfff), Xor: native32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: native32(podnet.ZtunnelMark)},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: binary.BigEndian.AppendUint16(nil, 8080)},
			&expr.Immediate{Register: reg, Data: binary.BigEndian.AppendUint16(nil, podnet.InboundPlaintextPort)},
			&expr.Redir{RegisterProtoMin: reg},
		}})
		return c.Flush()
	})
	if err != nil {
		t.Fatalf("installing the test redirect: %v", err)
	}
}

func addPodIP(t *testing.T, ns *netns.NS) {
	t.Helper()
	h, err := ns.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr(podIP.String() + "/32")
	if err := h.AddrAdd(lo, addr); err != nil {
		t.Fatal(err)
	}
}

// countedSockets counts the connections the proxy opens; past a few it
// fails them, so that a proxy looping on itself stops.
type countedSockets struct {
	Sockets
	dials atomic.Int64
}

func (s *countedSockets) Dial(ctx context.Context, dst, src netip.AddrPort) (net.Conn, error) {
	if s.dials.Add(1) > 20 {
		return nil, errors.New("test: too many dials (a loop?)")
	}
	return s.Sockets.Dial(ctx, dst, src)
}

type testCreds struct {
	cert func() (*tls.Certificate, error)
	ca   *spiffe.CA
}

func (c testCreds) Certificate() (*tls.Certificate, error) { return c.cert() }
func (c testCreds) Roots() *x509.CertPool                  { return c.ca.Roots() }

// dialIn connects from inside ns and returns the first line answered.
func dialIn(ns *netns.NS, addr string) (string, error) {
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 2*time.Second)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintln(c, "hello")
	return bufio.NewReader(c).ReadString('\n')
}

// TestSelfCallsInAPodNetns runs a pod's proxy in a real network namespace,
// with a real pod address and SO_ORIGINAL_DST: connections made straight to
// ztunnel's ports must be refused without ztunnel connecting anywhere.
func TestSelfCallsInAPodNetns(t *testing.T) {
	rootOnly(t)
	ns := podNS(t, "selfcall")
	addPodIP(t, ns)
	redirectApp(t, ns)

	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", podIP.String()+":8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				fmt.Fprintf(c, "app: %s", line)
			}()
		}
	}()

	store := state.NewStore()
	w := &workloadpb.Workload{Uid: "Kubernetes//Pod/demo/echo", Name: "echo", Namespace: "demo", ServiceAccount: "echo", Node: "n1",
		Addresses: [][]byte{podIP.AsSlice()}, TunnelProtocol: workloadpb.TunnelProtocol_HBONE}
	if err := store.ApplyAddresses(map[string]*workloadpb.Address{w.Uid: {Type: &workloadpb.Address_Workload{Workload: w}}}, nil); err != nil {
		t.Fatal(err)
	}
	ca, err := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "echo")
	svid, err := ca.IssueSVID(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sockets := &countedSockets{Sockets: Sockets{NS: ns}}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := proxy.NewPod(proxy.PodConfig{
		Namespace: "demo", Name: "echo", ServiceAccount: "echo", Node: "n1", Store: store,
		Sockets: sockets, OrigDst: OrigDst, Credentials: testCreds{spiffe.StaticCertificate(svid), ca},
		Metrics: proxy.NewMetrics(prometheus.NewRegistry()), Logger: quiet, AccessLog: quiet, DrainTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-p.Ready():
	case err := <-done:
		t.Fatal(err)
	}

	// The app, through the redirect: one connection from ztunnel.
	if got, err := dialIn(ns, podIP.String()+":8080"); err != nil || got != "app: hello\n" {
		t.Fatalf("redirected to the app: %q, %v", got, err)
	}
	if n := sockets.dials.Load(); n != 1 {
		t.Fatalf("ztunnel opened %d connections for one redirected connection", n)
	}
	for _, addr := range []string{
		podIP.String() + ":15006", podIP.String() + ":15001", podIP.String() + ":15008",
		"127.0.0.1:15006", "127.0.0.1:15001",
	} {
		if got, err := dialIn(ns, addr); err == nil && !strings.HasPrefix(got, "\x15") {
			t.Errorf("straight to %s: answered %q", addr, got)
		}
	}
	if n := sockets.dials.Load(); n != 1 {
		t.Errorf("ztunnel opened %d connections for connections made straight to its ports", n-1)
	}
}
