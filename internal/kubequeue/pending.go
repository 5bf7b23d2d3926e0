package kubequeue

import "sync"

// Pending holds, for a status writer's queue, the latest value wanted for
// each key: Set records it and queues the key, Get reads it for the
// reconcile, and Done drops it once written, unless a newer value came
// meanwhile (which its queued key then writes). It is safe for concurrent
// use.
type Pending[V any] struct {
	queue *Queue[string]
	equal func(a, b V) bool

	mu sync.Mutex
	m  map[string]V // guarded by mu
}

// NewPending returns a Pending whose Set queues keys on q; equal tells two
// values apart.
func NewPending[V any](q *Queue[string], equal func(a, b V) bool) *Pending[V] {
	return &Pending[V]{queue: q, equal: equal, m: map[string]V{}}
}

// Set records v as the value wanted for key and queues the key.
func (p *Pending[V]) Set(key string, v V) {
	p.mu.Lock()
	p.m[key] = v
	p.mu.Unlock()
	p.queue.Add(key)
}

// Get returns the value wanted for key, and whether there is one.
func (p *Pending[V]) Get(key string) (V, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.m[key]
	return v, ok
}

// Done drops the value of key if it is still v.
func (p *Pending[V]) Done(key string, v V) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.m[key]; ok && p.equal(cur, v) {
		delete(p.m, key)
	}
}

// Len is the number of keys with a value wanted.
func (p *Pending[V]) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}
