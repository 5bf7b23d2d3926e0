//go:build tools

// Package tools pins the reference CNI plugins (bridge, host-local, loopback)
// that wire the local test cluster's pods.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
)
