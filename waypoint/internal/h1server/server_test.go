package h1server

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

// FuzzResponseHead: whatever the handler puts in the header, the head the
// server writes parses back with the same status and fields, and nothing
// in a value adds a field of its own.
func FuzzResponseHead(f *testing.F) {
	f.Add(200, "X-Name", "value", "GET", 1, false)
	f.Add(404, "X-Inject", "a\r\nSet-Cookie: x=1", "HEAD", 0, true)
	f.Add(204, "Content-Length", "12", "GET", 1, false)
	f.Add(599, "Trailer", "X-T", "POST", 1, true)
	f.Fuzz(func(t *testing.T, code int, name, value, method string, minor int, flush bool) {
		if code < 200 || code > 999 || !validMethodForTest(method) {
			t.Skip()
		}
		req := &http.Request{Method: method, ProtoMajor: 1, ProtoMinor: minor & 1, Header: http.Header{}}
		w := &Response{c: &h1Server{}, req: req, header: http.Header{}, length: -1}
		w.header[name] = []string{value}
		w.WriteHeader(code)
		if flush {
			w.writeHead(false)
		} else {
			w.finish(false)
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(w.c.out)), req)
		if err != nil {
			if httpguts.ValidHeaderFieldName(name) && !strings.HasPrefix(name, http.TrailerPrefix) && isFraming(name) {
				t.Skip() // a length or coding of the handler's own that does not parse
			}
			t.Fatalf("%q: %v", w.c.out, err)
		}
		if resp.StatusCode != code {
			t.Errorf("status %d, want %d", resp.StatusCode, code)
		}
		for k := range resp.Header {
			switch {
			case k == "Date", isFraming(k):
			case k == http.CanonicalHeaderKey(name):
			default:
				t.Errorf("%q: field %s appeared from nowhere", w.c.out, k)
			}
		}
	})
}

func isFraming(k string) bool {
	switch http.CanonicalHeaderKey(k) {
	case "Content-Length", "Transfer-Encoding", "Connection", "Trailer":
		return true
	}
	return false
}

func validMethodForTest(m string) bool {
	return m != "" && strings.IndexFunc(m, func(r rune) bool { return r < 'A' || r > 'Z' }) < 0
}

// TestAdoptHeader: an adopted header is the one written, with the fields
// set before that it lacks; once the status is set nothing is adopted.
func TestAdoptHeader(t *testing.T) {
	req := &http.Request{Method: "GET", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{}}
	w := &Response{c: &h1Server{}, req: req, length: -1}
	w.Header().Set("X-Own", "1")
	w.Header().Set("X-Both", "mine")
	if !w.AdoptHeader(http.Header{"X-Both": {"theirs"}, "X-Up": {"u"}}) {
		t.Fatal("AdoptHeader before the status refused")
	}
	w.Header().Set("X-After", "a")
	w.WriteHeader(http.StatusAccepted)
	if w.AdoptHeader(http.Header{"X-Late": {"l"}}) {
		t.Fatal("AdoptHeader after the status took the header")
	}
	w.finish(false)
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(w.c.out)), req)
	if err != nil {
		t.Fatalf("%q: %v", w.c.out, err)
	}
	want := map[string]string{"X-Own": "1", "X-Both": "theirs", "X-Up": "u", "X-After": "a", "X-Late": ""}
	for k, v := range want {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q (head %q)", k, got, v, w.c.out)
		}
	}
}
