package bench

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weftmesh/weft/test/cluster"
)

// BenchmarkDemo reports, once:
//
//	demo_wall_s  `make demo` from a warm build to the story told: the
//	             cluster's start, the chart's install, the apps and every
//	             step of the story (the teardown after it is not counted)
//
// It runs `make demo DEMO_FLAGS="-exit ..."` as a user would, on a free
// API-server port and a kubeconfig of its own, and fails if a step of the
// story fails.
func BenchmarkDemo(b *testing.B) {
	if why := cluster.SkipReason(); why != "" {
		b.Skip(why)
	}
	cfg := cluster.Config{}
	if err := cfg.SetDefaults(); err != nil {
		b.Fatal(err)
	}
	// Warm: the binaries and the tools are built before the clock starts.
	warm := exec.Command("make", "build", "tools")
	warm.Dir = cfg.RepoDir
	if out, err := warm.CombinedOutput(); err != nil {
		b.Fatalf("make build tools: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	kubeconfig := filepath.Join(b.TempDir(), "demo.kubeconfig")
	cmd := exec.Command("make", "demo", fmt.Sprintf("DEMO_FLAGS=-exit -port %d -kubeconfig %s", port, kubeconfig))
	cmd.Dir = cfg.RepoDir
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var told time.Duration
	var tail []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		l := sc.Text()
		tail = append(tail, l)
		if len(tail) > 40 {
			tail = tail[1:]
		}
		if told == 0 && strings.HasPrefix(l, "==> the story is told") {
			told = time.Since(start)
		}
	}
	if err := cmd.Wait(); err != nil || told == 0 {
		b.Fatalf("make demo: %v; the story was not told; last lines:\n%s", err, strings.Join(tail, "\n"))
	}
	fmt.Printf("bench: demo_wall_s %.0f\n", told.Seconds())
	b.ReportMetric(told.Seconds(), "demo_s")
}
