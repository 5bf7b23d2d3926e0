package deployer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"istio.io/api/label"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/weftmesh/weft/internal/apinames"
	"github.com/weftmesh/weft/internal/kubequeue"
)

// FieldManager is the server-side apply manager of the deployed objects.
const FieldManager = "weft-waypoint-deployer"

// Deployer reconciles waypoint and ingress Gateways.
type Deployer struct {
	cfg      Config
	kube     kubernetes.Interface
	gw       gwclient.Interface
	gateways cache.SharedIndexInformer
	classes  cache.SharedIndexInformer
	log      *slog.Logger

	owned   informers.SharedInformerFactory // the waypoints' kinds of object, with the gateway-name label
	ops     map[string]*kindOps             // by parameters key
	params  informers.SharedInformerFactory // ConfigMaps, for parametersRef
	results *prometheus.CounterVec

	mu sync.Mutex
	// listeners are the ingress Gateways' listener statuses as the
	// configuration controller last computed them, by "<namespace>/<name>"
	// (SetGatewayListeners).
	listeners map[string][]gwv1.ListenerStatus
	queue     *kubequeue.Queue[string] // nil unless Run is running
}

// Results of a reconcile: the result label of weft_waypoint_reconciles_total.
const (
	resultOK       = "ok"       // deployed and status written (or the classes' status)
	resultRefused  = "refused"  // not Accepted: invalid parameters or name
	resultConflict = "conflict" // a status write lost a race; retried
	resultError    = "error"    // failed; retried with backoff
)

// New returns a Deployer. gateways and classes are the Gateway and
// GatewayClass informers, which the caller starts. log and reg may be nil.
// It starts nothing; Run does.
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
		// Existence selector: only objects that carry the label.
		owned: informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(stripManagedFields),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = label.IoK8sNetworkingGatewayGatewayName.Name })),
		params: informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTransform(stripManagedFields)),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_waypoint_reconciles_total", Help: "Waypoint and ingress Gateway reconciliations, by result (ok, refused, conflict, error).",
		}, []string{"result"}),
	}
	d.ops = d.kinds()
	if reg != nil {
		if err := reg.Register(d.results); err != nil {
			return nil, fmt.Errorf("creating the waypoint deployer: registering metrics: %w", err)
		}
	}
	return d, nil
}

// stripManagedFields drops what the deployer never reads from its caches.
func stripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

const classKey = "\x00class" // queue key of the GatewayClass status

// Run reconciles until ctx ends, and returns after its workers and
// informers have stopped.
func (d *Deployer) Run(ctx context.Context) error {
	var queue *kubequeue.Queue[string]
	queue = kubequeue.New(kubequeue.Config{Name: "waypoints", KeyAttr: "gateway", Logger: d.log},
		func(ctx context.Context, key string) error { return d.sync(ctx, queue, key) })
	defer queue.ShutDown()
	d.mu.Lock()
	d.queue = queue
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.queue = nil
		d.mu.Unlock()
	}()
	enqueue := func(obj any) {
		if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(k)
		}
	}
	byOwner := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if m, err := meta.Accessor(obj); err == nil {
			if name := m.GetLabels()[label.IoK8sNetworkingGatewayGatewayName.Name]; name != "" {
				queue.Add(m.GetNamespace() + "/" + name)
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
				queue.Add(cm.Namespace + "/" + gw.Name)
			}
		}
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		f   func(any)
	}{
		{d.gateways, enqueue},
		{d.classes, func(obj any) {
			queue.Add(classKey)
			// Whether a Gateway is ours may follow its class's controller.
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if gc, ok := obj.(*gwv1.GatewayClass); ok {
				for _, o := range d.gateways.GetIndexer().List() {
					if gw := o.(*gwv1.Gateway); string(gw.Spec.GatewayClassName) == gc.Name {
						enqueue(gw)
					}
				}
			}
		}},
		{d.params.Core().V1().ConfigMaps().Informer(), byParams},
	}
	for _, k := range keys {
		handlers = append(handlers, struct {
			inf cache.SharedIndexInformer
			f   func(any)
		}{d.ops[k].cache, byOwner})
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
	queue.Run(ctx, 2)
	return nil
}

// sync reconciles one key and counts the result; the queue retries an
// error. A conflict or AlreadyExists comes of a stale cache, or of an object
// changed or made since it was read: the retry recomputes from the newer
// version.
func (d *Deployer) sync(ctx context.Context, queue *kubequeue.Queue[string], key string) error {
	var result string
	var recheck bool
	var err error
	if key == classKey {
		result, err = d.reconcileClasses(ctx)
	} else {
		result, recheck, err = d.reconcile(ctx, key)
	}
	switch {
	case err == nil:
		if recheck {
			queue.AddAfter(key, d.cfg.Recheck)
		}
	case kubequeue.Conflict(err):
		result = resultConflict
	default:
		result = resultError
	}
	if result != "" {
		d.results.WithLabelValues(result).Inc()
	}
	return err
}

func paramsName(gw *gwv1.Gateway) string {
	if inf := gw.Spec.Infrastructure; inf != nil && inf.ParametersRef != nil {
		return inf.ParametersRef.Name
	}
	return ""
}

// refusal is why a Gateway is not Accepted.
type refusal struct{ reason, msg string }

// ours reports whether the deployer deploys gw: a waypoint by its class's
// name, an ingress gateway if its class is also handled by
// Config.GatewayControllerName (a class "istio" may be Istio's own).
func (d *Deployer) ours(gw *gwv1.Gateway) bool {
	switch string(gw.Spec.GatewayClassName) {
	case apinames.WaypointClass:
		return true
	case apinames.GatewayClass:
		if d.cfg.NoIngress {
			return false
		}
		o, ok, err := d.classes.GetIndexer().GetByKey(apinames.GatewayClass)
		return err == nil && ok && string(o.(*gwv1.GatewayClass).Spec.ControllerName) == d.cfg.GatewayControllerName
	}
	return false
}

// reconcile applies a Gateway's objects and writes its status. The result
// is "" for a Gateway that is not the deployer's; recheck says to look at it
// again later (an object it does not manage has its name).
func (d *Deployer) reconcile(ctx context.Context, key string) (result string, recheck bool, err error) {
	obj, ok, err := d.gateways.GetIndexer().GetByKey(key)
	if err != nil || !ok {
		return "", false, err // deleted: the garbage collector removes what it owned
	}
	gw := obj.(*gwv1.Gateway)
	if !d.ours(gw) {
		return "", false, nil
	}
	if gw.DeletionTimestamp != nil {
		// Being deleted (its dependents first, in a foreground deletion):
		// applying would bring back what the garbage collector removes.
		return "", false, nil
	}
	if err := checkName(gw); err != nil {
		return resultRefused, false, d.writeStatus(ctx, gw, &refusal{string(gwv1.GatewayReasonInvalid), err.Error()}, nil)
	}
	if Ingress(gw) {
		if r := checkIngress(gw); r != nil {
			d.log.Warn("gateway refused", "gateway", key, "error", r.msg)
			return resultRefused, false, d.writeStatus(ctx, gw, r, nil)
		}
	}
	params, err := d.parameters(gw)
	var objs *Objects
	if err == nil {
		objs, err = Build(d.cfg, gw, params)
	}
	if pe := (*ParamsError)(nil); errors.As(err, &pe) {
		d.log.Warn("parameters refused", "gateway", key, "error", pe.msg)
		return resultRefused, false, d.writeStatus(ctx, gw, &refusal{string(gwv1.GatewayReasonInvalidParameters), pe.msg}, nil)
	} else if err != nil {
		return "", false, err
	}
	// Nothing is written unless every name is free or the deployer's.
	order := objs.List()
	lives := make([]metav1.Object, len(order))
	for i, o := range order {
		if lives[i], err = d.live(ctx, o); err != nil {
			return "", false, err
		}
		if lives[i] == nil {
			continue
		}
		if why := manageable(lives[i], kindOf(o), gw); why != "" {
			d.log.Warn("gateway blocked by an object it does not manage", "gateway", key, "reason", why)
			return resultRefused, true, d.writeStatus(ctx, gw, &refusal{string(gwv1.GatewayReasonInvalid), why}, nil)
		}
	}
	var svc *corev1.Service
	for i, o := range order {
		applied, err := d.write(ctx, o, lives[i])
		if apierrors.IsInvalid(err) && params != nil {
			// The patches made an object the API server refuses.
			var st apierrors.APIStatus
			errors.As(err, &st)
			msg := fmt.Sprintf("ConfigMap %s/%s: the API server refuses the patched %s: %s", params.Namespace, params.Name, kindOf(o), st.Status().Message)
			d.log.Warn("parameters refused", "gateway", key, "error", msg)
			return resultRefused, false, d.writeStatus(ctx, gw, &refusal{string(gwv1.GatewayReasonInvalidParameters), msg}, nil)
		}
		if err != nil {
			return "", false, err
		}
		if s, ok := applied.(*corev1.Service); ok {
			svc = s
		}
	}
	if objs.HPA == nil {
		if err := d.prune(ctx, gw, KeyHPA); err != nil {
			return "", false, err
		}
	}
	if objs.PDB == nil {
		if err := d.prune(ctx, gw, KeyPDB); err != nil {
			return "", false, err
		}
	}
	return resultOK, false, d.writeStatus(ctx, gw, nil, svc)
}

// keyOf is the parameters key of obj's kind, "" if it is not a waypoint's.
func keyOf(obj any) string {
	switch obj.(type) {
	case *corev1.ServiceAccount:
		return KeyServiceAccount
	case *appsv1.Deployment:
		return KeyDeployment
	case *corev1.Service:
		return KeyService
	case *autoscalingv2.HorizontalPodAutoscaler:
		return KeyHPA
	case *policyv1.PodDisruptionBudget:
		return KeyPDB
	}
	return ""
}

// kindOf names obj's kind.
func kindOf(obj any) string {
	if k := keyOf(obj); k != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("%T", obj)
}

var kindNames = map[string]string{
	KeyServiceAccount: "ServiceAccount", KeyDeployment: "Deployment", KeyService: "Service",
	KeyHPA: "HorizontalPodAutoscaler", KeyPDB: "PodDisruptionBudget",
}

// parameters reads the ConfigMap a Gateway's parametersRef names.
func (d *Deployer) parameters(gw *gwv1.Gateway) (*corev1.ConfigMap, error) {
	name := paramsName(gw)
	if name == "" {
		return nil, nil
	}
	if err := checkRef(gw); err != nil {
		return nil, err
	}
	o, ok, err := d.params.Core().V1().ConfigMaps().Informer().GetIndexer().GetByKey(gw.Namespace + "/" + name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &ParamsError{fmt.Sprintf("parametersRef ConfigMap %s/%s not found", gw.Namespace, name)}
	}
	return o.(*corev1.ConfigMap), nil
}

// writeStatus sets the Gateway's conditions, addresses and listeners.
// refused is why it is not accepted, if it is not; svc the applied Service.
// It updates the version of the Gateway it was computed from: a conflict
// means the cache is behind, and the retry recomputes from the newer one
// rather than write this status over a spec it did not see.
func (d *Deployer) writeStatus(ctx context.Context, gw *gwv1.Gateway, refused *refusal, svc *corev1.Service) error {
	st := gwv1.GatewayStatus{Conditions: slices.Clone(gw.Status.Conditions)}
	gen := gw.Generation
	set := func(conds *[]metav1.Condition, typ string, ok bool, reason, msg string) {
		meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: condStatus(ok), Reason: reason, Message: msg, ObservedGeneration: gen})
	}
	programmed := false
	switch {
	case refused != nil:
		set(&st.Conditions, string(gwv1.GatewayConditionAccepted), false, refused.reason, refused.msg)
		set(&st.Conditions, string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonInvalid), "not deployed: "+refused.msg)
	default:
		set(&st.Conditions, string(gwv1.GatewayConditionAccepted), true, string(gwv1.GatewayReasonAccepted), kindOfProxy(gw)+" deployed")
		var why string
		if Ingress(gw) {
			st.Addresses, why = ingressAddresses(svc)
		} else {
			st.Addresses, why = d.waypointAddresses(svc)
		}
		if programmed = why == ""; programmed {
			set(&st.Conditions, string(gwv1.GatewayConditionProgrammed), true, string(gwv1.GatewayReasonProgrammed), "the "+kindOfProxy(gw)+"'s Service has an address")
		} else {
			set(&st.Conditions, string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonAddressNotAssigned), why)
		}
	}
	if Ingress(gw) {
		st.Listeners = d.ingressListeners(gw, refused == nil)
		if refused == nil {
			gatewayListenersValid(&st, gen)
		}
	} else {
		st.Listeners = waypointListeners(gw, refused == nil, programmed)
	}
	if statusEqual(gw.Status, st) {
		return nil
	}
	cur := gw.DeepCopy()
	cur.Status = st
	_, err := d.gw.GatewayV1().Gateways(gw.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile
	}
	if err != nil {
		return fmt.Errorf("writing the status of Gateway %s/%s: %w", gw.Namespace, gw.Name, err)
	}
	return nil
}

// gatewayListenersValid qualifies an accepted ingress Gateway's Accepted
// condition by its listeners, as Gateway API asks: with some listener not
// accepted the reason is ListenersNotValid, and with none accepted the
// Gateway is not accepted either (nor programmed: it serves nothing).
func gatewayListenersValid(st *gwv1.GatewayStatus, gen int64) {
	var bad []string
	for _, l := range st.Listeners {
		if c := meta.FindStatusCondition(l.Conditions, string(gwv1.ListenerConditionAccepted)); c != nil && c.Status == metav1.ConditionFalse {
			bad = append(bad, fmt.Sprintf("%s (%s)", l.Name, c.Reason))
		}
	}
	if len(bad) == 0 {
		return
	}
	all := len(bad) == len(st.Listeners)
	msg := "listeners not accepted: " + strings.Join(bad, ", ")
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: string(gwv1.GatewayConditionAccepted), Status: condStatus(!all),
		Reason: string(gwv1.GatewayReasonListenersNotValid), Message: msg, ObservedGeneration: gen})
	if all {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: string(gwv1.GatewayConditionProgrammed), Status: metav1.ConditionFalse,
			Reason: string(gwv1.GatewayReasonInvalid), Message: "no listener is accepted: " + msg, ObservedGeneration: gen})
	}
}

func condStatus(ok bool) metav1.ConditionStatus {
	if ok {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// waypointAddresses are a waypoint's status.addresses: its Service's
// hostname and cluster IPs; why says why there are none.
func (d *Deployer) waypointAddresses(svc *corev1.Service) (addrs []gwv1.GatewayStatusAddress, why string) {
	if svc == nil || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil, "the waypoint's Service has no cluster IP"
	}
	host := svc.Name + "." + svc.Namespace + ".svc." + d.cfg.ClusterDomain
	addrs = []gwv1.GatewayStatusAddress{{Type: ptr(gwv1.HostnameAddressType), Value: host}}
	return append(addrs, clusterIPs(svc)...), ""
}

// clusterIPs are a Service's cluster IPs as addresses, one per family, the
// primary first.
func clusterIPs(svc *corev1.Service) []gwv1.GatewayStatusAddress {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []gwv1.GatewayStatusAddress
	for _, ip := range ips {
		out = append(out, gwv1.GatewayStatusAddress{Type: ptr(gwv1.IPAddressType), Value: ip})
	}
	return out
}

// ingressAddresses are an ingress gateway's status.addresses: for a
// Service of type LoadBalancer the IPs and hostnames its load balancer
// reports, else its cluster IPs (a NodePort Service is reached on every
// node's address, which the deployer does not list); why says why there
// are none.
func ingressAddresses(svc *corev1.Service) (addrs []gwv1.GatewayStatusAddress, why string) {
	if svc == nil {
		return nil, "the gateway's Service is not applied"
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				addrs = append(addrs, gwv1.GatewayStatusAddress{Type: ptr(gwv1.IPAddressType), Value: in.IP})
			}
			if in.Hostname != "" {
				addrs = append(addrs, gwv1.GatewayStatusAddress{Type: ptr(gwv1.HostnameAddressType), Value: in.Hostname})
			}
		}
		if len(addrs) == 0 {
			return nil, fmt.Sprintf("the gateway's Service %s/%s of type LoadBalancer has no load-balancer address yet", svc.Namespace, svc.Name)
		}
		return addrs, ""
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil, fmt.Sprintf("the gateway's Service %s/%s has no cluster IP", svc.Namespace, svc.Name)
	}
	return clusterIPs(svc), ""
}

// waypointListeners are a waypoint's listener statuses: accepted and
// programmed with the Gateway, no routes attached.
func waypointListeners(gw *gwv1.Gateway, accepted, programmed bool) []gwv1.ListenerStatus {
	var out []gwv1.ListenerStatus
	set := func(conds *[]metav1.Condition, typ string, ok bool, reason string) {
		meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: condStatus(ok), Reason: reason, ObservedGeneration: gw.Generation})
	}
	for _, l := range gw.Spec.Listeners {
		ls := gwv1.ListenerStatus{Name: l.Name, SupportedKinds: []gwv1.RouteGroupKind{}, AttachedRoutes: attachedRoutes}
		ls.Conditions = oldListenerConditions(gw, l.Name)
		set(&ls.Conditions, string(gwv1.ListenerConditionAccepted), accepted, reasonOf(accepted, string(gwv1.ListenerReasonAccepted), string(gwv1.ListenerReasonPending)))
		set(&ls.Conditions, string(gwv1.ListenerConditionProgrammed), programmed, reasonOf(programmed, string(gwv1.ListenerReasonProgrammed), string(gwv1.ListenerReasonPending)))
		set(&ls.Conditions, string(gwv1.ListenerConditionResolvedRefs), true, string(gwv1.ListenerReasonResolvedRefs))
		out = append(out, ls)
	}
	return out
}

func oldListenerConditions(gw *gwv1.Gateway, name gwv1.SectionName) []metav1.Condition {
	for _, old := range gw.Status.Listeners {
		if old.Name == name {
			return slices.Clone(old.Conditions)
		}
	}
	return nil
}

// ingressListeners are an ingress gateway's listener statuses: the
// configuration controller's (SetGatewayListeners) once it has computed
// them; until then each listener is Accepted (if the Gateway is) and not
// yet Programmed (Pending), with no routes and the kinds its protocol
// admits by default. Only the configuration controller, which knows what
// the proxy was sent, sets a listener Programmed.
func (d *Deployer) ingressListeners(gw *gwv1.Gateway, accepted bool) []gwv1.ListenerStatus {
	d.mu.Lock()
	entry, ok := d.listeners[gw.Namespace+"/"+gw.Name]
	d.mu.Unlock()
	if ok {
		// The computed conditions carry no transition time: a condition
		// keeps the time it has in the Gateway's status while its status
		// stays, and takes now when it changes (the API server refuses a
		// condition without one).
		now := metav1.NewTime(time.Now())
		out := make([]gwv1.ListenerStatus, len(entry))
		for i := range entry {
			entry[i].DeepCopyInto(&out[i])
			old := oldListenerConditions(gw, out[i].Name)
			for j := range out[i].Conditions {
				c := &out[i].Conditions[j]
				if o := meta.FindStatusCondition(old, c.Type); o != nil && o.Status == c.Status {
					c.LastTransitionTime = o.LastTransitionTime
				} else if c.LastTransitionTime.IsZero() {
					c.LastTransitionTime = now
				}
			}
		}
		return out
	}
	var out []gwv1.ListenerStatus
	for _, l := range gw.Spec.Listeners {
		ls := gwv1.ListenerStatus{Name: l.Name, SupportedKinds: supportedKinds(l.Protocol), AttachedRoutes: 0}
		// Only these two, keeping their transition times.
		for _, c := range oldListenerConditions(gw, l.Name) {
			if c.Type == string(gwv1.ListenerConditionAccepted) || c.Type == string(gwv1.ListenerConditionProgrammed) {
				ls.Conditions = append(ls.Conditions, c)
			}
		}
		meta.SetStatusCondition(&ls.Conditions, metav1.Condition{Type: string(gwv1.ListenerConditionAccepted), Status: condStatus(accepted),
			Reason: reasonOf(accepted, string(gwv1.ListenerReasonAccepted), string(gwv1.ListenerReasonPending)), ObservedGeneration: gw.Generation})
		meta.SetStatusCondition(&ls.Conditions, metav1.Condition{Type: string(gwv1.ListenerConditionProgrammed), Status: metav1.ConditionFalse,
			Reason: string(gwv1.ListenerReasonPending), Message: "the listener's configuration is not computed yet", ObservedGeneration: gw.Generation})
		out = append(out, ls)
	}
	return out
}

// SetGatewayListeners hands the deployer the listener statuses of the
// ingress Gateways, by "<namespace>/<name>", as the configuration
// controller computed them (with their observedGeneration). It keeps the
// latest map, and writes an entry as the Gateway's status.listeners,
// requeueing the Gateways whose entry changed (or went). It keeps its own
// copy: the caller may reuse m. Safe for concurrent use; before Run the
// entries wait for it.
func (d *Deployer) SetGatewayListeners(m map[string][]gwv1.ListenerStatus) {
	next := make(map[string][]gwv1.ListenerStatus, len(m))
	for k, ls := range m {
		c := make([]gwv1.ListenerStatus, len(ls))
		for i := range ls {
			ls[i].DeepCopyInto(&c[i])
		}
		next[k] = c
	}
	d.mu.Lock()
	prev, queue := d.listeners, d.queue
	d.listeners = next
	d.mu.Unlock()
	if queue == nil {
		return // Run reconciles every Gateway when it starts
	}
	for k, ls := range next {
		if old, ok := prev[k]; !ok || mustJSON(old) != mustJSON(ls) {
			queue.Add(k)
		}
	}
	for k := range prev {
		if _, ok := next[k]; !ok {
			queue.Add(k)
		}
	}
}

// attachedRoutes is the attachedRoutes of every waypoint listener. A
// waypoint's routes attach to Services (GAMMA), not to its listener, and a
// route whose parentRef is the waypoint Gateway is refused
// (NotAllowedByListeners); so no route attaches to the listener, and istiod
// (1.28) reports 0 as well: it counts only routes attached to a Gateway's
// listener, and takes no waypoint Gateway as a route parent. The routes of
// a waypoint's Services show in their own status.parents.
const attachedRoutes = 0

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

// reconcileClasses accepts the GatewayClasses of our controllers: the
// waypoint's and the ingress gateway's. It sets no supportedFeatures.
func (d *Deployer) reconcileClasses(ctx context.Context) (string, error) {
	for _, o := range d.classes.GetIndexer().List() {
		gc := o.(*gwv1.GatewayClass)
		var msg string
		switch string(gc.Spec.ControllerName) {
		case d.cfg.ControllerName:
			msg = "handled by the Weft waypoint deployer"
		case d.cfg.GatewayControllerName:
			msg = "handled by the Weft gateway deployer"
		default:
			continue
		}
		conds := slices.Clone(gc.Status.Conditions)
		meta.SetStatusCondition(&conds, metav1.Condition{Type: string(gwv1.GatewayClassConditionStatusAccepted), Status: metav1.ConditionTrue,
			Reason: string(gwv1.GatewayClassReasonAccepted), Message: msg, ObservedGeneration: gc.Generation})
		if a, _ := json.Marshal(conds); string(a) == mustJSON(gc.Status.Conditions) {
			continue
		}
		cur := gc.DeepCopy()
		cur.Status.Conditions = conds
		if _, err := d.gw.GatewayV1().GatewayClasses().UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("writing the status of GatewayClass %s: %w", gc.Name, err)
		}
	}
	return resultOK, nil
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
