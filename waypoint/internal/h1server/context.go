package h1server

import (
	"context"
	"slices"
	"sync"
	"time"
)

// requestContext is a request's context: no deadline and no values, ended
// (context.Canceled) when its client leaves or its response is done.
//
// It does what context.WithCancel(context.Background()) would, for less:
// every request of every connection has one, and a proxy's upstream
// watches it for the request's whole life. Its Done channel is made only
// when asked for, and AfterFunc, which context.AfterFunc and the
// context package's children use when a context has it, registers a
// function without a goroutine or the package's bookkeeping; a caller that
// calls the method itself (package upstream) pays one allocation for stop.
type requestContext struct {
	mu    sync.Mutex
	done  chan struct{} // guarded by mu: made by Done, closed by cancel
	err   error         // guarded by mu: set by cancel
	funcs []afterFunc   // guarded by mu: those not yet run or stopped
	next  uint64        // guarded by mu: the next afterFunc's id
	slots [2]afterFunc  // funcs' first backing array
}

// afterFunc is one function waiting for a requestContext to end.
type afterFunc struct {
	id uint64
	f  func()
}

func newRequestContext() *requestContext {
	c := &requestContext{}
	c.funcs = c.slots[:0]
	return c
}

var _ context.Context = (*requestContext)(nil)

func (c *requestContext) Deadline() (time.Time, bool) { return time.Time{}, false }

func (c *requestContext) Value(any) any { return nil }

func (c *requestContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

func (c *requestContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *requestContext) String() string { return "h1server.requestContext" }

// AfterFunc arranges for f to run in its own goroutine once c ends (at
// once if it has); stop stops that and reports whether it did, as
// context.AfterFunc's.
func (c *requestContext) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	id := c.next
	c.next++
	c.funcs = append(c.funcs, afterFunc{id: id, f: f})
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.funcs {
			if x.id == id {
				c.funcs = slices.Delete(c.funcs, i, i+1)
				return true
			}
		}
		return false
	}
}

// cancel ends c, if it has not ended, and runs what waits for that.
func (c *requestContext) cancel() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = context.Canceled
	if c.done != nil {
		close(c.done)
	}
	funcs := c.funcs
	c.funcs = nil
	c.mu.Unlock()
	for _, a := range funcs {
		go a.f()
	}
}
