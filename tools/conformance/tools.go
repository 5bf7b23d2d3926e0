//go:build tools

// Package tools pins the echo application the Gateway API conformance
// suite's Mesh profile runs (its image registry.k8s.io/gateway-api/echo-advanced
// is Istio's test echo app: a server, and a client the suite execs in the
// pods), built from Istio's sources for the conformance run's images, and
// istioctl of the same snapshot, which the tests run against Weft's data
// plane as an Istio user would.
package tools

import (
	_ "istio.io/istio/istioctl/cmd/istioctl"
	_ "istio.io/istio/pkg/test/echo/cmd/client"
	_ "istio.io/istio/pkg/test/echo/cmd/server"
)
