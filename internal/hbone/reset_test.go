package hbone

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/weftmesh/weft/internal/nettest"
	"github.com/weftmesh/weft/internal/relay"
)

// twoHops is TCP client -> relay -> HBONE -> relay -> HBONE -> relay ->
// TCP backend: a node proxy's outbound, a middle proxy that tunnels on (a
// waypoint's TCP chain), and the destination's inbound. joins receives
// each relay's error.
type twoHops struct {
	front net.Addr
	joins chan error
}

func newTwoHops(t *testing.T, backend net.Addr) *twoHops {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	h := &twoHops{joins: make(chan error, 3)}
	d := newDialer(t, p)
	last := startServer(t, p, srvID, relayToAuthority(func(_, _ int64, err error) { h.joins <- err }))
	middle := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		on, err := d.Dial(r.Context(), last.target(cliID, r.Authority.String()))
		if err != nil {
			r.Reject(http.StatusServiceUnavailable)
			return
		}
		st, err := r.Accept(nil)
		if err != nil {
			on.Close()
			return
		}
		_, _, err = relay.Join(st, on, 0)
		h.joins <- err
	}))
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })
	h.front = front.Addr()
	go func() {
		for {
			c, err := front.Accept()
			if err != nil {
				return
			}
			go func() {
				st, err := d.Dial(context.Background(), middle.target(cliID, backend.String()))
				if err != nil {
					c.Close()
					return
				}
				_, _, err = relay.Join(c, st, 0)
				h.joins <- err
			}()
		}
	}()
	return h
}

// backendOnce accepts one connection and serves it with f.
func backendOnce(t *testing.T, f func(c *net.TCPConn)) net.Addr {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		f(c.(*net.TCPConn))
	}()
	return ln.Addr()
}

func (h *twoHops) dial(t *testing.T) *net.TCPConn {
	c, err := net.Dial("tcp", h.front.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c.(*net.TCPConn)
}

// A clean end stays clean through two hops: both sides half-close with
// data in flight both ways, the backend closes right after its last byte,
// and every relay ends without an error; the client reads everything,
// then an end, not a reset.
func TestJoinCleanTwoHops(t *testing.T) {
	const size = 8 << 20
	want := make([]byte, size)
	rand.Read(want)
	got := make(chan []byte, 1)
	h := newTwoHops(t, backendOnce(t, func(c *net.TCPConn) {
		// Answer while the client still sends, then read the rest and
		// close: the last byte and the end leave together.
		go c.Write(want)
		b, _ := io.ReadAll(c)
		got <- b
	}))
	c := h.dial(t)
	go func() { c.Write(want); c.CloseWrite() }()
	back, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(back, want) {
		t.Fatalf("the client read %d bytes and %v, want %d and a clean end", len(back), err, size)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the backend read %d bytes, want %d", len(b), size)
	}
	for range 3 {
		if err := <-h.joins; err != nil {
			t.Errorf("a relay of a clean exchange ended with %v", err)
		}
	}
}

// A reset passes through two hops each way: a backend's reset reaches the
// client as a reset, and a client's the backend.
func TestJoinResetTwoHops(t *testing.T) {
	t.Run("backend resets", func(t *testing.T) {
		h := newTwoHops(t, backendOnce(t, func(c *net.TCPConn) {
			io.ReadFull(c, make([]byte, 4))
			c.Write([]byte("partial"))
			time.Sleep(50 * time.Millisecond)
			c.SetLinger(0)
		}))
		c := h.dial(t)
		c.Write([]byte("ping"))
		got, err := io.ReadAll(c)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("the client read %q and %v, want a reset", got, err)
		}
	})
	t.Run("client resets", func(t *testing.T) {
		read := make(chan error, 1)
		h := newTwoHops(t, backendOnce(t, func(c *net.TCPConn) {
			c.Write([]byte("hello"))
			_, err := io.Copy(io.Discard, c)
			read <- err
		}))
		c := h.dial(t)
		if _, err := io.ReadFull(c, make([]byte, 5)); err != nil {
			t.Fatal(err)
		}
		c.SetLinger(0)
		c.Close()
		select {
		case err := <-read:
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("the backend's read ended with %v, want a reset", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the backend's read did not end after the client's reset")
		}
	})
}

// An idle timeout ends a relay of a socket and a stream with a close, not
// a reset: the stream's peer reads END_STREAM and the socket's a FIN.
func TestJoinIdleEndsStreamCleanly(t *testing.T) {
	cs, ss := streamPair(t)
	sock, app := nettest.TCPPair(t)
	joined := make(chan error, 1)
	go func() { _, _, err := relay.Join(sock, ss, 100*time.Millisecond); joined <- err }()
	cs.Write([]byte("ping"))
	if _, err := io.ReadFull(app, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-joined:
		if !errors.Is(err, relay.ErrIdle) {
			t.Errorf("Join: %v, want the idle timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the idle relay did not end")
	}
	if n, err := io.Copy(io.Discard, cs); n != 0 || err != nil {
		t.Errorf("the stream's peer read %d bytes and %v, want END_STREAM", n, err)
	}
	app.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := io.Copy(io.Discard, app); n != 0 || err != nil {
		t.Errorf("the socket's peer read %d bytes and %v, want a FIN", n, err)
	}
}

// x/net/http2's client, an independent peer, sees the stream its CONNECT
// opened reset with CANCEL when the backend behind the tunnel resets, and
// a clean end (EOF) when the backend closes.
func TestInteropXNetSeesRelayReset(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ts := startServer(t, p, srvID, relayToAuthority(nil))
	x := dialX(t, p, ts, cliID)
	for _, reset := range []bool{true, false} {
		be := backendOnce(t, func(c *net.TCPConn) {
			io.ReadFull(c, make([]byte, 4))
			c.Write([]byte("partial"))
			if reset {
				time.Sleep(50 * time.Millisecond)
				c.SetLinger(0)
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pw, resp, err := x.connect(ctx, be.String())
		if err != nil {
			t.Fatal(err)
		}
		pw.Write([]byte("ping"))
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		pw.Close()
		var se http2.StreamError
		switch {
		case reset && (!errors.As(err, &se) || se.Code != http2.ErrCodeCancel):
			t.Errorf("after the backend's reset x/net read %q and %v, want RST_STREAM CANCEL", got, err)
		case !reset && (err != nil || string(got) != "partial"):
			t.Errorf("after the backend's close x/net read %q and %v, want %q and an end", got, err, "partial")
		}
	}
}
