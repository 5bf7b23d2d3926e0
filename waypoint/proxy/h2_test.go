package proxy

import (
	"net/http"
	"net/netip"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestHTTP2ServerSettings: the downstream HTTP/2 server announces the
// waypoint's limits in its SETTINGS, and ends a connection idle for the
// chain's stream idle timeout with a GOAWAY.
func TestHTTP2ServerSettings(t *testing.T) {
	m := newMesh(t)
	m.hcm = func(h *hcmv3.HttpConnectionManager) { h.StreamIdleTimeout = durationpb.New(200 * time.Millisecond) }
	m.apply([]*routev3.Route{{Match: prefix("/"), Action: toCluster("ok")}}, map[string][]netip.AddrPort{"ok": {backend(t, "ok", nil)}})
	c, fr := m.h2framer(vip)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		t.Fatalf("first frame %v, want SETTINGS", f)
	}
	want := map[http2.SettingID]uint32{
		http2.SettingMaxConcurrentStreams: maxConcurrentStreams,
		http2.SettingHeaderTableSize:      4096,
		// MaxHeaderBytes with the allowance net/http adds for HTTP/2's
		// per-field overhead (32 bytes for each of 10 fields).
		http2.SettingMaxHeaderListSize: maxHeaderBytes + 320,
	}
	for id, v := range want {
		if got, ok := sf.Value(id); !ok || got != v {
			t.Errorf("%v = %d (sent: %v), want %d", id, got, ok, v)
		}
	}
	start := time.Now()
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("the idle connection ended without GOAWAY: %v", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if g.ErrCode != http2.ErrCodeNo {
				t.Errorf("GOAWAY %v, want NO_ERROR", g.ErrCode)
			}
			break
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the idle connection ended after %v, want about 200ms", d)
	}
}

// TestHTTP2OptionsAsterisk: an HTTP/2 OPTIONS * goes through the waypoint's
// routing and policy as any request; the server does not answer it itself.
func TestHTTP2OptionsAsterisk(t *testing.T) {
	m := newMesh(t)
	m.apply([]*routev3.Route{{Match: prefix("/"), Action: toCluster("ok")}}, map[string][]netip.AddrPort{"ok": {backend(t, "ok", nil)}})
	req, _ := http.NewRequest("OPTIONS", "http://"+svcHost, nil)
	req.URL.Opaque = "*"
	resp, err := m.h2client(vip).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	// No route matches the path *: the waypoint's own answer, not the
	// server's bare 200.
	if b := body(resp); resp.StatusCode != 404 || b != "route not found" {
		t.Errorf("OPTIONS *: %d %q, want the waypoint's 404", resp.StatusCode, b)
	}
}
