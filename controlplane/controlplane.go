// Package controlplane assembles Weft's control plane, what istiod is to
// Istio's ambient mode minus sidecars: the mesh CA, workload discovery over
// delta xDS and L4 authorization policy, served to ztunnel and waypoints.
//
// # Ports
//
//	15012  gRPC over TLS: IstioCertificateService (the CA), delta ADS and
//	       grpc.health.v1.Health (unauthenticated; SERVING until the
//	       server drains; at most 16 Watch streams at once).
//	       The serving certificate names <service>.<namespace>.svc and
//	       istiod.<namespace>.svc (and their .svc.<cluster domain> forms) and
//	       is signed by the mesh root, which clients read from ConfigMap
//	       istio-ca-root-cert. xDS streams authenticate like CA calls, with a
//	       service-account token for audience istio-ca, and are authorized
//	       by that identity: workload discovery goes to the trusted node
//	       accounts (ztunnel) only, waypoint configuration to each waypoint
//	       only; anyone else's stream ends with PermissionDenied.
//	15010  plaintext delta ADS, unauthenticated (workload discovery to
//	       anyone who reaches it, no waypoint configuration) and Health;
//	       off unless configured.
//	15014  HTTP: /ready, /metrics, and /debug/xds and /debug/pprof/
//	       (these two to loopback callers only).
//
// # Start-up
//
// Run loads (or creates) the root CA, starts the informers, publishes the
// whole cluster's workload state once, and only then serves gRPC and
// reports ready, so that no client is ever handed an empty mesh.
package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioclient "istio.io/client-go/pkg/clientset/versioned"
	istioinformers "istio.io/client-go/pkg/informers/externalversions"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/weftmesh/weft/controlplane/ambient"
	"github.com/weftmesh/weft/controlplane/authpolicy"
	"github.com/weftmesh/weft/controlplane/ca"
	"github.com/weftmesh/weft/controlplane/deployer"
	"github.com/weftmesh/weft/controlplane/waypointxds"
	"github.com/weftmesh/weft/controlplane/xdsserver"
	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/spiffe"
)

// Config configures the control plane. Zero fields take the defaults named;
// Validate applies them.
type Config struct {
	// Namespace is the release namespace (the pod's own). Required.
	Namespace string
	// ServiceName is the control plane's Service, named in its serving
	// certificate. Default "weft-controlplane".
	ServiceName string
	// ExtraDNSNames are further names for the serving certificate.
	ExtraDNSNames []string
	// TrustDomain of the mesh. Default "cluster.local".
	TrustDomain string
	// ClusterID names this cluster in workload uids and must match the
	// clusterid clients send. Default "Kubernetes".
	ClusterID string
	// ClusterDomain is the DNS suffix of Service hostnames. Default
	// "cluster.local".
	ClusterDomain string
	// Network of every workload. Default "".
	Network string
	// RootNamespace holds mesh-wide AuthorizationPolicies and
	// PeerAuthentications. Default Namespace.
	RootNamespace string
	// PathNormalization is how waypoints normalize request paths before
	// policy and routing (Istio's meshConfig.pathNormalization): NONE,
	// BASE, MERGE_SLASHES or DECODE_AND_MERGE_SLASHES. Default BASE.
	PathNormalization string
	// TrustedNodeAccounts are the node proxies: they may request the
	// identities of pods on their node, and only they are served workload
	// discovery. Default ["<Namespace>/ztunnel"].
	TrustedNodeAccounts []string
	// TokenAudience of callers' tokens. Default "istio-ca".
	TokenAudience string
	// TokenReviewCacheTTL reuses a TokenReview for the same token (never
	// past the token's expiry). Default 10s; negative disables.
	TokenReviewCacheTTL time.Duration
	// TokenReviewFailureCacheTTL refuses a token the API refused again
	// without a new TokenReview. Default 5s; negative disables.
	TokenReviewFailureCacheTTL time.Duration
	// CALimits bound certificate requests, in all and per caller pod.
	// Defaults: 512 in progress, 500/s with bursts of 1000; per caller 128,
	// 50/s, bursts of 250 (see ca.Limits).
	CALimits ca.Limits
	// XDSAuth requires a token on the TLS port's xDS streams. Default true.
	XDSAuth *bool
	// DefaultCertTTL is the lifetime of a workload certificate whose request
	// names none, MaxCertTTL the longest issued (a longer request gets it).
	// Defaults 24h and 7 days; MaxCertTTL at most 90 days.
	DefaultCertTTL, MaxCertTTL time.Duration
	// CASecret and PluginCASecret name the root CA's Secrets. Defaults
	// "istio-ca-secret" and "cacerts".
	CASecret, PluginCASecret string
	// SecureAddr serves CA and xDS over TLS. Default ":15012".
	SecureAddr string
	// PlaintextAddr serves plaintext xDS when set (":15010"). Default off.
	PlaintextAddr string
	// MonitorAddr serves /ready, /metrics and /debug. Default ":15014".
	MonitorAddr string
	// DebounceQuiet and DebounceMax batch changes before a push. Defaults
	// 10ms and 100ms.
	DebounceQuiet, DebounceMax time.Duration
	// Waypoints watches Gateways for waypoints. Default true; without the
	// Gateway API CRDs the control plane runs without waypoints.
	Waypoints *bool
	// IngressGateways configures and deploys ingress Gateways (class
	// istio, whose GatewayClass names weft.dev/gateway-controller) beside
	// waypoints, reading the TLS Secrets their listeners name. Default
	// true; false (the chart's gatewayClasses.istio.enabled) reads no
	// Secret, and Gateways of class istio are another controller's.
	IngressGateways *bool
	// WaypointImage is the image of the waypoints deployed for Gateways of
	// class istio-waypoint. Default "": waypoints are configured but not
	// deployed (someone else deploys them).
	WaypointImage string
	// ShutdownGrace bounds the drain of gRPC streams. Default 5s.
	ShutdownGrace time.Duration
	// MaxConnectionAge tells a client's connection GOAWAY after about this
	// long (gRPC adds up to 10% either way), so that clients spread over
	// the replicas again after one restarted or more were added; the
	// streams still open on it (xDS) end MaxConnectionAgeGrace later and
	// their clients reconnect, to any replica. Default 30m, istiod's
	// keepaliveMaxServerConnectionAge; negative: connections are never
	// aged out.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace is how long the streams of an aged-out
	// connection may go on. Default 10s, istiod's.
	MaxConnectionAgeGrace time.Duration
}

// DefaultMaxConnectionAge is Config.MaxConnectionAge's default.
const DefaultMaxConnectionAge = 30 * time.Minute

// Validate applies the defaults and checks the configuration.
func (c *Config) Validate() error {
	if c.Namespace == "" {
		return errors.New("no namespace: set POD_NAMESPACE or --namespace")
	}
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.ServiceName, "weft-controlplane")
	def(&c.TrustDomain, "cluster.local")
	def(&c.ClusterID, "Kubernetes")
	def(&c.ClusterDomain, "cluster.local")
	def(&c.RootNamespace, c.Namespace)
	def(&c.TokenAudience, ca.DefaultAudience)
	def(&c.CASecret, ca.DefaultSecretName)
	def(&c.PluginCASecret, ca.DefaultPluginSecretName)
	def(&c.SecureAddr, ":15012")
	def(&c.MonitorAddr, ":15014")
	if c.TrustedNodeAccounts == nil {
		c.TrustedNodeAccounts = []string{c.Namespace + "/ztunnel"}
	}
	if c.XDSAuth == nil {
		t := true
		c.XDSAuth = &t
	}
	if c.Waypoints == nil {
		t := true
		c.Waypoints = &t
	}
	if c.IngressGateways == nil {
		t := true
		c.IngressGateways = &t
	}
	if c.DefaultCertTTL == 0 {
		c.DefaultCertTTL = spiffe.DefaultCertTTL
	}
	if c.MaxCertTTL == 0 {
		c.MaxCertTTL = spiffe.DefaultMaxCertTTL
	}
	if c.DebounceQuiet == 0 {
		c.DebounceQuiet = ambient.DefaultDebounceQuiet
	}
	if c.DebounceMax == 0 {
		c.DebounceMax = ambient.DefaultDebounceMax
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 5 * time.Second
	}
	if c.MaxConnectionAge == 0 {
		c.MaxConnectionAge = DefaultMaxConnectionAge
	}
	if c.MaxConnectionAgeGrace == 0 {
		c.MaxConnectionAgeGrace = 10 * time.Second
	}
	if c.MaxConnectionAgeGrace < 0 {
		return fmt.Errorf("the grace of an aged-out connection is negative (%s)", c.MaxConnectionAgeGrace)
	}
	pn, err := waypointxds.ParsePathNormalization(c.PathNormalization)
	if err != nil {
		return fmt.Errorf("%w (meshConfig.pathNormalization.normalization)", err)
	}
	c.PathNormalization = string(pn)
	if _, err := spiffeid.TrustDomainFromString(c.TrustDomain); err != nil {
		return fmt.Errorf("trust domain %q: %w", c.TrustDomain, err)
	}
	for _, a := range c.TrustedNodeAccounts {
		if ns, sa, ok := strings.Cut(a, "/"); !ok || ns == "" || sa == "" {
			return fmt.Errorf("trusted node account %q is not <namespace>/<service account>", a)
		}
	}
	switch {
	case c.DefaultCertTTL < 0 || c.MaxCertTTL < c.DefaultCertTTL:
		return fmt.Errorf("certificate TTLs: default %v must be positive and at most the maximum %v", c.DefaultCertTTL, c.MaxCertTTL)
	case c.MaxCertTTL > spiffe.CeilingCertTTL:
		return fmt.Errorf("maximum certificate TTL %v is above 90 days", c.MaxCertTTL)
	case c.DebounceQuiet < 0 || c.DebounceMax < c.DebounceQuiet:
		return fmt.Errorf("debounce: quiet %v must be positive and at most max %v", c.DebounceQuiet, c.DebounceMax)
	}
	for _, a := range []string{c.SecureAddr, c.MonitorAddr, c.PlaintextAddr} {
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("listen address %q: %w", a, err)
		}
	}
	return nil
}

// DNSNames are the names in the serving certificate.
func (c *Config) DNSNames() []string {
	var out []string
	for _, svc := range []string{c.ServiceName, "istiod"} {
		out = append(out, svc+"."+c.Namespace+".svc", svc+"."+c.Namespace+".svc."+c.ClusterDomain)
	}
	return append(out, c.ExtraDNSNames...)
}

// Clients are the API clients. Gateway may be nil (no waypoints).
type Clients struct {
	Kube    kubernetes.Interface
	Istio   istioclient.Interface
	Gateway gwclient.Interface
}

// ControlPlane is the assembled control plane.
type ControlPlane struct {
	cfg     Config
	clients Clients
	log     *slog.Logger
	reg     *prometheus.Registry

	ready   atomic.Bool
	readyCh chan struct{}
	addrs   map[string]net.Addr // set before readyCh is closed
	roots   []byte              // set before readyCh is closed
	xds     *xdsserver.Server
}

// New returns a control plane for a validated cfg. It starts nothing.
func New(cfg Config, clients Clients, log *slog.Logger) (*ControlPlane, error) {
	if clients.Kube == nil || clients.Istio == nil {
		return nil, errors.New("creating control plane: the Kubernetes and Istio clients are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &ControlPlane{cfg: cfg, clients: clients, log: log, reg: reg, readyCh: make(chan struct{}), addrs: map[string]net.Addr{}}, nil
}

// Ready is closed once the control plane serves.
func (cp *ControlPlane) Ready() <-chan struct{} { return cp.readyCh }

// Addr returns the bound address of a listener ("secure", "plaintext",
// "monitor") once Ready is closed.
func (cp *ControlPlane) Addr(name string) net.Addr { return cp.addrs[name] }

// RootsPEM returns the mesh roots once Ready is closed.
func (cp *ControlPlane) RootsPEM() []byte { return cp.roots }

// Registry is the control plane's metrics registry.
func (cp *ControlPlane) Registry() *prometheus.Registry { return cp.reg }

// XDS is the xDS server (for tests and debugging). Set once Run started.
func (cp *ControlPlane) XDS() *xdsserver.Server { return cp.xds }

func stripManagedFields(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		// Only a node's labels (its locality) are read; its status, images
		// above all, would be most of the cache.
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels}}, nil
	}
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// Run serves until ctx ends: it loads the mesh CA, builds the parts on
// shared informers, binds the listeners, and serves gRPC once the first
// full workload state is published.
func (cp *ControlPlane) Run(ctx context.Context) error {
	cfg := cp.cfg
	mesh, err := ca.LoadCA(ctx, cp.clients.Kube.CoreV1(), ca.KeystoreConfig{
		Namespace: cfg.Namespace, SecretName: cfg.CASecret, PluginSecretName: cfg.PluginCASecret, Logger: cp.log,
		CA: spiffe.CAConfig{TrustDomain: spiffeid.RequireTrustDomainFromString(cfg.TrustDomain), DefaultTTL: cfg.DefaultCertTTL, MaxTTL: cfg.MaxCertTTL},
	})
	if err != nil {
		return err
	}
	cp.roots = mesh.RootsPEM()
	serving, err := ca.NewServingCert(mesh, cfg.DNSNames(), 0, cp.log)
	if err != nil {
		return err
	}
	infs, err := cp.newInformers()
	if err != nil {
		return err
	}
	// Events: on the Pods, Services and ServiceEntries whose waypoint
	// binding is denied.
	events := record.NewBroadcaster(record.WithContext(ctx))
	defer events.Shutdown()
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cp.clients.Kube.CoreV1().Events("")})
	kinds := runtime.NewScheme()
	if err := errors.Join(scheme.AddToScheme(kinds), istionetworkingv1.AddToScheme(kinds)); err != nil {
		return fmt.Errorf("building the events' scheme: %w", err)
	}
	p, err := cp.newParts(mesh, infs, events.NewRecorder(kinds, corev1.EventSource{Component: "weft-controlplane"}))
	if err != nil {
		return err
	}
	cp.xds = p.xds
	lns, err := cp.listen(ctx)
	if err != nil {
		return err
	}
	srv := cp.newServers(serving, p)
	infs.start(ctx)
	defer infs.shutdown()

	g, gctx := errgroup.WithContext(ctx)
	for _, run := range p.runners(serving) {
		g.Go(func() error { return run(gctx) })
	}
	g.Go(func() error {
		if err := srv.mon.Serve(lns.mon); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving monitoring on %s: %w", lns.mon.Addr(), err)
		}
		return nil
	})
	g.Go(func() error {
		if !cp.waitPublished(gctx, p.ctrl, infs.ambient.Pods) {
			return nil
		}
		srv.serveGRPC(g, lns)
		cp.ready.Store(true)
		close(cp.readyCh)
		cp.log.Info("control plane ready", "secure", lns.secure.Addr().String(), "monitor", lns.mon.Addr().String(),
			"plaintext", cfg.PlaintextAddr != "", "trust_domain", cfg.TrustDomain, "cluster_id", cfg.ClusterID,
			"trusted_node_accounts", cfg.TrustedNodeAccounts, "path_normalization", cfg.PathNormalization)
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		cp.ready.Store(false)
		srv.stop(lns, cfg.ShutdownGrace)
		return nil
	})
	return g.Wait()
}

// waitPublished waits until the workload controller published the whole
// cluster once and the pod cache the CA reads is synced; false if ctx
// ended first.
func (cp *ControlPlane) waitPublished(ctx context.Context, ctrl *ambient.Controller, pods cache.SharedIndexInformer) bool {
	select {
	case <-ctx.Done():
		return false
	case <-ctrl.Synced():
	}
	return cache.WaitForCacheSync(ctx.Done(), pods.HasSynced)
}

// informerSet is the control plane's shared informers.
type informerSet struct {
	kube, configMaps informers.SharedInformerFactory
	// secrets lists only TLS Secrets (ingress Gateways' certificates);
	// nil without waypoints.
	secrets   informers.SharedInformerFactory
	istio     istioinformers.SharedInformerFactory
	gateway   gwinformers.SharedInformerFactory // nil without waypoints
	ambient   ambient.Informers
	waypoints waypointxds.Informers // Gateways nil without waypoints
}

// newInformers makes the informers the parts share; the Gateway API ones
// only when waypoints are on and the Gateway API is installed.
func (cp *ControlPlane) newInformers() (*informerSet, error) {
	if err := requireIstioSecurityAPI(cp.clients.Kube); err != nil {
		return nil, err
	}
	s := &informerSet{
		kube: informers.NewSharedInformerFactoryWithOptions(cp.clients.Kube, 0, informers.WithTransform(stripManagedFields)),
		configMaps: informers.NewSharedInformerFactoryWithOptions(cp.clients.Kube, 0, informers.WithTransform(stripManagedFields),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ca.RootCertConfigMap).String()
			})),
		istio: istioinformers.NewSharedInformerFactory(cp.clients.Istio, 0),
	}
	s.ambient = ambient.Informers{
		Pods:           s.kube.Core().V1().Pods().Informer(),
		Services:       s.kube.Core().V1().Services().Informer(),
		EndpointSlices: s.kube.Discovery().V1().EndpointSlices().Informer(),
		Namespaces:     s.kube.Core().V1().Namespaces().Informer(),
		Policies:       s.istio.Security().V1().AuthorizationPolicies().Informer(),
		PeerAuths:      s.istio.Security().V1().PeerAuthentications().Informer(),
		Nodes:          s.kube.Core().V1().Nodes().Informer(),
	}
	if err := ca.AddPodIndexers(s.ambient.Pods); err != nil {
		return nil, err
	}
	switch res, err := servedResources(cp.clients.Kube, "networking.istio.io/v1"); {
	case err != nil:
		return nil, err
	default:
		if res["serviceentries"] {
			s.ambient.ServiceEntries = s.istio.Networking().V1().ServiceEntries().Informer()
		} else {
			cp.log.Info("the ServiceEntry CRD (networking.istio.io/v1) is not installed; ServiceEntries are not read (kubectl apply --server-side -f charts/weft/crds/)")
		}
		if res["workloadentries"] {
			s.ambient.WorkloadEntries = s.istio.Networking().V1().WorkloadEntries().Informer()
		} else {
			cp.log.Info("the WorkloadEntry CRD (networking.istio.io/v1) is not installed; WorkloadEntries are not read (kubectl apply --server-side -f charts/weft/crds/)")
		}
	}
	if !*cp.cfg.Waypoints || cp.clients.Gateway == nil {
		return s, nil
	}
	gwres, err := servedResources(cp.clients.Kube, gwv1.GroupVersion.String())
	switch {
	case err != nil:
		return nil, err
	case !gwres["gateways"]:
		cp.log.Warn("the Gateway API CRDs are not installed; running without waypoints")
		return s, nil
	}
	s.gateway = gwinformers.NewSharedInformerFactoryWithOptions(cp.clients.Gateway, 0, gwinformers.WithTransform(stripManagedFields))
	s.ambient.Gateways = s.gateway.Gateway().V1().Gateways().Informer()
	s.ambient.GatewayClasses = s.gateway.Gateway().V1().GatewayClasses().Informer()
	inf := s.ambient
	s.waypoints = waypointxds.Informers{
		Gateways: inf.Gateways, Services: inf.Services, EndpointSlices: inf.EndpointSlices, Pods: inf.Pods,
		Namespaces: inf.Namespaces, Policies: inf.Policies, ServiceEntries: inf.ServiceEntries,
		WorkloadEntries: inf.WorkloadEntries,
		HTTPRoutes:      s.gateway.Gateway().V1().HTTPRoutes().Informer(),
		GRPCRoutes:      s.gateway.Gateway().V1().GRPCRoutes().Informer(),
	}
	s.waypoints.GatewayClasses = inf.GatewayClasses
	// Ingress Gateways' certificates: the field selector keeps every
	// other Secret out of the cache (and out of memory).
	if *cp.cfg.IngressGateways {
		s.secrets = informers.NewSharedInformerFactoryWithOptions(cp.clients.Kube, 0, informers.WithTransform(stripManagedFields),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("type", string(corev1.SecretTypeTLS)).String()
			}))
		s.waypoints.Secrets = s.secrets.Core().V1().Secrets().Informer()
	}
	// TCPRoute is in Gateway API's experimental channel: without its CRD,
	// waypoints run without TCPRoutes.
	if gwres["tcproutes"] {
		s.waypoints.TCPRoutes = s.gateway.Gateway().V1().TCPRoutes().Informer()
	} else {
		cp.log.Info("the TCPRoute CRD (gateway.networking.k8s.io/v1) is not installed; waypoints apply no TCPRoutes")
	}
	// Without the TLSRoute CRD (an older Gateway API), ingress Gateways'
	// TLS listeners take no routes.
	if gwres["tlsroutes"] {
		s.waypoints.TLSRoutes = s.gateway.Gateway().V1().TLSRoutes().Informer()
	} else {
		cp.log.Info("the TLSRoute CRD (gateway.networking.k8s.io/v1) is not installed; ingress gateways apply no TLSRoutes")
	}
	if gwres["referencegrants"] {
		s.waypoints.ReferenceGrants = s.gateway.Gateway().V1().ReferenceGrants().Informer()
	} else {
		cp.log.Info("the ReferenceGrant CRD (gateway.networking.k8s.io/v1) is not installed; routes use only backends of their own namespace")
	}
	return s, nil
}

func (s *informerSet) start(ctx context.Context) {
	s.kube.Start(ctx.Done())
	s.configMaps.Start(ctx.Done())
	s.istio.Start(ctx.Done())
	if s.gateway != nil {
		s.gateway.Start(ctx.Done())
	}
	if s.secrets != nil {
		s.secrets.Start(ctx.Done())
	}
}

func (s *informerSet) shutdown() {
	s.kube.Shutdown()
	s.configMaps.Shutdown()
	s.istio.Shutdown()
	if s.secrets != nil {
		s.secrets.Shutdown()
	}
	if s.gateway != nil {
		s.gateway.Shutdown()
	}
}

// parts are the control plane's components.
type parts struct {
	xds         *xdsserver.Server
	caServer    *ca.Server
	status      *authpolicy.StatusWriter
	svcStatus   *ambient.ServiceStatusWriter
	entryStatus *ambient.EntryStatusWriter // nil without the ServiceEntry CRD
	ctrl        *ambient.Controller
	roots       *ca.RootCertPublisher
	wpConfig    *waypointxds.Controller   // nil without waypoints
	routeStatus *waypointxds.StatusWriter // nil without waypoints
	deploy      *deployer.Deployer        // nil without waypoints or an image
}

// newParts builds the components on infs.
func (cp *ControlPlane) newParts(mesh *spiffe.CA, infs *informerSet, events record.EventRecorder) (*parts, error) {
	cfg, log, inf := cp.cfg, cp.log, infs.ambient
	authn, err := ca.NewAuthenticator(ca.AuthenticatorConfig{Audience: cfg.TokenAudience, CacheTTL: cfg.TokenReviewCacheTTL,
		FailureCacheTTL: cfg.TokenReviewFailureCacheTTL},
		cp.clients.Kube.AuthenticationV1().TokenReviews(), ca.NewPodIndex(inf.Pods, cp.clients.Kube.CoreV1()))
	if err != nil {
		return nil, err
	}
	p := &parts{}
	xcfg := xdsserver.Config{Logger: log.With("part", "xds"), Registerer: cp.reg, NodeProxies: cfg.TrustedNodeAccounts}
	if *cfg.XDSAuth {
		xcfg.Authenticator = authn
	}
	if p.xds, err = xdsserver.New(xcfg); err != nil {
		return nil, err
	}
	p.caServer, err = ca.NewServer(ca.ServerConfig{
		TrustDomain: spiffeid.RequireTrustDomainFromString(cfg.TrustDomain), TrustedNodeAccounts: cfg.TrustedNodeAccounts,
		ClusterID: cfg.ClusterID, Logger: log.With("part", "ca"), Registerer: cp.reg, Limits: cfg.CALimits,
	}, mesh, authn, ca.NewPodIndex(inf.Pods, cp.clients.Kube.CoreV1()))
	if err != nil {
		return nil, err
	}
	p.status, err = authpolicy.NewStatusWriter(cp.clients.Istio.SecurityV1(), inf.Policies.GetIndexer(), log.With("part", "policy-status"), cp.reg)
	if err != nil {
		return nil, err
	}
	p.svcStatus, err = ambient.NewServiceStatusWriter(cp.clients.Kube.CoreV1(), inf.Services.GetIndexer(), log.With("part", "service-status"), cp.reg)
	if err != nil {
		return nil, err
	}
	var entrySink ambient.EntryStatusSink
	if inf.ServiceEntries != nil {
		p.entryStatus, err = ambient.NewEntryStatusWriter(cp.clients.Istio.NetworkingV1(), inf.ServiceEntries.GetIndexer(),
			log.With("part", "serviceentry-status"), cp.reg)
		if err != nil {
			return nil, err
		}
		entrySink = p.entryStatus
	}
	p.ctrl, err = ambient.NewController(ambient.ControllerConfig{
		Mesh: ambient.Config{ClusterID: cfg.ClusterID, TrustDomain: cfg.TrustDomain, ClusterDomain: cfg.ClusterDomain,
			Network: cfg.Network, RootNamespace: cfg.RootNamespace},
		DebounceQuiet: cfg.DebounceQuiet, DebounceMax: cfg.DebounceMax,
		Logger: log.With("part", "workloads"), Registerer: cp.reg, Events: events, ServiceStatus: p.svcStatus,
		EntryStatus: entrySink,
	}, inf, p.xds, p.status)
	if err != nil {
		return nil, err
	}
	if p.roots, err = ca.NewRootCertPublisher(mesh.RootsPEM(), inf.Namespaces, infs.configMaps.Core().V1().ConfigMaps().Informer(),
		cp.clients.Kube.CoreV1(), log.With("part", "root-cert"), cp.reg); err != nil {
		return nil, err
	}
	if infs.waypoints.Gateways == nil {
		return p, nil
	}
	if cfg.WaypointImage != "" {
		p.deploy, err = deployer.New(deployer.Config{
			Image: cfg.WaypointImage, ControlPlaneNamespace: cfg.Namespace,
			XDSAddress: cfg.ServiceName + "." + cfg.Namespace + ".svc:" + portOf(cfg.SecureAddr),
			ClusterID:  cfg.ClusterID, TrustDomain: cfg.TrustDomain, ClusterDomain: cfg.ClusterDomain,
			NoIngress: !*cfg.IngressGateways,
		}, cp.clients.Kube, cp.clients.Gateway, inf.Gateways, infs.gateway.Gateway().V1().GatewayClasses().Informer(),
			log.With("part", "waypoint-deployer"), cp.reg)
		if err != nil {
			return nil, err
		}
	}
	wi := infs.waypoints
	p.routeStatus, err = waypointxds.NewStatusWriter(apinames.WaypointController, cp.clients.Gateway.GatewayV1(),
		wi.HTTPRoutes.GetIndexer(), wi.GRPCRoutes.GetIndexer(), indexerOf(wi.TCPRoutes), indexerOf(wi.TLSRoutes), log.With("part", "route-status"), cp.reg)
	if err != nil {
		return nil, err
	}
	wcfg := waypointxds.ControllerConfig{
		Mesh: waypointxds.Mesh{TrustDomain: cfg.TrustDomain, ClusterDomain: cfg.ClusterDomain, RootNamespace: cfg.RootNamespace,
			PathNormalization: waypointxds.PathNormalization(cfg.PathNormalization), Network: cfg.Network},
		Logger: log.With("part", "waypoint-config"), Registerer: cp.reg, Status: p.routeStatus,
		NoIngress: !*cfg.IngressGateways,
	}
	if p.deploy != nil { // a nil *Deployer in the interface would not be nil
		wcfg.Gateways = p.deploy
	}
	p.wpConfig, err = waypointxds.NewController(wcfg, wi, p.xds)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// runners are the parts' run loops, with the serving certificate's.
func (p *parts) runners(serving *ca.ServingCert) []func(context.Context) error {
	rs := []func(context.Context) error{p.ctrl.Run, p.status.Run, p.svcStatus.Run, p.roots.Run, serving.Run, p.xds.Run}
	if p.entryStatus != nil {
		rs = append(rs, p.entryStatus.Run)
	}
	if p.wpConfig != nil {
		rs = append(rs, p.wpConfig.Run, p.routeStatus.Run)
	}
	if p.deploy != nil {
		rs = append(rs, p.deploy.Run)
	}
	return rs
}

// listeners are the control plane's sockets.
type listeners struct {
	secure, mon, plain net.Listener // plain nil unless configured
}

// listen binds the listeners now, so that a port conflict fails start-up.
func (cp *ControlPlane) listen(ctx context.Context) (*listeners, error) {
	cfg := cp.cfg
	var lc net.ListenConfig
	l := &listeners{}
	var err error
	if l.secure, err = lc.Listen(ctx, "tcp", cfg.SecureAddr); err != nil {
		return nil, fmt.Errorf("listening on %s: %w", cfg.SecureAddr, err)
	}
	if l.mon, err = lc.Listen(ctx, "tcp", cfg.MonitorAddr); err != nil {
		l.secure.Close()
		return nil, fmt.Errorf("listening on %s: %w", cfg.MonitorAddr, err)
	}
	if cfg.PlaintextAddr != "" {
		if l.plain, err = lc.Listen(ctx, "tcp", cfg.PlaintextAddr); err != nil {
			l.secure.Close()
			l.mon.Close()
			return nil, fmt.Errorf("listening on %s: %w", cfg.PlaintextAddr, err)
		}
		cp.addrs["plaintext"] = l.plain.Addr()
	}
	cp.addrs["secure"], cp.addrs["monitor"] = l.secure.Addr(), l.mon.Addr()
	return l, nil
}

// maxStreamsPerConn bounds the streams open at once on one gRPC
// connection, on both ports; it is advertised in SETTINGS and a stream
// beyond it is refused (REFUSED_STREAM), as RFC 9113 §5.1.2 has it. gRPC's
// default is no bound, so a single connection, even an unauthenticated
// one on the plaintext port, could hold as many xDS streams, each with its
// goroutines and watches, as it cared to open. A node proxy needs one
// stream and a certificate call per pod starting; clients that reach the
// bound wait for a stream to end (gRPC's) or open another connection
// (net/http's, the data plane's). 100 is the smallest bound RFC 9113
// recommends.
const maxStreamsPerConn = 100

// maxRecvMsg bounds one message the gRPC servers take. A ztunnel that
// reconnects names every Address it holds with its version, a SHA-256 in
// hex, in its first request: about 120 bytes an address, so gRPC's default
// of 4 MiB refused the request of a mesh of some 35,000 workloads and
// Services, and the ztunnel, refused on every reconnect, kept its old view
// of the mesh for good. 32 MiB takes some 250,000, past the 200,000 names
// one caller may subscribe to (xdsserver). A message is read as it arrives,
// so what the bound lets a caller make the server hold is what it sends.
const maxRecvMsg = 32 << 20

// servers are the control plane's gRPC and HTTP servers.
type servers struct {
	secure, plain *grpc.Server // plain nil unless configured
	mon           *http.Server
	// health is the standard gRPC health service on both gRPC servers:
	// SERVING from when they serve (the control plane is ready) until
	// they drain.
	health *boundedHealth
}

func (cp *ControlPlane) newServers(serving *ca.ServingCert, p *parts) *servers {
	kp := grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true})
	var age keepalive.ServerParameters // zero: never aged out
	if cp.cfg.MaxConnectionAge > 0 {
		age = keepalive.ServerParameters{MaxConnectionAge: cp.cfg.MaxConnectionAge, MaxConnectionAgeGrace: cp.cfg.MaxConnectionAgeGrace}
	}
	ka := grpc.KeepaliveParams(age)
	ms := grpc.MaxConcurrentStreams(maxStreamsPerConn)
	mr := grpc.MaxRecvMsgSize(maxRecvMsg)
	tlsCfg := &tls.Config{GetCertificate: serving.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	s := &servers{
		secure: grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)), kp, ka, ms, mr),
		mon:    &http.Server{Handler: cp.monitorMux(p.xds), ReadHeaderTimeout: 5 * time.Second},
		health: &boundedHealth{Server: health.NewServer(), watches: make(chan struct{}, maxHealthWatches)},
	}
	p.xds.Register(s.secure)
	p.caServer.Register(s.secure)
	healthpb.RegisterHealthServer(s.secure, s.health)
	if cp.cfg.PlaintextAddr != "" {
		// The same resources, never authenticated (as istiod's 15010).
		s.plain = grpc.NewServer(kp, ka, ms, mr)
		p.xds.RegisterPlaintext(s.plain)
		healthpb.RegisterHealthServer(s.plain, s.health)
	}
	return s
}

// serveGRPC serves the gRPC servers in g.
func (s *servers) serveGRPC(g *errgroup.Group, l *listeners) {
	serve := func(srv *grpc.Server, ln net.Listener, name string) {
		g.Go(func() error {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("serving %s gRPC on %s: %w", name, ln.Addr(), err)
			}
			return nil
		})
	}
	serve(s.secure, l.secure, "TLS")
	if s.plain != nil {
		serve(s.plain, l.plain, "plaintext")
	}
}

// stop stops accepting and drains, each server within grace.
func (s *servers) stop(l *listeners, grace time.Duration) {
	s.health.Shutdown()
	stopGRPC(s.secure, grace)
	if s.plain != nil {
		stopGRPC(s.plain, grace)
	}
	l.secure.Close()
	if l.plain != nil {
		l.plain.Close()
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = s.mon.Shutdown(sctx)
}

// maxHealthWatches bounds the health Watch streams held open at once,
// across both ports: the health service answers without a token, and each
// stream holds a goroutine for as long as its caller likes.
const maxHealthWatches = 16

// boundedHealth is the gRPC health service with at most maxHealthWatches
// Watch streams at once; beyond that Watch is refused at once
// (ResourceExhausted) and Check still answers.
type boundedHealth struct {
	*health.Server
	watches chan struct{}
}

func (h *boundedHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	select {
	case h.watches <- struct{}{}:
	default:
		return status.Errorf(codes.ResourceExhausted, "%d health watches are open, the most this server holds; poll Check instead", maxHealthWatches)
	}
	defer func() { <-h.watches }()
	return h.Server.Watch(req, stream)
}

// stopGRPC drains s, then stops it at the deadline (xDS streams never end
// on their own; the xDS server's Run has already ended them).
func stopGRPC(s *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.Stop()
		<-done
	}
}

// portOf is the port of a listen address (":15012" → "15012").
func portOf(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil || p == "" || p == "0" {
		return "15012"
	}
	return p
}

// requireIstioSecurityAPI fails start-up, with what to do, when the API
// server does not serve the Istio security kinds the control plane
// watches: their informers would wait for ever. Helm installs the chart's
// CRDs on install but never on upgrade.
func requireIstioSecurityAPI(kube kubernetes.Interface) error {
	const gv = "security.istio.io/v1"
	res, err := servedResources(kube, gv)
	if err != nil {
		return err
	}
	var missing []string
	for _, name := range []string{"authorizationpolicies", "peerauthentications"} {
		if !res[name] {
			missing = append(missing, name+"."+strings.Split(gv, "/")[0])
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the API server does not serve %s %s: install the CRDs of the chart's crds/ directory (Helm does not upgrade CRDs: kubectl apply --server-side -f charts/weft/crds/)",
			gv, strings.Join(missing, " and "))
	}
	return nil
}

// indexerOf is an optional informer's store.
func indexerOf(inf cache.SharedIndexInformer) cache.Indexer {
	if inf == nil {
		return nil
	}
	return inf.GetIndexer()
}

// servedResources lists the resources the API server serves in the group
// version gv, by name; none when the group version is not installed.
func servedResources(kube kubernetes.Interface, gv string) (map[string]bool, error) {
	res, err := kube.Discovery().ServerResourcesForGroupVersion(gv)
	if err != nil {
		if strings.Contains(err.Error(), "not found") || strings.Contains(err.Error(), "could not find") {
			return nil, nil
		}
		return nil, fmt.Errorf("discovering %s: %w", gv, err)
	}
	out := map[string]bool{}
	for _, r := range res.APIResources {
		out[r.Name] = true
	}
	return out, nil
}

func (cp *ControlPlane) monitorMux(xds *xdsserver.Server) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		if !cp.ready.Load() {
			http.Error(w, "not ready: the initial workload state is not published yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(cp.reg, promhttp.HandlerOpts{}))
	mux.Handle("GET /debug/xds", loopbackOnly(xds.DebugHandler()))
	// Profiles, as istiod serves them on its debug port.
	mux.Handle("GET /debug/pprof/", loopbackOnly(http.HandlerFunc(pprof.Index)))
	mux.Handle("GET /debug/pprof/profile", loopbackOnly(http.HandlerFunc(pprof.Profile)))
	mux.Handle("GET /debug/pprof/trace", loopbackOnly(http.HandlerFunc(pprof.Trace)))
	return mux
}

// loopbackOnly refuses callers that are not on loopback: debug output holds
// the whole mesh's configuration (reach it with kubectl port-forward).
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		if err != nil || !ap.Addr().Unmap().IsLoopback() {
			http.Error(w, "debug endpoints answer loopback callers only; use kubectl port-forward", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}
