package hbone

import (
	"sync"
	"time"
)

// deadline is a settable point in time whose passing closes a channel, the
// way a socket deadline wakes blocked reads and writes.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer   // guarded by mu
	ch    chan struct{} // guarded by mu; closed once the deadline passed
}

func newDeadline() deadline { return deadline{ch: make(chan struct{})} }

// set moves the deadline; the zero time means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.ch // the timer fired: wait for it to have closed ch
	}
	d.timer = nil
	if isClosed(d.ch) {
		d.ch = make(chan struct{})
	}
	if t.IsZero() {
		return
	}
	dur := time.Until(t)
	if dur <= 0 {
		close(d.ch)
		return
	}
	ch := d.ch
	d.timer = time.AfterFunc(dur, func() { close(ch) })
}

// wait returns a channel closed when the deadline passes.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

// stop releases the timer.
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
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
