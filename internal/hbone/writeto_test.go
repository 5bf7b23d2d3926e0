package hbone

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weftmesh/weft/internal/nettest"
)

// writeToResult is what StartWriteTo reported.
type writeToResult struct {
	n   int64
	err error
}

func startWriteTo(st *Stream, w io.Writer) <-chan writeToResult {
	done := make(chan writeToResult, 1)
	st.StartWriteTo(w, func(n int64, err error) { done <- writeToResult{n, err} })
	return done
}

func await(t *testing.T, done <-chan writeToResult) writeToResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("StartWriteTo did not report its end")
		return writeToResult{}
	}
}

// drainers counts the goroutines at work in a StartWriteTo.
func drainers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "hbone.(*Stream).drain(")
}

// streamPair opens a tunnel: the dialer's end and the server's.
func streamPair(t *testing.T) (client, server *Stream) {
	t.Helper()
	p := newPKI(t, "cluster.local")
	ts, streams := streamServer(t, p, p.identity("a", "server"))
	d := newDialer(t, p)
	cs, err := d.Dial(context.Background(), ts.target(p.identity("b", "client"), "127.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, <-streams
}

// TestStartWriteToIdle: data reaches the socket in order, nothing waits
// while the tunnel is idle, and the peer's END_STREAM ends it with the
// byte count and no error.
func TestStartWriteToIdle(t *testing.T) {
	cs, ss := streamPair(t)
	sock, app := nettest.TCPPair(t)
	done := startWriteTo(ss, sock)
	var want bytes.Buffer
	for i := range 20 {
		msg := bytes.Repeat([]byte{byte('a' + i)}, 1+i*100)
		want.Write(msg)
		if _, err := cs.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(app, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("message %d: read %q (%v)", i, got, err)
		}
	}
	waitFor(t, 5*time.Second, func() bool { return drainers() == 0 })
	cs.CloseWrite()
	r := await(t, done)
	if r.err != nil || r.n != int64(want.Len()) {
		t.Errorf("reported (%d, %v), want (%d, nil)", r.n, r.err, want.Len())
	}
}

// TestStartWriteToBackpressure: a socket that does not read holds the
// data back (the peer's writes block on flow control) without losing or
// reordering any once it reads again.
func TestStartWriteToBackpressure(t *testing.T) {
	cs, ss := streamPair(t)
	sock, app := nettest.TCPPair(t)
	done := startWriteTo(ss, sock)
	const size = 24 << 20 // well past the stream window and the socket buffers
	data := make([]byte, size)
	rand.Read(data)
	wrote := make(chan error, 1)
	go func() {
		_, err := cs.Write(data)
		if err == nil {
			err = cs.CloseWrite()
		}
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("the peer wrote everything (%v) while nothing was read", err)
	case <-time.After(300 * time.Millisecond):
	}
	got, err := io.ReadAll(io.LimitReader(app, size))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes (%v), want the %d written", len(got), err, size)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if r := await(t, done); r.err != nil || r.n != size {
		t.Errorf("reported (%d, %v), want (%d, nil)", r.n, r.err, size)
	}
}

// TestStartWriteToEnds: an idle StartWriteTo reports the stream's end
// however it comes: the peer's END_STREAM, a read deadline passing (now or
// later), Close, a reset by the peer; data buffered before it started is
// written first.
func TestStartWriteToEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, client, server *Stream)
		want error // nil: any error
	}{
		{"peer end", func(_ *testing.T, c, _ *Stream) { c.CloseWrite() }, io.EOF},
		{"past deadline", func(_ *testing.T, _, s *Stream) { s.SetReadDeadline(time.Unix(1, 0)) }, os.ErrDeadlineExceeded},
		{"later deadline", func(_ *testing.T, _, s *Stream) { s.SetReadDeadline(time.Now().Add(50 * time.Millisecond)) }, os.ErrDeadlineExceeded},
		{"close", func(_ *testing.T, _, s *Stream) { s.Close() }, net.ErrClosed},
		{"peer reset", func(t *testing.T, c, s *Stream) {
			// Closed with data unread, the client resets the stream.
			s.Write([]byte("unread"))
			waitFor(t, 5*time.Second, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.buf.n > 0 })
			c.Close()
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, ss := streamPair(t)
			if _, err := cs.Write([]byte("early")); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, func() bool { ss.mu.Lock(); defer ss.mu.Unlock(); return ss.buf.n == 5 })
			sock, app := nettest.TCPPair(t)
			done := startWriteTo(ss, sock)
			got := make([]byte, 5)
			if _, err := io.ReadFull(app, got); err != nil || string(got) != "early" {
				t.Fatalf("read %q (%v), want the data buffered before the start", got, err)
			}
			waitFor(t, 5*time.Second, func() bool { return drainers() == 0 })
			tc.end(t, cs, ss)
			r := await(t, done)
			switch {
			case tc.want == io.EOF && r.err != nil:
				t.Errorf("reported %v, want no error", r.err)
			case tc.want != nil && tc.want != io.EOF && !errors.Is(r.err, tc.want):
				t.Errorf("reported %v, want %v", r.err, tc.want)
			case tc.want == nil && r.err == nil:
				t.Error("reported no error for a reset stream")
			}
			if r.n != 5 {
				t.Errorf("reported %d bytes, want 5", r.n)
			}
		})
	}
}

// lockedBuffer is a writer that is not a socket.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// TestStartWriteToWriter: a writer that is not a socket gets the same
// bytes and end, through WriteTo.
func TestStartWriteToWriter(t *testing.T) {
	cs, ss := streamPair(t)
	var w lockedBuffer
	done := startWriteTo(ss, &w)
	cs.Write([]byte("hello"))
	cs.CloseWrite()
	if r := await(t, done); r.err != nil || r.n != 5 || w.buf.String() != "hello" {
		t.Errorf("reported (%d, %v) with %q written, want (5, nil) and hello", r.n, r.err, w.buf.String())
	}
}
