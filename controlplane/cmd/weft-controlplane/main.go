// Command weft-controlplane is Weft's control plane: the mesh CA, workload
// discovery over delta xDS and L4 authorization policy for ztunnel and
// waypoints. Every setting is a flag; each flag's default comes from the
// environment variable named in its help (Istio's name where istiod has
// one), so the chart sets env and a developer passes flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	istioclient "istio.io/client-go/pkg/clientset/versioned"
	"k8s.io/client-go/kubernetes"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/controlplane"
	"github.com/weftmesh/weft/controlplane/ca"
	"github.com/weftmesh/weft/internal/envflag"
	"github.com/weftmesh/weft/internal/kubeclient"
	"github.com/weftmesh/weft/internal/logging"
	"github.com/weftmesh/weft/internal/spiffe"
)

// options are the command's settings beyond controlplane.Config.
type options struct {
	kubeconfig string
	logFormat  string
	logLevel   string
	qps        float64
	burst      int
}

func main() {
	cfg, opts, err := parse(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "weft-controlplane:", err)
		os.Exit(2)
	}
	log, err := logging.New(os.Stderr, opts.logFormat, opts.logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "weft-controlplane:", err)
		os.Exit(2)
	}
	if err := run(cfg, opts, log); err != nil {
		log.Error("control plane failed", "error", err)
		os.Exit(1)
	}
}

func run(cfg controlplane.Config, opts options, log *slog.Logger) error {
	rc, err := kubeclient.Config(opts.kubeconfig, "weft-controlplane")
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = float32(opts.qps), opts.burst
	var clients controlplane.Clients
	if clients.Kube, err = kubernetes.NewForConfig(rc); err != nil {
		return fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	if clients.Istio, err = istioclient.NewForConfig(rc); err != nil {
		return fmt.Errorf("creating the Istio API client: %w", err)
	}
	if clients.Gateway, err = gwclient.NewForConfig(rc); err != nil {
		return fmt.Errorf("creating the Gateway API client: %w", err)
	}
	cp, err := controlplane.New(cfg, clients, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return cp.Run(ctx)
}

// parse reads flags, with defaults from the environment, into a validated
// Config.
func parse(args []string, getenv func(string) string) (controlplane.Config, options, error) {
	var cfg controlplane.Config
	var opts options
	fs := flag.NewFlagSet("weft-controlplane", flag.ContinueOnError)
	e := envflag.New(getenv)
	var trusted, extraDNS string
	var xdsAuth, waypoints, ingress bool
	fs.StringVar(&cfg.Namespace, "namespace", e.String("POD_NAMESPACE", ""), "release namespace (env POD_NAMESPACE)")
	fs.StringVar(&cfg.ServiceName, "service-name", e.String("SERVICE_NAME", "weft-controlplane"), "the control plane's Service, named in its certificate (env SERVICE_NAME)")
	fs.StringVar(&extraDNS, "extra-dns-names", e.String("EXTRA_DNS_NAMES", ""), "comma-separated extra DNS names for the serving certificate (env EXTRA_DNS_NAMES)")
	fs.StringVar(&cfg.TrustDomain, "trust-domain", e.String("TRUST_DOMAIN", "cluster.local"), "SPIFFE trust domain (env TRUST_DOMAIN)")
	fs.StringVar(&cfg.ClusterID, "cluster-id", e.String("CLUSTER_ID", "Kubernetes"), "cluster name in workload uids (env CLUSTER_ID)")
	fs.StringVar(&cfg.ClusterDomain, "cluster-domain", e.String("CLUSTER_DOMAIN", "cluster.local"), "DNS suffix of Service hostnames (env CLUSTER_DOMAIN)")
	fs.StringVar(&cfg.Network, "network", e.String("NETWORK", ""), "network of every workload (env NETWORK)")
	fs.StringVar(&cfg.RootNamespace, "root-namespace", e.String("ROOT_NAMESPACE", ""), "namespace of mesh-wide policies; default the release namespace (env ROOT_NAMESPACE)")
	fs.StringVar(&cfg.PathNormalization, "path-normalization", e.String("PATH_NORMALIZATION", "BASE"), "how waypoints normalize request paths before policy and routing: NONE, BASE, MERGE_SLASHES or DECODE_AND_MERGE_SLASHES (env PATH_NORMALIZATION)")
	fs.StringVar(&trusted, "trusted-node-accounts", e.String("CA_TRUSTED_NODE_ACCOUNTS", ""), "comma-separated <namespace>/<service account> of node proxies (they may request their pods' identities and are the only callers served workload discovery); default <namespace>/ztunnel (env CA_TRUSTED_NODE_ACCOUNTS)")
	fs.StringVar(&cfg.TokenAudience, "token-audience", e.String("TOKEN_AUDIENCE", "istio-ca"), "audience of callers' tokens (env TOKEN_AUDIENCE)")
	fs.DurationVar(&cfg.TokenReviewCacheTTL, "token-review-cache", e.Duration("TOKEN_REVIEW_CACHE", 10*time.Second), "reuse a TokenReview for the same token this long; negative disables (env TOKEN_REVIEW_CACHE)")
	fs.DurationVar(&cfg.TokenReviewFailureCacheTTL, "token-review-failure-cache", e.Duration("TOKEN_REVIEW_FAILURE_CACHE", 5*time.Second), "refuse a token the API refused again for this long without asking; negative disables (env TOKEN_REVIEW_FAILURE_CACHE)")
	lim := &cfg.CALimits
	fs.IntVar(&lim.MaxInFlight, "ca-max-in-flight", e.Int("CA_MAX_IN_FLIGHT", ca.DefaultMaxInFlight), "certificate requests in progress at once; -1: no limit (env CA_MAX_IN_FLIGHT)")
	fs.Float64Var(&lim.Rate, "ca-rate", e.Float("CA_RATE", ca.DefaultRate), "certificate requests per second; -1: no limit (env CA_RATE)")
	fs.IntVar(&lim.Burst, "ca-burst", e.Int("CA_BURST", ca.DefaultBurst), "certificate requests at once above the rate (env CA_BURST)")
	fs.IntVar(&lim.PerCallerMaxInFlight, "ca-caller-max-in-flight", e.Int("CA_CALLER_MAX_IN_FLIGHT", ca.DefaultPerCallerMaxInFlight), "one caller pod's certificate requests in progress; -1: no limit (env CA_CALLER_MAX_IN_FLIGHT)")
	fs.Float64Var(&lim.PerCallerRate, "ca-caller-rate", e.Float("CA_CALLER_RATE", ca.DefaultPerCallerRate), "one caller pod's certificate requests per second; -1: no limit (env CA_CALLER_RATE)")
	fs.IntVar(&lim.PerCallerBurst, "ca-caller-burst", e.Int("CA_CALLER_BURST", ca.DefaultPerCallerBurst), "one caller pod's burst above its rate (env CA_CALLER_BURST)")
	fs.BoolVar(&xdsAuth, "xds-auth", e.Bool("XDS_AUTH", true), "require a token on TLS xDS streams (env XDS_AUTH)")
	fs.DurationVar(&cfg.DefaultCertTTL, "default-cert-ttl", e.Duration("DEFAULT_WORKLOAD_CERT_TTL", 24*time.Hour), "workload certificate lifetime when none is asked (env DEFAULT_WORKLOAD_CERT_TTL)")
	fs.DurationVar(&cfg.MaxCertTTL, "max-cert-ttl", e.Duration("MAX_WORKLOAD_CERT_TTL", spiffe.DefaultMaxCertTTL), "longest workload certificate, at most 90 days (env MAX_WORKLOAD_CERT_TTL)")
	fs.StringVar(&cfg.CASecret, "ca-secret", e.String("CA_SECRET", "istio-ca-secret"), "Secret of the self-signed root (env CA_SECRET)")
	fs.StringVar(&cfg.PluginCASecret, "plugin-ca-secret", e.String("PLUGIN_CA_SECRET", "cacerts"), "Secret of a user-supplied CA, used when it exists (env PLUGIN_CA_SECRET)")
	fs.StringVar(&cfg.SecureAddr, "secure-addr", e.String("SECURE_ADDR", ":15012"), "CA and xDS over TLS (env SECURE_ADDR)")
	fs.StringVar(&cfg.PlaintextAddr, "plaintext-addr", e.String("PLAINTEXT_ADDR", ""), "plaintext xDS, e.g. :15010; empty disables (env PLAINTEXT_ADDR)")
	fs.StringVar(&cfg.MonitorAddr, "monitor-addr", e.String("MONITOR_ADDR", ":15014"), "/ready, /metrics, /debug (env MONITOR_ADDR)")
	fs.DurationVar(&cfg.MaxConnectionAge, "keepalive-max-server-connection-age", e.Duration("KEEPALIVE_MAX_SERVER_CONNECTION_AGE", controlplane.DefaultMaxConnectionAge), "tell a client's gRPC connection GOAWAY after about this long, so that clients spread over the replicas again; its xDS stream ends 10s later and reconnects; 0 or negative: never (env KEEPALIVE_MAX_SERVER_CONNECTION_AGE)")
	fs.DurationVar(&cfg.DebounceQuiet, "debounce-quiet", e.Duration("PILOT_DEBOUNCE_AFTER", 10*time.Millisecond), "push once no change arrived for this long (env PILOT_DEBOUNCE_AFTER)")
	fs.DurationVar(&cfg.DebounceMax, "debounce-max", e.Duration("PILOT_DEBOUNCE_MAX", 100*time.Millisecond), "push at most this long after a change (env PILOT_DEBOUNCE_MAX)")
	fs.BoolVar(&waypoints, "waypoints", e.Bool("PILOT_ENABLE_AMBIENT_WAYPOINTS", true), "watch Gateways for waypoints (env PILOT_ENABLE_AMBIENT_WAYPOINTS)")
	fs.BoolVar(&ingress, "ingress-gateways", e.Bool("INGRESS_GATEWAYS", true), "configure and deploy Gateways of class istio as ingress gateways, reading the TLS Secrets they name; needs --waypoints (env INGRESS_GATEWAYS)")
	fs.StringVar(&cfg.WaypointImage, "waypoint-image", e.String("WEFT_WAYPOINT_IMAGE", ""), "image of the waypoints to deploy for Gateways of class istio-waypoint; empty deploys none (env WEFT_WAYPOINT_IMAGE)")
	fs.StringVar(&opts.kubeconfig, "kubeconfig", e.String("KUBECONFIG", ""), "kubeconfig; default the in-cluster configuration (env KUBECONFIG)")
	fs.StringVar(&opts.logFormat, "log-format", e.String("LOG_FORMAT", "json"), "json or text (env LOG_FORMAT)")
	fs.StringVar(&opts.logLevel, "log-level", e.String("LOG_LEVEL", "info"), "debug, info, warn or error (env LOG_LEVEL)")
	fs.Float64Var(&opts.qps, "kube-qps", 50, "API request rate")
	fs.IntVar(&opts.burst, "kube-burst", 100, "API request burst")
	if err := fs.Parse(args); err != nil {
		return cfg, opts, err
	}
	if fs.NArg() > 0 {
		return cfg, opts, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := e.Err(); err != nil {
		return cfg, opts, err
	}
	if cfg.MaxConnectionAge == 0 {
		cfg.MaxConnectionAge = -1 // asked for: never (0 in Config is the default)
	}
	cfg.TrustedNodeAccounts = splitList(trusted)
	cfg.ExtraDNSNames = splitList(extraDNS)
	cfg.XDSAuth, cfg.Waypoints, cfg.IngressGateways = &xdsAuth, &waypoints, &ingress
	if err := cfg.Validate(); err != nil {
		return cfg, opts, err
	}
	return cfg, opts, nil
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
