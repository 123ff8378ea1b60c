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
}

func newMetrics(reg prometheus.Registerer, pending, cached func() float64) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "hams", Subsystem: "frontend", Name: "requests_total",
			Help: "Client requests answered, by service and gRPC status code.",
		}, []string{"service", "code"}),
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
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.inFlight, m.cacheHits, m.lateItems, m.pending, m.replyCache} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
