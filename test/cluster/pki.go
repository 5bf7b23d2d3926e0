package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"

	"github.com/weftmesh/weft/internal/testpki"
)

// pki issues the cluster's certificates from a CA it makes, writing PEM
// files into dir.
type pki struct {
	dir string
	ca  *testpki.Cert
}

// certFiles are the PEM files of an issued certificate and its key.
type certFiles struct{ cert, key string }

func newPKI(dir, name string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := testpki.NewRoot(name)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, ca: ca}
	if err := ca.WriteFiles(p.caFile(), p.caKeyFile()); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *pki) caFile() string { return filepath.Join(p.dir, p.ca.Cert.Subject.CommonName+".crt") }
func (p *pki) caKeyFile() string {
	return filepath.Join(p.dir, p.ca.Cert.Subject.CommonName+".key")
}

// caPEM returns the CA certificate in PEM.
func (p *pki) caPEM() []byte { return p.ca.CertPEM() }

// serving issues a server certificate for the IPs and DNS names.
func (p *pki) serving(file, cn string, ips []net.IP, dns []string) (certFiles, error) {
	c, err := p.ca.Server(cn, dns, ips)
	if err != nil {
		return certFiles{}, err
	}
	return p.write(file, c)
}

// client issues a client certificate; Kubernetes reads CN as the user and
// O as the groups.
func (p *pki) client(file, cn string, groups ...string) (certFiles, error) {
	c, err := p.ca.Client(cn, groups...)
	if err != nil {
		return certFiles{}, err
	}
	return p.write(file, c)
}

func (p *pki) write(file string, c *testpki.Cert) (certFiles, error) {
	f := certFiles{cert: filepath.Join(p.dir, file+".crt"), key: filepath.Join(p.dir, file+".key")}
	return f, c.WriteFiles(f.cert, f.key)
}

// serviceAccountKeys writes the key pair the API server signs service
// account tokens with (sa.key) and verifies them with (sa.pub).
func serviceAccountKeys(dir string) (priv, pub string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	priv, pub = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	if err := writePEM(priv, "PRIVATE KEY", keyDER); err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return "", "", err
	}
	return priv, pub, writePEM(pub, "PUBLIC KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
