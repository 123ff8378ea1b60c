package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of one sidecar (const label model).
type metrics struct {
	itemsIn   prometheus.Counter
	requests  prometheus.Counter
	batches   prometheus.Counter
	batchSize prometheus.Histogram
	backend   prometheus.Histogram
	lineage   prometheus.Histogram
	queue     prometheus.Gauge
	errors    *prometheus.CounterVec
	dropped   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, model string) *metrics {
	cl := prometheus.Labels{"model": model}
	m := &metrics{
		itemsIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_sidecar_items_received_total", Help: "Items received in order on inbound edges.", ConstLabels: cl}),
		requests: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_sidecar_requests_total", Help: "Requests executed by the backend successfully.", ConstLabels: cl}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hams_sidecar_batches_total", Help: "Backend calls (batches).", ConstLabels: cl}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "hams_sidecar_batch_size", Help: "Requests per backend call.", ConstLabels: cl,
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}}),
		backend: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "hams_sidecar_backend_seconds", Help: "Latency of one backend call.", ConstLabels: cl,
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5}}),
		lineage: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "hams_sidecar_lineage_seconds", Help: "Lineage bookkeeping (seqs, digests, entries) per batch.", ConstLabels: cl,
			Buckets: []float64{.000001, .0000025, .000005, .00001, .000025, .00005, .0001, .00025, .0005, .001, .01}}),
		queue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hams_sidecar_queue_depth", Help: "Requests waiting for a batch plus incomplete joins.", ConstLabels: cl}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hams_sidecar_errors_total", Help: "Requests this sidecar failed, by gRPC code.", ConstLabels: cl}, []string{"code"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hams_sidecar_items_dropped_total", Help: "Inbound items dropped (unknown predecessor, late or duplicate join part).", ConstLabels: cl}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.itemsIn, m.requests, m.batches, m.batchSize, m.backend, m.lineage, m.queue, m.errors, m.dropped)
	}
	return m
}
