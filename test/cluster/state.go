package cluster

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftmesh/weft/internal/netns"
)

// Every run is named "wft" + 6 hex digits. Its namespaces are named
// <run>-<what> and its files live in StateDir/<run>; it holds an flock on
// LockDir/<run>.lock while it lives, which is how a later start tells a
// killed run (lock free) from a running one. LockDir is machine-wide, like
// the namespace names, whatever StateDir a run uses.
const LockDir = "/var/run/weft-cluster"

var (
	runIDRE    = regexp.MustCompile(`^wft[0-9a-f]{6}$`)
	runNetnsRE = regexp.MustCompile(`^(wft[0-9a-f]{6})-`)
)

// run is this process's claim on a run ID.
type run struct {
	id   string
	dir  string
	lock *os.File
}

func newRun(stateDir string) (*run, error) {
	for range 10 {
		// Made each time: a run that just ended may remove them when empty.
		for _, d := range []string{stateDir, LockDir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return nil, fmt.Errorf("making %s: %w", d, err)
			}
		}
		b := make([]byte, 3)
		rand.Read(b)
		id := "wft" + hex.EncodeToString(b)
		lockPath := filepath.Join(LockDir, id+".lock")
		f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
		if errors.Is(err, os.ErrExist) || errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("claiming a run ID: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil || !samefile(f, lockPath) {
			// A concurrent cleanup took the new file for a killed run's.
			f.Close()
			continue
		}
		r := &run{id: id, dir: filepath.Join(stateDir, id), lock: f}
		if err := os.Mkdir(r.dir, 0o755); err != nil {
			r.release(false)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("making run dir: %w", err)
		}
		return r, nil
	}
	return nil, errors.New("cannot claim a run ID")
}

func (r *run) netnsPrefix() string { return r.id + "-" }

// samefile reports whether path still names the open file f.
func samefile(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// release removes the run's directory (unless keep) and lock, and the
// state and lock directories if no other run uses them.
func (r *run) release(keep bool) error {
	var err error
	if !keep {
		err = os.RemoveAll(r.dir)
		os.Remove(filepath.Dir(r.dir)) // fails while not empty
	}
	os.Remove(r.lock.Name())
	r.lock.Close()
	os.Remove(LockDir) // fails while not empty
	return err
}

// CleanStale removes what killed runs left behind in stateDir, LockDir and
// /var/run/netns: every process inside one of their namespaces, the
// namespaces, and their files. Runs still alive are left alone. It returns
// one line per run removed.
func CleanStale(stateDir string, log *slog.Logger) ([]string, error) {
	ids := map[string]bool{}
	names, err := netns.Names()
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if m := runNetnsRE.FindStringSubmatch(n); m != nil {
			ids[m[1]] = true
		}
	}
	for _, dir := range []string{stateDir, LockDir} {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		for _, e := range entries {
			if id := strings.TrimSuffix(strings.TrimSuffix(e.Name(), ".lock"), ".sysctls"); runIDRE.MatchString(id) {
				ids[id] = true
			}
		}
	}
	// Real-node runs also leave cgroups named <run>-<node>.
	for _, ctrl := range append(cgroupControllers(), "unified") {
		entries, _ := os.ReadDir(filepath.Join(cgroupMount, ctrl))
		for _, e := range entries {
			if m := runNetnsRE.FindStringSubmatch(e.Name()); m != nil && e.IsDir() {
				ids[m[1]] = true
			}
		}
	}
	var removed []string
	var errs []error
	for id := range ids {
		if err := os.MkdirAll(LockDir, 0o755); err != nil {
			return removed, err
		}
		lockPath := filepath.Join(LockDir, id+".lock")
		f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close() // alive
			continue
		}
		nNS, nProcs, err := removeRun(stateDir, id, names)
		if err != nil {
			errs = append(errs, fmt.Errorf("cleaning up run %s: %w", id, err))
		}
		os.Remove(lockPath)
		f.Close()
		line := fmt.Sprintf("removed what run %s left: %d namespaces, %d processes and its files", id, nNS, nProcs)
		log.Info("removed a killed run's leftovers", "run", id, "netns", nNS, "processes", nProcs)
		removed = append(removed, line)
	}
	return removed, errors.Join(errs...)
}

// removeRun kills the processes in run id's namespaces, deletes the
// namespaces and removes the run's directory.
func removeRun(stateDir, id string, names []string) (nNS, nProcs int, err error) {
	var mine []string
	inodes := map[uint64]bool{}
	for _, n := range names {
		if strings.HasPrefix(n, id+"-") {
			mine = append(mine, n)
			if ns, err := netns.OpenName(n); err == nil {
				if ino, err := ns.ID(); err == nil {
					inodes[ino] = true
				}
				ns.Close()
			}
		}
	}
	procs := processesIn(inodes)
	for _, pid := range procs {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	waitGone(procs, 10*time.Second)
	var errs []error
	// Real-node mode: containers outside those namespaces, mounts, cgroups,
	// sysctls and the runtime's files outside the run's directory.
	if err := cleanRuntimeLeftovers(filepath.Join(stateDir, id), id); err != nil {
		errs = append(errs, err)
	}
	for _, n := range mine {
		if err := netns.Delete(n); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(filepath.Join(stateDir, id)); err != nil {
		errs = append(errs, err)
	}
	return len(mine), len(procs), errors.Join(errs...)
}

// processesIn lists the processes whose network namespace is one of inodes.
func processesIn(inodes map[uint64]bool) []int {
	if len(inodes) == 0 {
		return nil
	}
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			continue
		}
		var ino uint64
		if _, err := fmt.Sscanf(link, "net:[%d]", &ino); err == nil && inodes[ino] {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids
}

// waitGone waits until none of pids is alive (zombies count as gone).
func waitGone(pids []int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		alive := false
		for _, pid := range pids {
			if processAlive(pid, 0) {
				alive = true
				break
			}
		}
		if !alive {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processAlive reports whether pid runs and is not a zombie; a non-zero
// start (clock ticks since boot, /proc/<pid>/stat field 22) must match too,
// so a reused PID does not count.
func processAlive(pid int, start uint64) bool {
	st, ok := procStat(pid)
	if !ok || st.state == "Z" || st.state == "X" {
		return false
	}
	return start == 0 || st.start == start
}

type procStatus struct {
	state string
	start uint64
}

func procStat(pid int) (procStatus, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStatus{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStatus{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return procStatus{}, false
	}
	start, _ := strconv.ParseUint(f[19], 10, 64)
	return procStatus{state: f[0], start: start}, true
}

// mountsMentioning lists mount points in this process's mount table that
// contain any of the given substrings.
func mountsMentioning(subs ...string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{"(cannot read /proc/self/mountinfo: " + err.Error() + ")"}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		for _, s := range subs {
			if strings.Contains(fields[4], s) {
				out = append(out, fields[4])
				break
			}
		}
	}
	return out
}
