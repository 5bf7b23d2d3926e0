// Package ztunnel wires Weft's node L4 proxy together: workload state from
// the control plane over delta xDS, workload certificates from the mesh CA,
// pods from the CNI node agent over ZDS, one proxy per pod inside its
// network namespace, and the admin, metrics and readiness servers.
package ztunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weftmesh/weft/internal/caclient"
	"github.com/weftmesh/weft/internal/netns"
	"github.com/weftmesh/weft/internal/pb/discoverypb"
	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/pb/workloadpb"
	"github.com/weftmesh/weft/internal/podnet"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/internal/xdsclient"
	"github.com/weftmesh/weft/ztunnel/admin"
	"github.com/weftmesh/weft/ztunnel/dnsproxy"
	"github.com/weftmesh/weft/ztunnel/identity"
	"github.com/weftmesh/weft/ztunnel/inpod"
	"github.com/weftmesh/weft/ztunnel/proxy"
	"github.com/weftmesh/weft/ztunnel/state"
)

// Config is ztunnel's configuration; main fills it from the environment
// (Istio's variable names where they exist) and calls Validate.
type Config struct {
	// NodeName is this node (env NODE_NAME). Required.
	NodeName string
	// PodName, PodNamespace and InstanceIP describe ztunnel's own pod.
	PodName, PodNamespace, InstanceIP string
	// XDSAddress is the control plane, host:port (XDS_ADDRESS); default
	// weft-controlplane.<PodNamespace>.svc:15012.
	XDSAddress string
	// CAAddress is the CA (CA_ADDRESS); default XDSAddress.
	CAAddress string
	// ControlPlaneName is the name the control plane's certificate must
	// carry (XDS_SAN); default weft-controlplane.<PodNamespace>.svc.
	ControlPlaneName string
	// RootCertFile holds the mesh roots (ROOT_CERT); default
	// /var/run/secrets/istio/root-cert.pem.
	RootCertFile string
	// TokenFile is ztunnel's projected token, audience istio-ca
	// (TOKEN_FILE); default /var/run/secrets/tokens/istio-token.
	TokenFile string
	// ClusterID (CLUSTER_ID); default Kubernetes.
	ClusterID string
	// TrustDomain (TRUST_DOMAIN); default cluster.local.
	TrustDomain string
	// ZDSSocket is the node agent's socket (INPOD_UDS); default /var/run/ztunnel/ztunnel.sock.
	ZDSSocket string
	// AdminAddr, MetricsAddr, ReadyAddr: defaults 127.0.0.1:15000, :15020, :15021.
	AdminAddr, MetricsAddr, ReadyAddr string
	// CertTTL asked of the CA (SECRET_TTL); default 24 h.
	CertTTL time.Duration
	// DrainTimeout lets connections finish on shutdown
	// (CONNECTION_TERMINATION_DEADLINE); default 5 s.
	DrainTimeout time.Duration
	// HandoffTimeout is how long a stopping ztunnel keeps serving while it
	// waits for its successor to listen in every pod (HANDOFF_TIMEOUT, a
	// Weft setting); default 5 s. HandoffTimeout plus DrainTimeout must fit
	// in the pod's terminationGracePeriodSeconds.
	HandoffTimeout time.Duration
	// MaxConnectionsPerPod caps the connections open at once in each
	// direction of a pod, so that one pod cannot use up ztunnel's file
	// descriptors for all (MAX_CONNECTIONS_PER_POD, a Weft setting);
	// default 16384 (proxy.DefaultMaxConnections). A pod at both caps
	// holds about four times as many sockets: keep the product of the cap
	// and the pods per node well below ztunnel's RLIMIT_NOFILE.
	MaxConnectionsPerPod int
	// ClusterDomain is the Services' DNS suffix (CLUSTER_DOMAIN); default
	// cluster.local.
	ClusterDomain string
	// DNSProxyOff turns the DNS proxy off (DNS_PROXY=false); by default
	// every pod gets one on 127.0.0.1:15053, where its rules send its DNS
	// when DNS capture is on.
	DNSProxyOff bool
	// ResolvConf names the DNS proxy's upstream nameservers; default
	// /etc/resolv.conf, ztunnel's own, which in Kubernetes points at the
	// cluster DNS (as Istio's ztunnel does). It is read once, at start.
	ResolvConf string
	// NoOriginalSource makes inbound connections reach the app from the
	// pod's own address rather than the client's (ENABLE_ORIG_SRC=false);
	// default false: the client's address is kept, as by Istio's ztunnel.
	NoOriginalSource bool
}

// SetDefaults fills the documented defaults.
func (c *Config) SetDefaults() {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.PodNamespace, "weft-system")
	def(&c.XDSAddress, "weft-controlplane."+c.PodNamespace+".svc:15012")
	def(&c.CAAddress, c.XDSAddress)
	def(&c.ControlPlaneName, "weft-controlplane."+c.PodNamespace+".svc")
	def(&c.RootCertFile, "/var/run/secrets/istio/root-cert.pem")
	def(&c.TokenFile, "/var/run/secrets/tokens/istio-token")
	def(&c.ClusterID, "Kubernetes")
	def(&c.TrustDomain, "cluster.local")
	def(&c.ZDSSocket, "/var/run/ztunnel/ztunnel.sock")
	def(&c.AdminAddr, "127.0.0.1:15000")
	def(&c.MetricsAddr, ":15020")
	def(&c.ReadyAddr, ":15021")
	def(&c.ClusterDomain, "cluster.local")
	def(&c.ResolvConf, "/etc/resolv.conf")
	if c.CertTTL == 0 {
		c.CertTTL = 24 * time.Hour
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 5 * time.Second
	}
	if c.HandoffTimeout == 0 {
		c.HandoffTimeout = 5 * time.Second
	}
	if c.MaxConnectionsPerPod == 0 {
		c.MaxConnectionsPerPod = proxy.DefaultMaxConnections
	}
}

// Validate reports what is missing or malformed.
func (c *Config) Validate() error {
	if c.NodeName == "" {
		return errors.New("NODE_NAME is required (the downward API's spec.nodeName)")
	}
	if _, err := spiffeid.TrustDomainFromString(c.TrustDomain); err != nil {
		return fmt.Errorf("TRUST_DOMAIN %q: %w", c.TrustDomain, err)
	}
	if c.CertTTL < time.Minute {
		return fmt.Errorf("SECRET_TTL %s is too short", c.CertTTL)
	}
	if c.MaxConnectionsPerPod < 0 {
		return fmt.Errorf("MAX_CONNECTIONS_PER_POD %d must be positive", c.MaxConnectionsPerPod)
	}
	if c.DrainTimeout < 0 || c.HandoffTimeout < 0 {
		return fmt.Errorf("CONNECTION_TERMINATION_DEADLINE %s and HANDOFF_TIMEOUT %s must not be negative", c.DrainTimeout, c.HandoffTimeout)
	}
	return nil
}

// certWait bounds how long a pod's proxy waits for the pod's first
// certificate before it opens its listeners. It stays below the node
// agent's ZDS request timeout (5 s): the Add is acknowledged after it.
const certWait = 3 * time.Second

// capturePorts are the TCP ports a pod's proxy listens on; a successor
// holds a pod once it listens on all of them.
func (c *Config) capturePorts() []uint16 {
	ports := []uint16{podnet.OutboundPort, podnet.InboundPlaintextPort, podnet.HBONEPort}
	if !c.DNSProxyOff {
		ports = append(ports, podnet.DNSPort)
	}
	return ports
}

// Ztunnel is the node proxy.
type Ztunnel struct {
	cfg      Config
	log      *slog.Logger
	store    *state.Store
	xds      *xdsclient.Client
	ca       *caclient.Client
	ids      *identity.Manager
	pods     *inpod.Manager
	admin    *admin.Servers
	registry *prometheus.Registry
	draining atomic.Bool // set once Run's context ended: readiness turns false

	migrateWarned atomic.Bool // MigrateOnClose's failure was logged
}

// New builds ztunnel from cfg; it starts nothing.
func New(cfg Config, log *slog.Logger) (*Ztunnel, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rootPEM, err := os.ReadFile(cfg.RootCertFile)
	if err != nil {
		return nil, fmt.Errorf("reading the mesh root certificate: %w", err)
	}
	roots, err := spiffe.ParseRoots(rootPEM)
	if err != nil {
		return nil, fmt.Errorf("mesh root certificate %s: %w", cfg.RootCertFile, err)
	}
	td := spiffeid.RequireTrustDomainFromString(cfg.TrustDomain)
	z := &Ztunnel{cfg: cfg, log: log, store: state.NewStore(), registry: prometheus.NewRegistry()}
	z.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := proxy.NewMetrics(z.registry)
	var resolver *dnsproxy.Resolver
	if !cfg.DNSProxyOff {
		upstreams, err := dnsproxy.ReadResolvConf(cfg.ResolvConf)
		if err != nil {
			return nil, fmt.Errorf("DNS proxy upstreams (DNS_PROXY=false turns the proxy off): %w", err)
		}
		resolver, err = dnsproxy.NewResolver(dnsproxy.Config{
			Store: z.store, Node: cfg.NodeName, ClusterDomain: cfg.ClusterDomain, Upstreams: upstreams,
			Metrics: dnsproxy.NewMetrics(z.registry), Logger: log,
		})
		if err != nil {
			return nil, err
		}
	}

	token := caclient.TokenFile(cfg.TokenFile)
	z.ca, err = caclient.New(caclient.Config{
		Address: cfg.CAAddress, Roots: roots, ServerName: cfg.ControlPlaneName,
		Token: token, ClusterID: cfg.ClusterID, Impersonate: true,
	})
	if err != nil {
		return nil, fmt.Errorf("CA client: %w", err)
	}
	z.ids, err = identity.New(identity.Config{Signer: z.ca, Roots: roots, TTL: cfg.CertTTL, Logger: log})
	if err != nil {
		return nil, err
	}
	z.xds, err = xdsclient.New(xdsclient.Config{
		Address:  cfg.XDSAddress,
		TLS:      &tls.Config{RootCAs: roots, ServerName: cfg.ControlPlaneName, MinVersion: tls.VersionTLS12},
		Node:     z.node(),
		Token:    token,
		Metadata: map[string]string{"clusterid": cfg.ClusterID},
		Subscriptions: []xdsclient.Subscription{
			{TypeURL: workloadpb.AddressTypeURL, Handle: z.applyAddresses},
			{TypeURL: securitypb.AuthorizationTypeURL, Handle: z.applyPolicies},
		},
		Logger: log,
	})
	if err != nil {
		return nil, err
	}
	access := log.With("log", "access")
	z.pods, err = inpod.New(inpod.Config{
		SocketPath: cfg.ZDSSocket,
		Logger:     log,
		NewProxy: func(info inpod.PodInfo, ns *netns.NS) (inpod.Proxy, func(), error) {
			id, err := spiffe.NewIdentity(td, info.Namespace, info.ServiceAccount)
			if err != nil {
				return nil, nil, err
			}
			creds, err := z.ids.Acquire(id)
			if err != nil {
				return nil, nil, err
			}
			// Listeners opened before the certificate would take their
			// share of the pod's connections (during a rollout, from the
			// old ztunnel) and fail them. Past certWait, serve anyway: a
			// refused Add would take the pod out of the mesh.
			select {
			case <-creds.Ready():
			case <-time.After(certWait):
				log.Warn("serving a pod before its certificate arrived", "pod", info.String(), "identity", id.String(), "waited", certWait.String())
			}
			if err := inpod.MigrateOnClose(ns); err != nil && !z.migrateWarned.Swap(true) {
				log.Warn("connections queued on a closing listener will be reset during rollouts", "error", err.Error())
			}
			p, err := proxy.NewPod(proxy.PodConfig{
				Namespace: info.Namespace, Name: info.Name, ServiceAccount: info.ServiceAccount, Node: cfg.NodeName,
				TrustDomain: td, Store: z.store,
				Sockets: inpod.Sockets{NS: ns}, OrigDst: inpod.OrigDst, DNSSockets: inpod.Sockets{NS: ns},
				Credentials: creds, Metrics: metrics, Logger: log, AccessLog: access,
				DrainTimeout: cfg.DrainTimeout, ClusterID: cfg.ClusterID,
				MaxConnections: cfg.MaxConnectionsPerPod, OriginalSource: !cfg.NoOriginalSource,
				DNS: resolver,
			})
			if err != nil {
				creds.Release()
				return nil, nil, err
			}
			return p, creds.Release, nil
		},
	})
	if err != nil {
		return nil, err
	}
	z.admin, err = admin.New(admin.Config{
		AdminAddr: cfg.AdminAddr, MetricsAddr: cfg.MetricsAddr, ReadyAddr: cfg.ReadyAddr,
		Gatherer: z.registry, Ready: z.ready, Dump: z.dump, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	return z, nil
}

// Run serves until ctx ends, then hands the pods over and stops: readiness
// turns false, every pod stays served until a successor listens in it too
// (or HandoffTimeout passes), then each pod's listeners close and its
// connections drain for DrainTimeout.
//
// Pods are taken from the node agent only once the control plane's first
// push is in: a proxy without workloads and policies would send traffic
// out unencrypted (unknown destinations pass through) and let in
// connections a policy denies.
func (z *Ztunnel) Run(ctx context.Context) error {
	partsCtx, stopParts := context.WithCancel(context.WithoutCancel(ctx))
	defer stopParts()
	g, gctx := errgroup.WithContext(partsCtx)
	g.Go(func() error { return z.xds.Run(gctx) })
	g.Go(func() error {
		select {
		case <-z.xds.Synced():
		case <-gctx.Done():
			return nil
		}
		return z.pods.Run(gctx)
	})
	g.Go(func() error { return z.admin.Run(gctx) })
	g.Go(func() error {
		select {
		case <-gctx.Done(): // a part failed
			return nil
		case <-ctx.Done():
		}
		z.draining.Store(true)
		z.handoff(gctx)
		stopParts()
		return nil
	})
	err := g.Wait()
	z.ids.Close()
	z.ca.Close()
	return err
}

// handoff waits until a successor listens in every pod, for up to
// HandoffTimeout.
func (z *Ztunnel) handoff(ctx context.Context) {
	start := time.Now()
	n := len(z.pods.Pods())
	ctx, cancel := context.WithTimeout(ctx, z.cfg.HandoffTimeout)
	defer cancel()
	left := z.pods.WaitTakenOver(ctx, z.cfg.capturePorts())
	waited := time.Since(start).Milliseconds()
	if len(left) == 0 {
		z.log.Info("pods handed over", "pods", n, "waited_ms", waited)
		return
	}
	names := make([]string, len(left))
	for i, p := range left {
		names[i] = p.String()
	}
	z.log.Warn("stopping without a successor in some pods; their connections are refused until one starts", "pods", names, "waited_ms", waited)
}

func (z *Ztunnel) ready() error {
	if z.draining.Load() {
		return errors.New("shutting down")
	}
	select {
	case <-z.xds.Synced():
	default:
		return errors.New("waiting for the control plane's first workload push")
	}
	return z.pods.Ready()
}

func (z *Ztunnel) dump() any {
	d := newConfigDump(z.store.Dump(), z.ids.Identities(), z.pods.Pods())
	d.XDS = z.xds.Stats()
	return d
}

func (z *Ztunnel) node() *discoverypb.Node {
	c := z.cfg
	md, _ := structpb.NewStruct(map[string]any{
		"NAME": c.PodName, "NAMESPACE": c.PodNamespace, "INSTANCE_IPS": c.InstanceIP, "NODE_NAME": c.NodeName,
	})
	return &discoverypb.Node{
		Id:       fmt.Sprintf("ztunnel~%s~%s.%s~%s.svc.cluster.local", c.InstanceIP, c.PodName, c.PodNamespace, c.PodNamespace),
		Metadata: md,
	}
}

func (z *Ztunnel) applyAddresses(up map[string]*anypb.Any, rm []string) error {
	addrs := make(map[string]*workloadpb.Address, len(up))
	var errs []error
	for name, a := range up {
		var addr workloadpb.Address
		if err := a.UnmarshalTo(&addr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		addrs[name] = &addr
	}
	return errors.Join(append(errs, z.store.ApplyAddresses(addrs, rm))...)
}

func (z *Ztunnel) applyPolicies(up map[string]*anypb.Any, rm []string) error {
	pols := make(map[string]*securitypb.Authorization, len(up))
	var errs []error
	for name, a := range up {
		var p securitypb.Authorization
		if err := a.UnmarshalTo(&p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		pols[name] = &p
	}
	return errors.Join(append(errs, z.store.ApplyPolicies(pols, rm))...)
}
