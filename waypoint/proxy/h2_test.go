package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weftmesh/weft/waypoint/internal/upstream/upstreamtest"
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

// TestH2UpstreamRefusedRetried: a request whose stream an HTTP/2 upstream
// refuses (REFUSED_STREAM: not processed, RFC 9113 section 8.7) goes again,
// and its answer is the client's.
func TestH2UpstreamRefusedRetried(t *testing.T) {
	var streams atomic.Int32
	up := upstreamtest.RawH2Backend(t, func(fr *http2.Framer, h *http2.HeadersFrame) {
		if streams.Add(1) == 1 {
			fr.WriteRSTStream(h.StreamID, http2.ErrCodeRefusedStream)
			return
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: h.StreamID, BlockFragment: encodeHeaders(":status", "200", "content-length", "2"), EndHeaders: true})
		fr.WriteData(h.StreamID, true, []byte("ok"))
	})
	m := newMesh(t)
	m.applyClusters([]*routev3.Route{{Match: prefix("/"), Action: toCluster("h2")}},
		map[string]clusterSpec{"h2": {eps: []endpointSpec{{addr: up}}, http2: true}})
	if r := m.h1(vip).do(get("/")); r.StatusCode != 200 || body(r) != "ok" {
		t.Errorf("a request refused once: %d, want 200 \"ok\"", r.StatusCode)
	}
	if n := streams.Load(); n != 2 {
		t.Errorf("the upstream saw %d streams, want 2", n)
	}
}

// TestH2UpstreamNoHost: an HTTP/1.0 request without Host reaches an HTTP/2
// upstream, with the endpoint's address as its :authority.
func TestH2UpstreamNoHost(t *testing.T) {
	m := newMesh(t)
	up := backend(t, "up", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Proto+" "+r.Host) })
	m.applyClusters([]*routev3.Route{{Match: prefix("/"), Action: toCluster("h2")}},
		map[string]clusterSpec{"h2": {eps: []endpointSpec{{addr: up}}, http2: true}})
	c, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b := body(resp); resp.StatusCode != 200 || b != "HTTP/2.0 "+up.String() {
		t.Errorf("HTTP/1.0 without Host: %d %q", resp.StatusCode, b)
	}
}

// TestH2UpstreamRetiredDrains: an HTTP/2 upstream connection whose endpoint
// leaves the cluster finishes the stream it carries, then closes.
func TestH2UpstreamRetiredDrains(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	closed := make(chan struct{}, 8)
	old := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-release
		}
		io.WriteString(w, "old")
	}), func(s *http.Server) {
		s.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed {
				closed <- struct{}{}
			}
		}
	})
	m := newMesh(t)
	route := []*routev3.Route{{Match: prefix("/"), Action: toCluster("h2")}}
	m.applyClusters(route, map[string]clusterSpec{"h2": {eps: []endpointSpec{{addr: old}}, http2: true}})
	c, err := m.dial(vip)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	get("/slow").Write(c)
	slow := make(chan string, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			slow <- err.Error()
			return
		}
		slow <- fmt.Sprint(resp.StatusCode, " ", body(resp))
	}()
	<-started
	// The endpoint leaves; the next request retires its host.
	m.applyClusters(route, map[string]clusterSpec{"h2": {eps: []endpointSpec{{addr: backend(t, "new", nil)}}, http2: true}})
	if r := m.h1(vip).do(get("/")); r.StatusCode != 200 || !strings.HasPrefix(body(r), "new") {
		t.Fatalf("after the push: %d", r.StatusCode)
	}
	select {
	case <-closed:
		t.Fatal("the retired connection closed with a stream in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if got := <-slow; got != "200 old" {
		t.Errorf("the stream in flight: %q, want 200 \"old\"", got)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Error("the retired connection stayed open after its stream")
	}
}
