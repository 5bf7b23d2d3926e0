package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/weftmesh/weft/internal/hbone"
)

func TestTunnelFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want flag
	}{
		{fmt.Errorf("opening: %w", &hbone.StatusError{Code: 401}), flagDenied},
		{&hbone.StatusError{Code: 503}, flagConnect},
		{&hbone.StatusError{Code: 400}, flagConnect},
		{errors.New("dial tcp: connection refused"), flagConnect},
	} {
		if got := tunnelFailure(tc.err); got != tc.want {
			t.Errorf("tunnelFailure(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestFailRecordsRejection checks the one path every refused plain
// connection takes: its flag in the metric's labels and the access log,
// its error logged, and the connection closed.
func TestFailRecordsRejection(t *testing.T) {
	for _, tc := range []struct {
		rej       rejection
		wantLabel string
	}{
		{rejection{err: errors.New("not this pod")}, "-"},
		{rejection{flag: flagDenied, err: errors.New("denied by demo/deny-all")}, "DENY"},
		{rejection{flag: flagConnect, err: errors.New("connection refused")}, "CONNECT"},
	} {
		t.Run(tc.wantLabel, func(t *testing.T) {
			var logged bytes.Buffer
			m := NewMetrics(prometheus.NewRegistry())
			p := &Pod{cfg: PodConfig{Metrics: m, AccessLog: slog.New(slog.NewTextHandler(&logged, nil))}}
			c, peer := net.Pipe()
			defer peer.Close()
			lbl := &connLabels{reporter: "source"}
			p.fail(c, lbl, netip.MustParseAddrPort("10.0.0.1:80"), time.Now(), tc.rej)

			v := lbl.values()
			if got := v[len(v)-2]; got != tc.wantLabel {
				t.Errorf("response_flags = %q, want %q", got, tc.wantLabel)
			}
			if n := testutil.ToFloat64(m.failed.WithLabelValues(v...)); n != 1 {
				t.Errorf("failed counted %v, want 1", n)
			}
			if !strings.Contains(logged.String(), tc.rej.err.Error()) {
				t.Errorf("access log %q lacks the error %q", logged.String(), tc.rej.err)
			}
			if _, err := peer.Read(make([]byte, 1)); err == nil {
				t.Error("the refused connection is still open")
			}
		})
	}
}
