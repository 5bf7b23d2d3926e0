package upstream

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// clientFrames is the client preface and then and then, with x/net's framer, a
// request's HEADERS (endStream as given), its DATA, a PING and a
// second request's HEADERS whose body follows.
func clientFrames(t testing.TB, endStream bool) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteString(clientPreface)
	fr := http2.NewFramer(&b, nil)
	fr.WriteSettings()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82, 0x86}, EndHeaders: true, EndStream: endStream})
	if !endStream {
		fr.WriteData(1, true, []byte("body"))
	}
	fr.WritePing(false, [8]byte{1})
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte{0x83, 0x86}, EndHeaders: true, PadLength: 3})
	return b.Bytes()
}

// TestFrameTrackerCuts: the tracker says the same of a client's bytes
// however the writes cut them, and holds exactly after a HEADERS frame
// whose stream goes on.
func TestFrameTrackerCuts(t *testing.T) {
	for _, endStream := range []bool{false, true} {
		b := clientFrames(t, endStream)
		// Where a hold is right: the ends of the HEADERS frames of streams
		// that go on.
		want := map[int]bool{}
		pos := len(clientPreface)
		for pos < len(b) {
			n := int(b[pos])<<16 | int(b[pos+1])<<8 | int(b[pos+2])
			typ, flags := b[pos+3], b[pos+4]
			pos += 9 + n
			if typ == 0x1 && flags&0x1 == 0 {
				want[pos] = true
			}
		}
		for step := 1; step <= len(b); step++ {
			tr := frameTracker{preface: len(clientPreface)}
			for i := 0; i < len(b); i += step {
				end := min(i+step, len(b))
				if got := tr.feed(b[i:end]); got != want[end] {
					t.Fatalf("endStream %v, writes of %d bytes: hold after byte %d = %v, want %v", endStream, step, end, got, want[end])
				}
			}
		}
	}
}

// FuzzFrameTracker: any bytes, cut anywhere, give the tracker the same
// state as the same bytes in one write.
func FuzzFrameTracker(f *testing.F) {
	f.Add(clientFrames(f, false), uint8(7))
	f.Add(clientFrames(f, true), uint8(1))
	f.Add([]byte(clientPreface+"\x00\x00\x00\x01\x04\x00\x00\x00\x01"), uint8(3))
	f.Fuzz(func(t *testing.T, b []byte, step uint8) {
		whole := frameTracker{preface: len(clientPreface)}
		want := whole.feed(b)
		cut := frameTracker{preface: len(clientPreface)}
		var got bool
		s := int(step)%17 + 1
		for i := 0; i < len(b); i += s {
			got = cut.feed(b[i:min(i+s, len(b))])
		}
		if len(b) > 0 && (got != want || cut != whole) {
			t.Fatalf("in writes of %d: %+v (%v); in one: %+v (%v)", s, cut, got, whole, want)
		}
	})
}

// recordConn records its writes; its reads never return.
type recordConn struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
	fail   error
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail != nil {
		return 0, c.fail
	}
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *recordConn) Close() error { return nil }

func (c *recordConn) recorded() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// TestGatherConnHoldsHeaders: a write ending in HEADERS of a stream that
// goes on is held and leaves with the next write; one that does not go on
// is written at once; the timer sends a held write that nothing follows;
// a failed held write fails the next write.
func TestGatherConnHoldsHeaders(t *testing.T) {
	rc := &recordConn{}
	g := newGatherConn(rc, time.Minute)
	defer g.Close()
	var head bytes.Buffer
	head.WriteString(clientPreface)
	fr := http2.NewFramer(&head, nil)
	fr.WriteSettings()
	g.Write(head.Bytes())

	var b bytes.Buffer
	fr = http2.NewFramer(&b, nil)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte{0x82}, EndHeaders: true})
	headers := bytes.Clone(b.Bytes())
	b.Reset()
	fr.WriteData(1, true, []byte("body"))
	data := bytes.Clone(b.Bytes())

	if n, err := g.Write(headers); n != len(headers) || err != nil {
		t.Fatalf("Write(HEADERS) = %d, %v", n, err)
	}
	if got := len(rc.recorded()); got != 1 {
		t.Fatalf("HEADERS of a stream that goes on were written at once (%d writes)", got)
	}
	if n, err := g.Write(data); n != len(data) || err != nil {
		t.Fatalf("Write(DATA) = %d, %v", n, err)
	}
	w := rc.recorded()
	if len(w) != 2 || !bytes.Equal(w[1], append(bytes.Clone(headers), data...)) {
		t.Fatalf("writes %q; want the settings, then HEADERS and DATA in one", w)
	}

	// HEADERS that end their stream go at once.
	b.Reset()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte{0x82}, EndHeaders: true, EndStream: true})
	g.Write(b.Bytes())
	if len(rc.recorded()) != 3 {
		t.Fatal("HEADERS with END_STREAM were held")
	}

	// Nothing follows: the timer sends them.
	g.mu.Lock()
	g.wait = time.Millisecond
	g.mu.Unlock()
	b.Reset()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: []byte{0x82}, EndHeaders: true})
	g.Write(b.Bytes())
	for i := 0; len(rc.recorded()) != 4; i++ {
		if i == 2000 {
			t.Fatal("held HEADERS never went out")
		}
		time.Sleep(time.Millisecond)
	}

	// A held write that fails fails the next write and closes the conn.
	g.mu.Lock()
	g.wait = time.Minute
	g.mu.Unlock()
	b.Reset()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 7, BlockFragment: []byte{0x82}, EndHeaders: true})
	g.Write(b.Bytes())
	rc.mu.Lock()
	rc.fail = errors.New("broken pipe")
	rc.mu.Unlock()
	g.flushHeld()
	if _, err := g.Write(data); err == nil {
		t.Fatal("a write after a held write failed succeeded")
	}
}
