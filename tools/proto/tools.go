//go:build tools

// Package tools pins the protoc plugins that generate the checked-in Go code
// under internal/pb. scripts/proto.sh builds them from this module.
package tools

import (
	_ "google.golang.org/grpc/cmd/protoc-gen-go-grpc"
	_ "google.golang.org/protobuf/cmd/protoc-gen-go"
)
