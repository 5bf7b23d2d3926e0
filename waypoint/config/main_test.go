package config

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a resolution goroutine outlives
// its Store's Run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
