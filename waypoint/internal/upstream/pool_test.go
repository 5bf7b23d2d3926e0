package upstream_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/internal/upstream"
	"github.com/weftmesh/weft/waypoint/internal/upstream/upstreamtest"
)

// TestFreshCheckout: the attempt that replaces a pooled connection the
// peer had given up on needs a new connection; with the cluster's only slot
// held by an idle connection to the same endpoint it closes that one
// rather than waiting for a slot that is never freed.
func TestFreshCheckout(t *testing.T) {
	addr := upstreamtest.HTTPBackend(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	snap := upstreamtest.Snapshot("b", config.Cluster{MaxConnections: 1, MaxPending: 1, MaxRequests: 1024, MaxRetries: 3}, addr)
	c := upstreamtest.NewClient(t, snap)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequest("GET", "http://svc.ns/", nil)
	var picked upstream.Picked
	resp, err := c.RoundTrip(ctx, snap, "b", req, false, netip.AddrPort{}, &picked)
	if err != nil {
		t.Fatalf("first request: %v", err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "ok" || picked.Addr != addr || picked.Endpoint == nil {
		t.Fatalf("first request: %q from %v", b, picked.Addr)
	}
	resp.Body.Close()
	if st, _ := c.Stats("b"); st != (upstream.Stats{Connections: 1}) {
		t.Fatalf("after the first request: %+v, want one pooled connection", st)
	}
	reused, discard, err := upstream.CheckoutFresh(ctx, c, snap, "b")
	if err != nil {
		t.Fatalf("fresh checkout: %v", err)
	}
	if reused {
		t.Error("fresh checkout reused a pooled connection")
	}
	if st, _ := c.Stats("b"); st.Connections != 1 || st.Pending != 0 {
		t.Errorf("after a fresh checkout: %d connections, %d pending; want 1 and 0", st.Connections, st.Pending)
	}
	discard()
	if st, _ := c.Stats("b"); st.Connections != 0 {
		t.Errorf("%d connections counted after the only one closed", st.Connections)
	}
}

// TestStats: a cluster never used has no counters; one that overflowed
// counts nothing held afterwards.
func TestStats(t *testing.T) {
	release := make(chan struct{})
	addr := upstreamtest.HTTPBackend(t, func(w http.ResponseWriter, r *http.Request) { <-release; io.WriteString(w, "ok") })
	snap := upstreamtest.Snapshot("b", config.Cluster{MaxConnections: 1, MaxPending: 0, MaxRequests: 1024, MaxRetries: 3}, addr)
	c := upstreamtest.NewClient(t, snap)
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
	if _, err := c.RoundTrip(ctx, snap, "b", req, false, netip.AddrPort{}, nil); !errors.Is(err, upstream.ErrOverloaded) {
		t.Errorf("a second request with the only connection busy: %v, want upstream.ErrOverloaded", err)
	}
	if st, _ := c.Stats("b"); st != (upstream.Stats{Connections: 1, Requests: 1}) {
		t.Errorf("after the overflow: %+v, want the first request's connection and request only", st)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first request: %v", err)
	}
	if st, _ := c.Stats("b"); st != (upstream.Stats{Connections: 1}) {
		t.Errorf("after the first request: %+v, want one pooled connection", st)
	}
}

// TestUnprocessed: the errors of the waypoint's HTTP/2 client for a
// request its upstream did not process (a graceful GOAWAY below its stream,
// as Go's server sends when its idle timeout closes a connection a request
// is racing; a refused stream) say so, and those for a request it may have
// processed do not.
func TestUnprocessed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(fr *http2.Framer, stream uint32)
		want   bool
	}{
		{"goaway", func(fr *http2.Framer, _ uint32) { fr.WriteGoAway(0, http2.ErrCodeNo, nil) }, true},
		{"refused", func(fr *http2.Framer, id uint32) { fr.WriteRSTStream(id, http2.ErrCodeRefusedStream) }, true},
		{"internal error", func(fr *http2.Framer, id uint32) { fr.WriteRSTStream(id, http2.ErrCodeInternal) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := upstreamtest.RawH2Backend(t, func(fr *http2.Framer, h *http2.HeadersFrame) { tc.answer(fr, h.StreamID) })
			nc, err := net.Dial("tcp", up.String())
			if err != nil {
				t.Fatal(err)
			}
			cc, err := upstream.NewH2ClientConn(context.Background(), nc, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			req, _ := http.NewRequest("GET", "http://svc.ns/", nil)
			_, err = cc.RoundTrip(req)
			if err == nil {
				t.Fatal("the request succeeded")
			}
			if got := upstream.Unprocessed(err); got != tc.want {
				t.Errorf("upstream.Unprocessed(%q) = %v, want %v", err, got, tc.want)
			}
		})
	}
	if upstream.Unprocessed(errors.New("http2: response body closed")) {
		t.Error("an error after processing counts as unprocessed")
	}
}

// TestEndpointUpdateDuringRequests: a configuration push that changes an
// endpoint's workload labels while requests pick, dial and report that
// endpoint is seen whole by each request (the race detector checks it), and
// each request reports the endpoint as one push or another had it.
func TestEndpointUpdateDuringRequests(t *testing.T) {
	addr := upstreamtest.HTTPBackend(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	push := func(i int) *config.Snapshot {
		s := upstreamtest.Snapshot("b", config.Cluster{MaxConnections: 8, MaxPending: 64, MaxRequests: 1024, MaxRetries: 3}, addr)
		s.Assignments["b"].Endpoints[0].WorkloadName = fmt.Sprintf("echo-%d", i)
		return s
	}
	var snaps atomic.Pointer[config.Snapshot]
	snaps.Store(push(0))
	c := upstreamtest.NewClient(t, snaps.Load())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	stop := make(chan struct{})
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			snaps.Store(push(i))
			runtime.Gosched()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				req, _ := http.NewRequest("GET", "http://svc.ns/", nil)
				var picked upstream.Picked
				resp, err := c.RoundTrip(ctx, snaps.Load(), "b", req, false, netip.AddrPort{}, &picked)
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if ep := picked.Endpoint; ep == nil || ep.Addr != addr || !strings.HasPrefix(ep.WorkloadName, "echo-") {
					errs <- fmt.Errorf("the request reports endpoint %+v", ep)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-pushed
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestOriginalDstCluster: any ORIGINAL_DST cluster, not only the one named
// passthrough (a ServiceEntry of resolution NONE is one of its own), sends
// a request and a relay to the target, the original destination.
func TestOriginalDstCluster(t *testing.T) {
	addr := upstreamtest.HTTPBackend(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "original") })
	snap := upstreamtest.Snapshot("outbound|8080||partner.example", config.Cluster{Passthrough: true, MaxConnections: 8, MaxPending: 8, MaxRequests: 8, MaxRetries: 3})
	c := upstreamtest.NewClient(t, snap)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequest("GET", "http://partner.example/", nil)
	var picked upstream.Picked
	resp, err := c.RoundTrip(ctx, snap, "outbound|8080||partner.example", req, false, addr, &picked)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "original" || picked.Addr != addr {
		t.Errorf("answered %q from %v, want the original destination %v", b, picked.Addr, addr)
	}
	conn, to, err := c.Dial(ctx, snap, "outbound|8080||partner.example", addr)
	if err != nil {
		t.Fatalf("relay: %v", err)
	}
	conn.Close()
	if to != addr {
		t.Errorf("relay to %v, want %v", to, addr)
	}
}
