package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"
)

// repoRoot is the module root, three levels above this package.
var repoRoot = filepath.Join("..", "..", "..")

// allBinaries are the binaries the images hold.
var allBinaries = []string{"weft-controlplane", "weft-webhook", "ztunnel", "weft-cni-agent", "weft-cni", "waypoint", "echo", "pause"}

// fakeBinaries writes a small executable script for each name into a temp
// dir; its content names the binary, so layers differ between images.
func fakeBinaries(t *testing.T, names []string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\necho "+n+"\n"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func testConfig(t *testing.T, binDir string) Config {
	t.Helper()
	cfg := Config{BinDir: binDir, OutDir: t.TempDir(), ChartDir: filepath.Join(repoRoot, "charts", "weft"), Arch: "amd64"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// layerFile is one entry of a layer: type, mode, owner, time and content.
type layerFile struct {
	Type     byte
	Mode     int64
	UID, GID int
	ModTime  int64
	Content  string
}

func readLayer(t *testing.T, r io.Reader) (map[string]layerFile, []string) {
	t.Helper()
	files := map[string]layerFile{}
	var order []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = layerFile{Type: h.Typeflag, Mode: h.Mode, UID: h.Uid, GID: h.Gid, ModTime: h.ModTime.Unix(), Content: string(b)}
		order = append(order, h.Name)
	}
	return files, order
}

func TestBuild(t *testing.T) {
	cfg := testConfig(t, fakeBinaries(t, allBinaries))
	if cfg.Hub != "weft" || cfg.Tag == "" {
		t.Fatalf("chart defaults: hub %q tag %q, want hub weft and a tag", cfg.Hub, cfg.Tag)
	}
	results, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}

	dirs := map[string]layerFile{
		"usr/":           {Type: tar.TypeDir, Mode: 0o755},
		"usr/local/":     {Type: tar.TypeDir, Mode: 0o755},
		"usr/local/bin/": {Type: tar.TypeDir, Mode: 0o755},
	}
	tests := []struct {
		name     string
		binaries []string
	}{
		{"weft-controlplane", []string{"weft-controlplane"}},
		{"weft-webhook", []string{"weft-webhook"}},
		{"ztunnel", []string{"ztunnel"}},
		{"weft-cni-agent", []string{"weft-cni-agent", "weft-cni"}},
		{"waypoint", []string{"waypoint"}},
		{"echo", []string{"echo"}},
		{"pause", []string{"pause"}},
	}
	if len(results) != len(tests) {
		t.Fatalf("got %d images, want %d", len(results), len(tests))
	}
	archives, err := filepath.Glob(filepath.Join(cfg.OutDir, "*.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if len(archives) != len(tests) {
		t.Errorf("output dir holds %q, want %d archives", archives, len(tests))
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := results[i]
			wantRef := "weft/" + tt.name + ":" + cfg.Tag
			if r.Ref != wantRef {
				t.Errorf("ref %q, want %q", r.Ref, wantRef)
			}
			wantPath := filepath.Join(cfg.OutDir, tt.name+"-"+cfg.Tag+".tar")
			if r.Path != wantPath {
				t.Errorf("path %q, want %q", r.Path, wantPath)
			}
			if fi, err := os.Stat(r.Path); err != nil || fi.Size() != r.Size {
				t.Errorf("archive %s: size %d reported, stat %v %v", r.Path, r.Size, fi, err)
			}

			tag, err := name.NewTag(wantRef)
			if err != nil {
				t.Fatal(err)
			}
			img, err := tarball.ImageFromPath(r.Path, &tag)
			if err != nil {
				t.Fatalf("loading the archive: %v", err)
			}
			m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(r.Path) })
			if err != nil {
				t.Fatal(err)
			}
			if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{wantRef}) {
				t.Errorf("archive manifest %+v, want one image tagged %s", m, wantRef)
			}
			digest, err := img.Digest()
			if err != nil {
				t.Fatal(err)
			}
			if digest != r.Digest {
				t.Errorf("loaded digest %s, reported %s", digest, r.Digest)
			}

			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS != "linux" || cf.Architecture != "amd64" {
				t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
			}
			if want := []string{"/usr/local/bin/" + tt.name}; !slices.Equal(cf.Config.Entrypoint, want) {
				t.Errorf("entrypoint %q, want %q", cf.Config.Entrypoint, want)
			}
			if cf.Config.User != "65532:65532" {
				t.Errorf("user %q, want the unprivileged 65532:65532", cf.Config.User)
			}
			if len(cf.Config.Cmd) != 0 {
				t.Errorf("cmd %q, want none", cf.Config.Cmd)
			}
			if !slices.ContainsFunc(cf.Config.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=") && strings.Contains(e, "/usr/local/bin") }) {
				t.Errorf("env %q has no PATH with /usr/local/bin", cf.Config.Env)
			}

			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != 1 {
				t.Fatalf("%d layers, want 1", len(layers))
			}
			rc, err := layers[0].Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			got, order := readLayer(t, rc)
			want := maps.Clone(dirs)
			for _, b := range tt.binaries {
				want["usr/local/bin/"+b] = layerFile{Type: tar.TypeReg, Mode: 0o755, Content: "#!/bin/sh\necho " + b + "\n"}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("layer files (-want +got):\n%s", diff)
			}
			if !slices.IsSorted(order) {
				t.Errorf("layer entries %q are not sorted", order)
			}
		})
	}
}

func TestReproducible(t *testing.T) {
	bin := fakeBinaries(t, allBinaries)
	first, err := Build(testConfig(t, bin))
	if err != nil {
		t.Fatal(err)
	}
	// Different modification times and permissions of the inputs must not
	// change the images.
	for _, b := range allBinaries {
		if err := os.Chmod(filepath.Join(bin, b), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(bin, b), epoch, epoch); err != nil {
			t.Fatal(err)
		}
	}
	second, err := Build(testConfig(t, bin))
	if err != nil {
		t.Fatal(err)
	}
	for i := range first {
		if first[i].Digest != second[i].Digest || first[i].Size != second[i].Size {
			t.Errorf("%s: first run %s (%d bytes), second %s (%d bytes)", first[i].Ref, first[i].Digest, first[i].Size, second[i].Digest, second[i].Size)
		}
		a, err := os.ReadFile(first[i].Path)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(second[i].Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s: the archives differ", first[i].Ref)
		}
	}
	seen := map[string]string{}
	for _, r := range first {
		if other, ok := seen[r.Digest.String()]; ok {
			t.Errorf("%s and %s have the same digest", r.Ref, other)
		}
		seen[r.Digest.String()] = r.Ref
	}
}

func TestMissingBinary(t *testing.T) {
	for _, missing := range []string{"weft-cni", "waypoint", "weft-controlplane"} {
		t.Run(missing, func(t *testing.T) {
			cfg := testConfig(t, fakeBinaries(t, slices.DeleteFunc(slices.Clone(allBinaries), func(b string) bool { return b == missing })))
			_, err := Build(cfg)
			if err == nil || !strings.Contains(err.Error(), "binary "+missing+" is missing") {
				t.Fatalf("Build without %s: error %v, want one naming it", missing, err)
			}
		})
	}
}

func TestDynamicBinary(t *testing.T) {
	sh, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Skipf("no /bin/sh to stand for a dynamic binary: %v", err)
	}
	bin := fakeBinaries(t, allBinaries)
	if err := os.WriteFile(filepath.Join(bin, "ztunnel"), sh, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkStatic(filepath.Join(bin, "ztunnel"), "amd64"); err == nil {
		t.Skip("/bin/sh is static here")
	}
	_, err = Build(testConfig(t, bin))
	if err == nil || !strings.Contains(err.Error(), "ztunnel is dynamically linked") && !strings.Contains(err.Error(), "ztunnel is for") {
		t.Fatalf("Build with a dynamic ztunnel: error %v, want one naming it", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg := Config{ChartDir: filepath.Join(repoRoot, "charts", "weft"), Hub: "registry.example/weft", Tag: "1.2.3"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.reference("ztunnel"), "registry.example/weft/ztunnel:1.2.3"; got != want {
		t.Errorf("reference %q, want %q", got, want)
	}
	bad := Config{ChartDir: cfg.ChartDir, Tag: "not a tag"}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "-tag") {
		t.Errorf("Validate with a bad tag: %v, want an error naming -tag", err)
	}
	if err := (&Config{ChartDir: t.TempDir()}).Validate(); err == nil || !strings.Contains(err.Error(), "values.yaml") {
		t.Errorf("Validate without a chart: %v, want an error naming values.yaml", err)
	}
}

// TestChartImages checks that every image the chart runs by default is one
// this program writes.
func TestChartImages(t *testing.T) {
	helm := filepath.Join(repoRoot, "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Skipf("bin/helm is missing (make tools builds it): %v", err)
	}
	cmd := exec.Command(helm, "template", "weft", filepath.Join(repoRoot, "charts", "weft"), "--namespace", "weft-system", "--kube-version", "1.37.2")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr(err))
	}
	var images []string
	for _, doc := range bytes.Split(out, []byte("\n---")) {
		var v any
		if err := yaml.Unmarshal(doc, &v); err != nil {
			t.Fatalf("decoding the rendered chart: %v", err)
		}
		images = append(images, chartImages(v)...)
	}
	slices.Sort(images)
	images = slices.Compact(images)
	if len(images) < 5 {
		t.Fatalf("the chart names only the images %q; want at least the five components'", images)
	}

	cfg := testConfig(t, t.TempDir())
	var refs []string
	for _, c := range components {
		refs = append(refs, cfg.reference(c.name))
	}
	for _, img := range images {
		if !slices.Contains(refs, img) {
			t.Errorf("the chart runs image %s, which is not among the archives' %q", img, refs)
		}
	}
}

// chartImages collects the container images of a rendered object and the
// waypoint image the control plane is told to deploy.
func chartImages(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		if s, ok := v["image"].(string); ok {
			out = append(out, s)
		}
		if v["name"] == "WEFT_WAYPOINT_IMAGE" {
			if s, ok := v["value"].(string); ok {
				out = append(out, s)
			}
		}
		for _, e := range v {
			out = append(out, chartImages(e)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, chartImages(e)...)
		}
	}
	return out
}

func stderr(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}

func TestExtra(t *testing.T) {
	bin := fakeBinaries(t, []string{"server", "client"})
	if err := os.WriteFile(filepath.Join(bin, "cert.pem"), []byte("CERT"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(t.TempDir(), "extra.yaml")
	const ref = "registry.k8s.io/gateway-api/echo-advanced:v1.5.1"
	if err := os.WriteFile(spec, []byte(`- ref: `+ref+`
  entrypoint: [/usr/local/bin/server]
  user: "1338"
  files:
  - {path: /usr/local/bin/server, from: server}
  - {path: /usr/local/bin/client, from: client}
  - {path: /cert.crt, from: cert.pem, mode: 0o644}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{BinDir: bin, OutDir: t.TempDir(), ChartDir: t.TempDir(), Arch: "amd64", Extra: spec}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	results, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 1 {
		t.Fatalf("got %d images, want only the extra one", len(results))
	}
	r := results[0]
	if want := filepath.Join(cfg.OutDir, "echo-advanced-v1.5.1.tar"); r.Ref != ref || r.Path != want {
		t.Fatalf("result %s at %s, want %s at %s", r.Ref, r.Path, ref, want)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(r.Path) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{ref}) {
		t.Errorf("archive manifest %+v, want one image tagged %s", m, ref)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(r.Path, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/server"}) || cf.Config.User != "1338" {
		t.Errorf("entrypoint %q user %q, want [/usr/local/bin/server] and 1338", cf.Config.Entrypoint, cf.Config.User)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, %v; want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, order := readLayer(t, rc)
	want := map[string]layerFile{
		"cert.crt":             {Type: tar.TypeReg, Mode: 0o644, Content: "CERT"},
		"usr/":                 {Type: tar.TypeDir, Mode: 0o755},
		"usr/local/":           {Type: tar.TypeDir, Mode: 0o755},
		"usr/local/bin/":       {Type: tar.TypeDir, Mode: 0o755},
		"usr/local/bin/client": {Type: tar.TypeReg, Mode: 0o755, Content: "#!/bin/sh\necho client\n"},
		"usr/local/bin/server": {Type: tar.TypeReg, Mode: 0o755, Content: "#!/bin/sh\necho server\n"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer files (-want +got):\n%s", diff)
	}
	if !slices.IsSorted(order) {
		t.Errorf("layer entries %q are not sorted", order)
	}
}

func TestExtraInvalid(t *testing.T) {
	for name, spec := range map[string]string{
		"empty":         `[]`,
		"no tag":        `[{ref: "registry.k8s.io/echo", entrypoint: [/x], files: [{path: /x, from: x}]}]`,
		"relative path": `[{ref: "r.io/echo:v1", entrypoint: [/x], files: [{path: x, from: x}]}]`,
		"dot dot":       `[{ref: "r.io/echo:v1", entrypoint: [/x], files: [{path: /a/../x, from: x}]}]`,
		"root":          `[{ref: "r.io/echo:v1", entrypoint: [/x], files: [{path: /, from: x}]}]`,
		"no source":     `[{ref: "r.io/echo:v1", entrypoint: [/x], files: [{path: /x}]}]`,
		"no entrypoint": `[{ref: "r.io/echo:v1", files: [{path: /x, from: x}]}]`,
		"file type bit": `[{ref: "r.io/echo:v1", entrypoint: [/x], files: [{path: /x, from: x, mode: 0o100755}]}]`,
		"unknown field": `[{ref: "r.io/echo:v1", entrypoint: [/x], files: [{path: /x, from: x}], cmd: [y]}]`,
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "extra.yaml")
			if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := Config{BinDir: t.TempDir(), OutDir: t.TempDir(), Extra: file}
			if err := cfg.Validate(); err == nil {
				t.Errorf("Validate(%s) passed, want an error", spec)
			}
		})
	}
	// A file listed twice is refused when the layer is made.
	bin := fakeBinaries(t, []string{"x"})
	if _, err := layerOf([]layerEntry{{path: "x", from: filepath.Join(bin, "x"), mode: 0o755}, {path: "x", from: filepath.Join(bin, "x"), mode: 0o755}}, "amd64"); err == nil {
		t.Error("a layer with a file twice: no error")
	}
}
