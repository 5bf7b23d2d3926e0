package relay

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/weftmesh/weft/internal/nettest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type result struct {
	ab, ba int64
	err    error
}

// relayed starts a relay (Start, which runs Join for two sockets) between
// two loopback TCP connections and returns the client's and the server's
// ends and a wait for the relay's result.
func relayed(t *testing.T, idle time.Duration) (client, server *net.TCPConn, wait func() result) {
	client, down := nettest.TCPPair(t)
	up, server := nettest.TCPPair(t)
	ch := make(chan result, 1)
	Start(down, up, idle, func(ab, ba int64, err error) { ch <- result{ab, ba, err} })
	wait = sync.OnceValue(func() result { return <-ch })
	t.Cleanup(func() { client.Close(); server.Close(); wait() })
	return client, server, wait
}

// TestHalfClose: each side's end reaches the other as EOF while the other
// direction still carries bytes, whichever side ends first, and Join
// returns once both ended, with their byte counts and no error.
func TestHalfClose(t *testing.T) {
	for _, first := range []string{"client", "server"} {
		t.Run(first+" first", func(t *testing.T) {
			client, server, wait := relayed(t, 0)
			a, b := client, server
			if first == "server" {
				a, b = server, client
			}
			io.WriteString(a, "request")
			a.CloseWrite()
			got, err := io.ReadAll(b)
			if err != nil || string(got) != "request" {
				t.Fatalf("read %q, %v; want the bytes then EOF", got, err)
			}
			io.WriteString(b, "the answer")
			b.CloseWrite()
			got, err = io.ReadAll(a)
			if err != nil || string(got) != "the answer" {
				t.Fatalf("read %q, %v after the half-close; want the bytes then EOF", got, err)
			}
			r := wait()
			want := result{ab: 7, ba: 10}
			if first == "server" {
				want = result{ab: 10, ba: 7}
			}
			if r != want {
				t.Errorf("Join = %+v, want %+v", r, want)
			}
		})
	}
}

// TestByteCounts: both directions at once, large enough to take the
// zero-copy paths, arrive intact and are counted.
func TestByteCounts(t *testing.T) {
	client, server, wait := relayed(t, 0)
	up, down := make([]byte, 3<<20+7), make([]byte, 1<<20+13)
	rand.Read(up)
	rand.Read(down)
	send := func(c *net.TCPConn, p []byte) {
		c.Write(p)
		c.CloseWrite()
	}
	go send(client, up)
	go send(server, down)
	atServer, err := io.ReadAll(server)
	if err != nil || !bytes.Equal(atServer, up) {
		t.Errorf("the server got %d bytes (%v), want the client's %d", len(atServer), err, len(up))
	}
	atClient, err := io.ReadAll(client)
	if err != nil || !bytes.Equal(atClient, down) {
		t.Errorf("the client got %d bytes (%v), want the server's %d", len(atClient), err, len(down))
	}
	if r := wait(); r.ab != int64(len(up)) || r.ba != int64(len(down)) || r.err != nil {
		t.Errorf("Join = %+v, want %d and %d bytes, no error", r, len(up), len(down))
	}
}

// TestResetAbortsBoth: a reset by one peer ends the relay with its error
// and resets the other peer's connection, which was idle and half-open.
func TestResetAbortsBoth(t *testing.T) {
	client, server, wait := relayed(t, 0)
	io.WriteString(client, "x")
	if _, err := io.ReadFull(server, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	client.SetLinger(0)
	client.Close()
	if _, err := server.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the server read %v, want a reset", err)
	}
	if r := wait(); !errors.Is(r.err, syscall.ECONNRESET) || r.ab != 1 {
		t.Errorf("Join = %+v, want 1 byte and the client's reset", r)
	}
}

// brokenWriter is an End whose writes fail.
type brokenWriter struct{ net.Conn }

var errBroken = errors.New("broken")

func (brokenWriter) Write([]byte) (int, error) { return 0, errBroken }

// TestWriteErrorAbortsBoth: a failed write in one direction ends the other
// direction, blocked reading, and Join reports the write's error.
func TestWriteErrorAbortsBoth(t *testing.T) {
	client, down := net.Pipe()
	up, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	done := make(chan result, 1)
	go func() {
		ab, ba, err := Join(down, brokenWriter{up}, 0)
		done <- result{ab, ba, err}
	}()
	// The server sends nothing: only the abort ends the relay's read of it.
	client.Write([]byte("x"))
	if r := <-done; !errors.Is(r.err, errBroken) {
		t.Errorf("Join = %+v, want the write's error", r)
	}
	if _, err := server.Read(make([]byte, 1)); err == nil {
		t.Error("the server's end is still open")
	}
}

// TestIdle: a relay ends, with ErrIdle, once neither direction carried a
// byte for the idle timeout; bytes one way only keep it open. net.Pipe's
// deadlines run on the bubble's clock, so the times are exact.
func TestIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client, down := net.Pipe()
		up, server := net.Pipe()
		defer client.Close()
		defer server.Close()
		const idle = time.Minute
		done := make(chan result, 1)
		go func() {
			ab, ba, err := Join(down, up, idle)
			done <- result{ab, ba, err}
		}()
		go io.Copy(io.Discard, client)
		// Server to client only, every 40 s for 5 minutes.
		start := time.Now()
		var last time.Time
		for time.Since(start) < 5*time.Minute {
			if _, err := server.Write([]byte("tick")); err != nil {
				t.Fatalf("the relay ended after %v while bytes flowed one way: %v", time.Since(start), err)
			}
			last = time.Now()
			time.Sleep(40 * time.Second)
		}
		r := <-done
		if quiet := time.Since(last); quiet != idle {
			t.Errorf("ended %v after the last byte, want %v", quiet, idle)
		}
		if !errors.Is(r.err, ErrIdle) || r.ba != 8*4 || r.ab != 0 {
			t.Errorf("Join = %+v, want 32 bytes one way and ErrIdle", r)
		}
	})
}

// TestIdleNotReset: an idle timeout closes TCP ends with a FIN; only a
// failure resets them.
func TestIdleNotReset(t *testing.T) {
	client, server, wait := relayed(t, 20*time.Millisecond)
	if _, err := server.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the server read %v, want EOF", err)
	}
	if _, err := client.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the client read %v, want EOF", err)
	}
	if r := wait(); !errors.Is(r.err, ErrIdle) {
		t.Errorf("Join = %+v, want ErrIdle", r)
	}
}
