package manager

import "github.com/prometheus/client_golang/prometheus"

// metrics of the manager, registered on Config.Registry.
type metrics struct {
	registered    prometheus.Gauge
	alive         prometheus.Gauge
	registrations prometheus.Counter
	heartbeats    prometheus.Counter
	failures      prometheus.Counter
	deaths        prometheus.Counter
	kvConflicts   prometheus.Counter
	kvUpdates     prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		registered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hams_manager_registered_components",
			Help: "Components the manager tracks (registered or known from persisted state).",
		}),
		alive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hams_manager_alive_components",
			Help: "Tracked components currently considered alive.",
		}),
		registrations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_registrations_total",
			Help: "Successful Register calls.",
		}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_heartbeats_received_total",
			Help: "Heartbeats received from registered components.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_failure_reports_total",
			Help: "Failure reports received.",
		}),
		deaths: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_components_declared_dead_total",
			Help: "Components declared dead after missing their heartbeats.",
		}),
		kvConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_kv_update_conflicts_total",
			Help: "Compare-and-swap conflicts on the deployment state (each one caused a retry).",
		}),
		kvUpdates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_kv_updates_total",
			Help: "Writes of the deployment state.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.registered, m.alive, m.registrations, m.heartbeats, m.failures, m.deaths, m.kvConflicts, m.kvUpdates)
	}
	return m
}
