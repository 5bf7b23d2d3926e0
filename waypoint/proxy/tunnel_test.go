package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/weftmesh/weft/internal/hbone"
	"github.com/weftmesh/weft/internal/relay"
	"github.com/weftmesh/weft/internal/spiffe"
)

// tunnelBackend is a workload's HBONE inbound, what ztunnel serves on
// 15008: it records every CONNECT and relays it to the authority over
// loopback TCP.
type tunnelBackend struct {
	mu       sync.Mutex
	connects []connectSeen // guarded by mu
}

type connectSeen struct {
	peer      spiffeid.ID
	authority string
}

// serveTunnel serves HBONE on ln with an SVID for id from the mesh's CA.
func serveTunnel(t *testing.T, m *mesh, ln net.Listener, id spiffe.Identity) *tunnelBackend {
	svid, err := m.ca.IssueSVID(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tb := &tunnelBackend{}
	srv, err := hbone.NewServer(hbone.ServerConfig{
		TLS:          spiffe.ServerConfig(spiffe.StaticCertificate(svid), m.ca.Roots(), id.ID().TrustDomain()),
		Handler:      hbone.HandlerFunc(tb.serve),
		DrainTimeout: 100 * time.Millisecond,
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return tb
}

func (tb *tunnelBackend) serve(r *hbone.Request) {
	tb.mu.Lock()
	tb.connects = append(tb.connects, connectSeen{peer: r.Peer, authority: r.Authority.String()})
	tb.mu.Unlock()
	c, err := net.Dial("tcp", r.Authority.String())
	if err != nil {
		r.Reject(http.StatusServiceUnavailable)
		return
	}
	st, err := r.Accept(nil)
	if err != nil {
		c.Close()
		return
	}
	relay.Join(c, st, 0)
}

// seen returns the CONNECTs so far.
func (tb *tunnelBackend) seen() []connectSeen {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]connectSeen(nil), tb.connects...)
}

// listen opens a loopback listener closed at the end of the test.
func listen(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func withHBONEPort(ln net.Listener) func(*Config) {
	return func(c *Config) { c.UpstreamHBONEPort = uint16(ln.Addr().(*net.TCPAddr).Port) }
}

// TestUpstreamHBONE re-originates to tunnel endpoints behind a real HBONE
// server: the waypoint presents its own identity, the CONNECT targets the
// endpoint, and an endpoint presenting another identity than its metadata
// says is never used.
func TestUpstreamHBONE(t *testing.T) {
	hl := listen(t)
	m := newMesh(t, withHBONEPort(hl))
	appID, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "app")
	tb := serveTunnel(t, m, hl, appID)
	app := backend(t, "app", nil)
	other := backend(t, "other", nil)
	impostor := "spiffe://cluster.local/ns/demo/sa/impostor"
	m.applyClusters([]*routev3.Route{
		{Name: "wrong", Match: prefix("/wrong"), Action: toCluster("wrong")},
		{Name: "mixed", Match: prefix("/mixed"), Action: toCluster("mixed")},
		{Name: "h2", Match: prefix("/h2"), Action: toCluster("h2")},
		{Name: "app", Match: prefix("/"), Action: toCluster("app")},
	}, map[string]clusterSpec{
		"app":   {eps: []endpointSpec{{addr: app, identity: appID.String()}}},
		"h2":    {eps: []endpointSpec{{addr: app, identity: appID.String()}}, http2: true},
		"wrong": {eps: []endpointSpec{{addr: other, identity: impostor}}},
		"mixed": {eps: []endpointSpec{{addr: other, identity: impostor}, {addr: app, identity: appID.String()}}},
	})

	for _, path := range []string{"/a", "/h2"} {
		r := m.do(get(path))
		if b := body(r); r.StatusCode != 200 || !strings.HasPrefix(b, "app "+path) {
			t.Fatalf("GET %s over HBONE: %d %q", path, r.StatusCode, b)
		}
	}
	seen := tb.seen()
	if len(seen) == 0 {
		t.Fatal("the backend's HBONE server saw no CONNECT")
	}
	for _, c := range seen {
		if c.peer != m.wpID || c.authority != app.String() {
			t.Errorf("CONNECT %s from %s, want %s from %s", c.authority, c.peer, app, m.wpID)
		}
	}

	r := m.do(get("/wrong"))
	if b := body(r); r.StatusCode != 503 {
		t.Errorf("endpoint presenting another identity: %d %q, want 503", r.StatusCode, b)
	}
	for range 10 {
		r := m.do(get("/mixed"))
		if b := body(r); r.StatusCode != 200 || !strings.HasPrefix(b, "app ") {
			t.Fatalf("cluster with one impostor: %d %q, want 200 from app", r.StatusCode, b)
		}
	}
	for _, c := range tb.seen() {
		if c.authority == other.String() {
			t.Errorf("a CONNECT reached the endpoint whose identity did not match: %+v", c)
		}
	}
}

// TestUpstreamHBONERelay sends through an HBONE endpoint that relays for
// another destination (an ingress gateway's route through a Service's
// waypoint): the stream goes to the relay's own address, asks it for the
// authority, and is never sent to a relay presenting another identity.
func TestUpstreamHBONERelay(t *testing.T) {
	hl := listen(t)
	m := newMesh(t, withHBONEPort(hl))
	appID, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "app")
	direct := serveTunnel(t, m, hl, appID)
	rl := listen(t) // the relay: at its own port, not the HBONE port
	relayID, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "waypoint")
	relayed := serveTunnel(t, m, rl, relayID)
	app := backend(t, "app", nil)
	relayAddr := rl.Addr().(*net.TCPAddr).AddrPort()
	m.applyClusters([]*routev3.Route{
		{Name: "wrong", Match: prefix("/wrong"), Action: toCluster("wrong")},
		{Name: "via", Match: prefix("/"), Action: toCluster("via")},
	}, map[string]clusterSpec{
		"via":   {eps: []endpointSpec{{addr: relayAddr, identity: relayID.String(), authority: app}}},
		"wrong": {eps: []endpointSpec{{addr: relayAddr, identity: appID.String(), authority: app}}},
	})
	r := m.do(get("/a"))
	if b := body(r); r.StatusCode != 200 || !strings.HasPrefix(b, "app /a") {
		t.Fatalf("GET through the relay: %d %q", r.StatusCode, b)
	}
	seen := relayed.seen()
	if len(seen) != 1 || seen[0].authority != app.String() || seen[0].peer != m.wpID {
		t.Errorf("the relay saw %+v, want one CONNECT %s from %s", seen, app, m.wpID)
	}
	if d := direct.seen(); len(d) != 0 {
		t.Errorf("the stream went to the HBONE port, not the relay: %+v", d)
	}
	if r := m.do(get("/wrong")); r.StatusCode != 503 {
		t.Errorf("relay presenting another identity: %d %q, want 503", r.StatusCode, body(r))
	}
	if n := len(relayed.seen()); n != 1 {
		t.Errorf("a CONNECT reached the relay whose identity did not match (%d CONNECTs)", n)
	}
}

// TestUpstreamHBONEStreamReuse: sequential HTTP/1.1 requests on one
// downstream connection use one CONNECT stream to a tunnel endpoint.
func TestUpstreamHBONEStreamReuse(t *testing.T) {
	hl := listen(t)
	m := newMesh(t, withHBONEPort(hl))
	appID, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "app")
	tb := serveTunnel(t, m, hl, appID)
	app := backend(t, "app", nil)
	m.applyClusters([]*routev3.Route{{Match: prefix("/"), Action: toCluster("app")}},
		map[string]clusterSpec{"app": {eps: []endpointSpec{{addr: app, identity: appID.String()}}}})
	c := m.h1(vip)
	for i := range 20 {
		if r := c.do(get("/")); r.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, r.StatusCode)
		}
	}
	if n := len(tb.seen()); n != 1 {
		t.Errorf("20 sequential requests opened %d CONNECT streams, want 1", n)
	}
}

// TestUpstreamHBONEIdleClose: an application behind HBONE that closes idle
// connections costs no request, not even one that cannot be repeated: the
// waypoint notices the ended tunnel before it sends on it.
func TestUpstreamHBONEIdleClose(t *testing.T) {
	hl := listen(t)
	m := newMesh(t, withHBONEPort(hl))
	appID, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "app")
	tb := serveTunnel(t, m, hl, appID)
	app := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s", r.Method, b)
	}), func(s *http.Server) { s.IdleTimeout = 50 * time.Millisecond })
	m.applyClusters([]*routev3.Route{{Match: prefix("/"), Action: toCluster("app")}},
		map[string]clusterSpec{"app": {eps: []endpointSpec{{addr: app, identity: appID.String()}}}})
	c := m.h1(vip)
	// Pauses well clear of the idle timeout: a request the application
	// receives just as it closes the connection is lost on any transport.
	for i := range 12 {
		pause := time.Duration(i%2) * 150 * time.Millisecond
		time.Sleep(pause)
		req, _ := http.NewRequest("POST", "http://"+svcHost+"/", strings.NewReader(fmt.Sprint(i)))
		if r := c.do(req); r.StatusCode != 200 || body(r) != fmt.Sprintf("POST %d", i) {
			t.Fatalf("POST %d after a pause of %v: %d", i, pause, r.StatusCode)
		}
	}
	if n := len(tb.seen()); n < 2 {
		t.Errorf("%d CONNECTs: the application's idle timeout was not exercised", n)
	}
}
