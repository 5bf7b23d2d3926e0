package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the waypoint's Istio standard HTTP metrics (reporter="waypoint").
type Metrics struct {
	requests           *prometheus.CounterVec
	duration           *prometheus.HistogramVec
	reqBytes, rspBytes *prometheus.HistogramVec
}

var labels = []string{"reporter", "source_workload", "source_workload_namespace", "source_principal", "source_app",
	"source_version", "source_cluster", "destination_workload", "destination_workload_namespace", "destination_principal",
	"destination_app", "destination_version", "destination_service", "destination_service_name",
	"destination_service_namespace", "destination_cluster", "request_protocol", "response_code", "grpc_response_status",
	"response_flags", "connection_security_policy"}

// NewMetrics creates the metrics and registers them with reg when non-nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	buckets := []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}
	sizes := prometheus.ExponentialBuckets(1, 10, 9)
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_requests_total", Help: "Requests handled."}, labels),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "istio_request_duration_milliseconds", Help: "Request duration.", Buckets: buckets}, labels),
		reqBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "istio_request_bytes", Help: "Request body sizes.", Buckets: sizes}, labels),
		rspBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "istio_response_bytes", Help: "Response body sizes.", Buckets: sizes}, labels),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.reqBytes, m.rspBytes)
	}
	return m
}

func (p *Proxy) record(s *session, r *http.Request, info *reqInfo, d time.Duration, tp string) {
	srcNS, srcSA := "unknown", ""
	if parts := strings.Split(s.peer, "/"); len(parts) >= 7 && parts[3] == "ns" {
		srcNS, srcSA = parts[4], parts[6]
	}
	if v := s.baggage["k8s.namespace.name"]; v != "" {
		srcNS = v
	}
	srcWL := firstNonEmpty(s.baggage["k8s.deployment.name"], s.baggage["k8s.statefulset.name"], s.baggage["k8s.daemonset.name"], s.baggage["k8s.pod.name"], srcSA, "unknown")
	host := "unknown"
	if s.chain.HTTP != nil && s.chain.HTTP.RouteName != "" {
		host, _, _ = strings.Cut(s.chain.HTTP.RouteName, ":")
	}
	svcName, svcNS, _ := strings.Cut(host, ".")
	svcNS, _, _ = strings.Cut(svcNS, ".")
	dstWL, dstNS, dstPrin := "unknown", "unknown", "unknown"
	if e := info.ep; e != nil {
		dstWL = firstNonEmpty(e.WorkloadName, e.Workload, "unknown")
		dstNS = firstNonEmpty(e.Namespace, "unknown")
		dstPrin = firstNonEmpty(e.Identity, "unknown")
	}
	proto := "http"
	grpc := ""
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
		proto = "grpc"
	}
	flags := firstNonEmpty(info.flags, "-")
	v := []string{"waypoint", srcWL, srcNS, firstNonEmpty(s.peer, "unknown"), firstNonEmpty(s.baggage["service.name"], srcWL),
		firstNonEmpty(s.baggage["service.version"], "unknown"), firstNonEmpty(s.baggage["k8s.cluster.name"], "unknown"),
		dstWL, dstNS, dstPrin, dstWL, "unknown", host, firstNonEmpty(svcName, "unknown"), firstNonEmpty(svcNS, "unknown"),
		"unknown", proto, strconv.Itoa(info.status), grpc, flags, "mutual_tls"}
	reqBytes := info.reqBytes.Load()
	m := p.cfg.Metrics
	m.requests.WithLabelValues(v...).Inc()
	m.duration.WithLabelValues(v...).Observe(float64(d.Microseconds()) / 1000)
	m.reqBytes.WithLabelValues(v...).Observe(float64(reqBytes))
	m.rspBytes.WithLabelValues(v...).Observe(float64(info.rspBytes))
	attrs := []any{"src_addr", s.remote.String(), "src_identity", s.peer, "src_workload", srcWL, "src_namespace", srcNS,
		"dst_addr", s.target.String(), "dst_service", host, "dst_workload", dstWL, "dst_namespace", dstNS, "dst_identity", dstPrin,
		"method", r.Method, "path", r.URL.RequestURI(), "protocol", r.Proto, "status", info.status, "route", info.route,
		"cluster", info.cluster, "upstream", upstreamString(info), "response_flags", flags,
		"bytes_recv", reqBytes, "bytes_sent", info.rspBytes, "duration_ms", d.Milliseconds(), "traceparent", tp}
	if info.audit {
		attrs = append(attrs, "audit", true, "audit_policy", info.auditPolicy)
	}
	p.cfg.AccessLog.Info("request", attrs...)
}

func upstreamString(i *reqInfo) string {
	if i.upstream.IsValid() {
		return i.upstream.String()
	}
	return ""
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
