package install

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/weftmesh/weft/cni/plugin"
)

const bridgeList = `{
    "cniVersion": "1.0.0",
    "name": "k8s-pod-network",
    "plugins": [
        { "type": "bridge", "bridge": "cni0", "isGateway": true,
          "ipam": { "type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]] } },
        { "type": "portmap", "capabilities": {"portMappings": true} }
    ]
}
`

const bridgeConf = `{"cniVersion":"0.4.0","name":"mynet","type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.22.0.0/16"}}
`

func newInstaller(t *testing.T) (*Installer, string, string) {
	t.Helper()
	dir := t.TempDir()
	bin, conf := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "weft-cni-src")
	if err := os.WriteFile(src, []byte("#!plugin v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	i, err := New(Config{BinDir: bin, ConfDir: conf, PluginSource: src, Entry: plugin.Config{
		AmbientEnabled: true, AgentRunDir: "/var/run/weft-cni", ExcludeNamespaces: []string{"kube-system"}, PodNamespace: "weft-system", NativeNftables: true,
	}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return i, bin, conf
}

func write(t *testing.T, path, s string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), mode); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// plugins returns the types in a conflist.
func plugins(t *testing.T, path string) []string {
	t.Helper()
	var l struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(read(t, path)), &l); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range l.Plugins {
		out = append(out, p.Type)
	}
	return out
}

func listing(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestInstallConflist(t *testing.T) {
	i, bin, conf := newInstaller(t)
	write(t, filepath.Join(conf, "10-bridge.conflist"), bridgeList, 0o640)
	write(t, filepath.Join(conf, "99-loopback.conf"), `{"cniVersion":"1.0.0","name":"lo","type":"loopback"}`, 0o644)
	before := listing(t, conf)

	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(conf, "10-bridge.conflist")
	if diff := cmp.Diff([]string{"bridge", "portmap", "weft-cni"}, plugins(t, path)); diff != "" {
		t.Fatalf("plugins (-want +got):\n%s", diff)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode changed to %v", fi.Mode().Perm())
	}
	// The entry is Istio's shape under our names.
	var l struct {
		Plugins []map[string]any `json:"plugins"`
	}
	json.Unmarshal([]byte(read(t, path)), &l)
	entry := l.Plugins[2]
	for k, want := range map[string]any{"type": "weft-cni", "name": "weft-cni", "cni_agent_run_dir": "/var/run/weft-cni", "ambient_enabled": true, "pod_namespace": "weft-system", "native_nftables": true} {
		if entry[k] != want {
			t.Errorf("entry %s = %v, want %v", k, entry[k], want)
		}
	}
	if b := read(t, filepath.Join(bin, "weft-cni")); b != "#!plugin v1" {
		t.Errorf("binary %q", b)
	}
	// The entry parses as the plugin's own config.
	raw, _ := json.Marshal(entry)
	if _, err := plugin.ParseConfig(raw); err != nil {
		t.Errorf("the plugin rejects its entry: %v", err)
	}

	// Idempotent.
	if _, changed, err := i.InstallConfig(); err != nil || changed {
		t.Fatalf("second InstallConfig changed = %v, %v", changed, err)
	}
	if changed, err := i.InstallBinary(); err != nil || changed {
		t.Fatalf("second InstallBinary changed = %v, %v", changed, err)
	}

	// The primary CNI rewrites its file: the entry comes back.
	write(t, path, bridgeList, 0o640)
	if _, changed, err := i.InstallConfig(); err != nil || !changed {
		t.Fatalf("after a rewrite InstallConfig changed = %v, %v", changed, err)
	}
	if got := plugins(t, path); len(got) != 3 || got[2] != "weft-cni" {
		t.Fatalf("plugins after re-insert %v", got)
	}

	// Uninstall restores the bytes and removes everything of ours.
	if err := i.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if got := read(t, path); got != bridgeList {
		t.Fatalf("after uninstall the file is\n%s\nwant the original bytes\n%s", got, bridgeList)
	}
	if diff := cmp.Diff(before, listing(t, conf)); diff != "" {
		t.Fatalf("conf dir listing changed (-before +after):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(bin, "weft-cni")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("binary left: %v", err)
	}
	if err := i.Uninstall(); err != nil {
		t.Fatalf("second Uninstall: %v", err)
	}
}

func TestInstallSingleConf(t *testing.T) {
	i, _, conf := newInstaller(t)
	orig := filepath.Join(conf, "10-mynet.conf")
	write(t, orig, bridgeConf, 0o600)
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(conf, "10-mynet.conflist")
	if diff := cmp.Diff([]string{"bridge", "weft-cni"}, plugins(t, list)); diff != "" {
		t.Fatalf("plugins (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(orig); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the .conf is still there: %v", err)
	}
	var l struct {
		CNIVersion, Name string
	}
	json.Unmarshal([]byte(read(t, list)), &l)
	if l.CNIVersion != "0.4.0" || l.Name != "mynet" {
		t.Fatalf("list header %+v", l)
	}
	if err := i.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if got := read(t, orig); got != bridgeConf {
		t.Fatalf("restored %q, want %q", got, bridgeConf)
	}
	if diff := cmp.Diff([]string{"10-mynet.conf"}, listing(t, conf)); diff != "" {
		t.Fatalf("listing (-want +got):\n%s", diff)
	}
}

func TestInstallReplacesOldEntryAndKeepsForeignChanges(t *testing.T) {
	i, _, conf := newInstaller(t)
	path := filepath.Join(conf, "05-cilium.conflist")
	old := strings.Replace(bridgeList, `{ "type": "portmap", "capabilities": {"portMappings": true} }`,
		`{ "type": "weft-cni", "name": "weft-cni", "ambient_enabled": false }, { "type": "portmap", "capabilities": {"portMappings": true} }`, 1)
	write(t, path, old, 0o644)
	if err := i.Install(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"bridge", "portmap", "weft-cni"}, plugins(t, path)); diff != "" {
		t.Fatalf("plugins (-want +got):\n%s", diff)
	}
	if err := i.Uninstall(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"bridge", "portmap"}, plugins(t, path)); diff != "" {
		t.Fatalf("after uninstall (-want +got):\n%s", diff)
	}
}

func TestInstallWaitsForPrimary(t *testing.T) {
	i, _, conf := newInstaller(t)
	if _, _, err := i.InstallConfig(); !errors.Is(err, ErrNoPrimary) {
		t.Fatalf("InstallConfig on an empty dir = %v, want ErrNoPrimary", err)
	}
	write(t, filepath.Join(conf, "00-broken.conf"), "{not json", 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- i.Run(ctx, 10*time.Millisecond, ready) }()
	write(t, filepath.Join(conf, "10-bridge.conflist"), bridgeList, 0o644)
	<-ready
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := plugins(t, filepath.Join(conf, "10-bridge.conflist")); got[len(got)-1] != "weft-cni" {
		t.Fatalf("plugins %v", got)
	}
	if got := read(t, filepath.Join(conf, "00-broken.conf")); got != "{not json" {
		t.Fatalf("the unparsable file was changed: %q", got)
	}
}

func TestInstallRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{BinDir: "bin", ConfDir: "/etc/cni/net.d"},
		{BinDir: "/opt/cni/bin", ConfDir: "/etc/cni/net.d", ConfName: "../x.conf"},
		{BinDir: "/opt/cni/bin", ConfDir: "/etc/cni/net.d", Entry: plugin.Config{AgentRunDir: "relative"}},
	} {
		if _, err := New(cfg, slog.Default()); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}
