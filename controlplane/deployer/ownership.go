package deployer

import (
	"context"
	"encoding/json"
	"fmt"

	"istio.io/api/label"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
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
		return fmt.Sprintf("%s and is not managed by the %s controller (it has no %s label)%s", what, kindOfProxy(gw), label.GatewayManaged.Name, fix)
	}
	return ""
}

func isGateway(ref *metav1.OwnerReference, name string) bool {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == gwv1.GroupName && ref.Kind == "Gateway" && ref.Name == name
}

// kindClient is what the deployer does with one kind of waypoint object:
// client-go's typed client of that kind in a namespace.
type kindClient[T runtime.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// kindOps are a kind's operations with the type taken out, and the cache
// of its objects that carry the gateway-name label.
type kindOps struct {
	kind   string
	cache  cache.SharedIndexInformer
	get    func(ctx context.Context, ns, name string) (metav1.Object, error)
	create func(ctx context.Context, obj metav1.Object) (runtime.Object, error)
	patch  func(ctx context.Context, ns, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (runtime.Object, error)
	delete func(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error
}

func opsOf[T interface {
	runtime.Object
	metav1.Object
}](kind string, inf cache.SharedIndexInformer, client func(ns string) kindClient[T]) *kindOps {
	return &kindOps{
		kind:  kind,
		cache: inf,
		get: func(ctx context.Context, ns, name string) (metav1.Object, error) {
			return client(ns).Get(ctx, name, metav1.GetOptions{})
		},
		create: func(ctx context.Context, obj metav1.Object) (runtime.Object, error) {
			return client(obj.GetNamespace()).Create(ctx, obj.(T), metav1.CreateOptions{FieldManager: FieldManager})
		},
		patch: func(ctx context.Context, ns, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (runtime.Object, error) {
			return client(ns).Patch(ctx, name, pt, data, opts)
		},
		delete: func(ctx context.Context, ns, name string, opts metav1.DeleteOptions) error {
			return client(ns).Delete(ctx, name, opts)
		},
	}
}

// kinds are the operations of each kind of waypoint object, by its key in
// the parameters ConfigMap.
func (d *Deployer) kinds() map[string]*kindOps {
	return map[string]*kindOps{
		KeyServiceAccount: opsOf("ServiceAccount", d.owned.Core().V1().ServiceAccounts().Informer(),
			func(ns string) kindClient[*corev1.ServiceAccount] { return d.kube.CoreV1().ServiceAccounts(ns) }),
		KeyDeployment: opsOf("Deployment", d.owned.Apps().V1().Deployments().Informer(),
			func(ns string) kindClient[*appsv1.Deployment] { return d.kube.AppsV1().Deployments(ns) }),
		KeyService: opsOf("Service", d.owned.Core().V1().Services().Informer(),
			func(ns string) kindClient[*corev1.Service] { return d.kube.CoreV1().Services(ns) }),
		KeyHPA: opsOf("HorizontalPodAutoscaler", d.owned.Autoscaling().V2().HorizontalPodAutoscalers().Informer(),
			func(ns string) kindClient[*autoscalingv2.HorizontalPodAutoscaler] {
				return d.kube.AutoscalingV2().HorizontalPodAutoscalers(ns)
			}),
		KeyPDB: opsOf("PodDisruptionBudget", d.owned.Policy().V1().PodDisruptionBudgets().Informer(),
			func(ns string) kindClient[*policyv1.PodDisruptionBudget] {
				return d.kube.PolicyV1().PodDisruptionBudgets(ns)
			}),
	}
}

// opsFor returns the operations of obj's kind.
func (d *Deployer) opsFor(obj metav1.Object) (*kindOps, error) {
	if k := keyOf(obj); k != "" {
		return d.ops[k], nil
	}
	return nil, fmt.Errorf("%T is not a waypoint object", obj)
}

// live returns the object of obj's kind and name as it exists: from the
// cache of labelled objects, else (an object the deployer did not make
// carries no label it selects on, or the cache is behind) from the API
// server. It is nil if there is none.
func (d *Deployer) live(ctx context.Context, obj metav1.Object) (metav1.Object, error) {
	ops, err := d.opsFor(obj)
	if err != nil {
		return nil, err
	}
	return d.liveOf(ctx, ops, obj.GetNamespace(), obj.GetName())
}

func (d *Deployer) liveOf(ctx context.Context, ops *kindOps, ns, name string) (metav1.Object, error) {
	if o, ok, err := ops.cache.GetIndexer().GetByKey(ns + "/" + name); err == nil && ok {
		return o.(metav1.Object), nil
	}
	o, err := ops.get(ctx, ns, name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the %s %s/%s: %w", ops.kind, ns, name, err)
	}
	return o, nil
}

// write creates obj if live is nil, else server-side-applies it over live
// (which must be manageable), and returns it as the API server has it.
func (d *Deployer) write(ctx context.Context, obj, live metav1.Object) (any, error) {
	ops, err := d.opsFor(obj)
	if err != nil {
		return nil, err
	}
	var out runtime.Object
	if live == nil {
		out, err = ops.create(ctx, obj)
		if err != nil {
			return nil, fmt.Errorf("creating the %s: %w", ops.kind, err)
		}
	} else {
		obj.SetUID(live.GetUID())
		obj.SetResourceVersion(live.GetResourceVersion())
		data, err := json.Marshal(obj)
		if err != nil {
			return nil, err
		}
		out, err = ops.patch(ctx, obj.GetNamespace(), obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: ptr(true)})
		if err != nil {
			return nil, fmt.Errorf("applying the %s: %w", ops.kind, err)
		}
	}
	if err := d.upgradeFields(ctx, ops, out); err != nil {
		return nil, err
	}
	return out, nil
}

// upgradeFields hands the fields a create gave the deployer as an Update
// manager to its Apply manager, so that a field a later apply leaves out
// is removed rather than kept by the create's claim. The next apply
// retries it if the object changed meanwhile.
func (d *Deployer) upgradeFields(ctx context.Context, ops *kindOps, obj runtime.Object) error {
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(obj, sets.New(FieldManager), FieldManager)
	if err != nil || patch == nil {
		return err
	}
	m := obj.(metav1.Object)
	_, err = ops.patch(ctx, m.GetNamespace(), m.GetName(), types.JSONPatchType, patch, metav1.PatchOptions{})
	if apierrors.IsConflict(err) {
		return nil // changed meanwhile: its next apply does it
	}
	if err != nil {
		return fmt.Errorf("handing the %s's fields to the apply manager: %w", ops.kind, err)
	}
	return nil
}

// prune deletes the Gateway's object of the kind under key, named after it,
// that the parameters no longer ask for (an HPA or PDB whose key was
// removed) — only if the Gateway controls it, and only that version of it.
func (d *Deployer) prune(ctx context.Context, gw *gwv1.Gateway, key string) error {
	ops := d.ops[key]
	live, err := d.liveOf(ctx, ops, gw.Namespace, ObjectName(gw))
	if err != nil || live == nil {
		return err
	}
	if c := metav1.GetControllerOfNoCopy(live); c == nil || !isGateway(c, gw.Name) || c.UID != gw.UID {
		return nil // not the waypoint's: someone else's to keep
	}
	uid, rv := live.GetUID(), live.GetResourceVersion()
	err = ops.delete(ctx, gw.Namespace, ObjectName(gw), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting the %s the parameters no longer ask for: %w", ops.kind, err)
	}
	return nil
}
