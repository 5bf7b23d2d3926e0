package hbone

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Small windows in the fuzzed connection, so that the buffering bounds are
// reached with short inputs.
const (
	fuzzStreamWindow = initialWindow
	fuzzConnWindow   = 3 * initialWindow
)

// frames builds a client's frame sequence with a real framer and encoder.
type frames struct {
	buf  bytes.Buffer
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder
}

func newFrames() *frames {
	f := &frames{}
	f.fr = http2.NewFramer(&f.buf, nil)
	f.fr.AllowIllegalWrites = true
	f.henc = hpack.NewEncoder(&f.hbuf)
	return f
}

func (f *frames) block(fields ...string) []byte {
	f.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		f.henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return bytes.Clone(f.hbuf.Bytes())
}

func (f *frames) connect(id uint32, end bool) *frames {
	f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: end,
		BlockFragment: f.block(":method", "CONNECT", ":authority", "10.0.0.1:80")})
	return f
}

func (f *frames) bytes() []byte { return bytes.Clone(f.buf.Bytes()) }

// hpackBomb is a header block that is small on the wire and decodes to far
// more than any header list limit: one 4000-byte field put in the dynamic
// table, then referenced by index again and again.
func hpackBomb(refs int) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	enc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
	enc.WriteField(hpack.HeaderField{Name: ":authority", Value: "10.0.0.1:80"})
	enc.WriteField(hpack.HeaderField{Name: "x-bomb", Value: strings.Repeat("a", 4000)})
	for range refs {
		b.WriteByte(0x80 | 62) // indexed: the newest dynamic table entry
	}
	return b.Bytes()
}

func fuzzSeeds() [][]byte {
	var seeds [][]byte
	add := func(build func(f *frames)) {
		f := newFrames()
		build(f)
		seeds = append(seeds, f.bytes())
	}
	add(func(f *frames) { f.connect(1, false) })
	add(func(f *frames) {
		f.connect(1, false)
		f.fr.WriteData(1, false, []byte("hello"))
		f.fr.WriteWindowUpdate(1, 1000)
		f.fr.WriteWindowUpdate(0, 1000)
		f.fr.WriteData(1, true, []byte("bye"))
	})
	add(func(f *frames) {
		f.connect(1, false)
		f.connect(3, false)
		f.fr.WriteRSTStream(1, http2.ErrCodeCancel)
		f.fr.WritePing(false, [8]byte{1, 2, 3})
		f.fr.WriteDataPadded(3, false, []byte("padded"), make([]byte, 20))
		f.fr.WriteGoAway(0, http2.ErrCodeNo, []byte("bye"))
	})
	add(func(f *frames) { // a header block split over CONTINUATIONs
		blk := f.block(":method", "CONNECT", ":authority", "10.0.0.1:80", "baggage", strings.Repeat("k=v,", 50))
		f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk[:10]})
		f.fr.WriteContinuation(1, false, blk[10:20])
		f.fr.WriteContinuation(1, true, blk[20:])
		f.fr.WritePriority(1, http2.PriorityParam{StreamDep: 0, Weight: 10})
	})
	add(func(f *frames) { // an unknown frame type, and settings
		f.fr.WriteRawFrame(0xfa, 0, 0, []byte("ignored"))
		f.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20})
		f.fr.WriteSettings(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
		f.connect(1, false)
		f.fr.WriteData(1, false, make([]byte, 1000))
	})
	add(func(f *frames) { // more DATA than the windows allow
		f.connect(1, false)
		f.connect(3, false)
		for i := 0; i < 6; i++ {
			f.fr.WriteData(1+uint32(i%2)*2, false, make([]byte, 16384))
		}
	})
	add(func(f *frames) { // an HPACK bomb
		f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hpackBomb(2000), EndHeaders: true})
	})
	add(func(f *frames) { // an oversized frame header
		f.fr.WriteRawFrame(http2.FramePing, 0, 0, make([]byte, 1<<10))
		f.buf.Bytes()[0], f.buf.Bytes()[1], f.buf.Bytes()[2] = 0xff, 0xff, 0xff
	})
	add(func(f *frames) { // even, reused and trailer streams
		f.connect(1, false)
		f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: f.block("x", "y"), EndHeaders: true, EndStream: true})
		f.connect(2, false)
		f.connect(1, false)
	})
	return seeds
}

// FuzzServerConn feeds a server connection arbitrary frames after a valid
// preface and SETTINGS, with handlers that echo, stall or refuse, and
// checks that it never panics, never buffers more than its windows allow,
// and leaves no goroutine behind once the client goes away.
func FuzzServerConn(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		ignore := goleak.IgnoreCurrent()
		srvSide, cliSide := net.Pipe()
		srv := &Server{cfg: ServerConfig{Handler: fuzzHandler}}
		c := newConn(srvSide, true, connConfig{
			streamWindow: fuzzStreamWindow, connWindow: fuzzConnWindow, maxHeaderList: 16 << 10,
			maxStreams: 8, log: quietLogger(),
		})
		c.onStream = func(st *Stream, f *http2.MetaHeadersFrame) {
			srv.handlers.Add(1)
			go srv.serveStream(c, st, f, fuzzPeer)
		}
		var drained sync.WaitGroup
		drained.Add(1)
		go func() { // the client reads whatever the server says
			defer drained.Done()
			io.Copy(io.Discard, cliSide)
		}()
		if err := c.start(); err != nil {
			t.Fatal(err)
		}
		pre := newFrames()
		pre.fr.WriteSettings()
		cliSide.SetWriteDeadline(time.Now().Add(5 * time.Second))
		cliSide.Write(append([]byte(http2.ClientPreface), pre.bytes()...))
		cliSide.Write(input)
		checkBuffered(t, c)
		cliSide.Close()

		finished := make(chan struct{})
		go func() {
			<-c.done
			c.loops.Wait()
			srv.handlers.Wait()
			close(finished)
		}()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("connection or handlers still running 10 s after the client left:\n%s", buf[:runtime.Stack(buf, true)])
		}
		drained.Wait()
		if err := goleak.Find(ignore); err != nil {
			t.Fatal(err)
		}
	})
}

var fuzzPeer = spiffeid.RequireFromString("spiffe://cluster.local/ns/fuzz/sa/client")

// fuzzHandler echoes on streams 1, 9, 17, ..., refuses streams 7, 15, ...
// and otherwise accepts and stalls, reading nothing, until the stream ends.
var fuzzHandler = HandlerFunc(func(r *Request) {
	switch r.s.id % 8 {
	case 7:
		r.Reject(http.StatusServiceUnavailable)
		return
	}
	st, err := r.Accept(nil)
	if err != nil {
		return
	}
	if st.id%8 == 1 {
		io.Copy(st, st)
		st.CloseWrite()
	}
	<-r.Context().Done()
})

// checkBuffered checks that no stream holds more than its window and that
// all together hold no more than the connection's.
func checkBuffered(t *testing.T, c *conn) {
	t.Helper()
	c.mu.Lock()
	streams := make([]*Stream, 0, len(c.streams))
	for _, s := range c.streams {
		streams = append(streams, s)
	}
	c.mu.Unlock()
	total := 0
	for _, s := range streams {
		s.mu.Lock()
		n := s.buf.n
		s.mu.Unlock()
		if n > fuzzStreamWindow {
			t.Errorf("stream %d buffers %d bytes, more than its window %d", s.id, n, fuzzStreamWindow)
		}
		total += n
	}
	if total > fuzzConnWindow {
		t.Errorf("streams buffer %d bytes, more than the connection window %d", total, fuzzConnWindow)
	}
}

func TestHPACKBombIsRefused(t *testing.T) {
	p := newPKI(t, "cluster.local")
	var handled sync.WaitGroup
	ts := startServer(t, p, p.identity("a", "server"), HandlerFunc(func(r *Request) {
		handled.Add(1)
		defer handled.Done()
		r.Reject(http.StatusTeapot)
	}))
	rc := dialRaw(t, p, ts, p.identity("b", "client"))
	bomb := hpackBomb(5000) // ~20 MB decoded from ~5 KB
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: bomb, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if got := rc.status(1); got != fmt.Sprint(http.StatusRequestHeaderFieldsTooLarge) {
		t.Errorf("status %s, want 431", got)
	}
	// The connection still serves a sane request.
	rc.headers(3, false, ":method", "CONNECT", ":authority", "10.0.0.1:80")
	if got := rc.status(3); got != fmt.Sprint(http.StatusTeapot) {
		t.Errorf("next stream: status %s, want 418 from the handler", got)
	}
}

// TestContextEndsWithConnAfterCleanEnd: a handler still running after its
// stream ended cleanly in both directions sees its context end when the
// connection ends (found by FuzzServerConn: such a handler waited forever,
// and so did Server.Serve).
func TestContextEndsWithConnAfterCleanEnd(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ended := make(chan struct{})
	ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		st, err := r.Accept(nil)
		if err != nil {
			return
		}
		io.Copy(st, st)
		st.CloseWrite()
		<-r.Context().Done()
		close(ended)
	}))
	rc := dialRaw(t, p, ts, cliID)
	rc.headers(1, false, ":method", "CONNECT", ":authority", "10.0.0.1:80")
	if got := rc.status(1); got != "200" {
		t.Fatalf("status %s", got)
	}
	rc.headers(1, true, "x-trailer", "1") // trailers end the client's side
	if f := rc.next(func(f http2.Frame) bool {
		d, ok := f.(*http2.DataFrame)
		return ok && d.StreamID == 1 && d.StreamEnded()
	}); f == nil {
		t.Fatal("no END_STREAM from the server")
	}
	rc.tc.Close() // the connection ends
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context did not end with its connection")
	}
}
