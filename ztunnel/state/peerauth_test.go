package state

import (
	"net/netip"
	"testing"

	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/weftmesh/weft/internal/pb/securitypb"
	"github.com/weftmesh/weft/internal/spiffe"
)

// TestAuthorizePeerAuthentication enforces the policies the control plane
// makes of PeerAuthentications, written here as the control plane sends
// them: a connection without a principal (plaintext) is denied where the
// mode is STRICT, one with a principal (HBONE) is not.
func TestAuthorizePeerAuthentication(t *testing.T) {
	presence := []*securitypb.StringMatch{{MatchType: &securitypb.StringMatch_Presence{Presence: &emptypb.Empty{}}}}
	clause := func(m *securitypb.Match) *securitypb.Clause {
		return &securitypb.Clause{Matches: []*securitypb.Match{m}}
	}
	deny := func(ns, name string, rules ...*securitypb.Rule) *securitypb.Authorization {
		return &securitypb.Authorization{Name: name, Namespace: ns, Scope: securitypb.Scope_WORKLOAD_SELECTOR, Action: securitypb.Action_DENY, Rules: rules}
	}
	policies := map[string]*securitypb.Authorization{
		// STRICT.
		"weft-system/istio_converted_static_strict": deny("weft-system", "istio_converted_static_strict",
			&securitypb.Rule{Clauses: []*securitypb.Clause{clause(&securitypb.Match{NotPrincipals: presence})}}),
		// STRICT but port 9090 PERMISSIVE.
		"demo/converted_peer_authentication_strict-9090": deny("demo", "converted_peer_authentication_strict-9090",
			&securitypb.Rule{Clauses: []*securitypb.Clause{
				clause(&securitypb.Match{NotPrincipals: presence}),
				clause(&securitypb.Match{NotDestinationPorts: []uint32{9090}}),
			}}),
		// PERMISSIVE but port 8080 STRICT.
		"demo/converted_peer_authentication_permissive-8080": deny("demo", "converted_peer_authentication_permissive-8080",
			&securitypb.Rule{Clauses: []*securitypb.Clause{clause(&securitypb.Match{NotPrincipals: presence, DestinationPorts: []uint32{8080}})}}),
	}
	s := NewStore()
	if err := s.ApplyPolicies(policies, nil); err != nil {
		t.Fatal(err)
	}
	peer, err := spiffe.NewIdentity(spiffe.DefaultTrustDomain, "other", "client")
	if err != nil {
		t.Fatal(err)
	}
	conn := func(src spiffe.Identity, port uint16) Conn {
		return Conn{Source: src, Src: netip.MustParseAddrPort("10.0.0.1:40000"), Dst: netip.AddrPortFrom(netip.MustParseAddr("10.244.1.10"), port)}
	}
	plain := spiffe.Identity{}
	for _, tc := range []struct {
		name    string
		lists   string
		conn    Conn
		allowed bool
	}{
		{"STRICT denies plaintext", "weft-system/istio_converted_static_strict", conn(plain, 8080), false},
		{"STRICT admits a peer", "weft-system/istio_converted_static_strict", conn(peer, 8080), true},
		{"not listed: PERMISSIVE", "", conn(plain, 8080), true},
		{"PERMISSIVE port admits plaintext", "demo/converted_peer_authentication_strict-9090", conn(plain, 9090), true},
		{"other ports stay STRICT", "demo/converted_peer_authentication_strict-9090", conn(plain, 8080), false},
		{"a peer on a STRICT port", "demo/converted_peer_authentication_strict-9090", conn(peer, 8080), true},
		{"STRICT port denies plaintext", "demo/converted_peer_authentication_permissive-8080", conn(plain, 8080), false},
		{"STRICT port admits a peer", "demo/converted_peer_authentication_permissive-8080", conn(peer, 8080), true},
		{"other ports stay PERMISSIVE", "demo/converted_peer_authentication_permissive-8080", conn(plain, 9090), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &Workload{UID: "u", Namespace: "demo"}
			if tc.lists != "" {
				w.Policies = []string{tc.lists}
			}
			d := s.Authorize(w, tc.conn)
			if d.Allowed != tc.allowed {
				t.Errorf("decision %+v, want allowed=%v", d, tc.allowed)
			}
			if !d.Allowed && d.Policy != tc.lists {
				t.Errorf("denied by %q, want %q", d.Policy, tc.lists)
			}
		})
	}
}
