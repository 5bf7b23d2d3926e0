package router

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/internal/upstream"
	"github.com/weftmesh/weft/waypoint/internal/upstream/upstreamtest"
	"github.com/weftmesh/weft/waypoint/route"
)

// newRouter returns a router over an upstream client for snap, whose
// endpoints are plain TCP.
func newRouter(t *testing.T, snap *config.Snapshot) *Router {
	return New(upstreamtest.NewClient(t, snap))
}

// TestSend: a retriable answer is retried within the cluster's retry
// budget, with the kept body each time; without budget the first answer
// stands.
func TestSend(t *testing.T) {
	var mu sync.Mutex
	calls := map[string][]string{}
	addr := upstreamtest.HTTPBackend(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		calls[r.URL.Path] = append(calls[r.URL.Path], string(b))
		n := len(calls[r.URL.Path])
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(503)
			io.WriteString(w, "first")
			return
		}
		io.WriteString(w, "ok")
	})
	ep := []config.Endpoint{{Addr: addr, Healthy: true}}
	snap := &config.Snapshot{
		Clusters: map[string]*config.Cluster{
			"budget":   {Name: "budget", MaxConnections: 10, MaxPending: 10, MaxRequests: 10, MaxRetries: 3},
			"nobudget": {Name: "nobudget", MaxConnections: 10, MaxPending: 10, MaxRequests: 10, MaxRetries: 0},
		},
		Assignments: map[string]*config.Assignment{"budget": {Name: "budget", Endpoints: ep}, "nobudget": {Name: "nobudget", Endpoints: ep}},
	}
	rr := newRouter(t, snap)
	for _, tc := range []struct {
		cluster, want string
		calls         int
	}{
		{"budget", "ok", 2},
		{"nobudget", "first", 1},
	} {
		t.Run(tc.cluster, func(t *testing.T) {
			rt := &route.Route{Name: tc.cluster, Clusters: []route.WeightedCluster{{Name: tc.cluster, Weight: 1}}, TotalWeight: 1,
				Retry: &route.Retry{OnStatus: true, StatusCodes: []int{503}, NumRetries: 2, BaseInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond}}
			r, _ := http.NewRequest("POST", "http://svc.ns/"+tc.cluster, strings.NewReader("an order"))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := NewCall(ctx, snap, rt, Pick(rt), r, false, "")
			if err != nil {
				t.Fatal(err)
			}
			var picked upstream.Picked
			resp, done, err := rr.Send(ctx, c, &picked)
			if err != nil {
				t.Fatal(err)
			}
			defer done()
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != tc.want || picked.Addr != addr {
				t.Errorf("answer %q from %v, want %q from %v", b, picked.Addr, tc.want, addr)
			}
			mu.Lock()
			got := calls["/"+tc.cluster]
			mu.Unlock()
			if len(got) != tc.calls {
				t.Errorf("%d upstream calls, want %d", len(got), tc.calls)
			}
			for i, body := range got {
				if body != "an order" {
					t.Errorf("call %d had body %q", i, body)
				}
			}
		})
	}
}

// TestShouldRetry: Envoy's retry_on conditions.
func TestShouldRetry(t *testing.T) {
	status := func(c int) *http.Response { return &http.Response{StatusCode: c} }
	reset := errors.New("connection reset")
	for _, tc := range []struct {
		name   string
		policy *route.Retry
		resp   *http.Response
		err    error
		want   bool
	}{
		{"no policy", nil, status(503), nil, false},
		{"5xx 500", &route.Retry{On5xx: true}, status(500), nil, true},
		{"5xx 404", &route.Retry{On5xx: true}, status(404), nil, false},
		{"5xx timeout", &route.Retry{On5xx: true}, nil, context.DeadlineExceeded, true},
		{"gateway-error 502", &route.Retry{OnGatewayError: true}, status(502), nil, true},
		{"gateway-error 500", &route.Retry{OnGatewayError: true}, status(500), nil, false},
		{"connect-failure timeout", &route.Retry{OnConnectFailure: true}, nil, context.DeadlineExceeded, false},
		{"connect-failure reset", &route.Retry{OnConnectFailure: true}, nil, reset, true},
		{"reset", &route.Retry{OnReset: true}, nil, reset, true},
		{"status listed", &route.Retry{OnStatus: true, StatusCodes: []int{409, 503}}, status(409), nil, true},
		{"status not listed", &route.Retry{OnStatus: true, StatusCodes: []int{503}}, status(500), nil, false},
	} {
		if got := shouldRetry(tc.policy, tc.resp, tc.err); got != tc.want {
			t.Errorf("%s: shouldRetry = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestStripHop: the fields Connection names and the standard hop-by-hop
// ones go; "Te: trailers" stays.
func TestStripHop(t *testing.T) {
	h := http.Header{"Connection": {"keep-alive, X-Private"}, "X-Private": {"1"}, "Keep-Alive": {"timeout=5"},
		"Te": {"trailers, deflate"}, "Upgrade": {"websocket"}, "X-Kept": {"1"}}
	StripHop(h)
	want := http.Header{"Te": {"trailers"}, "X-Kept": {"1"}}
	if len(h) != len(want) || h.Get("Te") != "trailers" || h.Get("X-Kept") != "1" {
		t.Errorf("after StripHop: %v, want %v", h, want)
	}
}

// TestStripHopOddConnection: Connection's names in any case, with spaces
// and empty items, across several fields; a Te that Connection names (as
// RFC 9110 section 10.1.4 asks of its sender) keeps "trailers" from
// whichever of several Te fields has it.
func TestStripHopOddConnection(t *testing.T) {
	h := http.Header{
		"Connection": {" , x-PRIVATE ,,te", "", "X-Other  ,  keep-alive"},
		"X-Private":  {"1"}, "X-Other": {"2"}, "Te": {"gzip", "deflate, Trailers"},
		"Proxy-Connection": {"keep-alive"}, "X-Kept": {"1"},
	}
	StripHop(h)
	if len(h) != 2 || h.Get("X-Kept") != "1" || len(h["Te"]) != 1 || h["Te"][0] != "trailers" {
		t.Errorf("after StripHop: %v, want X-Kept and Te: trailers", h)
	}
	for _, te := range []string{"gzip", "notrailers", "trailersx, gzip", "gzip;q=trailers", "deflate;trailers=1"} {
		h = http.Header{"Connection": {"te"}, "Te": {te}}
		if StripHop(h); len(h) != 0 {
			t.Errorf("Te %q, which does not ask for trailers: %v, want nothing", te, h)
		}
	}
	for _, te := range []string{"TRAILERS", " trailers ;q=0.5", "gzip,trailers"} {
		h = http.Header{"Te": {te}}
		if StripHop(h); len(h["Te"]) != 1 || h["Te"][0] != "trailers" {
			t.Errorf("Te %q: %v, want Te: trailers", te, h)
		}
	}
}
