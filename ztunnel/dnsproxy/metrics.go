package dnsproxy

import (
	"strings"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weftmesh/weft/ztunnel/state"
)

// Metrics are the DNS proxy's metrics, with the names and labels of Istio's
// ztunnel.
type Metrics struct {
	requests, upstream, failures *prometheus.CounterVec
	duration                     *prometheus.HistogramVec
}

// labelNames are Istio's ztunnel DNS labels.
var labelNames = []string{"request_query_type", "request_protocol", "source_canonical_service", "source_canonical_revision"}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labelNames)
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		requests: counter("istio_dns_requests_total", "Total number of DNS requests."),
		upstream: counter("istio_dns_upstream_requests_total", "Total number of DNS requests forwarded to upstream."),
		failures: counter("istio_dns_upstream_failures_total", "Total number of DNS requests that failed to forward upstream."),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "istio_dns_upstream_request_duration_seconds",
			Help:    "Total time in seconds it takes to get a DNS response from upstream.",
			Buckets: []float64{0.0005, 0.001, 0.01, 0.1, 1, 5},
		}, labelNames),
	}
	reg.MustRegister(m.duration)
	return m
}

// requestLabels are the label values of a query of qtype (0: not parsed)
// over network from src (nil: not known yet).
func requestLabels(qtype uint16, network string, src *state.Workload) []string {
	typ, svc, rev := "unknown", "unknown", "unknown"
	if s, ok := dns.TypeToString[qtype]; ok {
		typ = strings.ToLower(s)
	}
	if src != nil {
		if src.CanonicalName != "" {
			svc = src.CanonicalName
		}
		if src.CanonicalRev != "" {
			rev = src.CanonicalRev
		}
	}
	return []string{typ, network, svc, rev}
}
