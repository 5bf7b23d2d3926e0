package hbone

import (
	"sync"
	"time"
)

// deadline is a settable point in time whose passing closes a channel, the
// way a socket deadline wakes blocked reads and writes. Its timer is made
// once and reset, so that moving the deadline (net/http-style servers do it
// several times per request) allocates nothing; its channel is made only
// once something waits on it or a deadline is set, so that a stream whose
// reads and writes never block (an idle relayed one) has none.
type deadline struct {
	mu    sync.Mutex    // a leaf, taken under a Stream's rmu or wmu
	at    time.Time     // guarded by mu: the deadline in force; zero for none
	timer *time.Timer   // guarded by mu: runs fire; made on first use
	ch    chan struct{} // guarded by mu; closed once the deadline passed; nil until needed
	// passed, when set, is told each time the deadline passes, after mu
	// is released: a waiter that holds no goroutine on ch (StartWriteTo).
	passed deadlineWatcher
}

type deadlineWatcher interface{ deadlinePassed() }

func newDeadline() deadline { return deadline{} }

// set moves the deadline; the zero time means none.
func (d *deadline) set(t time.Time) {
	if d.setLocked(t) && d.passed != nil {
		d.passed.deadlinePassed()
	}
}

// setLocked is set under d.mu; it reports whether the deadline has passed.
func (d *deadline) setLocked(t time.Time) (passed bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = t
	if d.timer != nil {
		d.timer.Stop()
	}
	if isClosed(d.ch) {
		d.ch = make(chan struct{})
	}
	if t.IsZero() {
		return false
	}
	if d.ch == nil {
		d.ch = make(chan struct{})
	}
	dur := time.Until(t)
	if dur <= 0 {
		close(d.ch)
		return true
	}
	if d.timer == nil {
		d.timer = time.AfterFunc(dur, d.fire)
	} else {
		d.timer.Reset(dur)
	}
	return false
}

// fire closes the channel once the deadline in force has passed; a firing
// that a set came too late to stop finds a later deadline, or none, and
// leaves the channel open.
func (d *deadline) fire() {
	d.mu.Lock()
	if d.at.IsZero() || isClosed(d.ch) {
		d.mu.Unlock()
		return
	}
	if dur := time.Until(d.at); dur > 0 {
		d.timer.Reset(dur)
		d.mu.Unlock()
		return
	}
	close(d.ch)
	d.mu.Unlock()
	if d.passed != nil {
		d.passed.deadlinePassed()
	}
}

// wait returns a channel closed when the deadline passes.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ch == nil {
		d.ch = make(chan struct{})
	}
	return d.ch
}

// expired reports whether the deadline has passed, without making a channel.
func (d *deadline) expired() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch != nil && isClosed(d.ch)
}

// stop releases the timer.
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = time.Time{}
	if d.timer != nil {
		d.timer.Stop()
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// notify wakes one waiter on a capacity-1 channel without blocking.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
