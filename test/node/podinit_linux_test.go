package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// runInit runs the pod init (this test binary re-executed) as the runner
// does, with new mount and UTS namespaces, and returns its output.
func runInit(t *testing.T, spec initSpec) (string, error) {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(specPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{initEnv + "=" + specPath}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestPodInitMounts checks that the init mounts volumes where the container
// expects them, making mount points that do not exist on the machine
// without creating anything there, read-only where asked, and sets the host
// name.
func TestPodInitMounts(t *testing.T) {
	if os.Getenv("WEFT_ROOT_TESTS") == "" || os.Geteuid() != 0 {
		t.Skip("makes mount namespaces; needs root and WEFT_ROOT_TESTS=1 (make test sets it)")
	}
	dir := t.TempDir()
	vol := filepath.Join(dir, "vol")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "hello"), []byte("world"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "single")
	if err := os.WriteFile(file, []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("weft-init-test-%d", os.Getpid())
	underRun := "/var/run/" + tag + "/a/b" // parent missing under /run (a symlink's target)
	underRoot := "/" + tag + "/c"          // parent missing under /
	ro := "/etc/" + tag + "/ro"            // parent missing under /etc, read-only
	fileTarget := "/var/run/" + tag + "/f" // a single file
	script := strings.Join([]string{
		"cat " + underRun + "/hello " + underRoot + "/hello " + ro + "/hello " + fileTarget,
		"echo",
		"(echo x > " + ro + "/new) 2>/dev/null && echo writable || echo read-only",
		"cat /proc/sys/kernel/hostname",
		"test -e /etc/passwd && echo etc-intact",
	}, "; ")
	out, err := runInit(t, initSpec{
		Path: "/bin/sh", Argv: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"},
		Hostname: "pod-a", Stage: filepath.Join(dir, "stage"),
		Mounts: []initMount{
			{Source: vol, Target: underRun},
			{Source: vol, Target: underRoot},
			{Source: vol, Target: ro, ReadOnly: true},
			{Source: file, Target: fileTarget},
		},
	})
	if err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	if want := "worldworldworldone\nread-only\npod-a\netc-intact\n"; out != want {
		t.Fatalf("container saw %q, want %q", out, want)
	}
	for _, p := range []string{"/run/" + tag, "/" + tag, "/etc/" + tag} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists on the machine after the init ran (%v)", p, err)
		}
	}
	if h, _ := os.Hostname(); h == "pod-a" {
		t.Error("the init changed the machine's host name")
	}
}

func TestPodInitFailure(t *testing.T) {
	if os.Getenv("WEFT_ROOT_TESTS") == "" || os.Geteuid() != 0 {
		t.Skip("makes mount namespaces; needs root and WEFT_ROOT_TESTS=1 (make test sets it)")
	}
	out, err := runInit(t, initSpec{
		Path: "/bin/true", Argv: []string{"true"}, Stage: t.TempDir(),
		Mounts: []initMount{{Source: "/nonexistent-volume", Target: "/mnt/x"}},
	})
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 127 || !strings.Contains(out, "volume source /nonexistent-volume") {
		t.Fatalf("init with a missing volume: %v, %q; want exit 127 naming the volume", err, out)
	}
}
