package webhook

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weftmesh/weft/internal/testpki"
	"github.com/weftmesh/weft/webhook/admit"
	"github.com/weftmesh/weft/webhook/audit"
	"github.com/weftmesh/weft/webhook/servingcert"
)

// clientCert issues a client certificate (extended key usage clientAuth,
// unless usage says otherwise) from ca.
func clientCert(t testing.TB, ca *servingcert.CA, cn string, dnsNames []string, usage ...x509.ExtKeyUsage) *tls.Certificate {
	t.Helper()
	if len(usage) == 0 {
		usage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	issuer := &testpki.Cert{Cert: ca.Cert, Key: ca.Key}
	c, err := issuer.Issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: []string{"test"}},
		DNSNames:    dnsNames,
		ExtKeyUsage: usage,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c.TLS()
}

// caFile writes ca's certificate as a PEM file.
func caFile(t testing.TB, ca *servingcert.CA) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(p, servingcert.EncodeCerts(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func newCA(t testing.TB, name string) *servingcert.CA {
	t.Helper()
	ca, err := servingcert.NewCA(name, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// clientWith is an HTTP/2 client of ls presenting cert (none if nil).
func (ls *liveServer) clientWith(t testing.TB, cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{RootCAs: ls.roots, ServerName: serverName}
	if cert != nil {
		// Present it whatever CAs the server names, as a client with one
		// certificate does.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// syncBuffer is a bytes.Buffer safe for a sink and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// record returns the audit record with auditID id.
func (b *syncBuffer) record(t testing.TB, id string) *audit.Event {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev audit.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("a partial record: %v", err)
		}
		if ev.AuditID == id {
			return &ev
		}
	}
	return nil
}

// TestServerClientAuth checks each client-certificate mode against callers
// without a certificate, with one from another CA, with a serving (not
// client) certificate, with one whose name is not allowed, and with a good
// one; and what the audit record says about the caller.
func TestServerClientAuth(t *testing.T) {
	trusted, other := newCA(t, "api-server-client-ca"), newCA(t, "someone-else")
	good := clientCert(t, trusted, "kube-apiserver", []string{"apiserver.weft-test"})
	sanOnly := clientCert(t, trusted, "front-proxy", []string{"kube-apiserver"})
	otherCA := clientCert(t, other, "kube-apiserver", nil)
	stranger := clientCert(t, trusted, "someone", nil)
	serving := clientCert(t, trusted, "kube-apiserver", nil, x509.ExtKeyUsageServerAuth)
	caPath := caFile(t, trusted)

	type call struct {
		name    string
		cert    *tls.Certificate
		refused bool   // the TLS handshake fails
		caller  string // the verified subject; "" unauthenticated
	}
	for _, tc := range []struct {
		mode  ClientAuth
		names []string
		calls []call
	}{
		{ClientAuthRequire, nil, []call{
			{name: "no certificate", refused: true},
			{name: "another CA", cert: otherCA, refused: true},
			{name: "serving certificate", cert: serving, refused: true},
			{name: "trusted", cert: good, caller: "CN=kube-apiserver,O=test"},
		}},
		{ClientAuthRequire, []string{"kube-apiserver"}, []call{
			{name: "name not allowed", cert: stranger, refused: true},
			{name: "allowed common name", cert: good, caller: "CN=kube-apiserver,O=test"},
			{name: "allowed DNS name", cert: sanOnly, caller: "CN=front-proxy,O=test"},
		}},
		{ClientAuthIfGiven, nil, []call{
			{name: "no certificate"},
			{name: "another CA", cert: otherCA, refused: true},
			{name: "trusted", cert: good, caller: "CN=kube-apiserver,O=test"},
		}},
		{ClientAuthNone, nil, []call{
			{name: "no certificate"},
			{name: "another CA ignored", cert: otherCA},
		}},
	} {
		t.Run(string(tc.mode)+"/"+strings.Join(tc.names, ","), func(t *testing.T) {
			var records syncBuffer
			ls := startServer(t, serverOpts{sink: audit.NewWriter(&records), config: func(c *Config) {
				c.ClientAuth, c.ClientNames = tc.mode, tc.names
				if tc.mode != ClientAuthNone {
					c.ClientCAFile = caPath
				}
			}})
			for _, c := range tc.calls {
				uid := strings.ReplaceAll(c.name, " ", "-")
				a := ls.post(ls.clientWith(t, c.cert), namespaceReview(t, uid, "ambient", false), 5*time.Second)
				if c.refused {
					if a.err == nil {
						t.Errorf("%s: HTTP %d, want the TLS handshake refused", c.name, a.code)
					}
					if ev := records.record(t, "uid-"+uid); ev != nil {
						t.Errorf("%s: refused caller audited", c.name)
					}
					continue
				}
				if a.err != nil || a.code != 200 {
					t.Errorf("%s: HTTP %d %v %s", c.name, a.code, a.err, a.body)
					continue
				}
				ev := records.record(t, "uid-"+uid)
				if ev == nil {
					t.Fatalf("%s: no audit record", c.name)
				}
				want := map[string]string{audit.KeyCallerAuthenticated: "false", audit.KeyUserInfo: "claimed"}
				if c.caller != "" {
					want = map[string]string{audit.KeyCallerAuthenticated: "true", audit.KeyUserInfo: "asserted", audit.KeyCaller: c.caller}
				}
				for k, v := range want {
					if ev.Annotations[k] != v {
						t.Errorf("%s: annotation %s=%q, want %q", c.name, k, ev.Annotations[k], v)
					}
				}
				if _, ok := ev.Annotations[audit.KeyCaller]; ok && c.caller == "" {
					t.Errorf("%s: an unauthenticated record names a caller %q", c.name, ev.Annotations[audit.KeyCaller])
				}
			}
		})
	}
}

// TestServerClientCAReload replaces the CA file: the next handshake trusts
// the new CA and no longer the old one.
func TestServerClientCAReload(t *testing.T) {
	first, second := newCA(t, "first"), newCA(t, "second")
	path := caFile(t, first)
	ls := startServer(t, serverOpts{config: func(c *Config) {
		c.ClientAuth, c.ClientCAFile = ClientAuthRequire, path
	}})
	review := namespaceReview(t, "shop", "ambient", false)
	if a := ls.post(ls.clientWith(t, clientCert(t, first, "a", nil)), review, 5*time.Second); a.code != 200 {
		t.Fatalf("first CA: HTTP %d %v", a.code, a.err)
	}
	if err := os.WriteFile(path+".new", servingcert.EncodeCerts(second.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	ls.clientCAs.forceCheck()
	if a := ls.post(ls.clientWith(t, clientCert(t, second, "a", nil)), review, 5*time.Second); a.code != 200 {
		t.Errorf("second CA after the file changed: HTTP %d %v", a.code, a.err)
	}
	if a := ls.post(ls.clientWith(t, clientCert(t, first, "a", nil)), review, 5*time.Second); a.err == nil {
		t.Errorf("first CA after the file changed: HTTP %d, want refused", a.code)
	}
}

// TestServerRefusesBadClientConfig: a mode that verifies needs a CA file
// that holds a certificate.
func TestServerRefusesBadClientConfig(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.crt")
	os.WriteFile(empty, []byte("not a certificate\n"), 0o644)
	for _, cfg := range []Config{
		{ClientAuth: ClientAuthRequire},
		{ClientAuth: ClientAuthIfGiven, ClientCAFile: filepath.Join(t.TempDir(), "missing.crt")},
		{ClientAuth: ClientAuthRequire, ClientCAFile: empty},
		{ClientAuth: "sometimes"},
	} {
		cfg.GetCertificate = noCert
		cfg.Registry = prometheus.NewRegistry()
		if _, err := New(cfg, &blockingAdmitter{}, audit.NewWriter(&bytes.Buffer{})); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

// TestServerLimitsUnauthenticatedAccessReviews makes many cross-namespace
// reviews: those of an unauthenticated caller reach the SubjectAccessReview
// API only as often as the limit allows, those of an authenticated one
// always.
func TestServerLimitsUnauthenticatedAccessReviews(t *testing.T) {
	trusted := newCA(t, "api-server-client-ca")
	c := testCluster()
	reg := prometheus.NewRegistry()
	limited, err := NewAccessLimit(c, 0.001, 3, reg)
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admit.New(admit.Config{Gateways: c, Services: c, Namespaces: c, Access: limited})
	if err != nil {
		t.Fatal(err)
	}
	ls := startServer(t, serverOpts{adm: adm, config: func(cfg *Config) {
		cfg.ClientAuth, cfg.ClientCAFile = ClientAuthIfGiven, caFile(t, trusted)
	}})
	review := ruleCase{name: "cross", kind: "v1/Namespace", user: "system:admin", object: `
metadata: {name: shop2, labels: {istio.io/use-waypoint: shared, istio.io/use-waypoint-namespace: infra}}`}.review(t)
	anonymous, apiserver := ls.clientWith(t, nil), ls.clientWith(t, clientCert(t, trusted, "kube-apiserver", nil))
	refused := 0
	for range 10 {
		a := ls.post(anonymous, review, 5*time.Second)
		if a.code != 200 {
			t.Fatalf("HTTP %d %v", a.code, a.err)
		}
		resp := decodeReview(t, []byte(a.body))
		if resp.Result != nil && strings.Contains(resp.Result.Message, "unauthenticated callers") {
			refused++
		}
	}
	if c.reviews > 3 || refused != 10-c.reviews {
		t.Errorf("an unauthenticated caller made %d SubjectAccessReviews of 10 (%d refused), want at most the burst of 3", c.reviews, refused)
	}
	before := c.reviews
	for range 10 {
		if a := ls.post(apiserver, review, 5*time.Second); a.code != 200 {
			t.Fatalf("HTTP %d %v", a.code, a.err)
		}
	}
	if got := c.reviews - before; got != 10 {
		t.Errorf("an authenticated caller made %d SubjectAccessReviews of 10, want all", got)
	}
}

// forceCheck makes the next handshake look at the CA file again.
func (c *clientCAs) forceCheck() {
	c.mu.Lock()
	c.checked = time.Time{}
	c.mu.Unlock()
}
