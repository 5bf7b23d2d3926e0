package webhook

import "sync"

// inflight bounds the admission requests being handled, by count and by
// the body bytes each reserves before its body is read.
type inflight struct {
	maxReviews int
	maxBytes   int64

	mu      sync.Mutex // guards the fields below
	reviews int
	bytes   int64
}

// Limits [inflight.acquire] reports, as the overload metric's label.
const (
	limitReviews = "reviews"
	limitBytes   = "bytes"
)

// acquire takes a slot and n bytes. It returns "" when it did, else the
// limit that was reached, having taken nothing.
func (l *inflight) acquire(n int64) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reviews >= l.maxReviews {
		return limitReviews
	}
	if l.bytes+n > l.maxBytes {
		return limitBytes
	}
	l.reviews++
	l.bytes += n
	return ""
}

// release gives back what acquire(n) took.
func (l *inflight) release(n int64) {
	l.mu.Lock()
	l.reviews--
	l.bytes -= n
	l.mu.Unlock()
}
