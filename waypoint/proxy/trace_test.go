package proxy

import (
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/google/uuid"
)

// TestTraceparent: a valid traceparent keeps its trace id and flags with
// a new span id; anything else starts a trace, not sampled.
func TestTraceparent(t *testing.T) {
	const in = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	out := traceparent(in)
	if len(out) != 55 || out[:36] != in[:36] || out[52:] != in[52:] || out[36:52] == in[36:52] || !isHex(out[36:52]) {
		t.Errorf("traceparent(%q) = %q", in, out)
	}
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-b7ad6b7169203331-01",
		"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", "0--0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
		"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0x"} {
		out := traceparent(bad)
		if len(out) != 55 || out[:3] != "00-" || out[52:] != "-00" || !isHex(out[3:35]) || !isHex(out[36:52]) || strings.Contains(bad, out[3:35]) {
			t.Errorf("traceparent(%q) = %q, want a new trace", bad, out)
		}
	}
}

// TestRequestID: a request without x-request-id gets a UUID of its own
// upstream, a new one each; one with an id keeps it as it came; a request
// without traceparent starts a trace that is not sampled.
func TestRequestID(t *testing.T) {
	m := newMesh(t)
	b := backend(t, "ids", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("X-Request-Id")+" "+r.Header.Get("Traceparent"))
	})
	m.apply([]*routev3.Route{{Name: "default", Match: prefix("/"), Action: toCluster("ids")}}, map[string][]netip.AddrPort{"ids": {b}})
	seen := map[string]bool{}
	for range 3 {
		id, tp, _ := strings.Cut(body(m.do(get("/"))), " ")
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 4 || u.Variant() != uuid.RFC4122 || id != strings.ToLower(id) || seen[id] {
			t.Fatalf("x-request-id upstream %q (%v), want a new UUID v4", id, err)
		}
		seen[id] = true
		if !strings.HasSuffix(tp, "-00") {
			t.Errorf("a trace the waypoint started: traceparent %q, want not sampled (-00)", tp)
		}
	}
	if id, _, _ := strings.Cut(body(m.do(get("/", "x-request-id", "caller-id-1"))), " "); id != "caller-id-1" {
		t.Errorf("x-request-id upstream %q, want the caller's", id)
	}
}
