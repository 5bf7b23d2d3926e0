package spiffe

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// SVID is a workload certificate (an X.509-SVID) with its private key.
type SVID struct {
	// ID is the identity in the leaf's URI SAN.
	ID Identity
	// Chain is the leaf first, then any intermediates; the root may be last.
	Chain []*x509.Certificate
	// Key is the leaf's private key.
	Key crypto.Signer
}

// NewSVID checks that chain[0] is an X.509-SVID leaf for a Kubernetes workload
// identity (exactly one URI SAN, cA=false, no keyCertSign or cRLSign) whose
// public key belongs to key, and returns it as an SVID. It does not verify the
// chain to a root; peers do that.
func NewSVID(chain []*x509.Certificate, key crypto.Signer) (*SVID, error) {
	if len(chain) == 0 {
		return nil, errors.New("checking SVID: the certificate chain is empty")
	}
	leaf := chain[0]
	id, err := leafIdentity(leaf)
	if err != nil {
		return nil, fmt.Errorf("checking SVID: %w", err)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leaf.PublicKey) {
		return nil, fmt.Errorf("checking SVID for %s: the private key does not match the certificate", id)
	}
	return &SVID{ID: id, Chain: chain, Key: key}, nil
}

// leafIdentity checks that leaf is an X.509-SVID leaf (X509-SVID §5.2) and
// returns its Kubernetes workload identity.
func leafIdentity(leaf *x509.Certificate) (Identity, error) {
	if err := checkLeaf(leaf); err != nil {
		return Identity{}, err
	}
	sid, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return Identity{}, fmt.Errorf("leaf certificate: %w", err)
	}
	id, err := IdentityFromID(sid)
	if err != nil {
		return Identity{}, fmt.Errorf("leaf certificate: %w", err)
	}
	return id, nil
}

// checkLeaf checks the X.509 properties that make a certificate a leaf SVID
// rather than a signing certificate (X509-SVID §4.1, §4.3, §5.2).
func checkLeaf(leaf *x509.Certificate) error {
	switch {
	case leaf.IsCA:
		return errors.New("leaf certificate is a CA certificate (cA=true)")
	case leaf.KeyUsage&x509.KeyUsageCertSign != 0:
		return errors.New("leaf certificate has key usage keyCertSign")
	case leaf.KeyUsage&x509.KeyUsageCRLSign != 0:
		return errors.New("leaf certificate has key usage cRLSign")
	}
	return nil
}

// TLSCertificate returns the SVID as a tls.Certificate: the leaf and any
// intermediates (a trailing self-signed root is dropped; peers hold the roots
// already), the key, and Leaf set. It returns nil for an SVID with no chain.
func (s *SVID) TLSCertificate() *tls.Certificate {
	if s == nil || len(s.Chain) == 0 {
		return nil
	}
	chain := s.Chain
	if last := chain[len(chain)-1]; len(chain) > 1 && isSelfSigned(last) {
		chain = chain[:len(chain)-1]
	}
	cert := &tls.Certificate{PrivateKey: s.Key, Leaf: chain[0]}
	for _, c := range chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	return cert
}

// RefreshAt is when the SVID should be replaced: halfway through the leaf's
// lifetime, NotBefore + (NotAfter-NotBefore)/2, as ztunnel does.
func (s *SVID) RefreshAt() time.Time {
	leaf := s.Chain[0]
	return leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2)
}

// StaticCertificate returns a certificate callback for ServerConfig and
// ClientConfig that always yields s, for tests and fixed identities.
func StaticCertificate(s *SVID) func() (*tls.Certificate, error) {
	cert := s.TLSCertificate()
	return func() (*tls.Certificate, error) {
		if cert == nil {
			return nil, errors.New("no workload certificate: the SVID is empty")
		}
		return cert, nil
	}
}
