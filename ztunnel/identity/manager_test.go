package identity

import (
	"context"
	"crypto/x509"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weftmesh/weft/internal/spiffe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// countingSigner is the in-process CA, counting requests.
type countingSigner struct {
	ca   *spiffe.CA
	n    atomic.Int64
	fail atomic.Bool
}

func (s *countingSigner) SignCSR(ctx context.Context, csr []byte, id spiffe.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	s.n.Add(1)
	if s.fail.Load() {
		return nil, errors.New("CA unavailable")
	}
	return s.ca.SignCSR(ctx, csr, id, ttl)
}

func TestOneCertificatePerIdentity(t *testing.T) {
	ca, err := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	if err != nil {
		t.Fatal(err)
	}
	signer := &countingSigner{ca: ca}
	m, err := New(Config{Signer: signer, Roots: ca.Roots()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "echo")
	a, err := m.Acquire(id)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := m.Acquire(id) // a second pod of the same identity
	<-a.Ready()
	<-b.Ready()
	cert, err := b.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	if got := leaf.URIs[0].String(); got != id.String() {
		t.Errorf("certificate for %s", got)
	}
	if n := signer.n.Load(); n != 1 {
		t.Errorf("two pods of one identity cost %d CA requests, want 1", n)
	}
	if len(m.Identities()) != 1 {
		t.Errorf("identities %v", m.Identities())
	}
	a.Release()
	if len(m.Identities()) != 1 {
		t.Error("identity dropped while a pod still holds it")
	}
	b.Release()
	if len(m.Identities()) != 0 {
		t.Error("identity kept after its last pod left")
	}
}

func TestCAUnavailableFailsClearly(t *testing.T) {
	ca, _ := spiffe.NewCA(spiffe.CAConfig{TrustDomain: spiffe.DefaultTrustDomain})
	signer := &countingSigner{ca: ca}
	signer.fail.Store(true)
	m, _ := New(Config{Signer: signer, Roots: ca.Roots()})
	defer m.Close()
	id, _ := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "demo", "echo")
	c, err := m.Acquire(id)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	if _, err := c.Certificate(); err == nil {
		t.Fatal("a certificate was returned while the CA refuses")
	}
}
