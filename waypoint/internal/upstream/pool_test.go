package upstream

import (
	"context"
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

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/waypoint/config"
)

// newClient returns a client for snap's clusters, its Run stopped when the
// test ends. Its endpoints are plain TCP: it opens no HBONE connection.
func newClient(t *testing.T, snap *config.Snapshot) *Client {
	t.Helper()
	d, err := hbone.NewDialer(hbone.DialerConfig{TLS: func(spiffeid.ID, []spiffeid.ID) (*tls.Config, error) {
		return nil, errors.New("no HBONE in these tests")
	}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{
		Identity: spiffeid.RequireFromString("spiffe://cluster.local/ns/weft/sa/waypoint"),
		Dialer:   d,
		Snapshot: func() *config.Snapshot { return snap },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; d.Close() })
	return c
}

// snapshot has one cluster, name, with cl's settings and plain TCP
// endpoints at addrs.
func snapshot(name string, cl config.Cluster, addrs ...netip.AddrPort) *config.Snapshot {
	cl.Name = name
	a := &config.Assignment{Name: name}
	for _, addr := range addrs {
		a.Endpoints = append(a.Endpoints, config.Endpoint{Addr: addr, Healthy: true})
	}
	return &config.Snapshot{Clusters: map[string]*config.Cluster{name: &cl}, Assignments: map[string]*config.Assignment{name: a}}
}

// listen returns a loopback listener closed when the test ends.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// httpBackend serves h over HTTP/1.1 until the test ends.
func httpBackend(t *testing.T, h http.HandlerFunc) netip.AddrPort {
	ln := listen(t)
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// rawH2Backend is an HTTP/2 upstream that calls answer for each request's
// HEADERS frame.
func rawH2Backend(t *testing.T, answer func(*http2.Framer, *http2.HeadersFrame)) netip.AddrPort {
	ln := listen(t)
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				preface := make([]byte, len(http2.ClientPreface))
				if _, err := io.ReadFull(c, preface); err != nil {
					return
				}
				fr := http2.NewFramer(c, c)
				fr.WriteSettings()
				for {
					f, err := fr.ReadFrame()
					if err != nil {
						return
					}
					if h, ok := f.(*http2.HeadersFrame); ok {
						answer(fr, h)
					}
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// TestFreshCheckout: the attempt that replaces a pooled connection the
// peer had given up on needs a new connection; with the cluster's only slot
// held by an idle connection to the same endpoint it closes that one
// rather than waiting for a slot that is never freed.
func TestFreshCheckout(t *testing.T) {
	addr := httpBackend(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	snap := snapshot("b", config.Cluster{MaxConnections: 1, MaxPending: 1, MaxRequests: 1024, MaxRetries: 3}, addr)
	c := newClient(t, snap)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequest("GET", "http://svc.ns/", nil)
	var picked Picked
	resp, err := c.RoundTrip(ctx, snap, "b", req, false, netip.AddrPort{}, &picked)
	if err != nil {
		t.Fatalf("first request: %v", err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "ok" || picked.Addr != addr || picked.Endpoint == nil {
		t.Fatalf("first request: %q from %v", b, picked.Addr)
	}
	resp.Body.Close()
	if st, _ := c.Stats("b"); st != (Stats{Connections: 1}) {
		t.Fatalf("after the first request: %+v, want one pooled connection", st)
	}
	l, err := c.checkout(ctx, c.pool(snap, "b"), want{fresh: true})
	if err != nil {
		t.Fatalf("fresh checkout: %v", err)
	}
	if l.reused {
		t.Error("fresh checkout reused a pooled connection")
	}
	if st, _ := c.Stats("b"); st.Connections != 1 || st.Pending != 0 {
		t.Errorf("after a fresh checkout: %d connections, %d pending; want 1 and 0", st.Connections, st.Pending)
	}
	l.h1.discard()
	if st, _ := c.Stats("b"); st.Connections != 0 {
		t.Errorf("%d connections counted after the only one closed", st.Connections)
	}
}

// TestStats: a cluster never used has no counters; one that overflowed
// counts nothing held afterwards.
func TestStats(t *testing.T) {
	release := make(chan struct{})
	addr := httpBackend(t, func(w http.ResponseWriter, r *http.Request) { <-release; io.WriteString(w, "ok") })
	snap := snapshot("b", config.Cluster{MaxConnections: 1, MaxPending: 0, MaxRequests: 1024, MaxRetries: 3}, addr)
	c := newClient(t, snap)
	if _, ok := c.Stats("b"); ok {
		t.Error("a cluster never used has stats")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://svc.ns/", nil)
		resp, err := c.RoundTrip(ctx, snap, "b", req, false, netip.AddrPort{}, nil)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		first <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st, _ := c.Stats("b"); st.Requests == 1 && st.Connections == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first request never counted")
		}
	}
	req, _ := http.NewRequest("GET", "http://svc.ns/", nil)
	if _, err := c.RoundTrip(ctx, snap, "b", req, false, netip.AddrPort{}, nil); !errors.Is(err, ErrOverloaded) {
		t.Errorf("a second request with the only connection busy: %v, want ErrOverloaded", err)
	}
	if st, _ := c.Stats("b"); st != (Stats{Connections: 1, Requests: 1}) {
		t.Errorf("after the overflow: %+v, want the first request's connection and request only", st)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first request: %v", err)
	}
	if st, _ := c.Stats("b"); st != (Stats{Connections: 1}) {
		t.Errorf("after the first request: %+v, want one pooled connection", st)
	}
}
