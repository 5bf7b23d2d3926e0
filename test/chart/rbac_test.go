package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// cniAccounts are the service accounts of the CNI agent, whose token is on
// every node, and of its cleanup Job, which runs the agent's image. Root on
// one node holds the agent's token: with pods patch or update it could
// change the image of any pod in the cluster.
var cniAccounts = []string{"weft-cni-agent", "weft-cni-cleanup"}

// podVerbs are the verbs the CNI accounts may hold on pods and on their
// subresources; any other subresource (exec, eviction, ephemeralcontainers,
// binding, ...) is refused.
var podVerbs = map[string][]string{
	"pods":        {"get", "list", "watch"},
	"pods/status": {"patch"},
}

// TestCNIRBAC checks, in every render, that the CNI accounts can read pods
// and patch pods/status (which keeps a pod's spec; the redirection
// annotation goes through it) but neither patch, update, create nor delete
// pods, nor hold any wildcard.
func TestCNIRBAC(t *testing.T) {
	h := newHelm(t)
	for _, r := range renders {
		t.Run(r.name, func(t *testing.T) {
			var args []string
			if r.values != "" {
				args = []string{"--values", valuesFile(t, r.values)}
			}
			checkCNIRBAC(t, decode(t, h.mustTemplate(t, args...)))
		})
	}
}

// TestCNIRoles pins the CNI accounts' roles in the default render to what
// the agent and the cleanup Job do, so that a new right is a decision.
func TestCNIRoles(t *testing.T) {
	h := newHelm(t)
	o := decode(t, h.mustTemplate(t))
	core := func(res string, verbs ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{res}, Verbs: verbs}
	}
	want := map[string][]rbacv1.PolicyRule{
		// The node's pods and all namespaces, watched; a new pod read
		// once if the cache lags; the redirection annotation.
		"ClusterRole/weft-cni-agent": {
			core("pods", "get", "list", "watch"),
			core("pods/status", "patch"),
			core("namespaces", "get", "list", "watch"),
		},
		// Its own DaemonSet, to tell an upgrade from an uninstall.
		"Role/weft-cni-agent": {{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{"weft-cni-agent"}, Verbs: []string{"get"}}},
		// Every pod listed once, the annotation removed.
		"ClusterRole/weft-cni-cleanup-" + namespace: {
			core("pods", "list"),
			core("pods/status", "patch"),
		},
	}
	got := map[string][]rbacv1.PolicyRule{}
	for _, sa := range cniAccounts {
		for role, rules := range boundRules(o, sa) {
			got[role] = rules
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("the CNI accounts' roles (-want +got):\n%s", d)
	}
}

// checkCNIRBAC applies podVerbs to every rule bound to a CNI account.
func checkCNIRBAC(t *testing.T, o *objects) {
	t.Helper()
	for _, sa := range cniAccounts {
		for role, rules := range boundRules(o, sa) {
			for _, r := range rules {
				for _, field := range [][]string{r.Verbs, r.Resources, r.APIGroups, r.ResourceNames} {
					if slices.ContainsFunc(field, func(s string) bool { return strings.Contains(s, "*") }) {
						t.Errorf("%s (bound to %s) grants a wildcard: %+v", role, sa, r)
					}
				}
				if !slices.Contains(r.APIGroups, "") {
					continue
				}
				for _, res := range r.Resources {
					if res != "pods" && !strings.HasPrefix(res, "pods/") {
						continue
					}
					allowed, ok := podVerbs[res]
					if !ok {
						t.Errorf("%s (bound to %s) grants %v on %s", role, sa, r.Verbs, res)
						continue
					}
					for _, v := range r.Verbs {
						if !slices.Contains(allowed, v) {
							t.Errorf("%s (bound to %s) grants %s on %s; allowed: %v", role, sa, v, res, allowed)
						}
					}
				}
			}
		}
	}
}

// boundRules returns the rules of every role the chart binds to the
// service account sa of the release namespace, by "Kind/name".
func boundRules(o *objects, sa string) map[string][]rbacv1.PolicyRule {
	subject := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == namespace
		})
	}
	refs := map[rbacv1.RoleRef]bool{}
	for _, b := range o.clusterRoleBindings {
		if subject(b.Subjects) {
			refs[b.RoleRef] = true
		}
	}
	for _, b := range o.roleBindings {
		if subject(b.Subjects) {
			refs[b.RoleRef] = true
		}
	}
	out := map[string][]rbacv1.PolicyRule{}
	for _, r := range o.clusterRoles {
		if refs[rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.Name}] {
			out["ClusterRole/"+r.Name] = r.Rules
		}
	}
	for _, r := range o.roles {
		if refs[rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: r.Name}] {
			out["Role/"+r.Name] = r.Rules
		}
	}
	return out
}

// TestCNIAdmissionPolicy checks that wherever the CNI accounts hold
// pods/status patch, an admission policy that fails closed, and is bound
// to deny, narrows it to the redirection annotation for both accounts.
func TestCNIAdmissionPolicy(t *testing.T) {
	h := newHelm(t)
	for _, r := range renders {
		t.Run(r.name, func(t *testing.T) {
			var args []string
			if r.values != "" {
				args = []string{"--values", valuesFile(t, r.values)}
			}
			o := decode(t, h.mustTemplate(t, args...))
			if len(boundRules(o, "weft-cni-agent")) == 0 {
				if len(o.policies) != 0 {
					t.Errorf("admission policies without the CNI agent: %d", len(o.policies))
				}
				return
			}
			if len(o.policies) != 1 || len(o.policyBindings) != 1 {
				t.Fatalf("%d admission policies and %d bindings, want one of each", len(o.policies), len(o.policyBindings))
			}
			p, b := o.policies[0], o.policyBindings[0]
			if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail {
				t.Errorf("policy %s does not fail closed", p.Name)
			}
			rules := p.Spec.MatchConstraints.ResourceRules
			if len(rules) != 1 || !slices.Equal(rules[0].Resources, []string{"pods/status"}) || !slices.Equal(rules[0].APIGroups, []string{""}) {
				t.Errorf("policy %s matches %+v, want pods/status", p.Name, rules)
			}
			if len(p.Spec.MatchConditions) != 1 {
				t.Fatalf("policy %s has match conditions %+v", p.Name, p.Spec.MatchConditions)
			}
			for _, sa := range cniAccounts {
				if !strings.Contains(p.Spec.MatchConditions[0].Expression, "'system:serviceaccount:"+namespace+":"+sa+"'") {
					t.Errorf("policy %s does not apply to %s", p.Name, sa)
				}
			}
			if b.Spec.PolicyName != p.Name || !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) || b.Spec.MatchResources != nil {
				t.Errorf("binding %s: %+v, want Deny for every match of %s", b.Name, b.Spec, p.Name)
			}
		})
	}
}
