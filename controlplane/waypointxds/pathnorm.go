package waypointxds

import (
	"fmt"
	"strings"

	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// PathNormalization is Istio's meshConfig.pathNormalization.normalization:
// how a waypoint normalizes a request's path before its policies and
// routes see it and before it forwards it.
type PathNormalization string

// The settings, as Istio names them.
const (
	// PathNone leaves the path as the client sent it.
	PathNone PathNormalization = "NONE"
	// PathBase normalizes by RFC 3986 (unreserved characters decoded, dot
	// segments removed) and reads "\" as "/": Envoy's normalize_path.
	PathBase PathNormalization = "BASE"
	// PathMergeSlashes is PathBase, then runs of "/" merged.
	PathMergeSlashes PathNormalization = "MERGE_SLASHES"
	// PathDecodeAndMergeSlashes decodes %2F and %5C first, then is
	// PathMergeSlashes.
	PathDecodeAndMergeSlashes PathNormalization = "DECODE_AND_MERGE_SLASHES"
)

// ParsePathNormalization reads a setting; "" and Istio's DEFAULT are BASE.
func ParsePathNormalization(s string) (PathNormalization, error) {
	switch p := PathNormalization(strings.ToUpper(strings.TrimSpace(s))); p {
	case "", "DEFAULT":
		return PathBase, nil
	case PathNone, PathBase, PathMergeSlashes, PathDecodeAndMergeSlashes:
		return p, nil
	}
	return "", fmt.Errorf("path normalization %q is not one of NONE, BASE, MERGE_SLASHES, DECODE_AND_MERGE_SLASHES", s)
}

// apply sets m's path fields as Istio does for the setting; an unknown
// setting (Validate refuses it before) is BASE.
func (p PathNormalization) apply(m *hcmv3.HttpConnectionManager) {
	m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_KEEP_UNCHANGED
	m.NormalizePath = wrapperspb.Bool(p != PathNone)
	switch p {
	case PathMergeSlashes:
		m.MergeSlashes = true
	case PathDecodeAndMergeSlashes:
		m.MergeSlashes = true
		m.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_UNESCAPE_AND_FORWARD
	}
}
