package deployer

import (
	"context"
	"encoding/json"
	"fmt"

	"istio.io/api/label"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/csaupgrade"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// Taking over objects. The deployer writes an object named after a Gateway
// only if it does not exist (it is created, and a create fails if someone
// made it meanwhile) or if it is one of the deployer's (manageable). It
// applies over an existing object with that object's uid and
// resourceVersion as preconditions, so an object replaced or relabelled
// after the check is not written: the apply fails with a conflict, and the
// retry checks again.

// manageable says why the deployer may not write over live, an existing
// object named like the Gateway gw, or "" if it may. It may if the object
// is controlled by gw, or carries the label gateway.istio.io/managed (any
// value, as Istio's deployer: the mark of a deployer's object, which an
// application's object lacks) and is controlled by nothing else.
func manageable(live metav1.Object, kind string, gw *gwv1.Gateway) string {
	what := fmt.Sprintf("%s %s/%s exists", kind, live.GetNamespace(), live.GetName())
	fix := "; rename the Gateway or delete the " + kind
	if c := metav1.GetControllerOfNoCopy(live); c != nil {
		if isGateway(c, gw.Name) && c.UID == gw.UID {
			return ""
		}
		if isGateway(c, gw.Name) {
			return fmt.Sprintf("%s and is controlled by an earlier Gateway %s (uid %s), not this one%s", what, c.Name, c.UID, fix)
		}
		return fmt.Sprintf("%s and is controlled by %s %s%s", what, c.Kind, c.Name, fix)
	}
	if _, ok := live.GetLabels()[label.GatewayManaged.Name]; !ok {
		return fmt.Sprintf("%s and is not managed by the waypoint controller (it has no %s label)%s", what, label.GatewayManaged.Name, fix)
	}
	return ""
}

func isGateway(ref *metav1.OwnerReference, name string) bool {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == gwv1.GroupName && ref.Kind == "Gateway" && ref.Name == name
}

// live returns the object of obj's kind and name as it exists: from the
// cache of labelled objects, else (an object the deployer did not make
// carries no label it selects on, or the cache is behind) from the API
// server. It is nil if there is none.
func (d *Deployer) live(ctx context.Context, obj metav1.Object) (metav1.Object, error) {
	var inf cache.SharedIndexInformer
	ns, name := obj.GetNamespace(), obj.GetName()
	var get func() (metav1.Object, error)
	switch obj.(type) {
	case *corev1.ServiceAccount:
		inf = d.owned.Core().V1().ServiceAccounts().Informer()
		get = func() (metav1.Object, error) {
			return d.kube.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
		}
	case *appsv1.Deployment:
		inf = d.owned.Apps().V1().Deployments().Informer()
		get = func() (metav1.Object, error) {
			return d.kube.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		}
	case *corev1.Service:
		inf = d.owned.Core().V1().Services().Informer()
		get = func() (metav1.Object, error) { return d.kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}) }
	default:
		return nil, fmt.Errorf("reading %T: not a waypoint object", obj)
	}
	if o, ok, err := inf.GetIndexer().GetByKey(ns + "/" + name); err == nil && ok {
		return o.(metav1.Object), nil
	}
	o, err := get()
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the %s %s/%s: %w", kindOf(obj), ns, name, err)
	}
	return o, nil
}

// write creates obj if live is nil, else server-side-applies it over live
// (which must be manageable), and returns it as the API server has it.
func (d *Deployer) write(ctx context.Context, obj, live metav1.Object) (any, error) {
	var out runtime.Object
	var err error
	if live == nil {
		out, err = d.create(ctx, obj)
	} else {
		obj.SetUID(live.GetUID())
		obj.SetResourceVersion(live.GetResourceVersion())
		out, err = d.apply(ctx, obj)
	}
	if err != nil {
		return nil, err
	}
	if err := d.upgradeFields(ctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

// create creates obj; it fails (already exists) if the name is taken.
func (d *Deployer) create(ctx context.Context, obj metav1.Object) (runtime.Object, error) {
	opts := metav1.CreateOptions{FieldManager: FieldManager}
	var out runtime.Object
	var err error
	switch o := obj.(type) {
	case *corev1.ServiceAccount:
		out, err = d.kube.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
	case *appsv1.Deployment:
		out, err = d.kube.AppsV1().Deployments(o.Namespace).Create(ctx, o, opts)
	case *corev1.Service:
		out, err = d.kube.CoreV1().Services(o.Namespace).Create(ctx, o, opts)
	default:
		return nil, fmt.Errorf("creating %T: not a waypoint object", obj)
	}
	if err != nil {
		return nil, fmt.Errorf("creating the %s: %w", kindOf(obj), err)
	}
	return out, nil
}

// apply server-side-applies obj, with the preconditions its uid and
// resourceVersion say.
func (d *Deployer) apply(ctx context.Context, obj metav1.Object) (runtime.Object, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: ptr(true)}
	var out runtime.Object
	switch o := obj.(type) {
	case *corev1.ServiceAccount:
		out, err = d.kube.CoreV1().ServiceAccounts(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, data, opts)
	case *appsv1.Deployment:
		out, err = d.kube.AppsV1().Deployments(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, data, opts)
	case *corev1.Service:
		out, err = d.kube.CoreV1().Services(o.Namespace).Patch(ctx, o.Name, types.ApplyPatchType, data, opts)
	default:
		return nil, fmt.Errorf("applying %T: not a waypoint object", obj)
	}
	if err != nil {
		return nil, fmt.Errorf("applying the %s: %w", kindOf(obj), err)
	}
	return out, nil
}

// upgradeFields hands the fields a create gave the deployer as an Update
// manager to its Apply manager, so that a field a later apply leaves out
// is removed rather than kept by the create's claim. The next apply
// retries it if the object changed meanwhile.
func (d *Deployer) upgradeFields(ctx context.Context, obj runtime.Object) error {
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(obj, sets.New(FieldManager), FieldManager)
	if err != nil || patch == nil {
		return err
	}
	m := obj.(metav1.Object)
	opts := metav1.PatchOptions{}
	switch obj.(type) {
	case *corev1.ServiceAccount:
		_, err = d.kube.CoreV1().ServiceAccounts(m.GetNamespace()).Patch(ctx, m.GetName(), types.JSONPatchType, patch, opts)
	case *appsv1.Deployment:
		_, err = d.kube.AppsV1().Deployments(m.GetNamespace()).Patch(ctx, m.GetName(), types.JSONPatchType, patch, opts)
	case *corev1.Service:
		_, err = d.kube.CoreV1().Services(m.GetNamespace()).Patch(ctx, m.GetName(), types.JSONPatchType, patch, opts)
	}
	if apierrors.IsConflict(err) {
		return nil // changed meanwhile: its next apply does it
	}
	if err != nil {
		return fmt.Errorf("handing the %s's fields to the apply manager: %w", kindOf(obj), err)
	}
	return nil
}
