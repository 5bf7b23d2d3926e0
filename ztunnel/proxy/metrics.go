package proxy

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weftmesh/weft/ztunnel/state"
)

// Metrics are ztunnel's connection metrics, with Istio's names and labels so
// existing dashboards read them.
type Metrics struct {
	opened, closed *prometheus.CounterVec
	sent, received *prometheus.CounterVec
	failed         *prometheus.CounterVec
	open           *prometheus.GaugeVec
	limited        prometheus.Counter
	// sourceFallbacks counts inbound connections made from the pod's
	// address because the client's could not be bound; sourceWarned
	// logs the first.
	sourceFallbacks prometheus.Counter
	sourceWarned    atomic.Bool
}

// labelNames are Istio's ztunnel traffic labels.
var labelNames = []string{
	"reporter",
	"source_workload", "source_canonical_service", "source_canonical_revision", "source_workload_namespace", "source_principal", "source_cluster",
	"destination_service", "destination_service_namespace", "destination_service_name",
	"destination_workload", "destination_canonical_service", "destination_canonical_revision", "destination_workload_namespace", "destination_principal", "destination_cluster",
	"request_protocol", "response_flags", "connection_security_policy",
}

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labelNames)
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		opened:   counter("istio_tcp_connections_opened_total", "The total number of TCP connections opened."),
		closed:   counter("istio_tcp_connections_closed_total", "The total number of TCP connections closed."),
		sent:     counter("istio_tcp_sent_bytes_total", "The size of total bytes sent during response in case of a TCP connection."),
		received: counter("istio_tcp_received_bytes_total", "The size of total bytes received during request in case of a TCP connection."),
		failed:   counter("istio_tcp_connections_failed_total", "The total number of TCP connections that failed to be established."),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "istio_tcp_sockets_open", Help: "The number of proxied TCP connections open.",
		}, []string{"reporter"}),
	}
	m.limited = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "weft_ztunnel_pod_connection_limit_refusals_total",
		Help: "Connections refused because their pod had MAX_CONNECTIONS_PER_POD connections open.",
	})
	m.sourceFallbacks = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "weft_ztunnel_original_source_fallbacks_total",
		Help: "Inbound connections made to the app from the pod's own address because the kernel refused the client's (IP_TRANSPARENT).",
	})
	reg.MustRegister(m.open, m.limited, m.sourceFallbacks)
	return m
}

// connLabels describes one proxied connection for metrics and the access log.
type connLabels struct {
	reporter     string // source | destination
	src, dst     *state.Workload
	srcPrincipal string
	dstPrincipal string
	svc          *state.Service
	mtls         bool
	flags        flag
}

func (l *connLabels) values() []string {
	v := make([]string, 0, len(labelNames))
	v = append(v, l.reporter)
	v = appendWorkload(v, l.src, l.srcPrincipal)
	if l.svc != nil {
		v = append(v, l.svc.Hostname, l.svc.Namespace, l.svc.Name)
	} else if l.dst != nil && l.dst.CanonicalName != "" {
		v = append(v, "unknown", l.dst.Namespace, l.dst.CanonicalName)
	} else {
		v = append(v, "unknown", "unknown", "unknown")
	}
	v = appendWorkload(v, l.dst, l.dstPrincipal)
	security := "unknown"
	if l.mtls {
		security = "mutual_tls"
	}
	flags := string(l.flags)
	if l.flags == flagNone {
		flags = "-"
	}
	return append(v, "tcp", flags, security)
}

func appendWorkload(v []string, w *state.Workload, principal string) []string {
	if principal == "" {
		principal = "unknown"
	}
	if w == nil {
		return append(v, "unknown", "unknown", "unknown", "unknown", principal, "unknown")
	}
	name := w.WorkloadName
	if name == "" {
		name = w.Name
	}
	canon := w.CanonicalName
	if canon == "" {
		canon = name
	}
	rev := w.CanonicalRev
	if rev == "" {
		rev = "latest"
	}
	cluster := w.ClusterID
	if cluster == "" {
		cluster = "Kubernetes"
	}
	return append(v, name, canon, rev, w.Namespace, principal, cluster)
}
