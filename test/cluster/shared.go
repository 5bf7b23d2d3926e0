package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

// SkipReason says why local-cluster tests cannot run in this process, or
// "" when they can: they need root and WEFT_ROOT_TESTS set.
func SkipReason() string {
	if os.Getenv("WEFT_ROOT_TESTS") == "" {
		return "local-cluster test: set WEFT_ROOT_TESTS=1 to run it (make test does); it needs root"
	}
	if os.Geteuid() != 0 {
		return "local-cluster test: needs root (it makes network namespaces and mounts)"
	}
	return ""
}

// TestLogger is the harness's logger in tests: text on stderr at the level
// of WEFT_CLUSTER_LOG (debug, info, warn; default warn).
func TestLogger() *slog.Logger {
	level := slog.LevelWarn
	switch strings.ToLower(os.Getenv("WEFT_CLUSTER_LOG")) {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// Shared is one cluster for the tests of a package, started by the first
// test that asks for it and removed when the package's tests end:
//
//	var shared = cluster.NewShared(cluster.Config{})
//
//	func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		c := shared.Get(t) // skips unless root and WEFT_ROOT_TESTS
//		...
//	}
//
// A package whose tests never call Get (say under -run '^$' for benchmarks
// only) starts no cluster.
type Shared struct {
	cfg Config

	mu      sync.Mutex // guards the fields below
	c       *Cluster
	err     error
	started bool
}

// NewShared returns a Shared that starts a cluster with cfg.
func NewShared(cfg Config) *Shared { return &Shared{cfg: cfg} }

// Get returns the package's cluster, starting it on first use. It skips
// tb when local-cluster tests cannot run here and fails it when the cluster
// cannot start. When tb fails, the cluster's state is dumped to its log.
func (s *Shared) Get(tb testing.TB) *Cluster {
	tb.Helper()
	if why := SkipReason(); why != "" {
		tb.Skip(why)
	}
	s.mu.Lock()
	if !s.started {
		s.started = true
		s.c, s.err = Start(context.Background(), s.cfg, TestLogger())
	}
	c, err := s.c, s.err
	s.mu.Unlock()
	if err != nil {
		tb.Fatalf("starting the local cluster: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			c.Dump(tb.Logf)
		}
	})
	return c
}

// Main runs the package's tests, then removes the cluster if one started
// and fails the run if that left anything behind. Use it as
// os.Exit(shared.Main(m)).
func (s *Shared) Main(m *testing.M) int {
	code := m.Run()
	s.mu.Lock()
	c := s.c
	s.mu.Unlock()
	if c == nil {
		return code
	}
	if err := c.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "removing the local cluster: %v\n", err)
		code = 1
	}
	if left := c.Leftovers(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "the local cluster left behind:\n  %s\n", strings.Join(left, "\n  "))
		code = 1
	}
	return code
}
