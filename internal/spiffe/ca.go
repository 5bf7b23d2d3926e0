package spiffe

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

const (
	// DefaultCertTTL is the lifetime of a workload certificate when the caller
	// asks for none, as Istio's DEFAULT_WORKLOAD_CERT_TTL.
	DefaultCertTTL = 24 * time.Hour
	// DefaultMaxCertTTL is the longest workload certificate the CA issues
	// unless configured otherwise; a longer request gets this lifetime. It is
	// a week, not Istio's 90 days: no certificate is ever revoked, so this is
	// how long a certificate obtained by a compromised node (or a stolen key)
	// stays good after the node is cleaned up. Holders ask for 24h and renew
	// at half-life, so a week only serves clients that ask for more.
	DefaultMaxCertTTL = 7 * 24 * time.Hour
	// CeilingCertTTL is the highest MaxTTL may be set to, Istio's default
	// MAX_WORKLOAD_CERT_TTL.
	CeilingCertTTL = 90 * 24 * time.Hour
	// rootTTL is the lifetime of the root NewCA generates.
	rootTTL = 10 * 365 * 24 * time.Hour
	// clockSkew backdates NotBefore so that peers whose clocks lag a little
	// accept a certificate as soon as it is issued.
	clockSkew = time.Minute
	// serialBits is the size of the random serial numbers the CA assigns.
	serialBits = 128
)

// Signer obtains a signed certificate chain, leaf first, for a PEM CSR: the CA
// in-process, or the control plane's CA service over gRPC. ttl is the lifetime
// asked for; 0 lets the CA decide.
type Signer interface {
	SignCSR(ctx context.Context, csrPEM []byte, id Identity, ttl time.Duration) ([]*x509.Certificate, error)
}

var _ Signer = (*CA)(nil)

// CAConfig configures a CA.
type CAConfig struct {
	// TrustDomain is the trust domain the CA issues identities in. Default
	// DefaultTrustDomain (cluster.local).
	TrustDomain spiffeid.TrustDomain
	// DefaultTTL is the lifetime of a certificate when the request asks for
	// none (ttl <= 0). Default 24h.
	DefaultTTL time.Duration
	// MaxTTL caps the lifetime of every certificate. Default 7 days; at most
	// CeilingCertTTL (90 days).
	MaxTTL time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// withDefaults returns cfg with its defaults applied, or an error if it is
// inconsistent.
func (cfg CAConfig) withDefaults() (CAConfig, error) {
	if cfg.TrustDomain.IsZero() {
		cfg.TrustDomain = DefaultTrustDomain
	}
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL = DefaultCertTTL
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = DefaultMaxCertTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	switch {
	case cfg.DefaultTTL < 0:
		return cfg, fmt.Errorf("DefaultTTL %v is negative", cfg.DefaultTTL)
	case cfg.MaxTTL < 0:
		return cfg, fmt.Errorf("MaxTTL %v is negative", cfg.MaxTTL)
	case cfg.MaxTTL > CeilingCertTTL:
		return cfg, fmt.Errorf("MaxTTL %v is above %v", cfg.MaxTTL, CeilingCertTTL)
	case cfg.DefaultTTL > cfg.MaxTTL:
		return cfg, fmt.Errorf("DefaultTTL %v is longer than MaxTTL %v", cfg.DefaultTTL, cfg.MaxTTL)
	}
	return cfg, nil
}

// CA signs workload certificates (X.509-SVIDs) in one trust domain. It is safe
// for concurrent use; nothing in it changes after construction.
type CA struct {
	cfg CAConfig
	key crypto.Signer
	// chain is the issuing certificate first and the self-signed root last;
	// for a root CA it is just the root.
	chain []*x509.Certificate
	// notAfter is the earliest expiry in chain: no leaf outlives it.
	notAfter time.Time
}

// NewCA generates a CA with a fresh self-signed ECDSA P-256 root valid for ten
// years. Persist it with CertPEM and KeyPEM and reload it with LoadCA.
func NewCA(cfg CAConfig) (*CA, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("creating CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("creating CA: generating key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("creating CA: %w", err)
	}
	now := cfg.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{cfg.TrustDomain.Name()}},
		// A signing certificate should itself be an SVID whose SPIFFE ID is
		// its trust domain, with no path (X509-SVID §3.2).
		URIs:                  []*url.URL{cfg.TrustDomain.ID().URL()},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(rootTTL),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("creating CA: self-signing root: %w", err)
	}
	root, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("creating CA: parsing root: %w", err)
	}
	return &CA{cfg: cfg, key: key, chain: []*x509.Certificate{root}, notAfter: root.NotAfter}, nil
}

// LoadCA loads a CA from a user-supplied signing certificate and its key. The
// certificate is a root or an intermediate; certPEM holds it first, then any
// further intermediates and last the self-signed root. The key is PEM PKCS #8,
// SEC 1 ("EC PRIVATE KEY") or PKCS #1 ("RSA PRIVATE KEY") and must match the
// first certificate. The chain must be valid now.
func LoadCA(cfg CAConfig, certPEM, keyPEM []byte) (*CA, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("loading CA: %w", err)
	}
	chain, err := ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("loading CA: certificate: %w", err)
	}
	key, err := ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading CA: key: %w", err)
	}
	if err := checkSigningChain(chain, key, cfg.Now()); err != nil {
		return nil, fmt.Errorf("loading CA: %w", err)
	}
	notAfter := chain[0].NotAfter
	for _, c := range chain[1:] {
		if c.NotAfter.Before(notAfter) {
			notAfter = c.NotAfter
		}
	}
	return &CA{cfg: cfg, key: key, chain: chain, notAfter: notAfter}, nil
}

// TrustDomain returns the trust domain the CA issues identities in.
func (ca *CA) TrustDomain() spiffeid.TrustDomain { return ca.cfg.TrustDomain }

// CertPEM returns the CA's certificate chain, signing certificate first and
// root last, as LoadCA reads it.
func (ca *CA) CertPEM() []byte { return encodeCertsPEM(ca.chain) }

// KeyPEM returns the CA's private key as PEM PKCS #8.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, fmt.Errorf("encoding CA key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// RootsPEM returns the trust anchors workloads verify peers with (what Istio
// distributes as the istio-ca-root-cert ConfigMap).
func (ca *CA) RootsPEM() []byte { return encodeCertsPEM(ca.chain[len(ca.chain)-1:]) }

// Roots returns a new pool holding the CA's trust anchors.
func (ca *CA) Roots() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.chain[len(ca.chain)-1])
	return pool
}

// ParseRoots parses PEM trust anchors, such as RootsPEM or the root-cert.pem
// of Istio's istio-ca-root-cert ConfigMap, into a pool for ServerConfig and
// ClientConfig. Several roots may be concatenated (during a root rotation);
// each must be a CA certificate.
func ParseRoots(rootsPEM []byte) (*x509.CertPool, error) {
	certs, err := ParseCertsPEM(rootsPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing trust roots: %w", err)
	}
	pool := x509.NewCertPool()
	for i, c := range certs {
		if !c.BasicConstraintsValid || !c.IsCA {
			return nil, fmt.Errorf("parsing trust roots: certificate %d (%s) is not a CA certificate", i, c.Subject)
		}
		pool.AddCert(c)
	}
	return pool, nil
}

// Sign issues a workload certificate for id to the public key of a CSR (DER;
// PEM is accepted too). It verifies the CSR's signature and ignores everything
// in it except the public key, which must be ECDSA P-256 or RSA of 2048 to
// 4096 bits. The leaf has:
//
//   - an empty subject and a critical SAN extension holding exactly one URI, id;
//   - key usage digitalSignature (and keyEncipherment for RSA keys), extended
//     key usages serverAuth and clientAuth, and cA=false;
//   - NotBefore one minute in the past (clock skew) and NotAfter ttl from now,
//     where ttl <= 0 means the configured DefaultTTL, a ttl above MaxTTL is cut
//     to MaxTTL, and no leaf outlives the CA's own chain;
//   - a random 128-bit serial number.
//
// The chain returned is the leaf first, then the CA's chain with the root last,
// as Istio's CA returns it.
func (ca *CA) Sign(csrDER []byte, id Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	csr, err := ParseCSR(csrDER)
	if err != nil {
		return nil, fmt.Errorf("signing certificate for %s: %w", id, err)
	}
	chain, err := ca.sign(csr.PublicKey, id, ttl)
	if err != nil {
		return nil, fmt.Errorf("signing certificate for %s: %w", id, err)
	}
	return chain, nil
}

// SignRequest is Sign for a CSR its caller has parsed already (and checked
// nothing else of): it checks the CSR's signature, then issues as Sign does.
func (ca *CA) SignRequest(csr *x509.CertificateRequest, id Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("signing certificate for %s: the CSR's signature does not verify with its own public key: %w", id, err)
	}
	chain, err := ca.sign(csr.PublicKey, id, ttl)
	if err != nil {
		return nil, fmt.Errorf("signing certificate for %s: %w", id, err)
	}
	return chain, nil
}

// SignCSR is Sign for a PEM CSR, so that *CA is a Signer.
func (ca *CA) SignCSR(ctx context.Context, csrPEM []byte, id Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("signing certificate for %s: %w", id, err)
	}
	return ca.Sign(csrPEM, id, ttl)
}

// IssueSVID generates a P-256 key and issues a certificate for it: a
// convenience for tests and for the control plane's own identity.
func (ca *CA) IssueSVID(id Identity, ttl time.Duration) (*SVID, error) {
	key, csr, err := NewCSR(id)
	if err != nil {
		return nil, fmt.Errorf("issuing SVID for %s: %w", id, err)
	}
	chain, err := ca.Sign(csr, id, ttl)
	if err != nil {
		return nil, fmt.Errorf("issuing SVID for %s: %w", id, err)
	}
	return NewSVID(chain, key)
}

func (ca *CA) sign(pub crypto.PublicKey, id Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	tmpl, err := ca.leafTemplate(pub, id, ttl)
	if err != nil {
		return nil, err
	}
	der, err := ca.createLeaf(tmpl, pub)
	if err != nil {
		return nil, fmt.Errorf("creating certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing the new certificate: %w", err)
	}
	return append([]*x509.Certificate{leaf}, ca.chain...), nil
}

// leafTemplate checks a request and describes the certificate Sign issues
// for it.
func (ca *CA) leafTemplate(pub crypto.PublicKey, id Identity, ttl time.Duration) (*x509.Certificate, error) {
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("invalid identity: %w", err)
	}
	if id.TrustDomain != ca.cfg.TrustDomain {
		return nil, fmt.Errorf("identity is in trust domain %s, but this CA issues identities in %s", id.TrustDomain, ca.cfg.TrustDomain)
	}
	if err := checkKey(pub); err != nil {
		return nil, fmt.Errorf("CSR public key: %w", err)
	}
	switch {
	case ttl <= 0:
		ttl = ca.cfg.DefaultTTL
	case ttl > ca.cfg.MaxTTL:
		ttl = ca.cfg.MaxTTL
	}
	now := ca.cfg.Now()
	notAfter := now.Add(ttl)
	if notAfter.After(ca.notAfter) {
		notAfter = ca.notAfter
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("the CA certificate chain expired at %s; rotate the CA", ca.notAfter.UTC().Format(time.RFC3339))
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	san, err := uriSANExtension(id.String())
	if err != nil {
		return nil, err
	}
	usage := x509.KeyUsageDigitalSignature
	if _, ok := pub.(*rsa.PublicKey); ok {
		usage |= x509.KeyUsageKeyEncipherment
	}
	return &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              usage,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		ExtraExtensions:       []pkix.Extension{san},
	}, nil
}

// checkSigningChain checks that chain is a signing certificate for key, then
// the certificates that lead to a self-signed root, valid at now.
func checkSigningChain(chain []*x509.Certificate, key crypto.Signer, now time.Time) error {
	issuer := chain[0]
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(issuer.PublicKey) {
		return errors.New("the key does not belong to the first certificate")
	}
	if !issuer.BasicConstraintsValid || !issuer.IsCA {
		return errors.New("the first certificate is not a CA certificate (basic constraints cA=false)")
	}
	if issuer.KeyUsage != 0 && issuer.KeyUsage&x509.KeyUsageCertSign == 0 {
		return errors.New("the first certificate's key usage does not allow signing certificates (keyCertSign)")
	}
	for i := 0; i+1 < len(chain); i++ {
		if err := chain[i].CheckSignatureFrom(chain[i+1]); err != nil {
			return fmt.Errorf("certificate %d (%s) is not signed by certificate %d (%s); order the chain signing certificate first, root last: %w",
				i, chain[i].Subject, i+1, chain[i+1].Subject, err)
		}
	}
	root := chain[len(chain)-1]
	if !isSelfSigned(root) {
		return fmt.Errorf("the last certificate (%s) is not a self-signed root; append the root certificate to the chain", root.Subject)
	}
	roots := x509.NewCertPool()
	roots.AddCert(root)
	inter := x509.NewCertPool()
	for i := 1; i < len(chain)-1; i++ {
		inter.AddCert(chain[i])
	}
	_, err := issuer.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Errorf("verifying the CA chain: %w", err)
	}
	return nil
}

// isSelfSigned reports whether c is a self-signed certificate.
func isSelfSigned(c *x509.Certificate) bool {
	return bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil
}

// randomSerial returns a random positive serial number of up to 128 bits
// (RFC 5280 §4.1.2.2 allows up to 20 octets).
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), serialBits)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("generating serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

func encodeCertsPEM(certs []*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&buf, &pem.Block{Type: pemCert, Bytes: c.Raw}) // writes to a bytes.Buffer do not fail
	}
	return buf.Bytes()
}
