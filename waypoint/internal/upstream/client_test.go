package upstream

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestWriteRequest: an upstream reads what writeRequest writes as what
// net/http's Request.Write would have sent, but for its User-Agent.
func TestWriteRequest(t *testing.T) {
	mk := func(method, target, body string, length int64, hdr http.Header, trailer http.Header) func() *http.Request {
		return func() *http.Request {
			u, _ := url.Parse(target)
			r := &http.Request{Method: method, URL: u, Host: u.Host, Header: hdr.Clone(), ContentLength: length, Trailer: trailer.Clone()}
			switch {
			case body == "" && length == 0:
				r.Body = http.NoBody
			case length < 0:
				r.Body = io.NopCloser(io.MultiReader(strings.NewReader(body[:len(body)/2]), strings.NewReader(body[len(body)/2:])))
			default:
				r.Body = io.NopCloser(strings.NewReader(body))
			}
			return r
		}
	}
	for _, tc := range []struct {
		name string
		req  func() *http.Request
	}{
		{"get", mk("GET", "http://svc.ns/a/b?c=d", "", 0, http.Header{"Accept": {"*/*"}, "X-Two": {"1", "2"}}, nil)},
		{"post", mk("POST", "http://svc.ns/up", "hello", 5, http.Header{"Content-Type": {"text/plain"}}, nil)},
		{"post empty", mk("POST", "http://svc.ns/up", "", 0, nil, nil)},
		{"delete", mk("DELETE", "http://svc.ns/x", "", 0, nil, nil)},
		{"chunked", mk("PUT", "http://svc.ns/c", "abcdefgh", -1, nil, http.Header{"X-Sum": nil})},
		{"escaped path", mk("GET", "http://svc.ns/a%2Fb/%20c", "", 0, nil, nil)},
		{"user agent", mk("GET", "http://svc.ns/", "", 0, http.Header{"User-Agent": {"curl/8"}}, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ours, theirs bytes.Buffer
			bw := bufio.NewWriter(&ours)
			r := tc.req()
			if r.Trailer != nil {
				r.Body = trailerSetter{r.Body, r.Trailer}
			}
			if err := writeRequest(bw, r); err != nil {
				t.Fatal(err)
			}
			bw.Flush()
			r = tc.req()
			if r.Trailer != nil {
				r.Body = trailerSetter{r.Body, r.Trailer}
			}
			if r.Header.Get("User-Agent") == "" {
				r.Header = r.Header.Clone()
				if r.Header == nil {
					r.Header = http.Header{}
				}
				r.Header.Set("User-Agent", "") // none, as writeRequest
			}
			if err := r.Write(&theirs); err != nil {
				t.Fatal(err)
			}
			a, b := parse(t, ours.Bytes()), parse(t, theirs.Bytes())
			if diff := cmp.Diff(b, a); diff != "" {
				t.Errorf("as read upstream, writeRequest (+) differs from Request.Write (-):\n%s\n%q\n%q", diff, ours.String(), theirs.String())
			}
		})
	}
}

// trailerSetter sets the trailer values once the body is read, as a
// request body reader does.
type trailerSetter struct {
	io.ReadCloser
	trailer http.Header
}

func (b trailerSetter) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.trailer.Set("X-Sum", "8")
	}
	return n, err
}

type readBack struct {
	Method, RequestURI, Host string
	Header, Trailer          http.Header
	ContentLength            int64
	TransferEncoding         []string
	Body                     string
}

func parse(t *testing.T, raw []byte) readBack {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	return readBack{r.Method, r.RequestURI, r.Host, r.Header, r.Trailer, r.ContentLength, r.TransferEncoding, string(b)}
}

// TestClosedBeforeDelivery: a request that cannot be repeated blindly (a
// POST) may go once more only when its pooled connection closed before the
// upstream received any of it — the race of an upstream's idle close with
// a request — and never when the upstream received it and closed without
// answering.
func TestClosedBeforeDelivery(t *testing.T) {
	for _, tc := range []struct {
		name      string
		readFirst bool // the upstream reads the request before it closes
		wantAgain bool
	}{
		{"closed before the request arrived", false, true},
		{"closed after reading the request", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				c, err := ln.Accept()
				if err == nil {
					accepted <- c
				}
			}()
			nc, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			sc := <-accepted
			closed := make(chan struct{})
			if tc.readFirst {
				go func() {
					defer close(closed)
					br := bufio.NewReader(sc)
					if req, err := http.ReadRequest(br); err == nil {
						io.Copy(io.Discard, req.Body)
					}
					sc.Close()
				}()
			} else {
				sc.Close()
				close(closed)
				// The upstream's FIN is in before the request is written,
				// as when an idle close races a request past the liveness
				// check.
				for deadline := time.Now().Add(5 * time.Second); alive(nc); time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the upstream's close never arrived")
					}
				}
			}
			c := newH1Conn(nc, nil)
			req, _ := http.NewRequest("POST", "http://svc.ns/orders", io.NopCloser(strings.NewReader("one order")))
			recordBody(req, maxReplayBody)
			_, again, err := c.roundTrip(context.Background(), req, func() {})
			<-closed
			if err == nil {
				t.Fatal("the round trip succeeded on a closed connection")
			}
			if again != tc.wantAgain {
				t.Errorf("again = %v, want %v (err %v)", again, tc.wantAgain, err)
			}
			if tc.wantAgain {
				if !rewind(req) {
					t.Fatal("the recorded body cannot be replayed")
				}
				b, _ := io.ReadAll(req.Body)
				if string(b) != "one order" {
					t.Errorf("replayed body %q", b)
				}
			}
		})
	}
}

// TestBufferBody: a body of small declared length is read whole before the
// first attempt, so that any attempt can send it again, however early the
// last one failed; a body shorter than it declares is an error.
func TestBufferBody(t *testing.T) {
	req, _ := http.NewRequest("POST", "http://svc.ns/orders", io.NopCloser(strings.NewReader("one order")))
	req.ContentLength = int64(len("one order"))
	if err := bufferBody(req); err != nil {
		t.Fatal(err)
	}
	for attempt := range 3 {
		if attempt > 0 && !rewind(req) {
			t.Fatalf("attempt %d: the body cannot be replayed", attempt)
		}
		if b, _ := io.ReadAll(req.Body); string(b) != "one order" {
			t.Errorf("attempt %d sent %q", attempt, b)
		}
	}

	short, _ := http.NewRequest("POST", "http://svc.ns/orders", io.NopCloser(strings.NewReader("half")))
	short.ContentLength = 10
	err := bufferBody(short)
	if err == nil || !strings.Contains(err.Error(), "10 bytes declared") {
		t.Errorf("a body shorter than declared: %v", err)
	}
}
