package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// renders are the value sets the chart is linted and rendered with: the
// defaults, every knob changed, and the optional parts switched off.
var renders = []struct {
	name   string // the golden is testdata/<name>.golden.yaml
	values string // a values file in testdata; empty: the defaults
}{
	{name: "default"},
	{name: "custom", values: "custom-values.yaml"},
	{name: "disabled", values: "disabled-values.yaml"},
}

// TestLint runs helm lint --strict with each value set: it must pass and
// print no warning or error (lint's [INFO] lines are only logged).
func TestLint(t *testing.T) {
	h := newHelm(t)
	for _, r := range renders {
		t.Run(r.name, func(t *testing.T) {
			args := []string{"lint", "--strict", h.chart, "--namespace", namespace, "--kube-version", kubeVersion}
			if r.values != "" {
				args = append(args, "--values", valuesFile(t, r.values))
			}
			out, err := h.run(args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, line := range strings.Split(out, "\n") {
				switch {
				case strings.Contains(line, "[WARNING]"), strings.Contains(line, "[ERROR]"):
					t.Errorf("helm lint: %s", line)
				case strings.Contains(line, "[INFO]"):
					t.Logf("helm lint: %s", line)
				}
			}
		})
	}
}

// TestRender compares each render with its golden file and checks that
// rendering twice gives the same bytes.
func TestRender(t *testing.T) {
	h := newHelm(t)
	for _, r := range renders {
		t.Run(r.name, func(t *testing.T) {
			var args []string
			if r.values != "" {
				args = []string{"--values", valuesFile(t, r.values)}
			}
			got := h.mustTemplate(t, args...)
			compareGolden(t, filepath.Join("testdata", r.name+".golden.yaml"), got)
			if again := h.mustTemplate(t, args...); again != got {
				t.Error("two renders of the same values differ: the chart is not deterministic")
			}
			for _, s := range []string{"BEGIN CERTIFICATE", "PRIVATE KEY"} {
				if strings.Contains(got, s) {
					t.Errorf("the render holds %q: key material must come from the webhook and the control plane at run time", s)
				}
			}
		})
	}
}

// nondeterministic are the template functions whose output changes from
// one render to the next (sprig's generators, the clock) or with the
// cluster (lookup, which helm template answers with nothing).
var nondeterministic = regexp.MustCompile(`\b(genCA|genCAWithKey|genSelfSignedCert|genSelfSignedCertWithKey|genSignedCert|genSignedCertWithKey|genPrivateKey|derivePassword|randAlpha|randAlphaNum|randAscii|randNumeric|randBytes|randInt|uuidv4|now|date|dateInZone|unixEpoch|lookup)\b`)

// TestTemplatesDeterministic scans the templates for functions that would
// make a render differ between runs, between helm template and helm
// install, or from the goldens: the webhook makes its own certificates, the
// control plane its CA.
func TestTemplatesDeterministic(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "charts", "weft", "templates", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no templates: %v", err)
	}
	action := regexp.MustCompile(`(?s)\{\{.*?\}\}`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range action.FindAllString(string(b), -1) {
			if strings.HasPrefix(strings.TrimLeft(a, "{- "), "/*") {
				continue
			}
			if m := nondeterministic.FindString(a); m != "" {
				t.Errorf("%s: %s calls %s, which renders differently every time", filepath.Base(f), a, m)
			}
		}
	}
}
