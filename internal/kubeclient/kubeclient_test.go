package kubeclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kubeconfig")
	const kc = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://192.0.2.10:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: abc}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := Config(path, "weft-test")
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://192.0.2.10:6443" || rc.BearerToken != "abc" || rc.UserAgent != "weft-test" {
		t.Errorf("config %s token %q agent %q", rc.Host, rc.BearerToken, rc.UserAgent)
	}

	missing := filepath.Join(dir, "missing")
	if _, err := Config(missing, "weft-test"); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("a missing kubeconfig: %v, want an error naming it", err)
	}
	// Outside a pod there is no service account: the error says what to do.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := Config("", "weft-test"); err == nil || !strings.Contains(err.Error(), "pass --kubeconfig") {
		t.Errorf("no kubeconfig outside a cluster: %v, want an error saying to pass --kubeconfig", err)
	}
}
