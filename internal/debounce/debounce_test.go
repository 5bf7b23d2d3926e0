package debounce

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

const (
	quietFor = 10 * time.Millisecond
	maxFor   = 100 * time.Millisecond
)

// waited runs Wait in a goroutine and returns a channel that receives its
// result and the time it took.
func waited(ctx context.Context, d *Debouncer) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		if d.Wait(ctx) {
			out <- time.Since(start)
		} else {
			out <- -1
		}
	}()
	return out
}

// notifyEvery notifies d every interval until stop is closed.
func notifyEvery(d *Debouncer, interval time.Duration) (stop chan struct{}) {
	stop = make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(interval):
				d.Notify()
			}
		}
	}()
	return stop
}

// TestQuiet: one notification settles after the quiet period.
func TestQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(quietFor, maxFor)
		d.Notify()
		if got := <-waited(t.Context(), d); got != quietFor {
			t.Errorf("Wait took %v, want %v", got, quietFor)
		}
	})
}

// TestBurst: notifications closer than the quiet period extend the wait,
// up to the maximum after the first.
func TestBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(quietFor, maxFor)
		d.Notify()
		res := waited(t.Context(), d)
		for range 5 {
			time.Sleep(quietFor / 2)
			d.Notify()
		}
		if got := <-res; got != 5*quietFor/2+quietFor {
			t.Errorf("a burst of 6 over %v: Wait took %v, want %v", 5*quietFor/2, got, 5*quietFor/2+quietFor)
		}
		// Endless changes: settled at the maximum all the same.
		stop := notifyEvery(d, quietFor/2)
		d.Notify()
		got := <-waited(t.Context(), d)
		close(stop)
		if got != maxFor {
			t.Errorf("endless changes: Wait took %v, want the maximum %v", got, maxFor)
		}
	})
}

// TestWaitsForAChange: without a notification Wait does not return, and
// it reports false when its context ends.
func TestWaitsForAChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(quietFor, maxFor)
		ctx, cancel := context.WithCancel(t.Context())
		res := waited(ctx, d)
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case got := <-res:
			t.Fatalf("Wait returned (%v) with no change", got)
		default:
		}
		cancel()
		if got := <-res; got != -1 {
			t.Errorf("Wait after its context ended: %v, want false", got)
		}
		// Mid-burst too.
		ctx, cancel = context.WithCancel(t.Context())
		d.Notify()
		res = waited(ctx, d)
		synctest.Wait()
		cancel()
		if got := <-res; got != -1 {
			t.Errorf("Wait ended mid-burst: %v, want false", got)
		}
	})
}

// TestNotifyNeverBlocks: notifications with nobody waiting coalesce into
// one burst.
func TestNotifyNeverBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(quietFor, maxFor)
		for range 1000 {
			d.Notify()
		}
		if got := <-waited(t.Context(), d); got != quietFor {
			t.Errorf("Wait took %v, want %v", got, quietFor)
		}
		res := waited(t.Context(), d)
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case got := <-res:
			t.Errorf("a second burst (%v) from notifications already waited for", got)
		default:
		}
		d.Notify()
		<-res
	})
}

// TestMaxFromTheFirstChange: the maximum counts from the burst's first
// notification, also when the waiter came late.
func TestMaxFromTheFirstChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New(quietFor, maxFor)
		d.Notify()
		time.Sleep(maxFor - quietFor/2) // the waiter busy with the last batch
		stop := notifyEvery(d, quietFor/2)
		got := <-waited(t.Context(), d)
		close(stop)
		if got != quietFor/2 {
			t.Errorf("Wait took %v, want the %v left of the maximum", got, quietFor/2)
		}
	})
}
