// Package xdstest is a ztunnel-shaped xDS test client: it subscribes to the
// workload and authorization types with internal/xdsclient, keeps the
// resources it holds, records every response, and lets a test wait for the
// state it expects. It is shared by the control plane's in-process tests,
// benchmarks and cluster tests.
package xdstest

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/weftmesh/weft/internal/pb/discoverypb"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/xdsclient"
)

// Response is one response the client applied or rejected.
type Response struct {
	TypeURL string
	Upserts []string
	Removes []string
	NACKed  bool
}

// Config configures a Client.
type Config struct {
	// Address of the control plane. Required.
	Address string
	// TLS, nil for plaintext.
	TLS *tls.Config
	// Token returns the bearer token; nil sends none.
	Token func() (string, error)
	// NodeID; default "ztunnel~10.0.0.1~ztunnel-test.weft-system~weft-system.svc.cluster.local".
	NodeID string
	// Reject, when set, NACKs a response holding a resource it returns an
	// error for (and the response is not applied).
	Reject func(typeURL, name string, res *anypb.Any) error
	// TypeURLs to subscribe to; default the two workload types.
	TypeURLs []string
	// Logger: default discard.
	Logger *slog.Logger
}

// Start runs a client until the test ends; a bad cfg fails tb.
func Start(tb testing.TB, cfg Config) *Client {
	tb.Helper()
	c, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	tb.Cleanup(func() { cancel(); <-done })
	return c
}

// Client is the test client.
type Client struct {
	c   *xdsclient.Client
	cfg Config

	mu        sync.Mutex
	state     map[string]map[string]*anypb.Any // guarded by mu
	responses []Response                       // guarded by mu
	changed   chan struct{}                    // guarded by mu; closed on every response
}

// New returns a client; Run starts it.
func New(cfg Config) (*Client, error) {
	if cfg.NodeID == "" {
		cfg.NodeID = "ztunnel~10.0.0.1~ztunnel-test.weft-system~weft-system.svc.cluster.local"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Client{cfg: cfg, state: map[string]map[string]*anypb.Any{}, changed: make(chan struct{})}
	var subs []xdsclient.Subscription
	if cfg.TypeURLs == nil {
		cfg.TypeURLs = []string{workloadpb.AddressTypeURL, securitypb.AuthorizationTypeURL}
	}
	for _, typeURL := range cfg.TypeURLs {
		t.state[typeURL] = map[string]*anypb.Any{}
		subs = append(subs, xdsclient.Subscription{TypeURL: typeURL, Handle: t.handler(typeURL)})
	}
	c, err := xdsclient.New(xdsclient.Config{
		Address: cfg.Address, TLS: cfg.TLS, Token: cfg.Token,
		Node:          &discoverypb.Node{Id: cfg.NodeID},
		Metadata:      map[string]string{"clusterid": "Kubernetes"},
		Subscriptions: subs,
		Logger:        cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	t.c = c
	return t, nil
}

func (t *Client) handler(typeURL string) xdsclient.HandlerFunc {
	return func(upserts map[string]*anypb.Any, removes []string) error {
		r := Response{TypeURL: typeURL, Removes: removes}
		var err error
		for name, res := range upserts {
			r.Upserts = append(r.Upserts, name)
			if t.cfg.Reject != nil && err == nil {
				err = t.cfg.Reject(typeURL, name, res)
			}
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		r.NACKed = err != nil
		t.responses = append(t.responses, r)
		if err == nil {
			for name, res := range upserts {
				t.state[typeURL][name] = res
			}
			for _, name := range removes {
				delete(t.state[typeURL], name)
			}
		}
		close(t.changed)
		t.changed = make(chan struct{})
		return err
	}
}

// Run runs the client until ctx is done.
func (t *Client) Run(ctx context.Context) error { return t.c.Run(ctx) }

// Stats are the underlying client's counters.
func (t *Client) Stats() xdsclient.Stats { return t.c.Stats() }

// Synced is closed once both types had a first response.
func (t *Client) Synced() <-chan struct{} { return t.c.Synced() }

// Resources returns a copy of the resources held of a type.
func (t *Client) Resources(typeURL string) map[string]*anypb.Any {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]*anypb.Any, len(t.state[typeURL]))
	for k, v := range t.state[typeURL] {
		out[k] = v
	}
	return out
}

// Responses returns every response so far, oldest first.
func (t *Client) Responses() []Response {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Response(nil), t.responses...)
}

// Wait blocks until cond holds on the resources of typeURL, checking now
// and after every response, or until ctx is done.
func (t *Client) Wait(ctx context.Context, typeURL string, cond func(map[string]*anypb.Any) bool) error {
	for {
		t.mu.Lock()
		ch := t.changed
		snap := make(map[string]*anypb.Any, len(t.state[typeURL]))
		for k, v := range t.state[typeURL] {
			snap[k] = v
		}
		t.mu.Unlock()
		if cond(snap) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s resources (%d held): %w", typeURL, len(snap), ctx.Err())
		case <-ch:
		}
	}
}

// WaitResponses blocks until at least n responses arrived, or ctx is done.
func (t *Client) WaitResponses(ctx context.Context, n int) ([]Response, error) {
	for {
		t.mu.Lock()
		ch, got := t.changed, append([]Response(nil), t.responses...)
		t.mu.Unlock()
		if len(got) >= n {
			return got, nil
		}
		select {
		case <-ctx.Done():
			return got, fmt.Errorf("waiting for %d responses (%d arrived): %w", n, len(got), ctx.Err())
		case <-ch:
		}
	}
}

// Workload decodes an Address holding a Workload, or returns nil.
func Workload(a *anypb.Any) *workloadpb.Workload {
	if a == nil {
		return nil
	}
	var addr workloadpb.Address
	if err := a.UnmarshalTo(&addr); err != nil {
		return nil
	}
	return addr.GetWorkload()
}

// Service decodes an Address holding a Service, or returns nil.
func Service(a *anypb.Any) *workloadpb.Service {
	if a == nil {
		return nil
	}
	var addr workloadpb.Address
	if err := a.UnmarshalTo(&addr); err != nil {
		return nil
	}
	return addr.GetService()
}

// Authorization decodes an Authorization, or returns nil.
func Authorization(a *anypb.Any) *securitypb.Authorization {
	if a == nil {
		return nil
	}
	var p securitypb.Authorization
	if err := a.UnmarshalTo(&p); err != nil {
		return nil
	}
	return &p
}
