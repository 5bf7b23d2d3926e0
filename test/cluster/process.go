package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weftmesh/weft/internal/netns"
)

// process is a control-plane or node daemon the cluster runs inside one of
// its namespaces, with its output in a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process exited
	err     error         // Wait's result, set before done is closed
	stopped atomic.Bool   // set by stop, so an exit is expected
}

// startProcess starts bin with args inside ns. The process gets its own
// process group and dies with the harness (PR_SET_PDEATHSIG).
func startProcess(ns *netns.NS, name, logDir, bin string, args []string) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + logDir}
	cmd.Dir = logDir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := ns.Do(cmd.Start); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has exited, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, waits up to grace, then kills it.
func (p *process) stop(grace time.Duration) {
	p.stopped.Store(true)
	pid := p.cmd.Process.Pid
	if ok, _ := p.exited(); ok {
		_ = syscall.Kill(-pid, syscall.SIGKILL) // anything it left in its group
		return
	}
	sig := syscall.SIGTERM
	if grace <= 0 {
		sig = syscall.SIGKILL
	}
	_ = syscall.Kill(-pid, sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-p.done
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}

// failure describes an unexpected exit with the end of the log.
func (p *process) failure() error {
	return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.name, p.err, p.logPath, tail(p.logPath, 30))
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	b = bytes.TrimRight(b, "\n")
	lines := strings.Split(string(b), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// checkExited returns the first unexpected exit among procs.
func checkExited(procs ...*process) error {
	var errs []error
	for _, p := range procs {
		if p == nil {
			continue
		}
		if ok, _ := p.exited(); ok && !p.stopped.Load() {
			errs = append(errs, p.failure())
		}
	}
	return errors.Join(errs...)
}
