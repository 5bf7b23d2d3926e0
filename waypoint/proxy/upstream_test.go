package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// countConns counts the connections a test server accepts.
func countConns(n *atomic.Int32) func(*http.Server) {
	return func(s *http.Server) {
		s.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				n.Add(1)
			}
		}
	}
}

// breakerState reads a cluster's circuit-breaker counters.
func (m *mesh) breakerState(cluster string) (conns, pending, requests, retries int64) {
	st, ok := m.p.upstream.Stats(cluster)
	if !ok {
		m.t.Fatalf("cluster %s has no upstream state", cluster)
	}
	return st.Connections, st.Pending, st.Requests, st.Retries
}

// settled waits until a cluster's counters show no request, pending
// request or retry in flight (a request's slot is given back just after its
// response ends) and returns its connection count.
func (m *mesh) settled(cluster string) int64 {
	m.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		conns, pending, requests, retries := m.breakerState(cluster)
		if pending == 0 && requests == 0 && retries == 0 {
			return conns
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("cluster %s: pending %d, requests %d, retries %d still held", cluster, pending, requests, retries)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestConnectionReuse: sequential requests share one upstream connection,
// HTTP/1.1 or HTTP/2, and upstreams that close connections cost no request.
func TestConnectionReuse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		http2 bool
	}{{"http1", false}, {"http2", true}} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMesh(t)
			var plain, idle, closing atomic.Int32
			ok := func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok "+r.URL.Path) }
			addr := serveHTTP(t, http.HandlerFunc(ok), countConns(&plain))
			idler := serveHTTP(t, http.HandlerFunc(ok), func(s *http.Server) { countConns(&idle)(s); s.IdleTimeout = 30 * time.Millisecond })
			closer := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Connection", "close")
				ok(w, r)
			}), countConns(&closing))
			m.applyClusters([]*routev3.Route{
				{Match: prefix("/idle"), Action: toCluster("idle")},
				{Match: prefix("/close"), Action: toCluster("close")},
				{Match: prefix("/"), Action: toCluster("plain")},
			}, map[string]clusterSpec{
				"plain": {eps: []endpointSpec{{addr: addr}}, http2: tc.http2},
				"idle":  {eps: []endpointSpec{{addr: idler}}, http2: tc.http2},
				"close": {eps: []endpointSpec{{addr: closer}}, http2: tc.http2},
			})
			c := m.h1(vip)
			for i := range 50 {
				if r := c.do(get("/")); r.StatusCode != 200 {
					t.Fatalf("request %d: %d", i, r.StatusCode)
				}
			}
			if n := plain.Load(); n != 1 {
				t.Errorf("50 sequential requests used %d upstream connections, want 1", n)
			}
			if n := m.settled("plain"); n != 1 {
				t.Errorf("breaker counts %d connections, want 1", n)
			}

			// Pauses around the upstream's idle timeout: some requests find
			// the connection closed, some race its closing.
			for i := range 30 {
				time.Sleep(time.Duration(i%7) * 8 * time.Millisecond)
				if r := c.do(get("/idle")); r.StatusCode != 200 {
					t.Fatalf("request %d to an upstream closing idle connections: %d %q", i, r.StatusCode, body(r))
				}
			}
			// The same for requests that cannot be repeated, which are
			// sent only on a connection checked live.
			for i := range 30 {
				time.Sleep(time.Duration(i%7) * 8 * time.Millisecond)
				post, _ := http.NewRequest("POST", "http://"+svcHost+"/idle", strings.NewReader(fmt.Sprint(i)))
				if r := c.do(post); r.StatusCode != 200 {
					t.Fatalf("POST %d to an upstream closing idle connections: %d %q", i, r.StatusCode, body(r))
				}
			}
			if idle.Load() < 4 {
				t.Errorf("the idle upstream saw %d connections; the test did not exercise its idle timeout", idle.Load())
			}
			for i := range 20 {
				if r := c.do(get("/close")); r.StatusCode != 200 {
					t.Fatalf("request %d to an upstream answering Connection: close: %d %q", i, r.StatusCode, body(r))
				}
			}
			if tc.http2 {
				return // net/http's HTTP/2 server ignores Connection: close
			}
			if n := closing.Load(); n != 20 {
				t.Errorf("an upstream answering Connection: close saw %d connections for 20 requests", n)
			}
			if n := m.settled("close"); n != 0 {
				t.Errorf("breaker counts %d connections after Connection: close, want 0", n)
			}
		})
	}
}

// TestCircuitBreaker: with one connection and no pending request allowed
// (HTTP/1.1), or one request (HTTP/2), a concurrent request overflows with
// Envoy's 503 UO; afterwards nothing stays counted.
func TestCircuitBreaker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		http2  bool
		limits *clusterv3.CircuitBreakers_Thresholds
	}{
		{"http1", false, &clusterv3.CircuitBreakers_Thresholds{MaxConnections: wrapperspb.UInt32(1), MaxPendingRequests: wrapperspb.UInt32(0)}},
		{"http2", true, &clusterv3.CircuitBreakers_Thresholds{MaxConnections: wrapperspb.UInt32(1), MaxPendingRequests: wrapperspb.UInt32(0), MaxRequests: wrapperspb.UInt32(1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMesh(t)
			var hold atomic.Bool
			hold.Store(true)
			started, release := make(chan struct{}, 1), make(chan struct{})
			addr := backend(t, "held", func(w http.ResponseWriter, r *http.Request) {
				if hold.Load() && r.URL.Path == "/hold" {
					started <- struct{}{}
					<-release
				}
				io.WriteString(w, "ok")
			})
			m.applyClusters([]*routev3.Route{{Match: prefix("/"), Action: toCluster("held")}},
				map[string]clusterSpec{"held": {eps: []endpointSpec{{addr: addr}}, http2: tc.http2, limits: tc.limits}})

			first := make(chan *http.Response)
			go func() { first <- m.do(get("/hold")) }()
			<-started
			r := m.do(get("/second"))
			if r.StatusCode != 503 || r.Header.Get("x-envoy-overloaded") != "true" {
				t.Errorf("concurrent request: %d x-envoy-overloaded=%q, want 503 true", r.StatusCode, r.Header.Get("x-envoy-overloaded"))
			}
			hold.Store(false)
			close(release)
			if r := <-first; r.StatusCode != 200 {
				t.Fatalf("held request: %d", r.StatusCode)
			}
			for i := range 100 {
				if r := m.do(get(fmt.Sprintf("/after/%d", i))); r.StatusCode != 200 {
					t.Fatalf("request %d after the overflow: %d %q", i, r.StatusCode, body(r))
				}
			}
			if n := m.settled("held"); n > 1 {
				t.Errorf("breaker counts %d connections, want at most 1", n)
			}
			if got := m.requests(t, "503"); got != 1 {
				t.Errorf("503s counted %v, want 1", got)
			}
		})
	}
}

// TestCircuitBreakerPending: with one connection and one pending request
// allowed, a second request waits for the connection and is served on it,
// a third overflows.
func TestCircuitBreakerPending(t *testing.T) {
	m := newMesh(t)
	var conns atomic.Int32
	started, release := make(chan struct{}, 2), make(chan struct{})
	addr := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			started <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok "+r.URL.Path)
	}), countConns(&conns))
	m.applyClusters([]*routev3.Route{{Match: prefix("/"), Action: toCluster("held")}},
		map[string]clusterSpec{"held": {eps: []endpointSpec{{addr: addr}}, limits: &clusterv3.CircuitBreakers_Thresholds{
			MaxConnections: wrapperspb.UInt32(1), MaxPendingRequests: wrapperspb.UInt32(1)}}})
	first, second := make(chan *http.Response), make(chan *http.Response)
	go func() { first <- m.do(get("/hold")) }()
	<-started
	go func() { second <- m.do(get("/queued")) }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, pending, _, _ := m.breakerState("held"); pending == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second request never queued")
		}
	}
	if r := m.do(get("/third")); r.StatusCode != 503 || r.Header.Get("x-envoy-overloaded") != "true" {
		t.Errorf("third request: %d, want 503 with x-envoy-overloaded", r.StatusCode)
	}
	close(release)
	if r := <-first; r.StatusCode != 200 {
		t.Errorf("held request: %d", r.StatusCode)
	}
	if r := <-second; r.StatusCode != 200 || body(r) != "ok /queued" {
		t.Errorf("queued request: %d", r.StatusCode)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("the upstream saw %d connections, want 1", n)
	}
	if n := m.settled("held"); n != 1 {
		t.Errorf("breaker counts %d connections, want 1", n)
	}
}

// TestRetryBudget: a retriable 503 is retried only within the cluster's
// max_retries.
func TestRetryBudget(t *testing.T) {
	m := newMesh(t)
	var mu sync.Mutex
	calls := map[string]int{}
	// Each key fails its first request.
	flaky := backend(t, "flaky", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.URL.Path]++
		n := calls[r.URL.Path]
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(503)
			io.WriteString(w, "first")
			return
		}
		io.WriteString(w, "ok")
	})
	retry := func(cluster string) *routev3.Route_Route {
		return &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: cluster},
			RetryPolicy: &routev3.RetryPolicy{RetryOn: "retriable-status-codes", RetriableStatusCodes: []uint32{503}, NumRetries: wrapperspb.UInt32(2),
				RetryBackOff: &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(time.Millisecond)}}}}
	}
	m.applyClusters([]*routev3.Route{
		{Match: prefix("/nobudget"), Action: retry("nobudget")},
		{Match: prefix("/"), Action: retry("budget")},
	}, map[string]clusterSpec{
		"nobudget": {eps: []endpointSpec{{addr: flaky}}, limits: &clusterv3.CircuitBreakers_Thresholds{MaxRetries: wrapperspb.UInt32(0)}},
		"budget":   {eps: []endpointSpec{{addr: flaky}}, limits: &clusterv3.CircuitBreakers_Thresholds{MaxRetries: wrapperspb.UInt32(3)}},
	})
	if r := m.do(get("/nobudget/a")); r.StatusCode != 503 || body(r) != "first" {
		t.Errorf("retry without budget: %d, want the first 503 to stand", r.StatusCode)
	}
	if r := m.do(get("/b")); r.StatusCode != 200 || body(r) != "ok" {
		t.Errorf("retry with budget: %d, want 200", r.StatusCode)
	}
	mu.Lock()
	if calls["/nobudget/a"] != 1 || calls["/b"] != 2 {
		t.Errorf("upstream calls %v, want /nobudget/a once and /b twice", calls)
	}
	mu.Unlock()
	m.settled("nobudget")
	m.settled("budget")
}

// TestFailedEndpoint: an endpoint whose connect fails is passed over while
// another is left, and a cluster whose only endpoint was down answers as
// soon as that endpoint is back, not after the failure mark runs out.
func TestFailedEndpoint(t *testing.T) {
	m := newMesh(t)
	var live atomic.Int32
	up := backend(t, "up", func(w http.ResponseWriter, r *http.Request) { live.Add(1); io.WriteString(w, "up") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close() // nothing listens there now: connects are refused
	m.applyClusters([]*routev3.Route{
		{Match: prefix("/two"), Action: toCluster("two")},
		{Match: prefix("/one"), Action: toCluster("one")},
	}, map[string]clusterSpec{
		"two": {eps: []endpointSpec{{addr: up}, {addr: down}}},
		"one": {eps: []endpointSpec{{addr: down}}},
	})
	c := m.h1(vip)
	for i := range 20 {
		if r := c.do(get("/two")); r.StatusCode != 200 {
			t.Fatalf("request %d with one endpoint down: %d %q", i, r.StatusCode, body(r))
		}
	}
	if r := c.do(get("/one")); r.StatusCode != 503 {
		t.Fatalf("the only endpoint down: %d %q, want 503", r.StatusCode, body(r))
	}
	// The endpoint comes back at once; its failure mark is younger than 5 s.
	ln, err = net.Listen("tcp", down.String())
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "back") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	if r := c.do(get("/one")); r.StatusCode != 200 || body(r) != "back" {
		t.Errorf("the only endpoint back: %d, want 200 \"back\"", r.StatusCode)
	}
}
