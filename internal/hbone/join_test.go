package hbone

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/weftmesh/weft/internal/nettest"
	"github.com/weftmesh/weft/internal/relay"
)

// TestJoinEndToEnd runs TCP client -> relay -> HBONE -> server (relay)
// -> TCP echo, the shape of a node proxy pair, and checks data, half-close
// and the byte counts both relays report.
func TestJoinEndToEnd(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.(*net.TCPConn).CloseWrite(); io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	type counts struct{ sent, received int64 }
	serverCounts := make(chan counts, 1)
	ts := startServer(t, p, srvID, relayToAuthority(func(s, rcv int64, err error) {
		if err != nil {
			t.Errorf("server Join: %v", err)
		}
		serverCounts <- counts{s, rcv}
	}))
	d := newDialer(t, p)
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer front.Close()
	clientCounts := make(chan counts, 1)
	go func() {
		c, err := front.Accept()
		if err != nil {
			return
		}
		st, err := d.Dial(context.Background(), ts.target(cliID, echo.Addr().String()))
		if err != nil {
			t.Error(err)
			c.Close()
			return
		}
		s, rcv, err := relay.Join(c, st, 0)
		if err != nil {
			t.Errorf("client Join: %v", err)
		}
		clientCounts <- counts{s, rcv}
	}()

	c, err := net.Dial("tcp", front.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 32 << 20
	sent := sha256.New()
	go func() {
		io.Copy(c, io.TeeReader(io.LimitReader(rand.Reader, size), sent))
		c.(*net.TCPConn).CloseWrite()
	}()
	recv := sha256.New()
	n, err := io.Copy(recv, c)
	if err != nil || n != size {
		t.Fatalf("echoed %d bytes (%v), want %d", n, err, size)
	}
	if !bytes.Equal(sent.Sum(nil), recv.Sum(nil)) {
		t.Fatal("echoed data differs")
	}
	want := counts{size, size}
	if got := <-clientCounts; got != want {
		t.Errorf("client relay counted %+v, want %+v", got, want)
	}
	if got := <-serverCounts; got != (counts{size, size}) {
		t.Errorf("server relay counted %+v, want %+v", got, want)
	}
}

// TestJoinIdleOneGoroutine: a relay of a socket and a stream waits in one
// goroutine while idle (the stream writes to the socket without one), and
// still ends both ways: after the app's reset Join returns the error and
// the peer's read ends.
func TestJoinIdleOneGoroutine(t *testing.T) {
	cs, ss := streamPair(t)
	sock, app := nettest.TCPPair(t)
	type result struct {
		ab, ba int64
		err    error
	}
	joined := make(chan result, 1)
	go func() {
		ab, ba, err := relay.Join(sock, ss, 0)
		joined <- result{ab, ba, err}
	}()
	cs.Write([]byte("ping"))
	got := make([]byte, 4)
	if _, err := io.ReadFull(app, got); err != nil || string(got) != "ping" {
		t.Fatalf("app read %q (%v)", got, err)
	}
	app.Write([]byte("pong"))
	if _, err := io.ReadFull(cs, got); err != nil || string(got) != "pong" {
		t.Fatalf("peer read %q (%v)", got, err)
	}
	waitFor(t, 5*time.Second, func() bool {
		buf := make([]byte, 1<<20)
		dump := string(buf[:runtime.Stack(buf, true)])
		return drainers() == 0 && !strings.Contains(dump, "relay.(*join).forward")
	})
	app.SetLinger(0)
	app.Close() // a reset: the relay fails and resets the stream
	select {
	case r := <-joined:
		if r.err == nil || r.ab != 4 || r.ba != 4 {
			t.Errorf("Join returned (%d, %d, %v), want (4, 4, the reset)", r.ab, r.ba, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Join did not return after the app's reset")
	}
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, cs); ended <- err }()
	select {
	case err := <-ended:
		// The peer learns that the tunnel broke, as the app's own peer
		// would have from its reset, not that it ended.
		var re *ResetError
		if !errors.As(err, &re) || !re.Remote || re.Code != http2.ErrCodeCancel {
			t.Errorf("the peer's read ended with %v, want the stream reset (CANCEL)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the peer's read did not end")
	}
}
