package caclient

import (
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/spiffe"
)

func chainPEM(chain [][]byte) *capb.IstioCertificateResponse {
	r := &capb.IstioCertificateResponse{}
	for _, der := range chain {
		r.CertChain = append(r.CertChain, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	}
	return r
}

// TestCheck checks what the client accepts from a CA: a chain to its roots
// carrying exactly the identity asked for.
func TestCheck(t *testing.T) {
	mesh, _ := spiffe.NewCA(spiffe.CAConfig{})
	other, _ := spiffe.NewCA(spiffe.CAConfig{})
	want := spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: "shop", ServiceAccount: "cart"}
	issue := func(ca *spiffe.CA, id spiffe.Identity) *capb.IstioCertificateResponse {
		_, csr, _ := spiffe.NewCSR(id)
		chain, err := ca.Sign(csr, id, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		var ders [][]byte
		for _, c := range chain {
			ders = append(ders, c.Raw)
		}
		return chainPEM(ders)
	}
	c, err := New(Config{Address: "127.0.0.1:15012", Roots: mesh.Roots(), Token: func() (string, error) { return "t", nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.check(issue(mesh, want), want); err != nil {
		t.Errorf("a good chain was refused: %v", err)
	}
	for name, tc := range map[string]struct {
		resp *capb.IstioCertificateResponse
		want string
	}{
		"another identity":  {issue(mesh, spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: "shop", ServiceAccount: "db"}), "not spiffe://"},
		"another CA":        {issue(other, want), "does not verify"},
		"empty":             {&capb.IstioCertificateResponse{}, "no certificate"},
		"not a certificate": {&capb.IstioCertificateResponse{CertChain: []string{"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}}, "bad certificate"},
	} {
		if _, err := c.check(tc.resp, want); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", name, err, tc.want)
		}
	}
}

func TestTokenFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "token")
	read := TokenFile(p)
	if _, err := read(); err == nil {
		t.Error("a missing file gave a token")
	}
	os.WriteFile(p, []byte("  \n"), 0o600)
	if _, err := read(); err == nil {
		t.Error("an empty file gave a token")
	}
	os.WriteFile(p, []byte("abc\n"), 0o600)
	if tok, err := read(); err != nil || tok != "abc" {
		t.Errorf("token %q, %v", tok, err)
	}
	os.WriteFile(p, []byte("rotated"), 0o600)
	if tok, _ := read(); tok != "rotated" {
		t.Errorf("a rotated token was not re-read: %q", tok)
	}
}

func TestNewValidates(t *testing.T) {
	mesh, _ := spiffe.NewCA(spiffe.CAConfig{})
	tok := func() (string, error) { return "", nil }
	for _, cfg := range []Config{
		{Roots: mesh.Roots(), Token: tok},
		{Address: "a:1", Token: tok},
		{Address: "a:1", Roots: mesh.Roots()},
		{Address: "no-port", Roots: mesh.Roots(), Token: tok},
	} {
		if c, err := New(cfg); err == nil {
			c.Close()
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}
