package ca

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/internal/apitest"
	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// api is the package's real API server (root tests only).
var api = apitest.NewShared()

func TestMain(m *testing.M) { os.Exit(api.Main(m)) }

// countedReviews counts the TokenReviews sent to the real API server.
type countedReviews struct {
	TokenReviewer
	n atomic.Int64
}

func (c *countedReviews) Create(ctx context.Context, tr *authenticationv1.TokenReview, o metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	c.n.Add(1)
	return c.TokenReviewer.Create(ctx, tr, o)
}

// realCA is a CA server wired to the real API server as the control plane
// wires it: TokenReview, the pod informer with its index, the API fallback.
type realCA struct {
	c       *apitest.Cluster
	s       *Server
	reviews *countedReviews
}

func newRealCA(t *testing.T, relNS string) *realCA {
	t.Helper()
	c := api.Get(t)
	ctx, cancel := context.WithCancel(context.Background())
	f := informers.NewSharedInformerFactory(c.Kube, 0)
	t.Cleanup(func() {
		cancel()
		f.Shutdown()
	})
	pods := f.Core().V1().Pods().Informer()
	if err := AddPodIndexers(pods); err != nil {
		t.Fatal(err)
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	idx := NewPodIndex(pods, c.Kube.CoreV1())
	rv := &countedReviews{TokenReviewer: c.Kube.AuthenticationV1().TokenReviews()}
	authn, err := NewAuthenticator(AuthenticatorConfig{}, rv, idx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := spiffe.NewCA(spiffe.CAConfig{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(ServerConfig{TrustedNodeAccounts: []string{relNS + "/ztunnel"}}, m, authn, idx)
	if err != nil {
		t.Fatal(err)
	}
	return &realCA{c: c, s: s, reviews: rv}
}

func (r *realCA) run(t *testing.T, p apitest.PodOnNode) *corev1.Pod {
	t.Helper()
	pod, err := r.c.RunPod(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func (r *realCA) token(t *testing.T, p *corev1.Pod, aud ...string) string {
	t.Helper()
	if len(aud) == 0 {
		aud = []string{DefaultAudience}
	}
	tok, err := r.c.PodToken(context.Background(), p, aud...)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// ask requests a certificate for want with token, naming want as the
// impersonated identity when impersonate is set.
func (r *realCA) ask(t *testing.T, token string, want spiffe.Identity, impersonate bool) error {
	t.Helper()
	req := &capb.IstioCertificateRequest{Csr: csrFor(t, want), ValidityDuration: 3600}
	if impersonate {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{capb.ImpersonatedIdentityKey: structpb.NewStringValue(want.String())}}
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
	_, err := r.s.CreateCertificate(ctx, req)
	return err
}

// TestRealMirrorPodGrantsNoIdentity: a node can create mirror pods in any
// namespace; one on the node proxy's node gives it no identity there, not
// even the namespace's "default".
func TestRealMirrorPodGrantsNoIdentity(t *testing.T) {
	const rel = "weft-h4"
	r := newRealCA(t, rel)
	ctx := context.Background()
	zt := r.run(t, apitest.PodOnNode{Namespace: rel, Name: "ztunnel-a", ServiceAccount: "ztunnel", Node: "node-a", IP: "10.20.0.2"})
	r.run(t, apitest.PodOnNode{Namespace: "h4-shop", Name: "cart", ServiceAccount: "cart", Node: "node-a", IP: "10.20.0.3"})
	if err := r.c.EnsureNamespace(ctx, "h4-victim", nil); err != nil {
		t.Fatal(err)
	}
	// What a kubelet posts for a static pod: the mirror annotation, bound
	// to its node, no service account (the API server forbids one).
	mirror, err := r.c.Kube.CoreV1().Pods("h4-victim").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "static-node-a", Namespace: "h4-victim",
			Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "b2f7e0", "kubernetes.io/config.source": "file"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if mirror.Spec.ServiceAccountName != "" {
		t.Fatalf("the API server gave the mirror pod service account %q", mirror.Spec.ServiceAccountName)
	}
	mirror.Status.Phase = corev1.PodRunning
	if _, err := r.c.Kube.CoreV1().Pods("h4-victim").UpdateStatus(ctx, mirror, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ztTok := r.token(t, zt)
	ident := func(ns, sa string) spiffe.Identity {
		return spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: ns, ServiceAccount: sa}
	}
	// Wait until the informer has the mirror pod, so the index answers.
	waitFor(t, func() bool {
		_, ok, _ := r.s.nodes.(*PodIndex).cache.GetByKey("h4-victim/static-node-a")
		return ok
	}, "mirror pod in the informer")
	if err := r.ask(t, ztTok, ident("h4-shop", "cart"), true); err != nil {
		t.Fatalf("ztunnel refused a pod on its node: %v", err)
	}
	err = r.ask(t, ztTok, ident("h4-victim", "default"), true)
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("ztunnel asking for the mirror pod's namespace's default identity: got %v, want PermissionDenied", err)
	}
}

// TestRealTokenReviewFlood: a flood of bad tokens sent to the CA costs the
// real API server one TokenReview per token, and a good token reused costs
// one too.
func TestRealTokenReviewFlood(t *testing.T) {
	const rel = "weft-flood"
	r := newRealCA(t, rel)
	cart := r.run(t, apitest.PodOnNode{Namespace: "flood-shop", Name: "cart", ServiceAccount: "cart", Node: "node-a", IP: "10.21.0.3"})
	me := spiffe.Identity{TrustDomain: spiffe.DefaultTrustDomain, Namespace: "flood-shop", ServiceAccount: "cart"}
	bad := []string{"not-a-token", r.token(t, cart, "kubernetes"), r.token(t, cart, "other-audience")}
	good := r.token(t, cart)
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 15 {
				tok := bad[(i+j)%len(bad)]
				if err := r.ask(t, tok, me, false); status.Code(err) != codes.Unauthenticated {
					t.Errorf("bad token: got %v, want Unauthenticated", err)
				}
			}
		}()
	}
	wg.Wait()
	if n := r.reviews.n.Load(); n > int64(len(bad)) {
		t.Errorf("%d TokenReviews for 480 requests with %d bad tokens, want at most %d", n, len(bad), len(bad))
	}
	before := r.reviews.n.Load()
	for range 20 {
		if err := r.ask(t, good, me, false); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.reviews.n.Load() - before; n != 1 {
		t.Errorf("%d TokenReviews for 20 requests with one good token, want 1", n)
	}
}
