// Package testpki issues X.509 certificates for tests and test clusters: a
// self-signed root, intermediates, and server and client leaves with DNS
// names, IP addresses or URI (SPIFFE) SANs. Every key is ECDSA P-256, made
// fresh in memory; serials are random.
//
// It is for tests only. Mesh identities come from internal/spiffe's CA and
// the webhook's serving certificate from webhook/servingcert; tests of those
// use them, and this package where they need certificates of their own (a
// client, an intermediate, a Kubernetes control plane).
package testpki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// Defaults for what a template leaves zero.
const (
	Backdate     = time.Hour                 // validity starts this long before now
	LeafLifetime = 365 * 24 * time.Hour      // a leaf's validity
	CALifetime   = 10 * 365 * 24 * time.Hour // a CA's validity
)

// Cert is a certificate and its private key. A CA certificate (IsCA) issues
// others.
type Cert struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewRoot makes a self-signed root CA whose common name is cn.
func NewRoot(cn string) (*Cert, error) {
	return issue(&x509.Certificate{Subject: pkix.Name{CommonName: cn}, IsCA: true}, nil)
}

// Issue signs, with c, a certificate made from tmpl and a fresh key; c must
// be a CA. It fills what tmpl leaves zero: a random serial; validity from
// Backdate ago for LeafLifetime (CALifetime for a CA), ending no later than
// c's own; key usage, certificate and CRL signing for a CA, digital
// signature otherwise. tmpl is not modified.
func (c *Cert) Issue(tmpl *x509.Certificate) (*Cert, error) {
	if !c.Cert.IsCA {
		return nil, fmt.Errorf("testpki: %q is not a CA", c.Cert.Subject.CommonName)
	}
	return issue(tmpl, c)
}

// Server issues a serving certificate (extended key usage serverAuth) for
// the DNS names and IP addresses.
func (c *Cert) Server(cn string, dns []string, ips []net.IP) (*Cert, error) {
	return c.Issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		DNSNames:    dns,
		IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// Client issues a client certificate (extended key usage clientAuth) whose
// common name is cn and organizations groups: Kubernetes reads them as the
// user and its groups.
func (c *Cert) Client(cn string, groups ...string) (*Cert, error) {
	return c.Issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// issue signs a copy of tmpl with parent, or self-signs it when parent is nil.
func issue(tmpl *x509.Certificate, parent *Cert) (*Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("testpki: generating a key: %w", err)
	}
	t := *tmpl
	if t.SerialNumber == nil {
		t.SerialNumber = serial()
	}
	now := time.Now()
	if t.NotBefore.IsZero() {
		t.NotBefore = now.Add(-Backdate)
	}
	if t.NotAfter.IsZero() {
		t.NotAfter = now.Add(LeafLifetime)
		if t.IsCA {
			t.NotAfter = now.Add(CALifetime)
		}
		if parent != nil && t.NotAfter.After(parent.Cert.NotAfter) {
			t.NotAfter = parent.Cert.NotAfter
		}
	}
	if t.KeyUsage == 0 {
		t.KeyUsage = x509.KeyUsageDigitalSignature
		if t.IsCA {
			t.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
		}
	}
	t.BasicConstraintsValid = true
	signer, issuer := crypto.Signer(key), &t
	if parent != nil {
		signer, issuer = parent.Key, parent.Cert
	}
	der, err := x509.CreateCertificate(rand.Reader, &t, issuer, key.Public(), signer)
	if err != nil {
		return nil, fmt.Errorf("testpki: signing %q: %w", t.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("testpki: parsing %q: %w", t.Subject.CommonName, err)
	}
	return &Cert{Cert: cert, Key: key}, nil
}

// serial returns a random positive serial of up to 127 bits.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic("testpki: reading randomness: " + err.Error()) // crypto/rand does not fail
	}
	return n
}

// CertPEM returns the certificate in PEM.
func (c *Cert) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Cert.Raw})
}

// KeyPEM returns the private key in PEM, as PKCS #8.
func (c *Cert) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(c.Key)
	if err != nil {
		return nil, fmt.Errorf("testpki: encoding the key of %q: %w", c.Cert.Subject.CommonName, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// WriteFiles writes the certificate and the key as PEM files, readable by
// their owner only.
func (c *Cert) WriteFiles(certFile, keyFile string) error {
	key, err := c.KeyPEM()
	if err != nil {
		return err
	}
	return errors.Join(os.WriteFile(certFile, c.CertPEM(), 0o600), os.WriteFile(keyFile, key, 0o600))
}

// TLS returns the certificate for a tls.Config.
func (c *Cert) TLS() *tls.Certificate {
	return &tls.Certificate{Certificate: [][]byte{c.Cert.Raw}, PrivateKey: c.Key, Leaf: c.Cert}
}
