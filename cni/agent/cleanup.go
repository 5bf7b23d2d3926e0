package agent

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"istio.io/api/annotation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CleanupConfig configures Cleanup.
type CleanupConfig struct {
	// AgentNamespace and AgentSelector find the agents' pods. Required.
	AgentNamespace, AgentSelector string
	// Poll is how often the agents' pods are looked for. Default 1s.
	Poll time.Duration
}

// Cleanup finishes an uninstall once the agents are gone: it removes the
// ambient.istio.io/redirection annotation from every pod that still has
// it. The agents take their pods' redirection out when their DaemonSet is
// deleted, but by then the release's RBAC is going too, so their own
// annotation patches may be refused; the chart runs Cleanup as a
// post-delete hook, with RBAC of its own. It waits (until ctx ends) for the
// agents' pods to be gone first, so that no agent re-annotates a pod
// behind it, and returns how many pods it patched.
func Cleanup(ctx context.Context, kube kubernetes.Interface, cfg CleanupConfig, log *slog.Logger) (int, error) {
	if cfg.AgentNamespace == "" || cfg.AgentSelector == "" {
		return 0, fmt.Errorf("cleanup: the agents' namespace and selector are required")
	}
	if cfg.Poll == 0 {
		cfg.Poll = time.Second
	}
	t := time.NewTicker(cfg.Poll)
	defer t.Stop()
	for {
		pods, err := kube.CoreV1().Pods(cfg.AgentNamespace).List(ctx, metav1.ListOptions{LabelSelector: cfg.AgentSelector})
		if err == nil && len(pods.Items) == 0 {
			break
		}
		if err != nil {
			log.Warn("listing the agents' pods", "error", err)
		} else {
			log.Info("waiting for the node agents to finish", "pods", len(pods.Items))
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("cleanup: the node agents (%s in %s) are still running: %w", cfg.AgentSelector, cfg.AgentNamespace, ctx.Err())
		case <-t.C:
		}
	}
	pods, err := kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("cleanup: listing pods: %w", err)
	}
	a := podAnnotator{kube: kube}
	n := 0
	for _, p := range pods.Items {
		if _, ok := p.Annotations[annotation.AmbientRedirection.Name]; !ok {
			continue
		}
		if err := a.annotate(ctx, p.Namespace, p.Name, ""); err != nil {
			return n, fmt.Errorf("cleanup: %w", err)
		}
		n++
	}
	log.Info("removed the redirection annotation", "pods", n)
	return n, nil
}
