package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RunDir is where named network namespaces are bind-mounted, as iproute2 does.
const RunDir = "/var/run/netns"

// NS is an open network namespace. It keeps a file descriptor on the
// namespace, so the namespace stays alive while the NS is open even if its
// name is deleted.
type NS struct {
	f    *os.File
	fd   int // f's descriptor, read once at Open
	path string
	// mu orders Close after the uses of fd in flight (entering the
	// namespace, stat), so that none of them reads a closed descriptor
	// or, worse, a number already reused for another file.
	mu     sync.RWMutex
	closed bool
}

// Open opens the network namespace at path: a name under RunDir, a
// /proc/<pid>/ns/net file or any other nsfs file.
func Open(path string) (*NS, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening netns %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("opening netns %s: %w", path, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		f.Close()
		return nil, fmt.Errorf("opening netns %s: not a namespace file (is it mounted?)", path)
	}
	return &NS{f: f, fd: int(f.Fd()), path: path}, nil
}

// OpenName opens the named namespace RunDir/name.
func OpenName(name string) (*NS, error) { return Open(Path(name)) }

// Path returns the file of the named namespace name.
func Path(name string) string { return filepath.Join(RunDir, name) }

// Path returns the path the namespace was opened from.
func (n *NS) Path() string { return n.path }

// Fd returns the namespace's file descriptor, for APIs that move links or
// sockets into it (netlink's NsFd, SCM_RIGHTS). It is valid until Close.
func (n *NS) Fd() int { return n.fd }

// errClosed is returned by uses of an NS after Close.
func (n *NS) errClosed() error { return fmt.Errorf("netns %s: already closed", n.path) }

// ID returns the namespace's inode number: two NS values refer to the same
// namespace when their IDs are equal, and /proc/<pid>/ns/net of a process in
// it reads "net:[<ID>]".
func (n *NS) ID() (uint64, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed {
		return 0, n.errClosed()
	}
	var st unix.Stat_t
	if err := unix.Fstat(n.fd, &st); err != nil {
		return 0, fmt.Errorf("stat netns %s: %w", n.path, err)
	}
	return st.Ino, nil
}

// Close closes the namespace's file descriptor. A named namespace lives on.
// It waits for a Do entering the namespace at that moment; a Do after it
// fails.
func (n *NS) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	return n.f.Close()
}

// Do runs fn on a locked OS thread that has entered the namespace and waits
// for it. Sockets fn opens and processes fn starts (os/exec forks from the
// calling thread) are in the namespace. fn must not start goroutines that
// expect to be in the namespace: they run on other threads.
//
// The thread returns to its original namespace afterwards; if that fails the
// thread is discarded, and the error says so.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- n.doLocked(fn) }()
	return <-errc
}

// DialContext opens a connection from inside the namespace: the socket is
// made there and stays there, whatever thread uses it afterwards. Its
// signature is net.Dialer's, so it can stand in an http.Transport.
func (n *NS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := n.Do(func() error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// doLocked is the body of Do's goroutine.
func (n *NS) doLocked(fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("opening current netns: %w", err)
	}
	defer orig.Close()
	if err := n.enter(); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	fnErr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Stay locked: the runtime ends the thread with this goroutine
		// instead of running other goroutines in the wrong namespace.
		return errors.Join(fnErr, fmt.Errorf("returning from netns %s (thread discarded): %w", n.path, err))
	}
	runtime.UnlockOSThread()
	return fnErr
}

// enter moves the calling (locked) thread into the namespace. The
// descriptor is needed only for the setns call, so Close waits for that
// alone, never for the function Do runs.
func (n *NS) enter() error {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.closed {
		return n.errClosed()
	}
	if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering netns %s: %w", n.path, err)
	}
	return nil
}

// Netlink returns a route netlink handle whose socket was opened inside the
// namespace: links, addresses and routes it reads and writes are the
// namespace's. The caller closes it.
func (n *NS) Netlink() (*netlink.Handle, error) {
	var h *netlink.Handle
	err := n.Do(func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("opening netlink in netns %s: %w", n.path, err)
	}
	return h, nil
}

// runDirMu serializes making RunDir a shared mount point within the process.
var runDirMu sync.Mutex

// Create makes a new named network namespace RunDir/name, as `ip netns add`
// does, and returns it open. It fails if the name exists.
func Create(name string) (*NS, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := prepareRunDir(); err != nil {
		return nil, fmt.Errorf("creating netns %s: %w", name, err)
	}
	path := Path(name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("creating netns %s: %w", name, err)
	}
	f.Close()

	// Unshare on a locked thread that then returns to its namespace (or is
	// discarded if it cannot), as in Do.
	errc := make(chan error, 1)
	go func() { errc <- unshareOnto(path) }()
	if err := <-errc; err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("creating netns %s: %w", name, err)
	}
	ns, err := Open(path)
	if err != nil {
		_ = Delete(name)
		return nil, err
	}
	return ns, nil
}

// unshareOnto moves the calling thread into a new network namespace,
// bind-mounts it onto path and moves the thread back.
func unshareOnto(path string) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("opening current netns: %w", err)
	}
	defer orig.Close()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("unshare: %w", err)
	}
	mountErr := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
	if mountErr != nil {
		mountErr = fmt.Errorf("bind-mounting onto %s: %w", path, mountErr)
	}
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return errors.Join(mountErr, fmt.Errorf("returning from the new netns (thread discarded): %w", err))
	}
	runtime.UnlockOSThread()
	return mountErr
}

// prepareRunDir makes RunDir a shared mount point, as iproute2 does, so that
// deleting a namespace also unmounts it in mount namespaces copied from this
// one (for example a process started with a private mount namespace).
func prepareRunDir() error {
	runDirMu.Lock()
	defer runDirMu.Unlock()
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", RunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(RunDir, RunDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s onto itself: %w", RunDir, err)
		}
		err = unix.Mount("", RunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("making %s a shared mount: %w", RunDir, err)
	}
	return nil
}

// Delete removes the named namespace RunDir/name, as `ip netns delete`
// does. The namespace itself goes away once no process is in it and no file
// descriptor refers to it. Deleting a name that does not exist is not an error.
func Delete(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	path := Path(name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting netns %s: unmounting: %w", name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting netns %s: %w", name, err)
	}
	return nil
}

// Names lists the named namespaces under RunDir.
func Names() ([]string, error) {
	entries, err := os.ReadDir(RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", RunDir, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return fmt.Errorf("invalid netns name %q", name)
	}
	return nil
}
