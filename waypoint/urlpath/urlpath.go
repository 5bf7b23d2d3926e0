// Package urlpath normalizes the path of an HTTP request target as Envoy's
// http_connection_manager does before routing and authorization, so that
// a policy on a path sees the path the application will act on.
//
// Three steps, each switched on by Options, run in this order (Envoy's):
//
//  1. Escaped slashes (path_with_escaped_slashes_action): %2F, %2f, %5C and
//     %5c are kept, refused, or decoded into "/" and "\".
//  2. RFC 3986 normalization (normalize_path): percent-encoded unreserved
//     characters (ALPHA, DIGIT, "-", ".", "_", "~"; RFC 3986 section 2.3)
//     are decoded, the hex digits of the other percent-encodings are made
//     upper case (section 6.2.2.1), characters a path may not hold are
//     percent-encoded, "\" becomes "/" (as browsers and Envoy do), and dot
//     segments are removed (section 5.2.4). An encoded NUL (%00) or a "%"
//     not followed by two hex digits is refused.
//  3. Merging slashes (merge_slashes): each run of "/" becomes one "/".
//
// Istio's meshConfig.pathNormalization settings are these combinations:
// NONE is none of them, BASE step 2, MERGE_SLASHES steps 2 and 3, and
// DECODE_AND_MERGE_SLASHES all three with the escaped slashes decoded.
//
// The path given is the request target's path alone: the caller removes
// the query and the fragment first, and the query is never normalized.
// The result of a normalization is a fixed point: normalizing it again with
// the same options gives it back.
package urlpath

import (
	"errors"
	"fmt"
	"strings"
)

// EscapedSlashes is what becomes of %2F and %5C in a path (Envoy's
// HttpConnectionManager.PathWithEscapedSlashesAction).
type EscapedSlashes int

// The actions on escaped slashes.
const (
	// KeepEscapedSlashes leaves them (KEEP_UNCHANGED, and Envoy's
	// IMPLEMENTATION_SPECIFIC_DEFAULT).
	KeepEscapedSlashes EscapedSlashes = iota
	// RejectEscapedSlashes refuses the request (REJECT_REQUEST).
	RejectEscapedSlashes
	// UnescapeAndRedirect decodes them; the caller redirects the client to
	// the result (UNESCAPE_AND_REDIRECT).
	UnescapeAndRedirect
	// UnescapeAndForward decodes them (UNESCAPE_AND_FORWARD).
	UnescapeAndForward
)

// Options select the normalization. The zero value changes nothing.
type Options struct {
	// RFC3986 is Envoy's normalize_path. Default false.
	RFC3986 bool
	// MergeSlashes is Envoy's merge_slashes. Default false.
	MergeSlashes bool
	// EscapedSlashes is Envoy's path_with_escaped_slashes_action. Default
	// KeepEscapedSlashes.
	EscapedSlashes EscapedSlashes
}

// Errors of Normalize; either means the request is answered 400.
var (
	ErrInvalid      = errors.New("invalid path")
	ErrEscapedSlash = errors.New("escaped slash (%2F or %5C) in the path")

	errNotAbsolute   = fmt.Errorf("%w: it does not begin with /", ErrInvalid)
	errInvalidEscape = fmt.Errorf("%w: a %% is not followed by two hex digits", ErrInvalid)
	errNUL           = fmt.Errorf("%w: it holds a NUL", ErrInvalid)
)

// Normalize returns path normalized as o asks. Its errors wrap ErrInvalid
// or are ErrEscapedSlash.
func Normalize(path string, o Options) (string, error) {
	if HasEscapedSlash(path) {
		switch o.EscapedSlashes {
		case RejectEscapedSlashes:
			return "", ErrEscapedSlash
		case UnescapeAndRedirect, UnescapeAndForward:
			path = unescapeSlashes(path)
		}
	}
	if o.RFC3986 {
		var err error
		if path, err = canonical(path); err != nil {
			return "", err
		}
	}
	if o.MergeSlashes {
		path = mergeSlashes(path)
	}
	return path, nil
}

// HasEscapedSlash reports whether path holds %2F or %5C in either case.
func HasEscapedSlash(path string) bool {
	for i := 0; i+2 < len(path); i++ {
		if path[i] == '%' && escapedSlash(path[i+1], path[i+2]) {
			return true
		}
	}
	return false
}

func escapedSlash(a, b byte) bool {
	return (a == '2' && (b == 'f' || b == 'F')) || (a == '5' && (b == 'c' || b == 'C'))
}

func unescapeSlashes(path string) string {
	var b strings.Builder
	b.Grow(len(path))
	for i := 0; i < len(path); i++ {
		if path[i] == '%' && i+2 < len(path) && escapedSlash(path[i+1], path[i+2]) {
			if path[i+1] == '2' {
				b.WriteByte('/')
			} else {
				b.WriteByte('\\')
			}
			i += 2
			continue
		}
		b.WriteByte(path[i])
	}
	return b.String()
}

func mergeSlashes(path string) string {
	if !strings.Contains(path, "//") {
		return path
	}
	var b strings.Builder
	b.Grow(len(path))
	for i := 0; i < len(path); i++ {
		if path[i] == '/' && i > 0 && path[i-1] == '/' {
			continue
		}
		b.WriteByte(path[i])
	}
	return b.String()
}

// canonical is step 2: the encoding made canonical, then the dot segments
// removed.
func canonical(path string) (string, error) {
	if path == "" || (path[0] != '/' && path[0] != '\\') {
		return "", errNotAbsolute
	}
	enc, err := canonicalEncoding(path)
	if err != nil {
		return "", err
	}
	return removeDotSegments(enc), nil
}

const upperHex = "0123456789ABCDEF"

// canonicalEncoding decodes percent-encoded unreserved characters,
// upper-cases the other encodings, encodes what a path may not hold and
// turns "\" into "/".
func canonicalEncoding(path string) (string, error) {
	b := make([]byte, 0, len(path)+8)
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c == '%':
			if i+2 >= len(path) || !isHex(path[i+1]) || !isHex(path[i+2]) {
				return "", errInvalidEscape
			}
			v := unhex(path[i+1])<<4 | unhex(path[i+2])
			i += 2
			switch {
			case v == 0:
				return "", errNUL
			case unreserved(v):
				b = append(b, v)
			default:
				b = append(b, '%', upperHex[v>>4], upperHex[v&15])
			}
		case c == 0:
			return "", errNUL
		case c == '\\':
			b = append(b, '/')
		case pathChar(c):
			b = append(b, c)
		default:
			b = append(b, '%', upperHex[c>>4], upperHex[c&15])
		}
	}
	return string(b), nil
}

// unreserved reports RFC 3986 section 2.3's unreserved characters.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// pathChar reports the characters a path holds as they are: pchar (RFC
// 3986 section 3.3: unreserved, sub-delims, ":" and "@") and "/".
func pathChar(c byte) bool {
	if unreserved(c) {
		return true
	}
	switch c {
	case '/', ':', '@', '!', '$', '&', '\'', '(', ')', '*', '+', ',', ';', '=':
		return true
	}
	return false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// removeDotSegments is RFC 3986 section 5.2.4 for a path that begins with
// "/": a "." segment is dropped, a ".." segment drops itself and the
// segment before it (none above the root), and a path that ended in a dot
// segment ends in "/". Empty segments are segments like any other.
func removeDotSegments(path string) string {
	if !strings.Contains(path, ".") {
		return path
	}
	segs := strings.Split(path[1:], "/")
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	return "/" + strings.Join(out, "/")
}
