package ambient

import (
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var peerAuthAge = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func peerAuthn(ns, name string, mode securityv1beta1.PeerAuthentication_MutualTLS_Mode, selector map[string]string,
	ports map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode) *securityv1.PeerAuthentication {
	peerAuthAge = peerAuthAge.Add(time.Second)
	pa := &securityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(peerAuthAge)}}
	pa.Spec.Mtls = &securityv1beta1.PeerAuthentication_MutualTLS{Mode: mode}
	if selector != nil {
		pa.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: selector}
	}
	for p, m := range ports {
		if pa.Spec.PortLevelMtls == nil {
			pa.Spec.PortLevelMtls = map[uint32]*securityv1beta1.PeerAuthentication_MutualTLS{}
		}
		pa.Spec.PortLevelMtls[p] = &securityv1beta1.PeerAuthentication_MutualTLS{Mode: m}
	}
	return pa
}

func authzNames(u *Update) (changed, removed []string) {
	for k := range u.Authz {
		changed = append(changed, k)
	}
	sort.Strings(changed)
	removed = slices.Sorted(slices.Values(u.AuthzRemoved))
	return changed, removed
}

// TestIndexPeerAuthentication drives PeerAuthentications through the index
// and checks the policies published and the keys each pod lists.
func TestIndexPeerAuthentication(t *testing.T) {
	const (
		static    = "weft-system/istio_converted_static_strict"
		converted = "shop/converted_peer_authentication_cart"
		cart      = "Kubernetes//Pod/shop/cart-1"
		db        = "Kubernetes//Pod/shop/db"
		other     = "Kubernetes//Pod/other/x"
	)
	var (
		strict     = securityv1beta1.PeerAuthentication_MutualTLS_STRICT
		permissive = securityv1beta1.PeerAuthentication_MutualTLS_PERMISSIVE
		unset      = securityv1beta1.PeerAuthentication_MutualTLS_UNSET
	)
	w := newWorld(t)
	w.set(kindNamespace, ns("shop", nil), ns("other", nil), ns("weft-system", nil))
	w.set(kindPod, newPod("shop", "cart-1", withLabel("app", "cart")), newPod("shop", "db", withLabel("app", "db")),
		newPod("other", "x", withLabel("app", "cart")))
	w.ix.process(w.ix.all())

	nsStrict := peerAuthn("shop", "default", strict, nil, nil)
	cartPorts := peerAuthn("shop", "cart", unset, map[string]string{"app": "cart"},
		map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode{8080: permissive})
	steps := []struct {
		name                      string
		b                         func() batch
		wantAuthz, wantRemoved    []string
		wantAddresses             []string
		wantCart, wantDB, wantOth []string
	}{
		{
			name:          "namespace STRICT",
			b:             func() batch { return w.set(kindPeerAuth, nsStrict) },
			wantAuthz:     []string{static},
			wantAddresses: []string{cart, db},
			wantCart:      []string{static}, wantDB: []string{static},
		},
		{
			name: "metadata only",
			b: func() batch {
				p := nsStrict.DeepCopy()
				p.Labels = map[string]string{"x": "y"}
				return w.set(kindPeerAuth, p)
			},
			wantCart: []string{static}, wantDB: []string{static},
		},
		{
			name:          "workload port exception",
			b:             func() batch { return w.set(kindPeerAuth, cartPorts) },
			wantAuthz:     []string{converted},
			wantAddresses: []string{cart},
			wantCart:      []string{converted}, wantDB: []string{static},
		},
		{
			name:          "pod relabelled out of the workload policy",
			b:             func() batch { return w.set(kindPod, newPod("shop", "cart-1", withLabel("app", "web"))) },
			wantAddresses: []string{cart},
			wantCart:      []string{static}, wantDB: []string{static},
		},
		{
			name:          "pod relabelled back",
			b:             func() batch { return w.set(kindPod, newPod("shop", "cart-1", withLabel("app", "cart"))) },
			wantAddresses: []string{cart},
			wantCart:      []string{converted}, wantDB: []string{static},
		},
		{
			name:          "namespace PERMISSIVE: the exception is moot",
			b:             func() batch { return w.set(kindPeerAuth, peerAuthn("shop", "default", permissive, nil, nil)) },
			wantRemoved:   []string{converted},
			wantAddresses: []string{cart, db},
		},
		{
			name:          "mesh STRICT does not override the namespace",
			b:             func() batch { return w.set(kindPeerAuth, peerAuthn("weft-system", "default", strict, nil, nil)) },
			wantAddresses: []string{other},
			wantOth:       []string{static},
		},
		{
			name:          "namespace policy removed: the mesh's applies",
			b:             func() batch { return w.del(kindPeerAuth, nsStrict) },
			wantAuthz:     []string{converted},
			wantAddresses: []string{cart, db},
			wantCart:      []string{converted}, wantDB: []string{static}, wantOth: []string{static},
		},
		{
			name: "all removed",
			b: func() batch {
				b := w.del(kindPeerAuth, cartPorts)
				for k := range w.del(kindPeerAuth, peerAuthn("weft-system", "default", strict, nil, nil))[kindPeerAuth] {
					b.add(kindPeerAuth, k)
				}
				return b
			},
			wantRemoved:   []string{converted, static},
			wantAddresses: []string{other, cart, db},
		},
	}
	for _, st := range steps {
		u := w.ix.process(st.b())
		changed, removed := authzNames(u)
		if diff := cmp.Diff(st.wantAuthz, changed); diff != "" {
			t.Errorf("%s: authz published (-want +got):\n%s", st.name, diff)
		}
		if diff := cmp.Diff(st.wantRemoved, removed); diff != "" {
			t.Errorf("%s: authz removed (-want +got):\n%s", st.name, diff)
		}
		addrs, _ := names(u)
		if diff := cmp.Diff(st.wantAddresses, addrs); diff != "" {
			t.Errorf("%s: addresses published (-want +got):\n%s", st.name, diff)
		}
		for uid, want := range map[string][]string{cart: st.wantCart, db: st.wantDB, other: st.wantOth} {
			if diff := cmp.Diff(want, w.workload(uid).GetAuthorizationPolicies()); diff != "" {
				t.Errorf("%s: %s lists (-want +got):\n%s", st.name, uid, diff)
			}
		}
		// Every key a workload lists is published.
		for _, a := range w.ix.addresses {
			for _, k := range a.GetWorkload().GetAuthorizationPolicies() {
				if w.ix.authz[k] == nil {
					t.Errorf("%s: %s lists %s, which is not published", st.name, a.GetWorkload().GetUid(), k)
				}
			}
		}
	}
}
