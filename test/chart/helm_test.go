package chart

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// Every render uses the release, namespace and Kubernetes version of the
// other chart tests (webhook/chart_test.go, cni/cmd/weft-cni-agent).
const (
	release     = "weft"
	namespace   = "weft-system"
	kubeVersion = "1.37.2"
)

// helm runs bin/helm on charts/weft with its own empty cache, config and
// data directories, so that nothing of the user's helm setup is read.
type helm struct {
	bin   string
	chart string
	env   []string
}

// newHelm returns a helm for charts/weft, skipping the test when bin/helm
// is not built.
func newHelm(t *testing.T) *helm {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("bin/helm is not built (make tools): %v", err)
	}
	return &helm{
		bin:   bin,
		chart: filepath.Join(root, "charts", "weft"),
		env: append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(),
			"HELM_DATA_HOME="+t.TempDir(), "KUBECONFIG="+filepath.Join(t.TempDir(), "none")),
	}
}

// run runs helm with args and returns its stdout; the error carries
// stderr, where helm reports schema and template failures.
func (h *helm) run(args ...string) (string, error) {
	cmd := exec.Command(h.bin, args...)
	cmd.Env = h.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// template renders chart (charts/weft unless another is given) as the
// release weft in weft-system; args add values (--set, -f).
func (h *helm) template(chart string, args ...string) (string, error) {
	if chart == "" {
		chart = h.chart
	}
	return h.run(append([]string{"template", release, chart, "--namespace", namespace, "--kube-version", kubeVersion}, args...)...)
}

// mustTemplate is template of charts/weft that fails the test on error.
func (h *helm) mustTemplate(t *testing.T, args ...string) string {
	t.Helper()
	out, err := h.template("", args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// valuesFile is the path of a values file in testdata, as helm's -f needs.
func valuesFile(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// compareGolden compares got with the golden file, or rewrites it with
// -update. The failure shows a diff of the lines.
func compareGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the golden file (run go test ./test/chart -update to create it): %v", err)
	}
	if diff := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(got, "\n")); diff != "" {
		t.Errorf("the rendered chart differs from %s (-golden +rendered); if intended, run go test ./test/chart -update and review the diff:\n%s", path, diff)
	}
}
