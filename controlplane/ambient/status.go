package ambient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/internal/kubequeue"
)

// ServiceStatusManager is the server-side apply field manager of the
// istio.io/WaypointBound condition on Services.
const ServiceStatusManager = "weft-controlplane"

// ServiceStatusWriter writes the istio.io/WaypointBound condition onto
// Services. It sets it with a server-side apply of the status subresource
// that holds this one condition, so the API server keeps every other
// condition, whoever wrote it; it removes it with a JSON patch that tests
// the entry's type before removing it, so that a condition another manager
// wrote (istiod's, before Weft took over) goes too. SetServiceCondition is
// cheap and may be called from any goroutine; the writes happen in Run,
// retried with backoff, and only when the Service (read from the informer's
// cache) does not show the condition already. The condition keeps its
// lastTransitionTime while its status is unchanged.
type ServiceStatusWriter struct {
	client  typedcorev1.ServicesGetter
	store   cache.Indexer
	queue   *kubequeue.Queue[string]
	pending *kubequeue.Pending[*BindingStatus] // by "<ns>/<name>"; nil removes
	writes  *prometheus.CounterVec
	now     func() time.Time
}

// NewServiceStatusWriter returns a writer that reads Services from store
// (the Service informer's) and writes through client. It starts nothing.
func NewServiceStatusWriter(client typedcorev1.ServicesGetter, store cache.Indexer, log *slog.Logger, reg prometheus.Registerer) (*ServiceStatusWriter, error) {
	if client == nil || store == nil {
		return nil, errors.New("creating service status writer: the client and the Service store are required")
	}
	w := &ServiceStatusWriter{
		client: client, store: store, now: time.Now,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_service_status_writes_total",
			Help: "Service status writes (the istio.io/WaypointBound condition), by result.",
		}, []string{"result"}),
	}
	if reg != nil {
		if err := reg.Register(w.writes); err != nil {
			return nil, fmt.Errorf("creating service status writer: registering metrics: %w", err)
		}
	}
	w.queue = kubequeue.New(kubequeue.Config{Name: "service-status", KeyAttr: "service", Logger: log}, w.sync)
	w.pending = kubequeue.NewPending(w.queue, bindingEqual)
	return w, nil
}

// SetServiceCondition records the condition a Service should show (nil:
// none).
func (w *ServiceStatusWriter) SetServiceCondition(namespace, name string, c *BindingStatus) {
	w.pending.Set(namespace+"/"+name, c)
}

// Run writes until ctx is done.
func (w *ServiceStatusWriter) Run(ctx context.Context) error {
	w.queue.Run(ctx, 1)
	return nil
}

// sync writes one Service's condition if it differs; the queue retries an
// error.
func (w *ServiceStatusWriter) sync(ctx context.Context, key string) error {
	want, ok := w.pending.Get(key)
	if !ok {
		return nil
	}
	obj, exists, err := w.store.GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		w.pending.Done(key, want)
		return nil
	}
	write := w.write(obj.(*corev1.Service), want)
	if write == nil {
		w.pending.Done(key, want)
		return nil
	}
	err = write(ctx)
	switch {
	case apierrors.IsNotFound(err):
	case kubequeue.Conflict(err):
		return err
	case err != nil:
		w.writes.WithLabelValues("error").Inc()
		return fmt.Errorf("writing the status of Service %s: %w", key, err)
	default:
		w.writes.WithLabelValues("ok").Inc()
	}
	w.pending.Done(key, want)
	return nil
}

// write returns the write that gives svc the condition want (nil: none),
// or nil when svc shows it already.
func (w *ServiceStatusWriter) write(svc *corev1.Service, want *BindingStatus) func(context.Context) error {
	services := w.client.Services(svc.Namespace)
	if want == nil {
		patch := removePatch(svc)
		if patch == nil {
			return nil
		}
		return func(ctx context.Context) error {
			_, err := services.Patch(ctx, svc.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: ServiceStatusManager}, "status")
			if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
				// The test failed: the cache was behind the list's order.
				return apierrors.NewConflict(corev1.Resource("services"), svc.Name, err)
			}
			return err
		}
	}
	ac, changed := serviceApply(svc, want, w.now())
	if !changed {
		return nil
	}
	return func(ctx context.Context) error {
		_, err := services.ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: ServiceStatusManager, Force: true})
		return err
	}
}

// removePatch is the JSON patch that removes the condition from svc, or nil
// when it has none. It tests the entry's type first: should the list have
// changed since svc was read, the patch fails rather than remove another
// condition.
func removePatch(svc *corev1.Service) []byte {
	for i, c := range svc.Status.Conditions {
		if c.Type == ConditionWaypointBound {
			path := fmt.Sprintf("/status/conditions/%d", i)
			b, _ := json.Marshal([]map[string]string{
				{"op": "test", "path": path + "/type", "value": ConditionWaypointBound},
				{"op": "remove", "path": path},
			})
			return b
		}
	}
	return nil
}

// serviceApply returns the apply configuration that gives svc the condition
// want, and whether svc needs it. Forcing is safe: the configuration names
// only this condition, so only its ownership moves.
func serviceApply(svc *corev1.Service, want *BindingStatus, now time.Time) (*corev1ac.ServiceApplyConfiguration, bool) {
	cur := meta.FindStatusCondition(svc.Status.Conditions, ConditionWaypointBound)
	st := corev1ac.ServiceStatus()
	ac := corev1ac.Service(svc.Name, svc.Namespace).WithStatus(st)
	if shows(svc, want) {
		return ac, false
	}
	status := conditionStatus(want)
	since := metav1.NewTime(now)
	if cur != nil && cur.Status == status {
		since = cur.LastTransitionTime
	}
	st.WithConditions(metav1ac.Condition().WithType(ConditionWaypointBound).WithStatus(status).
		WithReason(want.Reason).WithMessage(want.Message).WithLastTransitionTime(since))
	return ac, true
}

// shows reports whether svc shows the condition c (nil: none).
func shows(svc *corev1.Service, c *BindingStatus) bool {
	cur := meta.FindStatusCondition(svc.Status.Conditions, ConditionWaypointBound)
	if c == nil || cur == nil {
		return c == nil && cur == nil
	}
	return cur.Status == conditionStatus(c) && cur.Reason == c.Reason && cur.Message == c.Message
}

func conditionStatus(c *BindingStatus) metav1.ConditionStatus {
	if c.Bound {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}
