package ambient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1alpha1 "istio.io/api/meta/v1alpha1"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	networkingclient "istio.io/client-go/pkg/clientset/versioned/typed/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/weftmesh/weft/internal/kubequeue"
)

// EntryStatusWriter writes what a ServiceEntry's status shows: the
// addresses allocated to its hosts (status.addresses) and its
// istio.io/WaypointBound condition. It updates the status subresource
// from the informer's copy, keeping every other condition, and retries a
// conflict with the newer copy. SetEntryStatus is cheap and may be called
// from any goroutine; the writes happen in Run, only when the entry does
// not show the status already.
type EntryStatusWriter struct {
	client  networkingclient.ServiceEntriesGetter
	store   cache.Indexer
	queue   *kubequeue.Queue[string]
	pending *kubequeue.Pending[EntryStatus] // by "<ns>/<name>"
	writes  *prometheus.CounterVec
	now     func() time.Time
}

// NewEntryStatusWriter returns a writer that reads ServiceEntries from
// store (the informer's) and writes through client. It starts nothing.
func NewEntryStatusWriter(client networkingclient.ServiceEntriesGetter, store cache.Indexer, log *slog.Logger, reg prometheus.Registerer) (*EntryStatusWriter, error) {
	if client == nil || store == nil {
		return nil, errors.New("creating ServiceEntry status writer: the client and the ServiceEntry store are required")
	}
	w := &EntryStatusWriter{
		client: client, store: store, now: time.Now,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_serviceentry_status_writes_total",
			Help: "ServiceEntry status writes (allocated addresses and the istio.io/WaypointBound condition), by result.",
		}, []string{"result"}),
	}
	if reg != nil {
		if err := reg.Register(w.writes); err != nil {
			return nil, fmt.Errorf("creating ServiceEntry status writer: registering metrics: %w", err)
		}
	}
	w.queue = kubequeue.New(kubequeue.Config{Name: "serviceentry-status", KeyAttr: "serviceentry", Logger: log}, w.sync)
	w.pending = kubequeue.NewPending(w.queue, entryStatusEqual)
	return w, nil
}

// SetEntryStatus records what an entry's status should show.
func (w *EntryStatusWriter) SetEntryStatus(s EntryStatus) { w.pending.Set(s.Namespace+"/"+s.Name, s) }

// Run writes until ctx is done.
func (w *EntryStatusWriter) Run(ctx context.Context) error {
	w.queue.Run(ctx, 1)
	return nil
}

// sync writes one entry's status if it differs; the queue retries an
// error.
func (w *EntryStatusWriter) sync(ctx context.Context, key string) error {
	want, ok := w.pending.Get(key)
	if !ok {
		return nil
	}
	obj, exists, err := w.store.GetByKey(key)
	if err != nil {
		return err
	}
	se, _ := obj.(*networkingv1.ServiceEntry)
	if !exists || se == nil || EntryShows(se, want) {
		w.pending.Done(key, want)
		return nil
	}
	next := se.DeepCopy()
	setEntryStatus(&next.Status, want, w.now())
	_, err = w.client.ServiceEntries(se.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case kubequeue.Conflict(err):
		return err
	case err != nil:
		w.writes.WithLabelValues("error").Inc()
		return fmt.Errorf("writing the status of ServiceEntry %s: %w", key, err)
	default:
		w.writes.WithLabelValues("ok").Inc()
	}
	w.pending.Done(key, want)
	return nil
}

func entryStatusEqual(a, b EntryStatus) bool {
	if len(a.Addresses) != len(b.Addresses) || !bindingEqual(a.Binding, b.Binding) {
		return false
	}
	for h, ip := range a.Addresses {
		if b.Addresses[h] != ip {
			return false
		}
	}
	return true
}

// setEntryStatus gives st the addresses (sorted by host) and condition of
// want. The condition keeps its lastTransitionTime while its status is
// unchanged; other conditions are kept.
func setEntryStatus(st *networkingv1alpha3.ServiceEntryStatus, want EntryStatus, now time.Time) {
	st.Addresses = nil
	hosts := make([]string, 0, len(want.Addresses))
	for h := range want.Addresses {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		st.Addresses = append(st.Addresses, &networkingv1alpha3.ServiceEntryAddress{Value: want.Addresses[h].String(), Host: h})
	}
	var kept []*metav1alpha1.IstioCondition
	var cur *metav1alpha1.IstioCondition
	for _, c := range st.Conditions {
		if c.GetType() == ConditionWaypointBound {
			cur = c
			continue
		}
		kept = append(kept, c)
	}
	if want.Binding != nil {
		status := string(conditionStatus(want.Binding))
		since := timestamppb.New(now)
		if cur != nil && cur.GetStatus() == status && cur.GetLastTransitionTime() != nil {
			since = cur.GetLastTransitionTime()
		}
		kept = append(kept, &metav1alpha1.IstioCondition{Type: ConditionWaypointBound, Status: status,
			Reason: want.Binding.Reason, Message: want.Binding.Message, LastTransitionTime: since})
	}
	st.Conditions = kept
}
