package spiffe

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"testing"

	"github.com/weftmesh/weft/internal/testpki"
)

// pathFixture holds certificates for VerifyPath: a root, an intermediate
// under it, a stranger's root, and a key rollover certificate: the same name
// as the root, a new key, signed by the root's old key (self-issued, not
// self-signed).
type pathFixture struct {
	root, inter, foreign, rollover *testpki.Cert
}

func newPathFixture(t testing.TB) *pathFixture {
	t.Helper()
	must := func(c *testpki.Cert, err error) *testpki.Cert {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	f := &pathFixture{root: must(testpki.NewRoot("mesh root")), foreign: must(testpki.NewRoot("mesh root"))}
	f.inter = must(f.root.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "mesh intermediate"}, IsCA: true}))
	f.rollover = must(f.root.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "mesh root"}, IsCA: true}))
	return f
}

func leafOf(t testing.TB, issuer *testpki.Cert) *x509.Certificate {
	t.Helper()
	c, err := issuer.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "workload"}})
	if err != nil {
		t.Fatal(err)
	}
	return c.Cert
}

// TestVerifyPath checks that VerifyPath accepts exactly the chains x509
// accepts with every certificate after the leaf offered as an intermediate,
// including the one a first attempt leaves out (a key rollover certificate).
func TestVerifyPath(t *testing.T) {
	f := newPathFixture(t)
	roots := x509.NewCertPool()
	roots.AddCert(f.root.Cert)
	for _, tc := range []struct {
		name  string
		chain []*x509.Certificate
		ok    bool
	}{
		{"leaf alone", []*x509.Certificate{leafOf(t, f.root)}, true},
		{"root last", []*x509.Certificate{leafOf(t, f.root), f.root.Cert}, true},
		{"intermediate, then root", []*x509.Certificate{leafOf(t, f.inter), f.inter.Cert, f.root.Cert}, true},
		{"intermediate left out", []*x509.Certificate{leafOf(t, f.inter), f.root.Cert}, false},
		{"a stranger's root, same name", []*x509.Certificate{leafOf(t, f.foreign), f.foreign.Cert}, false},
		{"a stranger's leaf, our root sent", []*x509.Certificate{leafOf(t, f.foreign), f.root.Cert}, false},
		{"key rollover certificate", []*x509.Certificate{leafOf(t, f.rollover), f.rollover.Cert}, true},
		{"key rollover certificate and root", []*x509.Certificate{leafOf(t, f.rollover), f.rollover.Cert, f.root.Cert}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all := x509.NewCertPool()
			for _, c := range tc.chain[1:] {
				all.AddCert(c)
			}
			_, x509Err := tc.chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: all})
			if (x509Err == nil) != tc.ok {
				t.Fatalf("the fixture is wrong: x509 with every certificate offered says %v, want ok=%v", x509Err, tc.ok)
			}
			err := VerifyPath(tc.chain, x509.VerifyOptions{Roots: roots})
			if (err == nil) != tc.ok {
				t.Errorf("VerifyPath = %v, want ok=%v", err, tc.ok)
			}
		})
	}
	if err := VerifyPath(nil, x509.VerifyOptions{Roots: roots}); err == nil {
		t.Error("VerifyPath of no certificate succeeded")
	}
}

// BenchmarkVerifyPath compares verifying a leaf sent with its root last
// (the CA's answer, an Istio peer's chain) by VerifyPath and by x509 with
// the root offered as an intermediate too.
func BenchmarkVerifyPath(b *testing.B) {
	f := newPathFixture(b)
	roots := x509.NewCertPool()
	roots.AddCert(f.root.Cert)
	chain := []*x509.Certificate{leafOf(b, f.root), f.root.Cert}
	b.Run("VerifyPath", func(b *testing.B) {
		for b.Loop() {
			if err := VerifyPath(chain, x509.VerifyOptions{Roots: roots}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("x509_root_as_intermediate", func(b *testing.B) {
		for b.Loop() {
			inter := x509.NewCertPool()
			inter.AddCert(chain[1])
			if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
