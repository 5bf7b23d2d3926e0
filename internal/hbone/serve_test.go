package hbone

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/weftmesh/weft/internal/spiffe"
)

// failingListener returns errs, one per Accept, before accepting.
type failingListener struct {
	net.Listener
	errs chan error
}

func (l *failingListener) Accept() (net.Conn, error) {
	select {
	case err := <-l.errs:
		return nil, err
	default:
		return l.Listener.Accept()
	}
}

func acceptErr(err error) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: err}
}

// serveFailing runs a server whose listener first fails with errs.
func serveFailing(t *testing.T, p *pki, errs ...error) (*testServer, chan error) {
	t.Helper()
	srvID := p.identity("a", "server")
	srv, err := NewServer(ServerConfig{
		TLS:     spiffe.ServerConfig(p.cert(srvID), p.ca.Roots(), p.ca.TrustDomain()),
		Handler: echoHandler,
		Logger:  quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingListener{Listener: ln, errs: make(chan error, len(errs))}
	for _, e := range errs {
		fl.errs <- e
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, fl) }()
	t.Cleanup(func() { cancel(); <-done })
	return &testServer{addr: ln.Addr().(*net.TCPAddr).AddrPort(), id: srvID, srv: srv}, done
}

func TestServeSurvivesTemporaryAcceptErrors(t *testing.T) {
	p := newPKI(t, "cluster.local")
	var errs []error
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EMFILE} {
		errs = append(errs, acceptErr(os.NewSyscallError("accept4", errno)))
	}
	ts, done := serveFailing(t, p, errs...)
	d := newDialer(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := d.Dial(ctx, ts.target(p.identity("b", "client"), "10.0.0.1:80"))
	if err != nil {
		t.Fatalf("dial after temporary accept errors: %v", err)
	}
	st.Close()
	select {
	case err := <-done:
		t.Fatalf("Serve returned after temporary accept errors: %v", err)
	default:
	}
}

func TestServeEndsOnPermanentAcceptError(t *testing.T) {
	p := newPKI(t, "cluster.local")
	broke := errors.New("listener broke")
	_, done := serveFailing(t, p, acceptErr(broke))
	select {
	case err := <-done:
		if !errors.Is(err, broke) {
			t.Errorf("Serve returned %v, want the accept error", err)
		}
		done <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("Serve kept going after a permanent accept error")
	}
}

// recordHandler keeps the messages of the records it receives.
type recordHandler struct {
	slog.Handler
	mu   *sync.Mutex
	msgs *[]string
}

func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.msgs = append(*h.msgs, r.Message)
	return nil
}

// TestServeSurvivesRealEMFILE runs out of file descriptors for real: a
// child process lowers its RLIMIT_NOFILE, floods its own server with
// connections until accept fails with EMFILE, lets them go and expects
// the server to serve again.
func TestServeSurvivesRealEMFILE(t *testing.T) {
	if os.Getenv("HBONE_EMFILE_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestServeSurvivesRealEMFILE$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "HBONE_EMFILE_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	var mu sync.Mutex
	var msgs []string
	ts := startServer(t, p, srvID, echoHandler, func(cfg *ServerConfig) {
		cfg.Logger = slog.New(recordHandler{Handler: slog.NewTextHandler(io.Discard, nil), mu: &mu, msgs: &msgs})
	})
	d := newDialer(t, p)

	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("counting open files: %v", err)
	}
	var saved syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	low := saved
	low.Cur = uint64(len(fds) + 40)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for range 200 {
		c, err := net.DialTimeout("tcp", ts.addr.String(), time.Second)
		if err != nil {
			break // this side is out of descriptors too
		}
		conns = append(conns, c)
	}
	time.Sleep(300 * time.Millisecond) // the server's accept meets EMFILE
	for _, c := range conns {
		c.Close()
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	serveEnded := func() {
		select {
		case err := <-ts.done:
			ts.done <- err // for the cleanup
			t.Fatalf("Serve returned: %v", err)
		default:
		}
	}
	st, err := d.Dial(ctx, ts.target(cliID, "10.0.0.1:80"))
	if err != nil {
		serveEnded()
		t.Fatalf("dial after running out of file descriptors: %v", err)
	}
	st.Close()
	serveEnded()
	mu.Lock()
	warned := slices.Contains(msgs, "accepting HBONE connections failed; retrying")
	mu.Unlock()
	if !warned {
		t.Errorf("the server never met a failing accept (%d connections opened)", len(conns))
	}
}

// TestDrainHandsLateConnectionsOn is a handover as a node proxy's restart
// makes one: a connection the old server accepted in the instant it began
// to drain finishes its handshake afterwards. The old server must neither
// cut the handshake short nor close the connection it brought up, and must
// tell it GOAWAY: the dial succeeds (served there, or refused and opened
// on a new connection to the successor) and the next dial goes to the
// successor. Both ways to drain: Serve's context ending, and Shutdown.
func TestDrainHandsLateConnectionsOn(t *testing.T) {
	for _, how := range []string{"context", "Shutdown"} {
		t.Run(how, func(t *testing.T) {
			p := newPKI(t, "cluster.local")
			srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
			old := startServer(t, p, srvID, echoHandler)
			next := startServer(t, p, srvID, echoHandler)
			shut := make(chan struct{})
			var dials atomic.Int64
			d := newDialer(t, p, func(cfg *DialerConfig) {
				cfg.Dial = func(ctx context.Context, _ netip.AddrPort, _ netip.Addr) (net.Conn, error) {
					var dl net.Dialer
					if dials.Add(1) > 1 {
						return dl.DialContext(ctx, "tcp", next.addr.String())
					}
					c, err := dl.DialContext(ctx, "tcp", old.addr.String())
					if err != nil {
						return nil, err
					}
					// The old server has the connection; now it drains.
					old.awaitAccepted(1)
					if how == "context" {
						old.cancel()
					} else {
						go func() { old.srv.Shutdown(10 * time.Second); close(shut) }()
					}
					for !old.srv.draining() {
						time.Sleep(time.Millisecond)
					}
					return c, nil
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			echo := func() {
				t.Helper()
				st, err := d.Dial(ctx, old.target(cliID, "10.0.0.1:80"))
				if err != nil {
					t.Fatalf("dial while the server it reached drains: %v", err)
				}
				defer st.Close()
				if _, err := st.Write([]byte("ping")); err != nil {
					t.Fatal(err)
				}
				st.CloseWrite()
				if b, err := io.ReadAll(st); err != nil || string(b) != "ping" {
					t.Fatalf("echo: %q, %v", b, err)
				}
			}
			echo()
			// The late connection was told GOAWAY: new streams go elsewhere.
			for dials.Load() < 2 {
				if ctx.Err() != nil {
					t.Fatal("new streams still go to the draining server")
				}
				echo()
			}
			if how == "Shutdown" {
				<-shut
				return
			}
			old.awaitStopped(t, 5*time.Second, "the old server did not finish draining")
		})
	}
}

// TestDialRetriesRefusedStream: a server that resets a CONNECT with
// REFUSED_STREAM has not processed it (RFC 9113, 8.7), as a server over
// its stream limit or one that has begun to drain does; Dial opens it
// again instead of failing.
func TestDialRetriesRefusedStream(t *testing.T) {
	p := newPKI(t, "cluster.local")
	srvID, cliID := p.identity("a", "server"), p.identity("b", "client")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", spiffe.ServerConfig(p.cert(srvID), p.ca.Roots(), p.ca.TrustDomain()))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		served <- func() error {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			preface := make([]byte, len(http2.ClientPreface))
			if _, err := io.ReadFull(c, preface); err != nil {
				return err
			}
			fr := http2.NewFramer(c, c)
			if err := fr.WriteSettings(); err != nil {
				return err
			}
			refused, answered := false, false
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					if answered {
						return nil // the client is done with the connection
					}
					return err
				}
				switch f := f.(type) {
				case *http2.SettingsFrame:
					if !f.IsAck() {
						if err := fr.WriteSettingsAck(); err != nil {
							return err
						}
					}
				case *http2.HeadersFrame:
					if !refused {
						refused = true
						if err := fr.WriteRSTStream(f.StreamID, http2.ErrCodeRefusedStream); err != nil {
							return err
						}
						continue
					}
					// Answered, the connection stays up as an HBONE server's does.
					var hb bytes.Buffer
					hpack.NewEncoder(&hb).WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
					if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
						return err
					}
					answered = true
				}
			}
		}()
	}()
	d := newDialer(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	st, err := d.Dial(ctx, Target{Source: cliID.ID(), Peers: []spiffeid.ID{srvID.ID()}, Addr: addr, Authority: "10.0.0.1:80"})
	if err != nil {
		t.Fatalf("dial after a refused stream: %v", err)
	}
	st.Close()
	d.Close()
	if err := <-served; err != nil {
		t.Errorf("server: %v", err)
	}
}

// TestDrainNotHeldByStalledHandshake: a peer that connects and never
// completes its handshake does not hold a draining server until the
// handshake timeout.
func TestDrainNotHeldByStalledHandshake(t *testing.T) {
	p := newPKI(t, "cluster.local")
	ts := startServer(t, p, p.identity("a", "server"), echoHandler, func(cfg *ServerConfig) { cfg.HandshakeTimeout = time.Minute })
	c, err := net.Dial("tcp", ts.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ts.awaitAccepted(1)
	ts.cancel()
	ts.awaitStopped(t, 20*time.Second, "a stalled handshake held the drain")
}
