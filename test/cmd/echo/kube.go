package main

import (
	"context"
	"flag"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// kubeList lists the pods of a namespace the way an in-cluster client-go
// program does: rest.InClusterConfig (KUBERNETES_SERVICE_HOST and _PORT,
// the service account's token and CA), then the typed clientset. -server
// replaces the address from the environment, say with
// https://kubernetes.default.svc, so the name is resolved through the
// pod's DNS. It prints one pod name a line.
func kubeList(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("echo kube-list", flag.ContinueOnError)
	namespace := fs.String("namespace", "default", "namespace whose pods to list")
	server := fs.String("server", "", "API server URL (default: from the in-cluster environment)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	if *server != "" {
		cfg.Host = *server
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	pods, err := cs.CoreV1().Pods(*namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing pods in %s via %s: %w", *namespace, cfg.Host, err)
	}
	for _, p := range pods.Items {
		fmt.Println(p.Name)
	}
	return nil
}
