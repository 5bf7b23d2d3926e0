package servingcert

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftmesh/weft/internal/spiffe"
)

// Keys of the Secret.
const (
	KeyCACert = "ca.crt" // trusted CAs, newest first: the caBundle
	KeyCAKey  = "ca.key" // key of the newest CA (self-managed mode only)
	KeyCert   = corev1.TLSCertKey
	KeyKey    = corev1.TLSPrivateKeyKey
)

// Mode says where the serving certificate comes from.
type Mode string

// Modes.
const (
	// SelfManaged: the webhook keeps its own CA and serving certificate in
	// the Secret, creating and rotating them.
	SelfManaged Mode = "self"
	// UserSupplied: the Secret holds tls.crt, tls.key and optionally ca.crt,
	// written by someone else (cert-manager, an operator); the webhook only
	// reads it.
	UserSupplied Mode = "secret"
)

// Secrets is the part of client-go's SecretInterface (for the webhook's
// namespace) the manager uses.
type Secrets interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error)
	Create(ctx context.Context, secret *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error)
	Update(ctx context.Context, secret *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error)
}

// Config configures a [Manager]. Zero fields take the defaults.
type Config struct {
	// Mode; default SelfManaged.
	Mode Mode
	// SecretName names the Secret in the webhook's namespace. Required.
	SecretName string
	// Namespace is the webhook's namespace, for messages.
	Namespace string
	// DNSNames the serving certificate carries (the Service's names);
	// required in SelfManaged mode.
	DNSNames []string
	// CAValidity and CertValidity are the lifetimes of a new CA and serving
	// certificate; defaults 10 years and 90 days. Either is renewed once less
	// than a third of its lifetime is left; a new CA joins the bundle while
	// the old one stays until it expires.
	CAValidity, CertValidity time.Duration
	// Interval is how often the Secret is read again, to renew and to pick
	// up another replica's renewal; default 1 minute.
	Interval time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer receives the manager's metrics; default none.
	Registerer prometheus.Registerer
}

// Defaults of [Config].
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultCertValidity = 90 * 24 * time.Hour
	DefaultInterval     = time.Minute
)

// Manager serves the webhook's TLS certificate from a Secret shared by the
// replicas.
type Manager struct {
	cfg     Config
	secrets Secrets
	log     *slog.Logger

	cur     atomic.Pointer[loaded]
	changed chan struct{} // one pending notification, to the registrar
	expiry  prometheus.Gauge
}

// loaded is what is being served.
type loaded struct {
	cert   *tls.Certificate
	bundle []byte // PEM CAs; nil when a user-supplied Secret has no ca.crt
}

// New returns a Manager; it reads nothing until Sync or Run.
func New(cfg Config, secrets Secrets) (*Manager, error) {
	if cfg.Mode == "" {
		cfg.Mode = SelfManaged
	}
	if cfg.Mode != SelfManaged && cfg.Mode != UserSupplied {
		return nil, fmt.Errorf("servingcert: unknown mode %q (want self or secret)", cfg.Mode)
	}
	if cfg.SecretName == "" {
		return nil, errors.New("servingcert: SecretName is required")
	}
	if cfg.Mode == SelfManaged && len(cfg.DNSNames) == 0 {
		return nil, errors.New("servingcert: DNSNames are required for a self-managed certificate")
	}
	if secrets == nil {
		return nil, errors.New("servingcert: a Secrets client is required")
	}
	if cfg.CAValidity <= 0 {
		cfg.CAValidity = DefaultCAValidity
	}
	if cfg.CertValidity <= 0 {
		cfg.CertValidity = DefaultCertValidity
	}
	if cfg.CertValidity > cfg.CAValidity {
		return nil, errors.New("servingcert: CertValidity must not exceed CAValidity")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Manager{
		cfg: cfg, secrets: secrets, log: cfg.Logger,
		changed: make(chan struct{}, 1),
		expiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weft_webhook_serving_cert_expiry_timestamp_seconds",
			Help: "When the serving certificate in use expires (Unix time).",
		}),
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(m.expiry); err != nil {
			return nil, fmt.Errorf("servingcert: registering metrics: %w", err)
		}
	}
	return m, nil
}

// GetCertificate is for tls.Config: the certificate being served.
func (m *Manager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if l := m.cur.Load(); l != nil {
		return l.cert, nil
	}
	return nil, errors.New("servingcert: no serving certificate loaded yet")
}

// CABundle returns the PEM CAs clients should trust, or nil if unknown
// (a user-supplied Secret without ca.crt).
func (m *Manager) CABundle() []byte {
	if l := m.cur.Load(); l != nil {
		return l.bundle
	}
	return nil
}

// Changed receives a value after the certificate or bundle changed.
func (m *Manager) Changed() <-chan struct{} { return m.changed }

// Ready reports whether a valid certificate is being served.
func (m *Manager) Ready() error {
	l := m.cur.Load()
	if l == nil {
		return errors.New("no serving certificate loaded yet")
	}
	if m.cfg.Now().After(l.cert.Leaf.NotAfter) {
		return errors.New("the serving certificate has expired")
	}
	return nil
}

// Run syncs now and then every Interval until ctx ends; failures are logged
// and retried sooner, with backoff.
func (m *Manager) Run(ctx context.Context) error {
	backoff := time.Second
	for {
		wait := m.cfg.Interval
		if err := m.Sync(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			m.log.Error("syncing the serving certificate", "secret", m.cfg.Namespace+"/"+m.cfg.SecretName, "error", err)
			wait, backoff = min(backoff, m.cfg.Interval), min(2*backoff, m.cfg.Interval)
		} else {
			backoff = time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Sync reads the Secret once, creating or renewing its content in
// SelfManaged mode, and loads it.
func (m *Manager) Sync(ctx context.Context) error {
	if m.cfg.Mode == UserSupplied {
		return m.syncSupplied(ctx)
	}
	// Each round reads the Secret; a lost create or update race (another
	// replica wrote first) starts a new round that adopts the winner's work.
	for range 5 {
		sec, err := m.secrets.Get(ctx, m.cfg.SecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			mat, err := m.fresh(m.cfg.Now())
			if err != nil {
				return err
			}
			data, err := mat.data()
			if err != nil {
				return err
			}
			_, err = m.secrets.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: m.cfg.SecretName, Namespace: m.cfg.Namespace,
					Labels: map[string]string{"app.kubernetes.io/managed-by": "weft-webhook"}},
				Type: corev1.SecretTypeOpaque,
				Data: data,
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("creating Secret %s: %w", m.secretRef(), err)
			}
			m.log.Info("created the webhook CA and serving certificate", "secret", m.secretRef(),
				"not_after", mat.chain[0].NotAfter)
			m.load(mat)
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading Secret %s: %w", m.secretRef(), err)
		}
		mat, perr := parseMaterial(sec.Data, true)
		next, why, err := m.plan(mat, perr, m.cfg.Now())
		if err != nil {
			return err
		}
		if next == nil {
			m.load(mat)
			return nil
		}
		data, err := next.data()
		if err != nil {
			return err
		}
		upd := sec.DeepCopy()
		upd.Data = data
		if _, err := m.secrets.Update(ctx, upd, metav1.UpdateOptions{}); apierrors.IsConflict(err) {
			continue
		} else if err != nil {
			return fmt.Errorf("updating Secret %s: %w", m.secretRef(), err)
		}
		m.log.Info("renewed the webhook certificates", "secret", m.secretRef(), "why", why,
			"not_after", next.chain[0].NotAfter, "cas", len(next.cas))
		m.load(next)
		return nil
	}
	return fmt.Errorf("the Secret %s kept changing under us; will retry", m.secretRef())
}

func (m *Manager) secretRef() string { return m.cfg.Namespace + "/" + m.cfg.SecretName }

func (m *Manager) syncSupplied(ctx context.Context) error {
	sec, err := m.secrets.Get(ctx, m.cfg.SecretName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the serving certificate Secret %s: %w", m.secretRef(), err)
	}
	mat, err := parseMaterial(sec.Data, false)
	if err != nil {
		return fmt.Errorf("the Secret %s: %w; it needs tls.crt and tls.key (and ca.crt for the caBundle)", m.secretRef(), err)
	}
	m.load(mat)
	return nil
}

// material is the content of the Secret.
type material struct {
	cas   []*x509.Certificate // newest first; may be empty for a user-supplied Secret
	caKey crypto.Signer       // key of cas[0]; nil for a user-supplied Secret
	chain []*x509.Certificate // serving certificate first
	key   crypto.Signer
}

func (mat *material) data() (map[string][]byte, error) {
	caKey, err := EncodeKey(mat.caKey)
	if err != nil {
		return nil, err
	}
	key, err := EncodeKey(mat.key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		KeyCACert: EncodeCerts(mat.cas...),
		KeyCAKey:  caKey,
		KeyCert:   EncodeCerts(mat.chain...),
		KeyKey:    key,
	}, nil
}

// parseMaterial reads a Secret's data; withCA requires the CA and its key.
// The result holds whatever parsed, even on error.
func parseMaterial(data map[string][]byte, withCA bool) (*material, error) {
	mat := &material{}
	var errs []error
	if len(data[KeyCACert]) > 0 || withCA {
		cas, err := spiffe.ParseCertsPEM(data[KeyCACert])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", KeyCACert, err))
		}
		mat.cas = cas
	}
	if withCA {
		k, err := spiffe.ParseKeyPEM(data[KeyCAKey])
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", KeyCAKey, err))
		case len(mat.cas) > 0 && !keyMatches(mat.cas[0], k):
			errs = append(errs, fmt.Errorf("%s is not the key of the first certificate of %s", KeyCAKey, KeyCACert))
		default:
			mat.caKey = k
		}
	}
	chain, err := spiffe.ParseCertsPEM(data[KeyCert])
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", KeyCert, err))
	}
	mat.chain = chain
	k, err := spiffe.ParseKeyPEM(data[KeyKey])
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("%s: %w", KeyKey, err))
	case len(chain) > 0 && !keyMatches(chain[0], k):
		errs = append(errs, fmt.Errorf("%s is not the key of %s", KeyKey, KeyCert))
	default:
		mat.key = k
	}
	return mat, errors.Join(errs...)
}

// fresh makes a new CA and serving certificate.
func (m *Manager) fresh(now time.Time) (*material, error) {
	ca, err := NewCA("weft-webhook-ca", now, m.cfg.CAValidity)
	if err != nil {
		return nil, err
	}
	cert, key, err := ca.Issue(m.cfg.DNSNames, now, m.cfg.CertValidity)
	if err != nil {
		return nil, err
	}
	return &material{cas: []*x509.Certificate{ca.Cert}, caKey: ca.Key, chain: []*x509.Certificate{cert}, key: key}, nil
}

// plan decides what the Secret should hold next; nil means keep it.
func (m *Manager) plan(mat *material, perr error, now time.Time) (*material, string, error) {
	caUsable := len(mat.cas) > 0 && mat.caKey != nil && now.Before(mat.cas[0].NotAfter)
	if !caUsable {
		why := "the CA expired"
		if perr != nil {
			why = "the Secret held no usable CA: " + perr.Error()
		}
		next, err := m.fresh(now)
		return next, why, err
	}
	next := &material{cas: mat.cas, caKey: mat.caKey, chain: mat.chain, key: mat.key}
	var whys []string
	if due(mat.cas[0], now) {
		ca, err := NewCA("weft-webhook-ca", now, m.cfg.CAValidity)
		if err != nil {
			return nil, "", err
		}
		next.cas = append([]*x509.Certificate{ca.Cert}, mat.cas...)
		next.caKey = ca.Key
		whys = append(whys, "the CA is due for renewal")
	}
	// Drop expired CAs; the newest always stays.
	kept := next.cas[:1:1]
	for _, c := range next.cas[1:] {
		if now.Before(c.NotAfter) {
			kept = append(kept, c)
		}
	}
	if len(kept) != len(next.cas) {
		whys = append(whys, "an old CA expired")
	}
	next.cas = kept

	if why := m.leafProblem(next, now); why != "" {
		ca := &CA{Cert: next.cas[0], Key: next.caKey}
		cert, key, err := ca.Issue(m.cfg.DNSNames, now, m.cfg.CertValidity)
		if err != nil {
			return nil, "", err
		}
		next.chain, next.key = []*x509.Certificate{cert}, key
		whys = append(whys, why)
	}
	if len(whys) == 0 {
		return nil, "", nil
	}
	return next, joinWhys(whys), nil
}

// leafProblem says why the serving certificate must be reissued, or "".
func (m *Manager) leafProblem(mat *material, now time.Time) string {
	if len(mat.chain) == 0 || mat.key == nil {
		return "the Secret held no usable serving certificate"
	}
	leaf := mat.chain[0]
	if !sameNames(leaf, m.cfg.DNSNames) {
		return "the Service's DNS names changed"
	}
	roots := x509.NewCertPool()
	for _, c := range mat.cas {
		roots.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return "the serving certificate does not verify: " + err.Error()
	}
	if due(leaf, now) {
		return "the serving certificate is due for renewal"
	}
	return ""
}

func joinWhys(whys []string) string {
	var b bytes.Buffer
	for i, w := range whys {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(w)
	}
	return b.String()
}

// load starts serving mat and tells the registrar if anything changed.
func (m *Manager) load(mat *material) {
	next := &loaded{cert: tlsCertificate(mat.chain, mat.key)}
	if len(mat.cas) > 0 {
		next.bundle = EncodeCerts(mat.cas...)
	}
	prev := m.cur.Load()
	if prev != nil && bytes.Equal(prev.cert.Leaf.Raw, next.cert.Leaf.Raw) && bytes.Equal(prev.bundle, next.bundle) {
		return
	}
	m.cur.Store(next)
	m.expiry.Set(float64(next.cert.Leaf.NotAfter.Unix()))
	select {
	case m.changed <- struct{}{}:
	default:
	}
}
