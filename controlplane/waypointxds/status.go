package waypointxds

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwtyped "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned/typed/apis/v1"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/kubequeue"
)

// StatusWriter writes the routes' outcomes into their status.parents: one
// entry per parentRef the outcome covers, with the controller's name (the
// waypoint controller's, or apinames.GatewayController for an ingress
// Gateway parent), the parentRef as the spec spells it, and the conditions
// Accepted and ResolvedRefs. Entries of other controllers are left as they
// are, and the entries of either name for parentRefs it no longer answers
// for are removed.
// A condition keeps its lastTransitionTime while its status is unchanged.
//
// SetRoutes is cheap and may be called from any goroutine; the writes
// happen in Run, through the status subresource after a read of the
// route's latest version from the informer's cache (an update of an older
// version fails with a conflict and is retried), only when the status
// changes, and never with an outcome older than the route's generation.
type StatusWriter struct {
	controller           gwv1.GatewayController
	client               gwtyped.GatewayV1Interface
	http, grpc, tcp, tls cache.Indexer
	queue                *kubequeue.Queue[RouteKey]
	writes               *prometheus.CounterVec
	now                  func() time.Time

	mu   sync.Mutex
	want map[RouteKey]RouteOutcome // guarded by mu
}

// NewStatusWriter returns a writer that reads routes from the HTTPRoute,
// GRPCRoute, TCPRoute and TLSRoute informers' stores (grpc, tcp and tls may
// be nil) and writes as controller, the waypoint GatewayClass's
// controllerName. It starts nothing.
func NewStatusWriter(controller string, client gwtyped.GatewayV1Interface, http, grpc, tcp, tls cache.Indexer, log *slog.Logger,
	reg prometheus.Registerer) (*StatusWriter, error) {
	if controller == "" || client == nil || http == nil {
		return nil, fmt.Errorf("creating route status writer: the controller name, the client and the HTTPRoute store are required")
	}
	w := &StatusWriter{
		controller: gwv1.GatewayController(controller), client: client, http: http, grpc: grpc, tcp: tcp, tls: tls, now: time.Now,
		want: map[RouteKey]RouteOutcome{},
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_route_status_writes_total",
			Help: "HTTPRoute, GRPCRoute, TCPRoute and TLSRoute status writes, by result.",
		}, []string{"result"}),
	}
	if reg != nil {
		if err := reg.Register(w.writes); err != nil {
			return nil, fmt.Errorf("creating route status writer: registering metrics: %w", err)
		}
	}
	w.queue = kubequeue.New(kubequeue.Config{Name: "route-status", KeyAttr: "route", Logger: log}, w.sync)
	return w, nil
}

// SetRoutes records every route's outcome and queues each route for a
// look at its status; routes not listed are forgotten (deleted routes).
func (w *StatusWriter) SetRoutes(outcomes []RouteOutcome) {
	w.mu.Lock()
	next := make(map[RouteKey]RouteOutcome, len(outcomes))
	for _, o := range outcomes {
		next[o.Key] = o
	}
	w.want = next
	w.mu.Unlock()
	// Every route, not only those whose outcome changed: the status may
	// have been changed by someone else. A route whose status is right
	// costs a cache read.
	for _, o := range outcomes {
		w.queue.Add(o.Key)
	}
}

// Run writes until ctx is done.
func (w *StatusWriter) Run(ctx context.Context) error {
	w.queue.Run(ctx, 1)
	return nil
}

// sync writes one route's status if it differs from the outcome; the
// queue retries an error.
func (w *StatusWriter) sync(ctx context.Context, key RouteKey) error {
	w.mu.Lock()
	o, ok := w.want[key]
	w.mu.Unlock()
	if !ok {
		return nil
	}
	store := w.http
	switch key.Kind {
	case kindGRPCRoute:
		store = w.grpc
	case kindTCPRoute:
		store = w.tcp
	case kindTLSRoute:
		store = w.tls
	}
	var err error
	switch r := getAny(store, key.Namespace+"/"+key.Name).(type) {
	case *gwv1.HTTPRoute:
		err = w.write(r.Generation, r.Status.Parents, o, func(ps []gwv1.RouteParentStatus) error {
			r = r.DeepCopy()
			r.Status.Parents = ps
			_, err := w.client.HTTPRoutes(r.Namespace).UpdateStatus(ctx, r, metav1.UpdateOptions{})
			return err
		})
	case *gwv1.GRPCRoute:
		err = w.write(r.Generation, r.Status.Parents, o, func(ps []gwv1.RouteParentStatus) error {
			r = r.DeepCopy()
			r.Status.Parents = ps
			_, err := w.client.GRPCRoutes(r.Namespace).UpdateStatus(ctx, r, metav1.UpdateOptions{})
			return err
		})
	case *gwv1.TCPRoute:
		err = w.write(r.Generation, r.Status.Parents, o, func(ps []gwv1.RouteParentStatus) error {
			r = r.DeepCopy()
			r.Status.Parents = ps
			_, err := w.client.TCPRoutes(r.Namespace).UpdateStatus(ctx, r, metav1.UpdateOptions{})
			return err
		})
	case *gwv1.TLSRoute:
		err = w.write(r.Generation, r.Status.Parents, o, func(ps []gwv1.RouteParentStatus) error {
			r = r.DeepCopy()
			r.Status.Parents = ps
			_, err := w.client.TLSRoutes(r.Namespace).UpdateStatus(ctx, r, metav1.UpdateOptions{})
			return err
		})
	default:
		return nil // deleted, or not in the cache yet: a later rebuild queues it again
	}
	if err != nil {
		return fmt.Errorf("updating status of %s: %w", key, err)
	}
	return nil
}

// write updates a route's status.parents through update when the outcome
// changes them, and counts the result.
func (w *StatusWriter) write(gen int64, cur []gwv1.RouteParentStatus, o RouteOutcome, update func([]gwv1.RouteParentStatus) error) error {
	parents, changed := w.parents(gen, cur, o)
	if !changed {
		return nil
	}
	err := update(parents)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case kubequeue.Conflict(err):
		return err // the cache was behind: the retry reads the newer version
	case err != nil:
		w.writes.WithLabelValues("error").Inc()
		return err
	}
	w.writes.WithLabelValues("ok").Inc()
	return nil
}

func getAny(s cache.Indexer, key string) any {
	if s == nil {
		return nil
	}
	obj, ok, err := s.GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	return obj
}

// parents computes a route's status.parents from the current one and the
// outcome, and reports whether it differs. An outcome of another
// generation than the route's is stale (a rebuild for the route's
// generation is on its way) and changes nothing.
func (w *StatusWriter) parents(gen int64, cur []gwv1.RouteParentStatus, o RouteOutcome) ([]gwv1.RouteParentStatus, bool) {
	if o.Generation != gen {
		return cur, false
	}
	var out []gwv1.RouteParentStatus
	for _, p := range cur {
		if p.ControllerName != w.controller && p.ControllerName != apinames.GatewayController {
			out = append(out, p)
		}
	}
	now := metav1.NewTime(w.now())
	for _, po := range o.Parents {
		controller := po.Controller
		if controller == "" {
			controller = w.controller
		}
		var conds []metav1.Condition
		for _, p := range cur {
			if p.ControllerName == controller && equality.Semantic.DeepEqual(p.ParentRef, po.Ref) {
				conds = append(conds, p.Conditions...)
				break
			}
		}
		for _, c := range po.Conditions {
			c.LastTransitionTime = now
			meta.SetStatusCondition(&conds, c)
		}
		out = append(out, gwv1.RouteParentStatus{ParentRef: po.Ref, ControllerName: controller, Conditions: conds})
	}
	return out, !equality.Semantic.DeepEqual(out, cur)
}
