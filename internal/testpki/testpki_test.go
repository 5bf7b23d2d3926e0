package testpki

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func mustRoot(t *testing.T, cn string) *Cert {
	t.Helper()
	root, err := NewRoot(cn)
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func pool(certs ...*Cert) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c.Cert)
	}
	return p
}

func TestRoot(t *testing.T) {
	root := mustRoot(t, "test-ca")
	c := root.Cert
	if !c.IsCA || !c.BasicConstraintsValid || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("root: IsCA %v, basic constraints %v, key usage %v; want a CA", c.IsCA, c.BasicConstraintsValid, c.KeyUsage)
	}
	if c.Subject.CommonName != "test-ca" || c.Issuer.CommonName != "test-ca" {
		t.Errorf("subject %q, issuer %q; want test-ca self-signed", c.Subject.CommonName, c.Issuer.CommonName)
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("root is not self-signed: %v", err)
	}
	if d := time.Until(c.NotAfter); d < CALifetime-time.Minute || d > CALifetime {
		t.Errorf("root valid for %v more, want %v", d, CALifetime)
	}
	if other := mustRoot(t, "test-ca"); other.Cert.SerialNumber.Cmp(c.SerialNumber) == 0 {
		t.Error("two roots share a serial")
	}
}

func TestServerVerifiesForItsNamesOnly(t *testing.T) {
	root := mustRoot(t, "test-ca")
	srv, err := root.Server("api", []string{"kubernetes.default.svc"}, []net.IP{net.IPv4(10, 96, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	opts := x509.VerifyOptions{Roots: pool(root), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, name := range []string{"kubernetes.default.svc", "10.96.0.1"} {
		if err := srv.Cert.VerifyHostname(name); err != nil {
			t.Errorf("VerifyHostname(%s): %v", name, err)
		}
	}
	if err := srv.Cert.VerifyHostname("other.svc"); err == nil {
		t.Error("VerifyHostname(other.svc) passed")
	}
	if _, err := srv.Cert.Verify(opts); err != nil {
		t.Errorf("server certificate does not verify: %v", err)
	}
	opts.KeyUsages = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if _, err := srv.Cert.Verify(opts); err == nil {
		t.Error("server certificate verified as a client certificate")
	}
	if _, err := srv.Cert.Verify(x509.VerifyOptions{Roots: pool(mustRoot(t, "other"))}); err == nil {
		t.Error("server certificate verified to another root")
	}
}

func TestClientCarriesUserAndGroups(t *testing.T) {
	root := mustRoot(t, "test-ca")
	cl, err := root.Client("weft-admin", "system:masters", "dev")
	if err != nil {
		t.Fatal(err)
	}
	// One RDN set holds the organizations, which DER sorts.
	if cl.Cert.Subject.CommonName != "weft-admin" || !slices.Equal(slices.Sorted(slices.Values(cl.Cert.Subject.Organization)), []string{"dev", "system:masters"}) {
		t.Errorf("subject %v, want CN weft-admin, O system:masters, dev", cl.Cert.Subject)
	}
	if _, err := cl.Cert.Verify(x509.VerifyOptions{Roots: pool(root), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate does not verify: %v", err)
	}
	if cl.Cert.IsCA {
		t.Error("client certificate is a CA")
	}
}

func TestIntermediateChainAndSPIFFELeaf(t *testing.T) {
	root := mustRoot(t, "root")
	inter, err := root.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "intermediate"}, IsCA: true})
	if err != nil {
		t.Fatal(err)
	}
	if inter.Cert.KeyUsage&x509.KeyUsageCertSign == 0 || inter.Cert.NotAfter.After(root.Cert.NotAfter) {
		t.Errorf("intermediate: key usage %v, not after %v (root %v)", inter.Cert.KeyUsage, inter.Cert.NotAfter, root.Cert.NotAfter)
	}
	id, _ := url.Parse("spiffe://cluster.local/ns/default/sa/client")
	leaf, err := inter.Issue(&x509.Certificate{URIs: []*url.URL{id}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		t.Fatal(err)
	}
	if len(leaf.Cert.URIs) != 1 || leaf.Cert.URIs[0].String() != id.String() {
		t.Errorf("URI SANs %v, want %s", leaf.Cert.URIs, id)
	}
	inters := pool(inter)
	chains, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: pool(root), Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil || len(chains[0]) != 3 {
		t.Errorf("leaf chain %v, error %v; want leaf, intermediate, root", chains, err)
	}
	if _, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: pool(root)}); err == nil {
		t.Error("leaf verified to the root without its intermediate")
	}
	if _, err := leaf.Issue(&x509.Certificate{}); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("issuing from a leaf: %v, want not a CA", err)
	}
}

func TestIssueKeepsWhatTheTemplateSets(t *testing.T) {
	root := mustRoot(t, "root")
	from := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tmpl := &x509.Certificate{
		Subject:   pkix.Name{CommonName: "expired"},
		NotBefore: from.Add(-2 * time.Hour),
		NotAfter:  from.Add(-time.Hour),
		KeyUsage:  x509.KeyUsageDigitalSignature | x509.KeyUsageKeyAgreement,
	}
	c, err := root.Issue(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Cert.NotBefore.Equal(tmpl.NotBefore) || !c.Cert.NotAfter.Equal(tmpl.NotAfter) || c.Cert.KeyUsage != tmpl.KeyUsage {
		t.Errorf("validity %v..%v, key usage %v; want the template's", c.Cert.NotBefore, c.Cert.NotAfter, c.Cert.KeyUsage)
	}
	if tmpl.SerialNumber != nil || tmpl.BasicConstraintsValid {
		t.Error("Issue modified the template")
	}
	if _, err := c.Cert.Verify(x509.VerifyOptions{Roots: pool(root)}); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired certificate verified: %v", err)
	}
}

// A leaf's default validity ends with its issuer's.
func TestLeafEndsWithItsIssuer(t *testing.T) {
	root := mustRoot(t, "root")
	end := time.Now().Add(time.Hour).Truncate(time.Second)
	short, err := root.Issue(&x509.Certificate{Subject: pkix.Name{CommonName: "short"}, IsCA: true, NotAfter: end})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := short.Client("c")
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.Cert.NotAfter.Equal(end) {
		t.Errorf("leaf valid until %v, want its issuer's %v", leaf.Cert.NotAfter, end)
	}
}

func TestPEMFilesAndTLS(t *testing.T) {
	root := mustRoot(t, "root")
	srv, err := root.Server("s", []string{"localhost"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "s.crt"), filepath.Join(dir, "s.key")
	if err := srv.WriteFiles(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{certFile, keyFile} {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f, err, st.Mode().Perm())
		}
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatalf("the files are not a key pair: %v", err)
	}
	if !pair.Leaf.Equal(srv.Cert) {
		t.Error("the certificate file holds another certificate")
	}
	got := srv.TLS()
	if len(got.Certificate) != 1 || !got.Leaf.Equal(srv.Cert) || got.PrivateKey != srv.Key {
		t.Errorf("TLS() = %+v, want the leaf and its key", got)
	}
	if err := srv.WriteFiles(filepath.Join(dir, "missing", "x.crt"), keyFile); err == nil {
		t.Error("WriteFiles into a missing directory succeeded")
	}
}
