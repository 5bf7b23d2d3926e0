package proxy

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the waypoint's Istio standard HTTP metrics (reporter="waypoint";
// "source" in gateway mode).
type Metrics struct {
	requests           *prometheus.CounterVec
	duration           *prometheus.HistogramVec
	reqBytes, rspBytes *prometheus.HistogramVec
	// reqMsgs and rspMsgs count gRPC messages (gRPC calls only).
	reqMsgs, rspMsgs *prometheus.CounterVec
	// shadow counts dry-run RBAC evaluations (shadow.go).
	shadow *prometheus.CounterVec
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
		reqMsgs:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_request_messages_total", Help: "gRPC messages sent by clients."}, labels),
		rspMsgs:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "istio_response_messages_total", Help: "gRPC messages sent by servers."}, labels),
		shadow:   newShadowCounter(),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.reqBytes, m.rspBytes, m.reqMsgs, m.rspMsgs, m.shadow)
	}
	return m
}

// series is one label set's four metrics, bound once so that recording a
// request costs no label hashing.
type series struct {
	requests                     prometheus.Counter
	duration, reqBytes, rspBytes prometheus.Observer
	reqMsgs, rspMsgs             prometheus.Counter // a gRPC series', else nil
}

// seriesKey is what varies between the requests of one session.
type seriesKey struct {
	dstWL, dstNS, dstPrin string
	// dstSvc is a gateway request's destination service, from its
	// cluster's name (outbound|<port>||<host>); "" on a waypoint, whose
	// session names the service.
	dstSvc     string
	grpc       bool
	grpcStatus string // the gRPC status code, "" when none came
	code       int
	flags      string
}

// maxSessionSeries bounds a session's series cache; past it the cache
// starts over.
const maxSessionSeries = 64

// sessionLabels are the label values every request of a session shares.
type sessionLabels struct {
	srcWL, srcNS, srcPrin, srcApp, srcVersion, srcCluster string
	host, svcName, svcNS                                  string
}

func (s *session) sessionLabels() sessionLabels {
	var l sessionLabels
	srcSA := ""
	l.srcNS = "unknown"
	if parts := strings.Split(s.peer, "/"); len(parts) >= 7 && parts[3] == "ns" {
		l.srcNS, srcSA = parts[4], parts[6]
	}
	if v := s.baggage["k8s.namespace.name"]; v != "" {
		l.srcNS = v
	}
	l.srcWL = firstNonEmpty(s.baggage["k8s.deployment.name"], s.baggage["k8s.statefulset.name"], s.baggage["k8s.daemonset.name"], s.baggage["k8s.pod.name"], srcSA, "unknown")
	l.srcPrin = firstNonEmpty(s.peer, "unknown")
	l.srcApp = firstNonEmpty(s.baggage["service.name"], l.srcWL)
	l.srcVersion = firstNonEmpty(s.baggage["service.version"], "unknown")
	l.srcCluster = firstNonEmpty(s.baggage["k8s.cluster.name"], "unknown")
	l.host = "unknown"
	if s.chain.HTTP != nil && s.chain.HTTP.RouteName != "" && s.listener == "" {
		l.host, _, _ = strings.Cut(s.chain.HTTP.RouteName, ":")
	}
	l.host, l.svcName, l.svcNS = serviceLabels(l.host)
	return l
}

// serviceLabels returns the destination_service, _name and _namespace
// labels of a service host name (<name>.<namespace>.svc...).
func serviceLabels(host string) (string, string, string) {
	svcName, svcNS, _ := strings.Cut(host, ".")
	svcNS, _, _ = strings.Cut(svcNS, ".")
	return host, firstNonEmpty(svcName, "unknown"), firstNonEmpty(svcNS, "unknown")
}

// series returns the metrics of k's label set, bound on first use.
func (s *session) series(k seriesKey) *series {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sr := s.cache[k]; sr != nil {
		return sr
	}
	if s.cache == nil || len(s.cache) >= maxSessionSeries {
		s.cache = make(map[seriesKey]*series)
	}
	l := &s.labels
	proto := "http"
	if k.grpc {
		proto = "grpc"
	}
	reporter, security := "waypoint", "mutual_tls"
	if s.p.cfg.Gateway {
		// Istio's gateways report as the source; their clients are
		// outside the mesh.
		reporter, security = "source", "unknown"
	}
	host, svcName, svcNS := l.host, l.svcName, l.svcNS
	if k.dstSvc != "" {
		host, svcName, svcNS = serviceLabels(k.dstSvc)
	}
	v := []string{reporter, l.srcWL, l.srcNS, l.srcPrin, l.srcApp, l.srcVersion, l.srcCluster,
		k.dstWL, k.dstNS, k.dstPrin, k.dstWL, "unknown", host, svcName, svcNS,
		"unknown", proto, strconv.Itoa(k.code), k.grpcStatus, k.flags, security}
	m := s.p.cfg.Metrics
	sr := &series{
		requests: m.requests.WithLabelValues(v...),
		duration: m.duration.WithLabelValues(v...),
		reqBytes: m.reqBytes.WithLabelValues(v...),
		rspBytes: m.rspBytes.WithLabelValues(v...),
	}
	if k.grpc {
		sr.reqMsgs, sr.rspMsgs = m.reqMsgs.WithLabelValues(v...), m.rspMsgs.WithLabelValues(v...)
	}
	s.cache[k] = sr
	return sr
}

func (p *Proxy) record(s *session, r *http.Request, info *reqInfo, d time.Duration, tp string, grpc bool) {
	k := seriesKey{dstWL: "unknown", dstNS: "unknown", dstPrin: "unknown", grpc: grpc, code: info.status, flags: firstNonEmpty(string(info.flags), "-")}
	if grpc {
		k.grpcStatus = info.grpcStatus
	}
	if s.listener != "" {
		k.dstSvc = cmp.Or(clusterHost(info.cluster), "unknown")
	}
	if e := info.picked.Endpoint; e != nil {
		k.dstWL = firstNonEmpty(e.WorkloadName, e.Workload, "unknown")
		k.dstNS = firstNonEmpty(e.Namespace, "unknown")
		k.dstPrin = firstNonEmpty(e.Identity, "unknown")
	}
	reqBytes := info.reqBytes.Load()
	sr := s.series(k)
	sr.requests.Inc()
	sr.duration.Observe(float64(d.Microseconds()) / 1000)
	sr.reqBytes.Observe(float64(reqBytes))
	sr.rspBytes.Observe(float64(info.rspBytes))
	if sr.reqMsgs != nil && info.reqMsgs != nil {
		sr.reqMsgs.Add(float64(info.reqMsgs.count()))
		sr.rspMsgs.Add(float64(info.rspMsgs.count()))
	}
	if !p.cfg.AccessLog.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	l := &s.labels
	attrs := []any{"src_addr", s.remote.String(), "src_identity", s.peer, "src_workload", l.srcWL, "src_namespace", l.srcNS,
		"dst_addr", s.target.String(), "dst_service", firstNonEmpty(k.dstSvc, l.host), "dst_workload", k.dstWL, "dst_namespace", k.dstNS, "dst_identity", k.dstPrin,
		"method", r.Method, "path", r.URL.RequestURI(), "protocol", r.Proto, "status", info.status, "route", info.route,
		"cluster", info.cluster, "upstream", upstreamString(info), "response_flags", k.flags,
		"bytes_recv", reqBytes, "bytes_sent", info.rspBytes, "duration_ms", d.Milliseconds(), "traceparent", tp, "request_id", r.Header.Get("X-Request-Id")}
	if info.audit {
		attrs = append(attrs, "audit", true, "audit_policy", info.auditPolicy)
	}
	attrs = info.shadow.appendLog(attrs)
	p.cfg.AccessLog.Info("request", attrs...)
}

// clusterHost is the host of a cluster named as the control plane names
// them, outbound|<port>|<subset>|<host>, or "" for another name.
func clusterHost(name string) string {
	rest := name
	for range 3 {
		var ok bool
		if _, rest, ok = strings.Cut(rest, "|"); !ok {
			return ""
		}
	}
	if strings.Contains(rest, "|") {
		return ""
	}
	return rest
}

func upstreamString(i *reqInfo) string {
	if i.picked.Addr.IsValid() {
		return i.picked.Addr.String()
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

// grpcStatus is the grpc-status a response carried, in its head (a
// trailers-only response) or its trailers: a code of gRPC's, 0 to 16, or
// "" for none or anything else (an upstream does not get to mint label
// values).
func grpcStatus(h http.Header) string {
	v := h.Get("Grpc-Status")
	if v == "" {
		v = h.Get(http.TrailerPrefix + "Grpc-Status")
	}
	if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 16 || strconv.Itoa(n) != v {
		return ""
	}
	return v
}
