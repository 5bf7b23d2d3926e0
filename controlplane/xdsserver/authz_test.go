package xdsserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// Node ids as the real clients send them; the server must ignore them.
const (
	ztunnelNode  = "ztunnel~10.0.0.1~ztunnel-x7k2p.weft-system~weft-system.svc.cluster.local"
	waypointNode = "waypoint~10.0.0.5~waypoint-5d9c.shop~shop.svc.cluster.local"
)

// subscribe opens a delta ADS stream to addr as caller (sent as the bearer
// token, which tokenIsCaller takes for the identity; "" sends none),
// claiming node, subscribes to typeURL (to names, or every resource), and
// returns the first response or the error that ended the stream. A server
// that neither answers nor refuses within a few seconds yields
// DeadlineExceeded.
func subscribe(t *testing.T, addr, caller, node, typeURL string, names ...string) (*discovery.DeltaDiscoveryResponse, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if caller != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+caller)
	}
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	// A stream the server refuses as it opens may end before the request
	// goes out: Send then says io.EOF and the status comes from Recv.
	if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: node}, TypeUrl: typeURL, ResourceNamesSubscribe: names}); err != nil && err != io.EOF {
		return nil, err
	}
	return st.Recv()
}

// waypointListener is a waypoint's configuration: one listener with one
// filter chain named chain, and one more listener named extra if set.
func waypointListener(chain, extra string) map[string]map[string]proto.Message {
	l := map[string]proto.Message{"waypoint": &listenerv3.Listener{Name: "waypoint", FilterChains: []*listenerv3.FilterChain{{Name: chain}}}}
	if extra != "" {
		l[extra] = &listenerv3.Listener{Name: extra}
	}
	return map[string]map[string]proto.Message{resource.ListenerType: l}
}

// meshState publishes a workload, a policy and two waypoints.
func meshState(t *testing.T, s *Server) {
	t.Helper()
	publish(t, s, workloadpb.AddressTypeURL, map[string]proto.Message{"Kubernetes//Pod/shop/a": workload("a", "n1")})
	publish(t, s, securitypb.AuthorizationTypeURL, map[string]proto.Message{
		"shop/p": &securitypb.Authorization{Name: "p", Namespace: "shop", Scope: securitypb.Scope_NAMESPACE},
	})
	if err := s.SetWaypoint("shop/waypoint", waypointListener("shop-chain", "")); err != nil {
		t.Fatal(err)
	}
	if err := s.SetWaypoint("bank/waypoint", waypointListener("bank-chain", "bank-only")); err != nil {
		t.Fatal(err)
	}
}

// TestSubscriptionRefused checks that an authenticated caller that is
// neither a node proxy nor a waypoint gets nothing: its stream ends with
// PermissionDenied before any resource is sent, whatever node id it claims,
// and a node proxy or a waypoint asking for the other's types is refused
// too.
func TestSubscriptionRefused(t *testing.T) {
	h := start(t, tokenIsCaller{})
	meshState(t, h.srv)
	for _, tc := range []struct {
		name, caller, node, typeURL, reason string
	}{
		{"workload asks for addresses", "shop/web", ztunnelNode, workloadpb.AddressTypeURL, reasonNotNodeProxy},
		{"workload asks for policies", "shop/web", ztunnelNode, securitypb.AuthorizationTypeURL, reasonNotNodeProxy},
		{"workload asks for listeners", "shop/web", waypointNode, resource.ListenerType, reasonNotWaypoint},
		{"workload asks for routes", "shop/web", waypointNode, resource.RouteType, reasonNotWaypoint},
		{"workload asks for clusters", "shop/web", waypointNode, resource.ClusterType, reasonNotWaypoint},
		{"workload asks for endpoints", "shop/web", waypointNode, resource.EndpointType, reasonNotWaypoint},
		{"ztunnel's account name in another namespace", "shop/ztunnel", ztunnelNode, workloadpb.AddressTypeURL, reasonNotNodeProxy},
		{"ztunnel's namespace, another account", "weft-system/default", ztunnelNode, workloadpb.AddressTypeURL, reasonNotNodeProxy},
		{"ztunnel's identity in other case", "Weft-System/Ztunnel", ztunnelNode, workloadpb.AddressTypeURL, reasonNotNodeProxy},
		{"ztunnel's identity as a prefix", "weft-system/ztunnel-x", ztunnelNode, workloadpb.AddressTypeURL, reasonNotNodeProxy},
		{"waypoint asks for addresses", "shop/waypoint", waypointNode, workloadpb.AddressTypeURL, reasonNotNodeProxy},
		{"waypoint asks for policies", "shop/waypoint", waypointNode, securitypb.AuthorizationTypeURL, reasonNotNodeProxy},
		{"ztunnel asks for listeners", "weft-system/ztunnel", ztunnelNode, resource.ListenerType, reasonNotWaypoint},
		{"a waypoint's namespace, another account", "shop/web", "waypoint~10.0.0.5~x.shop~shop.svc.cluster.local", resource.ListenerType, reasonNotWaypoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := subscribe(t, h.addr, tc.caller, tc.node, tc.typeURL)
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("got %d resources of %s and error %v; want PermissionDenied", len(resp.GetResources()), resp.GetTypeUrl(), err)
			}
			msg := status.Convert(err).Message()
			if !strings.Contains(msg, tc.caller) || !strings.Contains(msg, tc.typeURL) {
				t.Errorf("the refusal does not say who asked for what: %q", msg)
			}
			who := map[string]string{reasonNotNodeProxy: "only " + ztunnelID + " may", reasonNotWaypoint: "only waypoints may"}[tc.reason]
			if !strings.Contains(msg, who) {
				t.Errorf("the refusal does not say who may (%q): %q", who, msg)
			}
			if n := testutil.ToFloat64(h.srv.m.refused.WithLabelValues(tc.typeURL, tc.reason)); n < 1 {
				t.Errorf("weft_xds_rejected_streams_total{type_url=%q,reason=%q} = %v", tc.typeURL, tc.reason, n)
			}
		})
	}
	// Refused streams are forgotten like any other.
	for deadline := time.Now().Add(5 * time.Second); len(h.srv.dump(-1, false).Clients) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("refused streams still listed: %+v", h.srv.dump(-1, false).Clients)
		}
	}
}

// ztunnelID is the node proxy of the test servers.
const ztunnelID = "weft-system/ztunnel"

// TestSubscriptionAllowed checks that the node proxy gets the workload
// types and that each waypoint gets its own configuration only, even when
// it names a resource only another waypoint has.
func TestSubscriptionAllowed(t *testing.T) {
	h := start(t, tokenIsCaller{})
	meshState(t, h.srv)
	for _, typeURL := range TypeURLs {
		resp, err := subscribe(t, h.addr, ztunnelID, ztunnelNode, typeURL)
		if err != nil || len(resp.GetResources()) != 1 {
			t.Errorf("ztunnel asking for %s: %d resources, error %v; want 1 resource", typeURL, len(resp.GetResources()), err)
		}
	}
	for _, tc := range []struct{ caller, chain string }{{"shop/waypoint", "shop-chain"}, {"bank/waypoint", "bank-chain"}} {
		// The other waypoint's listener named too: only the caller's own
		// resources exist for it.
		resp, err := subscribe(t, h.addr, tc.caller, waypointNode, resource.ListenerType, "waypoint", "bank-only")
		if err != nil {
			t.Fatalf("%s: %v", tc.caller, err)
		}
		var names []string
		var chain string
		for _, r := range resp.GetResources() {
			names = append(names, r.GetName())
			var l listenerv3.Listener
			if r.GetName() == "waypoint" && r.GetResource().UnmarshalTo(&l) == nil && len(l.GetFilterChains()) == 1 {
				chain = l.GetFilterChains()[0].GetName()
			}
		}
		if chain != tc.chain {
			t.Errorf("%s got listeners %v with chain %q, want its own %q", tc.caller, names, chain, tc.chain)
		}
		if tc.caller == "shop/waypoint" && slices.Contains(names, "bank-only") {
			t.Errorf("shop's waypoint got bank's listener")
		}
	}
	if n := testutil.CollectAndCount(h.srv.m.refused); n != 0 {
		t.Errorf("%d refusals counted for allowed callers", n)
	}
}

// TestUnauthenticatedStreams checks the server without an authenticator
// (authentication turned off, or the plaintext service): workload
// discovery as before, no waypoint's configuration to anyone.
func TestUnauthenticatedStreams(t *testing.T) {
	h := start(t, nil)
	meshState(t, h.srv)
	if resp, err := subscribe(t, h.addr, "", ztunnelNode, workloadpb.AddressTypeURL); err != nil || len(resp.GetResources()) != 1 {
		t.Errorf("addresses: %d resources, error %v; want 1 resource", len(resp.GetResources()), err)
	}
	for _, caller := range []string{"", "shop/waypoint"} { // a token nobody checks names nobody
		_, err := subscribe(t, h.addr, caller, waypointNode, resource.ListenerType)
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("listeners with token %q: error %v, want PermissionDenied", caller, err)
		}
	}
	if n := testutil.ToFloat64(h.srv.m.refused.WithLabelValues(resource.ListenerType, reasonUnauthenticated)); n != 2 {
		t.Errorf("refusals counted: %v, want 2", n)
	}
}

// TestPlaintextStreams checks that the plaintext service of a server that
// authenticates its TLS service serves no waypoint configuration either.
func TestPlaintextStreams(t *testing.T) {
	s, err := New(Config{Authenticator: tokenIsCaller{}, NodeProxies: []string{ztunnelID}})
	if err != nil {
		t.Fatal(err)
	}
	meshState(t, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	s.RegisterPlaintext(g)
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()
	defer s.cancel()
	if _, err := subscribe(t, ln.Addr().String(), "shop/waypoint", waypointNode, resource.ListenerType); status.Code(err) != codes.PermissionDenied {
		t.Errorf("listeners on the plaintext service: error %v, want PermissionDenied", err)
	}
}

// records keeps the messages and attributes of the records logged.
type records struct {
	mu   sync.Mutex
	msgs []string // guarded by mu; "message attr=value ..."
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	line := rec.Message
	rec.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	r.mu.Lock()
	r.msgs = append(r.msgs, line)
	r.mu.Unlock()
	return nil
}

func (r *records) with(prefix string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs {
		if strings.HasPrefix(m, prefix) {
			out = append(out, m)
		}
	}
	return out
}

// TestRefusedMidStream checks that a node proxy adding a waypoint type to
// a stream it was served workloads on loses the stream, and that the
// refusal is logged once with who asked for what.
func TestRefusedMidStream(t *testing.T) {
	logs := &records{}
	s, err := New(Config{Authenticator: tokenIsCaller{}, NodeProxies: []string{ztunnelID}, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	meshState(t, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()
	defer s.cancel()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+ztunnelID)
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: ztunnelNode}, TypeUrl: workloadpb.AddressTypeURL}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("addresses: %d resources, error %v", len(resp.GetResources()), err)
	}
	if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("error %v, want PermissionDenied", err)
			}
			break
		}
		if resp.GetTypeUrl() != workloadpb.AddressTypeURL {
			t.Fatalf("sent %s after the refusal", resp.GetTypeUrl())
		}
	}
	got := logs.with("xDS subscription refused")
	if len(got) != 1 || !strings.Contains(got[0], "caller="+ztunnelID) || !strings.Contains(got[0], "type_url="+resource.ListenerType) ||
		!strings.Contains(got[0], "reason="+reasonNotWaypoint) {
		t.Errorf("refusal logs %q, want one naming the caller, the type and the reason", got)
	}
}

// nobody accepts every stream without naming its caller.
type nobody struct{}

func (nobody) Authenticate(context.Context) (string, error) { return "", nil }

// TestAuthenticatorNamesNobody checks that an authenticator accepting a
// stream without a caller does not turn it into an unauthenticated stream,
// which would be served workloads.
func TestAuthenticatorNamesNobody(t *testing.T) {
	h := start(t, nobody{})
	meshState(t, h.srv)
	if _, err := subscribe(t, h.addr, "", ztunnelNode, workloadpb.AddressTypeURL); status.Code(err) != codes.Unauthenticated {
		t.Errorf("error %v, want Unauthenticated", err)
	}
}

// openStream opens a delta ADS stream to addr as caller and returns it;
// it ends with the test or when the returned cancel is called.
func openStream(t *testing.T, addr, caller string) (discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, context.CancelFunc) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+caller)
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st, cancel
}

// names returns n resource names with prefix.
func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// TestNamedSubscriptionsBounded: a caller may subscribe to at most
// maxNamedPerCaller resources by name over all its streams and types; the
// request that would pass it ends its stream with ResourceExhausted saying
// so, names already held are not counted twice, an unsubscription or a
// closed stream makes room, another identity has its own allowance, and a
// wildcard subscription is not a name.
func TestNamedSubscriptionsBounded(t *testing.T) {
	h := start(t, tokenIsCaller{})
	meshState(t, h.srv)
	named := func(caller string) int {
		h.srv.mu.Lock()
		defer h.srv.mu.Unlock()
		return h.srv.named[caller]
	}
	first := names("l", maxNamedPerCaller*3/4)
	a, closeA := openStream(t, h.addr, "shop/waypoint")
	if err := a.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ListenerType, ResourceNamesSubscribe: append(first, "waypoint")}); err != nil {
		t.Fatal(err)
	}
	if resp, err := a.Recv(); err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("%d names: %d resources, %v; want the one that exists", len(first)+1, len(resp.GetResources()), err)
	}
	// The same names again, and a wildcard on another stream: no more room taken.
	if err := a.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ListenerType, ResourceNamesSubscribe: first}); err != nil {
		t.Fatal(err)
	}
	if resp, err := subscribe(t, h.addr, ztunnelID, ztunnelNode, workloadpb.AddressTypeURL, "*"); err != nil || len(resp.GetResources()) != 1 {
		t.Fatalf("ztunnel's wildcard: %d resources, %v", len(resp.GetResources()), err)
	}
	want := len(first) + 1
	for deadline := time.Now().Add(5 * time.Second); named("shop/waypoint") != want; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("shop/waypoint holds %d names, want %d", named("shop/waypoint"), want)
		}
	}
	if n := named(ztunnelID); n != 0 {
		t.Errorf("a wildcard subscription counted as %d names", n)
	}

	// Past the bound on another stream and type of the same identity.
	more := names("c", maxNamedPerCaller/2)
	_, err := subscribe(t, h.addr, "shop/waypoint", waypointNode, resource.ClusterType, more...)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("%d more names: %v, want ResourceExhausted", len(more), err)
	}
	msg := status.Convert(err).Message()
	if !strings.Contains(msg, `"shop/waypoint"`) || !strings.Contains(msg, fmt.Sprint(want+len(more))) || !strings.Contains(msg, fmt.Sprint(maxNamedPerCaller)) {
		t.Errorf("the refusal does not say who, how many and the bound: %q", msg)
	}
	if n := testutil.ToFloat64(h.srv.m.refused.WithLabelValues(resource.ClusterType, reasonTooManyNames)); n != 1 {
		t.Errorf("weft_xds_rejected_streams_total{reason=%q} = %v, want 1", reasonTooManyNames, n)
	}
	// Another identity has its own allowance.
	// (A name that exists among them, so that an answer comes.)
	existing := append(more[:len(more)-1:len(more)-1], "waypoint")
	if _, err := subscribe(t, h.addr, "bank/waypoint", waypointNode, resource.ListenerType, existing...); err != nil {
		t.Errorf("bank's waypoint, %d names: %v", len(more), err)
	}
	// Unsubscribing makes room on the stream itself.
	if err := a.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ListenerType, ResourceNamesUnsubscribe: first[:len(more)]}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); named("shop/waypoint") != want-len(more); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after unsubscribing %d: %d names held, want %d", len(more), named("shop/waypoint"), want-len(more))
		}
	}
	if _, err := subscribe(t, h.addr, "shop/waypoint", waypointNode, resource.ListenerType, existing...); err != nil {
		t.Errorf("%d names after unsubscribing as many: %v", len(more), err)
	}
	// A closed stream gives its names back; nothing is left behind.
	closeA()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		h.srv.mu.Lock()
		left := len(h.srv.named)
		h.srv.mu.Unlock()
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("names still counted after every stream closed: %v", h.srv.named)
		}
	}
}
