package spiffe

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"testing"
)

// FuzzParsePEM: the certificate and key parsers never panic, and what they
// refuse they refuse with a message.
func FuzzParsePEM(f *testing.F) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	der, _ := x509.MarshalECPrivateKey(key)
	ec := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	params := pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}})
	ca, err := NewCA(CAConfig{TrustDomain: DefaultTrustDomain})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ca.RootsPEM())
	if k, err := ca.KeyPEM(); err == nil {
		f.Add(k)
	}
	f.Add(append(params, ec...))
	f.Add(ec)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\n\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("not pem"))
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := ParseCertsPEM(data)
		if err != nil && err.Error() == "" || err == nil && len(certs) == 0 {
			t.Fatalf("ParseCertsPEM = %d certificates, %v", len(certs), err)
		}
		k, err := ParseKeyPEM(data)
		if err != nil && err.Error() == "" || err == nil && k == nil {
			t.Fatalf("ParseKeyPEM = %v, %v", k, err)
		}
	})
}
