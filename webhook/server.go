package webhook

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"runtime/debug"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"

	"github.com/weftmesh/weft/webhook/admit"
	"github.com/weftmesh/weft/webhook/audit"
)

// Admitter decides admission requests.
type Admitter interface {
	Validate(ctx context.Context, req *admissionv1.AdmissionRequest) admit.Result
	Mutate(ctx context.Context, req *admissionv1.AdmissionRequest) admit.Result
}

var (
	_ Admitter     = (*admit.Admitter)(nil)
	_ http.Handler = (*Server)(nil)
)

// Endpoints of the admission port.
const (
	PathValidate = "/validate"
	PathMutate   = "/mutate"
	PathReady    = "/ready"
)

// Config configures a [Server]. Zero fields take the documented defaults.
type Config struct {
	// Addr is the admission listener (HTTPS); default ":15017".
	Addr string
	// MonitoringAddr is the plain-HTTP listener for /metrics, /ready and
	// /healthz; default ":15014".
	MonitoringAddr string
	// GetCertificate supplies the serving certificate. Required.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// MaxBodyBytes caps a request body; default 6 MiB (as Istio's webhook).
	// Larger bodies get 413.
	MaxBodyBytes int64
	// DefaultTimeout bounds a decision when the API server sends no
	// ?timeout=; default 10 s. A sent timeout is honoured up to 30 s.
	DefaultTimeout time.Duration
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are the
	// http.Server's; defaults 5 s, 15 s, 15 s and 90 s.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// ShutdownDelay is how long the server keeps serving after readiness
	// turns false at shutdown, so endpoints drop it first; default 5 s,
	// negative for none.
	ShutdownDelay time.Duration
	// DrainTimeout bounds the wait for requests in flight at shutdown;
	// default 10 s.
	DrainTimeout time.Duration
	// MaxConcurrentReviews bounds the admission requests handled at once;
	// default 32. Beyond it a request gets 429 with Retry-After.
	MaxConcurrentReviews int
	// MaxInflightBytes bounds the body bytes of the admission requests
	// handled at once (each counts its Content-Length, or MaxBodyBytes when
	// it declares none); default 4 × MaxBodyBytes (24 MiB). It is raised to
	// MaxBodyBytes if lower. Beyond it a request gets 429 with Retry-After.
	MaxInflightBytes int64
	// ClientAuth says whether callers must present a client certificate:
	// ClientAuthNone (default), ClientAuthIfGiven or ClientAuthRequire.
	ClientAuth ClientAuth
	// ClientCAFile is a PEM bundle of the CAs that sign accepted client
	// certificates; required unless ClientAuth is none. It is read again
	// when it changes.
	ClientCAFile string
	// ClientNames, if set, lists the names a client certificate may carry
	// (its subject common name or one of its DNS SANs); default any.
	ClientNames []string
	// Replica names this replica in audit records (the pod name).
	Replica string
	// ReadyChecks must all pass for /ready to answer 200.
	ReadyChecks map[string]func() error
	// Registry receives the metrics and is served on /metrics; default a
	// fresh registry.
	Registry *prometheus.Registry
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// ClientAuth is how the admission port treats client certificates.
type ClientAuth string

// Client authentication modes.
const (
	ClientAuthNone    ClientAuth = "none"
	ClientAuthIfGiven ClientAuth = "if-given"
	ClientAuthRequire ClientAuth = "require"
)

// Defaults of [Config].
const (
	DefaultAddr           = ":15017"
	DefaultMonitoringAddr = ":15014"
	DefaultMaxBodyBytes   = 6 << 20
	// DefaultMaxConcurrentReviews is the default of MaxConcurrentReviews.
	DefaultMaxConcurrentReviews = 32
	// DefaultInflightBodies is MaxInflightBytes's default in bodies of
	// MaxBodyBytes: a review of that size takes about three times as much
	// memory while it is decoded and decided.
	DefaultInflightBodies = 4
	maxTimeout            = 30 * time.Second
	// retryAfter is the Retry-After of a 429, in seconds: the API server's
	// webhook client retries after it within the webhook's timeout.
	retryAfter = "1"
)

func (cfg *Config) setDefaults() {
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.MonitoringAddr == "" {
		cfg.MonitoringAddr = DefaultMonitoringAddr
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxConcurrentReviews <= 0 {
		cfg.MaxConcurrentReviews = DefaultMaxConcurrentReviews
	}
	if cfg.MaxInflightBytes <= 0 {
		cfg.MaxInflightBytes = DefaultInflightBodies * cfg.MaxBodyBytes
	}
	cfg.MaxInflightBytes = max(cfg.MaxInflightBytes, cfg.MaxBodyBytes)
	if cfg.ClientAuth == "" {
		cfg.ClientAuth = ClientAuthNone
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = 10 * time.Second
	}
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = 5 * time.Second
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = 15 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 15 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 90 * time.Second
	}
	if cfg.ShutdownDelay == 0 {
		cfg.ShutdownDelay = 5 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
}

// Server is the admission webhook's HTTPS server: it decodes
// AdmissionReviews, asks the Admitter, writes the audit record and answers.
type Server struct {
	cfg     Config
	adm     Admitter
	sink    audit.Sink
	log     *slog.Logger
	metrics *metrics
	limit   *inflight
	// clientCAs is nil when ClientAuth is none.
	clientCAs *clientCAs
	// overloadLog spaces out the overload warnings.
	overloadLog rate.Sometimes
	serving     atomic.Bool // listeners up and not shutting down
}

// New returns a Server; it listens only in Run or Serve.
func New(cfg Config, adm Admitter, sink audit.Sink) (*Server, error) {
	if cfg.GetCertificate == nil {
		return nil, errors.New("webhook: GetCertificate is required")
	}
	if adm == nil || sink == nil {
		return nil, errors.New("webhook: an Admitter and an audit sink are required")
	}
	cfg.setDefaults()
	s := &Server{cfg: cfg, adm: adm, sink: sink, log: cfg.Logger,
		limit:       &inflight{maxReviews: cfg.MaxConcurrentReviews, maxBytes: cfg.MaxInflightBytes},
		overloadLog: rate.Sometimes{First: 1, Interval: 10 * time.Second}}
	switch cfg.ClientAuth {
	case ClientAuthNone:
	case ClientAuthIfGiven, ClientAuthRequire:
		if cfg.ClientCAFile == "" {
			return nil, fmt.Errorf("webhook: client authentication %s needs a client CA file", cfg.ClientAuth)
		}
		cas, err := loadClientCAs(cfg.ClientCAFile, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("webhook: %w", err)
		}
		s.clientCAs = cas
	default:
		return nil, fmt.Errorf("webhook: client authentication %q: want none, if-given or require", cfg.ClientAuth)
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	return s, nil
}

// Run listens on Addr and MonitoringAddr and serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", s.cfg.Addr, err)
	}
	mon, err := net.Listen("tcp", s.cfg.MonitoringAddr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("listening on %s: %w", s.cfg.MonitoringAddr, err)
	}
	return s.Serve(ctx, ln, mon)
}

// Serve serves admission on ln (TLS is added here) and monitoring on mon
// until ctx ends, then turns readiness off, waits ShutdownDelay, and drains
// for at most DrainTimeout. It closes both listeners.
func (s *Server) Serve(ctx context.Context, ln, mon net.Listener) error {
	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
	admission := &http.Server{
		Handler:           s,
		TLSConfig:         s.tlsConfig(),
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          errLog,
	}
	monitoring := &http.Server{
		Handler:           s.Monitoring(),
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.WriteTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		ErrorLog:          errLog,
	}
	errc := make(chan error, 2)
	go func() { errc <- admission.ServeTLS(ln, "", "") }()
	go func() { errc <- monitoring.Serve(mon) }()
	s.serving.Store(true)
	s.log.Info("webhook serving", "addr", ln.Addr().String(), "monitoring_addr", mon.Addr().String())

	var err error
	running := 2
	select {
	case <-ctx.Done():
	case err = <-errc:
		running--
		err = fmt.Errorf("serving: %w", err)
	}
	s.serving.Store(false)
	if err == nil && s.cfg.ShutdownDelay > 0 {
		time.Sleep(s.cfg.ShutdownDelay)
	}
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
	defer cancel()
	if serr := admission.Shutdown(dctx); serr != nil && err == nil {
		err = fmt.Errorf("draining admission requests: %w", serr)
	}
	if serr := monitoring.Shutdown(dctx); serr != nil && err == nil {
		err = fmt.Errorf("stopping the monitoring server: %w", serr)
	}
	for ; running > 0; running-- {
		if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = fmt.Errorf("serving: %w", serr)
		}
	}
	return err
}

// Ready reports whether this replica serves admission requests and every
// readiness check passes.
func (s *Server) Ready() bool { return s.readiness() == nil }

func (s *Server) readiness() error {
	if !s.serving.Load() {
		return errors.New("not serving")
	}
	names := make([]string, 0, len(s.cfg.ReadyChecks))
	for n := range s.cfg.ReadyChecks {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := s.cfg.ReadyChecks[n](); err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
	}
	return nil
}

// Monitoring is the monitoring port's handler: /metrics, /ready, /healthz.
func (s *Server) Monitoring() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc(PathReady, s.serveReady)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	return mux
}

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	if err := s.readiness(); err != nil {
		http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok\n")
}

// ServeHTTP serves the admission port: /validate, /mutate and /ready.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case PathValidate:
		s.serveAdmission(w, r, "validate")
	case PathMutate:
		s.serveAdmission(w, r, "mutate")
	case PathReady:
		s.serveReady(w, r)
	default:
		s.httpError(w, http.StatusNotFound, "no such endpoint; use /validate or /mutate")
	}
}

func (s *Server) httpError(w http.ResponseWriter, code int, msg string) {
	s.metrics.httpErrors.WithLabelValues(fmt.Sprint(code)).Inc()
	http.Error(w, msg, code)
}

// checkRequest checks what can be checked before the body is read; on
// failure it has answered and returns false.
func (s *Server) checkRequest(w http.ResponseWriter, r *http.Request, caller Caller) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.httpError(w, http.StatusMethodNotAllowed, "admission requests are POSTed")
		return false
	}
	if s.cfg.ClientAuth == ClientAuthRequire && !caller.Authenticated {
		// The handshake already refuses such callers; this guards the
		// handler when it is served some other way.
		s.httpError(w, http.StatusForbidden, "a verified client certificate is required")
		return false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		s.httpError(w, http.StatusUnsupportedMediaType, "the body must be application/json")
		return false
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		s.httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", s.cfg.MaxBodyBytes))
		return false
	}
	return true
}

// reserve is what a request counts against MaxInflightBytes: its declared
// length, or the most it may send.
func (s *Server) reserve(r *http.Request) int64 {
	if r.ContentLength >= 0 {
		return r.ContentLength
	}
	return s.cfg.MaxBodyBytes
}

// overloaded answers 429 for the limit reached.
func (s *Server) overloaded(w http.ResponseWriter, limit string) {
	s.metrics.overload.WithLabelValues(limit).Inc()
	s.overloadLog.Do(func() {
		s.log.Warn("admission requests refused: too many in flight", "limit", limit,
			"max_concurrent_reviews", s.cfg.MaxConcurrentReviews, "max_inflight_bytes", s.cfg.MaxInflightBytes)
	})
	w.Header().Set("Retry-After", retryAfter)
	s.httpError(w, http.StatusTooManyRequests, "too many admission requests in flight ("+limit+"); retry after "+retryAfter+" s")
}

// readBody reads at most MaxBodyBytes, into a buffer of the declared size
// when there is one.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	if r.ContentLength < 0 {
		return io.ReadAll(body)
	}
	buf := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(body, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// readReview reads and checks the AdmissionReview of r; on failure it has
// answered and returns nil.
func (s *Server) readReview(w http.ResponseWriter, r *http.Request) *admissionv1.AdmissionReview {
	body, err := s.readBody(w, r)
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			s.httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes", s.cfg.MaxBodyBytes))
			return nil
		}
		s.httpError(w, http.StatusBadRequest, "reading the body: "+err.Error())
		return nil
	}
	if len(body) == 0 {
		s.httpError(w, http.StatusBadRequest, "empty body: send an admission.k8s.io/v1 AdmissionReview")
		return nil
	}
	var review admissionv1.AdmissionReview
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(body, &review); err != nil {
		s.httpError(w, http.StatusBadRequest, "the body is not an AdmissionReview: "+clip(err.Error(), 512))
		return nil
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		s.httpError(w, http.StatusBadRequest, fmt.Sprintf("unsupported %q %q: this webhook speaks admission.k8s.io/v1 AdmissionReview",
			clip(review.APIVersion, 64), clip(review.Kind, 64)))
		return nil
	}
	if review.Request == nil || review.Request.UID == "" {
		s.httpError(w, http.StatusBadRequest, "the AdmissionReview has no request, or the request has no uid")
		return nil
	}
	return &review
}

func (s *Server) serveAdmission(w http.ResponseWriter, r *http.Request, webhook string) {
	received := time.Now()
	caller := callerOf(r)
	if !s.checkRequest(w, r, caller) {
		return
	}
	n := s.reserve(r)
	if limit := s.limit.acquire(n); limit != "" {
		s.overloaded(w, limit)
		return
	}
	s.metrics.inflight.Inc()
	s.metrics.inflightBytes.Add(float64(n))
	defer func() {
		s.limit.release(n)
		s.metrics.inflight.Dec()
		s.metrics.inflightBytes.Sub(float64(n))
	}()
	review := s.readReview(w, r)
	if review == nil {
		return
	}
	req := review.Request
	ctx, cancel := context.WithTimeout(withCaller(r.Context(), caller), s.budget(r))
	defer cancel()

	res := s.decide(ctx, webhook, req)
	resp := s.response(req, res)
	done := time.Now()
	d := s.auditDecision(webhook, res, resp)
	d.CallerAuthenticated, d.Caller = caller.Authenticated, caller.Subject
	ev := audit.NewEvent(req, d, received, done)
	if err := s.sink.Write(ev); err != nil {
		// No decision leaves the webhook unrecorded: answer with an error.
		s.metrics.auditErrors.Inc()
		s.log.Error("writing the audit record", "uid", req.UID, "error", err)
		res = admit.Result{Decision: admit.Error, Code: http.StatusInternalServerError, Reason: "audit-failed",
			Message: "the webhook could not write its audit log, so it decides nothing; retry, and check the webhook's audit sink"}
		resp = s.response(req, res)
	} else {
		s.metrics.auditRecords.Inc()
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	})
	if err != nil {
		s.httpError(w, http.StatusInternalServerError, "encoding the response: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)

	dry := req.DryRun != nil && *req.DryRun
	s.metrics.requests.WithLabelValues(webhook, kindLabel(req.Kind.Kind), operationLabel(string(req.Operation)),
		string(res.Decision), fmt.Sprint(dry)).Inc()
	s.metrics.duration.WithLabelValues(webhook).Observe(time.Since(received).Seconds())
	if res.Access != nil {
		s.metrics.accessReviews.WithLabelValues(accessResult(res.Access)).Inc()
	}
	if res.Decision != admit.Allow && res.Decision != admit.Patch {
		s.log.Debug("admission denied", "uid", req.UID, "kind", req.Kind.Kind, "namespace", req.Namespace,
			"name", req.Name, "user", req.UserInfo.Username, "reason", res.Reason, "dry_run", dry)
	}
}

// budget is how long a decision may take: the API server's ?timeout=.
func (s *Server) budget(r *http.Request) time.Duration {
	if d, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && d > 0 {
		return min(d, maxTimeout)
	}
	return s.cfg.DefaultTimeout
}

// decide runs the Admitter, turning a panic into an error answer.
func (s *Server) decide(ctx context.Context, webhook string, req *admissionv1.AdmissionRequest) (res admit.Result) {
	defer func() {
		if p := recover(); p != nil {
			s.metrics.panics.Inc()
			s.log.Error("admission handler panicked", "uid", req.UID, "kind", req.Kind.Kind, "webhook", webhook,
				"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			res = admit.Result{Decision: admit.Error, Code: http.StatusInternalServerError, Reason: "internal-error",
				Message: "internal error in the webhook; the request was not decided: retry, and report it with uid " + string(req.UID)}
		}
	}()
	if webhook == "mutate" {
		return s.adm.Mutate(ctx, req)
	}
	return s.adm.Validate(ctx, req)
}

// response renders a Result for the API server.
func (s *Server) response(req *admissionv1.AdmissionRequest, res admit.Result) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{
		UID:      req.UID,
		Allowed:  res.Allowed(),
		Warnings: res.Warnings,
		AuditAnnotations: map[string]string{
			"decision":      string(res.Decision),
			"reason":        res.Reason,
			"admission-uid": string(req.UID),
		},
	}
	if s.cfg.Replica != "" {
		resp.AuditAnnotations["replica"] = s.cfg.Replica
	}
	if res.Access != nil {
		resp.AuditAnnotations["access-review"] = accessResult(res.Access)
	}
	if !resp.Allowed {
		resp.Result = &metav1.Status{
			Status:  metav1.StatusFailure,
			Code:    res.Code,
			Reason:  statusReason(res.Code),
			Message: res.Message,
		}
		if len(res.Causes) > 0 {
			resp.Result.Details = &metav1.StatusDetails{Name: req.Name, Group: req.Kind.Group, Kind: req.Kind.Kind, Causes: res.Causes}
		}
	}
	if res.Decision == admit.Patch {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = res.Patch, &pt
	}
	return resp
}

func (s *Server) auditDecision(webhook string, res admit.Result, resp *admissionv1.AdmissionResponse) audit.Decision {
	d := audit.Decision{
		Webhook:  webhook,
		Decision: string(res.Decision),
		Reason:   res.Reason,
		Rules:    res.Rules,
		Message:  res.Message,
		Warnings: res.Warnings,
		Patch:    res.Patch,
		Status:   resp.Result,
		Replica:  s.cfg.Replica,
	}
	if a := res.Access; a != nil {
		d.Access = &audit.AccessReview{
			User: a.User, Verb: "use", Resource: "gateways.gateway.networking.k8s.io",
			Namespace: a.Namespace, Name: a.Name,
			Allowed: a.Allowed, Denied: a.Denied, Reason: a.Reason, Error: a.Err,
		}
		if d.Access.Error == "" {
			d.Access.Error = a.EvaluationError
		}
	}
	return d
}

func accessResult(a *admit.AccessReview) string {
	switch {
	case a.Err != "":
		return "error"
	case a.Allowed:
		return "allowed"
	}
	return "denied"
}

func statusReason(code int32) metav1.StatusReason {
	switch code {
	case http.StatusBadRequest:
		return metav1.StatusReasonBadRequest
	case http.StatusForbidden:
		return metav1.StatusReasonForbidden
	case http.StatusUnprocessableEntity:
		return metav1.StatusReasonInvalid
	}
	return metav1.StatusReasonInternalError
}

// clip shortens s to n bytes for an error message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}
