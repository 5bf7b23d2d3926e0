package authpolicy

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/weftmesh/weft/internal/pb/securitypb"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const testRoot = "weft-system"

// TestGolden translates every testdata/*.yaml policy and compares the result
// with testdata/*.golden. Run with -update to rewrite the golden files.
func TestGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs in testdata: %v", err)
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		t.Run(name, func(t *testing.T) {
			p := readPolicy(t, in)
			got := render(t, Translate(testRoot, p))
			golden := strings.TrimSuffix(in, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("reading golden file (run go test -update to create it): %v", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("translation of %s differs from %s (-want +got):\n%s", in, golden, diff)
			}
		})
	}
}

func readPolicy(t *testing.T, path string) *securityv1.AuthorizationPolicy {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := &securityv1.AuthorizationPolicy{}
	if err := yaml.UnmarshalStrict(data, p); err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	return p
}

// render prints a Result as stable, indented JSON.
func render(t *testing.T, r Result) []byte {
	t.Helper()
	var out struct {
		Authorization json.RawMessage   `json:"authorization"`
		Selector      map[string]string `json:"selector,omitempty"`
		Condition     *Condition        `json:"condition"`
	}
	out.Authorization = json.RawMessage("null")
	if r.Authorization != nil {
		b, err := protojson.MarshalOptions{UseProtoNames: true, UseEnumNumbers: false, EmitUnpopulated: false}.Marshal(r.Authorization)
		if err != nil {
			t.Fatal(err)
		}
		out.Authorization = b
	}
	out.Selector, out.Condition = r.Selector, r.Condition
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	// protojson varies its whitespace on purpose; normalise it.
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		t.Fatal(err)
	}
	buf.WriteByte('\n')
	return buf.Bytes()
}

func policy(ns string, spec *securityv1beta1.AuthorizationPolicy) *securityv1.AuthorizationPolicy {
	p := &securityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns}}
	p.Spec.Selector = spec.GetSelector()
	p.Spec.Rules = spec.GetRules()
	p.Spec.Action = spec.GetAction()
	p.Spec.TargetRefs = spec.GetTargetRefs()
	return p
}

func from(src *securityv1beta1.Source) *securityv1beta1.Rule {
	return &securityv1beta1.Rule{From: []*securityv1beta1.Rule_From{{Source: src}}}
}

// TestScope checks the scope rules: root namespace without selector is
// GLOBAL, other namespaces NAMESPACE, any selector WORKLOAD_SELECTOR.
func TestScope(t *testing.T) {
	sel := &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "a"}}
	tests := []struct {
		name         string
		ns           string
		selector     *typev1beta1.WorkloadSelector
		wantScope    securitypb.Scope
		wantSelector map[string]string
	}{
		{"root namespace", testRoot, nil, securitypb.Scope_GLOBAL, nil},
		{"other namespace", "shop", nil, securitypb.Scope_NAMESPACE, nil},
		{"selector", "shop", sel, securitypb.Scope_WORKLOAD_SELECTOR, map[string]string{"app": "a"}},
		{"selector in root", testRoot, sel, securitypb.Scope_WORKLOAD_SELECTOR, map[string]string{"app": "a"}},
		{"empty selector", "shop", &typev1beta1.WorkloadSelector{}, securitypb.Scope_WORKLOAD_SELECTOR, map[string]string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Translate(testRoot, policy(tc.ns, &securityv1beta1.AuthorizationPolicy{Selector: tc.selector}))
			if got := r.Authorization.GetScope(); got != tc.wantScope {
				t.Errorf("scope = %v, want %v", got, tc.wantScope)
			}
			if diff := cmp.Diff(tc.wantSelector, r.Selector); diff != "" {
				t.Errorf("selector (-want +got):\n%s", diff)
			}
			if r.Authorization.GetNamespace() != tc.ns || r.Authorization.GetName() != "p" {
				t.Errorf("named %s/%s, want %s/p", r.Authorization.GetNamespace(), r.Authorization.GetName(), tc.ns)
			}
		})
	}
}

// TestLiteralNames is the CVE-2026-39350 property: names holding regex
// metacharacters come out byte for byte as exact matches, never patterns.
func TestLiteralNames(t *testing.T) {
	names := []string{"a.b", "x[1]", "team.(a|b)", "ns+", "a?b", `back\slash`, "^start$", "{1,2}", "dot.dot.dot"}
	for _, n := range names {
		for _, field := range []string{"namespaces", "principals"} {
			src := &securityv1beta1.Source{}
			if field == "namespaces" {
				src.Namespaces = []string{n}
			} else {
				src.Principals = []string{"cluster.local/ns/" + n + "/sa/" + n}
			}
			r := Translate(testRoot, policy("shop", &securityv1beta1.AuthorizationPolicy{
				Action: securityv1beta1.AuthorizationPolicy_DENY,
				Rules:  []*securityv1beta1.Rule{from(src)},
			}))
			m := r.Authorization.GetRules()[0].GetClauses()[0].GetMatches()[0]
			var got []*securitypb.StringMatch
			want := n
			if field == "namespaces" {
				got = m.GetNamespaces()
			} else {
				got, want = m.GetPrincipals(), "cluster.local/ns/"+n+"/sa/"+n
			}
			if len(got) != 1 || got[0].GetExact() != want {
				t.Errorf("%s %q compiled to %v, want exact %q", field, n, got, want)
			}
		}
		r := Translate(testRoot, policy("shop", &securityv1beta1.AuthorizationPolicy{
			Rules: []*securityv1beta1.Rule{from(&securityv1beta1.Source{ServiceAccounts: []string{"team.a/" + n}})},
		}))
		sa := r.Authorization.GetRules()[0].GetClauses()[0].GetMatches()[0].GetServiceAccounts()
		if len(sa) != 1 || sa[0].GetNamespace() != "team.a" || sa[0].GetServiceAccount() != n {
			t.Errorf("service account team.a/%s compiled to %v", n, sa)
		}
	}
}

// TestFailClosed checks that untranslatable input never widens an ALLOW or
// narrows a DENY.
func TestFailClosed(t *testing.T) {
	bad := []*securityv1beta1.Rule{
		{To: []*securityv1beta1.Rule_To{{Operation: &securityv1beta1.Operation{Ports: []string{"0"}}}}},
		{To: []*securityv1beta1.Rule_To{{Operation: &securityv1beta1.Operation{NotPorts: []string{"65536"}}}}},
		from(&securityv1beta1.Source{IpBlocks: []string{"not-an-ip"}}),
		from(&securityv1beta1.Source{NotIpBlocks: []string{"fe80::1%eth0"}}),
		from(&securityv1beta1.Source{Principals: []string{"a*b*"}}),
		from(&securityv1beta1.Source{Namespaces: []string{""}}),
		from(&securityv1beta1.Source{Namespaces: []string{"bad\x00name"}}),
		from(&securityv1beta1.Source{ServiceAccounts: []string{"ns/"}}),
		from(&securityv1beta1.Source{ServiceAccounts: []string{"a/b/c"}}),
		{When: []*securityv1beta1.Condition{{Key: "destination.port", Values: []string{"-1"}}}},
		{When: []*securityv1beta1.Condition{{Key: "source.ip", NotValues: []string{"1.2.3.4/33"}}}},
	}
	for i, rule := range bad {
		allow := Translate(testRoot, policy("shop", &securityv1beta1.AuthorizationPolicy{Rules: []*securityv1beta1.Rule{rule}}))
		if n := len(allow.Authorization.GetRules()); n != 0 {
			t.Errorf("bad rule %d in ALLOW: %d rules sent, want 0 (allow nothing)", i, n)
		}
		deny := Translate(testRoot, policy("shop", &securityv1beta1.AuthorizationPolicy{
			Action: securityv1beta1.AuthorizationPolicy_DENY, Rules: []*securityv1beta1.Rule{rule},
		}))
		rules := deny.Authorization.GetRules()
		if len(rules) != 1 || len(rules[0].GetClauses()) != 0 {
			t.Errorf("bad rule %d in DENY: sent %v, want one rule without clauses (deny everything)", i, rules)
		}
		for _, r := range []Result{allow, deny} {
			if r.Condition == nil || r.Condition.Status || r.Condition.Reason != ReasonInvalid {
				t.Errorf("bad rule %d: condition %+v, want False/%s", i, r.Condition, ReasonInvalid)
			}
		}
	}
}

// TestUnsupportedActions checks that AUDIT and CUSTOM are reported and not
// sent.
func TestUnsupportedActions(t *testing.T) {
	for _, a := range []securityv1beta1.AuthorizationPolicy_Action{securityv1beta1.AuthorizationPolicy_AUDIT, securityv1beta1.AuthorizationPolicy_CUSTOM} {
		r := Translate(testRoot, policy("shop", &securityv1beta1.AuthorizationPolicy{Action: a}))
		if r.Authorization != nil {
			t.Errorf("%v: sent %v, want nothing", a, r.Authorization)
		}
		if r.Condition == nil || r.Condition.Status || r.Condition.Reason != ReasonUnsupportedValue {
			t.Errorf("%v: condition %+v, want False/%s", a, r.Condition, ReasonUnsupportedValue)
		}
	}
}

// TestDeterministic checks that translating twice gives equal resources, so
// that an unchanged policy is never pushed again.
func TestDeterministic(t *testing.T) {
	inputs, _ := filepath.Glob("testdata/*.yaml")
	for _, in := range inputs {
		p := readPolicy(t, in)
		a, b := Translate(testRoot, p), Translate(testRoot, p.DeepCopy())
		if diff := cmp.Diff(a.Authorization, b.Authorization, protocmp.Transform()); diff != "" {
			t.Errorf("%s: two translations differ:\n%s", in, diff)
		}
	}
}

func FuzzTranslate(f *testing.F) {
	inputs, _ := filepath.Glob("testdata/*.yaml")
	for _, in := range inputs {
		data, err := os.ReadFile(in)
		if err != nil {
			f.Fatal(err)
		}
		j, err := yaml.YAMLToJSON(data)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(j)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p := &securityv1.AuthorizationPolicy{}
		if err := json.Unmarshal(data, p); err != nil {
			return
		}
		r := Translate(testRoot, p)
		if r.Authorization == nil {
			return
		}
		if r.Condition == nil {
			t.Fatal("a translated policy has no condition")
		}
		for _, rule := range r.Authorization.GetRules() {
			for _, c := range rule.GetClauses() {
				for _, m := range c.GetMatches() {
					for _, sm := range append(append(append(m.GetPrincipals(), m.GetNotPrincipals()...), m.GetNamespaces()...), m.GetNotNamespaces()...) {
						if sm.GetMatchType() == nil {
							t.Fatalf("string match without a type: %v", m)
						}
					}
					for _, a := range append(append(append(m.GetSourceIps(), m.GetNotSourceIps()...), m.GetDestinationIps()...), m.GetNotDestinationIps()...) {
						if l := len(a.GetAddress()); (l != 4 && l != 16) || a.GetLength() > uint32(l*8) {
							t.Fatalf("bad address %v", a)
						}
					}
					for _, port := range append(m.GetDestinationPorts(), m.GetNotDestinationPorts()...) {
						if port == 0 || port > 65535 {
							t.Fatalf("bad port %d", port)
						}
					}
				}
			}
		}
		if r.Authorization.GetAction() == securitypb.Action_ALLOW && len(r.Authorization.GetRules()) > len(p.Spec.GetRules()) {
			t.Fatalf("ALLOW grew from %d to %d rules", len(p.Spec.GetRules()), len(r.Authorization.GetRules()))
		}
	})
}
