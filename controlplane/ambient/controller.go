package ambient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/controlplane/authpolicy"
	"github.com/weftmesh/weft/internal/debounce"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
)

// Defaults of ControllerConfig.
const (
	DefaultDebounceQuiet = 10 * time.Millisecond
	DefaultDebounceMax   = 100 * time.Millisecond
)

// Publisher receives the resources to push to xDS clients: update holds new
// or changed resources by name, remove the names of deleted ones. changedAt
// is when the earliest change in the batch was observed.
type Publisher interface {
	Publish(typeURL string, update map[string]proto.Message, remove []string, changedAt time.Time) error
}

// StatusSink receives the conditions of policies, ZtunnelAccepted and
// WaypointAccepted (*authpolicy.StatusWriter). A nil condition removes it.
type StatusSink interface {
	SetCondition(namespace, name string, generation int64, typ string, c *authpolicy.Condition)
}

// ServiceStatusSink receives the istio.io/WaypointBound condition of
// Services (*ServiceStatusWriter). A nil condition removes it.
type ServiceStatusSink interface {
	SetServiceCondition(namespace, name string, c *BindingStatus)
}

// EntryStatusSink receives what ServiceEntries' status should show
// (*EntryStatusWriter).
type EntryStatusSink interface {
	SetEntryStatus(s EntryStatus)
}

// EventRecorder records Kubernetes Events (record.EventRecorder).
type EventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Informers are the shared informers the controller watches. Gateways is
// optional (nil when the Gateway API CRDs are not installed).
type Informers struct {
	Pods, Services, EndpointSlices, Namespaces, Policies cache.SharedIndexInformer
	// PeerAuths watches security.istio.io PeerAuthentications.
	PeerAuths cache.SharedIndexInformer
	Gateways  cache.SharedIndexInformer
	// Nodes gives workloads their locality; optional (nil: none).
	Nodes cache.SharedIndexInformer
	// GatewayClasses give their Gateways a default istio.io/waypoint-for;
	// optional, with Gateways.
	GatewayClasses cache.SharedIndexInformer
	// ServiceEntries watches networking.istio.io ServiceEntries; optional.
	ServiceEntries cache.SharedIndexInformer
	// WorkloadEntries watches networking.istio.io WorkloadEntries; optional.
	WorkloadEntries cache.SharedIndexInformer
}

func (inf Informers) stores() Stores {
	s := Stores{
		Pods:           inf.Pods.GetIndexer(),
		Services:       inf.Services.GetIndexer(),
		EndpointSlices: inf.EndpointSlices.GetIndexer(),
		Namespaces:     inf.Namespaces.GetIndexer(),
		Policies:       inf.Policies.GetIndexer(),
		PeerAuths:      inf.PeerAuths.GetIndexer(),
	}
	if inf.Gateways != nil {
		s.Gateways = inf.Gateways.GetIndexer()
	}
	if inf.Nodes != nil {
		s.Nodes = inf.Nodes.GetIndexer()
	}
	if inf.GatewayClasses != nil {
		s.GatewayClasses = inf.GatewayClasses.GetIndexer()
	}
	if inf.ServiceEntries != nil {
		s.ServiceEntries = inf.ServiceEntries.GetIndexer()
	}
	if inf.WorkloadEntries != nil {
		s.WorkloadEntries = inf.WorkloadEntries.GetIndexer()
	}
	return s
}

// ControllerConfig configures a Controller.
type ControllerConfig struct {
	// Mesh is the translation configuration. RootNamespace is required.
	Mesh Config
	// DebounceQuiet: a batch of changes is pushed once no new change has
	// arrived for this long. Default 10ms.
	DebounceQuiet time.Duration
	// DebounceMax: a batch is pushed at most this long after its first
	// change, however busy the API is. Default 100ms.
	DebounceMax time.Duration
	// Logger: default discard.
	Logger *slog.Logger
	// Registerer receives the controller's metrics. Default: none.
	Registerer prometheus.Registerer
	// Events receives a Warning Event on each Pod or Service whose waypoint
	// binding is denied by the waypoint's owner. Default: none (the denial
	// is still logged).
	Events EventRecorder
	// ServiceStatus receives the istio.io/WaypointBound condition of each
	// Service. Default: none.
	ServiceStatus ServiceStatusSink
	// EntryStatus receives what each ServiceEntry's status should show
	// (its hosts' allocated addresses, its istio.io/WaypointBound
	// condition). Default: none.
	EntryStatus EntryStatusSink
}

func (cfg ControllerConfig) withDefaults() (ControllerConfig, error) {
	if cfg.DebounceQuiet == 0 {
		cfg.DebounceQuiet = DefaultDebounceQuiet
	}
	if cfg.DebounceMax == 0 {
		cfg.DebounceMax = DefaultDebounceMax
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Mesh.Validate(); err != nil {
		return cfg, err
	}
	switch {
	case cfg.DebounceQuiet < 0:
		return cfg, fmt.Errorf("DebounceQuiet %v is negative", cfg.DebounceQuiet)
	case cfg.DebounceMax < cfg.DebounceQuiet:
		return cfg, fmt.Errorf("DebounceMax %v is shorter than DebounceQuiet %v", cfg.DebounceMax, cfg.DebounceQuiet)
	}
	return cfg, nil
}

// AddIndexers adds the indexes the controller needs to the informers (the
// Pods' only when inf has them). It must be called before they start;
// NewController calls it.
func AddIndexers(inf Informers) error {
	if _, ok := inf.EndpointSlices.GetIndexer().GetIndexers()[IndexServiceName]; !ok {
		if err := inf.EndpointSlices.AddIndexers(cache.Indexers{IndexServiceName: SliceServiceIndex}); err != nil {
			return fmt.Errorf("adding the EndpointSlice service index: %w", err)
		}
	}
	if inf.Pods == nil {
		return nil
	}
	if _, ok := inf.Pods.GetIndexer().GetIndexers()[IndexPodNode]; !ok {
		if err := inf.Pods.AddIndexers(cache.Indexers{IndexPodNode: PodNodeIndex}); err != nil {
			return fmt.Errorf("adding the Pod node index: %w", err)
		}
	}
	return nil
}

// PodNodeIndex indexes a Pod by its node's name, once it has one.
func PodNodeIndex(obj any) ([]string, error) {
	if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
		return []string{p.Spec.NodeName}, nil
	}
	return nil, nil
}

// SliceServiceIndex indexes an EndpointSlice by its Service's key.
func SliceServiceIndex(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	if name := s.Labels[discoveryv1.LabelServiceName]; name != "" {
		return []string{s.Namespace + "/" + name}, nil
	}
	return nil, nil
}

// Controller keeps the published workload and policy resources in step with
// the cluster. See the package documentation.
type Controller struct {
	cfg    ControllerConfig
	inf    Informers
	pub    Publisher
	status StatusSink
	ix     *index // owned by Run's goroutine
	log    *slog.Logger

	events   *prometheus.CounterVec
	debounce prometheus.Histogram
	synced   chan struct{}
	changed  *debounce.Debouncer

	mu    sync.Mutex
	dirty batch     // guarded by mu
	since time.Time // guarded by mu: when the oldest pending change arrived
}

// NewController returns a Controller. It starts nothing; call Run. status
// may be nil.
func NewController(cfg ControllerConfig, inf Informers, pub Publisher, status StatusSink) (*Controller, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("creating workload controller: %w", err)
	}
	if inf.Pods == nil || inf.Services == nil || inf.EndpointSlices == nil || inf.Namespaces == nil || inf.Policies == nil || inf.PeerAuths == nil {
		return nil, errors.New("creating workload controller: an informer is missing")
	}
	if pub == nil {
		return nil, errors.New("creating workload controller: no publisher")
	}
	if err := AddIndexers(inf); err != nil {
		return nil, fmt.Errorf("creating workload controller: %w", err)
	}
	c := &Controller{
		cfg:    cfg,
		inf:    inf,
		pub:    pub,
		status: status,
		ix:     newIndex(cfg.Mesh, inf.stores(), cfg.Logger),
		log:    cfg.Logger,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pilot_k8s_reg_events",
			Help: "Kubernetes object events the control plane handled, by type and event.",
		}, []string{"type", "event"}),
		debounce: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pilot_debounce_time",
			Help:    "Seconds between the first change of a batch and its processing.",
			Buckets: []float64{.005, .01, .02, .05, .1, .2, .5, 1},
		}),
		synced:  make(chan struct{}),
		changed: debounce.New(cfg.DebounceQuiet, cfg.DebounceMax),
		dirty:   batch{},
	}
	if cfg.Registerer != nil {
		for _, col := range []prometheus.Collector{c.events, c.debounce} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("creating workload controller: registering metrics: %w", err)
			}
		}
	}
	return c, nil
}

// Synced is closed once the state of the whole cluster has been published
// for the first time.
func (c *Controller) Synced() <-chan struct{} { return c.synced }

// Run watches the informers (which the caller starts) and publishes until ctx
// is done. It returns nil then, or an error if the caches never synced.
func (c *Controller) Run(ctx context.Context) error {
	type reg struct {
		inf cache.SharedIndexInformer
		r   cache.ResourceEventHandlerRegistration
	}
	var regs []reg
	defer func() {
		for _, r := range regs {
			_ = r.inf.RemoveEventHandler(r.r)
		}
	}()
	watch := []struct {
		kind string
		inf  cache.SharedIndexInformer
	}{
		{kindPod, c.inf.Pods}, {kindService, c.inf.Services}, {kindEndpointSlice, c.inf.EndpointSlices},
		{kindNamespace, c.inf.Namespaces}, {kindPolicy, c.inf.Policies}, {kindPeerAuth, c.inf.PeerAuths},
		{kindGateway, c.inf.Gateways}, {kindGatewayClass, c.inf.GatewayClasses}, {kindNode, c.inf.Nodes},
		{kindServiceEntry, c.inf.ServiceEntries}, {kindWorkloadEntry, c.inf.WorkloadEntries},
	}
	var synced []cache.InformerSynced
	for _, w := range watch {
		if w.inf == nil {
			continue
		}
		r, err := w.inf.AddEventHandler(c.handler(w.kind))
		if err != nil {
			return fmt.Errorf("watching %s objects: %w", w.kind, err)
		}
		regs = append(regs, reg{w.inf, r})
		synced = append(synced, r.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("waiting for the informer caches to sync")
	}

	// The first batch is everything, processed at once. Events that
	// arrived meanwhile are in the dirty set and are processed next.
	c.take()
	start := time.Now()
	u := c.ix.process(c.ix.all())
	c.publish(u, start)
	c.log.Info("workload state published", "addresses", len(c.ix.addresses), "policies", len(c.ix.authz),
		"duration", time.Since(start))
	close(c.synced)

	for {
		if !c.changed.Wait(ctx) {
			return nil
		}
		b, since := c.take()
		if len(b) == 0 {
			continue
		}
		c.debounce.Observe(time.Since(since).Seconds())
		c.publish(c.ix.process(b), since)
	}
}

func (c *Controller) take() (batch, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, since := c.dirty, c.since
	c.dirty, c.since = batch{}, time.Time{}
	return b, since
}

func (c *Controller) mark(kind, key string) {
	c.mu.Lock()
	if len(c.dirty) == 0 {
		c.since = time.Now()
	}
	c.dirty.add(kind, key)
	c.mu.Unlock()
	c.changed.Notify()
}

func (c *Controller) handler(kind string) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			c.events.WithLabelValues(kind, "add").Inc()
			c.mark(kind, keyOf(obj))
		},
		UpdateFunc: func(oldObj, newObj any) {
			if o, n := accessor(oldObj), accessor(newObj); o != nil && n != nil && o.GetResourceVersion() == n.GetResourceVersion() {
				return // a resync: nothing changed
			}
			c.events.WithLabelValues(kind, "update").Inc()
			c.mark(kind, keyOf(newObj))
		},
		DeleteFunc: func(obj any) {
			c.events.WithLabelValues(kind, "delete").Inc()
			key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
			if err == nil {
				c.mark(kind, key)
			}
		},
	}
}

func accessor(obj any) interface{ GetResourceVersion() string } {
	a, _ := obj.(interface{ GetResourceVersion() string })
	return a
}

func (c *Controller) publish(u *Update, since time.Time) {
	if !u.empty() {
		// New policies go out before the workloads that name them, and
		// removed ones after the workloads that stopped naming them:
		// ztunnel denies every connection to a workload naming a policy
		// it has not received.
		if len(u.Authz) > 0 {
			if err := c.pub.Publish(securitypb.AuthorizationTypeURL, u.Authz, nil, since); err != nil {
				c.log.Error("publishing authorization resources failed", "error", err)
			}
		}
		if len(u.Addresses)+len(u.AddressRemoved) > 0 {
			if err := c.pub.Publish(workloadpb.AddressTypeURL, u.Addresses, u.AddressRemoved, since); err != nil {
				c.log.Error("publishing workload resources failed", "error", err)
			}
		}
		if len(u.AuthzRemoved) > 0 {
			if err := c.pub.Publish(securitypb.AuthorizationTypeURL, nil, u.AuthzRemoved, since); err != nil {
				c.log.Error("removing authorization resources failed", "error", err)
			}
		}
		if c.log.Enabled(context.Background(), slog.LevelDebug) {
			c.log.Debug("resources published", "addresses", len(u.Addresses), "addresses_removed", len(u.AddressRemoved),
				"policies", len(u.Authz), "policies_removed", len(u.AuthzRemoved))
		}
	}
	if c.status != nil {
		for _, pc := range u.Conditions {
			c.status.SetCondition(pc.Namespace, pc.Name, pc.Generation, pc.Type, pc.Condition)
		}
	}
	if c.cfg.ServiceStatus != nil {
		for _, sc := range u.Services {
			c.cfg.ServiceStatus.SetServiceCondition(sc.Namespace, sc.Name, sc.Condition)
		}
	}
	if c.cfg.EntryStatus != nil {
		for _, es := range u.Entries {
			c.cfg.EntryStatus.SetEntryStatus(es)
		}
	}
	for _, d := range u.Denied {
		c.log.Warn("waypoint binding denied", "kind", d.Kind, "object", d.Key, "reason", d.Refusal.Reason, "message", d.Refusal.Message)
		if c.cfg.Events != nil {
			c.cfg.Events.Eventf(d.Object, corev1.EventTypeWarning, d.Refusal.Reason, "%s", d.Refusal.Message)
		}
	}
}
