// Command weft-images writes an image archive of every Weft component, and
// of the two images the local cluster's real nodes run besides (the echo
// test app and the pause/sandbox image), with no container engine: each
// image is an empty base plus one layer holding static binaries under
// /usr/local/bin.
//
//	weft-images [-bin bin/images/bin] [-out bin/images] [-chart charts/weft] [-hub HUB] [-tag TAG] [-arch ARCH]
//
// The archive <out>/<name>-<tag>.tar is in the `docker save` layout, tagged
// <hub>/<name>:<tag> (hub and tag default to the chart's global.hub and
// global.tag), so `docker load`, `ctr images import` and `crane push` read
// it. The same binaries always give the same digest: entries are sorted and
// every time stamp is the Unix epoch. One line per image goes to stdout:
//
//	image: weft/ztunnel:0.1.0 sha256:... 12345678
//
// with the manifest digest and the archive's size in bytes.
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"
)

// binDir is where every image holds its binaries.
const binDir = "/usr/local/bin"

// pathEnv is the images' PATH.
const pathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// epoch is every time stamp in the images, so that they are reproducible.
var epoch = time.Unix(0, 0).UTC()

// component is one image: its name, and the binaries it holds, the first of
// which is the entrypoint.
type component struct {
	name     string
	binaries []string
}

// components are the images the chart runs. The CNI agent installs the
// weft-cni plugin from next to its own executable (cni/agent Config
// PluginBinary), so its image holds both.
var components = []component{
	{name: "weft-controlplane", binaries: []string{"weft-controlplane"}},
	{name: "weft-webhook", binaries: []string{"weft-webhook"}},
	{name: "ztunnel", binaries: []string{"ztunnel"}},
	{name: "weft-cni-agent", binaries: []string{"weft-cni-agent", "weft-cni"}},
	{name: "waypoint", binaries: []string{"waypoint"}},
	// The echo test app (test/cmd/echo) and the sandbox image of the
	// cluster's real nodes (test/cmd/pause, their containerd's
	// sandbox_image).
	{name: "echo", binaries: []string{"echo"}},
	{name: "pause", binaries: []string{"pause"}},
}

// Config is what to build and where.
type Config struct {
	// BinDir holds the components' binaries. Default bin/images/bin.
	BinDir string
	// OutDir receives the archives. Default bin/images.
	OutDir string
	// ChartDir is the chart whose values give Hub and Tag when those are
	// empty. Default charts/weft.
	ChartDir string
	// Hub is the repository prefix of every image. Default: the chart's
	// global.hub.
	Hub string
	// Tag of every image. Default: the chart's global.tag, which must equal
	// its appVersion.
	Tag string
	// Arch is the images' architecture (GOARCH spelling). Default: this
	// program's.
	Arch string
}

// Validate applies the defaults, reading the chart if Hub or Tag is empty.
func (c *Config) Validate() error {
	if c.BinDir == "" {
		c.BinDir = filepath.Join("bin", "images", "bin")
	}
	if c.OutDir == "" {
		c.OutDir = filepath.Join("bin", "images")
	}
	if c.ChartDir == "" {
		c.ChartDir = filepath.Join("charts", "weft")
	}
	if c.Arch == "" {
		c.Arch = runtime.GOARCH
	}
	if c.Hub == "" || c.Tag == "" {
		hub, tag, err := chartDefaults(c.ChartDir)
		if err != nil {
			return err
		}
		if c.Hub == "" {
			c.Hub = hub
		}
		if c.Tag == "" {
			c.Tag = tag
		}
	}
	for _, comp := range components {
		if _, err := name.NewTag(c.reference(comp.name)); err != nil {
			return fmt.Errorf("image reference for %s (-hub %q, -tag %q): %w", comp.name, c.Hub, c.Tag, err)
		}
	}
	return nil
}

func (c *Config) reference(component string) string {
	return c.Hub + "/" + component + ":" + c.Tag
}

// chartDefaults reads global.hub and global.tag from the chart's values and
// checks the tag against the chart's appVersion.
func chartDefaults(dir string) (hub, tag string, err error) {
	var values struct {
		Global struct {
			Hub string `json:"hub"`
			Tag string `json:"tag"`
		} `json:"global"`
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := readYAML(filepath.Join(dir, "values.yaml"), &values); err != nil {
		return "", "", err
	}
	if err := readYAML(filepath.Join(dir, "Chart.yaml"), &chart); err != nil {
		return "", "", err
	}
	if values.Global.Hub == "" || values.Global.Tag == "" {
		return "", "", fmt.Errorf("%s: global.hub or global.tag is empty; pass -hub and -tag", filepath.Join(dir, "values.yaml"))
	}
	if values.Global.Tag != chart.AppVersion {
		return "", "", fmt.Errorf("chart %s: global.tag %q differs from appVersion %q; make them equal or pass -tag", dir, values.Global.Tag, chart.AppVersion)
	}
	return values.Global.Hub, values.Global.Tag, nil
}

func readYAML(file string, v any) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading the chart: %w", err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decoding %s: %w", file, err)
	}
	return nil
}

// Result is one written archive.
type Result struct {
	// Ref is the image's reference, <hub>/<name>:<tag>.
	Ref string
	// Path is the archive's file.
	Path string
	// Digest is the image manifest's digest.
	Digest v1.Hash
	// Size is the archive's size in bytes.
	Size int64
}

// Build writes every component's archive into cfg.OutDir. cfg must have
// been validated.
func Build(cfg Config) ([]Result, error) {
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("making the output dir: %w", err)
	}
	var results []Result
	for _, comp := range components {
		r, err := buildOne(cfg, comp)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", comp.name, err)
		}
		results = append(results, r)
	}
	return results, nil
}

func buildOne(cfg Config, comp component) (Result, error) {
	img, err := image(cfg, comp)
	if err != nil {
		return Result{}, err
	}
	ref, err := name.NewTag(cfg.reference(comp.name))
	if err != nil {
		return Result{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return Result{}, fmt.Errorf("computing the digest: %w", err)
	}
	out := filepath.Join(cfg.OutDir, comp.name+"-"+cfg.Tag+".tar")
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return Result{}, fmt.Errorf("writing %s: %w", out, err)
	}
	fi, err := os.Stat(out)
	if err != nil {
		return Result{}, err
	}
	return Result{Ref: cfg.reference(comp.name), Path: out, Digest: digest, Size: fi.Size()}, nil
}

// image is the component's image: the empty base, one layer and the config.
func image(cfg Config, comp component) (v1.Image, error) {
	layerTar, err := layer(cfg.BinDir, comp.binaries, cfg.Arch)
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("making the layer: %w", err)
	}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer: l,
		History: v1.History{
			Created:   v1.Time{Time: epoch},
			CreatedBy: "weft-images: " + strings.Join(comp.binaries, " "),
			Comment:   "static binaries in " + binDir,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = cfg.Arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = []string{path.Join(binDir, comp.binaries[0])}
	cf.Config.Env = []string{pathEnv}
	// Every component runs as an unprivileged user unless the chart says
	// otherwise (ztunnel and the CNI agent need root for their capabilities
	// and say so in their pod's securityContext).
	cf.Config.User = imageUser
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   comp.name,
		"org.opencontainers.image.version": cfg.Tag,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the config: %w", err)
	}
	return img, nil
}

// imageUser is the numeric user and group the images run as: no name, so
// that the kubelet can check runAsNonRoot without an /etc/passwd.
const imageUser = "65532:65532"

// layer is an uncompressed tar of binDir holding the binaries read from
// dir: directories and files owned by root, mode 0755, stamped with epoch,
// in lexical order.
func layer(dir string, binaries []string, arch string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		if err := tw.WriteHeader(header(d, tar.TypeDir, 0)); err != nil {
			return nil, err
		}
	}
	for _, b := range slices.Sorted(slices.Values(binaries)) {
		file := filepath.Join(dir, b)
		data, err := os.ReadFile(file)
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("binary %s is missing from %s; build it first (make images does)", b, dir)
		}
		if err != nil {
			return nil, fmt.Errorf("reading binary %s: %w", b, err)
		}
		if err := checkStatic(file, arch); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(header(path.Join(binDir[1:], b), tar.TypeReg, int64(len(data)))); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func header(name string, typ byte, size int64) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     name,
		Size:     size,
		Mode:     0o755,
		Uid:      0,
		Gid:      0,
		Uname:    "root",
		Gname:    "root",
		ModTime:  epoch,
		Format:   tar.FormatUSTAR,
	}
}

// elfMachines maps the GOARCH values images are built for to their ELF
// machine.
var elfMachines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"arm":     elf.EM_ARM,
	"386":     elf.EM_386,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

// checkStatic refuses an ELF binary that needs a dynamic loader (the
// images have none) or is for another architecture. Other files, such as
// scripts, pass.
func checkStatic(file, arch string) error {
	f, err := elf.Open(file)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) {
			return nil
		}
		return fmt.Errorf("reading binary %s: %w", file, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("binary %s is dynamically linked and cannot run on an empty base; build it with CGO_ENABLED=0", file)
		}
	}
	if m, ok := elfMachines[arch]; ok && f.Machine != m {
		return fmt.Errorf("binary %s is for %s, not %s; build it with GOARCH=%s", file, f.Machine, arch, arch)
	}
	return nil
}

func main() {
	var cfg Config
	fs := flag.NewFlagSet("weft-images", flag.ExitOnError)
	fs.StringVar(&cfg.BinDir, "bin", "", "directory of the components' static binaries (default bin/images/bin)")
	fs.StringVar(&cfg.OutDir, "out", "", "directory the archives are written to (default bin/images)")
	fs.StringVar(&cfg.ChartDir, "chart", "", "chart whose global.hub and global.tag are the defaults (default charts/weft)")
	fs.StringVar(&cfg.Hub, "hub", "", "repository prefix of the images (default: the chart's global.hub)")
	fs.StringVar(&cfg.Tag, "tag", "", "tag of the images (default: the chart's global.tag)")
	fs.StringVar(&cfg.Arch, "arch", "", "architecture of the images, as GOARCH (default: this program's)")
	fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "weft-images: unexpected arguments %q\n", fs.Args())
		os.Exit(2)
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "weft-images:", err)
		os.Exit(1)
	}
	results, err := Build(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "weft-images:", err)
		os.Exit(1)
	}
	for _, r := range results {
		fmt.Printf("image: %s %s %d\n", r.Ref, r.Digest, r.Size)
	}
}
