package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki issues the cluster's certificates (ECDSA P-256) from a CA it makes,
// writing PEM files into dir.
type pki struct {
	dir   string
	ca    *x509.Certificate
	caKey crypto.Signer
}

// certFiles are the PEM files of an issued certificate and its key.
type certFiles struct{ cert, key string }

func newPKI(dir, name string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("making CA %s: %w", name, err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, ca: ca, caKey: key}
	if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := writeKey(filepath.Join(dir, name+".key"), key); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *pki) caFile() string { return filepath.Join(p.dir, p.ca.Subject.CommonName+".crt") }
func (p *pki) caKeyFile() string {
	return filepath.Join(p.dir, p.ca.Subject.CommonName+".key")
}

// caPEM returns the CA certificate in PEM.
func (p *pki) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.ca.Raw})
}

// serving issues a server certificate for the IPs and DNS names.
func (p *pki) serving(file, cn string, ips []net.IP, dns []string) (certFiles, error) {
	return p.issue(file, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		IPAddresses: ips,
		DNSNames:    dns,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// client issues a client certificate; Kubernetes reads CN as the user and
// O as the groups.
func (p *pki) client(file, cn string, groups ...string) (certFiles, error) {
	return p.issue(file, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (p *pki) issue(file string, tmpl *x509.Certificate) (certFiles, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certFiles{}, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(365 * 24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, key.Public(), p.caKey)
	if err != nil {
		return certFiles{}, fmt.Errorf("issuing %s: %w", file, err)
	}
	f := certFiles{cert: filepath.Join(p.dir, file+".crt"), key: filepath.Join(p.dir, file+".key")}
	if err := writePEM(f.cert, "CERTIFICATE", der); err != nil {
		return certFiles{}, err
	}
	if err := writeKey(f.key, key); err != nil {
		return certFiles{}, err
	}
	return f, nil
}

// serviceAccountKeys writes the key pair the API server signs service
// account tokens with (sa.key) and verifies them with (sa.pub).
func serviceAccountKeys(dir string) (priv, pub string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	priv, pub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := writeKey(priv, key); err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return "", "", err
	}
	return priv, pub, writePEM(pub, "PUBLIC KEY", der)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
