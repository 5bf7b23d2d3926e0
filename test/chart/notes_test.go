package chart

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// renderNotes renders templates/NOTES.txt with the given values.
//
// helm template never prints the notes, and helm install --dry-run needs a
// cluster, so the test renders them through a copy of the chart that holds
// NOTES.txt as a named template and one ConfigMap carrying its output: the
// same engine, values and release as helm install's notes.
func renderNotes(t *testing.T, h *helm, args ...string) string {
	t.Helper()
	chart := filepath.Join(t.TempDir(), "weft")
	err := filepath.WalkDir(h.chart, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(h.chart, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel == "crds" {
				return filepath.SkipDir // not rendered
			}
			return os.MkdirAll(filepath.Join(chart, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(chart, rel), b, 0o644)
	})
	if err != nil {
		t.Fatalf("copying the chart: %v", err)
	}
	notes, err := os.ReadFile(filepath.Join(h.chart, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"_weft_test_notes.tpl": `{{ define "weft-test.notes" }}` + string(notes) + `{{ end }}`,
		"weft-test-notes.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: weft-test-notes}\n" +
			"data:\n  notes: {{ include \"weft-test.notes\" . | toJson }}\n",
	} {
		if err := os.WriteFile(filepath.Join(chart, "templates", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := h.template(chart, append(args, "--show-only", "templates/weft-test-notes.yaml")...)
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict([]byte(out), &cm); err != nil {
		t.Fatalf("the notes ConfigMap: %v\n%s", err, out)
	}
	return strings.TrimSpace(cm.Data["notes"])
}

// TestNotes checks that the install notes tell the user how to add a
// namespace to the mesh, how to add a waypoint (when waypoints are
// enabled), how to read the audit log of the configured sink, and what
// uninstalling does (when the CNI agent runs).
func TestNotes(t *testing.T) {
	h := newHelm(t)
	label := "kubectl label namespace <ns> istio.io/dataplane-mode=ambient"
	waypoint := []string{"gatewayClassName: istio-waypoint", "listeners: [{name: mesh, port: 15008, protocol: HBONE}]", "kubectl label namespace <ns> istio.io/use-waypoint=waypoint",
		"gatewayClassName: istio\n", "listeners: [{name: http, port: 80, protocol: HTTP}]"}
	stdoutAudit := []string{"kubectl -n weft-system logs -l app=weft-webhook", `grep '"apiVersion":"audit.k8s.io/v1"'`}
	unauthenticated := "does not authenticate its callers (webhook.clientCA.verify=none)"
	for _, tc := range []struct {
		name      string
		values    string
		want, not []string
	}{
		{
			name: "default",
			want: append(append([]string{label, "Weft 0.1.0 is installed in namespace weft-system", "(weft/waypoint:0.1.0)", "helm uninstall weft -n weft-system", unauthenticated}, waypoint...), stdoutAudit...),
		},
		{
			name:   "custom",
			values: "custom-values.yaml",
			want:   append([]string{label, "/var/log/weft-audit/decisions.log", "rotated at\n  50 MB", "(registry.example:5000/mesh/weft-waypoint:1.2.3-debug)"}, waypoint...),
			not:    append([]string{unauthenticated}, stdoutAudit...),
		},
		{
			name:   "disabled",
			values: "disabled-values.yaml",
			want:   append([]string{label}, stdoutAudit...),
			not:    append([]string{"istio-waypoint", "waypoint:", "removes the CNI"}, waypoint...),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			if tc.values != "" {
				args = []string{"--values", valuesFile(t, tc.values)}
			}
			notes := renderNotes(t, h, args...)
			for _, s := range tc.want {
				if !strings.Contains(notes, s) {
					t.Errorf("the notes do not say %q:\n%s", s, notes)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(notes, s) {
					t.Errorf("the notes say %q:\n%s", s, notes)
				}
			}
			if strings.Contains(notes, "<no value>") {
				t.Errorf("the notes print a missing value:\n%s", notes)
			}
		})
	}
}
