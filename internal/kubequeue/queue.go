// Package kubequeue works a controller's keys off a client-go rate-limited
// work queue, the same way in every controller of the mesh. Istio's
// pkg/kube/controllers queue and controller-runtime's processNextWorkItem
// are the models.
//
// Informer handlers Add keys; Run reconciles them with a number of workers.
// The work queue guarantees that one key is in one worker at a time, and
// that a key added while it is being reconciled is reconciled again after.
// For every key taken off the queue the worker calls Done, whatever the
// reconcile did. After a reconcile:
//
//   - success forgets the key's failures;
//   - an error requeues the key after its back-off (client-go's default
//     controller rate limiter: 5 ms doubling to 1000 s per key, and 10
//     retries a second overall after a burst of 100) and is logged once,
//     at Warn, with the retry count;
//   - a conflict (see Conflict) is requeued the same way but logged at
//     Debug only: the cache was behind the API server, and the retry
//     re-reads;
//   - an error while Run is stopping is not logged: it is, most likely, the
//     cancellation itself.
//
// Keys are retried until they succeed: giving up would leave a pod out of
// the mesh, or a status stale, until an unrelated event touched the object.
//
// Run stops taking keys once its context ends: a reconcile under way ends
// (its context is cancelled) and keys still queued are dropped, for the
// next start to find again in its informers' initial list.
package kubequeue

import (
	"context"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
)

// Config configures a Queue.
type Config struct {
	// Name names the queue in client-go's work-queue metrics and in the
	// log (attribute queue). Required.
	Name string
	// KeyAttr is the log attribute that carries a key, such as "pod";
	// default "key".
	KeyAttr string
	// Logger defaults to one that discards.
	Logger *slog.Logger
}

// Queue is a rate-limited work queue of keys and the workers that
// reconcile them. Add and AddAfter may be called from any goroutine, before
// and during Run.
type Queue[K comparable] struct {
	cfg       Config
	reconcile func(ctx context.Context, key K) error
	q         workqueue.TypedRateLimitingInterface[K]
}

// New returns a queue whose workers call reconcile. It starts the work
// queue's timer goroutine, which Run or ShutDown stops: a Queue is for one
// Run.
func New[K comparable](cfg Config, reconcile func(ctx context.Context, key K) error) *Queue[K] {
	if cfg.KeyAttr == "" {
		cfg.KeyAttr = "key"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Queue[K]{
		cfg:       cfg,
		reconcile: reconcile,
		q: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[K](),
			workqueue.TypedRateLimitingQueueConfig[K]{Name: cfg.Name}),
	}
}

// Add queues key; a key already queued is queued once.
func (q *Queue[K]) Add(key K) { q.q.Add(key) }

// AddAfter queues key once d has passed, to look at it again later.
func (q *Queue[K]) AddAfter(key K, d time.Duration) { q.q.AddAfter(key, d) }

// ShutDown stops the queue without Run, for a caller that returns before
// it reaches Run. It may be called more than once.
func (q *Queue[K]) ShutDown() { q.q.ShutDown() }

// Run reconciles keys with workers workers (at least one) until ctx ends,
// then shuts the queue down and returns once every worker has returned.
func (q *Queue[K]) Run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() { q.work(ctx) })
	}
	<-ctx.Done()
	q.q.ShutDown()
	wg.Wait()
}

// work is one worker's loop.
func (q *Queue[K]) work(ctx context.Context) {
	for q.processNext(ctx) {
	}
}

// processNext reconciles the next key, and reports whether to go on.
func (q *Queue[K]) processNext(ctx context.Context) bool {
	key, shutdown := q.q.Get()
	if shutdown {
		return false
	}
	defer q.q.Done(key)
	if ctx.Err() != nil {
		return false // stopping: what is left is dropped
	}
	err := q.reconcile(ctx, key)
	if err == nil {
		q.q.Forget(key)
		return true
	}
	log := q.cfg.Logger
	attrs := []any{"queue", q.cfg.Name, q.cfg.KeyAttr, key, "error", err, "retries", q.q.NumRequeues(key)}
	switch {
	case ctx.Err() != nil:
	case Conflict(err):
		log.Debug("reconcile conflict; retrying", attrs...)
	default:
		log.Warn("reconcile failed; retrying", attrs...)
	}
	q.q.AddRateLimited(key)
	return true
}

// Conflict reports whether err says that the cache a reconcile read was
// behind the API server: an update of an older version (409 Conflict), or
// the create of an object made meanwhile (409 AlreadyExists). A retry reads
// the newer version and recomputes.
func Conflict(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
}
