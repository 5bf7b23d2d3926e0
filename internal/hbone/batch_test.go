package hbone

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
)

// countingConn counts the writes to a socket.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestBatchedRecords: a large write through a tunnel reaches the socket in
// one write(2) per DATA frame Stream.Write makes (largeBuf), not one per
// TLS record (a quarter of that), and arrives whole.
func TestBatchedRecords(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("ns1", "server"), p.identity("ns2", "client")
	got := make(chan []byte, 1)
	ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		st, err := r.Accept(nil)
		if err != nil {
			return
		}
		b, _ := io.ReadAll(st)
		got <- b
	}))
	var writes atomic.Int64
	d := newDialer(t, p, func(c *DialerConfig) {
		c.Dial = func(ctx context.Context, addr netip.AddrPort, _ netip.Addr) (net.Conn, error) {
			var nd net.Dialer
			nc, err := nd.DialContext(ctx, "tcp", addr.String())
			return countingConn{nc, &writes}, err
		}
	})
	st, err := d.Dial(context.Background(), ts.target(cliID, "10.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Past crypto/tls's small records of a new connection.
	warm := bytes.Repeat([]byte("w"), 256<<10)
	if _, err := st.Write(warm); err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 4<<20)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	before := writes.Load()
	if _, err := st.Write(msg); err != nil {
		t.Fatal(err)
	}
	n := writes.Load() - before
	st.CloseWrite()
	b := <-got
	if !bytes.Equal(b[len(warm):], msg) {
		t.Fatalf("the tunnel delivered %d bytes, not the %d written", len(b)-len(warm), len(msg))
	}
	// 4 MiB are 256 records of 16 KiB and 64 frames; window updates may
	// split a few.
	if max := int64(len(msg)/largeBuf) + 16; n > max {
		t.Errorf("4 MiB took %d writes to the socket, want at most %d", n, max)
	}
}

// TestBatchRacesCloseNotify: closing a connection while a batch is being
// written (tls.Conn's close_notify from another goroutine) is safe (run
// with -race).
func TestBatchRacesCloseNotify(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("ns1", "server"), p.identity("ns2", "client")
	ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
		st, err := r.Accept(nil)
		if err != nil {
			return
		}
		io.Copy(io.Discard, st)
	}))
	d := newDialer(t, p)
	for range 20 {
		st, err := d.Dial(context.Background(), ts.target(cliID, "10.0.0.1:80"))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for {
				if _, err := st.Write(buf); err != nil {
					return
				}
			}
		}()
		st.c.nc.Close()
		wg.Wait()
	}
}
