package main

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/weftmesh/weft/internal/logging"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func TestParseFlags(t *testing.T) {
	cfg, format, level, err := parseFlags([]string{"--node-name=n1", "--pod-namespace=weft", "--excluded-namespaces=kube-system, infra", "--probe-uid=0", "--ipv6=false", "--log-format=text"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != "n1" || cfg.PodNamespace != "weft" || cfg.ProbeUID != 0 || cfg.IPv6 || format != "text" || level != "info" {
		t.Fatalf("parsed %+v %s %s", cfg, format, level)
	}
	if diff := cmp.Diff([]string{"kube-system", "infra"}, cfg.ExcludedNamespaces); diff != "" {
		t.Fatalf("excluded (-want +got):\n%s", diff)
	}
	for _, bad := range [][]string{{"--no-such-flag"}, {"extra-arg"}, {"--probe-uid=x"}} {
		if _, _, _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
	if err := logging.Check("xml", "info"); err == nil {
		t.Error("log format xml accepted")
	}
}

// TestChart renders the chart's CNI templates (golden; the agent's RBAC
// test in cni/agent applies its roles to a real API server) and runs the
// agent's flag parser and validation on the DaemonSet's arguments, so the
// chart and the binary cannot drift apart.
func TestChart(t *testing.T) {
	helm, err := filepath.Abs("../../../bin/helm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(helm); err != nil {
		t.Skip("bin/helm is not built: run make tools (scripts/tools.sh helm)")
	}
	tmp := t.TempDir()
	cmd := exec.Command(helm, "template", "weft", "../../../charts/weft", "--namespace", "weft-system", "--kube-version", "1.37.2",
		"--show-only", "templates/cni-agent.yaml", "--show-only", "templates/cni-rbac.yaml", "--show-only", "templates/cni-cleanup.yaml", "--show-only", "templates/cni-admission-policy.yaml")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+tmp, "HELM_CONFIG_HOME="+tmp, "HELM_DATA_HOME="+tmp)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	golden := filepath.Join("testdata", "chart.golden.yaml")
	if *update {
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if diff := cmp.Diff(string(want), string(out)); diff != "" {
		t.Errorf("rendered chart differs from %s (-golden +got); -update if intended:\n%s", golden, diff)
	}

	var ds struct {
		Kind string
		Spec struct {
			Template struct {
				Spec struct {
					HostNetwork bool `json:"hostNetwork"`
					Containers  []struct {
						Args []string
					}
				}
			}
		}
	}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if err := yaml.Unmarshal([]byte(doc), &ds); err == nil && ds.Kind == "DaemonSet" {
			break
		}
	}
	if ds.Kind != "DaemonSet" || len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("no agent DaemonSet in the chart:\n%s", out)
	}
	if !ds.Spec.Template.Spec.HostNetwork {
		t.Error("the agent must run with hostNetwork")
	}
	cfg, format, level, err := parseFlags(ds.Spec.Template.Spec.Containers[0].Args)
	if err != nil {
		t.Fatalf("the agent rejects the chart's arguments: %v", err)
	}
	if err := logging.Check(format, level); err != nil {
		t.Fatal(err)
	}
	cfg.NodeName, cfg.PodNamespace = "node1", "weft-system"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the chart's configuration does not validate: %v", err)
	}
	if cfg.HostRunDir != "/var/run/weft-cni" || cfg.NetnsPathPrefix != "/host" || cfg.ZtunnelSocket != "/var/run/ztunnel/ztunnel.sock" {
		t.Fatalf("chart configuration %+v", cfg)
	}
}
