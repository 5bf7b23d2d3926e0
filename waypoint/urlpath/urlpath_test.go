package urlpath

import (
	"errors"
	"strings"
	"testing"
)

var (
	none    = Options{}
	base    = Options{RFC3986: true}
	merge   = Options{RFC3986: true, MergeSlashes: true}
	decode  = Options{RFC3986: true, MergeSlashes: true, EscapedSlashes: UnescapeAndForward}
	reject  = Options{RFC3986: true, EscapedSlashes: RejectEscapedSlashes}
	allOpts = []Options{none, base, merge, decode, reject,
		{MergeSlashes: true}, {EscapedSlashes: UnescapeAndForward}, {EscapedSlashes: UnescapeAndRedirect, MergeSlashes: true}}
)

// TestRemoveDotSegments: RFC 3986 section 5.2.4's examples, and the paths
// of section 5.4's reference resolution examples (base /b/c/d;p) once
// merged, before their dot segments are removed.
func TestRemoveDotSegments(t *testing.T) {
	for in, want := range map[string]string{
		"/a/b/c/./../../g":    "/a/g",
		"/mid/content=5/../6": "/mid/6",
		"/b/c/g":              "/b/c/g",
		"/b/c/./g":            "/b/c/g",
		"/b/c/g/":             "/b/c/g/",
		"/b/c/.":              "/b/c/",
		"/b/c/./":             "/b/c/",
		"/b/c/..":             "/b/",
		"/b/c/../":            "/b/",
		"/b/c/../g":           "/b/g",
		"/b/c/../..":          "/",
		"/b/c/../../":         "/",
		"/b/c/../../g":        "/g",
		"/b/c/../../../g":     "/g",
		"/b/c/../../../../g":  "/g",
		"/./g":                "/g",
		"/../g":               "/g",
		"/b/c/g.":             "/b/c/g.",
		"/b/c/.g":             "/b/c/.g",
		"/b/c/g..":            "/b/c/g..",
		"/b/c/..g":            "/b/c/..g",
		"/b/c/./../g":         "/b/g",
		"/b/c/./g/.":          "/b/c/g/",
		"/b/c/g/./h":          "/b/c/g/h",
		"/b/c/g/../h":         "/b/c/h",
		"/b/c/g;x=1/./y":      "/b/c/g;x=1/y",
		"/b/c/g;x=1/../y":     "/b/c/y",
		"/":                   "/",
		"/.":                  "/",
		"/..":                 "/",
		"/../":                "/",
		"/a//../b":            "/a/b",
		"//..":                "/",
		"/..//a":              "//a",
		"/a/.../b":            "/a/.../b",
	} {
		if got := removeDotSegments(in); got != want {
			t.Errorf("removeDotSegments(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestNormalize: the three steps and their combinations, with Envoy's
// cases (normalize_path, merge_slashes, path_with_escaped_slashes_action).
func TestNormalize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		o    Options
		want string
		err  error
	}{
		// NONE changes nothing, not even what RFC 3986 would refuse.
		{"/x/../admin", none, "/x/../admin", nil},
		{"/%61dmin", none, "/%61dmin", nil},
		{"/%00", none, "/%00", nil},
		{"/%zz", none, "/%zz", nil},
		{"//a", none, "//a", nil},
		// BASE: unreserved characters decoded, the rest upper-cased.
		{"/%61dmin", base, "/admin", nil},
		{"/%41%42%7e%2D%5f%2e", base, "/AB~-_.", nil},
		{"/%7E", base, "/~", nil},
		{"/%2f", base, "/%2F", nil},
		{"/%5c", base, "/%5C", nil},
		{"/%3a%40%21", base, "/%3A%40%21", nil},
		{"/%25", base, "/%25", nil},
		{"/%252F", base, "/%252F", nil},
		{"/caf%c3%a9", base, "/caf%C3%A9", nil},
		// Characters a path may not hold are encoded.
		{"/a b", base, "/a%20b", nil},
		{"/a\"<>^`{|}b", base, "/a%22%3C%3E%5E%60%7B%7C%7Db", nil},
		{"/caf\xc3\xa9", base, "/caf%C3%A9", nil},
		{"/a[b]", base, "/a%5Bb%5D", nil},
		{"/a:b@c!$&'()*+,;=", base, "/a:b@c!$&'()*+,;=", nil},
		// Backslashes are slashes.
		{`/a\b`, base, "/a/b", nil},
		{`\a`, base, "/a", nil},
		{`/x\..\admin`, base, "/admin", nil},
		// Dot segments, also encoded ones.
		{"/a/../b", base, "/b", nil},
		{"/a/./b", base, "/a/b", nil},
		{"/a/%2e%2e/b", base, "/b", nil},
		{"/a/.%2E/b", base, "/b", nil},
		{"/a/%2E/b", base, "/a/b", nil},
		{"/a/%2e%2e", base, "/", nil},
		{"/a/%2e", base, "/a/", nil},
		{"/a/..%2f", base, "/a/..%2F", nil},
		{"//a/../b", base, "//b", nil},
		// Refused.
		{"/a%00b", base, "", ErrInvalid},
		{"/a\x00b", base, "", ErrInvalid},
		{"/%", base, "", ErrInvalid},
		{"/%4", base, "", ErrInvalid},
		{"/%zz", base, "", ErrInvalid},
		{"/%0g", base, "", ErrInvalid},
		{"/%%41", base, "", ErrInvalid},
		{"a/b", base, "", ErrInvalid},
		{"", base, "", ErrInvalid},
		// MERGE_SLASHES: after the dot segments are gone.
		{"//admin", merge, "/admin", nil},
		{"//a//b///", merge, "/a/b/", nil},
		{"/x/..//admin", merge, "/admin", nil},
		{"/a/%2F/b", merge, "/a/%2F/b", nil},
		{"//a", Options{MergeSlashes: true}, "/a", nil},
		// DECODE_AND_MERGE_SLASHES: escaped slashes first.
		{"/a%2Fb", decode, "/a/b", nil},
		{"/a%2fb", decode, "/a/b", nil},
		{"/a%5Cb", decode, "/a/b", nil},
		{"/a%5cb", decode, "/a/b", nil},
		{"/x%2F..%2Fadmin", decode, "/admin", nil},
		{"/%2F%2Fadmin", decode, "/admin", nil},
		{"/ADMIN%2F..", decode, "/", nil},
		{"/a%252Fb", decode, "/a%252Fb", nil},
		{"/a%2Fb", Options{EscapedSlashes: UnescapeAndForward}, "/a/b", nil},
		{"/a%5Cb", Options{EscapedSlashes: UnescapeAndForward}, `/a\b`, nil},
		{"/a%2Fb", Options{EscapedSlashes: UnescapeAndRedirect, RFC3986: true}, "/a/b", nil},
		// REJECT_REQUEST.
		{"/a%2fb", reject, "", ErrEscapedSlash},
		{"/a%5Cb", reject, "", ErrEscapedSlash},
		{"/a%252fb", reject, "/a%252fb", nil},
	} {
		got, err := Normalize(tc.in, tc.o)
		if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) || got != tc.want {
			t.Errorf("Normalize(%q, %+v) = %q, %v; want %q, %v", tc.in, tc.o, got, err, tc.want, tc.err)
		}
	}
}

func TestHasEscapedSlash(t *testing.T) {
	for in, want := range map[string]bool{"/a%2Fb": true, "/a%2fb": true, "/%5c": true, "/%5C": true, "/%252F": false, "/%2": false, "/a/b": false, "%2F": true} {
		if got := HasEscapedSlash(in); got != want {
			t.Errorf("HasEscapedSlash(%q) = %v", in, got)
		}
	}
}

// FuzzNormalize checks, for every combination Istio uses and a few more:
// no panic; the result normalized again is itself; with RFC 3986 on it
// begins with "/", holds no dot segment, no "\" and only canonical
// percent-encodings of characters that are not unreserved; with slashes
// merged it holds no "//"; with escaped slashes decoded it holds none.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"/", "/a/../b", "/%2e%2E/x", `/a\..\b`, "//a//", "/%2F%5c", "/%00", "/%", "/caf\xc3\xa9", "/a/./b/", "/..//a", "/%252F"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		for _, o := range allOpts {
			out, err := Normalize(in, o)
			if err != nil {
				if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrEscapedSlash) {
					t.Fatalf("Normalize(%q, %+v): unexpected error %v", in, o, err)
				}
				continue
			}
			again, err := Normalize(out, o)
			if err != nil || again != out {
				t.Fatalf("Normalize(%q, %+v) = %q, but normalizing that gives %q, %v", in, o, out, again, err)
			}
			if o.RFC3986 {
				checkCanonical(t, in, o, out)
			}
			if o.MergeSlashes && strings.Contains(out, "//") {
				t.Fatalf("Normalize(%q, %+v) = %q holds //", in, o, out)
			}
			if o.EscapedSlashes != KeepEscapedSlashes && HasEscapedSlash(out) {
				t.Fatalf("Normalize(%q, %+v) = %q holds an escaped slash", in, o, out)
			}
		}
	})
}

func checkCanonical(t *testing.T, in string, o Options, out string) {
	t.Helper()
	if !strings.HasPrefix(out, "/") {
		t.Fatalf("Normalize(%q, %+v) = %q does not begin with /", in, o, out)
	}
	for _, seg := range strings.Split(out, "/") {
		if seg == "." || seg == ".." {
			t.Fatalf("Normalize(%q, %+v) = %q holds a dot segment", in, o, out)
		}
	}
	for i := 0; i < len(out); i++ {
		c := out[i]
		switch {
		case c == '%':
			if i+2 >= len(out) || !strings.ContainsRune(upperHex, rune(out[i+1])) || !strings.ContainsRune(upperHex, rune(out[i+2])) {
				t.Fatalf("Normalize(%q, %+v) = %q: bad encoding at %d", in, o, out, i)
			}
			if v := unhex(out[i+1])<<4 | unhex(out[i+2]); unreserved(v) || v == 0 {
				t.Fatalf("Normalize(%q, %+v) = %q: %%%s should not be encoded", in, o, out, out[i+1:i+3])
			}
			i += 2
		case !pathChar(c):
			t.Fatalf("Normalize(%q, %+v) = %q: %q should be encoded", in, o, out, c)
		}
	}
}
