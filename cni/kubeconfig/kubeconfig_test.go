package kubeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var sample = Config{Server: "https://10.96.0.1:443", CAData: []byte("-----BEGIN CERTIFICATE-----\n...\n"), Token: "tok"}

func TestWriteRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	changed, err := Write(path, sample)
	if err != nil || !changed {
		t.Fatalf("Write = %v, %v", changed, err)
	}
	if changed, err := Write(path, sample); err != nil || changed {
		t.Fatalf("second Write = %v, %v; want unchanged", changed, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sample, got); diff != "" {
		t.Fatalf("(-want +got)\n%s", diff)
	}
	rotated := sample
	rotated.Token = "tok2"
	if changed, err := Write(path, rotated); err != nil || !changed {
		t.Fatalf("Write of a new token = %v, %v", changed, err)
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("temporary files left: %v", ents)
	}
}

func TestParseRejects(t *testing.T) {
	good, err := sample.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, body, want string
	}{
		{"not json", "server: x", "parsing kubeconfig"},
		{"no context", strings.Replace(string(good), `"current-context": "weft-cni"`, `"current-context": "other"`, 1), `no context "other"`},
		{"http server", strings.Replace(string(good), "https://", "http://", 1), "not an https URL"},
		{"no token", strings.Replace(string(good), `"token": "tok"`, `"token": ""`, 1), "no token"},
	}
	for _, tt := range tests {
		if _, err := Parse([]byte(tt.body)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Parse = %v, want %q", tt.name, err, tt.want)
		}
	}
	if _, err := (Config{Server: "https://x", Token: "t"}).Marshal(); err == nil {
		t.Error("Marshal accepted a config without a CA")
	}
}
