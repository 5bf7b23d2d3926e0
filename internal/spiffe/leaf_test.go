package spiffe

import (
	"bytes"
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"testing"
	"time"

	"github.com/weftmesh/weft/internal/testpki"
)

// caWithKey loads a CA whose signing certificate, issued by root, holds
// key; with noSKID the CA forgets the certificate's subject key identifier,
// as if it had none.
func caWithKey(t *testing.T, root *CA, key crypto.Signer, noSKID bool) *CA {
	t.Helper()
	issuer := &testpki.Cert{Cert: root.chain[0], Key: root.key}
	tmpl := &x509.Certificate{
		Subject:   pkix.Name{Organization: []string{"cluster.local"}, CommonName: "intermediate"},
		NotBefore: testNow.Add(-time.Hour), NotAfter: testNow.Add(48 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer.Cert, key.Public(), issuer.Key)
	if err != nil {
		t.Fatal(err)
	}
	inter, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := append(encodeCertsPEM([]*x509.Certificate{inter}), root.CertPEM()...)
	ca, err := LoadCA(CAConfig{Now: func() time.Time { return testNow }}, certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	if noSKID {
		ca.chain[0].SubjectKeyId = nil
	}
	return ca
}

// TestLeafTBSMatchesX509 checks that the certificate the CA encodes itself
// is, but for the signature, the one x509.CreateCertificate makes of the
// same template: the same TBSCertificate bytes, for CAs on each curve, with
// and without a subject key identifier, and leaf keys of each kind.
func TestLeafTBSMatchesX509(t *testing.T) {
	root := mustCA(t, CAConfig{Now: func() time.Time { return testNow }})
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	cas := map[string]*CA{
		"P-256 root":                  root,
		"P-384 intermediate":          caWithKey(t, root, mustECKey(t, elliptic.P384()), false),
		"P-521 intermediate":          caWithKey(t, root, mustECKey(t, elliptic.P521()), false),
		"P-256 intermediate, no SKID": caWithKey(t, root, mustECKey(t, elliptic.P256()), true),
	}
	leaves := map[string]crypto.PublicKey{"P-256": mustECKey(t, elliptic.P256()).Public(), "RSA-2048": rsaKey.Public()}
	for caName, ca := range cas {
		for leafName, pub := range leaves {
			for _, ttlName := range []string{"default TTL", "past 2050"} {
				t.Run(caName+"/"+leafName+"/"+ttlName, func(t *testing.T) {
					id := mustIdentity(t, DefaultTrustDomain, "ns", "sa")
					tmpl, err := ca.leafTemplate(pub, id, 0)
					if err != nil {
						t.Fatal(err)
					}
					if ttlName == "past 2050" { // GeneralizedTime rather than UTCTime
						tmpl.NotAfter = time.Date(2051, 1, 2, 3, 4, 5, 0, time.UTC)
					}
					ours, err := ca.createLeaf(tmpl, pub)
					if err != nil {
						t.Fatal(err)
					}
					theirs, err := x509.CreateCertificate(rand.Reader, tmpl, ca.chain[0], pub, ca.key)
					if err != nil {
						t.Fatal(err)
					}
					got, err := x509.ParseCertificate(ours)
					if err != nil {
						t.Fatal(err)
					}
					want, err := x509.ParseCertificate(theirs)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got.RawTBSCertificate, want.RawTBSCertificate) {
						t.Errorf("TBSCertificate differs from x509's:\n got %x\nwant %x", got.RawTBSCertificate, want.RawTBSCertificate)
					}
					if got.SignatureAlgorithm != want.SignatureAlgorithm {
						t.Errorf("signature algorithm %v, want %v", got.SignatureAlgorithm, want.SignatureAlgorithm)
					}
					if err := got.CheckSignatureFrom(ca.chain[0]); err != nil {
						t.Errorf("the signature does not verify with the CA's key: %v", err)
					}
				})
			}
		}
	}
}

// TestCreateLeafOtherKeys checks that a CA key that is not ECDSA (an RSA
// plugged-in CA) goes through x509.CreateCertificate and still verifies.
func TestCreateLeafOtherKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("RSA-2048 key generation is slow")
	}
	root := mustCA(t, CAConfig{Now: func() time.Time { return testNow }})
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ca := caWithKey(t, root, key, false)
	chain, err := ca.Sign(mustCSR(t, &x509.CertificateRequest{}, mustECKey(t, elliptic.P256())), mustIdentity(t, DefaultTrustDomain, "ns", "sa"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if chain[0].SignatureAlgorithm != x509.SHA256WithRSA {
		t.Errorf("signature algorithm %v, want SHA256-RSA", chain[0].SignatureAlgorithm)
	}
	if err := chain[0].CheckSignatureFrom(chain[1]); err != nil {
		t.Error(err)
	}
}

// TestLeafTBSRefusesOtherTemplates checks that the hand encoding takes
// only the workload template it mirrors.
func TestLeafTBSRefusesOtherTemplates(t *testing.T) {
	ca := mustCA(t, CAConfig{Now: func() time.Time { return testNow }})
	pub := mustECKey(t, elliptic.P256()).Public()
	for name, mod := range map[string]func(*x509.Certificate){
		"CA":              func(c *x509.Certificate) { c.IsCA = true },
		"no key usage":    func(c *x509.Certificate) { c.KeyUsage = 0 },
		"decipher only":   func(c *x509.Certificate) { c.KeyUsage |= x509.KeyUsageDecipherOnly },
		"other ext usage": func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageAny} },
		"no constraints":  func(c *x509.Certificate) { c.BasicConstraintsValid = false },
	} {
		tmpl, err := ca.leafTemplate(pub, mustIdentity(t, DefaultTrustDomain, "ns", "sa"), 0)
		if err != nil {
			t.Fatal(err)
		}
		mod(tmpl)
		if _, err := ca.createLeaf(tmpl, pub); err == nil {
			t.Errorf("%s: encoded, want an error", name)
		}
	}
}

// TestSignRequestChecksTheSignature: a parsed CSR whose signature does not
// verify with its own key is refused; a good one is signed as Sign does.
func TestSignRequestChecksTheSignature(t *testing.T) {
	ca := mustCA(t, CAConfig{Now: func() time.Time { return testNow }})
	id := mustIdentity(t, DefaultTrustDomain, "ns", "sa")
	der := mustCSR(t, &x509.CertificateRequest{}, mustECKey(t, elliptic.P256()))
	good, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.SignRequest(good, id, 0); err != nil {
		t.Fatalf("good CSR: %v", err)
	}
	bad := *good
	bad.Signature = append([]byte(nil), good.Signature...)
	bad.Signature[len(bad.Signature)-1] ^= 1
	if _, err := ca.SignRequest(&bad, id, 0); err == nil {
		t.Error("signed a CSR whose signature does not verify")
	}
	other := *good // another key's signature over the same request
	other.PublicKey = mustECKey(t, elliptic.P256()).Public()
	if _, err := ca.SignRequest(&other, id, 0); err == nil {
		t.Error("signed a CSR for a key that did not sign it")
	}
}
