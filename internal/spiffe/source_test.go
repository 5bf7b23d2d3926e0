package spiffe

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

// sleepCall is one wait of a Source: how long it asked for and the channel
// that ends it.
type sleepCall struct {
	d    time.Duration
	fire chan time.Time
}

// fakeTimers replaces a Source's timers so that a test sees every wait Run
// starts and decides when it ends.
type fakeTimers struct {
	calls chan sleepCall
}

func newFakeTimers() *fakeTimers {
	// Buffered so that Run never blocks announcing a wait after the test has
	// stopped listening.
	return &fakeTimers{calls: make(chan sleepCall, 64)}
}

func (f *fakeTimers) newTimer(d time.Duration) (<-chan time.Time, func() bool) {
	c := make(chan time.Time, 1)
	f.calls <- sleepCall{d: d, fire: c}
	return c, func() bool { return true }
}

// next returns the next wait Run starts. The timeout only stops a broken
// test from hanging.
func (f *fakeTimers) next(t *testing.T) sleepCall {
	t.Helper()
	select {
	case c := <-f.calls:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("Run started no wait")
		return sleepCall{}
	}
}

// flakySigner is a CA that fails the next fail calls and records the TTLs it
// was asked for.
type flakySigner struct {
	ca *CA

	mu   sync.Mutex
	fail int             // guarded by mu
	ttls []time.Duration // guarded by mu
}

func (s *flakySigner) SignCSR(ctx context.Context, csr []byte, id Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	s.mu.Lock()
	s.ttls = append(s.ttls, ttl)
	failing := s.fail > 0
	if failing {
		s.fail--
	}
	s.mu.Unlock()
	if failing {
		return nil, errors.New("CA unavailable")
	}
	return s.ca.SignCSR(ctx, csr, id, ttl)
}

func (s *flakySigner) setFail(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = n
}

type signerFunc func(ctx context.Context, csr []byte, id Identity, ttl time.Duration) ([]*x509.Certificate, error)

func (f signerFunc) SignCSR(ctx context.Context, csr []byte, id Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	return f(ctx, csr, id, ttl)
}

// runSource starts src.Run with fake timers and returns a function that
// stops it and returns Run's result.
func runSource(t *testing.T, src *Source, timers *fakeTimers) (stop func() error) {
	t.Helper()
	if timers != nil {
		src.newTimer = timers.newTimer
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func mustSource(t *testing.T, cfg SourceConfig) *Source {
	t.Helper()
	src, err := NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

func isReady(src *Source) bool {
	select {
	case <-src.Ready():
		return true
	default:
		return false
	}
}

func TestSourceRotatesAtHalfLife(t *testing.T) {
	clk := newClock(testNow)
	ca := mustCA(t, CAConfig{Now: clk.Now, DefaultTTL: time.Hour})
	id := mustIdentity(t, DefaultTrustDomain, "default", "ratings")
	src := mustSource(t, SourceConfig{ID: id, Signer: ca, Now: clk.Now})

	if _, err := src.SVID(); err == nil || !strings.Contains(err.Error(), "no workload certificate for spiffe://cluster.local/ns/default/sa/ratings yet") {
		t.Errorf("SVID before Run: error %v", err)
	}
	if isReady(src) {
		t.Fatal("Ready before Run")
	}

	timers := newFakeTimers()
	stop := runSource(t, src, timers)

	// The certificate lives from now-1m to now+1h, so its half-life is 29m30s
	// from now.
	const wait = 29*time.Minute + 30*time.Second
	var prev *SVID
	for round := range 3 {
		sleep := timers.next(t)
		if !isReady(src) {
			t.Fatalf("round %d: Ready not closed while Run waits for the refresh", round)
		}
		svid, err := src.SVID()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		leaf := svid.Chain[0]
		if got, want := leaf.NotBefore, clk.Now().Add(-time.Minute); !got.Equal(want) {
			t.Errorf("round %d: NotBefore %v, want %v", round, got, want)
		}
		if sleep.d != wait {
			t.Errorf("round %d: Run waits %v, want %v", round, sleep.d, wait)
		}
		if got, want := svid.RefreshAt(), clk.Now().Add(wait); !got.Equal(want) {
			t.Errorf("round %d: RefreshAt %v, want %v", round, got, want)
		}
		if prev != nil && prev.Chain[0].SerialNumber.Cmp(leaf.SerialNumber) == 0 {
			t.Errorf("round %d: certificate not replaced", round)
		}
		if prev != nil && prev.Key == svid.Key {
			t.Errorf("round %d: key not replaced", round)
		}
		cert, err := src.Certificate()
		if err != nil {
			t.Fatal(err)
		}
		if cert.Leaf != leaf || len(cert.Certificate) != 1 {
			t.Errorf("round %d: Certificate() has %d certificates and another leaf; want the current leaf alone", round, len(cert.Certificate))
		}
		prev = svid
		sleep.fire <- clk.Advance(sleep.d)
	}
	if err := stop(); err != nil {
		t.Errorf("Run = %v, want nil after cancel", err)
	}
}

func TestSourceBackoff(t *testing.T) {
	clk := newClock(testNow)
	signer := &flakySigner{ca: mustCA(t, CAConfig{Now: clk.Now, DefaultTTL: time.Hour}), fail: 5}
	var logs bytes.Buffer
	src := mustSource(t, SourceConfig{
		ID:         mustIdentity(t, DefaultTrustDomain, "default", "details"),
		Signer:     signer,
		TTL:        time.Hour,
		MinBackoff: time.Second,
		MaxBackoff: 5 * time.Second,
		Now:        clk.Now,
		Logger:     slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	timers := newFakeTimers()
	stop := runSource(t, src, timers)

	const refresh = 29*time.Minute + 30*time.Second
	fire := func(s sleepCall) { s.fire <- clk.Advance(s.d) }

	var got []time.Duration
	for range 5 {
		s := timers.next(t)
		got = append(got, s.d)
		if isReady(src) {
			t.Error("Ready while the signer has never succeeded")
		}
		if _, err := src.Certificate(); err == nil {
			t.Error("Certificate succeeded while the signer has never succeeded")
		}
		fire(s)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("waits while failing (-want +got):\n%s", diff)
	}
	s := timers.next(t)
	if s.d != refresh {
		t.Errorf("wait after recovery = %v, want %v", s.d, refresh)
	}
	if !isReady(src) {
		t.Fatal("not Ready after the signer recovered")
	}

	// Failures while a certificate is held keep it and back off from the
	// start again.
	held, err := src.SVID()
	if err != nil {
		t.Fatal(err)
	}
	signer.setFail(2)
	fire(s)
	got = nil
	for range 2 {
		s := timers.next(t)
		got = append(got, s.d)
		if cur, err := src.SVID(); err != nil || cur != held {
			t.Errorf("SVID during failures = %v, %v; want the held one", cur, err)
		}
		fire(s)
	}
	if diff := cmp.Diff([]time.Duration{time.Second, 2 * time.Second}, got); diff != "" {
		t.Errorf("waits after a refresh failure (-want +got):\n%s", diff)
	}
	s = timers.next(t)
	if s.d != refresh {
		t.Errorf("wait after the second recovery = %v, want %v", s.d, refresh)
	}
	if cur, err := src.SVID(); err != nil || cur == held {
		t.Errorf("SVID after recovery = %v, %v; want a new one", cur, err)
	}

	// A signer down for longer than the certificate lives: SVID says so.
	signer.setFail(1 << 30)
	fire(s)
	if got := timers.next(t).d; got != time.Second {
		t.Errorf("first retry wait = %v, want 1s", got)
	}
	clk.Advance(2 * time.Hour)
	if _, err := src.SVID(); err == nil || !strings.Contains(err.Error(), "expired at") {
		t.Errorf("SVID after expiry: error %v, want one saying it expired", err)
	}
	if _, err := src.Certificate(); err == nil {
		t.Error("Certificate after expiry succeeded")
	}

	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
	signer.mu.Lock()
	for _, ttl := range signer.ttls {
		if ttl != time.Hour {
			t.Errorf("signer asked for TTL %v, want the configured 1h", ttl)
		}
	}
	signer.mu.Unlock()
	if out := logs.String(); !strings.Contains(out, `"msg":"workload certificate fetch failed"`) || !strings.Contains(out, "CA unavailable") ||
		!strings.Contains(out, `"identity":"spiffe://cluster.local/ns/default/sa/details"`) {
		t.Errorf("logs lack the failure record:\n%s", out)
	}
}

// TestSourceChecksIssuedIdentity checks that a certificate for another
// identity than the one asked for is refused, as ztunnel does.
func TestSourceChecksIssuedIdentity(t *testing.T) {
	ca := mustCA(t, CAConfig{})
	other := mustIdentity(t, DefaultTrustDomain, "istio-system", "istiod")
	var logs bytes.Buffer
	src := mustSource(t, SourceConfig{
		ID: mustIdentity(t, DefaultTrustDomain, "default", "app"),
		Signer: signerFunc(func(ctx context.Context, csr []byte, _ Identity, ttl time.Duration) ([]*x509.Certificate, error) {
			return ca.SignCSR(ctx, csr, other, ttl)
		}),
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	timers := newFakeTimers()
	stop := runSource(t, src, timers)
	if got := timers.next(t).d; got != DefaultMinBackoff {
		t.Errorf("wait = %v, want the backoff %v", got, DefaultMinBackoff)
	}
	if isReady(src) {
		t.Error("Ready with a certificate for another identity")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if want := "the signer issued a certificate for spiffe://cluster.local/ns/istio-system/sa/istiod, not spiffe://cluster.local/ns/default/sa/app"; !strings.Contains(logs.String(), want) {
		t.Errorf("logs lack %q:\n%s", want, logs.String())
	}
}

// TestSourceRunReturns runs Source with real timers and a signer that never
// answers, and checks that Run returns on cancel leaving no goroutine.
func TestSourceRunReturns(t *testing.T) {
	defer goleak.VerifyNone(t)
	ca := mustCA(t, CAConfig{})
	id := mustIdentity(t, DefaultTrustDomain, "default", "app")

	src := mustSource(t, SourceConfig{ID: id, Signer: ca})
	stop := runSource(t, src, nil)
	<-src.Ready()
	if _, err := src.Certificate(); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
	if err := src.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "already called") {
		t.Errorf("second Run = %v, want an error", err)
	}

	called := make(chan struct{})
	hung := mustSource(t, SourceConfig{ID: id, Signer: signerFunc(func(ctx context.Context, _ []byte, _ Identity, _ time.Duration) ([]*x509.Certificate, error) {
		close(called)
		<-ctx.Done()
		return nil, ctx.Err()
	})})
	stop = runSource(t, hung, nil)
	<-called
	if err := stop(); err != nil {
		t.Errorf("Run with a hung signer = %v", err)
	}
}

func TestSourceConfigErrors(t *testing.T) {
	ca := mustCA(t, CAConfig{})
	id := mustIdentity(t, DefaultTrustDomain, "a", "b")
	tests := []struct {
		name    string
		cfg     SourceConfig
		wantErr string
	}{
		{name: "no identity", cfg: SourceConfig{Signer: ca}, wantErr: "invalid identity: trust domain is empty"},
		{name: "no signer", cfg: SourceConfig{ID: id}, wantErr: "no Signer"},
		{name: "negative TTL", cfg: SourceConfig{ID: id, Signer: ca, TTL: -1}, wantErr: "TTL -1ns is negative"},
		{name: "backoff bounds", cfg: SourceConfig{ID: id, Signer: ca, MinBackoff: time.Minute, MaxBackoff: time.Second}, wantErr: "MaxBackoff 1s is shorter than MinBackoff 1m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewSource(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewSource error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNextBackoff(t *testing.T) {
	var got []time.Duration
	var d time.Duration
	for range 10 {
		d = nextBackoff(d, time.Second, DefaultMaxBackoff)
		got = append(got, d)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 150, 150}
	for i := range want {
		want[i] *= time.Second
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("backoff sequence (-want +got):\n%s", diff)
	}
}
