package kubequeue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"
)

// fake is a reconcile function that answers from a script and records
// what it was asked.
type fake struct {
	gate    chan struct{} // if set, each reconcile says so on entered, then waits for gate or ctx
	entered chan string

	mu      sync.Mutex
	script  map[string][]error // guarded by mu: the results of the next calls, by key; then nil
	busy    map[string]int     // guarded by mu: reconciles under way, by key
	overlap bool               // guarded by mu: one key was in two reconciles at once
	calls   list               // the keys reconciled, in order
}

func (f *fake) reconcile(ctx context.Context, key string) error {
	f.calls.add(key)
	f.mu.Lock()
	f.busy[key]++
	f.overlap = f.overlap || f.busy[key] > 1
	var err error
	if s := f.script[key]; len(s) > 0 {
		err, f.script[key] = s[0], s[1:]
	}
	f.mu.Unlock()
	if f.gate != nil {
		f.entered <- key
		select {
		case <-f.gate:
		case <-ctx.Done():
			err = fmt.Errorf("writing %s: %w", key, ctx.Err())
		}
	}
	f.mu.Lock()
	f.busy[key]--
	f.mu.Unlock()
	return err
}

func (f *fake) got() []string { return f.calls.get() }

// list is a list of strings that goroutines add to.
type list struct {
	mu    sync.Mutex
	items []string // guarded by mu
}

func (l *list) add(s string) {
	l.mu.Lock()
	l.items = append(l.items, s)
	l.mu.Unlock()
}

func (l *list) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.items)
}

// counted counts Get and Done on the work queue, by key.
type counted struct {
	workqueue.TypedRateLimitingInterface[string]
	mu         sync.Mutex
	gets, done map[string]int // guarded by mu
}

func (c *counted) Get() (string, bool) {
	k, shutdown := c.TypedRateLimitingInterface.Get()
	if !shutdown {
		c.mu.Lock()
		c.gets[k]++
		c.mu.Unlock()
	}
	return k, shutdown
}

func (c *counted) Done(k string) {
	c.mu.Lock()
	c.done[k]++
	c.mu.Unlock()
	c.TypedRateLimitingInterface.Done(k)
}

// logged keeps the records logged, as "LEVEL message key=value ...".
type logged struct{ recs list }

func (l *logged) Enabled(context.Context, slog.Level) bool { return true }
func (l *logged) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logged) WithGroup(string) slog.Handler            { return l }
func (l *logged) Handle(_ context.Context, r slog.Record) error {
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
	l.recs.add(line)
	return nil
}

func (l *logged) lines() []string { return l.recs.get() }

// harness runs a Queue of a fake reconcile in a synctest bubble.
type harness struct {
	t     *testing.T
	f     *fake
	q     *Queue[string]
	wq    *counted
	log   *logged
	stop  context.CancelFunc
	ended chan struct{}
}

func start(t *testing.T, workers int, script map[string][]error, gate chan struct{}) *harness {
	h := newHarness(t, script, gate)
	h.run(workers)
	return h
}

// newHarness makes the queue and its fake reconciler without running it.
func newHarness(t *testing.T, script map[string][]error, gate chan struct{}) *harness {
	f := &fake{script: script, busy: map[string]int{}, gate: gate, entered: make(chan string, 10)}
	h := &harness{t: t, f: f, log: &logged{}, ended: make(chan struct{})}
	h.q = New(Config{Name: "test", KeyAttr: "thing", Logger: slog.New(h.log)}, f.reconcile)
	h.wq = &counted{TypedRateLimitingInterface: h.q.q, gets: map[string]int{}, done: map[string]int{}}
	h.q.q = h.wq
	return h
}

// run starts the queue's workers.
func (h *harness) run(workers int) {
	ctx, stop := context.WithCancel(h.t.Context())
	h.stop = stop
	go func() {
		defer close(h.ended)
		h.q.Run(ctx, workers)
	}()
}

// shutdown stops Run, waits for it, and checks that every key taken was
// marked Done and that none is left in processing.
func (h *harness) shutdown() {
	h.t.Helper()
	h.stop()
	<-h.ended
	h.wq.mu.Lock()
	if diff := cmp.Diff(h.wq.gets, h.wq.done); diff != "" {
		h.t.Errorf("Get and Done calls by key differ (-got +done):\n%s", diff)
	}
	h.wq.mu.Unlock()
	// Returns at once when nothing is in processing; a key never marked
	// Done would block it, which the bubble reports as a deadlock.
	h.wq.ShutDownWithDrain()
	left := h.wq.Len() // keys never taken, dropped
	h.q.Add("late")
	if n := h.wq.Len(); n != left {
		h.t.Errorf("a key added after Run returned was queued")
	}
}

func TestSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Added before the workers run: a worker that had already taken
		// "a" would rightly take it again for the third Add.
		h := newHarness(t, nil, nil)
		h.q.Add("a")
		h.q.Add("b")
		h.q.Add("a") // queued once
		h.run(2)
		synctest.Wait()
		got := h.f.got()
		slices.Sort(got)
		if diff := cmp.Diff([]string{"a", "b"}, got); diff != "" {
			t.Errorf("reconciled (-want +got):\n%s", diff)
		}
		if n := h.wq.NumRequeues("a"); n != 0 {
			t.Errorf("NumRequeues(a) = %d after a success", n)
		}
		h.shutdown()
		if l := h.log.lines(); len(l) != 0 {
			t.Errorf("logged on success: %q", l)
		}
	})
}

func TestErrorThenSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		h := start(t, 1, map[string][]error{"a": {boom, boom}}, nil)
		h.q.Add("a")
		synctest.Wait()
		if n := h.wq.NumRequeues("a"); n != 1 {
			t.Errorf("NumRequeues(a) = %d after one failure, want 1", n)
		}
		// Back-off: 5 ms after the first failure, 10 ms after the second.
		time.Sleep(5 * time.Millisecond)
		synctest.Wait()
		if got := len(h.f.got()); got != 2 {
			t.Errorf("%d attempts 5 ms after the first failure, want 2", got)
		}
		time.Sleep(9 * time.Millisecond)
		synctest.Wait()
		if got := len(h.f.got()); got != 2 {
			t.Errorf("%d attempts 9 ms after the second failure, want 2 (back-off not doubled)", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if diff := cmp.Diff([]string{"a", "a", "a"}, h.f.got()); diff != "" {
			t.Errorf("reconciled (-want +got):\n%s", diff)
		}
		if n := h.wq.NumRequeues("a"); n != 0 {
			t.Errorf("NumRequeues(a) = %d after the success, want 0 (forgotten)", n)
		}
		h.shutdown()
		want := []string{
			"WARN reconcile failed; retrying queue=test thing=a error=boom retries=0",
			"WARN reconcile failed; retrying queue=test thing=a error=boom retries=1",
		}
		if diff := cmp.Diff(want, h.log.lines()); diff != "" {
			t.Errorf("log (-want +got):\n%s", diff)
		}
	})
}

func TestConflict(t *testing.T) {
	gr := schema.GroupResource{Resource: "gateways"}
	for name, err := range map[string]error{
		"conflict":       apierrors.NewConflict(gr, "a", errors.New("the object has been modified")),
		"already exists": apierrors.NewAlreadyExists(gr, "a"),
		"wrapped":        fmt.Errorf("writing the status: %w", apierrors.NewConflict(gr, "a", errors.New("modified"))),
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := start(t, 1, map[string][]error{"a": {err}}, nil)
				h.q.Add("a")
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
				if diff := cmp.Diff([]string{"a", "a"}, h.f.got()); diff != "" {
					t.Errorf("reconciled (-want +got):\n%s", diff)
				}
				h.shutdown()
				want := []string{"DEBUG reconcile conflict; retrying queue=test thing=a error=" + err.Error() + " retries=0"}
				if diff := cmp.Diff(want, h.log.lines()); diff != "" {
					t.Errorf("log (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestConflictClassifies(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("connection refused"), false},
		{apierrors.NewNotFound(gr, "a"), false},
		{apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "a", nil), false},
		{apierrors.NewConflict(gr, "a", errors.New("modified")), true},
		{apierrors.NewAlreadyExists(gr, "a"), true},
		{fmt.Errorf("creating: %w", apierrors.NewAlreadyExists(gr, "a")), true},
	} {
		if got := Conflict(c.err); got != c.want {
			t.Errorf("Conflict(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestShutdownWhileBusy stops Run while a reconcile is under way: the
// reconcile's context ends, Run waits for it, its error is not logged, and
// the keys still queued are dropped without a reconcile.
func TestShutdownWhileBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := start(t, 1, nil, make(chan struct{}))
		h.q.Add("a")
		<-h.f.entered
		h.q.Add("b")
		h.q.Add("c")
		synctest.Wait()
		select {
		case <-h.ended:
			t.Fatal("Run returned before its context ended")
		default:
		}
		h.shutdown()
		if n := h.wq.Len(); n != 1 {
			t.Errorf("%d keys left in the queue, want 1: b taken and dropped, c never taken", n)
		}
		if diff := cmp.Diff([]string{"a"}, h.f.got()); diff != "" {
			t.Errorf("reconciled (-want +got):\n%s", diff)
		}
		if l := h.log.lines(); len(l) != 0 {
			t.Errorf("logged while stopping: %q", l)
		}
	})
}

// TestReaddedWhileBusy re-adds a key while it is being reconciled, with
// workers to spare: it is reconciled again once the first reconcile is
// Done, never by two workers at once.
func TestReaddedWhileBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		h := start(t, 4, map[string][]error{"a": {errors.New("boom")}}, gate)
		h.q.Add("a")
		<-h.f.entered
		h.q.Add("a")
		synctest.Wait()
		if got := len(h.f.got()); got != 1 {
			t.Errorf("a key re-added while busy was taken by another worker (%d reconciles)", got)
		}
		close(gate)
		<-h.f.entered
		synctest.Wait()
		if diff := cmp.Diff([]string{"a", "a"}, h.f.got()); diff != "" {
			t.Errorf("reconciled (-want +got):\n%s", diff)
		}
		h.shutdown()
		h.f.mu.Lock()
		defer h.f.mu.Unlock()
		if h.f.overlap {
			t.Error("one key was in two reconciles at once")
		}
	})
}

// TestRequeueAfter: AddAfter in a reconcile brings the key back
// after the delay, and the success still forgets its failures.
func TestRequeueAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var q *Queue[string]
		var mu sync.Mutex
		var at []time.Duration
		t0 := time.Now()
		q = New(Config{Name: "test"}, func(_ context.Context, key string) error {
			mu.Lock()
			at = append(at, time.Since(t0))
			n := len(at)
			mu.Unlock()
			if n == 1 {
				q.AddAfter(key, time.Minute)
			}
			return nil
		})
		ctx, stop := context.WithCancel(t.Context())
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			q.Run(ctx, 0) // at least one worker
		}()
		q.Add("a")
		time.Sleep(2 * time.Minute)
		stop()
		<-ended
		mu.Lock()
		defer mu.Unlock()
		if diff := cmp.Diff([]time.Duration{0, time.Minute}, at); diff != "" {
			t.Errorf("reconciled at (-want +got):\n%s", diff)
		}
	})
}

// TestShutDownBeforeRun: a caller that returns before Run stops the queue
// with ShutDown; the bubble checks that no goroutine is left.
func TestShutDownBeforeRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New(Config{Name: "test"}, func(context.Context, string) error { return nil })
		q.Add("a")
		q.ShutDown()
		q.ShutDown()
	})
}
