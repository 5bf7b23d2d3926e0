//go:build tools

// Package tools pins the Helm client the local test cluster installs charts with.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
