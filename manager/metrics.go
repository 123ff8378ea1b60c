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
	stalls        prometheus.Counter
	isolated      prometheus.Counter
	kvConflicts   prometheus.Counter
	kvUpdates     prometheus.Counter
	kvUnreadable  prometheus.Counter
	recoveryTime  prometheus.Histogram
	recoveries    prometheus.Counter
	unrecoverable prometheus.Counter
	active        prometheus.Gauge
	returned      *prometheus.CounterVec
	restarts      prometheus.Counter
	backupReports *prometheus.CounterVec
	// driverErrors: events the recovery machine refused (a bug of the
	// recovery driver, recover.go; the machine was left unchanged).
	driverErrors prometheus.Counter
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
		isolated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_isolated_ticks_total",
			Help: "Membership ticks at which every live component had gone silent at once: the manager took itself to be cut off and declared nobody dead (for at most one lease ttl).",
		}),
		stalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_stalls_total",
			Help: "Membership ticks that came over a quarter suspicion timeout late (the manager was not running); the silence was forgiven.",
		}),
		kvConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_kv_update_conflicts_total",
			Help: "Compare-and-swap conflicts on the deployment state (each one caused a retry).",
		}),
		kvUpdates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_kv_updates_total",
			Help: "Writes of the deployment state.",
		}),
		kvUnreadable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_kv_unreadable_total",
			Help: "Reads of the deployment state that found a value that does not decode (it is rewritten from the last readable one).",
		}),
		recoveryTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hams_manager_recovery_seconds",
			Help:    "Time from the suspicion that started a recovery round to the rewired topology.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		recoveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_recoveries_total",
			Help: "Recovery rounds that rewired the topology.",
		}),
		unrecoverable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_unrecoverable_total",
			Help: "Models recovery had to give up on (e.g. primary and backup both dead).",
		}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hams_manager_active",
			Help: "1 while this manager holds the active-manager lease.",
		}),
		returned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hams_manager_returned_components_total",
			Help: "Components declared dead that were heard from again (false suspicions), by decision: retired (never reused, told to exit) or readmitted (still their model's serving instance).",
		}, []string{"decision"}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_restarted_components_total",
			Help: "Registrations of a known component id by a new process (another incarnation): the old incarnation is declared dead and recovered, the new process admitted as a fresh standby.",
		}),
		backupReports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hams_manager_backup_reports_total",
			Help: "Sidecars' reports that a primary cannot ship to its backup, by outcome: replaced (the backup was retired and replaced) or refused (not the model's primary reporting its live backup).",
		}, []string{"outcome"}),
		driverErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_manager_recovery_driver_errors_total",
			Help: "Events the recovery machine refused (a bug of the manager's recovery driver, logged at error level with the event; 0 in a healthy manager).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.collectors()...)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.registered, m.alive, m.registrations, m.heartbeats, m.failures, m.deaths, m.stalls, m.isolated, m.kvConflicts, m.kvUpdates, m.kvUnreadable,
		m.recoveryTime, m.recoveries, m.unrecoverable, m.active, m.returned, m.restarts, m.backupReports, m.driverErrors}
}

// MetricCollectors returns fresh, unregistered collectors of every metric
// a manager registers (its own; the gRPC server's come from grpcx). The
// operations kit's test (deploy/) checks that the Grafana dashboard and
// the alert rules name only metrics that exist.
func MetricCollectors() []prometheus.Collector { return newMetrics(nil).collectors() }
