package hbone

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLockOrderUnderChurn drives the paths that take two of the engine's
// locks at once (see the lock order on conn) from many goroutines together:
// streams opening on shared connections, writing, reading, echoing (WriteTo
// into the same Stream: rmu, then wmu), half-closing, resetting with unread
// data, being refused and cancelled, keepalive PINGs, while the client
// closes its connections and the server drains and closes its own (some
// writers run until then, so connections end under writes). A lock
// taken out of order deadlocks, which the watchdog reports with every
// goroutine's stack; under -race the fields each lock guards are checked
// too.
func TestLockOrderUnderChurn(t *testing.T) {
	p := newPKI(t, "cluster.local")
	// A deadlock leaves nothing to report from this goroutine: the
	// watchdog dumps every goroutine's stack and ends the test binary.
	watchdog := time.AfterFunc(2*time.Minute, func() {
		buf := make([]byte, 4<<20)
		panic(fmt.Sprintf("churn did not finish: a lock-order deadlock?\n%s", buf[:runtime.Stack(buf, true)]))
	})
	defer watchdog.Stop()
	var opened atomic.Int64
	for range 30 {
		churnRound(t, p, &opened)
	}
	t.Logf("%d streams opened", opened.Load())
}

// churnRound runs workers against a fresh server and dialer and shuts
// both down under them.
func churnRound(t *testing.T, p *pki, opened *atomic.Int64) {
	srv := p.identity("ns", "srv")
	src := p.identity("ns", "cli")
	ts := startServer(t, p, srv, churnHandler, func(c *ServerConfig) {
		c.KeepAlive = 2 * time.Millisecond
		c.MaxConcurrentStreams = 8
	})
	d := newDialer(t, p, func(c *DialerConfig) {
		c.MaxStreamsPerConn = 2
		c.KeepAlive = 2 * time.Millisecond
		c.IdleTimeout = time.Millisecond // connections close between streams too
	})
	ctx, cancel := context.WithCancel(context.Background())
	var workers sync.WaitGroup
	for range 8 {
		workers.Go(func() {
			for ctx.Err() == nil {
				churnStream(ctx, d, ts.target(src, fmt.Sprintf("10.0.0.1:%d", 1+rand.IntN(4))), opened)
			}
		})
	}
	// Shut down under load: once streams are flowing, not during the
	// first handshakes (which take long on a busy machine).
	start, deadline := opened.Load(), time.Now().Add(10*time.Second)
	for opened.Load()-start < 8 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if opened.Load()-start < 8 {
		t.Errorf("fewer than 8 streams opened in 10 s; the churn exercised little")
	}
	time.Sleep(20 * time.Millisecond)
	var closers sync.WaitGroup
	closers.Go(func() { d.Close() })
	closers.Go(func() { ts.srv.Shutdown(0) })
	cancel()
	workers.Wait()
	closers.Wait()
	ts.stop()
}

// churnStream opens one stream and reads, writes and closes it at once, in
// an order left to chance.
func churnStream(ctx context.Context, d *Dialer, target Target, opened *atomic.Int64) {
	st, err := d.Dial(ctx, target)
	if err != nil {
		return // refused (503), cancelled or closed: all expected here
	}
	opened.Add(1)
	if rand.IntN(4) == 0 {
		st.SetDeadline(time.Now().Add(time.Duration(rand.IntN(2000)) * time.Microsecond))
	}
	var g sync.WaitGroup
	g.Go(func() { io.Copy(io.Discard, st) })
	g.Go(func() {
		buf := make([]byte, 1<<(8+rand.IntN(8)))
		n := 1 + rand.IntN(16)
		if rand.IntN(3) == 0 {
			n = -1 // until the stream or the connection ends
		}
		for i := 0; i != n; i++ {
			if _, err := st.Write(buf); err != nil {
				return
			}
		}
		st.CloseWrite()
	})
	switch rand.IntN(3) {
	case 0: // Close racing the Write and the read: a reset with data unread
		st.Close()
	case 1:
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		st.Close()
	}
	g.Wait()
	st.Close()
}

// churnHandler answers by the authority's port: 1 echoes (io.Copy from the
// Stream into itself), 2 reads a little and closes with data unread
// (RST_STREAM CANCEL), 3 refuses with 503, 4 answers and half-closes at once.
var churnHandler = HandlerFunc(func(r *Request) {
	switch r.Authority.Port {
	case 1:
		echoHandler.ServeHBONE(r)
	case 2:
		st, err := r.Accept(nil)
		if err != nil {
			return
		}
		st.Read(make([]byte, 100))
		st.Close()
	case 3:
		r.Reject(503)
	default:
		st, err := r.Accept(nil)
		if err != nil {
			return
		}
		st.CloseWrite()
		io.Copy(io.Discard, st)
	}
})
