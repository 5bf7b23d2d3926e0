package reconnect

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// within checks that d was drawn from [b/2, b].
func within(t *testing.T, what string, d, b time.Duration) {
	t.Helper()
	if d < b/2 || d > b {
		t.Errorf("%s: delay %v, want within [%v, %v]", what, d, b/2, b)
	}
}

func TestDelayGrowsToMax(t *testing.T) {
	b := NewBackoff(10*time.Millisecond, 80*time.Millisecond)
	for i, want := range []time.Duration{10, 20, 40, 80, 80, 80} {
		within(t, fmt.Sprintf("attempt %d", i+1), b.Delay(0), want*time.Millisecond)
	}
}

func TestDefaults(t *testing.T) {
	for _, c := range []struct {
		name   string
		lo, hi time.Duration
		first  time.Duration
		capped time.Duration
	}{
		{"zero", 0, 0, DefaultMin, DefaultMax},
		{"negative", -time.Second, -time.Second, DefaultMin, DefaultMax},
		{"max below min", time.Second, time.Millisecond, time.Second, time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := NewBackoff(c.lo, c.hi)
			within(t, "first", b.Delay(0), c.first)
			for range 20 {
				b.Delay(0)
			}
			within(t, "capped", b.Delay(0), c.capped)
		})
	}
}

// TestHealthyResets: a connection up for Healthy starts the back-off
// again; one that ended sooner keeps it growing.
func TestHealthyResets(t *testing.T) {
	b := NewBackoff(time.Second, time.Minute)
	within(t, "first", b.Delay(0), time.Second)
	within(t, "second", b.Delay(time.Second), 2*time.Second)
	within(t, "after a short connection", b.Delay(Healthy-time.Millisecond), 4*time.Second)
	within(t, "after a healthy connection", b.Delay(Healthy), time.Second)
	within(t, "then", b.Delay(0), 2*time.Second)
}

// TestJitter: the delays at the cap spread over [max/2, max].
func TestJitter(t *testing.T) {
	b := NewBackoff(time.Second, time.Second)
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		d := b.Delay(0)
		within(t, "capped", d, time.Second)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo > 600*time.Millisecond || hi < 900*time.Millisecond {
		t.Errorf("1000 delays spread over [%v, %v], want about [500ms, 1s]", lo, hi)
	}
}

func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if !Sleep(t.Context(), time.Second) {
			t.Error("Sleep reported a live context as ended")
		}
		if got := time.Since(start); got != time.Second {
			t.Errorf("slept %v, want 1s", got)
		}
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(time.Second, cancel)
		start = time.Now()
		if Sleep(ctx, time.Hour) {
			t.Error("Sleep reported an ended context as live")
		}
		if got := time.Since(start); got != time.Second {
			t.Errorf("Sleep returned %v after it started, want 1s, when its context ended", got)
		}
	})
}

// TestReconnectLoop runs a reconnect loop the way the clients do, against
// a server that refuses three times, then keeps a connection for 40 s, then
// refuses again: the attempts are paced 10, 20, 40 ms apart (give or take
// the jitter), and after the healthy connection the next comes within
// 10 ms again.
func TestReconnectLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		steps := []struct {
			up time.Duration // how long the connection stays up
			b  time.Duration // the back-off after it
		}{
			{0, 10 * time.Millisecond},
			{0, 20 * time.Millisecond},
			{0, 40 * time.Millisecond},
			{40 * time.Second, 10 * time.Millisecond},
			{0, 20 * time.Millisecond},
		}
		b := NewBackoff(0, 0)
		for i, s := range steps {
			start := time.Now()
			time.Sleep(s.up)
			if !Sleep(t.Context(), b.Delay(time.Since(start))) {
				t.Fatal("Sleep ended early")
			}
			if gap := time.Since(start); gap < s.up+s.b/2 || gap > s.up+s.b {
				t.Errorf("attempt %d came %v after attempt %d, want %v + [%v, %v]", i+2, gap, i+1, s.up, s.b/2, s.b)
			}
		}
	})
}
