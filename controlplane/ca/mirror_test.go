package ca

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/internal/pb/capb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// podOn is a running pod for the node index tests.
func podOn(ns, name, sa, node string, mirror bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name)},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: sa},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if mirror {
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "3f6c1b"}
	}
	return p
}

// TestNodeIndexGrantsNoDefaultIdentity: a pod without a service account, and
// any mirror pod (a node creates those in any namespace it likes), gives no
// identity to the node proxy of its node, from the informer's index or from
// the API fallback alike.
func TestNodeIndexGrantsNoDefaultIdentity(t *testing.T) {
	objs := []*corev1.Pod{
		podOn("shop", "cart", "cart", "node-a", false),
		podOn("victim", "kube-proxy-node-a", "", "node-a", true),  // a mirror pod, as the API server admits them
		podOn("victim2", "nosa", "", "node-a", false),             // no service account at all
		podOn("victim3", "static-admin", "admin", "node-a", true), // a mirror pod naming one (admission plugin off)
		podOn("victim4", "elsewhere", "other", "node-b", false),   // on another node
		podOn("victim5", "MixedCase", "default", "node-a", true),  // a mirror pod naming "default" itself
	}
	indexed := newPodInformer(t)
	live := fake.NewClientset()
	for _, p := range objs {
		if err := indexed.GetIndexer().Add(p); err != nil {
			t.Fatal(err)
		}
		if _, err := live.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		node, ns, sa string
		want         bool
	}{
		{"node-a", "shop", "cart", true},
		{"node-a", "victim", "default", false},
		{"node-a", "victim", "", false},
		{"node-a", "victim2", "default", false},
		{"node-a", "victim2", "", false},
		{"node-a", "victim3", "admin", false},
		{"node-a", "victim3", "default", false},
		{"node-a", "victim4", "other", false},
		{"node-a", "victim5", "default", false},
	}
	for _, src := range []struct {
		name string
		x    *PodIndex
	}{
		{"informer", NewPodIndex(indexed, nil)},
		{"API fallback", NewPodIndex(newPodInformer(t), live.CoreV1())},
	} {
		for _, tc := range tests {
			got, err := src.x.HasPodOnNode(context.Background(), tc.node, tc.ns, tc.sa)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("%s: HasPodOnNode(%s, %s, %q) = %v, want %v", src.name, tc.node, tc.ns, tc.sa, got, tc.want)
			}
		}
	}
}

func newPodInformer(t *testing.T) cache.SharedIndexInformer {
	t.Helper()
	inf := cache.NewSharedIndexInformer(&cache.ListWatch{}, &corev1.Pod{}, 0, cache.Indexers{})
	if err := AddPodIndexers(inf); err != nil {
		t.Fatal(err)
	}
	return inf
}

// TestAuthenticatorMirrorPod: a token bound to a mirror pod, or to a pod
// without a service account, authenticates nobody, even for "default".
func TestAuthenticatorMirrorPod(t *testing.T) {
	mirror := podOn("victim", "static", "", "node-a", true)
	mirrorSA := podOn("victim", "static-sa", "default", "node-a", true)
	nosa := podOn("victim", "nosa", "", "node-a", false)
	a, err := NewAuthenticator(AuthenticatorConfig{CacheTTL: -1}, reviewer{
		"mirror":    saStatus("victim", "default", mirror.Name, string(mirror.UID), "istio-ca"),
		"mirror-sa": saStatus("victim", "default", mirrorSA.Name, string(mirrorSA.UID), "istio-ca"),
		"nosa":      saStatus("victim", "default", nosa.Name, string(nosa.UID), "istio-ca"),
	}, pods{"victim/static": mirror, "victim/static-sa": mirrorSA, "victim/nosa": nosa})
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"mirror", "mirror-sa", "nosa"} {
		if c, ref := a.review(context.Background(), tok); ref == nil {
			t.Errorf("%s: authenticated as %s", tok, c)
		} else if ref.Code != codes.Unauthenticated {
			t.Errorf("%s: refusal %s, want Unauthenticated", tok, ref.Code)
		}
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// csrWith builds a signed CSR with the given SANs and extra extensions.
func csrWith(t testing.TB, key crypto.Signer, uris []string, dns []string, ips []net.IP, extra []pkix.Extension) string {
	t.Helper()
	tmpl := &x509.CertificateRequest{DNSNames: dns, IPAddresses: ips, ExtraExtensions: extra}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// TestImpersonationEncodings: the ImpersonatedIdentity is one exact SPIFFE
// ID; other spellings of an identity on the node, and identities of mirror
// pods, are refused.
func TestImpersonationEncodings(t *testing.T) {
	inf := newPodInformer(t)
	for _, p := range []*corev1.Pod{
		podOn("shop", "cart", "cart", "node-a", false),
		podOn("kube-system", "etcd-node-a", "", "node-a", true),
		podOn("victim", "static", "", "node-a", true),
	} {
		if err := inf.GetIndexer().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	m, _ := spiffe.NewCA(spiffe.CAConfig{})
	s, err := NewServer(ServerConfig{TrustedNodeAccounts: []string{"weft-system/ztunnel"}}, m,
		okAuthn{caller("weft-system", "ztunnel", "node-a")}, NewPodIndex(inf, nil))
	if err != nil {
		t.Fatal(err)
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, tc := range []struct {
		want string
		ok   bool
	}{
		{"spiffe://cluster.local/ns/shop/sa/cart", true},
		{"spiffe://cluster.local/ns/victim/sa/default", false},
		{"spiffe://cluster.local/ns/kube-system/sa/default", false},
		{"spiffe://cluster.local/ns/shop/sa/cart/", false},
		{"spiffe://cluster.local/ns/shop/sa/cart%2F", false},
		{"spiffe://cluster.local/ns/shop/sa/c%61rt", false},
		{"spiffe://CLUSTER.LOCAL/ns/shop/sa/cart", false},
		{"spiffe://cluster.local/ns/shop/sa/Cart", false},
		{"spiffe://cluster.local//ns/shop/sa/cart", false},
		{"spiffe://cluster.local/ns/shop/sa/cart?x=1", false},
		{" spiffe://cluster.local/ns/shop/sa/cart", false},
		{"spiffe://cluster.local/ns/./sa/cart", false},
		{"spiffe://cluster.local/ns/shop/sa/cart\x00", false},
	} {
		req := &capb.IstioCertificateRequest{
			Csr:      csrWith(t, ec, []string{"spiffe://cluster.local/ns/shop/sa/cart"}, nil, nil, nil),
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{capb.ImpersonatedIdentityKey: structpb.NewStringValue(tc.want)}},
		}
		if !tc.ok {
			// The CSR names what was asked for, so only the decision refuses.
			if u, err := url.Parse(tc.want); err == nil {
				req.Csr = csrWith(t, ec, []string{u.String()}, nil, nil, nil)
			}
		}
		_, err := s.CreateCertificate(context.Background(), req)
		if tc.ok != (err == nil) {
			t.Errorf("%q: got %v, want granted=%v", tc.want, err, tc.ok)
		}
	}
}
