package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2client opens an h2c connection through the waypoint.
//
//lint:ignore SA1019 a client on one given connection, as the proxy uses
func (m *mesh) h2client(target netip.AddrPort) *http2.ClientConn {
	m.t.Helper()
	c, err := m.dial(target)
	if err != nil {
		m.t.Fatal(err)
	}
	//lint:ignore SA1019 a client on one given connection, as the proxy uses
	cc, err := (&http2.Transport{AllowHTTP: true}).NewClientConn(c)
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { cc.Close() })
	return cc
}

// h2framer opens a CONNECT to target and speaks raw HTTP/2 on it: the
// preface and SETTINGS are sent.
func (m *mesh) h2framer(target netip.AddrPort) (net.Conn, *http2.Framer) {
	m.t.Helper()
	c, err := m.dial(target)
	if err != nil {
		m.t.Fatal(err)
	}
	m.t.Cleanup(func() { c.Close() })
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		m.t.Fatal(err)
	}
	return c, fr
}

func encodeHeaders(fields ...string) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for i := 0; i+1 < len(fields); i += 2 {
		enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return buf.Bytes()
}

// TestHeaderTooLarge: request headers over the limit are answered 431, on
// HTTP/1.1 and HTTP/2 alike; headers under it pass.
func TestHeaderTooLarge(t *testing.T) {
	m := newMesh(t)
	m.apply([]*routev3.Route{{Match: prefix("/"), Action: toCluster("ok")}}, map[string][]netip.AddrPort{"ok": {backend(t, "ok", nil)}})
	if r := m.h1(vip).do(get("/", "x-big", strings.Repeat("a", 40<<10))); r.StatusCode != 200 {
		t.Errorf("HTTP/1.1 with 40 KiB of headers: %d, want 200", r.StatusCode)
	}
	if r := m.h1(vip).do(get("/", "x-big", strings.Repeat("a", 100<<10))); r.StatusCode != 431 {
		t.Errorf("HTTP/1.1 with 100 KiB of headers: %d, want 431", r.StatusCode)
	}

	c, fr := m.h2framer(vip)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// A little over the limit, in many fields: x/net/http2 ends the
	// connection instead (COMPRESSION_ERROR, PROTOCOL_ERROR) for one value
	// longer than the limit or CONTINUATION frames far past it.
	fields := []string{":method", "GET", ":scheme", "http", ":authority", svcHost, ":path", "/"}
	for i := range 17 {
		fields = append(fields, fmt.Sprintf("x-big-%d", i), strings.Repeat("a", 4<<10))
	}
	block := encodeHeaders(fields...)
	const frag = 16 << 10
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:frag], EndStream: true}); err != nil {
		t.Fatal(err)
	}
	for rest := block[frag:]; len(rest) > 0; {
		n := min(frag, len(rest))
		if err := fr.WriteContinuation(1, n == len(rest), rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("HTTP/2 with 68 KiB of headers: no response: %v", err)
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamID == 1 {
			if s := h.PseudoValue("status"); s != "431" {
				t.Errorf("HTTP/2 with 68 KiB of headers: %s, want 431", s)
			}
			break
		}
		if rst, ok := f.(*http2.RSTStreamFrame); ok && rst.StreamID == 1 {
			t.Fatalf("HTTP/2 with 68 KiB of headers: stream reset %v, want a 431", rst.ErrCode)
		}
	}
}

// TestRapidReset: a downstream that opens streams and resets them at once
// (CVE-2023-44487) does not take the waypoint down, does not run unbounded
// upstream work, and a well-behaved connection is served meanwhile.
func TestRapidReset(t *testing.T) {
	m := newMesh(t)
	var inflight, peak atomic.Int32
	addr := backend(t, "b", func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		if r.URL.Path == "/slow" {
			select {
			case <-r.Context().Done():
			case <-time.After(time.Second):
			}
		}
		io.WriteString(w, "ok")
	})
	m.apply([]*routev3.Route{{Match: prefix("/"), Action: toCluster("b")}}, map[string][]netip.AddrPort{"b": {addr}})

	c, fr := m.h2framer(vip)
	c.SetDeadline(time.Now().Add(20 * time.Second))
	goaway := make(chan http2.ErrCode, 1)
	go func() {
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				close(goaway)
				return
			}
			if g, ok := f.(*http2.GoAwayFrame); ok {
				goaway <- g.ErrCode
				return
			}
		}
	}()
	flood := make(chan int)
	go func() {
		sent := 0
		block := encodeHeaders(":method", "GET", ":scheme", "http", ":authority", svcHost, ":path", "/slow")
		for id := uint32(1); id < 20000; id += 2 {
			if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: true, EndHeaders: true}) != nil ||
				fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
				break
			}
			sent++
		}
		flood <- sent
	}()

	good := m.h1(vip)
	for i := 0; ; i++ {
		if r := good.do(get(fmt.Sprintf("/good/%d", i))); r.StatusCode != 200 {
			t.Fatalf("well-behaved request %d during the flood: %d %q", i, r.StatusCode, body(r))
		}
		select {
		case n := <-flood:
			t.Logf("flood: %d streams opened and reset; %d well-behaved requests meanwhile", n, i+1)
		default:
			continue
		}
		break
	}
	select {
	case code, ok := <-goaway:
		if ok {
			t.Logf("flooding connection ended with GOAWAY %v", code)
		}
	case <-time.After(time.Second):
		t.Log("flooding connection still open")
	}
	c.Close()
	if p := peak.Load(); p > maxConcurrentStreams+1 {
		t.Errorf("the upstream saw %d concurrent requests, more than a connection's %d streams", p, maxConcurrentStreams)
	}
	cc := m.h2client(vip)
	for i := range 10 {
		r, err := cc.RoundTrip(get(fmt.Sprintf("/after/%d", i)))
		if err != nil {
			t.Fatalf("request after the flood: %v", err)
		}
		if b := body(r); r.StatusCode != 200 || b != "ok" {
			t.Fatalf("request after the flood: %d %q", r.StatusCode, b)
		}
	}
	m.settled("b")
}
