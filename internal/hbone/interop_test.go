//lint:file-ignore SA1019 x/net/http2 is the independent HTTP/2 implementation these tests hold the engine against, on purpose

package hbone

// Interoperability with an independent HTTP/2 implementation,
// golang.org/x/net/http2, in both directions: its client against our
// Server, and our Dialer against its server, over mutual TLS with SPIFFE
// certificates.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http2"

	"github.com/weftmesh/weft/internal/spiffe"
)

const interopLarge = 64 << 20

// prompt is how long a reset or GOAWAY may take to show on the other side.
const prompt = 5 * time.Second

// xclient is an x/net/http2 client connection to one of our servers.
type xclient struct {
	t  *testing.T
	cc *http2.ClientConn
}

func dialX(t *testing.T, p *pki, ts *testServer, id spiffe.Identity) *xclient {
	t.Helper()
	cfg := spiffe.ClientConfig(p.cert(id), p.ca.Roots(), []spiffeid.ID{ts.id.ID()})
	tc, err := tls.Dial("tcp", ts.addr.String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http2.Transport{}
	cc, err := tr.NewClientConn(tc)
	if err != nil {
		tc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &xclient{t: t, cc: cc}
}

// connect sends a CONNECT whose request body is what the caller writes to
// the returned writer.
func (x *xclient) connect(ctx context.Context, authority string) (*io.PipeWriter, *http.Response, error) {
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(ctx, http.MethodConnect, "https://"+authority, pr)
	if err != nil {
		return nil, nil, err
	}
	req.Host = authority
	resp, err := x.cc.RoundTrip(req)
	if err != nil {
		pw.Close()
		return nil, nil, err
	}
	return pw, resp, nil
}

func sendRandom(w io.WriteCloser, n int64, sum *[]byte, errs chan<- error) {
	h := sha256.New()
	_, err := io.Copy(w, io.TeeReader(io.LimitReader(rand.Reader, n), h))
	*sum = h.Sum(nil)
	if err == nil {
		err = w.Close()
	}
	errs <- err
}

func hashAll(r io.Reader) ([]byte, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return h.Sum(nil), n, err
}

func TestInteropXNetClient(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")

	t.Run("echo, half-close and a large transfer both ways", func(t *testing.T) {
		ts := startServer(t, p, srvID, echoHandler)
		x := dialX(t, p, ts, cliID)
		var wg sync.WaitGroup
		for range 2 { // two large streams share the connection
			wg.Add(1)
			go func() {
				defer wg.Done()
				pw, resp, err := x.connect(context.Background(), "10.0.0.1:80")
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("status %d", resp.StatusCode)
					return
				}
				var sent []byte
				errs := make(chan error, 1)
				go sendRandom(pw, interopLarge, &sent, errs) // ends with END_STREAM
				got, n, err := hashAll(resp.Body)            // the echo goes on after our half-close
				if err != nil || n != interopLarge {
					t.Errorf("read %d bytes, err %v; want %d", n, err, interopLarge)
					return
				}
				if err := <-errs; err != nil {
					t.Errorf("sending: %v", err)
				}
				if !bytes.Equal(got, sent) {
					t.Error("echoed data differs from what was sent")
				}
			}()
		}
		wg.Wait()
	})

	t.Run("server half-closes first, then reads on", func(t *testing.T) {
		got := make(chan []byte, 1)
		ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
			st, err := r.Accept(nil)
			if err != nil {
				return
			}
			st.Write([]byte("hello"))
			st.CloseWrite()
			b, _ := io.ReadAll(st)
			got <- b
		}))
		x := dialX(t, p, ts, cliID)
		pw, resp, err := x.connect(context.Background(), "10.0.0.1:80")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != "hello" {
			t.Fatalf("read %q, %v", b, err)
		}
		// x/net's client stops sending the request body once the response
		// has ended (HTTP semantics), so only what it sent is checked.
		pw.Write([]byte("late"))
		pw.Close()
		select {
		case b := <-got:
			if len(b) != 0 && string(b) != "late" {
				t.Errorf("server read %q", b)
			}
		case <-time.After(prompt):
			t.Error("server's read did not end")
		}
	})

	t.Run("client reset reaches the handler", func(t *testing.T) {
		readErr := make(chan error, 1)
		ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
			st, err := r.Accept(nil)
			if err != nil {
				return
			}
			_, err = io.Copy(io.Discard, st)
			readErr <- err
		}))
		x := dialX(t, p, ts, cliID)
		pw, resp, err := x.connect(context.Background(), "10.0.0.1:80")
		if err != nil {
			t.Fatal(err)
		}
		defer pw.Close()
		pw.Write([]byte("some"))
		resp.Body.Close() // RST_STREAM(CANCEL)
		select {
		case err := <-readErr:
			var re *ResetError
			if !errors.As(err, &re) || !re.Remote {
				t.Errorf("server read ended with %v, want a reset by the peer", err)
			}
		case <-time.After(prompt):
			t.Fatal("server read still blocked after the client's RST_STREAM")
		}
	})

	t.Run("server reset reaches the client", func(t *testing.T) {
		ts := startServer(t, p, srvID, HandlerFunc(func(r *Request) {
			st, err := r.Accept(nil)
			if err != nil {
				return
			}
			st.Write([]byte("partial"))
			time.Sleep(50 * time.Millisecond) // the client's data arrives, unread
			st.Close()                        // with data unread: RST_STREAM(CANCEL)
		}))
		x := dialX(t, p, ts, cliID)
		pw, resp, err := x.connect(context.Background(), "10.0.0.1:80")
		if err != nil {
			t.Fatal(err)
		}
		defer pw.Close()
		go pw.Write([]byte("unread"))
		done := make(chan error, 1)
		go func() { _, err := io.ReadAll(resp.Body); done <- err }()
		select {
		case err := <-done:
			var se http2.StreamError
			if !errors.As(err, &se) {
				t.Errorf("client read ended with %v, want a stream error", err)
			}
		case <-time.After(prompt):
			t.Fatal("client read still blocked after the server's RST_STREAM")
		}
	})

	t.Run("many concurrent streams", func(t *testing.T) {
		ts := startServer(t, p, srvID, echoHandler)
		x := dialX(t, p, ts, cliID)
		// A lone ClientConn allows 100 streams until our SETTINGS arrive.
		if pw, resp, err := x.connect(context.Background(), "10.0.0.1:80"); err != nil {
			t.Fatal(err)
		} else {
			pw.Close()
			io.Copy(io.Discard, resp.Body)
		}
		var wg sync.WaitGroup
		for i := range 150 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pw, resp, err := x.connect(context.Background(), "10.0.0.1:80")
				if err != nil {
					t.Error(err)
					return
				}
				defer resp.Body.Close()
				msg := bytes.Repeat([]byte{byte(i)}, 1000+i)
				go func() { pw.Write(msg); pw.Close() }()
				b, err := io.ReadAll(resp.Body)
				if err != nil || !bytes.Equal(b, msg) {
					t.Errorf("stream %d: echo of %d bytes came back as %d bytes, %v", i, len(msg), len(b), err)
				}
			}()
		}
		wg.Wait()
	})

	t.Run("client GOAWAY lets open streams finish", func(t *testing.T) {
		ts, streams := streamServer(t, p, srvID)
		x := dialX(t, p, ts, cliID)
		pw, resp, err := x.connect(context.Background(), "10.0.0.1:80")
		if err != nil {
			t.Fatal(err)
		}
		st := <-streams
		shut := make(chan error, 1)
		go func() { shut <- x.cc.Shutdown(context.Background()) }() // GOAWAY, then waits for the stream
		time.Sleep(50 * time.Millisecond)
		go func() { pw.Write([]byte("ping")); pw.Close() }()
		b := make([]byte, 4)
		if _, err := io.ReadFull(st, b); err != nil || string(b) != "ping" {
			t.Fatalf("server read %q, %v after the client's GOAWAY", b, err)
		}
		st.Write([]byte("pong"))
		st.CloseWrite()
		if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "pong" {
			t.Fatalf("client read %q, %v", b, err)
		}
		st.Close()
		select {
		case err := <-shut:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(prompt):
			t.Error("client's graceful shutdown did not finish")
		}
	})

	t.Run("server GOAWAY lets open streams finish and refuses new ones", func(t *testing.T) {
		ts, streams := streamServer(t, p, srvID)
		x := dialX(t, p, ts, cliID)
		pw, resp, err := x.connect(context.Background(), "10.0.0.1:80")
		if err != nil {
			t.Fatal(err)
		}
		st := <-streams
		go ts.srv.Shutdown(10 * time.Second)
		deadline := time.Now().Add(prompt)
		for x.cc.CanTakeNewRequest() {
			if time.Now().After(deadline) {
				t.Fatal("client still takes new requests after the server's GOAWAY")
			}
			time.Sleep(5 * time.Millisecond)
		}
		go func() { pw.Write([]byte("ping")); pw.Close() }()
		b := make([]byte, 4)
		if _, err := io.ReadFull(st, b); err != nil || string(b) != "ping" {
			t.Fatalf("server read %q, %v after its GOAWAY", b, err)
		}
		st.Write([]byte("pong"))
		st.CloseWrite()
		if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "pong" {
			t.Fatalf("client read %q, %v", b, err)
		}
		st.Close()
	})
}

// xserver is an x/net/http2 server of CONNECTs on a loopback port.
type xserver struct {
	id   spiffe.Identity
	addr netip.AddrPort
	hs   *http.Server
	done chan struct{}
}

func startX(t *testing.T, p *pki, id spiffe.Identity, h http.HandlerFunc) *xserver {
	t.Helper()
	cfg := spiffe.ServerConfig(p.cert(id), p.ca.Roots(), p.ca.TrustDomain())
	cfg.NextProtos = []string{"h2"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h, ErrorLog: nil}
	if err := http2.ConfigureServer(hs, &http2.Server{}); err != nil {
		t.Fatal(err)
	}
	hs.TLSConfig = cfg
	xs := &xserver{id: id, addr: ln.Addr().(*net.TCPAddr).AddrPort(), hs: hs, done: make(chan struct{})}
	go func() {
		defer close(xs.done)
		hs.Serve(tls.NewListener(ln, cfg))
	}()
	t.Cleanup(func() {
		hs.Close()
		<-xs.done
	})
	return xs
}

func (xs *xserver) target(src spiffe.Identity) Target {
	return Target{Source: src.ID(), Peers: []spiffeid.ID{xs.id.ID()}, Addr: xs.addr, Authority: "10.0.0.1:80"}
}

// flushWriter flushes every write, as a tunnel must.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// xEcho answers a CONNECT with 200 and echoes the request body until its
// end; the response then ends.
func xEcho(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	rc.EnableFullDuplex()
	io.Copy(flushWriter{w, rc}, r.Body)
}

func TestInteropXNetServer(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")

	t.Run("echo, half-close and a large transfer both ways", func(t *testing.T) {
		xs := startX(t, p, srvID, xEcho)
		d := newDialer(t, p)
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := d.Dial(context.Background(), xs.target(cliID))
				if err != nil {
					t.Error(err)
					return
				}
				defer st.Close()
				var sent []byte
				errs := make(chan error, 1)
				go sendRandom(halfCloser{st}, interopLarge, &sent, errs) // then CloseWrite
				got, n, err := hashAll(st)
				if err != nil || n != interopLarge {
					t.Errorf("read %d bytes, err %v; want %d", n, err, interopLarge)
					return
				}
				if err := <-errs; err != nil {
					t.Errorf("sending: %v", err)
				}
				if !bytes.Equal(got, sent) {
					t.Error("echoed data differs from what was sent")
				}
			}()
		}
		wg.Wait()
	})

	t.Run("server answers in full before reading the request", func(t *testing.T) {
		// RFC 9113 §8.1: a complete response followed by RST_STREAM(NO_ERROR)
		// must not be discarded.
		xs := startX(t, p, srvID, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("done early"))
		})
		d := newDialer(t, p)
		st, err := d.Dial(context.Background(), xs.target(cliID))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		time.Sleep(100 * time.Millisecond) // let END_STREAM and RST_STREAM arrive
		b, err := io.ReadAll(st)
		if err != nil || string(b) != "done early" {
			t.Errorf("read %q, %v; want the whole response and EOF", b, err)
		}
		st.SetWriteDeadline(time.Now().Add(prompt))
		if _, err := st.Write([]byte("too late")); err == nil {
			t.Error("write after the server ended the stream succeeded")
		}
	})

	t.Run("client reset reaches the handler", func(t *testing.T) {
		readErr := make(chan error, 1)
		xs := startX(t, p, srvID, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("unread"))
			http.NewResponseController(w).Flush()
			_, err := io.Copy(io.Discard, r.Body)
			readErr <- err
		})
		d := newDialer(t, p)
		st, err := d.Dial(context.Background(), xs.target(cliID))
		if err != nil {
			t.Fatal(err)
		}
		st.Write([]byte("some"))
		time.Sleep(50 * time.Millisecond) // the server's data arrives, unread
		st.Close()                        // with data unread: RST_STREAM(CANCEL)
		select {
		case err := <-readErr:
			if err == nil {
				t.Error("server read ended cleanly after the client's reset")
			}
		case <-time.After(prompt):
			t.Fatal("server read still blocked after the client's RST_STREAM")
		}
	})

	t.Run("server reset reaches the client", func(t *testing.T) {
		xs := startX(t, p, srvID, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("partial"))
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler) // RST_STREAM(INTERNAL_ERROR)
		})
		d := newDialer(t, p)
		st, err := d.Dial(context.Background(), xs.target(cliID))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		done := make(chan error, 1)
		go func() { _, err := io.ReadAll(st); done <- err }()
		select {
		case err := <-done:
			var re *ResetError
			if !errors.As(err, &re) || !re.Remote {
				t.Errorf("client read ended with %v, want a reset by the peer", err)
			}
		case <-time.After(prompt):
			t.Fatal("client read still blocked after the server's RST_STREAM")
		}
		st.SetWriteDeadline(time.Now().Add(prompt))
		if _, err := st.Write([]byte("x")); err == nil {
			t.Error("write after the server's reset succeeded")
		}
	})

	t.Run("many concurrent streams", func(t *testing.T) {
		xs := startX(t, p, srvID, xEcho)
		d := newDialer(t, p)
		var wg sync.WaitGroup
		for i := range 150 { // beyond one pooled connection's 100
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := d.Dial(context.Background(), xs.target(cliID))
				if err != nil {
					t.Error(err)
					return
				}
				defer st.Close()
				msg := bytes.Repeat([]byte{byte(i)}, 1000+i)
				go func() { st.Write(msg); st.CloseWrite() }()
				b, err := io.ReadAll(st)
				if err != nil || !bytes.Equal(b, msg) {
					t.Errorf("stream %d: echo of %d bytes came back as %d bytes, %v", i, len(msg), len(b), err)
				}
			}()
		}
		wg.Wait()
	})

	t.Run("server GOAWAY lets open streams finish", func(t *testing.T) {
		xs := startX(t, p, srvID, xEcho)
		d := newDialer(t, p)
		st, err := d.Dial(context.Background(), xs.target(cliID))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		shut := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			shut <- xs.hs.Shutdown(ctx) // GOAWAY, then waits for the stream
		}()
		time.Sleep(100 * time.Millisecond)
		if _, err := st.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		st.CloseWrite()
		if b, err := io.ReadAll(st); err != nil || string(b) != "ping" {
			t.Fatalf("read %q, %v after the server's GOAWAY", b, err)
		}
		if err := <-shut; err != nil {
			t.Errorf("server shutdown: %v", err)
		}
		if _, err := d.Dial(context.Background(), xs.target(cliID)); err == nil {
			t.Error("a new stream was opened on a connection that is going away")
		}
	})
}

// halfCloser makes a Stream's Close a CloseWrite, for sendRandom.
type halfCloser struct{ *Stream }

func (c halfCloser) Close() error { return c.Stream.CloseWrite() }
