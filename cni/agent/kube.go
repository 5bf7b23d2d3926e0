package agent

import (
	"context"
	"encoding/json"
	"fmt"

	"istio.io/api/annotation"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// podAnnotator patches the redirection annotation onto pods through the
// pods/status subresource. The API server keeps a pod's metadata changes
// made there but puts its spec (and owner references) back, so the agent
// and the cleanup Job need only pods/status patch, never pods patch, with
// which a token taken from a node could change any pod's image. The chart's
// admission policy holds them, through pods/status, to this one annotation
// (and the agent to its node's pods).
type podAnnotator struct {
	kube kubernetes.Interface
}

var _ annotator = podAnnotator{}

// annotate sets the annotation to value, or removes it for "". A pod that
// is gone is not an error.
func (a podAnnotator) annotate(ctx context.Context, ns, name, value string) error {
	var v any
	if value != "" {
		v = value
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{annotation.AmbientRedirection.Name: v}}})
	if err != nil {
		return err
	}
	_, err = a.kube.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "weft-cni-agent"}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("patching %s=%q onto pod %s/%s: %w", annotation.AmbientRedirection.Name, value, ns, name, err)
	}
	return nil
}
