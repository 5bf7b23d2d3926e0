package hbone

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"regexp"
	"runtime"
	"testing"
	"time"

	"github.com/weftmesh/weft/internal/nettest"
)

func startReadFrom(st *Stream, r io.Reader) <-chan writeToResult {
	done := make(chan writeToResult, 1)
	st.StartReadFrom(r, func(n int64, err error) { done <- writeToResult{n, err} })
	return done
}

var goroutineHeader = regexp.MustCompile(`(?m)^goroutine (\d+) `)

// readers returns the IDs of the goroutines at work in a StartReadFrom.
func readers() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var ids []string
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("hbone.(*Stream).readAsync(")) {
			if m := goroutineHeader.FindSubmatch(g); m != nil {
				ids = append(ids, string(m[1]))
			}
		}
	}
	return ids
}

// withIdleHandOff sets idleHandOff for the streams the test starts.
func withIdleHandOff(t *testing.T, d time.Duration) {
	old := idleHandOff
	idleHandOff = d
	t.Cleanup(func() { idleHandOff = old })
}

// sendThrough sends msg from app through the tunnel (sock to cs, read at
// ss) and checks it arrives whole.
func sendThrough(t *testing.T, app *net.TCPConn, ss *Stream, msg []byte) {
	t.Helper()
	if _, err := app.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(ss, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read %d bytes (%v), not the %d sent", len(got), err, len(msg))
	}
}

// TestStartReadFromHandsOff: what the socket sends arrives in order. While
// it keeps sending, one goroutine does the work; once it has been idle for
// idleHandOff after a burst, a new goroutine waits instead, and one at a
// time. The socket's end is reported with the byte count and leaves the
// stream writable by its owner (CloseWrite).
func TestStartReadFromHandsOff(t *testing.T) {
	for _, tc := range []struct {
		name     string
		idle     time.Duration
		handsOff bool
	}{{"busy", time.Hour, false}, {"idle", 10 * time.Millisecond, true}} {
		t.Run(tc.name, func(t *testing.T) {
			withIdleHandOff(t, tc.idle)
			cs, ss := streamPair(t)
			sock, app := nettest.TCPPair(t)
			done := startReadFrom(cs, sock)
			waitFor(t, 5*time.Second, func() bool { return len(readers()) == 1 })
			waiting := readers()[0]
			var total int64
			for i := range 20 {
				msg := make([]byte, 1+i*997)
				rand.Read(msg)
				sendThrough(t, app, ss, msg)
				total += int64(len(msg))
				if tc.handsOff {
					waitFor(t, 5*time.Second, func() bool {
						ids := readers()
						return len(ids) == 1 && ids[0] != waiting
					})
				}
				ids := readers()
				if len(ids) != 1 || (ids[0] != waiting) == !tc.handsOff {
					t.Fatalf("message %d: waiting in %v, after %s", i, ids, waiting)
				}
				waiting = ids[0]
			}
			big := make([]byte, 8<<20) // many reads in one burst, past the stream window
			rand.Read(big)
			go app.Write(big)
			got := make([]byte, len(big))
			if _, err := io.ReadFull(ss, got); err != nil || !bytes.Equal(got, big) {
				t.Fatalf("read %d bytes (%v), not the 8 MiB sent", len(got), err)
			}
			total += int64(len(big))
			app.CloseWrite()
			r := await(t, done)
			if r.err != nil || r.n != total {
				t.Errorf("reported (%d, %v), want (%d, nil)", r.n, r.err, total)
			}
			if err := cs.CloseWrite(); err != nil {
				t.Fatalf("CloseWrite after the end: %v", err)
			}
			if rest, err := io.ReadAll(ss); err != nil || len(rest) != 0 {
				t.Errorf("after the end read %d bytes (%v), want EOF", len(rest), err)
			}
			if n := len(readers()); n != 0 {
				t.Errorf("%d goroutines still in StartReadFrom after its end", n)
			}
		})
	}
}

// TestStopReadFrom: StopReadFrom ends a StartReadFrom with a deadline
// error whatever it is doing: waiting with the hand-off deadline set (an
// hour away), or handing off every few milliseconds.
func TestStopReadFrom(t *testing.T) {
	for _, idle := range []time.Duration{time.Hour, time.Millisecond} {
		t.Run(idle.String(), func(t *testing.T) {
			withIdleHandOff(t, idle)
			for i := range 10 {
				cs, ss := streamPair(t)
				sock, app := nettest.TCPPair(t)
				done := startReadFrom(cs, sock)
				sendThrough(t, app, ss, []byte("armed"))
				time.Sleep(time.Duration(i) * time.Millisecond)
				cs.StopReadFrom()
				if r := await(t, done); !errors.Is(r.err, os.ErrDeadlineExceeded) || r.n != 5 {
					t.Fatalf("stopped after %d ms: reported (%d, %v), want (5, a deadline error)", i, r.n, r.err)
				}
			}
		})
	}
}

// TestStartReadFromReset: a socket reset by its peer ends StartReadFrom
// with an error.
func TestStartReadFromReset(t *testing.T) {
	cs, _ := streamPair(t)
	sock, app := nettest.TCPPair(t)
	done := startReadFrom(cs, sock)
	app.SetLinger(0)
	app.Close()
	if r := await(t, done); r.err == nil {
		t.Error("reported no error for a reset socket")
	}
}

// TestStartReadFromReader: from a reader that is not a socket,
// StartReadFrom is ReadFrom on a goroutine of its own.
func TestStartReadFromReader(t *testing.T) {
	cs, ss := streamPair(t)
	done := startReadFrom(cs, bytes.NewReader([]byte("not a socket")))
	if r := await(t, done); r.err != nil || r.n != 12 {
		t.Errorf("reported (%d, %v), want (12, nil)", r.n, r.err)
	}
	cs.CloseWrite()
	if got, err := io.ReadAll(ss); err != nil || string(got) != "not a socket" {
		t.Errorf("read %q (%v)", got, err)
	}
}
