package dnsproxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// reuseSockets are hostSockets bound with SO_REUSEPORT, as a pod's are, so
// that two servers, an old ztunnel's and its successor's, share a port.
type reuseSockets struct{ hostSockets }

func reuseControl(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	return serr
}

func (reuseSockets) Listen(ctx context.Context, addr netip.AddrPort) (net.Listener, error) {
	lc := net.ListenConfig{Control: reuseControl}
	return lc.Listen(ctx, "tcp", addr.String())
}

func (reuseSockets) ListenPacket(ctx context.Context, addr netip.AddrPort) (net.PacketConn, error) {
	lc := net.ListenConfig{Control: reuseControl}
	return lc.ListenPacket(ctx, "udp", addr.String())
}

// reservePort finds a loopback port free for both TCP and UDP and holds it
// (SO_REUSEPORT, so that the servers can join) until release: a port taken
// for UDP alone may be some other socket's for TCP, and the successor
// could not bind it.
func reservePort(t *testing.T) (netip.AddrPort, func()) {
	t.Helper()
	var rs reuseSockets
	for range 20 {
		ln, err := rs.Listen(context.Background(), netip.MustParseAddrPort("127.0.0.1:0"))
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).AddrPort()
		pc, err := rs.ListenPacket(context.Background(), port)
		if err != nil {
			ln.Close() // taken for UDP: another
			continue
		}
		return port, func() { ln.Close(); pc.Close() }
	}
	t.Fatal("no loopback port free for both TCP and UDP in 20 tries")
	return netip.AddrPort{}, nil
}

// TestHandoffLosesNoQuery: while clients query without pause, an old
// server stops with a successor already listening on its port: every
// query is answered, those the old one had read or queued included, and
// those forwarded upstream when it stopped too.
func TestHandoffLosesNoQuery(t *testing.T) {
	up := startUpstream(t)
	up.mu.Lock()
	up.delay = 20 * time.Millisecond // answers in flight when the old one stops
	up.mu.Unlock()
	r, err := NewResolver(Config{Store: testStore(t), Node: "node1", Upstreams: []netip.AddrPort{up.addr}, Timeout: 2 * time.Second,
		Metrics: NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	port, release := reservePort(t)
	_, stopOld := serveProxy(t, r, reuseSockets{}, port)
	release()
	_, stopNew := serveProxy(t, r, reuseSockets{}, port)
	defer func() {
		if err := stopNew(); err != nil {
			t.Error(err)
		}
	}()
	oldDone := make(chan error, 1)

	const clients, each = 8, 60
	start := time.Now()
	var stoppedAt time.Duration
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lost []string
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range each {
				// A new socket each time: a new source port, so the
				// kernel spreads the queries over both servers.
				c := &dns.Client{Net: "udp", Timeout: 3 * time.Second}
				m := new(dns.Msg)
				name := "known.example."
				if j%2 == 0 {
					name = "echo.demo.svc.cluster.local." // answered from the store
				}
				m.SetQuestion(name, dns.TypeA)
				sent := time.Since(start)
				resp, _, err := c.Exchange(m, port.String())
				if err != nil || resp.Rcode != dns.RcodeSuccess {
					mu.Lock()
					lost = append(lost, fmt.Sprintf("%s sent at +%v: %s", name, sent.Round(time.Microsecond), errString(err)))
					mu.Unlock()
				}
				if i == 0 && j == each/3 {
					mu.Lock()
					stoppedAt = time.Since(start)
					mu.Unlock()
					go func() { oldDone <- stopOld() }()
				}
			}
		}()
	}
	wg.Wait()
	if err := <-oldDone; err != nil {
		t.Errorf("the old server's Serve: %v", err)
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d queries not answered across the handoff (the old server stopped at +%v): %v", len(lost), clients*each, stoppedAt.Round(time.Microsecond), lost)
	}
}

func errString(err error) string {
	if err == nil {
		return "not NOERROR"
	}
	return err.Error()
}

// TestTCPDrainAnswersQueryInFlight: a query over TCP that the server is
// forwarding when it begins to drain is answered on its connection; the
// connection ends after it, and an idle one at once.
func TestTCPDrainAnswersQueryInFlight(t *testing.T) {
	up := startUpstream(t)
	up.mu.Lock()
	up.delay = 300 * time.Millisecond
	up.mu.Unlock()
	r, err := NewResolver(Config{Store: testStore(t), Node: "node1", Upstreams: []netip.AddrPort{up.addr}, Timeout: 2 * time.Second,
		Metrics: NewMetrics(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	srv, stop := serveProxy(t, r, hostSockets{}, netip.MustParseAddrPort("127.0.0.1:0"))
	dial := func() *dns.Conn {
		c, err := dns.Dial("tcp", srv.TCPAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(5 * time.Second))
		return c
	}
	busy, idle := dial(), dial()
	// The idle connection is served before the drain: it answers once.
	m := new(dns.Msg)
	m.SetQuestion("echo.demo.svc.cluster.local.", dns.TypeA)
	if err := idle.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	if _, err := idle.ReadMsg(); err != nil {
		t.Fatal(err)
	}
	q := new(dns.Msg)
	q.SetQuestion("known.example.", dns.TypeA)
	if err := busy.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	for len(up.queries()) == 0 {
		time.Sleep(time.Millisecond)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	resp, err := busy.ReadMsg()
	if err != nil || resp.Id != q.Id || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("the query being forwarded when the drain began: %v, %v", resp, err)
	}
	for name, c := range map[string]*dns.Conn{"answered": busy, "idle": idle} {
		if _, err := c.ReadMsg(); err == nil {
			t.Errorf("the %s connection got a message after the drain", name)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("the %s connection stayed open after the drain", name)
		}
	}
	if err := <-stopped; err != nil {
		t.Error(err)
	}
}
