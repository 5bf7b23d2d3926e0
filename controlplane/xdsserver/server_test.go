package xdsserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/weftmesh/weft/controlplane/internal/xdstest"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

func workload(name, node string) *workloadpb.Address {
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
		Uid: "Kubernetes//Pod/shop/" + name, Name: name, Namespace: "shop", Node: node,
		Addresses: [][]byte{{10, 0, 0, byte(len(name))}}, ServiceAccount: "sa",
	}}}
}

type harness struct {
	srv  *Server
	reg  *prometheus.Registry
	addr string
}

// start serves s on a loopback port until the test ends.
func start(t *testing.T, auth Authenticator, opts ...grpc.ServerOption) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := New(Config{Registerer: reg, Authenticator: auth, NodeProxies: []string{ztunnelID}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	s.Register(g)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = g.Serve(ln); done <- struct{}{} }()
	go func() { _ = s.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() {
		cancel()
		<-done // Run ended the streams
		g.Stop()
		<-done
	})
	return &harness{srv: s, reg: reg, addr: ln.Addr().String()}
}

func (h *harness) client(t *testing.T, ctx context.Context, cfg xdstest.Config) *xdstest.Client {
	t.Helper()
	cfg.Address = h.addr
	c, err := xdstest.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	go func() { _ = c.Run(cctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func publish(t *testing.T, s *Server, typeURL string, upd map[string]proto.Message, remove ...string) {
	t.Helper()
	if err := s.Publish(typeURL, upd, remove, time.Now()); err != nil {
		t.Fatal(err)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestIncrementalPush checks the delta protocol end to end: the first
// response holds everything, each later update exactly what changed, and a
// removal only the name.
func TestIncrementalPush(t *testing.T) {
	// Registered first, so it runs after every other cleanup.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	ctx := testCtx(t)
	h := start(t, nil)
	publish(t, h.srv, workloadpb.AddressTypeURL, map[string]proto.Message{
		"Kubernetes//Pod/shop/a": workload("a", "n1"), "Kubernetes//Pod/shop/b": workload("b", "n1"), "Kubernetes//Pod/shop/c": workload("c", "n2"),
	})
	publish(t, h.srv, securitypb.AuthorizationTypeURL, map[string]proto.Message{
		"shop/p": &securitypb.Authorization{Name: "p", Namespace: "shop", Scope: securitypb.Scope_NAMESPACE},
	})
	c := h.client(t, ctx, xdstest.Config{})
	if err := c.Wait(ctx, workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool { return len(m) == 3 }); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, securitypb.AuthorizationTypeURL, func(m map[string]*anypb.Any) bool { return len(m) == 1 }); err != nil {
		t.Fatal(err)
	}
	before := len(c.Responses())

	// One workload changes: one resource.
	publish(t, h.srv, workloadpb.AddressTypeURL, map[string]proto.Message{"Kubernetes//Pod/shop/b": workload("b", "n2")})
	if err := c.Wait(ctx, workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool {
		return xdstest.Workload(m["Kubernetes//Pod/shop/b"]).GetNode() == "n2"
	}); err != nil {
		t.Fatal(err)
	}
	// Publishing an identical resource sends nothing; a removal sends the name.
	publish(t, h.srv, workloadpb.AddressTypeURL, map[string]proto.Message{"Kubernetes//Pod/shop/a": workload("a", "n1")}, "Kubernetes//Pod/shop/c")
	if err := c.Wait(ctx, workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool { return len(m) == 2 }); err != nil {
		t.Fatal(err)
	}
	got := c.Responses()[before:]
	want := []xdstest.Response{
		{TypeURL: workloadpb.AddressTypeURL, Upserts: []string{"Kubernetes//Pod/shop/b"}},
		{TypeURL: workloadpb.AddressTypeURL, Removes: []string{"Kubernetes//Pod/shop/c"}},
	}
	if len(got) != len(want) {
		t.Fatalf("responses after the first = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].TypeURL != want[i].TypeURL || !slices.Equal(got[i].Upserts, want[i].Upserts) || !slices.Equal(got[i].Removes, want[i].Removes) {
			t.Errorf("response %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if n := testutil.ToFloat64(h.srv.m.clients); n != 1 {
		t.Errorf("pilot_xds = %v, want 1", n)
	}
	if n := testutil.ToFloat64(h.srv.m.pushes.WithLabelValues("wds")); n < 3 {
		t.Errorf("pilot_xds_pushes{type=wds} = %v, want at least 3", n)
	}
}

// TestNACK checks that a rejected resource is counted and logged and does
// not stop later updates.
func TestNACK(t *testing.T) {
	ctx := testCtx(t)
	h := start(t, nil)
	c := h.client(t, ctx, xdstest.Config{Reject: func(_, name string, _ *anypb.Any) error {
		if name == "Kubernetes//Pod/shop/bad" {
			return errors.New("bad workload")
		}
		return nil
	}})
	<-c.Synced()
	publish(t, h.srv, workloadpb.AddressTypeURL, map[string]proto.Message{"Kubernetes//Pod/shop/bad": workload("bad", "n1")})
	if _, err := c.WaitResponses(ctx, 3); err != nil { // two initial, one rejected
		t.Fatal(err)
	}
	publish(t, h.srv, workloadpb.AddressTypeURL, map[string]proto.Message{"Kubernetes//Pod/shop/good": workload("good", "n1")})
	if err := c.Wait(ctx, workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool { return m["Kubernetes//Pod/shop/good"] != nil }); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(h.srv.m.rejects.WithLabelValues("wds")); n != 1 {
		t.Errorf("pilot_total_xds_rejects{type=wds} = %v, want 1", n)
	}
	if c.Resources(workloadpb.AddressTypeURL)["Kubernetes//Pod/shop/bad"] != nil {
		t.Error("the rejected resource was applied")
	}
	d := h.srv.dump(-1, false)
	if len(d.Clients) != 1 || d.Clients[0].Types["wds"].NACKs != 1 || d.Clients[0].Types["wds"].LastNACK == "" {
		t.Errorf("debug dump does not show the NACK: %+v", d.Clients)
	}
}

type denyAll struct{}

func (denyAll) Authenticate(context.Context) (string, error) {
	return "", status.Error(codes.Unauthenticated, "no token")
}

// gatedAuth refuses every stream, once the server has read a request
// (reads is signalled) or after a second, whichever is first.
type gatedAuth struct{ reads chan struct{} }

func (a gatedAuth) Authenticate(context.Context) (string, error) {
	select {
	case <-a.reads:
	case <-time.After(time.Second):
	}
	return "", status.Error(codes.Unauthenticated, "token refused")
}

// requestsRead is a gRPC stats handler that counts the requests the
// server reads and decodes, and signals each on reads.
type requestsRead struct {
	n     *atomic.Int64
	reads chan struct{}
}

func (r requestsRead) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (r requestsRead) HandleRPC(_ context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InPayload); ok {
		r.n.Add(1)
		select {
		case r.reads <- struct{}{}:
		default:
		}
	}
}
func (r requestsRead) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (r requestsRead) HandleConn(context.Context, stats.ConnStats)                       {}

// TestNothingReadBeforeAuthentication checks that the server reads no
// request of a stream before the stream's caller is authenticated: a
// caller whose token is refused had its first request, as large as it
// cared to make it up to the message bound, read and decoded while the
// token was reviewed.
func TestNothingReadBeforeAuthentication(t *testing.T) {
	reads := make(chan struct{}, 1)
	var n atomic.Int64
	h := start(t, gatedAuth{reads: reads}, grpc.StatsHandler(requestsRead{n: &n, reads: reads}))
	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(testCtx(t), "authorization", "Bearer stolen")
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 2 MiB of names, under gRPC's default bound on a message.
	names := make([]string, 20_000)
	for i := range names {
		names[i] = fmt.Sprintf("Kubernetes//Pod/shop/%094d", i)
	}
	sent := make(chan error, 1)
	go func() {
		sent <- st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: workloadpb.AddressTypeURL, ResourceNamesSubscribe: names})
	}()
	if _, err := st.Recv(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("stream ended with %v, want Unauthenticated", err)
	}
	<-sent // the stream's end ends the send too (io.EOF)
	if got := n.Load(); got != 0 {
		t.Errorf("the server read %d request(s) of a stream whose caller it then refused", got)
	}
}

// TestAuthenticatorRefuses checks that a refused stream never gets a
// resource.
func TestAuthenticatorRefuses(t *testing.T) {
	ctx := testCtx(t)
	h := start(t, denyAll{})
	publish(t, h.srv, workloadpb.AddressTypeURL, map[string]proto.Message{"Kubernetes//Pod/shop/a": workload("a", "n1")})
	c := h.client(t, ctx, xdstest.Config{})
	for c.Stats().LastError == "" {
		if err := ctx.Err(); err != nil {
			t.Fatal("the refused stream never failed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := c.Stats(); st.Responses != 0 {
		t.Errorf("a refused client got %d responses", st.Responses)
	}
	if n := testutil.ToFloat64(h.srv.m.authFailures); n < 1 {
		t.Errorf("auth failures = %v, want at least 1", n)
	}
}

// TestDebugHandler checks the dump of what a client was sent.
func TestDebugHandler(t *testing.T) {
	ctx := testCtx(t)
	h := start(t, nil)
	publish(t, h.srv, workloadpb.AddressTypeURL, map[string]proto.Message{"Kubernetes//Pod/shop/a": workload("a", "n1")})
	c := h.client(t, ctx, xdstest.Config{NodeID: "ztunnel~10.0.0.9~zt.weft-system~weft-system.svc.cluster.local"})
	if err := c.Wait(ctx, workloadpb.AddressTypeURL, func(m map[string]*anypb.Any) bool { return len(m) == 1 }); err != nil {
		t.Fatal(err)
	}
	// The server records the response just before sending it.
	srv := httptest.NewServer(h.srv.DebugHandler())
	defer srv.Close()
	var d debugDump
	get := func(q string) *http.Response {
		resp, err := http.Get(srv.URL + q)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := get("/")
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(d.Clients) != 1 || d.Clients[0].Node != "ztunnel~10.0.0.9~zt.weft-system~weft-system.svc.cluster.local" {
		t.Fatalf("clients = %+v", d.Clients)
	}
	wds := d.Clients[0].Types["wds"]
	if len(wds.LastSentResources) != 1 || wds.LastSentResources[0].Name != "Kubernetes//Pod/shop/a" || wds.LastSentResources[0].Version == "" {
		t.Errorf("last sent = %+v", wds.LastSentResources)
	}
	resp = get(fmt.Sprintf("/?client=%d&resources=1", d.Clients[0].Stream))
	var one debugDump
	if err := json.NewDecoder(resp.Body).Decode(&one); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if r := one.Clients[0].Types["wds"].LastSentResources; len(r) != 1 || len(r[0].Resource) == 0 {
		t.Errorf("resources not included: %+v", r)
	}
	if resp := get("/?client=999"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown client: status %d, want 404", resp.StatusCode)
	}
}

// tokenIsCaller authenticates a stream as the bearer token it sends.
type tokenIsCaller struct{}

func (tokenIsCaller) Authenticate(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("authorization"); len(v) == 1 && strings.HasPrefix(v[0], "Bearer ") {
		return strings.TrimPrefix(v[0], "Bearer "), nil
	}
	return "", status.Error(codes.Unauthenticated, "no token")
}

// TestWaypointByCaller checks that a waypoint is sent the Envoy resources
// stored under its authenticated identity, whatever node id it claims.
func TestWaypointByCaller(t *testing.T) {
	ctx := testCtx(t)
	h := start(t, tokenIsCaller{})
	listener := func(chain string) map[string]map[string]proto.Message {
		return map[string]map[string]proto.Message{resource.ListenerType: {"waypoint": &listenerv3.Listener{Name: "waypoint",
			FilterChains: []*listenerv3.FilterChain{{Name: chain}}}}}
	}
	if err := h.srv.SetWaypoint("shop/waypoint", listener("shop-chain")); err != nil {
		t.Fatal(err)
	}
	if err := h.srv.SetWaypoint("bank/waypoint", listener("bank-chain")); err != nil {
		t.Fatal(err)
	}
	if err := h.srv.SetWaypoint("bank/waypoint", map[string]map[string]proto.Message{"type.googleapis.com/x": {}}); err == nil {
		t.Error("a non-Envoy type was accepted")
	}
	chainOf := func(token string) string {
		c := h.client(t, ctx, xdstest.Config{NodeID: "waypoint~10.0.0.5~waypoint.shop~shop.svc.cluster.local",
			Token: func() (string, error) { return token, nil }, TypeURLs: []string{resource.ListenerType}})
		var chain string
		if err := c.Wait(ctx, resource.ListenerType, func(m map[string]*anypb.Any) bool {
			var l listenerv3.Listener
			if a := m["waypoint"]; a != nil && a.UnmarshalTo(&l) == nil && len(l.GetFilterChains()) == 1 {
				chain = l.GetFilterChains()[0].GetName()
			}
			return chain != ""
		}); err != nil {
			t.Fatal(err)
		}
		return chain
	}
	if got := chainOf("shop/waypoint"); got != "shop-chain" {
		t.Errorf("shop's waypoint got %q", got)
	}
	// The same node id, another identity: that identity's resources.
	if got := chainOf("bank/waypoint"); got != "bank-chain" {
		t.Errorf("bank's waypoint got %q", got)
	}
	if got := h.srv.Waypoints(); !slices.Equal(got, []string{"bank/waypoint", "shop/waypoint"}) {
		t.Errorf("waypoints %v", got)
	}
}
