package xdsserver

import "github.com/prometheus/client_golang/prometheus"

// metrics uses istiod's names where istiod has one.
type metrics struct {
	clients      prometheus.Gauge
	pushes       *prometheus.CounterVec
	sent         *prometheus.CounterVec
	rejects      *prometheus.CounterVec
	convergence  *prometheus.HistogramVec
	resources    *prometheus.GaugeVec
	authFailures prometheus.Counter
	refused      *prometheus.CounterVec
}

func newMetrics() metrics {
	return metrics{
		clients: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pilot_xds",
			Help: "Connected delta xDS clients.",
		}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pilot_xds_pushes",
			Help: "xDS responses sent, by type (wds: istio.workload.Address, wads: istio.security.Authorization).",
		}, []string{"type"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_xds_resources_sent_total",
			Help: "Resources sent or removed in xDS responses, by type.",
		}, []string{"type"}),
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pilot_total_xds_rejects",
			Help: "xDS responses a client rejected (NACKed), by type.",
		}, []string{"type"}),
		convergence: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pilot_proxy_convergence_time",
			Help:    "Seconds from a Kubernetes change being observed to its xDS response being sent to a client.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"type"}),
		resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "weft_xds_resources",
			Help: "Resources held for xDS clients, by type.",
		}, []string{"type"}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pilot_xds_auth_failures_total",
			Help: "xDS streams refused because the caller failed authentication.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_xds_rejected_streams_total",
			Help: "xDS streams ended because their caller may not subscribe to a type or to more names, by type URL and reason " +
				"(not_node_proxy, not_waypoint, unauthenticated, too_many_names).",
		}, []string{"type_url", "reason"}),
	}
}

func (m metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.clients, m.pushes, m.sent, m.rejects, m.convergence, m.resources, m.authFailures, m.refused} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
