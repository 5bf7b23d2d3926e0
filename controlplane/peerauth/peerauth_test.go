package peerauth

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/weftmesh/weft/internal/pb/securitypb"
)

const root = "istio-system"

// parse reads YAML documents of PeerAuthentications. A policy without a
// namespace is in foo; without a creationTimestamp, each is a second
// younger than the one before it.
func parse(t *testing.T, docs string) []*securityv1.PeerAuthentication {
	t.Helper()
	var out []*securityv1.PeerAuthentication
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, doc := range strings.Split(docs, "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var pa securityv1.PeerAuthentication
		if err := yaml.UnmarshalStrict([]byte(doc), &pa); err != nil {
			t.Fatalf("policy %d: %v", i, err)
		}
		if pa.Namespace == "" {
			pa.Namespace = "foo"
		}
		if pa.CreationTimestamp.IsZero() {
			pa.CreationTimestamp = metav1.NewTime(base.Add(time.Duration(i) * time.Second))
		}
		out = append(out, &pa)
	}
	return out
}

// authz reads an Authorization written in YAML; "" is nil.
func authz(t *testing.T, y string) *securitypb.Authorization {
	t.Helper()
	if y == "" {
		return nil
	}
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	a := &securitypb.Authorization{}
	if err := protojson.Unmarshal(j, a); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestConvert mirrors istiod's ambient PeerAuthentication cases: a pod
// app=a in namespace foo, the keys it lists and the converted policy of
// its workload policy.
func TestConvert(t *testing.T) {
	static := []string{"istio-system/istio_converted_static_strict"}
	for _, tc := range []struct {
		name     string
		policies string
		keys     []string
		want     string // the rules of the converted policy, YAML
	}{
		{name: "none"},
		{
			name:     "namespace strict",
			policies: "metadata: {name: strict}\nspec: {mtls: {mode: STRICT}}",
			keys:     static,
		},
		{
			name:     "namespace permissive",
			policies: "metadata: {name: permissive}\nspec: {mtls: {mode: PERMISSIVE}}",
		},
		{
			name:     "namespace disable is permissive",
			policies: "metadata: {name: disable}\nspec: {mtls: {mode: DISABLE}}",
		},
		{
			name:     "mesh strict",
			policies: "metadata: {name: default, namespace: istio-system}\nspec: {mtls: {mode: STRICT}}",
			keys:     static,
		},
		{
			name:     "mesh with empty matchLabels is mesh-wide",
			policies: "metadata: {name: default, namespace: istio-system}\nspec: {selector: {matchLabels: {}}, mtls: {mode: STRICT}}",
			keys:     static,
		},
		{
			name:     "root namespace workload policy ignored",
			policies: "metadata: {name: w, namespace: istio-system}\nspec: {selector: {matchLabels: {app: a}}, mtls: {mode: STRICT}}",
		},
		{
			name:     "workload strict",
			policies: "metadata: {name: w}\nspec: {selector: {matchLabels: {app: a}}, mtls: {mode: STRICT}}",
			keys:     static,
		},
		{
			name:     "workload selecting other pods",
			policies: "metadata: {name: w}\nspec: {selector: {matchLabels: {app: b}}, mtls: {mode: STRICT}}",
		},
		{
			name:     "other namespace",
			policies: "metadata: {name: strict, namespace: bar}\nspec: {mtls: {mode: STRICT}}",
		},
		{
			name: "strict and permissive port",
			policies: `metadata: {name: strict-and-permissive-mtls}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: STRICT}, portLevelMtls: {9090: {mode: PERMISSIVE}}}`,
			keys: []string{"foo/converted_peer_authentication_strict-and-permissive-mtls"},
			want: `- clauses:
  - matches: [{notPrincipals: [{presence: {}}]}]
  - matches: [{notDestinationPorts: [9090]}]`,
		},
		{
			name: "strict and disable port",
			policies: `metadata: {name: strict-and-disable-mtls}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: STRICT}, portLevelMtls: {9090: {mode: DISABLE}}}`,
			keys: []string{"foo/converted_peer_authentication_strict-and-disable-mtls"},
			want: `- clauses:
  - matches: [{notPrincipals: [{presence: {}}]}]
  - matches: [{notDestinationPorts: [9090]}]`,
		},
		{
			name: "strict with only strict ports is the static policy",
			policies: `metadata: {name: w}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: STRICT}, portLevelMtls: {9090: {mode: STRICT}, 8080: {mode: UNSET}}}`,
			keys: static,
		},
		{
			name: "disable with a strict port",
			policies: `metadata: {name: disable-mtls}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: DISABLE}, portLevelMtls: {9090: {mode: STRICT}}}`,
			keys: []string{"foo/converted_peer_authentication_disable-mtls"},
			want: `- clauses:
  - matches: [{notPrincipals: [{presence: {}}], destinationPorts: [9090]}]`,
		},
		{
			name: "permissive with strict and permissive ports",
			policies: `metadata: {name: w}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: PERMISSIVE}, portLevelMtls: {8080: {mode: STRICT}, 9090: {mode: PERMISSIVE}}}`,
			keys: []string{"foo/converted_peer_authentication_w"},
			want: `- clauses:
  - matches: [{notPrincipals: [{presence: {}}], destinationPorts: [8080]}]`,
		},
		{
			name: "unset with a strict port and no parent",
			policies: `metadata: {name: strict-mtls}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: UNSET}, portLevelMtls: {8080: {mode: STRICT}}}`,
			keys: []string{"foo/converted_peer_authentication_strict-mtls"},
			want: `- clauses:
  - matches: [{notPrincipals: [{presence: {}}], destinationPorts: [8080]}]`,
		},
		{
			name: "permissive root, permissive namespace, strict workload ports",
			policies: `metadata: {name: default-mesh, namespace: istio-system}
spec: {mtls: {mode: PERMISSIVE}}
---
metadata: {name: default-foo}
spec: {mtls: {mode: PERMISSIVE}}
---
metadata: {name: workload}
spec: {selector: {matchLabels: {app: a}}, portLevelMtls: {9090: {mode: STRICT}, 8080: {mode: STRICT}}}`,
			keys: []string{"foo/converted_peer_authentication_workload"},
			want: `- clauses:
  - matches: [{notPrincipals: [{presence: {}}], destinationPorts: [8080]}]
- clauses:
  - matches: [{notPrincipals: [{presence: {}}], destinationPorts: [9090]}]`,
		},
		{
			name: "permissive root, unset namespace, mixed workload ports",
			policies: `metadata: {name: default-mesh, namespace: istio-system}
spec: {mtls: {mode: PERMISSIVE}}
---
metadata: {name: default-foo}
spec: {mtls: {mode: UNSET}}
---
metadata: {name: workload}
spec: {selector: {matchLabels: {app: a}}, portLevelMtls: {9090: {mode: STRICT}, 8080: {mode: PERMISSIVE}}}`,
			keys: []string{"foo/converted_peer_authentication_workload"},
			want: `- clauses:
  - matches: [{notPrincipals: [{presence: {}}], destinationPorts: [9090]}]`,
		},
		{
			name: "strict namespace, unset workload, permissive port",
			policies: `metadata: {name: default-foo}
spec: {mtls: {mode: STRICT}}
---
metadata: {name: workload}
spec: {selector: {matchLabels: {app: a}}, portLevelMtls: {9090: {mode: PERMISSIVE}, 8080: {mode: PERMISSIVE}}}`,
			keys: []string{"foo/converted_peer_authentication_workload"},
			want: `- clauses:
  - matches: [{notDestinationPorts: [8080]}]
  - matches: [{notDestinationPorts: [9090]}]
  - matches: [{notPrincipals: [{presence: {}}]}]`,
		},
		{
			name: "strict mesh, unset namespace, unset workload, disable port",
			policies: `metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
metadata: {name: default-foo}
spec: {mtls: {}}
---
metadata: {name: workload}
spec: {selector: {matchLabels: {app: a}}, portLevelMtls: {9090: {mode: DISABLE}}}`,
			keys: []string{"foo/converted_peer_authentication_workload"},
			want: `- clauses:
  - matches: [{notDestinationPorts: [9090]}]
  - matches: [{notPrincipals: [{presence: {}}]}]`,
		},
		{
			name: "strict mesh, permissive workload, strict port",
			policies: `metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
metadata: {name: workload}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: PERMISSIVE}, portLevelMtls: {8080: {mode: STRICT}}}`,
			keys: []string{"foo/converted_peer_authentication_workload"},
			want: `- clauses:
  - matches: [{notPrincipals: [{presence: {}}], destinationPorts: [8080]}]`,
		},
		{
			name: "permissive root, strict namespace, permissive workload",
			policies: `metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: PERMISSIVE}}
---
metadata: {name: default-foo}
spec: {mtls: {mode: STRICT}}
---
metadata: {name: workload}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: PERMISSIVE}}`,
		},
		{
			name: "strict root, permissive workload",
			policies: `metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
metadata: {name: workload}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: PERMISSIVE}}`,
		},
		{
			name: "strict root, permissive namespace, strict workload",
			policies: `metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
metadata: {name: default-foo}
spec: {mtls: {mode: PERMISSIVE}}
---
metadata: {name: workload}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: STRICT}}`,
			keys: static,
		},
		{
			name: "strict root, unset namespace inherits",
			policies: `metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
metadata: {name: default-foo}
spec: {}`,
			keys: static,
		},
		{
			name: "oldest namespace policy wins",
			policies: `metadata: {name: new, creationTimestamp: "2026-02-01T00:00:00Z"}
spec: {mtls: {mode: PERMISSIVE}}
---
metadata: {name: old, creationTimestamp: "2026-01-01T00:00:00Z"}
spec: {mtls: {mode: STRICT}}`,
			keys: static,
		},
		{
			name: "same age: the first name wins",
			policies: `metadata: {name: b, creationTimestamp: "2026-01-01T00:00:00Z"}
spec: {mtls: {mode: STRICT}}
---
metadata: {name: a, creationTimestamp: "2026-01-01T00:00:00Z"}
spec: {mtls: {mode: PERMISSIVE}}`,
		},
		{
			name: "oldest workload policy wins",
			policies: `metadata: {name: old}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: PERMISSIVE}}
---
metadata: {name: new}
spec: {selector: {matchLabels: {app: a}}, mtls: {mode: STRICT}}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var applicable []*securityv1.PeerAuthentication
			for _, pa := range parse(t, tc.policies) {
				if Applies(root, pa, "foo", map[string]string{"app": "a", "version": "v1"}) {
					applicable = append(applicable, pa)
				}
			}
			e := Select(root, applicable)
			if diff := cmp.Diff(tc.keys, Keys(root, e)); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
			var got *securitypb.Authorization
			if e.Workload != nil {
				got = Convert(root, e.Workload, e.ParentStrict())
			}
			var want *securitypb.Authorization
			if tc.want != "" {
				name := strings.TrimPrefix(tc.keys[0], "foo/")
				want = authz(t, "name: "+name+"\nnamespace: foo\nscope: WORKLOAD_SELECTOR\naction: DENY\nrules:\n"+tc.want)
			}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("converted policy (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKeysMatchConvert: a workload lists a converted policy exactly when
// one is made, for every combination of modes, so ztunnel is never asked
// for a policy that is not published.
func TestKeysMatchConvert(t *testing.T) {
	modes := []string{"", "UNSET", "DISABLE", "PERMISSIVE", "STRICT"}
	spec := func(m string) string {
		if m == "" {
			return "{}"
		}
		return "{mode: " + m + "}"
	}
	for _, mesh := range modes {
		for _, ns := range modes {
			for _, wl := range modes {
				for _, port := range modes[1:] {
					docs := "metadata: {name: m, namespace: istio-system}\nspec: {mtls: " + spec(mesh) + "}\n---\n" +
						"metadata: {name: n}\nspec: {mtls: " + spec(ns) + "}\n---\n" +
						"metadata: {name: w}\nspec: {selector: {matchLabels: {app: a}}, mtls: " + spec(wl) + ", portLevelMtls: {80: " + spec(port) + "}}"
					e := Select(root, parse(t, docs))
					conv := Convert(root, e.Workload, e.ParentStrict())
					keys := Keys(root, e)
					listed := len(keys) == 1 && keys[0] == "foo/converted_peer_authentication_w"
					if listed != (conv != nil) {
						t.Errorf("mesh %q ns %q workload %q port %q: keys %v, converted %v", mesh, ns, wl, port, keys, conv)
					}
				}
			}
		}
	}
}

func TestStaticStrict(t *testing.T) {
	want := authz(t, `name: istio_converted_static_strict
namespace: istio-system
scope: WORKLOAD_SELECTOR
action: DENY
rules:
- clauses:
  - matches: [{notPrincipals: [{presence: {}}]}]`)
	if diff := cmp.Diff(want, StaticStrict(root), protocmp.Transform()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestLevelOf(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want Level
	}{
		{"metadata: {name: x, namespace: istio-system}", Mesh},
		{"metadata: {name: x, namespace: istio-system}\nspec: {selector: {matchLabels: {app: a}}}", Ignored},
		{"metadata: {name: x}", Namespace},
		{"metadata: {name: x}\nspec: {selector: {}}", Namespace},
		{"metadata: {name: x}\nspec: {selector: {matchLabels: {app: a}}}", Workload},
	} {
		if got := LevelOf(root, parse(t, tc.doc)[0]); got != tc.want {
			t.Errorf("%s: level %d, want %d", tc.doc, got, tc.want)
		}
	}
}
