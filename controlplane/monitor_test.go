package controlplane

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMonitorDebugLoopbackOnly: the monitoring port's debug endpoints (the
// mesh's configuration, the process's profiles) answer loopback callers
// only, whatever address form the peer arrives with; /ready and /metrics
// answer anyone.
func TestMonitorDebugLoopbackOnly(t *testing.T) {
	cp := &ControlPlane{reg: prometheus.NewRegistry()}
	cp.ready.Store(true)
	mux := cp.monitorMux(nil)
	for _, tc := range []struct {
		path, peer string
		want       int
	}{
		{"/debug/pprof/", "127.0.0.1:40000", http.StatusOK},
		{"/debug/pprof/", "[::1]:40000", http.StatusOK},
		{"/debug/pprof/", "[::ffff:127.0.0.1]:40000", http.StatusOK},
		{"/debug/pprof/", "10.0.0.7:40000", http.StatusForbidden},
		{"/debug/pprof/", "[::ffff:10.0.0.7]:40000", http.StatusForbidden},
		{"/debug/pprof/", "garbage", http.StatusForbidden},
		{"/debug/pprof/profile?seconds=1", "10.0.0.7:40000", http.StatusForbidden},
		{"/debug/pprof/trace?seconds=1", "10.0.0.7:40000", http.StatusForbidden},
		{"/debug/pprof/goroutine", "10.0.0.7:40000", http.StatusForbidden},
		{"/debug/xds", "10.0.0.7:40000", http.StatusForbidden},
		{"/ready", "10.0.0.7:40000", http.StatusOK},
		{"/metrics", "10.0.0.7:40000", http.StatusOK},
	} {
		req := httptest.NewRequest(http.MethodGet, tc.path, nil)
		req.RemoteAddr = tc.peer
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("GET %s from %s: %d, want %d", tc.path, tc.peer, rec.Code, tc.want)
		}
	}
}
