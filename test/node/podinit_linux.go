package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A container process starts as this program re-executed (/proc/self/exe)
// with initEnv naming a spec file: the runner starts it inside the pod's
// network namespace with a new mount and UTS namespace, and the init bind-
// mounts the container's volumes onto their mount paths, sets the host name
// and execs the container's binary. Every binary that links this package can
// do it, because the check runs in the package's init function, before main.
const initEnv = "WEFT_NODE_POD_INIT"

func init() {
	if path := os.Getenv(initEnv); path != "" {
		err := podInit(path)
		fmt.Fprintf(os.Stderr, "weft pod init: %v\n", err)
		os.Exit(127)
	}
}

// initSpec is what the init does, written by the runner as JSON.
type initSpec struct {
	Path     string      `json:"path"`
	Argv     []string    `json:"argv"`
	Env      []string    `json:"env"`
	Dir      string      `json:"dir"`
	Hostname string      `json:"hostname"`
	Mounts   []initMount `json:"mounts"`
	// Stage is an empty directory the init may mount scratch tmpfs on.
	Stage string `json:"stage"`
	// KeepNetns keeps /run/netns visible (a volume mounts it); otherwise
	// the init unmounts it so the container holds no other pod's namespace.
	KeepNetns bool `json:"keepNetns"`
}

type initMount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// podInit runs in the re-executed init; it returns only on failure.
func podInit(specPath string) error {
	b, err := os.ReadFile(specPath)
	if err != nil {
		return fmt.Errorf("reading spec: %w", err)
	}
	var spec initSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("decoding spec %s: %w", specPath, err)
	}
	// Mounts made here stay here; unmounts on the host (a deleted netns)
	// still reach this namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making / a slave mount: %w", err)
	}
	if !spec.KeepNetns {
		for _, d := range []string{"/run/netns", "/var/run/netns"} {
			_ = unix.Unmount(d, unix.MNT_DETACH)
		}
	}
	m := &mounter{stage: spec.Stage}
	// Parents before children.
	sort.SliceStable(spec.Mounts, func(i, j int) bool {
		return strings.Count(filepath.Clean(spec.Mounts[i].Target), "/") < strings.Count(filepath.Clean(spec.Mounts[j].Target), "/")
	})
	for _, mt := range spec.Mounts {
		if err := m.bind(mt); err != nil {
			return err
		}
	}
	if spec.Hostname != "" {
		if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
			return fmt.Errorf("setting host name: %w", err)
		}
	}
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	if err := os.Chdir(dir); err != nil {
		return fmt.Errorf("changing to working dir: %w", err)
	}
	path := spec.Path
	if !strings.Contains(path, "/") {
		if path, err = lookPath(spec.Path, spec.Env); err != nil {
			return err
		}
	}
	if err := syscall.Exec(path, spec.Argv, spec.Env); err != nil {
		return fmt.Errorf("exec %s: %w", spec.Path, err)
	}
	return nil
}

// lookPath finds an executable in the PATH of env, as the container sees it.
func lookPath(name string, env []string) (string, error) {
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found in PATH %s", name, path)
}

// mounter bind-mounts volumes in the init's private mount namespace. A mount
// path whose directory does not exist on the host is made on a tmpfs that
// shadows its nearest existing ancestor (that ancestor's entries are
// bind-mounted back into it), so nothing is ever created on the host.
type mounter struct {
	stage  string
	stages int
}

func (m *mounter) bind(mt initMount) error {
	st, err := os.Stat(mt.Source)
	if err != nil {
		return fmt.Errorf("volume source %s: %w", mt.Source, err)
	}
	target, err := m.mountpoint(mt.Target, st.IsDir())
	if err != nil {
		return fmt.Errorf("making mount point %s: %w", mt.Target, err)
	}
	if err := unix.Mount(mt.Source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s onto %s: %w", mt.Source, mt.Target, err)
	}
	if mt.ReadOnly {
		if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("making %s read-only: %w", mt.Target, err)
		}
	}
	return nil
}

// mountpoint returns target with symlinks resolved, making it (a directory,
// or an empty file when dir is false) if it does not exist.
func (m *mounter) mountpoint(target string, dir bool) (string, error) {
	target = filepath.Clean(target)
	if !filepath.IsAbs(target) {
		return "", errors.New("mount path must be absolute")
	}
	if real, err := filepath.EvalSymlinks(target); err == nil {
		return real, nil
	}
	// Find the nearest existing ancestor.
	anc, rest := target, ""
	for {
		parent := filepath.Dir(anc)
		rest = filepath.Join(filepath.Base(anc), rest)
		anc = parent
		if _, err := os.Stat(anc); err == nil || anc == "/" {
			break
		}
	}
	realAnc, err := filepath.EvalSymlinks(anc)
	if err != nil {
		return "", err
	}
	if err := m.shadow(realAnc); err != nil {
		return "", err
	}
	full := filepath.Join(realAnc, rest)
	if dir {
		return full, os.MkdirAll(full, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return "", err
	}
	f, err := os.OpenFile(full, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return "", err
	}
	return full, f.Close()
}

// shadow replaces dir, in this mount namespace, with a tmpfs holding the
// same entries (directories and files bind-mounted from the original,
// symlinks copied), on which new entries can be made. For "/" it changes
// root into the shadow instead.
func (m *mounter) shadow(dir string) error {
	if m.stage == "" {
		return errors.New("no stage directory to make mount points in")
	}
	m.stages++
	stage := filepath.Join(m.stage, strconv.Itoa(m.stages))
	if err := os.MkdirAll(stage, 0o700); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	mode := fmt.Sprintf("mode=%o", st.Mode&0o7777)
	if err := unix.Mount("tmpfs", stage, "tmpfs", 0, mode); err != nil {
		return fmt.Errorf("mounting tmpfs on %s: %w", stage, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		src, dst := filepath.Join(dir, e.Name()), filepath.Join(stage, e.Name())
		if dir == "/" && src == filepath.Clean(m.stage) {
			continue
		}
		switch t := e.Type(); {
		case t&os.ModeSymlink != 0:
			link, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, dst); err != nil {
				return err
			}
			continue
		case t.IsDir():
			fi, err := os.Stat(src)
			if err != nil {
				return err
			}
			if err := os.Mkdir(dst, fi.Mode().Perm()); err != nil {
				return err
			}
		default:
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_RDONLY, 0o600)
			if err != nil {
				return err
			}
			f.Close()
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s into the shadow of %s: %w", src, dir, err)
		}
	}
	if dir == "/" {
		if err := unix.Chroot(stage); err != nil {
			return fmt.Errorf("changing root to the shadow of /: %w", err)
		}
		return os.Chdir("/")
	}
	if err := unix.Mount(stage, dir, "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving the shadow onto %s: %w", dir, err)
	}
	return nil
}
