// Package reconnect paces a client's reconnects to a server it keeps a
// long-lived connection or stream with: the xDS client to the control
// plane, ztunnel to the CNI node agent.
//
// The delay before an attempt is drawn evenly from [b/2, b] ("equal
// jitter": never less than half the back-off, so a fleet of clients that
// lost one server spreads out instead of coming back at once), where b
// starts at Min, doubles with each attempt up to Max, and starts again at
// Min once a connection stayed up for Healthy.
package reconnect

import (
	"context"
	"math/rand/v2"
	"time"
)

// Healthy is how long a connection must have stayed up to count as
// healthy: the next reconnect after it starts again from the first delay.
// A connection that ends sooner (a server that accepts and then fails on
// the first request, or a peer that restarts in a loop) keeps the back-off
// growing. Thirty seconds spans several rounds of the peers' own failure
// detection (the node agent probes an idle ztunnel every 5 s; gRPC reports
// a refused stream at once), so a connection that lived past it did work;
// a client whose connection was healthy waits at most the minimum delay
// before its next attempt.
const Healthy = 30 * time.Second

// The default bounds of a Backoff.
const (
	DefaultMin = 10 * time.Millisecond
	DefaultMax = 15 * time.Second
)

// Backoff is the reconnect delay of one loop, which owns it.
type Backoff struct {
	min, max time.Duration
	next     time.Duration // the b of the next attempt; 0 before the first
}

// NewBackoff returns a back-off from lo to hi; zero takes DefaultMin and
// DefaultMax, and hi is at least lo.
func NewBackoff(lo, hi time.Duration) *Backoff {
	if lo <= 0 {
		lo = DefaultMin
	}
	if hi <= 0 {
		hi = DefaultMax
	}
	return &Backoff{min: lo, max: max(hi, lo)}
}

// Delay returns how long to wait before the next attempt, the connection
// having been up for up (0 if it never came up).
func (b *Backoff) Delay(up time.Duration) time.Duration {
	if b.next == 0 || up >= Healthy {
		b.next = b.min
	}
	d := b.next/2 + rand.N(b.next-b.next/2+1)
	b.next = min(2*b.next, b.max)
	return d
}

// Sleep waits for d or until ctx ends, and reports whether ctx is still
// live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
