package webhook

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/weftmesh/weft/webhook/admit"
	"github.com/weftmesh/weft/webhook/audit"
	"github.com/weftmesh/weft/webhook/servingcert"
)

const serverName = "weft-webhook.weft-system.svc"

// tlsPair makes a CA and a serving certificate for serverName.
func tlsPair(t testing.TB) (*tls.Certificate, *x509.CertPool) {
	t.Helper()
	now := time.Now()
	ca, err := servingcert.NewCA("test-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, key, err := ca.Issue([]string{serverName}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}, pool
}

// liveServer is a Server on loopback listeners with real TLS.
type liveServer struct {
	*Server
	url     string // https://127.0.0.1:port
	monURL  string // http://127.0.0.1:port
	roots   *x509.CertPool
	client  *http.Client
	reg     *prometheus.Registry
	stop    func()
	stopped chan error
}

type serverOpts struct {
	adm         Admitter
	sink        audit.Sink
	readyChecks map[string]func() error
	maxBody     int64
	config      func(*Config) // changes the Config before New
}

func startServer(t testing.TB, o serverOpts) *liveServer {
	t.Helper()
	cert, pool := tlsPair(t)
	if o.adm == nil {
		c := testCluster()
		adm, err := admit.New(admit.Config{Gateways: c, Services: c, Namespaces: c, Access: c})
		if err != nil {
			t.Fatal(err)
		}
		o.adm = adm
	}
	if o.sink == nil {
		o.sink = audit.NewWriter(io.Discard)
	}
	reg := prometheus.NewRegistry()
	cfg := Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil },
		MaxBodyBytes:   o.maxBody,
		ShutdownDelay:  -1,
		Replica:        "weft-webhook-test",
		ReadyChecks:    o.readyChecks,
		Registry:       reg,
		Logger:         discardLogger(),
	}
	if o.config != nil {
		o.config(&cfg)
	}
	s, err := New(cfg, o.adm, o.sink)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mon, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ls := &liveServer{
		Server: s, reg: reg, roots: pool,
		url:    "https://" + ln.Addr().String(),
		monURL: "http://" + mon.Addr().String(),
		client: &http.Client{Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: serverName},
			ForceAttemptHTTP2: true,
		}},
		stopped: make(chan error, 1),
	}
	go func() { ls.stopped <- s.Serve(ctx, ln, mon) }()
	var once sync.Once
	ls.stop = func() {
		once.Do(func() {
			ls.client.CloseIdleConnections()
			cancel()
			if err := <-ls.stopped; err != nil {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(ls.stop)
	return ls
}

func (ls *liveServer) do(t testing.TB, method, path, contentType string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, ls.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := ls.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func namespaceReview(t testing.TB, name, mode string, dryRun bool) []byte {
	return ruleCase{name: name, kind: "v1/Namespace", dryRun: dryRun,
		object: fmt.Sprintf("metadata: {name: %s, labels: {istio.io/dataplane-mode: %s}}", name, mode)}.review(t)
}

func decodeReview(t testing.TB, b []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	var r admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("not an AdmissionReview: %v: %s", err, b)
	}
	if r.APIVersion != "admission.k8s.io/v1" || r.Kind != "AdmissionReview" || r.Response == nil {
		t.Fatalf("bad AdmissionReview envelope: %s", b)
	}
	return r.Response
}

func TestServerBadRequests(t *testing.T) {
	ls := startServer(t, serverOpts{})
	valid := namespaceReview(t, "shop", "ambient", false)
	for _, tc := range []struct {
		name        string
		method      string
		path        string
		contentType string
		body        []byte
		want        int
		wantBody    string
	}{
		{"valid", "POST", "/validate", "application/json", valid, 200, `"allowed":true`},
		{"charset parameter", "POST", "/validate", "application/json; charset=utf-8", valid, 200, `"allowed":true`},
		{"GET", "GET", "/validate", "", nil, 405, "POSTed"},
		{"unknown path", "POST", "/convert", "application/json", valid, 404, "/validate"},
		{"wrong content type", "POST", "/validate", "application/yaml", valid, 415, "application/json"},
		{"no content type", "POST", "/validate", "", valid, 415, "application/json"},
		{"empty body", "POST", "/validate", "application/json", nil, 400, "empty body"},
		{"random bytes", "POST", "/validate", "application/json", []byte("\x00\xffnot json"), 400, "not an AdmissionReview"},
		{"truncated JSON", "POST", "/validate", "application/json", valid[:len(valid)/2], 400, "not an AdmissionReview"},
		{"JSON array", "POST", "/validate", "application/json", []byte(`[1,2]`), 400, "not an AdmissionReview"},
		{"v1beta1", "POST", "/validate", "application/json",
			bytes.Replace(valid, []byte(`admission.k8s.io/v1"`), []byte(`admission.k8s.io/v1beta1"`), 1), 400, "speaks admission.k8s.io/v1"},
		{"wrong kind", "POST", "/validate", "application/json",
			bytes.Replace(valid, []byte(`"AdmissionReview"`), []byte(`"ConversionReview"`), 1), 400, "speaks admission.k8s.io/v1"},
		{"no request", "POST", "/validate", "application/json", []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), 400, "no request"},
		{"no uid", "POST", "/mutate", "application/json",
			[]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}`), 400, "no uid"},
		{"huge body", "POST", "/validate", "application/json", bytes.Repeat([]byte(" "), 7<<20), 413, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.body != nil {
				body = bytes.NewReader(tc.body)
			}
			code, got := ls.do(t, tc.method, tc.path, tc.contentType, body)
			if code != tc.want || !strings.Contains(string(got), tc.wantBody) {
				t.Errorf("HTTP %d %q, want %d containing %q", code, clip(string(got), 300), tc.want, tc.wantBody)
			}
		})
	}
	// Refused requests are counted, never audited.
	if n := testutil.ToFloat64(ls.metrics.auditRecords); n != 2 {
		t.Errorf("%v audit records, want 2 (the two valid requests)", n)
	}
	if n := testutil.ToFloat64(ls.metrics.httpErrors.WithLabelValues("400")); n != 8 {
		t.Errorf("%v HTTP 400s counted, want 8", n)
	}
}

// panicky panics in every handler.
type panicky struct{}

func (panicky) Validate(context.Context, *admissionv1.AdmissionRequest) admit.Result {
	panic("validate exploded")
}

func (panicky) Mutate(_ context.Context, req *admissionv1.AdmissionRequest) admit.Result {
	var rules []string
	return admit.Result{Reason: rules[len(req.UID)]} // a runtime error, as a real bug would cause
}

func TestServerRecoversPanics(t *testing.T) {
	var records bytes.Buffer
	ls := startServer(t, serverOpts{adm: panicky{}, sink: audit.NewWriter(&records)})
	for _, path := range []string{"/validate", "/mutate"} {
		code, body := ls.do(t, "POST", path, "application/json", bytes.NewReader(namespaceReview(t, "boom", "ambient", false)))
		if code != 200 {
			t.Fatalf("%s: HTTP %d %s", path, code, body)
		}
		resp := decodeReview(t, body)
		if resp.UID != "uid-boom" || resp.Allowed || resp.Result == nil || resp.Result.Code != 500 ||
			!strings.Contains(resp.Result.Message, "uid-boom") {
			t.Errorf("%s: response %+v, want an error keeping the uid", path, resp)
		}
	}
	if n := testutil.ToFloat64(ls.metrics.panics); n != 2 {
		t.Errorf("%v panics counted, want 2", n)
	}
	// The server still serves afterwards, and each panic was audited as an error.
	if code, _ := ls.do(t, "POST", "/validate", "application/json", bytes.NewReader(namespaceReview(t, "again", "ambient", false))); code != 200 {
		t.Errorf("after panics: HTTP %d", code)
	}
	if got := strings.Count(records.String(), `"admission.weft.dev/reason":"internal-error"`); got != 3 {
		t.Errorf("%d internal-error audit records, want 3:\n%s", got, records.String())
	}
}

// failingSink fails every write.
type failingSink struct{}

func (failingSink) Write(*audit.Event) error { return errors.New("disk full") }
func (failingSink) Close() error             { return nil }

func TestServerRefusesWithoutAudit(t *testing.T) {
	ls := startServer(t, serverOpts{sink: failingSink{}})
	code, body := ls.do(t, "POST", "/validate", "application/json", bytes.NewReader(namespaceReview(t, "shop", "ambient", false)))
	if code != 200 {
		t.Fatalf("HTTP %d", code)
	}
	resp := decodeReview(t, body)
	if resp.Allowed || resp.Result.Code != 500 || resp.AuditAnnotations["reason"] != "audit-failed" {
		t.Errorf("response %+v, want an audit-failed error", resp)
	}
	if n := testutil.ToFloat64(ls.metrics.auditErrors); n != 1 {
		t.Errorf("%v audit errors counted", n)
	}
}

// TestServerAuditsBeforeResponding sends requests one by one and checks,
// as each answer arrives, that its record is already in the file, whole.
func TestServerAuditsBeforeResponding(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	sink, err := audit.OpenFile(audit.FileConfig{Path: path, MaxBytes: 16 << 10, MaxBackups: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	ls := startServer(t, serverOpts{sink: sink})
	const n = 60
	for i := range n {
		mode := []string{"ambient", "bogus"}[i%2]
		code, body := ls.do(t, "POST", "/validate", "application/json",
			bytes.NewReader(namespaceReview(t, fmt.Sprintf("ns-%d", i), mode, i%3 == 0)))
		if code != 200 {
			t.Fatalf("HTTP %d %s", code, body)
		}
		resp := decodeReview(t, body)
		ev := findRecord(t, path, string(resp.UID))
		if ev == nil {
			t.Fatalf("answer for %s arrived before its audit record", resp.UID)
		}
		wantDecision := map[bool]string{true: "allow", false: "deny"}[resp.Allowed]
		if ev.Annotations[audit.KeyDecision] != wantDecision || ev.Annotations[audit.KeyDryRun] != fmt.Sprint(i%3 == 0) {
			t.Errorf("record %s: %v, want decision %s dry-run %v", resp.UID, ev.Annotations, wantDecision, i%3 == 0)
		}
		if !resp.Allowed && (ev.ResponseStatus.Code != resp.Result.Code || ev.ResponseStatus.Message != resp.Result.Message) {
			t.Errorf("record %s status %+v differs from the response %+v", resp.UID, ev.ResponseStatus, resp.Result)
		}
	}
	files, _ := filepath.Glob(path + "*")
	if len(files) < 2 {
		t.Errorf("the test never rotated (%d files)", len(files))
	}
	if got := countRecords(t, files...); got != n {
		t.Errorf("%d records for %d requests", got, n)
	}
}

// findRecord returns the record with auditID id from the active file.
func findRecord(t testing.TB, path, id string) *audit.Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev audit.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("a partial record: %v: %q", err, sc.Text())
		}
		if ev.AuditID == id {
			return &ev
		}
	}
	return nil
}

func countRecords(t testing.TB, files ...string) int {
	t.Helper()
	n := 0
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		n += bytes.Count(b, []byte("\n"))
	}
	return n
}

func TestServerReadinessAndMetrics(t *testing.T) {
	var certErr error
	var mu sync.Mutex
	ls := startServer(t, serverOpts{readyChecks: map[string]func() error{
		"certificate": func() error { mu.Lock(); defer mu.Unlock(); return certErr },
	}})
	get := func(url string) (int, string) {
		resp, err := ls.client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(ls.monURL + "/ready"); code != 200 {
		t.Errorf("/ready = %d %s", code, body)
	}
	if code, body := get(ls.url + "/ready"); code != 200 {
		t.Errorf("HTTPS /ready = %d %s", code, body)
	}
	mu.Lock()
	certErr = errors.New("no serving certificate loaded yet")
	mu.Unlock()
	if code, body := get(ls.monURL + "/ready"); code != 503 || !strings.Contains(body, "certificate: no serving certificate") {
		t.Errorf("/ready with a failing check = %d %q", code, body)
	}
	if code, _ := get(ls.monURL + "/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	ls.do(t, "POST", "/validate", "application/json", bytes.NewReader(namespaceReview(t, "shop", "bogus", true)))
	_, metrics := get(ls.monURL + "/metrics")
	for _, want := range []string{
		`weft_webhook_admission_requests_total{decision="deny",dry_run="true",kind="Namespace",operation="CREATE",webhook="validate"} 1`,
		`weft_webhook_admission_duration_seconds_count{webhook="validate"} 1`,
		`weft_webhook_audit_records_total 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	ls.stop()
	if ls.Ready() {
		t.Error("still ready after shutdown")
	}
}

// TestServerUnknownKindsBoundLabels checks that request fields cannot
// create new metric series.
func TestServerUnknownKindsBoundLabels(t *testing.T) {
	ls := startServer(t, serverOpts{})
	body := bytes.Replace(namespaceReview(t, "shop", "ambient", false), []byte(`"kind":"Namespace"`), []byte(`"kind":"Evil\u2028Kind"`), 1)
	body = bytes.Replace(body, []byte(`"operation":"CREATE"`), []byte(`"operation":"ANYTHING"`), 1)
	if code, b := ls.do(t, "POST", "/validate", "application/json", bytes.NewReader(body)); code != 200 {
		t.Fatalf("HTTP %d %s", code, b)
	}
	if n := testutil.ToFloat64(ls.metrics.requests.WithLabelValues("validate", "other", "other", "allow", "false")); n != 1 {
		t.Errorf("request counted %v times under kind=other operation=other", n)
	}
}
