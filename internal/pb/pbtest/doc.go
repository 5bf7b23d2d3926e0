// Package pbtest checks that the generated protocol code under internal/pb
// stays wire-compatible with Istio: every message round-trips, its
// deterministic encoding matches a checked-in fixture, the schema (field
// names, numbers, types; enum values) matches a hand-written table of the
// upstream facts, a few encodings are compared with bytes worked out by hand,
// and the type URLs and the gRPC method name are Istio's.
//
// The package holds tests only. Rewrite the fixtures after an intended change
// with:
//
//	go test ./internal/pb/pbtest -update
package pbtest
