package hbone

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"net/http"
	"testing"

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
	ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		up, err := net.Dial("tcp", r.Authority.String())
		if err != nil {
			r.Reject(http.StatusServiceUnavailable)
			return
		}
		st, err := r.Accept(nil)
		if err != nil {
			up.Close()
			return
		}
		s, rcv, err := relay.Join(up, st, 0)
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
