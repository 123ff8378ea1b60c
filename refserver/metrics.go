package refserver

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hams-go/hams/refserver/models"
)

// register registers c on reg, reusing an identical collector already
// registered (two servers in one process may share a registry).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
		panic(fmt.Sprintf("refserver: register metrics: %v", err))
	}
	return c
}

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	// straggled and straggleSeconds count the calls a Straggler held and
	// the time they waited.
	straggled       *prometheus.CounterVec
	straggleSeconds *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, hosted map[string]models.Model) *metrics {
	var state *prometheus.GaugeVec
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hams_refserver_requests_total",
			Help: "Batches handled per model, API method and gRPC status code (OK, Unavailable, ... as grpc-go names them).",
		}, []string{"model", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hams_refserver_batch_seconds",
			Help:    "Time to run one batch (Infer, Compute, Update) per model.",
			Buckets: []float64{.0001, .0005, .001, .002, .005, .01, .02, .05, .1, .5, 1},
		}, []string{"model", "method"}),
		straggled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hams_modelserver_straggle_delayed_total",
			Help: "Infer/Compute calls that arrived in a slow window of the server's straggle schedule, per model and API method.",
		}, []string{"model", "method"}),
		straggleSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hams_modelserver_straggle_delay_seconds_total",
			Help: "Time Infer/Compute calls waited for the server's straggle schedule, per model and API method.",
		}, []string{"model", "method"}),
	}
	state = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "hams_refserver_state_bytes",
		Help: "Size of a model's state (0 for stateless models).",
	}, []string{"model"})
	m.requests = register(reg, m.requests)
	m.latency = register(reg, m.latency)
	m.straggled = register(reg, m.straggled)
	m.straggleSeconds = register(reg, m.straggleSeconds)
	state = register(reg, state)
	for name, h := range hosted {
		state.WithLabelValues(name).Set(float64(h.StateInfo().TotalBytes))
	}
	register(reg, &streamCollector{hosted: hosted})
	return m
}

// streamCollector reports the stream tables of per-stream models
// (models.StreamTable): live streams, slots, and evictions.
type streamCollector struct {
	hosted map[string]models.Model
}

var (
	streamLiveDesc = prometheus.NewDesc("hams_refserver_stream_slots_live",
		"Stream slots held by live streams, per per-stream model (the rest are free).", []string{"model"}, nil)
	streamSlotsDesc = prometheus.NewDesc("hams_refserver_stream_slots",
		"Stream slots of a per-stream model (param streams): at most this many streams keep their state at once.", []string{"model"}, nil)
	streamEvictDesc = prometheus.NewDesc("hams_refserver_stream_evictions_total",
		"Streams evicted (least recently used first) to give a new stream a slot; an evicted stream that returns starts from zero state.", []string{"model"}, nil)
)

func (c *streamCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- streamLiveDesc
	ch <- streamSlotsDesc
	ch <- streamEvictDesc
}

func (c *streamCollector) Collect(ch chan<- prometheus.Metric) {
	for name, m := range c.hosted {
		live, slots, ev, ok := models.StreamTable(m)
		if !ok {
			continue
		}
		ch <- prometheus.MustNewConstMetric(streamLiveDesc, prometheus.GaugeValue, float64(live), name)
		ch <- prometheus.MustNewConstMetric(streamSlotsDesc, prometheus.GaugeValue, float64(slots), name)
		ch <- prometheus.MustNewConstMetric(streamEvictDesc, prometheus.CounterValue, float64(ev), name)
	}
}

// MetricCollectors returns fresh, unregistered collectors of every metric
// a model server registers. The operations kit's test (deploy/) checks
// that the Grafana dashboard and the alert rules name only metrics that
// exist.
func MetricCollectors() []prometheus.Collector {
	var rec recorder
	newMetrics(&rec, nil)
	return rec
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder []prometheus.Collector

func (r *recorder) Register(c prometheus.Collector) error   { *r = append(*r, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { *r = append(*r, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }
