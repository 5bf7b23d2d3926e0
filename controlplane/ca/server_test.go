package ca

import (
	"context"
	"encoding/pem"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// nodeIndex is a fake NodeIndex: "<node>/<ns>/<sa>" present.
type nodeIndex map[string]bool

func (n nodeIndex) HasPodOnNode(_ context.Context, node, ns, sa string) (bool, error) {
	return n[nodeIdentityKey(node, ns, sa)], nil
}

func caller(ns, sa, node string) *Caller {
	return &Caller{Namespace: ns, ServiceAccount: sa, Pod: &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa + "-pod"},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: sa},
	}}
}

func id(ns, sa string) spiffe.Identity {
	return spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: ns, ServiceAccount: sa}
}

func newTestServer(t *testing.T) *Server {
	t.Helper()
	ca, err := spiffe.NewCA(spiffe.CAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(ServerConfig{}, ca, nil, nodeIndex{}); err == nil {
		t.Fatal("NewServer accepted a nil authenticator")
	}
	s, err := NewServer(ServerConfig{TrustedNodeAccounts: []string{"weft-system/ztunnel"}}, ca, fakeAuthn{}, nodeIndex{
		"node-a/shop/cart": true, "node-b/shop/db": true, "node-a/weft-system/ztunnel": true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type fakeAuthn struct{}

func (fakeAuthn) Caller(context.Context) (*Caller, *Refusal) { return nil, nil }

// TestDecide is the impersonation matrix over the decision logic alone.
func TestDecide(t *testing.T) {
	s := newTestServer(t)
	zt := caller("weft-system", "ztunnel", "node-a")
	tests := []struct {
		name         string
		caller       *Caller
		impersonated string
		csrURIs      []string
		want         spiffe.Identity
		wantCode     codes.Code
		wantReason   string
	}{
		{name: "own identity", caller: caller("shop", "cart", "node-a"), want: id("shop", "cart")},
		{name: "own identity with matching CSR", caller: caller("shop", "cart", "node-a"), csrURIs: []string{"spiffe://cluster.local/ns/shop/sa/cart"}, want: id("shop", "cart")},
		{name: "own identity named explicitly", caller: caller("shop", "cart", "node-a"), impersonated: "spiffe://cluster.local/ns/shop/sa/cart", want: id("shop", "cart")},
		{name: "CSR for another identity", caller: caller("shop", "cart", "node-a"), csrURIs: []string{"spiffe://cluster.local/ns/shop/sa/db"},
			wantCode: codes.PermissionDenied, wantReason: "csr_identity_mismatch"},
		{name: "ztunnel for a pod on its node", caller: zt, impersonated: "spiffe://cluster.local/ns/shop/sa/cart",
			csrURIs: []string{"spiffe://cluster.local/ns/shop/sa/cart"}, want: id("shop", "cart")},
		{name: "ztunnel for a pod on another node", caller: zt, impersonated: "spiffe://cluster.local/ns/shop/sa/db",
			wantCode: codes.PermissionDenied, wantReason: "identity_not_on_node"},
		{name: "ztunnel for an identity with no pod", caller: zt, impersonated: "spiffe://cluster.local/ns/shop/sa/ghost",
			wantCode: codes.PermissionDenied, wantReason: "identity_not_on_node"},
		{name: "ztunnel whose CSR names another identity", caller: zt, impersonated: "spiffe://cluster.local/ns/shop/sa/cart",
			csrURIs: []string{"spiffe://cluster.local/ns/weft-system/sa/ztunnel"}, wantCode: codes.PermissionDenied, wantReason: "csr_identity_mismatch"},
		{name: "ztunnel of another namespace is not trusted", caller: caller("other", "ztunnel", "node-a"),
			impersonated: "spiffe://cluster.local/ns/shop/sa/cart", wantCode: codes.PermissionDenied, wantReason: "impersonation_not_trusted"},
		{name: "ordinary pod may not impersonate", caller: caller("shop", "db", "node-a"),
			impersonated: "spiffe://cluster.local/ns/shop/sa/cart", wantCode: codes.PermissionDenied, wantReason: "impersonation_not_trusted"},
		{name: "foreign trust domain", caller: zt, impersonated: "spiffe://evil.example/ns/shop/sa/cart",
			wantCode: codes.PermissionDenied, wantReason: "foreign_trust_domain"},
		{name: "malformed identity", caller: zt, impersonated: "spiffe://cluster.local/ns/shop",
			wantCode: codes.InvalidArgument, wantReason: "impersonation_invalid"},
		{name: "regex-looking identity is literal", caller: zt, impersonated: "spiffe://cluster.local/ns/shop/sa/car.",
			wantCode: codes.InvalidArgument, wantReason: "impersonation_invalid"},
		{name: "unscheduled ztunnel pod", caller: caller("weft-system", "ztunnel", ""), impersonated: "spiffe://cluster.local/ns/shop/sa/cart",
			wantCode: codes.PermissionDenied, wantReason: "caller_not_scheduled"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ref := s.decide(context.Background(), tc.caller, &request{impersonated: tc.impersonated, csrURIs: tc.csrURIs})
			if tc.wantReason != "" {
				if ref == nil {
					t.Fatalf("granted %s, want refusal %s", got, tc.wantReason)
				}
				if ref.Code != tc.wantCode || ref.Reason != tc.wantReason {
					t.Errorf("refusal %s/%s (%s), want %s/%s", ref.Code, ref.Reason, ref.Public, tc.wantCode, tc.wantReason)
				}
				return
			}
			if ref != nil {
				t.Fatalf("refused: %v", ref)
			}
			if got != tc.want {
				t.Errorf("granted %s, want %s", got, tc.want)
			}
		})
	}
}

func csrFor(t testing.TB, ident spiffe.Identity) string {
	_, csr, err := spiffe.NewCSR(ident)
	if err != nil {
		t.Fatal(err)
	}
	return string(csr)
}

func TestParseRequest(t *testing.T) {
	good := csrFor(t, id("shop", "cart"))
	tests := []struct {
		name       string
		req        *capb.IstioCertificateRequest
		wantReason string
		wantTTL    time.Duration
	}{
		{name: "plain", req: &capb.IstioCertificateRequest{Csr: good}},
		{name: "ttl", req: &capb.IstioCertificateRequest{Csr: good, ValidityDuration: 3600}, wantTTL: time.Hour},
		{name: "negative ttl means default", req: &capb.IstioCertificateRequest{Csr: good, ValidityDuration: -5}},
		{name: "huge ttl is clamped", req: &capb.IstioCertificateRequest{Csr: good, ValidityDuration: 1 << 62}, wantTTL: spiffe.CeilingCertTTL},
		{name: "empty CSR", req: &capb.IstioCertificateRequest{}, wantReason: "csr_invalid"},
		{name: "garbage CSR", req: &capb.IstioCertificateRequest{Csr: "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"}, wantReason: "csr_invalid"},
		{name: "impersonation not a string", req: &capb.IstioCertificateRequest{Csr: good, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			capb.ImpersonatedIdentityKey: structpb.NewNumberValue(1)}}}, wantReason: "metadata_invalid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, ref := parseRequest(tc.req)
			if tc.wantReason != "" {
				if ref == nil || ref.Reason != tc.wantReason || ref.Code != codes.InvalidArgument {
					t.Fatalf("refusal %+v, want InvalidArgument/%s", ref, tc.wantReason)
				}
				return
			}
			if ref != nil {
				t.Fatal(ref)
			}
			if r.ttl != tc.wantTTL {
				t.Errorf("ttl %v, want %v", r.ttl, tc.wantTTL)
			}
			if len(r.csrURIs) != 1 || r.csrURIs[0] != "spiffe://cluster.local/ns/shop/sa/cart" {
				t.Errorf("CSR URIs %v", r.csrURIs)
			}
		})
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add(csrFor(f, id("shop", "cart")), int64(3600), "spiffe://cluster.local/ns/shop/sa/cart")
	f.Add("", int64(0), "")
	f.Add("-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----", int64(-1), "spiffe://x/ns/a/sa/b")
	s := &Server{cfg: ServerConfig{TrustDomain: spiffe.DefaultTrustDomain, TrustedNodeAccounts: []string{"weft-system/ztunnel"}}, nodes: nodeIndex{"n/shop/cart": true}}
	f.Fuzz(func(t *testing.T, csr string, ttl int64, imp string) {
		req := &capb.IstioCertificateRequest{Csr: csr, ValidityDuration: ttl}
		if imp != "" {
			req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{capb.ImpersonatedIdentityKey: structpb.NewStringValue(imp)}}
		}
		r, ref := parseRequest(req)
		if ref != nil {
			if ref.Code != codes.InvalidArgument {
				t.Fatalf("parse refusal with code %s", ref.Code)
			}
			return
		}
		if r.ttl < 0 || r.ttl > spiffe.CeilingCertTTL {
			t.Fatalf("ttl %v out of range", r.ttl)
		}
		got, ref := s.decide(context.Background(), caller("weft-system", "ztunnel", "n"), r)
		if ref == nil && got.String() != "spiffe://cluster.local/ns/shop/sa/cart" && got.String() != "spiffe://cluster.local/ns/weft-system/sa/ztunnel" {
			t.Fatalf("granted %s", got)
		}
	})
}

// reviewer is a fake TokenReviewer: token -> status.
type reviewer map[string]authenticationv1.TokenReviewStatus

func (r reviewer) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	st, ok := r[tr.Spec.Token]
	if !ok {
		return nil, errors.New("connection refused")
	}
	out := tr.DeepCopy()
	out.Status = st
	return out, nil
}

type pods map[string]*corev1.Pod

func (p pods) GetPod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	return p[ns+"/"+name], nil
}

func saStatus(ns, sa, pod, uid string, aud ...string) authenticationv1.TokenReviewStatus {
	st := authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: aud,
		User: authenticationv1.UserInfo{Username: "system:serviceaccount:" + ns + ":" + sa, Extra: map[string]authenticationv1.ExtraValue{}}}
	if pod != "" {
		st.User.Extra[PodNameExtra] = authenticationv1.ExtraValue{pod}
		st.User.Extra[PodUIDExtra] = authenticationv1.ExtraValue{uid}
	}
	return st
}

// TestAuthenticatorDecisions covers the token checks with a fake TokenReview
// answer for each case.
func TestAuthenticatorDecisions(t *testing.T) {
	live := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-1", UID: types.UID("u1")}, Spec: corev1.PodSpec{ServiceAccountName: "cart"}}
	done := live.DeepCopy()
	done.Name, done.UID, done.Status.Phase = "cart-2", "u2", corev1.PodSucceeded
	a, err := NewAuthenticator(AuthenticatorConfig{CacheTTL: -1}, reviewer{
		"good":         saStatus("shop", "cart", "cart-1", "u1", "istio-ca"),
		"no-audiences": saStatus("shop", "cart", "cart-1", "u1"),
		"wrong-aud":    saStatus("shop", "cart", "cart-1", "u1", "kubernetes"),
		"invalid":      {Authenticated: false, Error: "token expired"},
		"user":         {Authenticated: true, Audiences: []string{"istio-ca"}, User: authenticationv1.UserInfo{Username: "alice"}},
		"unbound":      saStatus("shop", "cart", "", "", "istio-ca"),
		"gone":         saStatus("shop", "cart", "cart-9", "u9", "istio-ca"),
		"recreated":    saStatus("shop", "cart", "cart-1", "old-uid", "istio-ca"),
		"other-sa":     saStatus("shop", "db", "cart-1", "u1", "istio-ca"),
		"terminated":   saStatus("shop", "cart", "cart-2", "u2", "istio-ca"),
	}, pods{"shop/cart-1": live, "shop/cart-2": done})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		token      string
		wantReason string
		wantCode   codes.Code
	}{
		{"good", "", codes.OK},
		{"no-audiences", "wrong_audience", codes.Unauthenticated},
		{"wrong-aud", "wrong_audience", codes.Unauthenticated},
		{"invalid", "token_invalid", codes.Unauthenticated},
		{"user", "not_service_account", codes.Unauthenticated},
		{"unbound", "not_pod_bound", codes.Unauthenticated},
		{"gone", "pod_gone", codes.Unauthenticated},
		{"recreated", "pod_uid_mismatch", codes.Unauthenticated},
		{"other-sa", "pod_sa_mismatch", codes.Unauthenticated},
		{"terminated", "pod_terminated", codes.Unauthenticated},
		{"unreachable", "token_review_failed", codes.Unavailable},
	}
	for _, tc := range tests {
		t.Run(tc.token, func(t *testing.T) {
			c, ref := a.review(context.Background(), tc.token)
			if tc.wantReason == "" {
				if ref != nil {
					t.Fatalf("refused: %v", ref)
				}
				if c.String() != "shop/cart" || c.Pod.Name != "cart-1" {
					t.Errorf("caller %s pod %s", c, c.Pod.Name)
				}
				return
			}
			if ref == nil || ref.Reason != tc.wantReason || ref.Code != tc.wantCode {
				t.Errorf("refusal %+v, want %s/%s", ref, tc.wantCode, tc.wantReason)
			}
		})
	}
}

// TestAuthenticatorCache checks that a cached review still re-checks the pod.
func TestAuthenticatorCache(t *testing.T) {
	live := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-1", UID: "u1"}, Spec: corev1.PodSpec{ServiceAccountName: "cart"}}
	rv := reviewer{"tok": saStatus("shop", "cart", "cart-1", "u1", "istio-ca")}
	ps := pods{"shop/cart-1": live}
	a, err := NewAuthenticator(AuthenticatorConfig{CacheTTL: time.Hour}, rv, ps)
	if err != nil {
		t.Fatal(err)
	}
	if _, ref := a.review(context.Background(), "tok"); ref != nil {
		t.Fatal(ref)
	}
	delete(rv, "tok") // a second TokenReview would now fail
	if _, ref := a.review(context.Background(), "tok"); ref != nil {
		t.Fatalf("cached review not used: %v", ref)
	}
	delete(ps, "shop/cart-1")
	if _, ref := a.review(context.Background(), "tok"); ref == nil || ref.Reason != "pod_gone" {
		t.Errorf("deleted pod still authenticated from the cache: %+v", ref)
	}
}

type okAuthn struct{ c *Caller }

func (a okAuthn) Caller(context.Context) (*Caller, *Refusal) { return a.c, nil }

// TestBadCSRSignature checks that a CSR whose self-signature does not verify
// is refused as malformed, after authentication.
func TestBadCSRSignature(t *testing.T) {
	m, _ := spiffe.NewCA(spiffe.CAConfig{})
	s, err := NewServer(ServerConfig{}, m, okAuthn{caller("shop", "cart", "n")}, nodeIndex{})
	if err != nil {
		t.Fatal(err)
	}
	_, csrPEM, _ := spiffe.NewCSR(id("shop", "cart"))
	b, _ := pem.Decode(csrPEM)
	b.Bytes[len(b.Bytes)-3] ^= 0xff // inside the signature
	_, err = s.CreateCertificate(context.Background(), &capb.IstioCertificateRequest{Csr: string(pem.EncodeToMemory(b))})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("got %v, want InvalidArgument", err)
	}
	if _, err := s.CreateCertificate(context.Background(), &capb.IstioCertificateRequest{Csr: csrFor(t, id("shop", "cart"))}); err != nil {
		t.Errorf("a good CSR was refused: %v", err)
	}
}

// BenchmarkCreateCertificateCPU is the server's own cost per request,
// without gRPC, TLS or the API. Its one caller asks far faster than a
// pod may, so the rate limits are off.
func BenchmarkCreateCertificateCPU(b *testing.B) {
	m, _ := spiffe.NewCA(spiffe.CAConfig{})
	s, err := NewServer(ServerConfig{Limits: Limits{Rate: -1, PerCallerRate: -1}}, m, okAuthn{caller("shop", "cart", "n")}, nodeIndex{})
	if err != nil {
		b.Fatal(err)
	}
	req := &capb.IstioCertificateRequest{Csr: csrFor(b, id("shop", "cart"))}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.CreateCertificate(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}
