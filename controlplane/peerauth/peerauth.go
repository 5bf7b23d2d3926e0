package peerauth

import (
	"maps"
	"slices"

	"google.golang.org/protobuf/types/known/emptypb"
	securitybeta "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/weftmesh/weft/internal/pb/securitypb"
)

// Names of the resources this package makes. They hold '_', which no
// Kubernetes object name may, so they never collide with a translated
// AuthorizationPolicy.
const (
	StaticStrictName = "istio_converted_static_strict"
	ConvertedPrefix  = "converted_peer_authentication_"
)

// Level is how far a PeerAuthentication reaches.
type Level int

// Levels, from the widest.
const (
	// Ignored is a root-namespace policy with matchLabels: istiod does not
	// apply it to ambient workloads.
	Ignored Level = iota
	Mesh
	Namespace
	Workload
)

// LevelOf returns the level of pa, given the mesh's root namespace.
func LevelOf(rootNamespace string, pa *securityv1.PeerAuthentication) Level {
	selects := len(pa.Spec.GetSelector().GetMatchLabels()) > 0
	switch {
	case pa.Namespace == rootNamespace && selects:
		return Ignored
	case pa.Namespace == rootNamespace:
		return Mesh
	case selects:
		return Workload
	}
	return Namespace
}

// StaticStrictKey is the resource name of the static STRICT policy.
func StaticStrictKey(rootNamespace string) string {
	return rootNamespace + "/" + StaticStrictName
}

// ConvertedKey is the resource name of the converted form of the
// PeerAuthentication namespace/name.
func ConvertedKey(namespace, name string) string {
	return namespace + "/" + ConvertedPrefix + name
}

// StaticStrict is the policy every STRICT workload without port exceptions
// lists: deny a connection whose peer has no principal (plaintext).
func StaticStrict(rootNamespace string) *securitypb.Authorization {
	return &securitypb.Authorization{
		Name:      StaticStrictName,
		Namespace: rootNamespace,
		Scope:     securitypb.Scope_WORKLOAD_SELECTOR,
		Action:    securitypb.Action_DENY,
		Rules:     []*securitypb.Rule{{Clauses: []*securitypb.Clause{noPeer()}}},
	}
}

// noPeer matches a connection without a peer principal.
func noPeer() *securitypb.Clause {
	return &securitypb.Clause{Matches: []*securitypb.Match{{NotPrincipals: presence()}}}
}

func presence() []*securitypb.StringMatch {
	return []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Presence{Presence: &emptypb.Empty{}}}}
}

// Applies reports whether pa bears on a pod of namespace ns with labels:
// it is mesh-wide, or of ns and without a selector or selecting labels.
func Applies(rootNamespace string, pa *securityv1.PeerAuthentication, ns string, labels map[string]string) bool {
	if LevelOf(rootNamespace, pa) == Mesh {
		return true
	}
	if pa.Namespace != ns {
		return false
	}
	for k, v := range pa.Spec.GetSelector().GetMatchLabels() {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Effective is the policy in force at each level for one workload; nil
// where none is.
type Effective struct {
	Mesh, Namespace, Workload *securityv1.PeerAuthentication
}

// Select picks the policy of each level from those that apply to one
// workload; at each level the oldest wins.
func Select(rootNamespace string, pas []*securityv1.PeerAuthentication) Effective {
	var e Effective
	for _, pa := range pas {
		var slot **securityv1.PeerAuthentication
		switch LevelOf(rootNamespace, pa) {
		case Mesh:
			slot = &e.Mesh
		case Namespace:
			slot = &e.Namespace
		case Workload:
			slot = &e.Workload
		default:
			continue
		}
		if *slot == nil || older(pa, *slot) {
			*slot = pa
		}
	}
	return e
}

// older orders policies by creation time, then by namespace and name, so
// that the choice does not depend on the order of a list.
func older(a, b *securityv1.PeerAuthentication) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.Name < b.Name
}

// ParentStrict reports whether the mesh and namespace levels make the mode
// STRICT for a workload whose own policy leaves it UNSET.
func (e Effective) ParentStrict() bool {
	return strict(mode(e.Namespace), strict(mode(e.Mesh), false))
}

func mode(pa *securityv1.PeerAuthentication) securitybeta.PeerAuthentication_MutualTLS_Mode {
	if pa == nil {
		return securitybeta.PeerAuthentication_MutualTLS_UNSET
	}
	return pa.Spec.GetMtls().GetMode()
}

// strict resolves a mode against the inherited one: UNSET (or a value this
// version does not know) inherits, DISABLE is PERMISSIVE.
func strict(m securitybeta.PeerAuthentication_MutualTLS_Mode, inherited bool) bool {
	switch m {
	case securitybeta.PeerAuthentication_MutualTLS_STRICT:
		return true
	case securitybeta.PeerAuthentication_MutualTLS_PERMISSIVE, securitybeta.PeerAuthentication_MutualTLS_DISABLE:
		return false
	}
	return inherited
}

// Keys lists the policies a workload under e names in its
// authorization_policies: the static STRICT policy, the converted form of
// its workload policy, or nothing (PERMISSIVE).
func Keys(rootNamespace string, e Effective) []string {
	parent := e.ParentStrict()
	w := e.Workload
	switch {
	case w == nil && parent:
		return []string{StaticStrictKey(rootNamespace)}
	case w == nil:
		return nil
	case Convert(rootNamespace, w, parent) != nil:
		return []string{ConvertedKey(w.Namespace, w.Name)}
	case strict(mode(w), parent):
		return []string{StaticStrictKey(rootNamespace)}
	}
	return nil
}

// Convert returns the converted form of a workload policy whose port
// modes differ from its own, given whether its namespace (or else the mesh)
// makes the mode STRICT; nil for any other policy.
func Convert(rootNamespace string, pa *securityv1.PeerAuthentication, parentStrict bool) *securitypb.Authorization {
	if LevelOf(rootNamespace, pa) != Workload {
		return nil
	}
	wStrict := strict(mode(pa), parentStrict)
	ports := pa.Spec.GetPortLevelMtls()
	var exceptions []uint32
	for _, port := range slices.Sorted(maps.Keys(ports)) {
		m := ports[port].GetMode()
		if port != 0 && m != securitybeta.PeerAuthentication_MutualTLS_UNSET && strict(m, wStrict) != wStrict {
			exceptions = append(exceptions, port)
		}
	}
	if len(exceptions) == 0 {
		return nil
	}
	a := &securitypb.Authorization{
		Name:      ConvertedPrefix + pa.Name,
		Namespace: pa.Namespace,
		Scope:     securitypb.Scope_WORKLOAD_SELECTOR,
		Action:    securitypb.Action_DENY,
	}
	if !wStrict {
		// DENY plaintext to each STRICT port: one rule per port, any of
		// which denies.
		for _, port := range exceptions {
			a.Rules = append(a.Rules, &securitypb.Rule{Clauses: []*securitypb.Clause{{Matches: []*securitypb.Match{
				{NotPrincipals: presence(), DestinationPorts: []uint32{port}},
			}}}})
		}
		return a
	}
	// DENY plaintext unless to a PERMISSIVE port: one rule whose clauses
	// must all match. istiod puts the principal clause first for an
	// explicit STRICT and last for an inherited one; the order is kept so
	// the resources compare equal.
	clauses := make([]*securitypb.Clause, 0, len(exceptions)+1)
	explicit := mode(pa) == securitybeta.PeerAuthentication_MutualTLS_STRICT
	if explicit {
		clauses = append(clauses, noPeer())
	}
	for _, port := range exceptions {
		clauses = append(clauses, &securitypb.Clause{Matches: []*securitypb.Match{{NotDestinationPorts: []uint32{port}}}})
	}
	if !explicit {
		clauses = append(clauses, noPeer())
	}
	a.Rules = []*securitypb.Rule{{Clauses: clauses}}
	return a
}
