package ambient

import (
	"google.golang.org/protobuf/proto"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/controlplane/peerauth"
	"github.com/weftmesh/weft/internal/pb/securitypb"
)

// peerAuthChanged takes in a PeerAuthentication's new state, publishes the
// static STRICT policy while any exists, re-converts the workload policies
// whose parent it may be, and marks dirty the pods whose keys may change.
func (ix *index) peerAuthChanged(key string, b batch, u *Update) {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	old := ix.peerAuths[ns][key]
	pa := getObj[securityv1.PeerAuthentication](ix.stores.PeerAuths, key)
	if old != nil && pa != nil && old.CreationTimestamp.Equal(&pa.CreationTimestamp) && proto.Equal(&old.Spec, &pa.Spec) {
		ix.peerAuths[ns][key] = pa
		return // metadata or status only
	}
	ix.setPeerAuth(ns, key, pa)

	var static *securitypb.Authorization
	if ix.peerAuthCount > 0 {
		static = peerauth.StaticStrict(ix.cfg.RootNamespace)
	}
	ix.publishAuthz(peerauth.StaticStrictKey(ix.cfg.RootNamespace), static, u)

	root := ix.cfg.RootNamespace
	for _, p := range []*securityv1.PeerAuthentication{old, pa} {
		if p == nil {
			continue
		}
		switch peerauth.LevelOf(root, p) {
		case peerauth.Mesh:
			for n := range ix.peerAuths {
				ix.reconvertNamespace(n, u)
			}
			if ix.stores.Pods != nil {
				for _, k := range ix.stores.Pods.ListKeys() {
					b.add(kindPod, k)
				}
			}
		case peerauth.Namespace, peerauth.Workload:
			ix.reconvertNamespace(ns, u)
			for _, pod := range ix.byNamespace(ix.stores.Pods, ns) {
				b.add(kindPod, keyOf(pod))
			}
		}
	}
	if pa == nil {
		// Removed: its converted form goes too.
		ix.publishAuthz(peerauth.ConvertedKey(ns, name), nil, u)
	}
}

func (ix *index) setPeerAuth(ns, key string, pa *securityv1.PeerAuthentication) {
	m := ix.peerAuths[ns]
	_, had := m[key]
	switch {
	case pa != nil && m == nil:
		m = map[string]*securityv1.PeerAuthentication{}
		ix.peerAuths[ns] = m
		fallthrough
	case pa != nil:
		m[key] = pa
		if !had {
			ix.peerAuthCount++
		}
	case had:
		delete(m, key)
		ix.peerAuthCount--
		if len(m) == 0 {
			delete(ix.peerAuths, ns)
		}
	}
}

// reconvertNamespace publishes the converted form of each workload policy
// of ns, against the namespace and mesh policies now in force.
func (ix *index) reconvertNamespace(ns string, u *Update) {
	root := ix.cfg.RootNamespace
	var parent *bool
	for _, pa := range ix.peerAuths[ns] {
		if peerauth.LevelOf(root, pa) != peerauth.Workload {
			continue
		}
		if parent == nil {
			strict := peerauth.Select(root, ix.peerAuthsFor(ns, nil)).ParentStrict()
			parent = &strict
		}
		ix.publishAuthz(peerauth.ConvertedKey(pa.Namespace, pa.Name), peerauth.Convert(root, pa, *parent), u)
	}
}

// peerAuthsFor returns the PeerAuthentications that apply to a pod of ns
// with labels; with nil labels, the mesh and namespace ones.
func (ix *index) peerAuthsFor(ns string, labels map[string]string) []*securityv1.PeerAuthentication {
	root := ix.cfg.RootNamespace
	var out []*securityv1.PeerAuthentication
	for _, n := range []string{root, ns} {
		for _, pa := range ix.peerAuths[n] {
			if peerauth.Applies(root, pa, ns, labels) {
				out = append(out, pa)
			}
		}
		if ns == root {
			break
		}
	}
	return out
}

// podPeerAuthKeys lists the policies a pod names for its effective
// PeerAuthentication mode.
func (ix *index) podPeerAuthKeys(pod *corev1.Pod) []string {
	return ix.peerAuthKeys(pod.Namespace, pod.Labels)
}

// peerAuthKeys lists the policies a workload of namespace ns with labels
// names for its effective PeerAuthentication mode.
func (ix *index) peerAuthKeys(ns string, labels map[string]string) []string {
	if ix.peerAuthCount == 0 {
		return nil
	}
	return peerauth.Keys(ix.cfg.RootNamespace, peerauth.Select(ix.cfg.RootNamespace, ix.peerAuthsFor(ns, labels)))
}
