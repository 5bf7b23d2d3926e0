package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftmesh/weft/webhook/audit"
)

// benchRequest is one request of the benchmark mix.
type benchRequest struct {
	path string
	body []byte
}

// benchMix is the rule cases' requests, validate and mutate, each with its
// own uid per use.
func benchMix(b *testing.B) []benchRequest {
	var mix []benchRequest
	for _, tc := range ruleCases {
		path := PathValidate
		if tc.webhook == "mutate" {
			path = PathMutate
		}
		mix = append(mix, benchRequest{path, tc.review(b)})
	}
	return mix
}

// withUID returns body with its request uid replaced.
func withUID(b *testing.B, body []byte, uid string) []byte {
	var r admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &r); err != nil {
		b.Fatal(err)
	}
	r.Request.UID = types.UID("bench-" + uid)
	out, err := json.Marshal(r)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// paced sends n requests at rate per second, open loop (each on its own
// goroutine at its scheduled time), and returns every latency.
func paced(b *testing.B, n int, rate float64, send func(i int) error) []time.Duration {
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			if err := send(i); err != nil {
				errs <- err
				return
			}
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return lat
}

func quantile(lat []time.Duration, q float64) float64 {
	s := slices.Clone(lat)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))]) / float64(time.Millisecond)
}

func postTo(client *http.Client, url string, body []byte) error {
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	return nil
}

// BenchmarkWebhook measures, over HTTPS from a Go client on loopback, with
// the mix of the rule cases (validate and mutate):
//
//   - webhook_p99_ms: admission latency at 200 requests/s with the default
//     audit sink, stdout, here a pipe drained into a file as a container
//     runtime drains a pod's stdout;
//   - webhook_file_sink_p99_ms: the same with the file sink, which fsyncs
//     every decision before answering (concurrent requests share an fsync);
//   - webhook_tls_baseline_p99_ms: the same rate against a handler that
//     answers a fixed body on the same TLS setup: the floor of the above;
//   - webhook_fsync_p99_ms: one fsync of a small append on the disk the file
//     sink uses, the floor of the file sink's figure;
//   - webhook_audit_lost: audit records missing after 10,000 requests sent
//     16 at a time through the file sink, rotating every 4 MiB.
func BenchmarkWebhook(b *testing.B) {
	const (
		rate     = 200
		paceN    = 2000 // 10 s at 200/s
		auditN   = 10000
		parallel = 16
	)
	mix := benchMix(b)
	dir := b.TempDir()

	// The default sink: stdout, a pipe someone drains.
	pr, pw, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() {
		f, err := os.Create(filepath.Join(dir, "stdout.log"))
		if err == nil {
			_, err = io.Copy(f, pr)
			f.Close()
		}
		drained <- err
	}()
	stdoutServer := startServer(b, serverOpts{sink: audit.NewWriter(pw)})

	path := filepath.Join(dir, "audit.log")
	sink, err := audit.OpenFile(audit.FileConfig{Path: path, MaxBytes: 4 << 20, MaxBackups: 10000})
	if err != nil {
		b.Fatal(err)
	}
	fileServer := startServer(b, serverOpts{sink: sink})

	// The floor: the same TLS and client, a fixed answer.
	cert, pool := tlsPair(b)
	fixed := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"x","allowed":true}}`)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	base := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Write(fixed)
		}),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{*cert}},
	}
	go base.ServeTLS(ln, "", "")
	defer base.Shutdown(context.Background())
	baseClient := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: serverName}, ForceAttemptHTTP2: true}}
	defer baseClient.CloseIdleConnections()

	bodies := make([][]byte, paceN)
	for i := range bodies {
		bodies[i] = withUID(b, mix[i%len(mix)].body, fmt.Sprintf("paced-%d", i))
	}
	b.ResetTimer()
	baseLat := paced(b, paceN, rate, func(i int) error {
		return postTo(baseClient, "https://"+ln.Addr().String()+PathValidate, bodies[i])
	})
	stdoutLat := paced(b, paceN, rate, func(i int) error {
		return postTo(stdoutServer.client, stdoutServer.url+mix[i%len(mix)].path, bodies[i])
	})
	fileLat := paced(b, paceN, rate, func(i int) error {
		return postTo(fileServer.client, fileServer.url+mix[i%len(mix)].path, bodies[i])
	})
	fsyncLat := fsyncLatencies(b, filepath.Join(dir, "fsync.probe"), paceN)

	// Audit completeness under concurrency and rotation.
	work := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, parallel)
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				req := mix[i%len(mix)]
				if err := postTo(fileServer.client, fileServer.url+req.path, withUID(b, req.body, fmt.Sprintf("audit-%d", i))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range auditN {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.StopTimer()
	stdoutServer.stop()
	fileServer.stop()
	pw.Close()
	if err := <-drained; err != nil {
		b.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		b.Fatal(err)
	}
	files, _ := filepath.Glob(path + "*")
	found := map[string]bool{}
	for _, name := range files {
		for _, id := range recordIDs(b, name) {
			found[id] = true
		}
	}
	lost := 0
	for i := range auditN {
		if !found[fmt.Sprintf("bench-audit-%d", i)] {
			lost++
		}
	}
	if n := len(recordIDs(b, filepath.Join(dir, "stdout.log"))); n != paceN {
		b.Errorf("%d stdout records for %d requests", n, paceN)
	}
	fmt.Printf("bench: webhook_p99_ms %.2f\n", quantile(stdoutLat, 0.99))
	fmt.Printf("bench: webhook_p50_ms %.2f\n", quantile(stdoutLat, 0.50))
	fmt.Printf("bench: webhook_file_sink_p99_ms %.2f\n", quantile(fileLat, 0.99))
	fmt.Printf("bench: webhook_tls_baseline_p99_ms %.2f\n", quantile(baseLat, 0.99))
	fmt.Printf("bench: webhook_fsync_p99_ms %.2f\n", quantile(fsyncLat, 0.99))
	fmt.Printf("bench: webhook_audit_lost %d\n", lost)
	b.ReportMetric(quantile(stdoutLat, 0.99), "p99-ms")
	b.ReportMetric(float64(lost), "audit-lost")
}

// fsyncLatencies times n append+fsync pairs of a 1 KiB record, 5 ms apart.
func fsyncLatencies(b *testing.B, path string, n int) []time.Duration {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	rec := bytes.Repeat([]byte("x"), 1024)
	lat := make([]time.Duration, n)
	for i := range lat {
		t0 := time.Now()
		if _, err := f.Write(rec); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(t0)
		time.Sleep(5 * time.Millisecond)
	}
	return lat
}

func recordIDs(b *testing.B, name string) []string {
	data, err := os.ReadFile(name)
	if err != nil {
		b.Fatal(err)
	}
	var ids []string
	for _, line := range bytes.Split(data, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var ev audit.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			b.Fatalf("%s: a partial record: %v", name, err)
		}
		ids = append(ids, ev.AuditID)
	}
	return ids
}
