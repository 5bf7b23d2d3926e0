package agent

import "github.com/prometheus/client_golang/prometheus"

// metrics are the agent's Prometheus metrics.
type metrics struct {
	enrolled prometheus.Gauge
	latency  *prometheus.HistogramVec
	failures *prometheus.CounterVec
	ztunnels prometheus.Gauge
	repairs  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		enrolled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weft_cni_enrolled_pods",
			Help: "Pods on this node enrolled in the ambient mesh (redirected, accepted by ztunnel).",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "weft_cni_enrollment_duration_seconds",
			Help:    "Time to enroll a pod: netns checked, ztunnel's ack, rules and probe addresses in place. source is cni (a new pod) or watch (a running pod that joined).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"source"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_cni_enrollment_failures_total",
			Help: "Failed enrollments by reason: netns (missing or wrong namespace), ztunnel (absent or refused), rules, probe_ips, pod (bad annotations), other.",
		}, []string{"reason"}),
		ztunnels: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weft_cni_ztunnel_connections",
			Help: "ztunnel connections on the ZDS socket that received their snapshot.",
		}),
		repairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weft_cni_rule_repairs_total",
			Help: "Enrolled pods whose rules differed from the expected ones and were re-applied.",
		}),
	}
	for _, r := range []string{"netns", "ztunnel", "rules", "probe_ips", "pod", "other"} {
		m.failures.WithLabelValues(r)
	}
	reg.MustRegister(m.enrolled, m.latency, m.failures, m.ztunnels, m.repairs)
	return m
}
