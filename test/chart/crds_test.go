package chart

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// crd is the part of an apiextensions.k8s.io/v1 CustomResourceDefinition
// the test reads (k8s.io/apiextensions-apiserver is not a dependency of the
// module).
type crd struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Group string `json:"group"`
		Names struct {
			Plural string `json:"plural"`
			Kind   string `json:"kind"`
		} `json:"names"`
		Scope    string       `json:"scope"`
		Versions []crdVersion `json:"versions"`
	} `json:"spec"`
}

type crdVersion struct {
	Name    string `json:"name"`
	Served  bool   `json:"served"`
	Storage bool   `json:"storage"`
	Schema  struct {
		OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
	} `json:"schema"`
}

// served reports whether the CRD serves version v.
func (c *crd) served(v string) bool {
	return slices.ContainsFunc(c.Spec.Versions, func(x crdVersion) bool { return x.Name == v && x.Served })
}

// readCRDs parses every file of charts/weft/crds, one CRD per file, by
// <plural>.<group>.
func readCRDs(t *testing.T) map[string]*crd {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "charts", "weft", "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in charts/weft/crds: %v", err)
	}
	crds := map[string]*crd{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var c crd
		if err := yaml.Unmarshal(b, &c); err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		if c.APIVersion != "apiextensions.k8s.io/v1" || c.Kind != "CustomResourceDefinition" {
			t.Errorf("%s: %s %s, want one apiextensions.k8s.io/v1 CustomResourceDefinition", filepath.Base(f), c.APIVersion, c.Kind)
			continue
		}
		if c.Metadata.Name != c.Spec.Names.Plural+"."+c.Spec.Group {
			t.Errorf("%s: CRD %s, want %s.%s", filepath.Base(f), c.Metadata.Name, c.Spec.Names.Plural, c.Spec.Group)
		}
		storage := 0
		for _, v := range c.Spec.Versions {
			if v.Storage {
				storage++
			}
			if v.Served && len(v.Schema.OpenAPIV3Schema) == 0 {
				t.Errorf("%s: version %s is served without a schema", c.Metadata.Name, v.Name)
			}
		}
		if storage != 1 {
			t.Errorf("%s: %d storage versions, want one", c.Metadata.Name, storage)
		}
		if c.Spec.Scope != "Namespaced" && c.Spec.Scope != "Cluster" {
			t.Errorf("%s: scope %q", c.Metadata.Name, c.Spec.Scope)
		}
		crds[c.Metadata.Name] = &c
	}
	return crds
}

// TestCRDs parses the chart's CRDs, checks that the ones Weft reads are
// there, and that every resource of these groups the templates name (RBAC
// rules, webhook rules) and every custom object they render is defined.
func TestCRDs(t *testing.T) {
	crds := readCRDs(t)
	for name, version := range map[string]string{
		"gateways.gateway.networking.k8s.io":       "v1",
		"gatewayclasses.gateway.networking.k8s.io": "v1",
		"httproutes.gateway.networking.k8s.io":     "v1",
		"grpcroutes.gateway.networking.k8s.io":     "v1",
		"authorizationpolicies.security.istio.io":  "v1",
		"peerauthentications.security.istio.io":    "v1",
		"serviceentries.networking.istio.io":       "v1",
		"workloadentries.networking.istio.io":      "v1",
	} {
		c, ok := crds[name]
		if !ok {
			t.Errorf("no CRD %s in charts/weft/crds", name)
			continue
		}
		if !c.served(version) {
			t.Errorf("CRD %s does not serve %s", name, version)
		}
	}
	if c := crds["authorizationpolicies.security.istio.io"]; c != nil && (c.Spec.Names.Kind != "AuthorizationPolicy" || !c.served("v1beta1")) {
		t.Errorf("AuthorizationPolicy CRD: kind %s, v1beta1 served %v; Istio's policies use both versions", c.Spec.Names.Kind, c.served("v1beta1"))
	}
	if c := crds["peerauthentications.security.istio.io"]; c != nil && (c.Spec.Names.Kind != "PeerAuthentication" || !c.served("v1beta1")) {
		t.Errorf("PeerAuthentication CRD: kind %s, v1beta1 served %v; Istio's policies use both versions", c.Spec.Names.Kind, c.served("v1beta1"))
	}

	h := newHelm(t)
	for _, r := range renders {
		var args []string
		if r.values != "" {
			args = []string{"--values", valuesFile(t, r.values)}
		}
		o := decode(t, h.mustTemplate(t, args...))
		defined := func(where, group, resource string, versions ...string) {
			if !strings.Contains(group, ".") || (strings.HasSuffix(group, ".k8s.io") && group != "gateway.networking.k8s.io") {
				return // built in
			}
			resource, _, _ = strings.Cut(resource, "/")
			c, ok := crds[resource+"."+group]
			if !ok {
				t.Errorf("%s: %s names %s.%s, which no CRD of the chart defines", r.name, where, resource, group)
				return
			}
			for _, v := range versions {
				if !c.served(v) {
					t.Errorf("%s: %s names %s.%s %s, which its CRD does not serve", r.name, where, resource, group, v)
				}
			}
		}
		for _, cr := range o.clusterRoles {
			for _, rule := range cr.Rules {
				for _, g := range rule.APIGroups {
					for _, res := range rule.Resources {
						defined("ClusterRole "+cr.Name, g, res)
					}
				}
			}
		}
		for _, c := range o.validating {
			for _, w := range c.Webhooks {
				if w.Name == "istio-unsupported.validation.weft.dev" {
					continue // refuses others' kinds where their CRDs are installed
				}
				for _, rule := range w.Rules {
					for _, g := range rule.APIGroups {
						for _, res := range rule.Resources {
							defined("webhook "+w.Name, g, res, rule.APIVersions...)
						}
					}
				}
			}
		}
		for _, c := range o.mutating {
			for _, w := range c.Webhooks {
				for _, rule := range w.Rules {
					for _, g := range rule.APIGroups {
						for _, res := range rule.Resources {
							defined("webhook "+w.Name, g, res, rule.APIVersions...)
						}
					}
				}
			}
		}
		for _, gc := range o.gatewayClasses {
			defined("GatewayClass "+gc.Name, "gateway.networking.k8s.io", "gatewayclasses", "v1")
		}
	}
}
