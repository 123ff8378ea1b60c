package frontend

import (
	"github.com/prometheus/client_golang/prometheus"
)

// unknownService is the service label of requests naming no configured
// service, so clients cannot grow the label set.
const unknownService = "_unknown"

// metrics of the frontend, registered on Config.Registry.
type metrics struct {
	requests   *prometheus.CounterVec   // service, code
	latency    *prometheus.HistogramVec // service
	inFlight   prometheus.Gauge
	cacheHits  *prometheus.CounterVec // service, kind (inflight|answered)
	lateItems  prometheus.Counter
	pending    prometheus.GaugeFunc
	replyCache prometheus.GaugeFunc

	held             prometheus.GaugeFunc
	gatingWait       prometheus.Histogram
	watchRestarts    prometheus.Counter
	completions      prometheus.Counter
	completionErrors prometheus.Counter
	auditErrors      prometheus.Counter
	rolledBack       prometheus.Counter
	logged           prometheus.Counter
	recorded         *prometheus.CounterVec // outcome: own|other|error
	adopted          prometheus.Counter
	retakes          prometheus.Counter
	logLatency       prometheus.Histogram
	passThrough      *prometheus.CounterVec // model, code
	// approximate counts the client calls answered with an approximate
	// reply (a parity reconstruction), by service: a subset of the OK
	// answers requests counts.
	approximate *prometheus.CounterVec // service
	// refused counts requests answered ResourceExhausted by admission
	// control (admission.go).
	refused prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, pending, cached, held func() float64) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "requests_total",
			Help: "Client requests answered, by service and gRPC status code.",
		}, []string{"service", "code"}),
		approximate: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "approximate_replies_total",
			Help: "Client requests answered with an approximate reply (reconstructed by a parity model, marked approximate on every API), by service.",
		}, []string{"service"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "request_duration_seconds",
			Help:    "Time from accepting a client request to its answer, by service.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10},
		}, []string{"service"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "in_flight_requests",
			Help: "Client calls currently being served.",
		}),
		cacheHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "idempotent_hits_total",
			Help: "Client retries answered without a second execution, by service and whether the first call was in flight or already answered.",
		}, []string{"service", "kind"}),
		lateItems: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "dropped_items_total",
			Help: "Sink items dropped: their request was no longer pending (expired, answered) or they came from an unexpected model.",
		}),
		pending: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "pending_requests",
			Help: "Requests in the request table (sent into the graph, not yet answered).",
		}, pending),
		replyCache: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "reply_cache_entries",
			Help: "Answers remembered for idempotent retries.",
		}, cached),
		held: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "held_replies",
			Help: "Replies whose sinks all arrived, held until the stateful states they depend on are durable.",
		}, held),
		gatingWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "gating_wait_seconds",
			Help:    "Time from a gated reply's last sink item to its release (0 when its states were already durable).",
			Buckets: []float64{.0001, .0002, .0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5},
		}),
		watchRestarts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "durability_watch_restarts_total",
			Help: "Times the durability watch failed and was restarted.",
		}),
		completions: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "completed_requests_published_total",
			Help: "Req_ids published in completion notices.",
		}),
		completionErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "completion_notice_errors_total",
			Help: "Completion notices that failed to publish (each is retried).",
		}),
		auditErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "audit_write_errors_total",
			Help: "Reply audit records that could not be written.",
		}),
		rolledBack: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "rolled_back_replies_total",
			Help: "Held replies dropped because a stateful model they depend on failed over below their seq; their requests await re-executed items.",
		}),
		logged: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "logged_requests_total",
			Help: "Requests appended to the request log.",
		}),
		recorded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "recorded_answers_total",
			Help: "Answers recorded before release, by outcome (own: this frontend's answer was recorded; other: another frontend had recorded one; error: recording failed).",
		}, []string{"outcome"}),
		retakes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "entry_retakes_total",
			Help: "Entry edges this leading frontend took back after another frontend's sender fenced it off (a newer sender incarnation).",
		}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "adopted_requests_total",
			Help: "Logged requests this frontend injected although it did not accept them (taken over from another frontend).",
		}),
		logLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "request_log_seconds",
			Help:    "Time to append a request to the request log (until JetStream acknowledged it).",
			Buckets: []float64{.0001, .0002, .0005, .001, .002, .005, .01, .02, .05, .1, .5},
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "admission_refused_total",
			Help: "Client requests answered ResourceExhausted at once because the requests or bytes in flight were at their bound (limits.max_inflight_requests, max_inflight_bytes).",
		}),
		passThrough: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "pass_through_calls_total",
			Help: "Calls forwarded to the backend of a pass-through (ha: off) model, by model and gRPC status code.",
		}, []string{"model", "code"}),
	}
	for _, c := range []prometheus.Collector{m.refused, m.passThrough, m.rolledBack, m.logged, m.recorded, m.adopted, m.retakes, m.logLatency, m.requests, m.approximate, m.latency, m.inFlight, m.cacheHits, m.lateItems, m.pending, m.replyCache,
		m.held, m.gatingWait, m.watchRestarts, m.completions, m.completionErrors, m.auditErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// MetricCollectors returns fresh, unregistered collectors of every metric
// a frontend registers. The operations kit's test (deploy/) checks that
// the Grafana dashboard and the alert rules name only metrics that exist.
//
// Label values: code is the gRPC status code name as grpc-go prints it
// (codes.Code.String(): "OK", "Unavailable", ...), on every component.
func MetricCollectors() []prometheus.Collector {
	var rec recorder
	zero := func() float64 { return 0 }
	if _, err := newMetrics(&rec, zero, zero, zero); err != nil {
		panic(err) // recorder.Register never fails
	}
	return rec
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder []prometheus.Collector

func (r *recorder) Register(c prometheus.Collector) error   { *r = append(*r, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { *r = append(*r, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }
