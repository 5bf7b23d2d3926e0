package authpolicy

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1alpha1 "istio.io/api/meta/v1alpha1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	securityclient "istio.io/client-go/pkg/clientset/versioned/typed/security/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/internal/kubequeue"
)

// StatusWriter writes the control plane's conditions onto policies,
// ZtunnelAccepted and WaypointAccepted, leaving every other condition
// alone. SetCondition is cheap and may be called from any goroutine; the
// writes happen in Run, retried with backoff, and skipped when the policy
// already shows the conditions.
type StatusWriter struct {
	client securityclient.AuthorizationPoliciesGetter
	store  cache.Indexer
	queue  *kubequeue.Queue[string]
	writes *prometheus.CounterVec

	mu      sync.Mutex
	pending map[string]map[string]desired // guarded by mu; by "<ns>/<name>", then condition type
}

type desired struct {
	generation int64
	cond       *Condition // nil removes the condition
}

// NewStatusWriter returns a writer that reads policies from store (the
// policy informer's) and writes through client. It starts nothing.
func NewStatusWriter(client securityclient.AuthorizationPoliciesGetter, store cache.Indexer, log *slog.Logger, reg prometheus.Registerer) (*StatusWriter, error) {
	w := &StatusWriter{
		client: client, store: store, pending: map[string]map[string]desired{},
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_policy_status_writes_total",
			Help: "AuthorizationPolicy status writes, by result.",
		}, []string{"result"}),
	}
	if reg != nil {
		if err := reg.Register(w.writes); err != nil {
			return nil, fmt.Errorf("creating policy status writer: registering metrics: %w", err)
		}
	}
	w.queue = kubequeue.New(kubequeue.Config{Name: "policy-status", KeyAttr: "policy", Logger: log}, w.reconcile)
	return w, nil
}

// SetCondition records the condition of type typ (ConditionType or
// WaypointConditionType) a policy should show; nil removes it.
func (w *StatusWriter) SetCondition(namespace, name string, generation int64, typ string, c *Condition) {
	key := namespace + "/" + name
	w.mu.Lock()
	if w.pending[key] == nil {
		w.pending[key] = map[string]desired{}
	}
	w.pending[key][typ] = desired{generation: generation, cond: c}
	w.mu.Unlock()
	w.queue.Add(key)
}

// Run writes until ctx is done.
func (w *StatusWriter) Run(ctx context.Context) error {
	w.queue.Run(ctx, 1)
	return nil
}

// reconcile writes one policy's status; the queue retries an error.
func (w *StatusWriter) reconcile(ctx context.Context, key string) error {
	err := w.sync(ctx, key)
	if err != nil && !kubequeue.Conflict(err) {
		w.writes.WithLabelValues("error").Inc()
	}
	return err
}

func (w *StatusWriter) sync(ctx context.Context, key string) error {
	w.mu.Lock()
	ds := maps.Clone(w.pending[key])
	w.mu.Unlock()
	if len(ds) == 0 {
		return nil
	}
	obj, exists, err := w.store.GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		w.forget(key, ds)
		return nil
	}
	p := obj.(*securityv1.AuthorizationPolicy)
	status, changed := &p.Status, false
	for _, typ := range slices.Sorted(maps.Keys(ds)) {
		var c bool
		status, c = withCondition(status, typ, ds[typ], time.Now())
		changed = changed || c
	}
	if !changed {
		w.forget(key, ds)
		return nil
	}
	p = p.DeepCopy()
	proto.Reset(&p.Status)
	proto.Merge(&p.Status, status)
	_, err = w.client.AuthorizationPolicies(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		w.forget(key, ds)
		return nil
	}
	if err != nil {
		return fmt.Errorf("updating status of AuthorizationPolicy %s: %w", key, err)
	}
	w.writes.WithLabelValues("ok").Inc()
	w.forget(key, ds)
	return nil
}

// forget drops the pending conditions that are still those of ds.
func (w *StatusWriter) forget(key string, ds map[string]desired) {
	w.mu.Lock()
	defer w.mu.Unlock()
	cur := w.pending[key]
	for typ, d := range ds {
		if c, ok := cur[typ]; ok && c.generation == d.generation && condEq(c.cond, d.cond) {
			delete(cur, typ)
		}
	}
	if len(cur) == 0 {
		delete(w.pending, key)
	}
}

func condEq(a, b *Condition) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// withCondition returns the status with the condition of type typ set
// (or removed), and whether anything changed.
func withCondition(cur *metav1alpha1.IstioStatus, typ string, d desired, now time.Time) (*metav1alpha1.IstioStatus, bool) {
	out := proto.Clone(cur).(*metav1alpha1.IstioStatus)
	var kept []*metav1alpha1.IstioCondition
	var old *metav1alpha1.IstioCondition
	for _, c := range out.GetConditions() {
		if c.GetType() == typ {
			old = c
			continue
		}
		kept = append(kept, c)
	}
	if d.cond == nil {
		out.Conditions = kept
		return out, old != nil
	}
	st := "False"
	if d.cond.Status {
		st = "True"
	}
	next := &metav1alpha1.IstioCondition{
		Type: typ, Status: st, Reason: d.cond.Reason, Message: d.cond.Message,
		ObservedGeneration: d.generation, LastTransitionTime: timestamppb.New(now),
	}
	if old != nil && old.GetStatus() == st {
		next.LastTransitionTime = old.GetLastTransitionTime()
	}
	if old != nil && old.GetStatus() == st && old.GetReason() == next.Reason && old.GetMessage() == next.Message &&
		old.GetObservedGeneration() == next.ObservedGeneration {
		return cur, false
	}
	out.Conditions = append(kept, next)
	return out, true
}
