package kubequeue

import (
	"context"
	"testing"
)

// TestPending: the reconcile reads the latest value; Done of a value that
// a newer Set replaced keeps the newer one.
func TestPending(t *testing.T) {
	q := New(Config{Name: "test"}, func(context.Context, string) error { return nil })
	p := NewPending(q, func(a, b int) bool { return a == b })
	p.Set("a", 1)
	p.Set("a", 2)
	if v, ok := p.Get("a"); !ok || v != 2 {
		t.Fatalf("Get = %d, %v; want the latest, 2", v, ok)
	}
	p.Done("a", 1) // a write of a value already replaced
	if v, ok := p.Get("a"); !ok || v != 2 {
		t.Fatalf("after Done of the replaced value: %d, %v; want 2 kept", v, ok)
	}
	p.Done("a", 2)
	if _, ok := p.Get("a"); ok || p.Len() != 0 {
		t.Fatal("after Done of the latest value: still pending")
	}
	if q.q.Len() != 1 {
		t.Errorf("%d keys queued, want a once", q.q.Len())
	}
	q.ShutDown()
}
