// Package debounce batches bursts of change notifications: a controller
// that rebuilds on change waits for a quiet moment, or at most a bound
// after the burst began, then rebuilds once for the lot.
package debounce

import (
	"context"
	"sync"
	"time"
)

// Debouncer coalesces notifications. Notify never blocks; Wait returns
// once per burst. One goroutine waits; any number notify.
type Debouncer struct {
	quiet, max time.Duration
	wake       chan struct{}
	mu         sync.Mutex
	first      time.Time // of the burst not yet waited for; zero if none
}

// New returns a Debouncer whose Wait returns once no notification came for
// quiet, or max after the burst's first, whichever is sooner. max must be
// at least quiet.
func New(quiet, max time.Duration) *Debouncer {
	return &Debouncer{quiet: quiet, max: max, wake: make(chan struct{}, 1)}
}

// Notify records a change.
func (d *Debouncer) Notify() {
	d.mu.Lock()
	if d.first.IsZero() {
		d.first = time.Now()
	}
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default: // a wake is already pending
	}
}

// Wait blocks until a burst of changes has settled: it waits for a first
// notification, then until no other came for the quiet period or the
// maximum passed since that first, even if it came while the caller was
// busy. It reports false if ctx ended first.
func (d *Debouncer) Wait(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-d.wake:
	}
	d.mu.Lock()
	first := d.first
	d.mu.Unlock()
	quiet := time.NewTimer(d.quiet)
	defer quiet.Stop()
	deadline := time.NewTimer(max(d.max-time.Since(first), 0))
	defer deadline.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-d.wake:
			quiet.Reset(d.quiet)
			continue
		case <-quiet.C:
		case <-deadline.C:
		}
		d.mu.Lock()
		d.first = time.Time{} // the next notification begins a burst
		d.mu.Unlock()
		return true
	}
}
