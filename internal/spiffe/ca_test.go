package spiffe

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/weftmesh/weft/internal/testpki"
)

// testNow is a whole second, so that certificate times (second precision)
// compare exactly.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// clock is a settable clock safe for concurrent use.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock(t time.Time) *clock { return &clock{now: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

func mustIdentity(t testing.TB, td spiffeid.TrustDomain, ns, sa string) Identity {
	t.Helper()
	id, err := NewIdentity(td, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func mustCA(t testing.TB, cfg CAConfig) *CA {
	t.Helper()
	ca, err := NewCA(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// mustCSR returns a DER CSR for tmpl signed by key.
func mustCSR(t testing.TB, tmpl *x509.CertificateRequest, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func mustECKey(t testing.TB, curve elliptic.Curve) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(curve, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func sanExtensions(c *x509.Certificate) []pkix.Extension {
	var exts []pkix.Extension
	for _, e := range c.Extensions {
		if e.Id.Equal(oidSubjectAltName()) {
			exts = append(exts, e)
		}
	}
	return exts
}

func TestCASignLeaf(t *testing.T) {
	ca := mustCA(t, CAConfig{Now: func() time.Time { return testNow }})
	id := mustIdentity(t, DefaultTrustDomain, "default", "productpage")
	_, csr, err := NewCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := ca.Sign(csr, id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(chain) != 2 {
		t.Fatalf("chain has %d certificates, want leaf and root", len(chain))
	}
	leaf, root := chain[0], chain[1]
	if !root.Equal(ca.chain[0]) || !isSelfSigned(root) {
		t.Errorf("last certificate is %s, want the CA's self-signed root", root.Subject)
	}

	if got := len(leaf.URIs); got != 1 || leaf.URIs[0].String() != id.String() {
		t.Errorf("leaf URIs = %v, want exactly [%s]", leaf.URIs, id)
	}
	if sans := sanExtensions(leaf); len(sans) != 1 || !sans[0].Critical {
		t.Errorf("leaf SAN extensions = %+v, want exactly one, critical", sans)
	}
	if len(leaf.DNSNames)+len(leaf.EmailAddresses)+len(leaf.IPAddresses) != 0 {
		t.Errorf("leaf has other SANs: %v %v %v", leaf.DNSNames, leaf.EmailAddresses, leaf.IPAddresses)
	}
	if n := len(leaf.Subject.Names); n != 0 {
		t.Errorf("leaf subject = %q, want empty", leaf.Subject)
	}
	if leaf.KeyUsage != x509.KeyUsageDigitalSignature {
		t.Errorf("leaf KeyUsage = %v, want digitalSignature only", leaf.KeyUsage)
	}
	if diff := cmp.Diff([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, leaf.ExtKeyUsage); diff != "" {
		t.Errorf("leaf ExtKeyUsage (-want +got):\n%s", diff)
	}
	if leaf.IsCA || !leaf.BasicConstraintsValid {
		t.Errorf("leaf IsCA=%v BasicConstraintsValid=%v, want false, true", leaf.IsCA, leaf.BasicConstraintsValid)
	}
	if s := leaf.SerialNumber; s.Sign() <= 0 || s.BitLen() > 128 {
		t.Errorf("serial %v is not a positive 128-bit number", s)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Roots(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: testNow}); err != nil {
		t.Errorf("leaf does not verify to the CA's roots: %v", err)
	}
	// go-spiffe's own X.509-SVID validation accepts it too.
	bundle := x509bundle.FromX509Authorities(DefaultTrustDomain, []*x509.Certificate{root})
	sid, _, err := x509svid.Verify(chain[:1], bundle, x509svid.WithTime(testNow))
	if err != nil || sid != id.ID() {
		t.Errorf("x509svid.Verify = %v, %v; want %v", sid, err, id.ID())
	}

	// The root is an SVID signing certificate for the trust domain.
	if len(root.URIs) != 1 || root.URIs[0].String() != "spiffe://cluster.local" || root.KeyUsage&x509.KeyUsageCertSign == 0 || !root.IsCA {
		t.Errorf("root URIs=%v KeyUsage=%v IsCA=%v", root.URIs, root.KeyUsage, root.IsCA)
	}
	if got, want := root.NotAfter.Sub(testNow), 10*365*24*time.Hour; got != want {
		t.Errorf("root lifetime %v, want %v", got, want)
	}

	again, err := ca.Sign(csr, id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if again[0].SerialNumber.Cmp(leaf.SerialNumber) == 0 {
		t.Errorf("two certificates share serial %v", leaf.SerialNumber)
	}
}

func TestCATTL(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		name string
		cfg  CAConfig
		ttl  time.Duration
		want time.Duration
	}{
		{name: "requested", ttl: time.Hour, want: time.Hour},
		{name: "zero means default", ttl: 0, want: day},
		{name: "negative means default", ttl: -time.Hour, want: day},
		{name: "at max", ttl: 7 * day, want: 7 * day},
		{name: "90 days clamped to the default max", ttl: 90 * day, want: 7 * day},
		{name: "configured up to the ceiling", cfg: CAConfig{MaxTTL: 90 * day}, ttl: 100 * day, want: 90 * day},
		{name: "configured default", cfg: CAConfig{DefaultTTL: 2 * time.Hour, MaxTTL: 4 * time.Hour}, ttl: 0, want: 2 * time.Hour},
		{name: "configured max", cfg: CAConfig{DefaultTTL: 2 * time.Hour, MaxTTL: 4 * time.Hour}, ttl: day, want: 4 * time.Hour},
	}
	id := mustIdentity(t, DefaultTrustDomain, "ns", "sa")
	_, csr, err := NewCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Now = func() time.Time { return testNow }
			chain, err := mustCA(t, cfg).Sign(csr, id, tt.ttl)
			if err != nil {
				t.Fatal(err)
			}
			leaf := chain[0]
			if got, want := leaf.NotBefore, testNow.Add(-time.Minute); !got.Equal(want) {
				t.Errorf("NotBefore = %v, want %v", got, want)
			}
			if got := leaf.NotAfter.Sub(testNow); got != tt.want {
				t.Errorf("lifetime from now = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCAConfigErrors(t *testing.T) {
	for _, tt := range []struct {
		cfg     CAConfig
		wantErr string
	}{
		{CAConfig{DefaultTTL: 2 * time.Hour, MaxTTL: time.Hour}, "DefaultTTL 2h0m0s is longer than MaxTTL 1h0m0s"},
		{CAConfig{DefaultTTL: -time.Hour}, "DefaultTTL -1h0m0s is negative"},
		{CAConfig{MaxTTL: 91 * 24 * time.Hour}, "MaxTTL 2184h0m0s is above 2160h0m0s"},
	} {
		if _, err := NewCA(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("NewCA(%+v) error = %v, want %q", tt.cfg, err, tt.wantErr)
		}
	}
}

// TestCAIgnoresCSRContents checks that only the CSR's public key reaches the
// certificate: the identity comes from the caller.
func TestCAIgnoresCSRContents(t *testing.T) {
	ca := mustCA(t, CAConfig{})
	key := mustECKey(t, elliptic.P256())
	evil, _ := url.Parse("spiffe://cluster.local/ns/istio-system/sa/istiod")
	bc, err := asn1.Marshal(struct {
		IsCA bool `asn1:"optional"`
	}{true})
	if err != nil {
		t.Fatal(err)
	}
	csr := mustCSR(t, &x509.CertificateRequest{
		Subject:        pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		DNSNames:       []string{"istiod.istio-system.svc"},
		EmailAddresses: []string{"root@example.org"},
		IPAddresses:    []net.IP{net.ParseIP("10.0.0.1")},
		URIs:           []*url.URL{evil},
		ExtraExtensions: []pkix.Extension{
			{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: bc}, // basicConstraints cA=true
		},
	}, key)
	id := mustIdentity(t, DefaultTrustDomain, "default", "sleep")
	chain, err := ca.Sign(csr, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf := chain[0]
	type shape struct {
		URIs              []string
		DNS, Email        []string
		IPs               int
		Subject           string
		IsCA              bool
		KeyUsage          x509.KeyUsage
		SameKeyAsCSR      bool
		SANExtensionCount int
		SANCritical       bool
	}
	got := shape{
		DNS: leaf.DNSNames, Email: leaf.EmailAddresses, IPs: len(leaf.IPAddresses),
		Subject: leaf.Subject.String(), IsCA: leaf.IsCA, KeyUsage: leaf.KeyUsage,
		SameKeyAsCSR:      key.PublicKey.Equal(leaf.PublicKey),
		SANExtensionCount: len(sanExtensions(leaf)), SANCritical: sanExtensions(leaf)[0].Critical,
	}
	for _, u := range leaf.URIs {
		got.URIs = append(got.URIs, u.String())
	}
	want := shape{
		URIs: []string{id.String()}, KeyUsage: x509.KeyUsageDigitalSignature,
		SameKeyAsCSR: true, SANExtensionCount: 1, SANCritical: true,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("leaf (-want +got):\n%s", diff)
	}
}

func TestCASignRejects(t *testing.T) {
	ca := mustCA(t, CAConfig{})
	id := mustIdentity(t, DefaultTrustDomain, "default", "sleep")
	p256 := mustCSR(t, &x509.CertificateRequest{}, mustECKey(t, elliptic.P256()))

	badSig := bytes.Clone(p256)
	badSig[len(badSig)-1] ^= 0xff

	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pemOf := func(typ string, der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}) }

	tests := []struct {
		name    string
		csr     []byte
		id      Identity
		wantErr string
	}{
		{name: "garbage", csr: []byte("not a certificate request"), wantErr: "parsing CSR: not a PEM or DER certificate request"},
		{name: "empty", csr: nil, wantErr: "parsing CSR: input is empty"},
		{name: "wrong signature", csr: badSig, wantErr: "its signature does not verify"},
		{name: "P-384", csr: mustCSR(t, &x509.CertificateRequest{}, mustECKey(t, elliptic.P384())), wantErr: "ECDSA key on curve P-384 is not supported; use P-256"},
		{name: "RSA 1024", csr: mustCSR(t, &x509.CertificateRequest{}, rsa1024), wantErr: "RSA key of 1024 bits is too small; use at least 2048"},
		{name: "Ed25519", csr: mustCSR(t, &x509.CertificateRequest{}, edKey), wantErr: "ed25519.PublicKey keys are not supported"},
		{name: "certificate PEM", csr: pemOf("CERTIFICATE", ca.chain[0].Raw), wantErr: `PEM block is "CERTIFICATE", want "CERTIFICATE REQUEST"`},
		{name: "other trust domain", csr: p256, id: mustIdentity(t, spiffeid.RequireTrustDomainFromString("example.org"), "a", "b"),
			wantErr: "identity is in trust domain example.org, but this CA issues identities in cluster.local"},
		{name: "invalid identity", csr: p256, id: Identity{DefaultTrustDomain, "Default", "b"}, wantErr: "invalid identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sid := tt.id
			if sid.IsZero() {
				sid = id
			}
			chain, err := ca.Sign(tt.csr, sid, 0)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Sign = %d certificates, %v; want error containing %q", len(chain), err, tt.wantErr)
			}
			if !strings.HasPrefix(err.Error(), "signing certificate for ") {
				t.Errorf("error %q does not name the operation", err)
			}
		})
	}
}

func TestCASignRSA(t *testing.T) {
	if testing.Short() {
		t.Skip("RSA-2048 key generation is slow")
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	id := mustIdentity(t, DefaultTrustDomain, "legacy", "app")
	chain, err := mustCA(t, CAConfig{}).Sign(mustCSR(t, &x509.CertificateRequest{}, key), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment; chain[0].KeyUsage != want {
		t.Errorf("KeyUsage = %v, want %v", chain[0].KeyUsage, want)
	}
}

func TestCASignAfterCAExpiry(t *testing.T) {
	clk := newClock(testNow)
	ca := mustCA(t, CAConfig{Now: clk.Now})
	id := mustIdentity(t, DefaultTrustDomain, "a", "b")
	_, csr, err := NewCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(ca.chain[0].NotAfter.Sub(testNow) - time.Hour)
	chain, err := ca.Sign(csr, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !chain[0].NotAfter.Equal(ca.chain[0].NotAfter) {
		t.Errorf("leaf NotAfter %v, want it cut to the root's %v", chain[0].NotAfter, ca.chain[0].NotAfter)
	}
	clk.Advance(2 * time.Hour)
	if _, err := ca.Sign(csr, id, 0); err == nil || !strings.Contains(err.Error(), "rotate the CA") {
		t.Errorf("Sign after the root expired: error %v, want one saying to rotate the CA", err)
	}
}

func TestCASignCSRContext(t *testing.T) {
	ca := mustCA(t, CAConfig{})
	id := mustIdentity(t, DefaultTrustDomain, "a", "b")
	_, csr, err := NewCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := ca.SignCSR(ctx, csr, id, 0); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := ca.SignCSR(ctx, csr, id, 0); err == nil {
		t.Error("SignCSR with a cancelled context succeeded")
	}
}

func TestLoadCARoundTrip(t *testing.T) {
	orig := mustCA(t, CAConfig{})
	keyPEM, err := orig.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(CAConfig{}, orig.CertPEM(), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(loaded.RootsPEM(), orig.RootsPEM()) {
		t.Error("loaded CA has different roots")
	}
	svid, err := loaded.IssueSVID(mustIdentity(t, DefaultTrustDomain, "a", "b"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svid.Chain[0].Verify(x509.VerifyOptions{Roots: orig.Roots()}); err != nil {
		t.Errorf("certificate from the reloaded CA does not verify to the original roots: %v", err)
	}
}

// newIntermediate returns an intermediate CA certificate signed by root,
// valid for lifetime from testNow, and its key.
func newIntermediate(t *testing.T, root *CA, lifetime time.Duration) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	issuer := &testpki.Cert{Cert: root.chain[0], Key: root.key}
	inter, err := issuer.Issue(&x509.Certificate{
		Subject:   pkix.Name{Organization: []string{"cluster.local"}, CommonName: "intermediate"},
		NotBefore: testNow.Add(-time.Hour),
		NotAfter:  testNow.Add(lifetime),
		KeyUsage:  x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		IsCA:      true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return inter.Cert, inter.Key.(*ecdsa.PrivateKey)
}

func TestLoadCAIntermediate(t *testing.T) {
	now := func() time.Time { return testNow }
	root := mustCA(t, CAConfig{Now: now})
	inter, key := newIntermediate(t, root, 2*time.Hour)
	ecDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := append(encodeCertsPEM([]*x509.Certificate{inter}), root.CertPEM()...)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecDER})
	ca, err := LoadCA(CAConfig{Now: now}, certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca.RootsPEM(), root.RootsPEM()) {
		t.Error("RootsPEM of the intermediate CA is not the root")
	}
	if !bytes.Equal(ca.CertPEM(), certPEM) {
		t.Error("CertPEM does not return the chain loaded")
	}

	svid, err := ca.IssueSVID(mustIdentity(t, DefaultTrustDomain, "a", "b"), 0)
	if err != nil {
		t.Fatal(err)
	}
	chain := svid.Chain
	if len(chain) != 3 || !chain[1].Equal(inter) || !chain[2].Equal(root.chain[0]) {
		t.Fatalf("chain is %d certificates, want leaf, intermediate, root", len(chain))
	}
	if !chain[0].NotAfter.Equal(inter.NotAfter) {
		t.Errorf("leaf NotAfter %v, want it cut to the intermediate's %v", chain[0].NotAfter, inter.NotAfter)
	}
	inters := x509.NewCertPool()
	inters.AddCert(inter)
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: root.Roots(), Intermediates: inters, CurrentTime: testNow}); err != nil {
		t.Errorf("leaf does not verify through the intermediate: %v", err)
	}
	tc := svid.TLSCertificate()
	if len(tc.Certificate) != 2 || !bytes.Equal(tc.Certificate[1], inter.Raw) || tc.Leaf != chain[0] {
		t.Errorf("TLSCertificate has %d certificates, want leaf and intermediate without the root", len(tc.Certificate))
	}
}

func TestLoadCAErrors(t *testing.T) {
	now := func() time.Time { return testNow }
	root := mustCA(t, CAConfig{Now: now})
	rootKey, err := root.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	inter, interKey := newIntermediate(t, root, time.Hour)
	interDER, err := x509.MarshalPKCS8PrivateKey(interKey)
	if err != nil {
		t.Fatal(err)
	}
	interKeyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: interDER})
	interPEM := encodeCertsPEM([]*x509.Certificate{inter})
	leaf, err := root.IssueSVID(mustIdentity(t, DefaultTrustDomain, "a", "b"), 0)
	if err != nil {
		t.Fatal(err)
	}
	leafDER, err := x509.MarshalPKCS8PrivateKey(leaf.Key)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name          string
		cfg           CAConfig
		cert, key     []byte
		wantErrSubstr string
	}{
		{name: "key of another certificate", cert: root.CertPEM(), key: interKeyPEM, wantErrSubstr: "the key does not belong to the first certificate"},
		{name: "no root", cert: interPEM, key: interKeyPEM, wantErrSubstr: "is not a self-signed root; append the root certificate"},
		{name: "root first", cert: append(root.CertPEM(), interPEM...), key: rootKey, wantErrSubstr: "certificate 0 (O=cluster.local) is not signed by certificate 1"},
		{name: "leaf certificate", cert: encodeCertsPEM(leaf.Chain), key: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: leafDER}), wantErrSubstr: "not a CA certificate"},
		{name: "garbage certificate", cert: []byte("hello"), key: rootKey, wantErrSubstr: "certificate: malformed PEM"},
		{name: "key PEM in certificate", cert: rootKey, key: rootKey, wantErrSubstr: `PEM block 0 is "PRIVATE KEY", want "CERTIFICATE"`},
		{name: "garbage key", cert: root.CertPEM(), key: []byte("hello"), wantErrSubstr: "key: no PEM private key block"},
		{name: "expired chain", cfg: CAConfig{Now: func() time.Time { return testNow.Add(2 * time.Hour) }},
			cert: append(interPEM, root.CertPEM()...), key: interKeyPEM, wantErrSubstr: "verifying the CA chain: x509: certificate has expired"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			if cfg.Now == nil {
				cfg.Now = now
			}
			_, err := LoadCA(cfg, tt.cert, tt.key)
			if err == nil || !strings.Contains(err.Error(), tt.wantErrSubstr) {
				t.Fatalf("LoadCA error = %v, want one containing %q", err, tt.wantErrSubstr)
			}
		})
	}
}

func TestParseRoots(t *testing.T) {
	a, b := mustCA(t, CAConfig{}), mustCA(t, CAConfig{})
	pool, err := ParseRoots(append(a.RootsPEM(), b.RootsPEM()...))
	if err != nil {
		t.Fatal(err)
	}
	for _, ca := range []*CA{a, b} {
		svid, err := ca.IssueSVID(mustIdentity(t, DefaultTrustDomain, "a", "b"), 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svid.Chain[0].Verify(x509.VerifyOptions{Roots: pool}); err != nil {
			t.Errorf("leaf does not verify to the parsed roots: %v", err)
		}
	}
	leaf, err := a.IssueSVID(mustIdentity(t, DefaultTrustDomain, "a", "b"), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, in, wantErr string
	}{
		{"empty", "", "parsing trust roots: no PEM CERTIFICATE block"},
		{"garbage", "not PEM", "parsing trust roots: malformed PEM"},
		{"leaf", string(encodeCertsPEM(leaf.Chain[:1])), "certificate 0 () is not a CA certificate"},
	} {
		if _, err := ParseRoots([]byte(tt.in)); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: ParseRoots error = %v, want one containing %q", tt.name, err, tt.wantErr)
		}
	}
}
