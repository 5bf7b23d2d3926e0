// Command weft-images writes an image archive of every Weft component, and
// of the two images the local cluster's real nodes run besides (the echo
// test app and the pause/sandbox image), with no container engine: each
// image is an empty base plus one layer holding static binaries under
// /usr/local/bin.
//
//	weft-images [-bin bin/images/bin] [-out bin/images] [-chart charts/weft] [-hub HUB] [-tag TAG] [-arch ARCH]
//	weft-images -extra FILE [-bin DIR] [-out DIR] [-arch ARCH]
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
//
// With -extra, it writes instead the images a YAML file lists: images of
// other projects built from their sources here and named as their users
// name them (the Gateway API conformance suite's echo app), each an empty
// base plus one layer of the listed files (see Extra). Their archives are
// <out>/<last path element of the repository>-<tag>.tar.
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
	// Extra, if set, is a YAML file listing images to write instead of
	// the components (a list of Extra; file sources relative to BinDir).
	// Hub, Tag and ChartDir are then unused.
	Extra string

	extras []Extra
}

// Extra is an image other than Weft's components, written under the
// reference its users name.
type Extra struct {
	// Ref is the image's reference, with a tag.
	Ref string `json:"ref"`
	// Entrypoint is the image's entrypoint.
	Entrypoint []string `json:"entrypoint"`
	// User is the image's user (numeric, "uid" or "uid:gid").
	User string `json:"user"`
	// Files are the layer's regular files.
	Files []ExtraFile `json:"files"`
}

// ExtraFile is one file of an Extra image.
type ExtraFile struct {
	// Path is the file's absolute path in the image.
	Path string `json:"path"`
	// From is the source file, relative to Config.BinDir.
	From string `json:"from"`
	// Mode is the file's permission bits. Default 0755.
	Mode int64 `json:"mode"`
}

// readExtras reads and checks an Extra list.
func readExtras(file string) ([]Extra, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading the extra images: %w", err)
	}
	var extras []Extra
	if err := yaml.UnmarshalStrict(b, &extras); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", file, err)
	}
	if len(extras) == 0 {
		return nil, fmt.Errorf("%s lists no image", file)
	}
	for _, e := range extras {
		if _, err := name.NewTag(e.Ref, name.StrictValidation); err != nil {
			return nil, fmt.Errorf("%s: image reference %q: %w", file, e.Ref, err)
		}
		if len(e.Entrypoint) == 0 || len(e.Files) == 0 {
			return nil, fmt.Errorf("%s: image %s needs an entrypoint and files", file, e.Ref)
		}
		for _, f := range e.Files {
			if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" || f.From == "" {
				return nil, fmt.Errorf("%s: image %s: file %q from %q: want a clean absolute path and a source", file, e.Ref, f.Path, f.From)
			}
			if f.Mode&^0o7777 != 0 {
				return nil, fmt.Errorf("%s: image %s: file %s: mode %o is not permission bits", file, e.Ref, f.Path, f.Mode)
			}
		}
	}
	return extras, nil
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
	if c.Extra != "" {
		extras, err := readExtras(c.Extra)
		if err != nil {
			return err
		}
		c.extras = extras
		return nil
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
	if cfg.extras != nil {
		for _, e := range cfg.extras {
			r, err := buildExtra(cfg, e)
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", e.Ref, err)
			}
			results = append(results, r)
		}
		return results, nil
	}
	for _, comp := range components {
		r, err := buildOne(cfg, comp)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", comp.name, err)
		}
		results = append(results, r)
	}
	return results, nil
}

// buildExtra writes an Extra image's archive.
func buildExtra(cfg Config, e Extra) (Result, error) {
	ref, err := name.NewTag(e.Ref, name.StrictValidation)
	if err != nil {
		return Result{}, err
	}
	var files []layerEntry
	for _, f := range e.Files {
		mode := f.Mode
		if mode == 0 {
			mode = 0o755
		}
		files = append(files, layerEntry{path: f.Path[1:], from: filepath.Join(cfg.BinDir, f.From), mode: mode})
	}
	layerTar, err := layerOf(files, cfg.Arch)
	if err != nil {
		return Result{}, err
	}
	repo := ref.RepositoryStr()
	img, err := imageOf(layerTar, cfg.Arch, "weft-images: "+e.Ref, "built from sources", e.Entrypoint, e.User, map[string]string{
		"org.opencontainers.image.title":   path.Base(repo),
		"org.opencontainers.image.version": ref.TagStr(),
	})
	if err != nil {
		return Result{}, err
	}
	out := filepath.Join(cfg.OutDir, path.Base(repo)+"-"+ref.TagStr()+".tar")
	return writeArchive(out, ref, img)
}

// writeArchive writes img tagged ref to out.
func writeArchive(out string, ref name.Tag, img v1.Image) (Result, error) {
	digest, err := img.Digest()
	if err != nil {
		return Result{}, fmt.Errorf("computing the digest: %w", err)
	}
	// Written beside and renamed into place, so that a reader never sees
	// a half-written archive.
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return Result{}, fmt.Errorf("writing %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return Result{}, fmt.Errorf("writing %s: %w", out, err)
	}
	fi, err := os.Stat(out)
	if err != nil {
		return Result{}, err
	}
	return Result{Ref: ref.String(), Path: out, Digest: digest, Size: fi.Size()}, nil
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
	r, err := writeArchive(filepath.Join(cfg.OutDir, comp.name+"-"+cfg.Tag+".tar"), ref, img)
	r.Ref = cfg.reference(comp.name)
	return r, err
}

// image is the component's image: the empty base, one layer and the config.
func image(cfg Config, comp component) (v1.Image, error) {
	layerTar, err := layer(cfg.BinDir, comp.binaries, cfg.Arch)
	if err != nil {
		return nil, err
	}
	// Every component runs as an unprivileged user unless the chart says
	// otherwise (ztunnel and the CNI agent need root for their capabilities
	// and say so in their pod's securityContext).
	return imageOf(layerTar, cfg.Arch, "weft-images: "+strings.Join(comp.binaries, " "), "static binaries in "+binDir,
		[]string{path.Join(binDir, comp.binaries[0])}, imageUser, map[string]string{
			"org.opencontainers.image.title":   comp.name,
			"org.opencontainers.image.version": cfg.Tag,
		})
}

// imageOf is the empty base with one layer and the given configuration.
func imageOf(layerTar []byte, arch, createdBy, comment string, entrypoint []string, user string, labels map[string]string) (v1.Image, error) {
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
			CreatedBy: createdBy,
			Comment:   comment,
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
	cf.Architecture = arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = entrypoint
	cf.Config.Env = []string{pathEnv}
	cf.Config.User = user
	cf.Config.Labels = labels
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
	var files []layerEntry
	for _, b := range binaries {
		file := filepath.Join(dir, b)
		if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("binary %s is missing from %s; build it first (make images does)", b, dir)
		}
		files = append(files, layerEntry{path: path.Join(binDir[1:], b), from: file, mode: 0o755})
	}
	return layerOf(files, arch)
}

// layerEntry is a regular file of a layer: its relative path in the image,
// its source and its permission bits.
type layerEntry struct {
	path string
	from string
	mode int64
}

// layerOf is an uncompressed tar of the files and every directory above
// them (mode 0755), owned by root, stamped with epoch, in lexical order
// (a directory comes before what it holds).
func layerOf(files []layerEntry, arch string) ([]byte, error) {
	type entry struct {
		name string
		file *layerEntry
	}
	seen := map[string]bool{}
	var entries []entry
	for i := range files {
		f := &files[i]
		if seen[f.path] {
			return nil, fmt.Errorf("file /%s is listed twice", f.path)
		}
		seen[f.path] = true
		entries = append(entries, entry{name: f.path, file: f})
		for d := path.Dir(f.path); d != "."; d = path.Dir(d) {
			if !seen[d+"/"] {
				seen[d+"/"] = true
				entries = append(entries, entry{name: d + "/"})
			}
		}
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if e.file == nil {
			if err := tw.WriteHeader(header(e.name, tar.TypeDir, 0, 0o755)); err != nil {
				return nil, err
			}
			continue
		}
		data, err := os.ReadFile(e.file.from)
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("file %s is missing; build it first", e.file.from)
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", e.file.from, err)
		}
		if err := checkStatic(e.file.from, arch); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(header(e.name, tar.TypeReg, int64(len(data)), e.file.mode)); err != nil {
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

func header(name string, typ byte, size, mode int64) *tar.Header {
	return &tar.Header{
		Typeflag: typ,
		Name:     name,
		Size:     size,
		Mode:     mode,
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
		// Not ELF: a bad magic, or shorter than an ELF header.
		var fe *elf.FormatError
		if errors.As(err, &fe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
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
	fs.StringVar(&cfg.Extra, "extra", "", "YAML file of other images to write instead of the components (sources relative to -bin)")
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
