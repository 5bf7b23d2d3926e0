// Package kubeclient gives Weft's components their API client
// configuration: the kubeconfig a flag names, or, without one, the pod's
// in-cluster service account.
package kubeclient

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config returns the REST configuration of the kubeconfig file at path, or
// the in-cluster one when path is empty, with userAgent set.
func Config(path, userAgent string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if path == "" {
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("reading the in-cluster API configuration (outside a cluster, pass --kubeconfig): %w", err)
		}
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("reading kubeconfig %s: %w", path, err)
		}
	}
	rc.UserAgent = userAgent
	return rc, nil
}
