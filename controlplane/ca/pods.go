package ca

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
)

// indexNodeIdentity indexes pods by "<node>/<namespace>/<service account>".
const indexNodeIdentity = "weft-node-identity"

func nodeIdentityKey(node, ns, sa string) string { return node + "/" + ns + "/" + sa }

// AddPodIndexers adds the index PodIndex needs to the pod informer. Call it
// before the informer starts.
func AddPodIndexers(inf cache.SharedIndexInformer) error {
	if _, ok := inf.GetIndexer().GetIndexers()[indexNodeIdentity]; ok {
		return nil
	}
	err := inf.AddIndexers(cache.Indexers{indexNodeIdentity: func(obj any) ([]string, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" || identityOf(p) == "" {
			return nil, nil
		}
		return []string{nodeIdentityKey(p.Spec.NodeName, p.Namespace, identityOf(p))}, nil
	}})
	if err != nil {
		return fmt.Errorf("adding the pod node-identity index: %w", err)
	}
	return nil
}

// PodIndex answers the CA's questions about pods from the pod informer,
// asking the API directly when the informer has not seen a pod yet.
type PodIndex struct {
	cache cache.Indexer
	live  corev1client.PodsGetter
}

var (
	_ NodeIndex = (*PodIndex)(nil)
	_ PodGetter = (*PodIndex)(nil)
)

// NewPodIndex returns a PodIndex over a pod informer that AddPodIndexers was
// called on. live may be nil (no fallback).
func NewPodIndex(inf cache.SharedIndexInformer, live corev1client.PodsGetter) *PodIndex {
	return &PodIndex{cache: inf.GetIndexer(), live: live}
}

// identityOf returns the service account whose identity a pod's workload
// has, or "" when the pod grants none. A mirror pod (the API's copy of a
// static pod, annotation kubernetes.io/config.mirror) grants none: a node
// creates mirror pods in any namespace it likes, so counting one would let a
// compromised node mint identities of namespaces it has no workload in; the
// API server forbids them a service account anyway. A pod without a service
// account grants none either: the name is never defaulted to "default".
func identityOf(p *corev1.Pod) string {
	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return ""
	}
	return p.Spec.ServiceAccountName
}

func running(p *corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && p.DeletionTimestamp == nil
}

// HasPodOnNode reports whether a running pod of the identity is on node.
// Mirror pods and pods without a service account count for no identity.
func (x *PodIndex) HasPodOnNode(ctx context.Context, node, ns, sa string) (bool, error) {
	if node == "" || ns == "" || sa == "" {
		return false, nil
	}
	objs, err := x.cache.ByIndex(indexNodeIdentity, nodeIdentityKey(node, ns, sa))
	if err != nil {
		return false, fmt.Errorf("reading the pod index: %w", err)
	}
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && running(p) {
			return true, nil
		}
	}
	if x.live == nil {
		return false, nil
	}
	// The informer may lag a pod that was just scheduled.
	list, err := x.live.Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return false, fmt.Errorf("listing pods of %s on node %s: %w", ns, node, err)
	}
	for i := range list.Items {
		if p := &list.Items[i]; p.Spec.NodeName == node && identityOf(p) == sa && running(p) {
			return true, nil
		}
	}
	return false, nil
}

// GetPod returns a pod, or nil when it does not exist.
func (x *PodIndex) GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	obj, ok, err := x.cache.GetByKey(ns + "/" + name)
	if err != nil {
		return nil, fmt.Errorf("reading pod %s/%s from the cache: %w", ns, name, err)
	}
	if ok {
		if p, ok := obj.(*corev1.Pod); ok {
			return p, nil
		}
	}
	if x.live == nil {
		return nil, nil
	}
	p, err := x.live.Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("getting pod %s/%s: %w", ns, name, err)
	}
	return p, nil
}
