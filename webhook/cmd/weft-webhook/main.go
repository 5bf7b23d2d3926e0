// Command weft-webhook is Weft's admission webhook: it validates and
// defaults ambient configuration, reviews cross-namespace waypoint use, and
// writes one audit record per decision. Every setting is a flag whose default
// comes from the environment variable named in its help, so the chart sets
// env and a developer passes flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/weftmesh/weft/internal/envflag"
	"github.com/weftmesh/weft/internal/kubeclient"
	"github.com/weftmesh/weft/internal/logging"
	"github.com/weftmesh/weft/webhook"
	"github.com/weftmesh/weft/webhook/admit"
	"github.com/weftmesh/weft/webhook/audit"
	"github.com/weftmesh/weft/webhook/registration"
	"github.com/weftmesh/weft/webhook/servingcert"
)

// Config is every setting of the command.
type Config struct {
	// Addr and MonitoringAddr are the listeners; defaults :15017 and :15014.
	Addr, MonitoringAddr string
	// Namespace is the webhook's own (release) namespace. Required.
	Namespace string
	// PodName names this replica in audit records; default the hostname.
	PodName string
	// ServiceName is the webhook's Service, named in its certificate. Required.
	ServiceName string
	// ClusterDomain is the DNS suffix of Services; default cluster.local.
	ClusterDomain string
	// Network is the mesh's network, the only one a WorkloadEntry may
	// name; default "" (none).
	Network string
	// ValidatingConfiguration and MutatingConfiguration name the two
	// webhook configurations to keep patched. Required.
	ValidatingConfiguration, MutatingConfiguration string
	// FailurePolicy is reached after the self-check: Fail (default) or Ignore.
	FailurePolicy string
	// SelfCheckWebhook is the validating webhook that must deny the
	// self-check; default labels.validation.weft.dev.
	SelfCheckWebhook string
	// CertMode is self (default) or secret; CertSecret the Secret (required).
	CertMode, CertSecret string
	// CertValidity and CAValidity; defaults 90 days and 10 years.
	CertValidity, CAValidity time.Duration
	// AuditSink is stdout (default) or file.
	AuditSink string
	// AuditFile, AuditMaxBytes and AuditMaxBackups configure the file sink;
	// defaults /var/log/weft/audit.log, 100 MiB, 5.
	AuditFile       string
	AuditMaxBytes   int64
	AuditMaxBackups int
	// RootNamespace is the mesh root namespace; default Namespace.
	RootNamespace string
	// WaypointUserRole is the ClusterRole granting use on gateways, named in
	// denial messages; default weft-waypoint-user.
	WaypointUserRole string
	// LogFormat is json (default) or text; LogLevel debug, info (default),
	// warn or error.
	LogFormat, LogLevel string
	// Kubeconfig is for running outside a cluster; default in-cluster.
	Kubeconfig string
	// MaxConcurrentReviews and MaxInflightBytes bound the admission
	// requests handled at once; defaults 32 and 24 MiB (at least 6 MiB, the
	// largest body).
	MaxConcurrentReviews int
	MaxInflightBytes     int64
	// ClientAuth is none (default), if-given or require; ClientCAFile the
	// PEM bundle of the CAs that sign the API server's client certificate
	// (required unless none); ClientNames the allowed certificate names
	// (common name or DNS SAN), default any.
	ClientAuth   string
	ClientCAFile string
	ClientNames  []string
	// UnauthenticatedSARRate and UnauthenticatedSARBurst bound the
	// SubjectAccessReviews made for unauthenticated callers, per replica;
	// defaults 20 per second and 50.
	UnauthenticatedSARRate  float64
	UnauthenticatedSARBurst int
}

// Validate checks the settings.
func (c *Config) Validate() error {
	var errs []error
	for _, req := range []struct{ flag, value string }{
		{"--namespace", c.Namespace}, {"--service-name", c.ServiceName}, {"--cert-secret", c.CertSecret},
		{"--validating-configuration", c.ValidatingConfiguration}, {"--mutating-configuration", c.MutatingConfiguration},
	} {
		if req.value == "" {
			errs = append(errs, fmt.Errorf("%s is required", req.flag))
		}
	}
	if c.FailurePolicy != string(admissionregistrationv1.Fail) && c.FailurePolicy != string(admissionregistrationv1.Ignore) {
		errs = append(errs, fmt.Errorf("--failure-policy %q: want Fail or Ignore", c.FailurePolicy))
	}
	if c.CertMode != string(servingcert.SelfManaged) && c.CertMode != string(servingcert.UserSupplied) {
		errs = append(errs, fmt.Errorf("--cert-mode %q: want self or secret", c.CertMode))
	}
	if c.CertValidity <= 0 || c.CAValidity <= 0 || c.CertValidity > c.CAValidity {
		errs = append(errs, errors.New("--cert-validity and --ca-validity must be positive, the CA's the longer"))
	}
	switch c.AuditSink {
	case "stdout":
	case "file":
		if c.AuditFile == "" {
			errs = append(errs, errors.New("--audit-file is required with --audit-sink=file"))
		}
		if c.AuditMaxBytes <= 0 || c.AuditMaxBackups <= 0 {
			errs = append(errs, errors.New("--audit-max-size-mb and --audit-max-backups must be positive"))
		}
	default:
		errs = append(errs, fmt.Errorf("--audit-sink %q: want stdout or file", c.AuditSink))
	}
	switch webhook.ClientAuth(c.ClientAuth) {
	case webhook.ClientAuthNone:
	case webhook.ClientAuthIfGiven, webhook.ClientAuthRequire:
		if c.ClientCAFile == "" {
			errs = append(errs, fmt.Errorf("--client-ca-file is required with --client-auth=%s", c.ClientAuth))
		}
	default:
		errs = append(errs, fmt.Errorf("--client-auth %q: want none, if-given or require", c.ClientAuth))
	}
	if c.MaxConcurrentReviews <= 0 {
		errs = append(errs, errors.New("--max-concurrent-reviews must be positive"))
	}
	if c.MaxInflightBytes < webhook.DefaultMaxBodyBytes {
		errs = append(errs, fmt.Errorf("--max-inflight-mb must be at least %d: one review may be that large", webhook.DefaultMaxBodyBytes>>20))
	}
	if c.UnauthenticatedSARRate < 0 || c.UnauthenticatedSARBurst < 0 {
		errs = append(errs, errors.New("--unauthenticated-sar-rate and --unauthenticated-sar-burst must not be negative"))
	}
	if err := logging.Check(c.LogFormat, c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// parse reads flags, with defaults from the environment, into a Config.
func parse(args []string, getenv func(string) string) (Config, error) {
	e := envflag.New(getenv)
	var errs []error
	var c Config
	var maxMB, inflightMB int
	var clientNames string
	hostname, _ := os.Hostname()
	fs := flag.NewFlagSet("weft-webhook", flag.ContinueOnError)
	fs.StringVar(&c.Addr, "addr", e.String("ADDR", webhook.DefaultAddr), "admission listener, HTTPS (env ADDR)")
	fs.StringVar(&c.MonitoringAddr, "monitoring-addr", e.String("MONITORING_ADDR", webhook.DefaultMonitoringAddr), "metrics and readiness listener, HTTP (env MONITORING_ADDR)")
	fs.StringVar(&c.Namespace, "namespace", e.String("POD_NAMESPACE", ""), "the webhook's namespace (env POD_NAMESPACE)")
	fs.StringVar(&c.PodName, "pod-name", e.String("POD_NAME", hostname), "this replica's name in audit records (env POD_NAME)")
	fs.StringVar(&c.ServiceName, "service-name", e.String("SERVICE_NAME", ""), "the webhook's Service (env SERVICE_NAME)")
	fs.StringVar(&c.ClusterDomain, "cluster-domain", e.String("CLUSTER_DOMAIN", "cluster.local"), "DNS suffix of Services (env CLUSTER_DOMAIN)")
	fs.StringVar(&c.Network, "network", e.String("NETWORK", ""), "the mesh's network, the only one a WorkloadEntry may name (env NETWORK)")
	fs.StringVar(&c.ValidatingConfiguration, "validating-configuration", e.String("VALIDATING_CONFIGURATION", ""), "ValidatingWebhookConfiguration to patch (env VALIDATING_CONFIGURATION)")
	fs.StringVar(&c.MutatingConfiguration, "mutating-configuration", e.String("MUTATING_CONFIGURATION", ""), "MutatingWebhookConfiguration to patch (env MUTATING_CONFIGURATION)")
	fs.StringVar(&c.FailurePolicy, "failure-policy", e.String("FAILURE_POLICY", "Fail"), "failurePolicy once the webhook has proven it rejects: Fail or Ignore (env FAILURE_POLICY)")
	fs.StringVar(&c.SelfCheckWebhook, "self-check-webhook", e.String("SELF_CHECK_WEBHOOK", "labels.validation.weft.dev"), "validating webhook that must deny the self-check (env SELF_CHECK_WEBHOOK)")
	fs.StringVar(&c.CertMode, "cert-mode", e.String("CERT_MODE", "self"), "serving certificate: self (managed) or secret (user-supplied) (env CERT_MODE)")
	fs.StringVar(&c.CertSecret, "cert-secret", e.String("CERT_SECRET", ""), "Secret holding the serving certificate (env CERT_SECRET)")
	fs.DurationVar(&c.CertValidity, "cert-validity", e.Duration("CERT_VALIDITY", servingcert.DefaultCertValidity), "lifetime of a self-managed serving certificate (env CERT_VALIDITY)")
	fs.DurationVar(&c.CAValidity, "ca-validity", e.Duration("CA_VALIDITY", servingcert.DefaultCAValidity), "lifetime of a self-managed CA (env CA_VALIDITY)")
	fs.StringVar(&c.AuditSink, "audit-sink", e.String("AUDIT_SINK", "stdout"), "audit log: stdout or file (env AUDIT_SINK)")
	fs.StringVar(&c.AuditFile, "audit-file", e.String("AUDIT_FILE", "/var/log/weft/audit.log"), "audit log file for --audit-sink=file (env AUDIT_FILE)")
	fs.IntVar(&maxMB, "audit-max-size-mb", e.Int("AUDIT_MAX_SIZE_MB", 100), "rotate the audit file at this size (env AUDIT_MAX_SIZE_MB)")
	fs.IntVar(&c.AuditMaxBackups, "audit-max-backups", e.Int("AUDIT_MAX_BACKUPS", audit.DefaultMaxBackups), "rotated audit files kept (env AUDIT_MAX_BACKUPS)")
	fs.StringVar(&c.RootNamespace, "root-namespace", e.String("ROOT_NAMESPACE", ""), "mesh root namespace; default --namespace (env ROOT_NAMESPACE)")
	fs.StringVar(&c.WaypointUserRole, "waypoint-user-role", e.String("WAYPOINT_USER_ROLE", "weft-waypoint-user"), "ClusterRole granting use on gateways, for messages (env WAYPOINT_USER_ROLE)")
	fs.StringVar(&c.LogFormat, "log-format", e.String("LOG_FORMAT", "json"), "json or text (env LOG_FORMAT)")
	fs.StringVar(&c.LogLevel, "log-level", e.String("LOG_LEVEL", "info"), "debug, info, warn or error (env LOG_LEVEL)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", e.String("KUBECONFIG", ""), "kubeconfig outside a cluster; default in-cluster (env KUBECONFIG)")
	fs.IntVar(&c.MaxConcurrentReviews, "max-concurrent-reviews", e.Int("MAX_CONCURRENT_REVIEWS", webhook.DefaultMaxConcurrentReviews), "admission requests handled at once; more get 429 (env MAX_CONCURRENT_REVIEWS)")
	fs.IntVar(&inflightMB, "max-inflight-mb", e.Int("MAX_INFLIGHT_MB", webhook.DefaultInflightBodies*webhook.DefaultMaxBodyBytes>>20), "MiB of request bodies handled at once; more get 429 (env MAX_INFLIGHT_MB)")
	fs.StringVar(&c.ClientAuth, "client-auth", e.String("CLIENT_AUTH", string(webhook.ClientAuthNone)), "client certificates: none, if-given or require (env CLIENT_AUTH)")
	fs.StringVar(&c.ClientCAFile, "client-ca-file", e.String("CLIENT_CA_FILE", ""), "PEM CAs of accepted client certificates (env CLIENT_CA_FILE)")
	fs.StringVar(&clientNames, "client-names", e.String("CLIENT_NAMES", ""), "comma-separated names (CN or DNS SAN) a client certificate must carry one of; empty: any (env CLIENT_NAMES)")
	fs.Float64Var(&c.UnauthenticatedSARRate, "unauthenticated-sar-rate", e.Float("UNAUTHENTICATED_SAR_RATE", webhook.DefaultUnauthenticatedReviewsPerSecond), "SubjectAccessReviews per second for unauthenticated callers (env UNAUTHENTICATED_SAR_RATE)")
	fs.IntVar(&c.UnauthenticatedSARBurst, "unauthenticated-sar-burst", e.Int("UNAUTHENTICATED_SAR_BURST", webhook.DefaultUnauthenticatedReviewBurst), "burst of SubjectAccessReviews for unauthenticated callers (env UNAUTHENTICATED_SAR_BURST)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	c.AuditMaxBytes = int64(maxMB) << 20
	c.MaxInflightBytes = int64(inflightMB) << 20
	for _, n := range strings.Split(clientNames, ",") {
		if n = strings.TrimSpace(n); n != "" {
			c.ClientNames = append(c.ClientNames, n)
		}
	}
	if c.RootNamespace == "" {
		c.RootNamespace = c.Namespace
	}
	if err := errors.Join(append(errs, e.Err())...); err != nil {
		return c, err
	}
	return c, c.Validate()
}

func main() {
	cfg, err := parse(os.Args[1:], os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "weft-webhook:", err)
		os.Exit(2)
	}
	// The debug log goes to stderr: stdout is the audit log's default sink.
	log, err := logging.New(os.Stderr, cfg.LogFormat, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "weft-webhook:", err)
		os.Exit(2)
	}
	if err := run(cfg, log); err != nil {
		log.Error("webhook failed", "error", err)
		os.Exit(1)
	}
}

func run(cfg Config, log *slog.Logger) error {
	rc, err := kubeclient.Config(cfg.Kubeconfig, "weft-webhook")
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating the Kubernetes client: %w", err)
	}
	gw, err := gwclient.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating the Gateway API client: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Caches of what the rules read.
	kf := informers.NewSharedInformerFactory(kube, 0)
	gf := gwinformers.NewSharedInformerFactory(gw, 0)
	services, namespaces, gateways := kf.Core().V1().Services(), kf.Core().V1().Namespaces(), gf.Gateway().V1().Gateways()
	classes := gf.Gateway().V1().GatewayClasses()
	for _, inf := range []cache.SharedIndexInformer{services.Informer(), namespaces.Informer(), gateways.Informer(), classes.Informer()} {
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return fmt.Errorf("configuring an informer: %w", err)
		}
	}
	var synced atomic.Bool

	certs, err := servingcert.New(servingcert.Config{
		Mode:         servingcert.Mode(cfg.CertMode),
		SecretName:   cfg.CertSecret,
		Namespace:    cfg.Namespace,
		DNSNames:     dnsNames(cfg.ServiceName, cfg.Namespace, cfg.ClusterDomain),
		CAValidity:   cfg.CAValidity,
		CertValidity: cfg.CertValidity,
		Logger:       log,
		Registerer:   reg,
	}, kube.CoreV1().Secrets(cfg.Namespace))
	if err != nil {
		return err
	}

	sink, err := openSink(cfg, log)
	if err != nil {
		return err
	}
	listers := webhook.Listers{GatewayLister: gateways.Lister(), GatewayClassLister: classes.Lister(),
		ServiceLister: services.Lister(), NamespaceLister: namespaces.Lister()}
	access, err := webhook.NewAccessLimit(webhook.AccessReviews{Client: kube.AuthorizationV1().SubjectAccessReviews()},
		cfg.UnauthenticatedSARRate, cfg.UnauthenticatedSARBurst, reg)
	if err != nil {
		return err
	}
	adm, err := admit.New(admit.Config{
		Gateways: listers, Services: listers, Namespaces: listers,
		Access:           access,
		RootNamespace:    cfg.RootNamespace,
		WaypointUserRole: cfg.WaypointUserRole,
		ClusterDomain:    cfg.ClusterDomain,
		Network:          cfg.Network,
	})
	if err != nil {
		return err
	}
	srv, err := webhook.New(webhook.Config{
		Addr:                 cfg.Addr,
		MonitoringAddr:       cfg.MonitoringAddr,
		GetCertificate:       certs.GetCertificate,
		MaxConcurrentReviews: cfg.MaxConcurrentReviews,
		MaxInflightBytes:     cfg.MaxInflightBytes,
		ClientAuth:           webhook.ClientAuth(cfg.ClientAuth),
		ClientCAFile:         cfg.ClientCAFile,
		ClientNames:          cfg.ClientNames,
		Replica:              cfg.PodName,
		ReadyChecks: map[string]func() error{
			"serving certificate": certs.Ready,
			"caches": func() error {
				if !synced.Load() {
					return errors.New("the Gateway, Service and Namespace caches are not synced yet")
				}
				return nil
			},
		},
		Registry: reg,
		Logger:   log,
	}, adm, sink)
	if err != nil {
		return err
	}
	reg1 := kube.AdmissionregistrationV1()
	registrar, err := registration.New(registration.Config{
		ValidatingName:   cfg.ValidatingConfiguration,
		MutatingName:     cfg.MutatingConfiguration,
		FailurePolicy:    admissionregistrationv1.FailurePolicyType(cfg.FailurePolicy),
		SelfCheckWebhook: cfg.SelfCheckWebhook,
		Logger:           log,
		Registerer:       reg,
	}, reg1.ValidatingWebhookConfigurations(), reg1.MutatingWebhookConfigurations(), kube.CoreV1().Namespaces(), certs, srv.Ready)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		kf.Start(ctx.Done())
		gf.Start(ctx.Done())
		defer gf.Shutdown()
		defer kf.Shutdown()
		ok := true
		for typ, done := range kf.WaitForCacheSync(ctx.Done()) {
			if !done {
				ok = false
				log.Error("cache not synced", "type", typ.String())
			}
		}
		for typ, done := range gf.WaitForCacheSync(ctx.Done()) {
			if !done {
				ok = false
				log.Error("cache not synced (are the Gateway API CRDs installed?)", "type", typ.String())
			}
		}
		synced.Store(ok && ctx.Err() == nil)
		<-ctx.Done()
		return nil
	})
	g.Go(func() error { return certs.Run(ctx) })
	g.Go(func() error {
		err := srv.Run(ctx)
		if cerr := sink.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing the audit log: %w", cerr)
		}
		return err
	})
	g.Go(func() error { return registrar.Run(ctx) })
	log.Info("weft-webhook starting", "namespace", cfg.Namespace, "replica", cfg.PodName, "audit_sink", cfg.AuditSink,
		"cert_mode", cfg.CertMode, "failure_policy", cfg.FailurePolicy, "client_auth", cfg.ClientAuth)
	return g.Wait()
}

// stripManagedFields drops what the rules never read from cached objects.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

func openSink(cfg Config, log *slog.Logger) (audit.Sink, error) {
	if cfg.AuditSink == "stdout" {
		return audit.NewWriter(os.Stdout), nil
	}
	s, err := audit.OpenFile(audit.FileConfig{
		Path: cfg.AuditFile, MaxBytes: cfg.AuditMaxBytes, MaxBackups: cfg.AuditMaxBackups,
		OnRotateError: func(err error) { log.Error("rotating the audit log; still appending", "error", err) },
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// dnsNames are the names the API server may use for the Service.
func dnsNames(service, namespace, domain string) []string {
	return []string{
		service + "." + namespace + ".svc",
		service + "." + namespace + ".svc." + strings.TrimSuffix(domain, "."),
		service + "." + namespace,
		service,
	}
}
