package deployer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/controlplane/ambient"
)

// FieldManager is the server-side apply manager of the deployed objects.
const FieldManager = "weft-waypoint-deployer"

// Deployer reconciles waypoint Gateways.
type Deployer struct {
	cfg      Config
	kube     kubernetes.Interface
	gw       gwclient.Interface
	gateways cache.SharedIndexInformer
	classes  cache.SharedIndexInformer
	log      *slog.Logger
	queue    workqueue.TypedRateLimitingInterface[string]

	owned   informers.SharedInformerFactory // Deployments and Services with the gateway label
	params  informers.SharedInformerFactory // ConfigMaps
	results *prometheus.CounterVec
}

// New returns a Deployer. gateways and classes are the Gateway and
// GatewayClass informers, which the caller starts. log and reg may be nil.
func New(cfg Config, kube kubernetes.Interface, gw gwclient.Interface, gateways, classes cache.SharedIndexInformer, log *slog.Logger, reg prometheus.Registerer) (*Deployer, error) {
	if err := cfg.defaults(); err != nil {
		return nil, fmt.Errorf("creating the waypoint deployer: %w", err)
	}
	if kube == nil || gw == nil || gateways == nil || classes == nil {
		return nil, errors.New("creating the waypoint deployer: a client or informer is missing")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Deployer{
		cfg: cfg, kube: kube, gw: gw, gateways: gateways, classes: classes, log: log,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "waypoints"}),
		owned: informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = ambient.LabelGatewayName
		})),
		params: informers.NewSharedInformerFactory(kube, 0),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_waypoint_reconciles_total", Help: "Waypoint Gateway reconciliations, by result.",
		}, []string{"result"}),
	}
	if reg != nil {
		if err := reg.Register(d.results); err != nil {
			return nil, fmt.Errorf("creating the waypoint deployer: registering metrics: %w", err)
		}
	}
	return d, nil
}

const classKey = "\x00class" // queue key of the GatewayClass status

// Run reconciles until ctx ends.
func (d *Deployer) Run(ctx context.Context) error {
	defer d.queue.ShutDown()
	enqueue := func(obj any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			d.queue.Add(k)
		}
	}
	byOwner := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if m, err := meta.Accessor(obj); err == nil {
			if name := m.GetLabels()[ambient.LabelGatewayName]; name != "" {
				d.queue.Add(m.GetNamespace() + "/" + name)
			}
		}
	}
	byParams := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		for _, o := range d.gateways.GetIndexer().List() {
			gw := o.(*gwv1.Gateway)
			if gw.Namespace == cm.Namespace && paramsName(gw) == cm.Name {
				d.queue.Add(cm.Namespace + "/" + gw.Name)
			}
		}
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		f   func(any)
	}{
		{d.gateways, enqueue},
		{d.classes, func(any) { d.queue.Add(classKey) }},
		{d.owned.Apps().V1().Deployments().Informer(), byOwner},
		{d.owned.Core().V1().Services().Informer(), byOwner},
		{d.owned.Core().V1().ServiceAccounts().Informer(), byOwner},
		{d.params.Core().V1().ConfigMaps().Informer(), byParams},
	}
	var synced []cache.InformerSynced
	for _, h := range handlers {
		f := h.f
		r, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: f, UpdateFunc: func(_, n any) { f(n) }, DeleteFunc: f,
		})
		if err != nil {
			return fmt.Errorf("waypoint deployer: %w", err)
		}
		defer func(inf cache.SharedIndexInformer) { _ = inf.RemoveEventHandler(r) }(h.inf)
		synced = append(synced, r.HasSynced)
	}
	d.owned.Start(ctx.Done())
	d.params.Start(ctx.Done())
	defer d.owned.Shutdown()
	defer d.params.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil
	}
	d.log.Info("waypoint deployer started", "image", d.cfg.Image)
	done := make(chan struct{})
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			wait.UntilWithContext(ctx, func(ctx context.Context) {
				for d.next(ctx) {
				}
			}, time.Second)
		}()
	}
	<-ctx.Done()
	d.queue.ShutDown()
	<-done
	<-done
	return nil
}

func (d *Deployer) next(ctx context.Context) bool {
	key, quit := d.queue.Get()
	if quit {
		return false
	}
	defer d.queue.Done(key)
	var err error
	if key == classKey {
		err = d.reconcileClasses(ctx)
	} else {
		err = d.reconcile(ctx, key)
	}
	if err != nil {
		d.results.WithLabelValues("error").Inc()
		d.log.Warn("waypoint reconcile failed; retrying", "gateway", key, "error", err)
		d.queue.AddRateLimited(key)
		return true
	}
	d.results.WithLabelValues("ok").Inc()
	d.queue.Forget(key)
	return true
}

func paramsName(gw *gwv1.Gateway) string {
	if inf := gw.Spec.Infrastructure; inf != nil && inf.ParametersRef != nil {
		return inf.ParametersRef.Name
	}
	return ""
}

// reconcile applies a Gateway's objects and writes its status.
func (d *Deployer) reconcile(ctx context.Context, key string) error {
	obj, ok, err := d.gateways.GetIndexer().GetByKey(key)
	if err != nil || !ok {
		return err // deleted: the garbage collector removes what it owned
	}
	gw := obj.(*gwv1.Gateway)
	if string(gw.Spec.GatewayClassName) != ambient.WaypointClass {
		return nil
	}
	params, perr := d.parameters(gw)
	var objs *Objects
	if perr == nil {
		objs, perr = Build(d.cfg, gw, params)
	}
	var pe *ParamsError
	if perr != nil && !errors.As(perr, &pe) {
		return perr
	}
	if pe != nil {
		d.log.Warn("waypoint parameters refused", "gateway", key, "error", pe.msg)
		return d.writeStatus(ctx, gw, pe.msg, nil)
	}
	for _, o := range []any{objs.ServiceAccount, objs.Deployment, objs.Service} {
		if err := d.apply(ctx, o); err != nil {
			return err
		}
	}
	var svc *corev1.Service
	if o, ok, _ := d.owned.Core().V1().Services().Informer().GetIndexer().GetByKey(key); ok {
		svc = o.(*corev1.Service)
	}
	return d.writeStatus(ctx, gw, "", svc)
}

// parameters reads the ConfigMap a Gateway's parametersRef names.
func (d *Deployer) parameters(gw *gwv1.Gateway) (*corev1.ConfigMap, error) {
	inf := gw.Spec.Infrastructure
	if inf == nil || inf.ParametersRef == nil {
		return nil, nil
	}
	ref := inf.ParametersRef
	if (ref.Group != "" && ref.Group != "core") || ref.Kind != "ConfigMap" {
		return nil, &ParamsError{fmt.Sprintf("parametersRef %s/%s %s: only a ConfigMap is supported", ref.Group, ref.Kind, ref.Name)}
	}
	o, ok, err := d.params.Core().V1().ConfigMaps().Informer().GetIndexer().GetByKey(gw.Namespace + "/" + ref.Name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &ParamsError{fmt.Sprintf("parametersRef ConfigMap %s/%s not found", gw.Namespace, ref.Name)}
	}
	return o.(*corev1.ConfigMap), nil
}

// apply server-side-applies one object.
func (d *Deployer) apply(ctx context.Context, obj any) error {
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: ptr(true)}
	switch o := obj.(type) {
	case *corev1.ServiceAccount:
		_, err = d.kube.CoreV1().ServiceAccounts(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, data, opts)
	case *appsv1.Deployment:
		_, err = d.kube.AppsV1().Deployments(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, data, opts)
	case *corev1.Service:
		_, err = d.kube.CoreV1().Services(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, data, opts)
	}
	if err != nil {
		return fmt.Errorf("applying %T: %w", obj, err)
	}
	return nil
}

// writeStatus sets the Gateway's conditions, addresses and listeners.
// refused is the parameters problem, if any; svc the deployed Service.
func (d *Deployer) writeStatus(ctx context.Context, gw *gwv1.Gateway, refused string, svc *corev1.Service) error {
	st := gwv1.GatewayStatus{Conditions: slices.Clone(gw.Status.Conditions)}
	gen := gw.Generation
	set := func(conds *[]metav1.Condition, typ string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
	}
	programmed := false
	switch {
	case refused != "":
		set(&st.Conditions, string(gwv1.GatewayConditionAccepted), false, string(gwv1.GatewayReasonInvalidParameters), refused)
		set(&st.Conditions, string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonInvalid), "not deployed: "+refused)
	default:
		set(&st.Conditions, string(gwv1.GatewayConditionAccepted), true, string(gwv1.GatewayReasonAccepted), "waypoint deployed")
		if svc != nil && svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone {
			programmed = true
			host := svc.Name + "." + svc.Namespace + ".svc." + d.cfg.ClusterDomain
			st.Addresses = []gwv1.GatewayStatusAddress{
				{Type: ptr(gwv1.HostnameAddressType), Value: host},
				{Type: ptr(gwv1.IPAddressType), Value: svc.Spec.ClusterIP},
			}
			set(&st.Conditions, string(gwv1.GatewayConditionProgrammed), true, string(gwv1.GatewayReasonProgrammed), "the waypoint's Service has an address")
		} else {
			set(&st.Conditions, string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonPending), "waiting for the waypoint's Service address")
		}
	}
	for _, l := range gw.Spec.Listeners {
		ls := gwv1.ListenerStatus{Name: l.Name, SupportedKinds: []gwv1.RouteGroupKind{}}
		for _, old := range gw.Status.Listeners {
			if old.Name == l.Name {
				ls.Conditions = slices.Clone(old.Conditions)
				ls.AttachedRoutes = old.AttachedRoutes
			}
		}
		set(&ls.Conditions, string(gwv1.ListenerConditionAccepted), refused == "", reasonOf(refused == "", string(gwv1.ListenerReasonAccepted), string(gwv1.ListenerReasonPending)), "")
		set(&ls.Conditions, string(gwv1.ListenerConditionProgrammed), programmed, reasonOf(programmed, string(gwv1.ListenerReasonProgrammed), string(gwv1.ListenerReasonPending)), "")
		set(&ls.Conditions, string(gwv1.ListenerConditionResolvedRefs), true, string(gwv1.ListenerReasonResolvedRefs), "")
		st.Listeners = append(st.Listeners, ls)
	}
	if statusEqual(gw.Status, st) {
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := d.gw.GatewayV1().Gateways(gw.Namespace).Get(ctx, gw.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		cur = cur.DeepCopy()
		cur.Status = st
		_, err = d.gw.GatewayV1().Gateways(gw.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

func reasonOf(ok bool, yes, no string) string {
	if ok {
		return yes
	}
	return no
}

// statusEqual compares statuses ignoring transition times (SetStatusCondition
// keeps those of unchanged conditions).
func statusEqual(a, b gwv1.GatewayStatus) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// reconcileClasses accepts the GatewayClasses of our controller.
func (d *Deployer) reconcileClasses(ctx context.Context) error {
	for _, o := range d.classes.GetIndexer().List() {
		gc := o.(*gwv1.GatewayClass)
		if string(gc.Spec.ControllerName) != d.cfg.ControllerName {
			continue
		}
		conds := slices.Clone(gc.Status.Conditions)
		meta.SetStatusCondition(&conds, metav1.Condition{Type: string(gwv1.GatewayClassConditionStatusAccepted), Status: metav1.ConditionTrue,
			Reason: string(gwv1.GatewayClassReasonAccepted), Message: "handled by the Weft waypoint deployer", ObservedGeneration: gc.Generation})
		if a, _ := json.Marshal(conds); string(a) == mustJSON(gc.Status.Conditions) {
			continue
		}
		cur := gc.DeepCopy()
		cur.Status.Conditions = conds
		if _, err := d.gw.GatewayV1().GatewayClasses().UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("GatewayClass %s status: %w", gc.Name, err)
		}
	}
	return nil
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
