// Command waypoint is Weft's L7 waypoint proxy: HBONE in on 15008, routing
// and L7 authorization from Envoy xDS, HBONE out to the chosen endpoint.
//
// With PROXY_MODE=gateway it is an ingress gateway instead: no HBONE
// server; it listens on the ports of the Listeners with an address that
// xDS gives it (waypoint/proxy, gateway.go), and is ready once every one is
// bound.
//
// With -bootstrap it runs without a control plane: the Envoy resources come
// from a file (waypoint/config.Bootstrap) and the SVID from PEM files.
//
// Garbage collection: unless GOGC is set, the collector runs at GOGC=400
// with a soft memory limit (GOMEMLIMIT, default 64 MiB) instead of Go's
// GOGC=100: the waypoint's live heap is a few MiB, so GOGC=100 collects
// every few MiB of requests (about a fifth of its CPU under load in the
// rps benchmark), while 400 keeps the heap under about five times the live
// data and the limit makes collection eager again as it nears 64 MiB.
package main

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/caclient"
	"github.com/weftmesh/weft/internal/pb/discoverypb"
	"github.com/weftmesh/weft/internal/proxytune"
	"github.com/weftmesh/weft/internal/spiffe"
	"github.com/weftmesh/weft/internal/xdsclient"
	"github.com/weftmesh/weft/waypoint/config"
	"github.com/weftmesh/weft/waypoint/proxy"
)

// Default garbage-collection settings (see the package doc).
const (
	defaultGOGC     = 400
	defaultMemLimit = 64 << 20
)

// Config is the waypoint's configuration, from flags and the environment.
type Config struct {
	// Bootstrap, when set (-bootstrap), is a file of static Envoy resources
	// used instead of xDS; CertFile and KeyFile (-cert, -key) then hold the
	// SVID, leaf first, in PEM; it is not rotated.
	Bootstrap, CertFile, KeyFile string
	// RootsFile holds the mesh trust anchors (-roots); default $ROOT_CERT,
	// else /var/run/secrets/istio/root-cert.pem.
	RootsFile string

	// xDS mode, from the environment: POD_NAMESPACE (default "default"),
	// SERVICE_ACCOUNT (required: the Gateway's name), CONTROLPLANE_NAMESPACE
	// (default weft-system), XDS_ADDRESS (default
	// $WEFT_CONTROLPLANE_SERVICE_HOST:15012, else
	// weft-controlplane.<ns>.svc:15012), CA_ADDRESS (default the xDS
	// address), XDS_SAN (default weft-controlplane.<ns>.svc), TOKEN_FILE
	// (default /var/run/secrets/tokens/istio-token), CLUSTER_ID (default
	// Kubernetes), TRUST_DOMAIN (default cluster.local), INSTANCE_IP and
	// POD_NAME (for the xDS node id).
	Namespace, ServiceAccount, XDSAddress, CAAddress, XDSSAN, TokenFile, ClusterID string
	TrustDomain                                                                    string
	InstanceIP, PodName                                                            string

	// HBONEAddr (HBONE_ADDR, default :15008), MetricsAddr (METRICS_ADDR,
	// default :15020) and ReadinessAddr (READINESS_ADDR, default :15021)
	// are the listeners (no HBONE one in gateway mode); DebugAddr (DEBUG_ADDR, default none) serves
	// net/http/pprof under /debug/pprof/ when set.
	HBONEAddr, MetricsAddr, ReadinessAddr, DebugAddr string
	// AccessLog logs a line per request and connection (ACCESS_LOG: "on",
	// the default, or "off").
	AccessLog bool
	// Gateway: PROXY_MODE=gateway (apinames.ProxyModeEnv); default
	// waypoint.
	Gateway bool
	// DrainDelay (DRAIN_DELAY, default 3s, at most 1m) is how long the proxy, told to
	// stop, reports unready and still takes new connections before it
	// closes its listeners and drains: the ztunnels (or, for a gateway,
	// the nodes' Service rules) learn meanwhile that it is going, and
	// stop sending it connections it would refuse.
	DrainDelay time.Duration
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// loadConfig reads the flags in args and the environment.
func loadConfig(args []string) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("waypoint", flag.ContinueOnError)
	fs.StringVar(&c.Bootstrap, "bootstrap", "", "run on the static Envoy resources of this YAML or JSON file instead of xDS")
	fs.StringVar(&c.CertFile, "cert", "", "with -bootstrap: the SVID's certificate chain (PEM)")
	fs.StringVar(&c.KeyFile, "key", "", "with -bootstrap: the SVID's private key (PEM)")
	fs.StringVar(&c.RootsFile, "roots", env("ROOT_CERT", "/var/run/secrets/istio/root-cert.pem"), "the mesh trust anchors (PEM)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cpNS := env("CONTROLPLANE_NAMESPACE", "weft-system")
	c.Namespace = env("POD_NAMESPACE", "default")
	c.ServiceAccount = os.Getenv("SERVICE_ACCOUNT")
	c.XDSAddress = os.Getenv("XDS_ADDRESS")
	if c.XDSAddress == "" {
		if h := os.Getenv("WEFT_CONTROLPLANE_SERVICE_HOST"); h != "" {
			c.XDSAddress = net.JoinHostPort(h, "15012")
		} else {
			c.XDSAddress = "weft-controlplane." + cpNS + ".svc:15012"
		}
	}
	c.CAAddress = env("CA_ADDRESS", c.XDSAddress)
	c.XDSSAN = env("XDS_SAN", "weft-controlplane."+cpNS+".svc")
	c.TokenFile = env("TOKEN_FILE", "/var/run/secrets/tokens/istio-token")
	c.ClusterID = env("CLUSTER_ID", "Kubernetes")
	c.TrustDomain = env("TRUST_DOMAIN", "cluster.local")
	c.InstanceIP, c.PodName = os.Getenv("INSTANCE_IP"), os.Getenv("POD_NAME")
	c.HBONEAddr = env("HBONE_ADDR", ":"+strconv.Itoa(apinames.HBONEPort))
	c.MetricsAddr = env("METRICS_ADDR", ":15020")
	c.ReadinessAddr = env("READINESS_ADDR", ":15021")
	c.DebugAddr = os.Getenv("DEBUG_ADDR")
	switch v := env(apinames.ProxyModeEnv, apinames.ProxyModeWaypoint); v {
	case apinames.ProxyModeWaypoint:
	case apinames.ProxyModeGateway:
		c.Gateway = true
	default:
		return c, fmt.Errorf("%s=%q: want %s or %s", apinames.ProxyModeEnv, v, apinames.ProxyModeWaypoint, apinames.ProxyModeGateway)
	}
	var err error
	if c.DrainDelay, err = proxytune.ParseDrainDelay(os.Getenv(proxytune.DrainDelay)); err != nil {
		return c, fmt.Errorf("%s=%q: %w", proxytune.DrainDelay, os.Getenv(proxytune.DrainDelay), err)
	}
	if c.AccessLog, err = proxytune.ParseAccessLog(os.Getenv(proxytune.AccessLog)); err != nil {
		return c, fmt.Errorf("%s=%q: %w", proxytune.AccessLog, os.Getenv(proxytune.AccessLog), err)
	}
	return c, nil
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if c.Bootstrap != "" {
		if c.CertFile == "" || c.KeyFile == "" {
			return errors.New("-bootstrap needs -cert and -key (the waypoint's SVID in PEM)")
		}
		return nil
	}
	if c.CertFile != "" || c.KeyFile != "" {
		return errors.New("-cert and -key go with -bootstrap; with xDS the certificate comes from the control plane's CA")
	}
	if c.ServiceAccount == "" {
		return errors.New("SERVICE_ACCOUNT is required (the Gateway's name)")
	}
	if _, err := spiffeid.TrustDomainFromString(c.TrustDomain); err != nil {
		return fmt.Errorf("TRUST_DOMAIN: %w", err)
	}
	return nil
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg, err := loadConfig(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil {
		tuneGC()
		stop, now, release := signals()
		err = run(stop, now, cfg, log)
		release()
	}
	if err != nil {
		log.Error("waypoint stopped", "error", err.Error())
		os.Exit(1)
	}
}

// tuneGC applies the default collector settings unless GOGC is set.
func tuneGC() {
	if os.Getenv("GOGC") != "" {
		return
	}
	debug.SetGCPercent(defaultGOGC)
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemLimit)
	}
}

// credentials are the waypoint's identity and certificate, and whether
// they are ready.
type credentials struct {
	id    spiffeid.ID
	cert  func() (*tls.Certificate, error)
	ready <-chan struct{}
	run   func(context.Context) error // rotation, if any
	close func()
}

// signals turns SIGTERM and SIGINT into two contexts: stop ends at the
// first, now at the second, which skips what is left of the drain delay.
// release stops the handling.
func signals() (stop, now context.Context, release func()) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	stop, stopped := context.WithCancel(context.Background())
	now, hurried := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		for _, cancel := range []context.CancelFunc{stopped, hurried} {
			select {
			case <-ch:
				cancel()
			case <-done:
				return
			}
		}
	}()
	return stop, now, func() {
		signal.Stop(ch)
		close(done)
		stopped()
		hurried()
	}
}

// run serves until ctx ends, then for the drain delay unless now ends
// first, then drains.
func run(ctx, now context.Context, cfg Config, log *slog.Logger) error {
	rootPEM, err := os.ReadFile(cfg.RootsFile)
	if err != nil {
		return fmt.Errorf("reading the mesh root certificate: %w", err)
	}
	roots, err := spiffe.ParseRoots(rootPEM)
	if err != nil {
		return err
	}
	store := config.NewStoreWith(config.StoreConfig{Logger: log})
	var creds credentials
	var xds *xdsclient.Client
	if cfg.Bootstrap != "" {
		if creds, err = staticCredentials(cfg.CertFile, cfg.KeyFile); err != nil {
			return err
		}
		data, err := os.ReadFile(cfg.Bootstrap)
		if err != nil {
			return fmt.Errorf("reading the bootstrap file: %w", err)
		}
		b, err := config.ParseBootstrap(data)
		if err == nil {
			err = b.Apply(store)
		}
		if err != nil {
			return fmt.Errorf("bootstrap file %s: %w", cfg.Bootstrap, err)
		}
	} else {
		if creds, xds, err = dynamicConfig(cfg, roots, store, log); err != nil {
			return err
		}
	}
	defer creds.close()
	if !strings.Contains(os.Getenv("GODEBUG"), "http2xconnect=1") {
		log.Warn("HTTP/2 clients cannot open WebSockets: extended CONNECT (RFC 8441) needs GODEBUG=http2xconnect=1 when the waypoint starts, as the deployer sets it")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	access := slog.New(slog.DiscardHandler)
	if cfg.AccessLog {
		access = log.With("log", "access")
	}
	p, err := proxy.New(proxy.Config{
		Identity: creds.id, Certificate: creds.cert, Roots: roots, Store: store,
		Metrics: proxy.NewMetrics(reg), Logger: log, AccessLog: access, Gateway: cfg.Gateway,
	})
	if err != nil {
		return err
	}
	var ln net.Listener
	if !cfg.Gateway {
		if ln, err = net.Listen("tcp", cfg.HBONEAddr); err != nil {
			return err
		}
	}
	// Told to stop (ctx), the proxy goes on serving for DrainDelay, unready.
	stopping := ctx
	serving, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	defer context.AfterFunc(stopping, func() {
		log.Info("waypoint stopping: unready, still taking connections", "for", cfg.DrainDelay.String())
		time.AfterFunc(cfg.DrainDelay, stopServing)
	})()
	defer context.AfterFunc(now, func() {
		log.Info("waypoint told again to stop: draining now")
		stopServing()
	})()
	g, ctx := errgroup.WithContext(serving)
	if creds.run != nil {
		g.Go(func() error { return creds.run(ctx) })
	}
	if xds != nil {
		g.Go(func() error { return xds.Run(ctx) })
	}
	g.Go(func() error { return store.Run(ctx) }) // resolves the DNS clusters
	if cfg.Gateway {
		g.Go(func() error { return p.ServeGateway(ctx) })
	} else {
		g.Go(func() error { return p.Serve(ctx, ln) })
	}
	mux := http.NewServeMux()
	metrics := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	mux.Handle("/metrics", metrics)
	mux.Handle(apinames.MetricsPath, metrics) // what the pods' scrape annotations name
	ready := http.NewServeMux()
	ready.HandleFunc("/healthz/ready", func(w http.ResponseWriter, _ *http.Request) {
		if stopping.Err() != nil {
			http.Error(w, "stopping", http.StatusServiceUnavailable)
			return
		}
		var missing []string
		select {
		case <-store.Applied():
		default:
			missing = append(missing, "xDS configuration")
		}
		select {
		case <-creds.ready:
		default:
			missing = append(missing, "certificate")
		}
		if cfg.Gateway && len(missing) == 0 {
			if err := p.GatewayReady(); err != nil {
				missing = append(missing, err.Error())
			}
		}
		if len(missing) > 0 {
			http.Error(w, "waiting for "+strings.Join(missing, " and "), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	servers := map[string]http.Handler{cfg.MetricsAddr: mux, cfg.ReadinessAddr: ready}
	if cfg.DebugAddr != "" {
		dbg := http.NewServeMux()
		dbg.HandleFunc("/debug/pprof/", pprof.Index)
		dbg.HandleFunc("/debug/pprof/profile", pprof.Profile)
		dbg.HandleFunc("/debug/pprof/trace", pprof.Trace)
		servers[cfg.DebugAddr] = dbg
	}
	for addr, h := range servers {
		srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error {
			go func() { <-ctx.Done(); srv.Close() }()
			if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if cfg.Bootstrap != "" {
		log.Info("waypoint starting", "identity", creds.id.String(), "bootstrap", cfg.Bootstrap, "gateway", cfg.Gateway)
	} else {
		log.Info("waypoint starting", "identity", creds.id.String(), "xds", cfg.XDSAddress, "gateway", cfg.Gateway)
	}
	return g.Wait()
}

// dynamicConfig sets up the certificate from the control plane's CA and
// the xDS client that fills store.
func dynamicConfig(cfg Config, roots *x509.CertPool, store *config.Store, log *slog.Logger) (credentials, *xdsclient.Client, error) {
	td, err := spiffeid.TrustDomainFromString(cfg.TrustDomain)
	if err != nil {
		return credentials{}, nil, fmt.Errorf("TRUST_DOMAIN: %w", err)
	}
	id, err := spiffe.NewIdentity(td, cfg.Namespace, cfg.ServiceAccount)
	if err != nil {
		return credentials{}, nil, err
	}
	token := caclient.TokenFile(cfg.TokenFile)
	ca, err := caclient.New(caclient.Config{Address: cfg.CAAddress, Roots: roots, ServerName: cfg.XDSSAN, Token: token, ClusterID: cfg.ClusterID})
	if err != nil {
		return credentials{}, nil, err
	}
	src, err := spiffe.NewSource(spiffe.SourceConfig{ID: id, Signer: ca, Logger: log})
	if err != nil {
		ca.Close()
		return credentials{}, nil, err
	}
	xds, err := xdsclient.New(xdsclient.Config{
		Address:  cfg.XDSAddress,
		TLS:      &tls.Config{RootCAs: roots, ServerName: cfg.XDSSAN, MinVersion: tls.VersionTLS12},
		Node:     &discoverypb.Node{Id: fmt.Sprintf("waypoint~%s~%s.%s~%s.svc.cluster.local", cfg.InstanceIP, cfg.PodName, cfg.Namespace, cfg.Namespace)},
		Token:    token,
		Metadata: map[string]string{"clusterid": cfg.ClusterID},
		Subscriptions: []xdsclient.Subscription{
			{TypeURL: resource.ListenerType, Handle: store.ApplyListeners},
			{TypeURL: resource.RouteType, Handle: store.ApplyRoutes},
			{TypeURL: resource.ClusterType, Handle: store.ApplyClusters},
			{TypeURL: resource.EndpointType, Handle: store.ApplyEndpoints},
		},
		Logger: log,
	})
	if err != nil {
		ca.Close()
		return credentials{}, nil, err
	}
	return credentials{id: id.ID(), cert: src.Certificate, ready: src.Ready(), run: src.Run, close: func() { ca.Close() }}, xds, nil
}

// staticCredentials loads an SVID from PEM files.
func staticCredentials(certFile, keyFile string) (credentials, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return credentials{}, fmt.Errorf("reading the certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return credentials{}, fmt.Errorf("reading the private key: %w", err)
	}
	svid, err := parseSVID(certPEM, keyPEM)
	if err != nil {
		return credentials{}, fmt.Errorf("%s and %s: %w", certFile, keyFile, err)
	}
	ready := make(chan struct{})
	close(ready)
	return credentials{id: svid.ID.ID(), cert: spiffe.StaticCertificate(svid), ready: ready, close: func() {}}, nil
}

// parseSVID checks a PEM certificate chain (leaf first) and its key as an
// X.509-SVID.
func parseSVID(certPEM, keyPEM []byte) (*spiffe.SVID, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	chain := make([]*x509.Certificate, 0, len(pair.Certificate))
	for _, der := range pair.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		chain = append(chain, c)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("a %T private key cannot sign", pair.PrivateKey)
	}
	return spiffe.NewSVID(chain, key)
}
