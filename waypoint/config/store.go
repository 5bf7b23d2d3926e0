package config

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/weftmesh/weft/internal/podnet"
	"github.com/weftmesh/weft/waypoint/route"
)

// Store accumulates xDS resources per type and publishes a new Snapshot
// after every accepted update. A rejected update changes nothing.
//
// While Run runs, the store also resolves the names of its STRICT_DNS and
// LOGICAL_DNS clusters (dns.go) and publishes a new Snapshot when their
// endpoints change; a DNS cluster's Assignment is always the resolved one,
// never an EDS assignment of the same name.
type Store struct {
	resolver  Resolver
	allowAddr func(netip.Addr) bool
	log       *slog.Logger

	mu        sync.Mutex
	listeners map[string]*Listener
	routes    map[string]*route.Table
	clusters  map[string]*Cluster
	cla       map[string]*Assignment
	dns       map[string]*dnsCluster
	runCtx    context.Context // set by Run
	stopped   bool            // Run is returning: start no resolution

	wg        sync.WaitGroup // resolve goroutines
	resolving atomic.Int32   // resolve goroutines running (tests)

	cur     atomic.Pointer[Snapshot]
	changed chan struct{} // guarded by mu: closed at the next publish
	applied chan struct{}
	once    sync.Once
}

// StoreConfig configures how a Store resolves DNS clusters.
type StoreConfig struct {
	// Resolver looks names up; default net.DefaultResolver.
	Resolver Resolver
	// AllowAddr reports whether a resolved address may become an
	// endpoint; default podnet.EndpointAddr.
	AllowAddr func(netip.Addr) bool
	// Logger logs resolution changes and failures; default none.
	Logger *slog.Logger
}

// NewStore returns an empty store with the default StoreConfig.
func NewStore() *Store { return NewStoreWith(StoreConfig{}) }

// NewStoreWith returns an empty store.
func NewStoreWith(c StoreConfig) *Store {
	s := &Store{resolver: c.Resolver, allowAddr: c.AllowAddr, log: c.Logger,
		listeners: map[string]*Listener{}, routes: map[string]*route.Table{}, clusters: map[string]*Cluster{},
		cla: map[string]*Assignment{}, dns: map[string]*dnsCluster{}, applied: make(chan struct{}), changed: make(chan struct{})}
	if s.resolver == nil {
		s.resolver = net.DefaultResolver
	}
	if s.allowAddr == nil {
		s.allowAddr = podnet.EndpointAddr
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// Run resolves the DNS clusters' names until ctx ends, and returns after
// every resolution has stopped. Before Run, DNS clusters have no
// Assignment; after, they keep their last. Call it once.
func (s *Store) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.runCtx != nil {
		s.mu.Unlock()
		return errors.New("config: Store.Run called twice")
	}
	s.runCtx = ctx
	for _, d := range s.dns {
		s.startDNS(d)
	}
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// Snapshot returns the current configuration (never nil).
func (s *Store) Snapshot() *Snapshot {
	if p := s.cur.Load(); p != nil {
		return p
	}
	return &Snapshot{}
}

// Changed returns a channel closed when a Snapshot newer than the current
// one is published: take it before reading Snapshot to miss no change.
func (s *Store) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Applied is closed after the first accepted update.
func (s *Store) Applied() <-chan struct{} { return s.applied }

// publish makes a Snapshot of the store's state. Called with s.mu held.
func (s *Store) publish() {
	s.reconcileDNS()
	snap := &Snapshot{Routes: clone(s.routes), Clusters: clone(s.clusters), Assignments: clone(s.cla)}
	for name, d := range s.dns {
		delete(snap.Assignments, name)
		if a := d.current(); a != nil {
			snap.Assignments[name] = a
		}
	}
	snap.Listeners = clone(s.listeners)
	if l, ok := s.listeners["waypoint"]; ok && !l.Addr.IsValid() {
		snap.Listener = l
	} else {
		for _, l := range s.listeners {
			if !l.Addr.IsValid() {
				snap.Listener = l
			}
		}
	}
	s.cur.Store(snap)
	close(s.changed)
	s.changed = make(chan struct{})
	s.once.Do(func() { close(s.applied) })
}

func clone[V any](m map[string]V) map[string]V {
	o := make(map[string]V, len(m))
	for k, v := range m {
		o[k] = v
	}
	return o
}

// ApplyListeners is the xDS handler for resource.ListenerType.
func (s *Store) ApplyListeners(up map[string]*anypb.Any, rm []string) error {
	return applyAny(s, s.listeners, up, rm, func(a *anypb.Any) (*Listener, error) {
		var l listenerv3.Listener
		if err := a.UnmarshalTo(&l); err != nil {
			return nil, err
		}
		return CompileListener(&l)
	})
}

// ApplyRoutes is the xDS handler for resource.RouteType.
func (s *Store) ApplyRoutes(up map[string]*anypb.Any, rm []string) error {
	return applyAny(s, s.routes, up, rm, func(a *anypb.Any) (*route.Table, error) {
		var r routev3.RouteConfiguration
		if err := a.UnmarshalTo(&r); err != nil {
			return nil, err
		}
		return route.Compile(&r)
	})
}

// ApplyClusters is the xDS handler for resource.ClusterType.
func (s *Store) ApplyClusters(up map[string]*anypb.Any, rm []string) error {
	return applyAny(s, s.clusters, up, rm, func(a *anypb.Any) (*Cluster, error) {
		var c clusterv3.Cluster
		if err := a.UnmarshalTo(&c); err != nil {
			return nil, err
		}
		return CompileCluster(&c)
	})
}

// ApplyEndpoints is the xDS handler for resource.EndpointType.
func (s *Store) ApplyEndpoints(up map[string]*anypb.Any, rm []string) error {
	return applyAny(s, s.cla, up, rm, func(a *anypb.Any) (*Assignment, error) {
		var c endpointv3.ClusterLoadAssignment
		if err := a.UnmarshalTo(&c); err != nil {
			return nil, err
		}
		return CompileAssignment(&c)
	})
}

func applyAny[C any](s *Store, dst map[string]C, up map[string]*anypb.Any, rm []string, compile func(*anypb.Any) (C, error)) error {
	compiled := map[string]C{}
	var errs []error
	for name, a := range up {
		c, err := compile(a)
		if err != nil {
			errs = append(errs, fmt.Errorf("resource %q: %w", name, err))
			continue
		}
		compiled[name] = c
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range rm {
		delete(dst, n)
	}
	for n, c := range compiled {
		dst[n] = c
	}
	s.publish()
	return nil
}
