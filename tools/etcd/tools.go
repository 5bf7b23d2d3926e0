//go:build tools

// Package tools pins the etcd server the local test cluster stores its
// state in. (Debian's etcd 3.4 lacks watch progress requests, without which
// kube-apiserver's watch cache rejects fresh watches on quiet resources.)
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
