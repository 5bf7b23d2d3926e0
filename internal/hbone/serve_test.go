package hbone

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

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
