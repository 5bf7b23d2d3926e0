package agent

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// TestPodForEventWaitsForArrival: a CNI event for a pod the cache does
// not hold yet is answered from the cache once the pod arrives there (the
// API, which has no such pod here, is not asked), a pod bound to another
// node is never taken, and a waiter gives up with its context.
func TestPodForEventWaitsForArrival(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	c := &controller{cfg: &Config{NodeName: "n1"}, pods: corelisters.NewPodLister(idx), kube: fake.NewClientset()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	type result struct {
		pod *corev1.Pod
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := c.podForEvent(ctx, "shop", "cart")
		done <- result{p, err}
	}()
	// Elsewhere first, then here: only the pod bound to this node counts.
	for _, node := range []string{"n2", "n1"} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart", ResourceVersion: node}, Spec: corev1.PodSpec{NodeName: node}}
		if err := idx.Update(pod); err != nil {
			t.Fatal(err)
		}
		c.arrived("shop/cart")
		if node == "n2" {
			select {
			case r := <-done:
				t.Fatalf("took the pod while it was bound to n2: %v %v", r.pod, r.err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	r := <-done
	if r.err != nil || r.pod.Spec.NodeName != "n1" {
		t.Fatalf("podForEvent = %v, %v; want the pod on n1 from the cache", r.pod, r.err)
	}
	if len(c.arrivals) != 0 {
		t.Errorf("%d waiters left behind", len(c.arrivals))
	}

	gone, stop := context.WithCancel(ctx)
	stop()
	if _, err := c.podForEvent(gone, "shop", "ghost"); err == nil {
		t.Error("a cancelled wait for a pod that never arrives succeeded")
	}
	if len(c.arrivals) != 0 {
		t.Errorf("%d waiters left behind after a cancelled wait", len(c.arrivals))
	}
}
