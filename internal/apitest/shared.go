package apitest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Shared is one API server for the tests of a package, with CRDs
// installed, started by the first test that asks for it:
//
//	var api = apitest.NewShared("../charts/weft/crds/….yaml")
//
//	func TestMain(m *testing.M) { os.Exit(api.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		c := api.Get(t) // skips unless the binaries are there
//		...
//	}
type Shared struct {
	crds []string

	once sync.Once
	c    *Cluster // nil when the start failed
}

// NewShared returns a Shared whose API server gets the CRDs of these
// files (paths relative to the test's package).
func NewShared(crdFiles ...string) *Shared { return &Shared{crds: crdFiles} }

// Get returns the package's API server, starting it on first use. It skips
// tb when the API server cannot run here and fails it when it did not
// start.
func (s *Shared) Get(tb testing.TB) *Cluster {
	tb.Helper()
	if ok, why := Available(); !ok {
		tb.Skip(why)
	}
	s.once.Do(func() {
		c := Start(tb)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, f := range s.crds {
			if err := c.ApplyCRDFile(ctx, f); err != nil {
				c.Stop()
				tb.Fatalf("installing the CRDs of %s: %v", f, err)
			}
		}
		s.c = c
	})
	if s.c == nil {
		tb.Fatal("the shared API server failed to start in an earlier test")
	}
	return s.c
}

// Main runs the package's tests and then stops the API server, if one was
// started; it returns the exit code for os.Exit.
func (s *Shared) Main(m *testing.M) int {
	code := m.Run()
	if s.c != nil {
		s.c.Stop()
	}
	return code
}
