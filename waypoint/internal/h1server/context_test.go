package h1server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRequestContext checks requestContext against what a context from
// context.WithCancel does, through the context package's own functions.
func TestRequestContext(t *testing.T) {
	wait := func(t *testing.T, ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not happen", what)
		}
	}
	t.Run("done and err", func(t *testing.T) {
		c := newRequestContext()
		done := c.Done()
		if c.Err() != nil {
			t.Fatalf("Err before cancel = %v", c.Err())
		}
		select {
		case <-done:
			t.Fatal("Done closed before cancel")
		default:
		}
		c.cancel()
		c.cancel() // a second cancel is harmless
		wait(t, done, "Done's close")
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(context.Cause(c), context.Canceled) {
			t.Fatalf("Err = %v, Cause = %v, want context.Canceled", c.Err(), context.Cause(c))
		}
		// A channel asked for after the end is closed already.
		wait(t, newCanceled().Done(), "a late Done's close")
		if _, ok := c.Deadline(); ok || c.Value(testKey{}) != nil {
			t.Fatal("a request context has no deadline and no values")
		}
	})
	t.Run("after func", func(t *testing.T) {
		c := newRequestContext()
		ran := make(chan struct{})
		var stopped atomic.Bool
		stop := c.AfterFunc(func() { close(ran) })
		stop2 := c.AfterFunc(func() { stopped.Store(true) })
		ran3 := make(chan struct{})
		stop3 := context.AfterFunc(c, func() { close(ran3) }) // through the context package
		if !stop2() || stop2() {
			t.Fatal("stop reports true once, then false")
		}
		c.cancel()
		wait(t, ran, "the registered function")
		wait(t, ran3, "the function registered through the context package")
		if stop() || stop3() {
			t.Fatal("stop after the function ran reports true")
		}
		time.Sleep(10 * time.Millisecond)
		if stopped.Load() {
			t.Fatal("a stopped function ran")
		}
		late := make(chan struct{})
		c.AfterFunc(func() { close(late) })
		wait(t, late, "a function registered after the end")
	})
	t.Run("children", func(t *testing.T) {
		for _, end := range []string{"parent", "child"} {
			c := newRequestContext()
			child, cancel := context.WithTimeout(c, time.Hour)
			vctx := context.WithValue(c, testKey{}, "v")
			if end == "child" {
				cancel()
				if c.Err() != nil {
					t.Fatal("a child's end ended its parent")
				}
				c.cancel()
				continue
			}
			c.cancel()
			wait(t, child.Done(), "the child's end")
			wait(t, vctx.Done(), "a value child's end")
			if !errors.Is(child.Err(), context.Canceled) {
				t.Fatalf("child Err = %v", child.Err())
			}
			cancel()
		}
	})
	t.Run("many", func(t *testing.T) {
		// More functions than the inline slots, stopped out of order.
		c := newRequestContext()
		var n atomic.Int32
		var stops []func() bool
		for range 5 {
			stops = append(stops, c.AfterFunc(func() { n.Add(1) }))
		}
		stops[3]()
		stops[0]()
		c.cancel()
		deadline := time.Now().Add(5 * time.Second)
		for n.Load() != 3 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if got := n.Load(); got != 3 {
			t.Fatalf("%d functions ran, want 3", got)
		}
	})
}

type testKey struct{}

func newCanceled() *requestContext {
	c := newRequestContext()
	c.cancel()
	return c
}

// TestRequestContextRace races cancel against registrations and stops,
// direct and through the context package's children: every function
// either runs once or is stopped (its stop reporting true), never both,
// never neither; a child created at any point ends with its parent.
func TestRequestContextRace(t *testing.T) {
	for range 200 {
		c := newRequestContext()
		const n = 8
		var ran [n]atomic.Int32
		var stopped [n]atomic.Bool
		children := make(chan context.Context, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				stop := c.AfterFunc(func() { ran[i].Add(1) })
				child, cancel := context.WithCancel(c)
				defer cancel()
				children <- child
				if i%2 == 0 {
					stopped[i].Store(stop())
				}
			}()
		}
		close(start)
		c.cancel()
		wg.Wait()
		close(children)
		for child := range children {
			select {
			case <-child.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("a child did not end with its parent")
			}
		}
		deadline := time.Now().Add(5 * time.Second)
		for i := range n {
			for !stopped[i].Load() && ran[i].Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if r := ran[i].Load(); stopped[i].Load() == (r == 1) || r > 1 {
				t.Fatalf("function %d: stopped %v, ran %d times", i, stopped[i].Load(), r)
			}
		}
	}
}
