package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// syncBuffer is a log sink safe for the pod's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestInboundOriginalSource checks that the app sees the client's address
// on inbound connections, over HBONE and plaintext, and that a pod whose
// kernel refuses the client's address still connects, from its own, once
// logged and counted.
func TestInboundOriginalSource(t *testing.T) {
	m := newMesh(t)
	m.apply(workload("demo", "client", "client", "127.0.0.13"), workload("demo", "echo", "echo", "127.0.0.23"),
		workload("demo", "old-kernel", "echo", "127.0.0.24"))
	app(t, "127.0.0.23:8080", "echo")
	app(t, "127.0.0.24:8080", "old-kernel")
	logs := &syncBuffer{}
	keep := func(c *PodConfig) { c.OriginalSource = true }
	client := m.startPod("demo", "client", "client", "127.0.0.13", keep)
	echo := m.startPod("demo", "echo", "echo", "127.0.0.23", keep)
	refusing := m.startPod("demo", "old-kernel", "echo", "127.0.0.24", keep, func(c *PodConfig) {
		c.Sockets = &testSockets{refuseSource: true}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})

	client.set("127.0.0.23:8080")
	if got, err := call(t, "127.0.0.13:15001", "a"); err != nil || got != "echo from 127.0.0.13: a" {
		t.Errorf("over HBONE: %q, %v; want the client pod's address", got, err)
	}
	echo.set("127.0.0.23:8080")
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.99")}, Timeout: 10 * time.Second}
	if got, err := lineFrom(d, "127.0.0.23:15006", "b"); err != nil || got != "echo from 127.0.0.99: b" {
		t.Errorf("plaintext: %q, %v; want the client's address", got, err)
	}

	refusing.set("127.0.0.24:8080")
	for i := 0; i < 2; i++ {
		if got, err := lineFrom(d, "127.0.0.24:15006", "c"); err != nil || got != "old-kernel from 127.0.0.24: c" {
			t.Errorf("refused source, try %d: %q, %v; want a connection from the pod's own address", i, got, err)
		}
	}
	client.set("127.0.0.24:8080")
	if got, err := call(t, "127.0.0.13:15001", "d"); err != nil || got != "old-kernel from 127.0.0.24: d" {
		t.Errorf("refused source over HBONE: %q, %v", got, err)
	}
	m.stop()
	if n := testutil.ToFloat64(m.metrics.sourceFallbacks); n != 3 {
		t.Errorf("weft_ztunnel_original_source_fallbacks_total = %v, want 3", n)
	}
	if n := strings.Count(logs.String(), "cannot keep the client's address"); n != 1 {
		t.Errorf("the fallback was logged %d times, want once:\n%s", n, logs)
	}
}

func lineFrom(d net.Dialer, addr, msg string) (string, error) {
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	buf := make([]byte, 256)
	var out []byte
	for !bytes.Contains(out, []byte("\n")) {
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return strings.TrimSpace(string(out)), err
		}
	}
	return strings.TrimSpace(string(out)), nil
}

// recSockets records the sources it is asked to dial from and connects
// nowhere.
type recSockets struct{ srcs []netip.AddrPort }

func (s *recSockets) Listen(context.Context, netip.AddrPort) (net.Listener, error) {
	return nil, errors.New("test: no listener")
}

func (s *recSockets) Dial(_ context.Context, _, src netip.AddrPort) (net.Conn, error) {
	s.srcs = append(s.srcs, src)
	return nil, errors.New("test: nothing to dial")
}

// TestDialAppSource checks which source dialApp asks for.
func TestDialAppSource(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	v4, v6 := netip.MustParseAddrPort("10.244.0.9:8080"), netip.MustParseAddrPort("[fd00::9]:8080")
	tests := []struct {
		name     string
		on       bool
		dst, src netip.AddrPort
		want     netip.AddrPort
	}{
		{"kept", true, v4, netip.MustParseAddrPort("10.244.1.5:40000"), netip.MustParseAddrPort("10.244.1.5:0")},
		{"kept, v4-mapped", true, v4, netip.MustParseAddrPort("[::ffff:10.244.1.5]:40000"), netip.MustParseAddrPort("[::ffff:10.244.1.5]:0")},
		{"kept, v6", true, v6, netip.MustParseAddrPort("[fd00::5]:40000"), netip.MustParseAddrPort("[fd00::5]:0")},
		{"turned off", false, v4, netip.MustParseAddrPort("10.244.1.5:40000"), netip.AddrPort{}},
		{"no source", true, v4, netip.AddrPort{}, netip.AddrPort{}},
		{"v6 client, v4 app", true, v4, netip.MustParseAddrPort("[fd00::5]:40000"), netip.AddrPort{}},
		{"v4 client, v6 app", true, v6, netip.MustParseAddrPort("10.244.1.5:40000"), netip.AddrPort{}},
	}
	for _, tt := range tests {
		rec := &recSockets{}
		m := NewMetrics(prometheus.NewRegistry())
		p := &Pod{cfg: PodConfig{OriginalSource: tt.on, Sockets: rec, Metrics: m, Logger: quiet}}
		p.dialApp(context.Background(), tt.dst, tt.src)
		if len(rec.srcs) != 1 || rec.srcs[0] != tt.want {
			t.Errorf("%s: dialed from %v, want once from %v", tt.name, rec.srcs, tt.want)
		}
		if n := testutil.ToFloat64(m.sourceFallbacks); n != 0 {
			t.Errorf("%s: %v fallbacks counted", tt.name, n)
		}
	}
}
