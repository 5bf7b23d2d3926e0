package servingcert

import (
	"bytes"
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/weftmesh/weft/internal/spiffe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// store is an in-memory Secrets with the API server's optimistic
// concurrency: Create of an existing name is AlreadyExists, Update with a
// stale resourceVersion is Conflict.
type store struct {
	mu      sync.Mutex // guards the fields below
	secrets map[string]*corev1.Secret
	rv      int
	writes  int
	// beforeCreate, if set, runs before each Create is applied.
	beforeCreate func()
	// conflicts makes the next n Updates fail with Conflict.
	conflicts int
}

var gr = schema.GroupResource{Resource: "secrets"}

func newStore() *store { return &store{secrets: map[string]*corev1.Secret{}} }

func (s *store) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.Secret, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sec, ok := s.secrets[name]; ok {
		return sec.DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(gr, name)
}

func (s *store) Create(_ context.Context, sec *corev1.Secret, _ metav1.CreateOptions) (*corev1.Secret, error) {
	if s.beforeCreate != nil {
		s.beforeCreate()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.secrets[sec.Name]; ok {
		return nil, apierrors.NewAlreadyExists(gr, sec.Name)
	}
	s.rv++
	s.writes++
	sec = sec.DeepCopy()
	sec.ResourceVersion = strconv.Itoa(s.rv)
	s.secrets[sec.Name] = sec
	return sec.DeepCopy(), nil
}

func (s *store) Update(_ context.Context, sec *corev1.Secret, _ metav1.UpdateOptions) (*corev1.Secret, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.secrets[sec.Name]
	if !ok {
		return nil, apierrors.NewNotFound(gr, sec.Name)
	}
	if s.conflicts > 0 || cur.ResourceVersion != sec.ResourceVersion {
		if s.conflicts > 0 {
			s.conflicts--
			s.rv++ // someone else wrote
			cur.ResourceVersion = strconv.Itoa(s.rv)
		}
		return nil, apierrors.NewConflict(gr, sec.Name, nil)
	}
	s.rv++
	s.writes++
	sec = sec.DeepCopy()
	sec.ResourceVersion = strconv.Itoa(s.rv)
	s.secrets[sec.Name] = sec
	return sec.DeepCopy(), nil
}

func (s *store) writeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

// clock is a settable time source.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

var names = []string{"weft-webhook.weft-system.svc", "weft-webhook.weft-system.svc.cluster.local"}

func newManager(t *testing.T, s Secrets, clk *clock, cfg Config) *Manager {
	t.Helper()
	cfg.SecretName = "weft-webhook-certs"
	cfg.Namespace = "weft-system"
	if cfg.DNSNames == nil {
		cfg.DNSNames = names
	}
	cfg.Now = clk.Now
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	m, err := New(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// verifyServing checks that the served certificate is valid at now for
// the DNS names against the served bundle, as the API server checks it.
func verifyServing(t *testing.T, m *Manager, now time.Time) {
	t.Helper()
	cert, err := m.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(m.CABundle()) {
		t.Fatal("the CA bundle holds no certificate")
	}
	for _, name := range names {
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Fatalf("at %s the served certificate does not verify for %s: %v", now.Format(time.DateOnly), name, err)
		}
	}
}

func TestCreatesAndServes(t *testing.T) {
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	st := newStore()
	m := newManager(t, st, clk, Config{})
	if err := m.Ready(); err == nil {
		t.Error("ready before the first sync")
	}
	if err := m.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.Ready(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Changed():
	default:
		t.Error("no change notification after loading")
	}
	verifyServing(t, m, clk.Now())
	// A second sync changes nothing and writes nothing.
	if err := m.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st.writeCount() != 1 {
		t.Errorf("%d writes, want 1", st.writeCount())
	}
	select {
	case <-m.Changed():
		t.Error("a change notification without a change")
	default:
	}
}

// TestReplicasRaceToCreate lets two replicas find the Secret missing at
// the same time: one create wins, the other adopts its certificate.
func TestReplicasRaceToCreate(t *testing.T) {
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	st := newStore()
	var arrived sync.WaitGroup
	arrived.Add(2)
	st.beforeCreate = func() { arrived.Done(); arrived.Wait() } // both have read NotFound
	a, b := newManager(t, st, clk, Config{}), newManager(t, st, clk, Config{})
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, m := range []*Manager{a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = m.Sync(context.Background()) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	ca, _ := a.GetCertificate(nil)
	cb, _ := b.GetCertificate(nil)
	if !bytes.Equal(ca.Leaf.Raw, cb.Leaf.Raw) || !bytes.Equal(a.CABundle(), b.CABundle()) {
		t.Error("the replicas serve different certificates after the race")
	}
	if st.writeCount() != 1 {
		t.Errorf("%d writes, want 1", st.writeCount())
	}
}

func TestConflictRereads(t *testing.T) {
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	st := newStore()
	st.secrets["weft-webhook-certs"] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "weft-webhook-certs", ResourceVersion: "1"}}
	st.conflicts = 2
	m := newManager(t, st, clk, Config{})
	if err := m.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	verifyServing(t, m, clk.Now())
}

func TestRepairsUnusableSecret(t *testing.T) {
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for name, data := range map[string]map[string][]byte{
		"empty (as the chart creates it)": nil,
		"garbage":                         {KeyCACert: []byte("nope"), KeyCAKey: []byte("nope"), KeyCert: []byte("x"), KeyKey: []byte("y")},
	} {
		t.Run(name, func(t *testing.T) {
			st := newStore()
			st.secrets["weft-webhook-certs"] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "weft-webhook-certs", ResourceVersion: "1"}, Data: data}
			m := newManager(t, st, clk, Config{})
			if err := m.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			verifyServing(t, m, clk.Now())
		})
	}
}

// TestRotation runs two replicas through 4 years of syncs every other day with
// short lifetimes, so both the serving certificate and the CA roll over
// many times, and checks at every step what the API server would check:
// each replica's certificate verifies against the bundle patched into the
// webhook configurations, and a CA leaves the bundle only once expired.
func TestRotation(t *testing.T) {
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	st := newStore()
	cfg := Config{CAValidity: 200 * 24 * time.Hour, CertValidity: 20 * 24 * time.Hour}
	a, b := newManager(t, st, clk, cfg), newManager(t, st, clk, cfg)
	ctx := context.Background()
	leaves, cas := map[string]bool{}, map[string]bool{}
	var prevBundle []*x509.Certificate
	for day := 0; day < 4*365; day += 2 {
		for _, m := range []*Manager{a, b} {
			if err := m.Sync(ctx); err != nil {
				t.Fatalf("day %d: %v", day, err)
			}
		}
		now := clk.Now()
		verifyServing(t, a, now)
		verifyServing(t, b, now)
		bundle, err := spiffe.ParseCertsPEM(a.CABundle())
		if err != nil {
			t.Fatal(err)
		}
		for _, old := range prevBundle {
			if !containsCert(bundle, old) && now.Before(old.NotAfter) {
				t.Fatalf("day %d: a CA valid until %s left the bundle", day, old.NotAfter.Format(time.DateOnly))
			}
		}
		for _, c := range bundle {
			if !now.Before(c.NotAfter) {
				t.Fatalf("day %d: the bundle still holds a CA that expired %s", day, c.NotAfter.Format(time.DateOnly))
			}
		}
		prevBundle = bundle
		for _, c := range bundle {
			cas[string(c.Raw)] = true
		}
		leaf, _ := a.GetCertificate(nil)
		leaves[string(leaf.Leaf.Raw)] = true
		clk.Add(48 * time.Hour)
	}
	if len(cas) < 8 || len(leaves) < 80 {
		t.Errorf("only %d CAs and %d serving certificates in 4 years: the test did not rotate", len(cas), len(leaves))
	}
}

func containsCert(certs []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range certs {
		if x.Equal(c) {
			return true
		}
	}
	return false
}

func TestReissuesForNewDNSNames(t *testing.T) {
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	st := newStore()
	if err := newManager(t, st, clk, Config{}).Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	renamed := []string{"webhook.weft.svc"}
	m := newManager(t, st, clk, Config{DNSNames: renamed})
	if err := m.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	cert, _ := m.GetCertificate(nil)
	if len(cert.Leaf.DNSNames) != 1 || cert.Leaf.DNSNames[0] != renamed[0] {
		t.Errorf("DNS names %v, want %v", cert.Leaf.DNSNames, renamed)
	}
}

func TestUserSupplied(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("user-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, key, err := ca.Issue(names, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := EncodeKey(key)
	otherKey, _ := EncodeKey(ca.Key)
	clk := &clock{now: now}
	for _, tc := range []struct {
		name       string
		data       map[string][]byte
		wantErr    bool
		wantBundle bool
	}{
		{"with ca.crt", map[string][]byte{KeyCert: EncodeCerts(leaf), KeyKey: keyPEM, KeyCACert: EncodeCerts(ca.Cert)}, false, true},
		{"without ca.crt", map[string][]byte{KeyCert: EncodeCerts(leaf), KeyKey: keyPEM}, false, false},
		{"key of another certificate", map[string][]byte{KeyCert: EncodeCerts(leaf), KeyKey: otherKey}, true, false},
		{"no key", map[string][]byte{KeyCert: EncodeCerts(leaf)}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore()
			st.secrets["weft-webhook-certs"] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "weft-webhook-certs"}, Data: tc.data}
			m := newManager(t, st, clk, Config{Mode: UserSupplied})
			err := m.Sync(context.Background())
			if (err != nil) != tc.wantErr {
				t.Fatalf("Sync = %v, want error %v", err, tc.wantErr)
			}
			if err == nil && (m.CABundle() != nil) != tc.wantBundle {
				t.Errorf("bundle %q, want one: %v", m.CABundle(), tc.wantBundle)
			}
			if st.writeCount() != 0 {
				t.Error("the manager wrote a user-supplied Secret")
			}
		})
	}
	m := newManager(t, newStore(), clk, Config{Mode: UserSupplied})
	if err := m.Sync(context.Background()); err == nil {
		t.Error("Sync without the Secret succeeded")
	}
}

// TestUserSuppliedFromOpenSSL loads user-supplied Secrets whose key and
// certificate the openssl command line made, in the layouts it writes: an
// EC key from ecparam (an "EC PARAMETERS" block before the key, which
// kubectl create secret tls accepts), PKCS #8 from genpkey, and RSA in
// PKCS #1 (-traditional). The webhook serves each.
func TestUserSuppliedFromOpenSSL(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Fatal("openssl is needed (scripts/deps.sh installs it)")
	}
	dir := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(openssl, args...).CombinedOutput(); err != nil {
			t.Fatalf("openssl %v: %v: %s", args, err, out)
		}
	}
	for _, tc := range []struct {
		name, layout string
		genKey       []string
	}{
		{"ecparam", "EC PARAMETERS", []string{"ecparam", "-name", "prime256v1", "-genkey", "-out"}},
		{"genpkey", "PRIVATE KEY", []string{"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"}},
		{"rsa-traditional", "RSA PRIVATE KEY", []string{"genrsa", "-traditional", "-out"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keyFile, certFile := filepath.Join(dir, tc.name+".key"), filepath.Join(dir, tc.name+".crt")
			args := append(tc.genKey, keyFile)
			if tc.genKey[0] == "genrsa" {
				args = append(args, "2048") // the size comes last
			}
			run(args...)
			run("req", "-x509", "-key", keyFile, "-subj", "/CN="+names[0], "-addext", "subjectAltName=DNS:"+strings.Join(names, ",DNS:"),
				"-days", "2", "-out", certFile)
			keyPEM, err := os.ReadFile(keyFile)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(keyPEM, []byte("-----BEGIN "+tc.layout+"-----")) {
				t.Fatalf("openssl wrote a key starting %.40q; the case wants %s first", keyPEM, tc.layout)
			}
			certPEM, err := os.ReadFile(certFile)
			if err != nil {
				t.Fatal(err)
			}
			st := newStore()
			st.secrets["weft-webhook-certs"] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "weft-webhook-certs"},
				Data: map[string][]byte{KeyCert: certPEM, KeyKey: keyPEM, KeyCACert: certPEM}}
			m := newManager(t, st, &clock{now: time.Now()}, Config{Mode: UserSupplied})
			if err := m.Sync(context.Background()); err != nil {
				t.Fatalf("a Secret made with openssl %s: %v", tc.name, err)
			}
			verifyServing(t, m, time.Now())
		})
	}
}

func TestRunStopsWithContext(t *testing.T) {
	clk := &clock{now: time.Now()}
	m := newManager(t, newStore(), clk, Config{Interval: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	<-m.Changed() // the first sync loaded a certificate
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
