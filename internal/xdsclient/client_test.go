package xdsclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/weftmesh/weft/internal/pb/discoverypb"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// controlPlane is a real go-control-plane delta ADS server with one
// LinearCache per Istio workload type.
type controlPlane struct {
	addresses, policies *cachev3.LinearCache
	addr                string
	stop                func()

	mu     sync.Mutex
	nacks  []string
	tokens []string
	inits  []map[string]string
}

func startControlPlane(t *testing.T) *controlPlane {
	t.Helper()
	return startControlPlaneAt(t, "127.0.0.1:0")
}

func wl(uid, ip string) types.Resource {
	return &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: &workloadpb.Workload{
		Uid: uid, Name: uid, Namespace: "demo", Addresses: [][]byte{net.ParseIP(ip).To4()}}}}
}

// store records what the handler was given.
type store struct {
	mu      sync.Mutex
	have    map[string]*workloadpb.Address
	changed chan struct{}
	reject  string // a resource name the handler refuses
}

func (s *store) handle(up map[string]*anypb.Any, rm []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for name, a := range up {
		if name == s.reject {
			err = errors.New("refusing " + name)
			continue
		}
		var addr workloadpb.Address
		if uerr := a.UnmarshalTo(&addr); uerr != nil {
			return uerr
		}
		s.have[name] = &addr
	}
	for _, name := range rm {
		delete(s.have, name)
	}
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return err
}

func (s *store) wait(t *testing.T, cond func(map[string]*workloadpb.Address) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		ok := cond(s.have)
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-s.changed:
		case <-deadline:
			t.Fatal("store did not reach the expected state")
		}
	}
}

// run starts a client of cfg (a quiet logger unless set) until the test
// ends.
func run(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func TestDeltaSubscribeUpdateRemoveNACK(t *testing.T) {
	cp := startControlPlane(t)
	if err := cp.addresses.UpdateResource("Kubernetes//Pod/demo/a", wl("a", "10.244.1.10")); err != nil {
		t.Fatal(err)
	}
	s := &store{have: map[string]*workloadpb.Address{}, changed: make(chan struct{}, 1), reject: "Kubernetes//Pod/demo/bad"}
	var policies int
	c := run(t, Config{
		Address: cp.addr,
		Node:    &discoverypb.Node{Id: "ztunnel~10.0.0.1~ztunnel-x.weft-system~weft-system.svc.cluster.local"},
		Token:   func() (string, error) { return "tok", nil },
		Subscriptions: []Subscription{
			{TypeURL: workloadpb.AddressTypeURL, Handle: s.handle},
			{TypeURL: securitypb.AuthorizationTypeURL, Handle: func(up map[string]*anypb.Any, rm []string) error { policies += len(up); return nil }},
		},
	})

	select {
	case <-c.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("client never synced")
	}
	s.wait(t, func(m map[string]*workloadpb.Address) bool { return m["Kubernetes//Pod/demo/a"] != nil })

	// One change arrives as one resource.
	cp.addresses.UpdateResource("Kubernetes//Pod/demo/b", wl("b", "10.244.1.11"))
	s.wait(t, func(m map[string]*workloadpb.Address) bool { return len(m) == 2 })
	cp.addresses.DeleteResource("Kubernetes//Pod/demo/a")
	s.wait(t, func(m map[string]*workloadpb.Address) bool { return m["Kubernetes//Pod/demo/a"] == nil })

	// A resource the handler refuses is NACKed with its reason.
	cp.addresses.UpdateResource("Kubernetes//Pod/demo/bad", wl("bad", "10.244.1.12"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		cp.mu.Lock()
		n := len(cp.nacks)
		cp.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no NACK reached the server")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cp.mu.Lock()
	if got := cp.nacks[0]; got != "refusing Kubernetes//Pod/demo/bad" {
		t.Errorf("NACK message %q", got)
	}
	if len(cp.tokens) == 0 || cp.tokens[0] != "Bearer tok" {
		t.Errorf("authorization metadata %v", cp.tokens)
	}
	cp.mu.Unlock()
	if st := c.Stats(); st.NACKs != 1 || st.ACKs < 3 {
		t.Errorf("stats %+v", st)
	}
}

func TestReconnectSendsKnownVersions(t *testing.T) {
	cp := startControlPlane(t)
	cp.addresses.UpdateResource("Kubernetes//Pod/demo/a", wl("a", "10.244.1.10"))
	s := &store{have: map[string]*workloadpb.Address{}, changed: make(chan struct{}, 1)}
	run(t, Config{
		Address:       cp.addr,
		Subscriptions: []Subscription{{TypeURL: workloadpb.AddressTypeURL, Handle: s.handle}},
		MinBackoff:    time.Millisecond, MaxBackoff: 10 * time.Millisecond,
	})
	s.wait(t, func(m map[string]*workloadpb.Address) bool { return len(m) == 1 })

	// Restart the server on the same port: the client reconnects and says what it has.
	cp.stop()
	cp2 := startControlPlaneAt(t, cp.addr)
	cp2.addresses.UpdateResource("Kubernetes//Pod/demo/a", wl("a", "10.244.1.10"))
	cp2.addresses.UpdateResource("Kubernetes//Pod/demo/c", wl("c", "10.244.1.13"))
	s.wait(t, func(m map[string]*workloadpb.Address) bool { return len(m) == 2 })
	cp2.mu.Lock()
	defer cp2.mu.Unlock()
	if len(cp2.inits) == 0 || cp2.inits[0]["Kubernetes//Pod/demo/a"] == "" {
		t.Errorf("reconnect sent initial versions %v, want the version of demo/a", cp2.inits)
	}
}

// startControlPlaneAt starts a server on addr (the same port again after a restart).
func startControlPlaneAt(t *testing.T, addr string) *controlPlane {
	t.Helper()
	cp := &controlPlane{
		addresses: cachev3.NewLinearCache(workloadpb.AddressTypeURL),
		policies:  cachev3.NewLinearCache(securitypb.AuthorizationTypeURL),
	}
	mux := &cachev3.MuxCache{
		Classify:      func(r *cachev3.Request) string { return r.GetTypeUrl() },
		ClassifyDelta: func(r *cachev3.DeltaRequest) string { return r.GetTypeUrl() },
		Caches:        map[string]cachev3.Cache{workloadpb.AddressTypeURL: cp.addresses, securitypb.AuthorizationTypeURL: cp.policies},
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, mux, serverv3.CallbackFuncs{
		DeltaStreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			cp.mu.Lock()
			cp.tokens = append(cp.tokens, md.Get("authorization")...)
			cp.mu.Unlock()
			return nil
		},
		StreamDeltaRequestFunc: func(_ int64, r *discoveryv3.DeltaDiscoveryRequest) error {
			cp.mu.Lock()
			defer cp.mu.Unlock()
			if r.GetErrorDetail() != nil {
				cp.nacks = append(cp.nacks, r.GetErrorDetail().GetMessage())
			}
			if r.GetTypeUrl() == workloadpb.AddressTypeURL && r.GetResponseNonce() == "" {
				cp.inits = append(cp.inits, r.GetInitialResourceVersions())
			}
			return nil
		},
	})
	gs := grpc.NewServer()
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(gs, srv)
	var ln net.Listener
	var err error
	for i := 0; i < 100; i++ { // after a restart the port may take a moment to free
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	cp.addr = ln.Addr().String()
	cp.stop = func() { gs.Stop(); cancel() }
	t.Cleanup(cp.stop)
	return cp
}

// TestLargeResponse: a first response larger than gRPC's default 4 MiB
// (a mesh of tens of thousands of workloads) is taken, not refused and
// retried forever.
func TestLargeResponse(t *testing.T) {
	cp := startControlPlane(t)
	const n = 3000
	pad := strings.Repeat("w", 2000)
	for i := range n {
		uid := fmt.Sprintf("Kubernetes//Pod/demo/p%d-%s", i, pad)
		if err := cp.addresses.UpdateResource(uid, wl(uid, "10.244.1.10")); err != nil {
			t.Fatal(err)
		}
	}
	s := &store{have: map[string]*workloadpb.Address{}, changed: make(chan struct{}, 1)}
	run(t, Config{
		Address:       cp.addr,
		Node:          &discoverypb.Node{Id: "ztunnel~10.0.0.1~ztunnel-x.weft-system~weft-system.svc.cluster.local"},
		Token:         func() (string, error) { return "tok", nil },
		Subscriptions: []Subscription{{TypeURL: workloadpb.AddressTypeURL, Handle: s.handle}},
	})
	s.wait(t, func(m map[string]*workloadpb.Address) bool { return len(m) == n })
}
