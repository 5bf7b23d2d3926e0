package webhook

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus series.
type metrics struct {
	requests      *prometheus.CounterVec   // webhook, kind, operation, decision, dry_run
	duration      *prometheus.HistogramVec // webhook
	httpErrors    *prometheus.CounterVec   // code
	panics        prometheus.Counter
	auditRecords  prometheus.Counter
	auditErrors   prometheus.Counter
	accessReviews *prometheus.CounterVec // result
	overload      *prometheus.CounterVec // limit
	inflight      prometheus.Gauge
	inflightBytes prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_webhook_admission_requests_total",
			Help: "Admission decisions by webhook (validate, mutate), kind, operation, decision (allow, deny, patch, error) and dry run.",
		}, []string{"webhook", "kind", "operation", "decision", "dry_run"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "weft_webhook_admission_duration_seconds",
			Help:    "Time from reading an AdmissionReview to sending the answer, audit write included.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
		}, []string{"webhook"}),
		httpErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_webhook_http_errors_total",
			Help: "Requests refused before an admission decision (no AdmissionReview to answer), by HTTP status.",
		}, []string{"code"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weft_webhook_panics_total",
			Help: "Admission handlers that panicked; each was answered with an error.",
		}),
		auditRecords: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weft_webhook_audit_records_total",
			Help: "Audit records written (one per admission decision).",
		}),
		auditErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weft_webhook_audit_write_errors_total",
			Help: "Audit records that could not be written; each request was answered with an error instead.",
		}),
		accessReviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_webhook_access_reviews_total",
			Help: "SubjectAccessReviews for cross-namespace waypoint use, by result (allowed, denied, error).",
		}, []string{"result"}),
		overload: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_webhook_overload_rejections_total",
			Help: "Admission requests refused with 429 because a limit was reached, by limit (reviews: MaxConcurrentReviews, bytes: MaxInflightBytes).",
		}, []string{"limit"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weft_webhook_inflight_reviews",
			Help: "Admission requests being handled.",
		}),
		inflightBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weft_webhook_inflight_bytes",
			Help: "Body bytes reserved by the admission requests being handled.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.duration, m.httpErrors, m.panics, m.auditRecords, m.auditErrors, m.accessReviews,
			m.overload, m.inflight, m.inflightBytes} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering webhook metrics: %w", err)
			}
		}
	}
	return m, nil
}

// knownKinds bounds the kind label: the webhook port is reachable without
// authentication, so label values must not come from the request as is.
var knownKinds = map[string]bool{
	"Gateway": true, "HTTPRoute": true, "GRPCRoute": true, "Namespace": true, "Service": true, "Pod": true,
	"Deployment": true, "StatefulSet": true, "DaemonSet": true, "ReplicaSet": true, "Job": true, "CronJob": true,
	"AuthorizationPolicy": true, "ServiceEntry": true, "WorkloadEntry": true,
}

func kindLabel(kind string) string {
	if knownKinds[kind] {
		return kind
	}
	return "other"
}

func operationLabel(op string) string {
	switch op {
	case "CREATE", "UPDATE", "DELETE", "CONNECT":
		return op
	}
	return "other"
}
