package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/weftmesh/weft/webhook/admit"
)

// blockingAdmitter holds every request until release is closed.
type blockingAdmitter struct {
	entered atomic.Int32
	release chan struct{}
}

func newBlockingAdmitter() *blockingAdmitter { return &blockingAdmitter{release: make(chan struct{})} }

func (b *blockingAdmitter) Validate(ctx context.Context, _ *admissionv1.AdmissionRequest) admit.Result {
	b.entered.Add(1)
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return admit.Result{Decision: admit.Allow, Reason: "ok"}
}

func (b *blockingAdmitter) Mutate(ctx context.Context, req *admissionv1.AdmissionRequest) admit.Result {
	return b.Validate(ctx, req)
}

// answer is one HTTP exchange seen by a client goroutine.
type answer struct {
	code   int
	header http.Header
	body   string
	err    error
}

// post sends body to /validate and gives up after timeout.
func (ls *liveServer) post(client *http.Client, body []byte, timeout time.Duration) answer {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", ls.url+PathValidate, bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestServerConcurrencyLimit holds MaxConcurrentReviews slow reviews in
// the handler: one more gets 429 with Retry-After at once, and the slots
// come back when the slow ones finish.
func TestServerConcurrencyLimit(t *testing.T) {
	const n = 3
	ba := newBlockingAdmitter()
	ls := startServer(t, serverOpts{adm: ba, config: func(c *Config) { c.MaxConcurrentReviews = n }})
	review := namespaceReview(t, "shop", "ambient", false)
	slow := make(chan answer, n)
	for range n {
		go func() { slow <- ls.post(ls.client, review, 10*time.Second) }()
	}
	if !waitFor(5*time.Second, func() bool { return ba.entered.Load() == n }) {
		t.Fatalf("%d of %d slow reviews reached the handler", ba.entered.Load(), n)
	}
	extra := ls.post(ls.client, review, 2*time.Second)
	if extra.err != nil || extra.code != http.StatusTooManyRequests || extra.header.Get("Retry-After") == "" {
		t.Errorf("review %d of %d: HTTP %d %v (Retry-After %q) %q, want 429 with Retry-After; entered the handler: %d",
			n+1, n, extra.code, extra.err, extra.header.Get("Retry-After"), extra.body, ba.entered.Load())
	}
	close(ba.release)
	for range n {
		if a := <-slow; a.err != nil || a.code != 200 {
			t.Errorf("a slow review: HTTP %d %v", a.code, a.err)
		}
	}
	if a := ls.post(ls.client, review, 5*time.Second); a.code != 200 {
		t.Errorf("after the slow reviews: HTTP %d %v %s", a.code, a.err, a.body)
	}
	if got := testutil.ToFloat64(ls.metrics.httpErrors.WithLabelValues("429")); got != 1 {
		t.Errorf("%v 429s counted, want 1", got)
	}
	if got := testutil.ToFloat64(ls.metrics.overload.WithLabelValues("reviews")); got != 1 {
		t.Errorf("%v overload rejections counted for reviews, want 1", got)
	}
}

// bigReview is a Namespace review whose object carries an annotation of
// about size bytes: the decoded request holds that much.
func bigReview(t testing.TB, name string, size int) []byte {
	small := ruleCase{name: name, kind: "v1/Namespace",
		object: fmt.Sprintf("metadata: {name: %s, annotations: {pad: PAD}}", name)}.review(t)
	return bytes.Replace(small, []byte(`"PAD"`), []byte(`"`+strings.Repeat("x", size)+`"`), 1)
}

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestServerInflightBytesBounded sends many big reviews at once to a slow
// handler: only MaxInflightBytes of them are taken in, the rest get 429 at
// once, and the memory held stays within the bound.
func TestServerInflightBytesBounded(t *testing.T) {
	const size, parallel = 5 << 20, 12
	ba := newBlockingAdmitter()
	ls := startServer(t, serverOpts{adm: ba, config: func(c *Config) {
		c.MaxInflightBytes = 2*size + 1<<20 // room for two
		c.MaxConcurrentReviews = 100
	}})
	bodies := make([][]byte, parallel)
	for i := range bodies {
		bodies[i] = bigReview(t, fmt.Sprintf("big-%d", i), size)
	}
	base := heapAlloc()
	answers := make(chan answer, parallel)
	var answered atomic.Int32
	var wg sync.WaitGroup
	for i := range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := ls.post(ls.client, bodies[i], 30*time.Second)
			answered.Add(1)
			answers <- a
		}()
	}
	settled := waitFor(20*time.Second, func() bool { return ba.entered.Load()+answered.Load() == parallel })
	held := int64(heapAlloc()) - int64(base)
	entered, early := ba.entered.Load(), answered.Load()
	close(ba.release)
	wg.Wait()
	close(answers)
	if !settled {
		t.Fatalf("not settled after 20 s: %d in the handler, %d answered", entered, early)
	}
	if entered != 2 {
		t.Errorf("%d reviews of %d MiB in the handler at once, want 2 (MaxInflightBytes)", entered, size>>20)
	}
	codes := map[int]int{}
	for a := range answers {
		codes[a.code]++
	}
	if codes[http.StatusTooManyRequests] != parallel-2 || codes[200] != 2 {
		t.Errorf("answers by status %v, want 2×200 and %d×429", codes, parallel-2)
	}
	if held > 40<<20 {
		t.Errorf("the heap grew by %d MiB with %d big reviews sent at once; the bound allows about %d MiB",
			held>>20, parallel, 2*2*size>>20)
	}
	if got := testutil.ToFloat64(ls.metrics.overload.WithLabelValues("bytes")); got != parallel-2 {
		t.Errorf("%v overload rejections counted for bytes, want %d", got, parallel-2)
	}
}

// TestServerSlowBodyReleasesSlot starts a review whose body never ends, on
// HTTP/2 and on HTTP/1.1: the read deadline frees its slot, so it cannot
// keep the one slot there is.
func TestServerSlowBodyReleasesSlot(t *testing.T) {
	ls := startServer(t, serverOpts{config: func(c *Config) {
		c.MaxConcurrentReviews = 1
		c.ReadTimeout = 500 * time.Millisecond
	}})
	review := namespaceReview(t, "shop", "ambient", false)
	check := func(t *testing.T, started time.Time) {
		t.Helper()
		var last answer
		ok := waitFor(5*time.Second, func() bool {
			last = ls.post(ls.client, review, time.Second)
			return last.code == 200
		})
		if !ok {
			t.Fatalf("a review after a stalled one: HTTP %d %v %s", last.code, last.err, last.body)
		}
		if d := time.Since(started); d > 3*time.Second {
			t.Errorf("the stalled body held the slot for %v; ReadTimeout is 500ms", d)
		}
	}

	t.Run("HTTP/2", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		req, _ := http.NewRequest("POST", ls.url+PathValidate, pr)
		req.Header.Set("Content-Type", "application/json")
		req.ContentLength = 4096
		done := make(chan answer, 1)
		go func() {
			resp, err := ls.client.Do(req)
			if err != nil {
				done <- answer{err: err}
				return
			}
			resp.Body.Close()
			done <- answer{code: resp.StatusCode}
		}()
		pw.Write(review[:10])
		started := time.Now()
		check(t, started)
		if a := <-done; a.code == 200 {
			t.Errorf("the stalled review was answered 200")
		}
	})

	t.Run("HTTP/1.1", func(t *testing.T) {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(ls.url, "https://"),
			&tls.Config{RootCAs: ls.roots, ServerName: serverName, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /validate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n%s", review[:10])
		started := time.Now()
		check(t, started)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(conn)
		if bytes.HasPrefix(b, []byte("HTTP/1.1 200")) {
			t.Errorf("the stalled review was answered %q", b)
		}
	})
}

// TestServerUnknownLengthReservesMax sends a body without a declared
// length: it counts as MaxBodyBytes, so with room for one such body a
// second review waits for nothing and gets 429.
func TestServerUnknownLengthReservesMax(t *testing.T) {
	ba := newBlockingAdmitter()
	ls := startServer(t, serverOpts{adm: ba, maxBody: 1 << 20, config: func(c *Config) { c.MaxInflightBytes = 1 << 20 }})
	review := namespaceReview(t, "shop", "ambient", false)
	done := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("POST", ls.url+PathValidate, io.MultiReader(bytes.NewReader(review))) // no length
		req.Header.Set("Content-Type", "application/json")
		resp, err := ls.client.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		resp.Body.Close()
		done <- answer{code: resp.StatusCode}
	}()
	if !waitFor(5*time.Second, func() bool { return ba.entered.Load() == 1 }) {
		t.Fatal("the review without a length never reached the handler")
	}
	if a := ls.post(ls.client, review, 2*time.Second); a.code != http.StatusTooManyRequests {
		t.Errorf("a second review beside one of unknown length: HTTP %d %v, want 429", a.code, a.err)
	}
	close(ba.release)
	if a := <-done; a.code != 200 {
		t.Errorf("the review without a length: HTTP %d %v", a.code, a.err)
	}
}

// TestServerBodyCapWithoutLength sends more than MaxBodyBytes without
// declaring a length: the cap still stops the read with 413.
func TestServerBodyCapWithoutLength(t *testing.T) {
	ls := startServer(t, serverOpts{maxBody: 1 << 20})
	body := append(namespaceReview(t, "shop", "ambient", false), bytes.Repeat([]byte(" "), 2<<20)...)
	code, got := ls.do(t, "POST", PathValidate, "application/json", io.MultiReader(bytes.NewReader(body)))
	if code != http.StatusRequestEntityTooLarge {
		t.Errorf("HTTP %d %q, want 413", code, got)
	}
	if code, got := ls.do(t, "POST", PathValidate, "application/json", bytes.NewReader(body)); code != http.StatusRequestEntityTooLarge {
		t.Errorf("declared length: HTTP %d %q, want 413", code, got)
	}
}

// TestServerOverloadRetried checks the 429 against the REST client the API
// server calls webhooks with: it waits Retry-After and sends the review
// again, which goes through once a slot is free.
func TestServerOverloadRetried(t *testing.T) {
	ba := newBlockingAdmitter()
	ls := startServer(t, serverOpts{adm: ba, config: func(c *Config) { c.MaxConcurrentReviews = 1 }})
	review := namespaceReview(t, "shop", "ambient", false)
	held := make(chan answer, 1)
	go func() { held <- ls.post(ls.client, review, 10*time.Second) }()
	if !waitFor(5*time.Second, func() bool { return ba.entered.Load() == 1 }) {
		t.Fatal("the first review never reached the handler")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ls.roots, ServerName: serverName}}
	defer tr.CloseIdleConnections()
	rc, err := rest.UnversionedRESTClientFor(&rest.Config{Host: ls.url, Transport: tr,
		ContentConfig: rest.ContentConfig{NegotiatedSerializer: scheme.Codecs.WithoutConversion()}})
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { close(ba.release) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	started := time.Now()
	body, err := rc.Post().AbsPath(PathValidate).SetHeader("Content-Type", "application/json").Body(review).DoRaw(ctx)
	if err != nil {
		t.Fatalf("the REST client's review: %v", err)
	}
	if resp := decodeReview(t, body); !resp.Allowed {
		t.Errorf("response %+v", resp)
	}
	if time.Since(started) < 900*time.Millisecond {
		t.Errorf("answered after %v: the first attempt was not refused", time.Since(started))
	}
	if got := testutil.ToFloat64(ls.metrics.overload.WithLabelValues("reviews")); got < 1 {
		t.Errorf("%v overload rejections, want the first attempt's", got)
	}
	<-held
}
