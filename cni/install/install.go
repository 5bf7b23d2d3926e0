// Package install puts the weft-cni plugin on a node and takes it off: it
// copies the plugin binary into the node's CNI bin directory and chains the
// plugin's entry at the end of the primary network configuration in the CNI
// conf directory (protocols.md §4.4), the way install-cni does.
//
// The primary configuration is the one the runtime uses: the
// lexicographically first .conf, .conflist or .json file (or a configured
// name). A .conflist gets any earlier weft-cni entry removed and the new
// entry appended; a single-plugin .conf becomes a .conflist of the original
// plugin and ours. Files are replaced atomically and keep their mode. Before
// the first change the original bytes are kept next to the file (a dotfile
// the runtime ignores), so that Uninstall restores the file byte for byte
// when nothing else changed it meanwhile.
package install

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/weftmesh/weft/cni/plugin"
)

// Config says where the plugin goes.
type Config struct {
	// BinDir is the node's CNI bin directory as the agent sees it.
	BinDir string
	// ConfDir is the node's CNI conf directory as the agent sees it.
	ConfDir string
	// ConfName, when set, names the primary configuration file instead of
	// picking the first one.
	ConfName string
	// PluginSource is the weft-cni binary to copy.
	PluginSource string
	// Entry is the plugin's conflist entry.
	Entry plugin.Config
}

// Installer installs and uninstalls the plugin. Its methods are not safe
// for concurrent use.
type Installer struct {
	cfg   Config
	entry json.RawMessage
	log   *slog.Logger
}

// New checks cfg and returns an Installer.
func New(cfg Config, log *slog.Logger) (*Installer, error) {
	for name, dir := range map[string]string{"CNI bin dir": cfg.BinDir, "CNI conf dir": cfg.ConfDir} {
		if !filepath.IsAbs(dir) {
			return nil, fmt.Errorf("install: %s %q is not an absolute path", name, dir)
		}
	}
	if strings.ContainsRune(cfg.ConfName, '/') {
		return nil, fmt.Errorf("install: conf name %q must be a file name", cfg.ConfName)
	}
	cfg.Entry.Type, cfg.Entry.Name = plugin.Type, plugin.Name
	if cfg.Entry.CNIVersion == "" {
		cfg.Entry.CNIVersion = plugin.EntryCNIVersion
	}
	if err := cfg.Entry.Validate(); err != nil {
		return nil, fmt.Errorf("install: the plugin entry: %w", err)
	}
	entry, err := json.Marshal(cfg.Entry)
	if err != nil {
		return nil, err
	}
	return &Installer{cfg: cfg, entry: entry, log: log}, nil
}

// confExts are the extensions runtimes read, in libcni's order.
var confExts = []string{".conf", ".conflist", ".json"}

// Backups are named .weft-cni-backup.<file>.orig: a dotfile with an
// extension no runtime reads.
const (
	backupPrefix = ".weft-cni-backup."
	backupSuffix = ".orig"
)

// ErrNoPrimary means the conf dir holds no network configuration yet (the
// primary CNI has not installed its own).
var ErrNoPrimary = errors.New("no primary CNI network configuration yet")

// primary finds the primary configuration file.
func (i *Installer) primary() (string, error) {
	if i.cfg.ConfName != "" {
		p := filepath.Join(i.cfg.ConfDir, i.cfg.ConfName)
		if _, err := os.Stat(p); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return "", fmt.Errorf("%w: %s does not exist", ErrNoPrimary, p)
			}
			return "", err
		}
		return p, nil
	}
	ents, err := os.ReadDir(i.cfg.ConfDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%w: %s does not exist", ErrNoPrimary, i.cfg.ConfDir)
		}
		return "", fmt.Errorf("reading CNI conf dir: %w", err)
	}
	var names []string
	for _, e := range ents {
		if !e.IsDir() && slices.Contains(confExts, filepath.Ext(e.Name())) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(i.cfg.ConfDir, n))
		if err != nil {
			continue
		}
		if _, err := parseObject(b); err == nil {
			return filepath.Join(i.cfg.ConfDir, n), nil
		}
		i.log.Warn("skipping an unparsable CNI config", "file", n)
	}
	return "", fmt.Errorf("%w in %s", ErrNoPrimary, i.cfg.ConfDir)
}

func backupPath(path string) string {
	return filepath.Join(filepath.Dir(path), backupPrefix+filepath.Base(path)+backupSuffix)
}

// InstallConfig chains the entry into the primary configuration. It
// returns the file it wrote and whether it changed anything; a second call
// with nothing new changes nothing.
func (i *Installer) InstallConfig() (string, bool, error) {
	path, err := i.primary()
	if err != nil {
		return "", false, err
	}
	orig, err := os.ReadFile(path)
	if err != nil {
		return "", false, fmt.Errorf("reading %s: %w", path, err)
	}
	if hasEntryLast(orig, i.entry) {
		return path, false, nil
	}
	if hasType(orig, "istio-cni") {
		i.log.Warn("the primary CNI config also chains istio-cni: pods may be enrolled twice", "file", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", false, err
	}
	out, err := insertEntry(orig, plugin.Type, i.entry)
	if err != nil {
		return "", false, fmt.Errorf("editing %s: %w", path, err)
	}
	// Keep the original once, before our first edit of this file.
	if !hasType(orig, plugin.Type) {
		if err := writeFileAtomic(backupPath(path), orig, 0o600); err != nil {
			return "", false, fmt.Errorf("saving the original of %s: %w", path, err)
		}
	}
	target := path
	if filepath.Ext(path) != ".conflist" {
		// A single plugin: the list replaces it under the .conflist name.
		if _, ok := mustObject(orig).get("plugins"); !ok {
			target = strings.TrimSuffix(path, filepath.Ext(path)) + ".conflist"
		}
	}
	if err := writeFileAtomic(target, out, fi.Mode().Perm()); err != nil {
		return "", false, fmt.Errorf("writing %s: %w", target, err)
	}
	if target != path {
		if err := os.Remove(path); err != nil {
			return "", false, fmt.Errorf("removing %s after converting it to %s: %w", path, target, err)
		}
		// The backup is named after the original file.
	}
	i.log.Info("chained weft-cni into the primary CNI config", "file", target)
	return target, true, nil
}

func mustObject(b []byte) object {
	o, _ := parseObject(b)
	return o
}

// UninstallConfig removes the entry from every configuration that has it,
// restoring a file's original bytes when the rest of it is unchanged.
func (i *Installer) UninstallConfig() error {
	ents, err := os.ReadDir(i.cfg.ConfDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("reading CNI conf dir: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if e.IsDir() || !slices.Contains(confExts, filepath.Ext(e.Name())) {
			continue
		}
		path := filepath.Join(i.cfg.ConfDir, e.Name())
		if err := i.uninstallFile(path); err != nil {
			errs = append(errs, err)
		}
	}
	// Backups whose file is gone.
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), backupPrefix) && strings.HasSuffix(e.Name(), backupSuffix) {
			orig := filepath.Join(i.cfg.ConfDir, strings.TrimSuffix(strings.TrimPrefix(e.Name(), backupPrefix), backupSuffix))
			conv := strings.TrimSuffix(orig, filepath.Ext(orig)) + ".conflist"
			if !exists(orig) && !exists(conv) {
				os.Remove(filepath.Join(i.cfg.ConfDir, e.Name()))
			}
		}
	}
	return errors.Join(errs...)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (i *Installer) uninstallFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if !hasType(b, plugin.Type) {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	out, _, err := removeEntry(b, plugin.Type)
	if err != nil {
		return fmt.Errorf("editing %s: %w", path, err)
	}
	// Was it converted from a single-plugin file?
	if filepath.Ext(path) == ".conflist" {
		for _, ext := range []string{".conf", ".json"} {
			orig := strings.TrimSuffix(path, ".conflist") + ext
			bk, err := os.ReadFile(backupPath(orig))
			if err != nil {
				continue
			}
			if rest := restOfConverted(out); rest != nil && sameJSON(rest, bk) {
				if err := writeFileAtomic(orig, bk, fi.Mode().Perm()); err != nil {
					return fmt.Errorf("restoring %s: %w", orig, err)
				}
				os.Remove(path)
				os.Remove(backupPath(orig))
				i.log.Info("removed weft-cni from the CNI config", "file", orig)
				return nil
			}
		}
	}
	if bk, err := os.ReadFile(backupPath(path)); err == nil && sameJSON(out, bk) {
		out = bk
	}
	if err := writeFileAtomic(path, out, fi.Mode().Perm()); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	os.Remove(backupPath(path))
	i.log.Info("removed weft-cni from the CNI config", "file", path)
	return nil
}

// restOfConverted returns the single plugin of a list we made from a
// single-plugin file, or nil.
func restOfConverted(list []byte) []byte {
	raw, ok := mustObject(list).get("plugins")
	if !ok {
		return nil
	}
	var plugins []json.RawMessage
	if json.Unmarshal(raw, &plugins) != nil || len(plugins) != 1 {
		return nil
	}
	return plugins[0]
}

// InstallBinary copies the plugin into the bin dir unless an identical copy
// is there. The copy is atomic: a runtime never execs half a binary.
func (i *Installer) InstallBinary() (bool, error) {
	src, err := os.ReadFile(i.cfg.PluginSource)
	if err != nil {
		return false, fmt.Errorf("reading the plugin binary: %w", err)
	}
	dst := filepath.Join(i.cfg.BinDir, plugin.Type)
	if cur, err := os.ReadFile(dst); err == nil && sha256.Sum256(cur) == sha256.Sum256(src) {
		return false, nil
	}
	if err := os.MkdirAll(i.cfg.BinDir, 0o755); err != nil {
		return false, fmt.Errorf("creating the CNI bin dir: %w", err)
	}
	if err := writeFileAtomic(dst, src, 0o755); err != nil {
		return false, fmt.Errorf("installing %s: %w", dst, err)
	}
	i.log.Info("installed the weft-cni plugin", "path", dst)
	return true, nil
}

// UninstallBinary removes the plugin binary.
func (i *Installer) UninstallBinary() error {
	if err := os.Remove(filepath.Join(i.cfg.BinDir, plugin.Type)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the plugin binary: %w", err)
	}
	return nil
}

// Install does both: the binary first, so the runtime never finds an entry
// without its plugin.
func (i *Installer) Install() error {
	if _, err := i.InstallBinary(); err != nil {
		return err
	}
	_, _, err := i.InstallConfig()
	return err
}

// Uninstall removes the entry first, then the binary.
func (i *Installer) Uninstall() error {
	return errors.Join(i.UninstallConfig(), i.UninstallBinary())
}

// Run keeps the plugin installed until ctx ends: it installs, waits for a
// primary configuration if there is none yet, and re-inserts the entry when
// the primary CNI rewrites its file. ready is closed after the first
// successful install.
func (i *Installer) Run(ctx context.Context, interval time.Duration, ready chan<- struct{}) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	waiting := false
	for {
		err := i.Install()
		switch {
		case err == nil:
			if ready != nil {
				close(ready)
				ready = nil
			}
			waiting = false
		case errors.Is(err, ErrNoPrimary):
			if !waiting {
				i.log.Info("waiting for the primary CNI to write its network configuration", "conf_dir", i.cfg.ConfDir)
				waiting = true
			}
		default:
			i.log.Error("installing the CNI plugin failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
