package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

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
