package pool

import "github.com/prometheus/client_golang/prometheus"

// metrics of one pool (const label model).
type metrics struct {
	outcome        *prometheus.CounterVec // batches answered: original, reconstructed, failed
	encode, decode prometheus.Histogram
	queue          *prometheus.GaugeVec // data, parity
	lateRows       *prometheus.CounterVec
	lateDiff       prometheus.Histogram
	hedges         prometheus.Counter
	hedgeAfter     prometheus.Gauge
	withdrawn      prometheus.Counter
	standIns       prometheus.Counter
	parityDropped  prometheus.Counter
	parityFailed   *prometheus.CounterVec
	instance       *prometheus.HistogramVec
	instanceErrors *prometheus.CounterVec
	// driverErrors: events the parity machine refused (a bug of the
	// pool's driver; the machine was left unchanged).
	driverErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, model string) *metrics {
	cl := prometheus.Labels{"model": model}
	fast := prometheus.ExponentialBuckets(1e-7, 4, 12) // 100 ns .. 0.4 s
	m := &metrics{
		outcome: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hams_pool_batches_total",
			Help: "Batches the pool answered, by outcome: original (the deployed model's output), reconstructed (ParM, approximate), failed.", ConstLabels: cl}, []string{"outcome"}),
		encode: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hams_pool_encode_seconds",
			Help: "Time to encode one parity batch.", ConstLabels: cl, Buckets: fast}),
		decode: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hams_pool_decode_seconds",
			Help: "Time to reconstruct the missing outputs of one coding group.", ConstLabels: cl, Buckets: fast}),
		queue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hams_pool_queue_depth",
			Help: "Batches waiting for an idle instance, by queue (data, parity).", ConstLabels: cl}, []string{"queue"}),
		lateRows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hams_pool_late_original_rows_total",
			Help: "Rows whose original arrived after their reconstruction was released, by whether the top-1 class agreed.", ConstLabels: cl}, []string{"agreement"}),
		lateDiff: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hams_pool_reconstruction_error",
			Help: "Largest absolute difference between a reconstruction and its late original.", ConstLabels: cl,
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12)}),
		hedges: prometheus.NewCounter(prometheus.CounterOpts{Name: "hams_pool_hedges_total",
			Help: "Second copies of slow batches sent (redundancy hedge).", ConstLabels: cl}),
		hedgeAfter: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hams_pool_hedge_after_seconds",
			Help: "Current hedge delay (the observed p95 service time).", ConstLabels: cl}),
		withdrawn: prometheus.NewCounter(prometheus.CounterOpts{Name: "hams_pool_withdrawn_total",
			Help: "Queued batches answered before they ran (reconstructed or cancelled).", ConstLabels: cl}),
		standIns: prometheus.NewCounter(prometheus.CounterOpts{Name: "hams_pool_stand_ins_total",
			Help: "Answered batches that completed a coding group closed short of k members (fill_after).", ConstLabels: cl}),
		parityDropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "hams_pool_parity_dropped_total",
			Help: "Parity batches dropped before they ran (every original arrived).", ConstLabels: cl}),
		parityFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hams_pool_parity_failed_total",
			Help: "Parity batches that cost their group's reconstruction, by reason (gRPC code, shape, encode, decode).", ConstLabels: cl}, []string{"reason"}),
		instance: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hams_pool_instance_seconds",
			Help: "Calls on the pool's instances, by kind (data, parity).", ConstLabels: cl, Buckets: prometheus.ExponentialBuckets(1e-4, 2, 16)}, []string{"kind"}),
		instanceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hams_pool_instance_errors_total",
			Help: "Failed calls on the pool's instances, by kind and gRPC code.", ConstLabels: cl}, []string{"kind", "code"}),
		driverErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "hams_pool_driver_errors_total",
			Help: "Events the pool's parity machine refused (a bug of the pool's driver, logged at error level with the event; 0 in a healthy pool).", ConstLabels: cl}),
	}
	reg.MustRegister(m.outcome, m.encode, m.decode, m.queue, m.lateRows, m.lateDiff, m.hedges, m.hedgeAfter,
		m.withdrawn, m.standIns, m.parityDropped, m.parityFailed, m.instance, m.instanceErrors, m.driverErrors)
	return m
}

// MetricCollectors returns fresh, unregistered collectors of every metric
// a pool registers (model label "model"; online parity training's
// included). The operations kit's test (deploy/) checks that the Grafana
// dashboard and the alert rules name only metrics that exist.
func MetricCollectors() []prometheus.Collector {
	var rec recorder
	newMetrics(&rec, "model")
	newOnlineMetrics(&rec, "model")
	return rec
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder []prometheus.Collector

func (r *recorder) Register(c prometheus.Collector) error   { *r = append(*r, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { *r = append(*r, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }
