package ca

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// blockingSigner holds every Sign until release is closed.
type blockingSigner struct {
	ca      *spiffe.CA
	entered chan struct{}
	release chan struct{}
}

func (b *blockingSigner) SignRequest(csr *x509.CertificateRequest, id spiffe.Identity, ttl time.Duration) ([]*x509.Certificate, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.ca.SignRequest(csr, id, ttl)
}

// mdAuthn authenticates the caller named in the "x-caller" metadata
// ("<namespace>/<service account>"), each on its own pod.
type mdAuthn struct{}

func (mdAuthn) Caller(ctx context.Context) (*Caller, *Refusal) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get("x-caller")
	if len(v) != 1 {
		return nil, refuse(codes.Unauthenticated, "no_token", "no caller", "")
	}
	ns, sa, _ := strings.Cut(v[0], "/")
	c := caller(ns, sa, "node-a")
	c.Pod.UID = types.UID(v[0])
	return c, nil
}

func callerCtx(ns, sa string) context.Context {
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-caller", ns+"/"+sa))
}

// TestConcurrencyCap: one caller, and all callers together, can have only
// so many CreateCertificate requests in progress; beyond that the CA answers
// ResourceExhausted at once, and admits again once requests finish.
func TestConcurrencyCap(t *testing.T) {
	m, _ := spiffe.NewCA(spiffe.CAConfig{})
	sg := &blockingSigner{ca: m, entered: make(chan struct{}, 100), release: make(chan struct{})}
	s, err := NewServer(ServerConfig{Limits: Limits{MaxInFlight: 12, PerCallerMaxInFlight: 5, Rate: -1, PerCallerRate: -1}},
		sg, mdAuthn{}, nodeIndex{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var exhausted, granted atomic.Int64
	send := func(sa string, n int) {
		csr := csrFor(t, id("shop", sa))
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := s.CreateCertificate(callerCtx("shop", sa), &capb.IstioCertificateRequest{Csr: csr})
				switch status.Code(err) {
				case codes.ResourceExhausted:
					exhausted.Add(1)
				case codes.OK:
					granted.Add(1)
				default:
					t.Errorf("unexpected %v", err)
				}
			}()
		}
	}
	entered := 0
	waitEntered := func(want int) {
		t.Helper()
		for entered < want {
			select {
			case <-sg.entered:
				entered++
			case <-time.After(5 * time.Second):
				t.Fatalf("%d requests reached the signer, want %d", entered, want)
			}
		}
	}
	send("a", 8) // one caller: 5 in progress, 3 refused
	waitEntered(5)
	waitFor(t, func() bool { return exhausted.Load() == 3 }, "3 refusals of caller a")
	send("b", 5) // 10 in progress
	send("c", 5) // 12 in progress: the global cap refuses 3
	waitEntered(12)
	waitFor(t, func() bool { return exhausted.Load() == 6 }, "3 refusals of caller c")
	select {
	case <-sg.entered:
		t.Fatal("a 13th request reached the signer")
	case <-time.After(50 * time.Millisecond):
	}
	close(sg.release)
	wg.Wait()
	if granted.Load() != 12 || exhausted.Load() != 6 {
		t.Errorf("granted %d, refused %d; want 12 and 6", granted.Load(), exhausted.Load())
	}
	// Finished requests free their places.
	send("a", 1)
	wg.Wait()
	if granted.Load() != 13 {
		t.Error("a request after the others finished was refused")
	}
}

// TestRateLimit: a caller that sends request after request is refused with
// ResourceExhausted once past its burst, without holding back others, and
// all callers together are held to the global rate.
func TestRateLimit(t *testing.T) {
	m, _ := spiffe.NewCA(spiffe.CAConfig{})
	s, err := NewServer(ServerConfig{Limits: Limits{Rate: 0.001, Burst: 20, PerCallerRate: 0.001, PerCallerBurst: 8}}, m, mdAuthn{}, nodeIndex{})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(sa string) error {
		_, err := s.CreateCertificate(callerCtx("shop", sa), &capb.IstioCertificateRequest{Csr: csrFor(t, id("shop", sa))})
		return err
	}
	outcome := func(sa string, n int) (granted, refused int) {
		for range n {
			switch err := ask(sa); status.Code(err) {
			case codes.OK:
				granted++
			case codes.ResourceExhausted:
				refused++
			default:
				t.Fatalf("unexpected %v", err)
			}
		}
		return granted, refused
	}
	if g, r := outcome("a", 12); g != 8 || r != 4 {
		t.Errorf("caller a: %d granted, %d refused; want 8 and 4 (its burst)", g, r)
	}
	if g, r := outcome("b", 8); g != 8 || r != 0 {
		t.Errorf("caller b: %d granted, %d refused; want 8 and 0", g, r)
	}
	// 12 requests left of the global burst of 20 (refused ones count too:
	// the global bucket is taken before authentication).
	if g, r := outcome("c", 3); g != 0 || r != 3 {
		t.Errorf("caller c past the global burst: %d granted, %d refused; want 0 and 3", g, r)
	}
}

// TestDefaultLimitsHold: with the default limits a caller in a loop is
// held back too.
func TestDefaultLimitsHold(t *testing.T) {
	m, _ := spiffe.NewCA(spiffe.CAConfig{})
	s, err := NewServer(ServerConfig{}, m, mdAuthn{}, nodeIndex{})
	if err != nil {
		t.Fatal(err)
	}
	req := &capb.IstioCertificateRequest{Csr: csrFor(t, id("shop", "cart"))}
	var refused int
	for range DefaultPerCallerBurst + 200 {
		_, err := s.CreateCertificate(callerCtx("shop", "cart"), req)
		if status.Code(err) == codes.ResourceExhausted {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if refused == 0 {
		t.Fatalf("%d requests of one caller in a row: none refused", DefaultPerCallerBurst+200)
	}
}

// TestLifetimeCap: a request for 90 days gets the CA's maximum, a week.
func TestLifetimeCap(t *testing.T) {
	m, _ := spiffe.NewCA(spiffe.CAConfig{})
	s, err := NewServer(ServerConfig{}, m, okAuthn{caller("shop", "cart", "n")}, nodeIndex{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ask  int64
		want time.Duration
	}{
		{90 * 24 * 3600, 7 * 24 * time.Hour},
		{8 * 24 * 3600, 7 * 24 * time.Hour},
		{1 << 62, 7 * 24 * time.Hour},
		{0, 24 * time.Hour},
		{3600, time.Hour},
	} {
		resp, err := s.CreateCertificate(context.Background(), &capb.IstioCertificateRequest{Csr: csrFor(t, id("shop", "cart")), ValidityDuration: tc.ask})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode([]byte(resp.CertChain[0]))
		leaf, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if got := leaf.NotAfter.Sub(leaf.NotBefore); got < tc.want || got > tc.want+2*time.Minute {
			t.Errorf("asked %ds: lifetime %v, want %v", tc.ask, got, tc.want)
		}
	}
}

// TestCSRChecks: the CSR must name exactly the identity granted and nothing
// else, with a supported key, and be of a sane size.
func TestCSRChecks(t *testing.T) {
	m, _ := spiffe.NewCA(spiffe.CAConfig{})
	s, err := NewServer(ServerConfig{}, m, okAuthn{caller("shop", "cart", "n")}, nodeIndex{})
	if err != nil {
		t.Fatal(err)
	}
	const me = "spiffe://cluster.local/ns/shop/sa/cart"
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	bigRSA, err := rsa.GenerateKey(rand.Reader, 4104)
	if err != nil {
		t.Fatal(err)
	}
	junk, _ := asn1.Marshal(strings.Repeat("x", 12<<10))
	tests := []struct {
		name string
		csr  string
		ok   bool
	}{
		{"exactly the identity", csrWith(t, ec, []string{me}, nil, nil, nil), true},
		{"no SAN", csrWith(t, ec, nil, nil, nil, nil), false},
		{"the identity twice", csrWith(t, ec, []string{me, me}, nil, nil, nil), false},
		{"the identity and another", csrWith(t, ec, []string{me, "spiffe://cluster.local/ns/shop/sa/db"}, nil, nil, nil), false},
		{"the identity and a DNS name", csrWith(t, ec, []string{me}, []string{"db.shop.svc"}, nil, nil), false},
		{"the identity and an IP", csrWith(t, ec, []string{me}, nil, []net.IP{net.IPv4(10, 0, 0, 1)}, nil), false},
		{"the identity in upper case", csrWith(t, ec, []string{strings.ToUpper(me)}, nil, nil, nil), false},
		{"the identity with a trailing slash", csrWith(t, ec, []string{me + "/"}, nil, nil, nil), false},
		{"the identity percent-encoded", csrWith(t, ec, []string{"spiffe://cluster.local/ns/shop/sa/c%61rt"}, nil, nil, nil), false},
		{"P-384 key", csrWith(t, p384, []string{me}, nil, nil, nil), false},
		{"Ed25519 key", csrWith(t, ed, []string{me}, nil, nil, nil), false},
		{"RSA key over 4096 bits", csrWith(t, bigRSA, []string{me}, nil, nil, nil), false},
		{"oversized CSR", csrWith(t, ec, []string{me}, nil, nil, []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}, Value: junk}}), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.CreateCertificate(context.Background(), &capb.IstioCertificateRequest{Csr: tc.csr})
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok {
				if err == nil {
					t.Fatal("granted")
				}
				if c := status.Code(err); c != codes.InvalidArgument && c != codes.PermissionDenied {
					t.Errorf("refused with %v, want InvalidArgument or PermissionDenied", err)
				}
			}
		})
	}
}

// TestCallerBucketsPruned: the per-caller buckets of callers gone quiet are
// dropped once there are many, and the dropped ones come back full.
func TestCallerBucketsPruned(t *testing.T) {
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	lim, err := Limits{PerCallerRate: 10, PerCallerBurst: 20}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	a := newAdmission(lim, clk.Now)
	busy, r := a.enterCaller("busy")
	if r != nil {
		t.Fatal(r)
	}
	for i := range maxCallerEntries {
		release, r := a.enterCaller(fmt.Sprint("caller-", i))
		if r != nil {
			t.Fatal(r)
		}
		release()
	}
	clk.Add(time.Second) // not yet refilled (20 at 10/s takes 2s)
	if _, r := a.enterCaller("new-1"); r != nil {
		t.Fatal(r)
	}
	if n := len(a.callers); n != maxCallerEntries+2 {
		t.Errorf("%d buckets after a prune of none refilled, want %d", n, maxCallerEntries+2)
	}
	clk.Add(2 * time.Second)
	if _, r := a.enterCaller("new-2"); r != nil {
		t.Fatal(r)
	}
	// Left: the caller with a request in progress, new-1 (in progress too)
	// and new-2.
	if n := len(a.callers); n != 3 {
		t.Errorf("%d buckets after the prune, want 3", n)
	}
	busy()
}
