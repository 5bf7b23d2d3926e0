package hbone

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/weftmesh/weft/internal/spiffe"
)

// rawClient speaks HTTP/2 frame by frame, to send what a well-behaved
// client never would.
type rawClient struct {
	t    *testing.T
	tc   *tls.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder
}

func dialRaw(t *testing.T, p *pki, ts *testServer, id spiffe.Identity) *rawClient {
	t.Helper()
	cfg := spiffe.ClientConfig(p.cert(id), p.ca.Roots(), []spiffeid.ID{ts.id.ID()})
	tc, err := tls.Dial("tcp", ts.addr.String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	rc := &rawClient{t: t, tc: tc, fr: http2.NewFramer(tc, tc)}
	rc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	rc.henc = hpack.NewEncoder(&rc.hbuf)
	if _, err := tc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := rc.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return rc
}

func (rc *rawClient) block(fields ...string) []byte {
	rc.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		rc.henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return bytes.Clone(rc.hbuf.Bytes())
}

func (rc *rawClient) headers(id uint32, end bool, fields ...string) {
	rc.t.Helper()
	err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: rc.block(fields...), EndHeaders: true, EndStream: end})
	if err != nil {
		rc.t.Fatal(err)
	}
}

// next reads frames until one satisfies match; it fails the test on timeout
// and returns nil when the connection ends first.
func (rc *rawClient) next(match func(http2.Frame) bool) http2.Frame {
	rc.t.Helper()
	rc.tc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) || strings.Contains(err.Error(), "closed") || strings.Contains(err.Error(), "reset") {
				return nil
			}
			var ne interface{ Timeout() bool }
			if errors.As(err, &ne) && ne.Timeout() {
				rc.t.Fatal("timed out waiting for a frame")
			}
			return nil
		}
		if match(f) {
			return f
		}
	}
}

func (rc *rawClient) status(id uint32) string {
	rc.t.Helper()
	f := rc.next(func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == id
	})
	if f == nil {
		rc.t.Fatalf("stream %d: connection ended before a response", id)
	}
	return f.(*http2.MetaHeadersFrame).PseudoValue("status")
}

func (rc *rawClient) goAway() *http2.GoAwayFrame {
	rc.t.Helper()
	f := rc.next(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok })
	if f == nil {
		return nil
	}
	return f.(*http2.GoAwayFrame)
}

func TestBadRequestsGet400(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	var served atomic.Int64
	ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		served.Add(1)
		r.Reject(http.StatusUnauthorized)
	}))
	rc := dialRaw(t, p, ts, cliID)
	cases := []struct {
		name   string
		fields []string
	}{
		{"GET", []string{":method", "GET", ":scheme", "https", ":authority", "10.0.0.1:80", ":path", "/"}},
		{"no authority", []string{":method", "CONNECT"}},
		{"authority without port", []string{":method", "CONNECT", ":authority", "10.0.0.1"}},
		{"authority with userinfo", []string{":method", "CONNECT", ":authority", "u@10.0.0.1:80"}},
		{"extended CONNECT", []string{":method", "CONNECT", ":protocol", "websocket", ":scheme", "https", ":path", "/", ":authority", "10.0.0.1:80"}},
	}
	id := uint32(1)
	for _, c := range cases {
		rc.headers(id, false, c.fields...)
		if got := rc.status(id); got != "400" {
			t.Errorf("%s: status %s, want 400", c.name, got)
		}
		id += 2
	}
	// A good request on the same connection still reaches the handler.
	rc.headers(id, false, ":method", "CONNECT", ":authority", "10.0.0.1:80")
	if got := rc.status(id); got != "401" {
		t.Errorf("valid CONNECT after bad ones: status %s, want the handler's 401", got)
	}
	if served.Load() != 1 {
		t.Errorf("handler ran %d times, want once (bad requests never reach it)", served.Load())
	}
}

func TestStreamLimitRefusesExtraStreams(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	release := make(chan struct{})
	ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		select { // a handler still dialing its upstream
		case <-release:
		case <-r.Context().Done():
		}
		r.Reject(http.StatusServiceUnavailable)
	}), func(c *ServerConfig) { c.MaxConcurrentStreams = 10 })
	defer close(release)
	rc := dialRaw(t, p, ts, cliID)
	for i := 0; i < 11; i++ {
		rc.headers(uint32(2*i+1), false, ":method", "CONNECT", ":authority", "10.0.0.1:80")
	}
	f := rc.next(func(f http2.Frame) bool { _, ok := f.(*http2.RSTStreamFrame); return ok })
	if rst, ok := f.(*http2.RSTStreamFrame); !ok || rst.StreamID != 21 || rst.ErrCode != http2.ErrCodeRefusedStream {
		t.Errorf("the 11th stream over a limit of 10 got %v, want RST_STREAM REFUSED_STREAM on stream 21", f)
	}
}

func TestRapidResetIsCutOff(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	var running, peak atomic.Int64
	ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		if r.Authority.Port == 81 {
			r.Reject(http.StatusUnauthorized)
			return
		}
		n := running.Add(1)
		defer running.Add(-1)
		for {
			old := peak.Load()
			if n <= old || peak.CompareAndSwap(old, n) {
				break
			}
		}
		<-r.Context().Done() // an upstream dial that never finishes
	}), func(c *ServerConfig) { c.MaxConcurrentStreams = 100 })
	rc := dialRaw(t, p, ts, cliID)
	go func() {
		for id := uint32(1); id < 20000; id += 2 {
			blk := rc.block(":method", "CONNECT", ":authority", "10.0.0.1:80")
			if rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: blk, EndHeaders: true}) != nil ||
				rc.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
				return
			}
		}
	}()
	ga := rc.goAway()
	if ga == nil || ga.ErrCode != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("rapid reset flood: got %v, want GOAWAY ENHANCE_YOUR_CALM", ga)
	}
	if peak.Load() > 100 {
		t.Errorf("%d handlers ran at once, more than the stream limit of 100", peak.Load())
	}
	// Another client is served as usual.
	d := newDialer(t, p)
	_, err := d.Dial(context.Background(), ts.target(cliID, "10.0.0.1:81"))
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
		t.Fatalf("a well-behaved client after the flood: %v, want the handler's 401", err)
	}
}

func TestContinuationFloodIsCutOff(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ts := startServer(t, p, srvID, echoHandler)
	rc := dialRaw(t, p, ts, cliID)
	go func() {
		first := rc.block(":method", "CONNECT", ":authority", "10.0.0.1:80")
		if rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first}) != nil {
			return
		}
		junk := rc.block("x-junk", strings.Repeat("a", 4000))
		for i := 0; i < 100000; i++ {
			if rc.fr.WriteContinuation(1, false, junk) != nil {
				return
			}
		}
	}()
	if ga := rc.goAway(); ga != nil && ga.ErrCode == http2.ErrCodeNo {
		t.Errorf("CONTINUATION flood: GOAWAY %v, want an error code", ga.ErrCode)
	}
	// The connection is gone (GOAWAY then close, or close); the server lives on.
	d := newDialer(t, p)
	st, err := d.Dial(context.Background(), ts.target(cliID, "10.0.0.1:80"))
	if err != nil {
		t.Fatalf("server after a CONTINUATION flood: %v", err)
	}
	st.Close()
}

func TestOversizedHeaderBlock(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ts := startServer(t, p, srvID, echoHandler)
	rc := dialRaw(t, p, ts, cliID)
	fields := []string{":method", "CONNECT", ":authority", "10.0.0.1:80"}
	for i := 0; i < 12; i++ { // ~72 KiB, over the 64 KiB limit
		fields = append(fields, "x-big-"+string(rune('a'+i)), strings.Repeat("v", 6000))
	}
	blk := rc.block(fields...)
	for off := 0; off < len(blk); off += 16000 {
		end := min(off+16000, len(blk))
		var err error
		if off == 0 {
			err = rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk[off:end], EndHeaders: end == len(blk)})
		} else {
			err = rc.fr.WriteContinuation(1, end == len(blk), blk[off:end])
		}
		if err != nil {
			break
		}
	}
	f := rc.next(func(f http2.Frame) bool {
		switch f.(type) {
		case *http2.MetaHeadersFrame, *http2.GoAwayFrame:
			return true
		}
		return false
	})
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		if s := f.PseudoValue("status"); s != "431" {
			t.Errorf("oversized headers answered %s, want 431", s)
		}
	case *http2.GoAwayFrame:
		if f.ErrCode == http2.ErrCodeNo {
			t.Errorf("oversized headers: GOAWAY without an error code")
		}
	case nil:
		// The server dropped the connection: also a clear refusal.
	}
}
