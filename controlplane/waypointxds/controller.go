package waypointxds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/internal/debounce"
)

// Publisher receives each waypoint's resources (*xdsserver.Server).
type Publisher interface {
	SetWaypoint(key string, resources map[string]map[string]proto.Message) error
	RemoveWaypoint(key string)
}

// Informers are the shared informers the controller reads. GRPCRoutes,
// TCPRoutes, ReferenceGrants and Policies may be nil.
type Informers struct {
	Gateways, Services, EndpointSlices, Pods, Namespaces cache.SharedIndexInformer
	HTTPRoutes, GRPCRoutes, TCPRoutes, Policies          cache.SharedIndexInformer
	ReferenceGrants                                      cache.SharedIndexInformer
	// TLSRoutes attach to ingress Gateways' TLS listeners; optional.
	TLSRoutes cache.SharedIndexInformer
	// ServiceEntries (networking.istio.io/v1) bound to a waypoint are
	// served by it (egress); optional.
	ServiceEntries cache.SharedIndexInformer
	// WorkloadEntries (networking.istio.io/v1) are endpoints of the
	// Services that select them; optional.
	WorkloadEntries cache.SharedIndexInformer
	// GatewayClasses give their Gateways a default istio.io/waypoint-for,
	// and tell which istio-class Gateways are ingress gateways of this
	// controller; optional.
	GatewayClasses cache.SharedIndexInformer
	// Secrets of type kubernetes.io/tls (a field selector keeps the rest
	// out of the cache) hold ingress Gateways' certificates; optional.
	Secrets cache.SharedIndexInformer
}

func (inf Informers) all() []cache.SharedIndexInformer {
	return []cache.SharedIndexInformer{inf.Gateways, inf.Services, inf.EndpointSlices, inf.Pods, inf.Namespaces,
		inf.HTTPRoutes, inf.GRPCRoutes, inf.TCPRoutes, inf.Policies, inf.GatewayClasses, inf.ReferenceGrants, inf.ServiceEntries, inf.WorkloadEntries, inf.Secrets, inf.TLSRoutes}
}

func indexer(i cache.SharedIndexInformer) cache.Indexer {
	if i == nil {
		return nil
	}
	return i.GetIndexer()
}

// ControllerConfig configures a Controller.
type ControllerConfig struct {
	Mesh Mesh
	// Debounce batches changes: a rebuild waits until no change has come
	// for this long (default 20ms), and at most 10 times as long.
	Debounce time.Duration
	// Logger: default discard.
	Logger *slog.Logger
	// Registerer receives the controller's metrics. Default: none.
	Registerer prometheus.Registerer
	// Status receives every route's outcome after each rebuild
	// (*StatusWriter). Default: none.
	Status RouteStatusSetter
	// Gateways receives every ingress Gateway's listener status after
	// each rebuild (the deployer, which writes Gateway status). Default:
	// none.
	Gateways GatewayListenersSetter
	// NoIngress configures no ingress Gateway: they are turned off, and
	// a class istio may be another controller's.
	NoIngress bool
}

// RouteStatusSetter takes the routes' outcomes (*StatusWriter).
type RouteStatusSetter interface {
	SetRoutes(outcomes []RouteOutcome)
}

// GatewayListenersSetter takes the status.listeners of every ingress
// Gateway, by "<namespace>/<gateway name>"; a Gateway not in the map is
// not (or no longer) an ingress gateway. The map is the caller's no more:
// the setter may keep it.
type GatewayListenersSetter interface {
	SetGatewayListeners(listeners map[string][]gwv1.ListenerStatus)
}

// Controller keeps every waypoint's resources in step with the cluster.
// Each batch of changes rebuilds the waypoints (a waypoint's resources
// depend on few objects, and the xDS cache sends clients only the
// resources whose bytes changed); with no waypoint Gateway it does nothing.
type Controller struct {
	cfg ControllerConfig
	inf Informers
	st  Stores
	pub Publisher
	log *slog.Logger
	// changed batches the informers' events into rebuilds: at most ten
	// debounce periods after the first.
	changed *debounce.Debouncer
	built   map[string]map[string]map[string]proto.Message // owned by Run
	notes   map[string]string                              // owned by Run: last notes by waypoint

	builds    prometheus.Counter
	resources *prometheus.GaugeVec

	mu     sync.Mutex
	synced bool
}

// NewController returns a Controller; Run starts it.
func NewController(cfg ControllerConfig, inf Informers, pub Publisher) (*Controller, error) {
	if inf.Gateways == nil || inf.Services == nil || inf.EndpointSlices == nil || inf.Pods == nil || inf.HTTPRoutes == nil {
		return nil, errors.New("creating waypoint configuration controller: an informer is missing")
	}
	if pub == nil {
		return nil, errors.New("creating waypoint configuration controller: no publisher")
	}
	if err := ambient.AddIndexers(ambient.Informers{EndpointSlices: inf.EndpointSlices}); err != nil {
		return nil, fmt.Errorf("creating waypoint configuration controller: %w", err)
	}
	if cfg.Debounce == 0 {
		cfg.Debounce = 20 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Controller{
		cfg: cfg, inf: inf, pub: pub, log: cfg.Logger,
		st: Stores{Services: indexer(inf.Services), EndpointSlices: indexer(inf.EndpointSlices), Pods: indexer(inf.Pods),
			Namespaces: indexer(inf.Namespaces), HTTPRoutes: indexer(inf.HTTPRoutes), GRPCRoutes: indexer(inf.GRPCRoutes),
			TCPRoutes: indexer(inf.TCPRoutes), TLSRoutes: indexer(inf.TLSRoutes), Policies: indexer(inf.Policies), ReferenceGrants: indexer(inf.ReferenceGrants),
			ServiceEntries: indexer(inf.ServiceEntries), WorkloadEntries: indexer(inf.WorkloadEntries), Secrets: indexer(inf.Secrets),
			Gateways: indexer(inf.Gateways), GatewayClasses: indexer(inf.GatewayClasses)},
		changed: debounce.New(cfg.Debounce, 10*cfg.Debounce),
		built:   map[string]map[string]map[string]proto.Message{},
		notes:   map[string]string{},
		builds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weft_waypoint_config_builds_total", Help: "Rebuilds of the waypoints' Envoy configuration.",
		}),
		resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "weft_waypoint_config_resources", Help: "Envoy resources held per waypoint.",
		}, []string{"waypoint"}),
	}
	if cfg.Registerer != nil {
		for _, col := range []prometheus.Collector{c.builds, c.resources} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("creating waypoint configuration controller: registering metrics: %w", err)
			}
		}
	}
	return c, nil
}

func (c *Controller) poke() { c.changed.Notify() }

// Run watches until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.poke() },
		UpdateFunc: func(o, n any) { c.poke() },
		DeleteFunc: func(any) { c.poke() },
	}
	var synced []cache.InformerSynced
	for _, inf := range c.inf.all() {
		if inf == nil {
			continue
		}
		r, err := inf.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("watching for waypoint configuration: %w", err)
		}
		defer func() { _ = inf.RemoveEventHandler(r) }()
		synced = append(synced, r.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("waiting for the waypoint informers to sync")
	}
	c.rebuild()
	c.mu.Lock()
	c.synced = true
	c.mu.Unlock()
	for c.changed.Wait(ctx) {
		c.rebuild()
	}
	return nil
}

// gatewayClass is the GatewayClass name, nil when unknown.
func (c *Controller) gatewayClass(name string) *gwv1.GatewayClass {
	if c.inf.GatewayClasses == nil {
		return nil
	}
	o, ok, err := c.inf.GatewayClasses.GetIndexer().GetByKey(name)
	if err != nil || !ok {
		return nil
	}
	gc, _ := o.(*gwv1.GatewayClass)
	return gc
}

// Synced reports whether the first build was published.
func (c *Controller) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

// rebuild computes every waypoint and ingress Gateway and publishes those
// that changed, then hands the routes' outcomes to the status writer and
// the Gateways' listener status to their writer.
func (c *Controller) rebuild() {
	waypoints := map[string]*ambient.Waypoint{}
	seen := map[string]bool{} // xDS keys built
	listeners := map[string][]gwv1.ListenerStatus{}
	var reports []Report
	gateways := c.inf.Gateways.GetIndexer().List()
	sort.Slice(gateways, func(i, j int) bool { return keyOf(gateways[i]) < keyOf(gateways[j]) })
	for _, o := range gateways {
		gw := o.(*gwv1.Gateway)
		class := c.gatewayClass(string(gw.Spec.GatewayClassName))
		if wp := ambient.NewWaypointOfClass(gw, class, ""); wp != nil {
			key := wp.Key() // its service account, named after the Gateway
			waypoints[key], seen[key] = wp, true
			res, rep := Build(c.cfg.Mesh, wp, c.st)
			reports = append(reports, rep)
			c.publish("waypoint", key, res, rep.Notes)
			continue
		}
		if c.cfg.NoIngress || !Ingress(gw, class) {
			continue
		}
		key := GatewayKey(gw.Namespace, gw.Name)
		if seen[key] {
			c.log.Error("ingress gateway not configured: its proxy's identity is a waypoint's", "gateway", keyOf(gw), "identity", key)
			continue
		}
		seen[key] = true
		res, rep := BuildGateway(c.cfg.Mesh, gw, c.st)
		reports = append(reports, rep.Report)
		listeners[keyOf(gw)] = rep.Listeners
		c.publish("gateway", key, res, rep.Notes)
	}
	for key := range c.built {
		if !seen[key] {
			c.pub.RemoveWaypoint(key)
			delete(c.built, key)
			delete(c.notes, key)
			c.resources.DeleteLabelValues(key)
			c.log.Info("proxy configuration removed", "proxy", key)
		}
	}
	if c.cfg.Status != nil {
		c.cfg.Status.SetRoutes(Outcomes(c.cfg.Mesh, c.st, waypoints, reports))
	}
	if c.cfg.Gateways != nil {
		c.cfg.Gateways.SetGatewayListeners(listeners)
	}
}

// publish logs a proxy's new problems and publishes its resources if they
// changed; kind is "waypoint" or "gateway", for the log.
func (c *Controller) publish(kind, key string, res Resources, notes []string) {
	c.builds.Inc()
	if n := strings.Join(notes, "; "); n != c.notes[key] {
		c.notes[key] = n
		if n != "" {
			c.log.Warn("proxy configuration has problems", kind, key, "problems", notes)
		}
	}
	// A proxy with nothing to serve still gets its empty configuration:
	// its first answer is what makes it ready.
	if prev, ok := c.built[key]; ok && same(prev, res) {
		return
	}
	if err := c.pub.SetWaypoint(key, res); err != nil {
		c.log.Error("publishing proxy configuration failed", kind, key, "error", err)
		return
	}
	c.built[key] = res
	c.resources.WithLabelValues(key).Set(float64(res.Count()))
	c.log.Info("proxy configuration published", kind, key, "listeners", len(res[resource.ListenerType]),
		"routes", len(res[resource.RouteType]), "clusters", len(res[resource.ClusterType]))
}

func same(a, b map[string]map[string]proto.Message) bool {
	if len(a) != len(b) {
		return false
	}
	for t, am := range a {
		bm := b[t]
		if len(am) != len(bm) {
			return false
		}
		for n, m := range am {
			if o, ok := bm[n]; !ok || !proto.Equal(m, o) {
				return false
			}
		}
	}
	return true
}
