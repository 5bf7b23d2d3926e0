//go:build tools

// Package tools pins govulncheck and the Go vulnerability database (its
// data, and the tool that indexes it) that `make lint` checks the module
// against, offline.
package tools

import (
	_ "golang.org/x/vuln/cmd/govulncheck"
	_ "golang.org/x/vulndb/cmd/indexdb"
)
