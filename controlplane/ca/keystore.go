package ca

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/weftmesh/weft/internal/spiffe"
)

// Secret names and keys, Istio's, so that a plugged-in CA (cacerts) and a
// self-signed root (istio-ca-secret) made for Istio work unchanged.
const (
	DefaultSecretName       = "istio-ca-secret"
	DefaultPluginSecretName = "cacerts"

	keyCACert    = "ca-cert.pem"
	keyCAKey     = "ca-key.pem"
	keyCertChain = "cert-chain.pem"
	keyRootCert  = "root-cert.pem"

	secretType = "istio.io/ca-root"
)

// KeystoreConfig says where the CA's keys live.
type KeystoreConfig struct {
	// Namespace of the Secrets: the release namespace. Required.
	Namespace string
	// SecretName is the self-signed root the control plane creates on first
	// start. Default "istio-ca-secret".
	SecretName string
	// PluginSecretName is a user-supplied CA (keys ca-cert.pem, ca-key.pem,
	// cert-chain.pem, root-cert.pem); when it exists it is used instead.
	// Default "cacerts".
	PluginSecretName string
	// CA configures the CA (trust domain, TTLs).
	CA spiffe.CAConfig
	// Logger: default discard.
	Logger *slog.Logger
}

// LoadCA returns the mesh CA: the user's plugged-in CA if its Secret exists,
// else the self-signed root in SecretName, created on first start. When two
// replicas start together one creation wins and both use its root.
func LoadCA(ctx context.Context, secrets corev1client.SecretsGetter, cfg KeystoreConfig) (*spiffe.CA, error) {
	if cfg.Namespace == "" {
		return nil, errors.New("loading the CA: no namespace")
	}
	if cfg.SecretName == "" {
		cfg.SecretName = DefaultSecretName
	}
	if cfg.PluginSecretName == "" {
		cfg.PluginSecretName = DefaultPluginSecretName
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	api := secrets.Secrets(cfg.Namespace)
	plugged, err := api.Get(ctx, cfg.PluginSecretName, metav1.GetOptions{})
	switch {
	case err == nil:
		ca, err := loadPlugged(cfg.CA, plugged)
		if err != nil {
			return nil, fmt.Errorf("loading the CA from Secret %s/%s: %w", cfg.Namespace, cfg.PluginSecretName, err)
		}
		cfg.Logger.Info("using the plugged-in CA", "secret", cfg.Namespace+"/"+cfg.PluginSecretName)
		return ca, nil
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("loading the CA: reading Secret %s/%s: %w", cfg.Namespace, cfg.PluginSecretName, err)
	}
	for attempt := 0; ; attempt++ {
		s, err := api.Get(ctx, cfg.SecretName, metav1.GetOptions{})
		if err == nil {
			ca, err := spiffe.LoadCA(cfg.CA, s.Data[keyCACert], s.Data[keyCAKey])
			if err != nil {
				return nil, fmt.Errorf("loading the CA from Secret %s/%s: %w", cfg.Namespace, cfg.SecretName, err)
			}
			cfg.Logger.Info("using the self-signed mesh root", "secret", cfg.Namespace+"/"+cfg.SecretName)
			return ca, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("loading the CA: reading Secret %s/%s: %w", cfg.Namespace, cfg.SecretName, err)
		}
		if attempt > 0 {
			return nil, fmt.Errorf("loading the CA: Secret %s/%s was created and then disappeared", cfg.Namespace, cfg.SecretName)
		}
		ca, err := spiffe.NewCA(cfg.CA)
		if err != nil {
			return nil, fmt.Errorf("loading the CA: %w", err)
		}
		key, err := ca.KeyPEM()
		if err != nil {
			return nil, fmt.Errorf("loading the CA: %w", err)
		}
		_, err = api.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: cfg.SecretName, Namespace: cfg.Namespace,
				Labels: map[string]string{"app.kubernetes.io/part-of": "weft"}},
			Type: secretType,
			Data: map[string][]byte{keyCACert: ca.CertPEM(), keyCAKey: key, keyCertChain: {}, keyRootCert: {}},
		}, metav1.CreateOptions{})
		switch {
		case err == nil:
			cfg.Logger.Info("created the self-signed mesh root", "secret", cfg.Namespace+"/"+cfg.SecretName,
				"trust_domain", ca.TrustDomain().Name())
			return ca, nil
		case apierrors.IsAlreadyExists(err):
			// Another replica won the race: use its root.
			continue
		default:
			return nil, fmt.Errorf("loading the CA: creating Secret %s/%s: %w", cfg.Namespace, cfg.SecretName, err)
		}
	}
}

// loadPlugged loads a plugged-in CA: ca-cert.pem signs, cert-chain.pem (if
// any) leads from it to the root, root-cert.pem is the root.
func loadPlugged(cfg spiffe.CAConfig, s *corev1.Secret) (*spiffe.CA, error) {
	cert, key := s.Data[keyCACert], s.Data[keyCAKey]
	if len(cert) == 0 || len(key) == 0 {
		return nil, fmt.Errorf("the Secret must hold %s and %s", keyCACert, keyCAKey)
	}
	chain := bytes.TrimSpace(s.Data[keyCertChain])
	root := bytes.TrimSpace(s.Data[keyRootCert])
	var all []byte
	switch {
	case len(chain) > 0 && firstCertEqual(chain, cert):
		all = append(all, chain...)
	case len(chain) > 0:
		all = append(append(append(all, cert...), '\n'), chain...)
	default:
		all = append(all, cert...)
	}
	if len(root) > 0 && !lastCertEqual(all, root) {
		all = append(append(all, '\n'), root...)
	}
	return spiffe.LoadCA(cfg, all, key)
}

func certsOf(p []byte) [][]byte {
	var out [][]byte
	for {
		var b *pem.Block
		b, p = pem.Decode(p)
		if b == nil {
			return out
		}
		if b.Type == "CERTIFICATE" {
			out = append(out, b.Bytes)
		}
	}
}

func firstCertEqual(a, b []byte) bool {
	ca, cb := certsOf(a), certsOf(b)
	return len(ca) > 0 && len(cb) > 0 && bytes.Equal(ca[0], cb[0])
}

func lastCertEqual(a, b []byte) bool {
	ca, cb := certsOf(a), certsOf(b)
	return len(ca) > 0 && len(cb) > 0 && bytes.Equal(ca[len(ca)-1], cb[len(cb)-1])
}

// ServingCert is the control plane's own TLS certificate for port 15012,
// with DNS names, signed by the mesh CA and renewed at half its lifetime.
type ServingCert struct {
	ca       *spiffe.CA
	dnsNames []string
	ttl      time.Duration
	log      *slog.Logger
	cur      atomic.Pointer[tls.Certificate]
}

// DefaultServingTTL is the lifetime of the serving certificate.
const DefaultServingTTL = 30 * 24 * time.Hour

// NewServingCert issues the first serving certificate for dnsNames.
func NewServingCert(ca *spiffe.CA, dnsNames []string, ttl time.Duration, log *slog.Logger) (*ServingCert, error) {
	if len(dnsNames) == 0 {
		return nil, errors.New("issuing the serving certificate: no DNS names")
	}
	if ttl <= 0 {
		ttl = DefaultServingTTL
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &ServingCert{ca: ca, dnsNames: dnsNames, ttl: ttl, log: log}
	if err := s.renew(); err != nil {
		return nil, err
	}
	return s, nil
}

// GetCertificate is for tls.Config.GetCertificate.
func (s *ServingCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cur.Load(), nil
}

// Run renews the certificate at half its lifetime until ctx is done.
func (s *ServingCert) Run(ctx context.Context) error {
	for {
		leaf := s.cur.Load().Leaf
		wait := time.Until(leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2))
		t := time.NewTimer(max(wait, time.Minute))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if err := s.renew(); err != nil {
			s.log.Error("renewing the serving certificate failed; retrying in a minute", "error", err)
		}
	}
}

func (s *ServingCert) renew() error {
	issuerCerts := certsOf(s.ca.CertPEM())
	if len(issuerCerts) == 0 {
		return errors.New("issuing the serving certificate: the CA has no certificate")
	}
	issuer, err := x509.ParseCertificate(issuerCerts[0])
	if err != nil {
		return fmt.Errorf("issuing the serving certificate: %w", err)
	}
	keyPEM, err := s.ca.KeyPEM()
	if err != nil {
		return fmt.Errorf("issuing the serving certificate: %w", err)
	}
	caKey, err := spiffe.ParseKeyPEM(keyPEM)
	if err != nil {
		return fmt.Errorf("issuing the serving certificate: parsing the CA key: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("issuing the serving certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return fmt.Errorf("issuing the serving certificate: %w", err)
	}
	now := time.Now()
	notAfter := now.Add(s.ttl)
	if notAfter.After(issuer.NotAfter) {
		notAfter = issuer.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		DNSNames:              s.dnsNames,
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("issuing the serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("issuing the serving certificate: %w", err)
	}
	// The leaf and any intermediates; clients hold the root.
	chain := append([][]byte{der}, issuerCerts[:len(issuerCerts)-1]...)
	s.cur.Store(&tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf})
	s.log.Info("serving certificate issued", "dns_names", s.dnsNames, "not_after", notAfter.UTC())
	return nil
}
