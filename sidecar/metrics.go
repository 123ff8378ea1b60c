package sidecar

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hams-go/hams/internal/config"
)

// metrics of one sidecar (const label model).
//
// Labels: every series carries model; code labels are gRPC status code
// names as grpc-go prints them (codes.Code.String(): "OK", "Unavailable",
// ...), as on every component (docs/operations.md). The instance's role
// is not a label of these series: a backup is promoted and a standby
// takes traffic at run time, and a role label would end one series and
// start another at each failover. hams_sidecar_role carries it instead
// (watch): one series per possible role, 1 for the current one, joined
// in queries with `* on (model, instance) group_left (role)
// (hams_sidecar_role == 1)`.
type metrics struct {
	labels prometheus.Labels // const labels (model)

	itemsIn   prometheus.Counter
	requests  prometheus.Counter
	batches   prometheus.Counter
	batchSize prometheus.Histogram
	backend   prometheus.Histogram
	lineage   prometheus.Histogram
	queue     prometheus.Gauge
	errors    *prometheus.CounterVec
	dropped   *prometheus.CounterVec

	// State manager (replicated stateful models).
	update        prometheus.Histogram
	snapCopy      prometheus.Histogram
	snapDelivery  prometheus.Histogram
	stateBytes    prometheus.Gauge
	shipped       prometheus.Counter
	shipRetries   prometheus.Counter
	shipSelf      prometheus.Counter
	shipBulk      prometheus.Counter
	outlogBytes   prometheus.Gauge
	outlogItems   prometheus.Gauge
	outlogBlocked prometheus.Counter
	applied       prometheus.Counter
	applySeconds  prometheus.Histogram
	pending       prometheus.Gauge
	durableSeq    prometheus.Gauge
	backupSynced  prometheus.Gauge
	// Stage breakdown of the state path.
	updateWait prometheus.Histogram // compute end -> update issued (waits for a copy)
	copyPin    prometheus.Histogram // copy start -> state captured
	shipSend   prometheus.Histogram // one ShipSnapshot call
	coalesced  prometheus.Histogram // batches per shipped snapshot
	deltaBytes prometheus.Histogram // bytes of a delta snapshot's state
	shipBytes  prometheus.Counter   // state bytes of acknowledged snapshots
	applyWait  prometheus.Histogram // backup: received -> applied
	announce   prometheus.Histogram // backup: Coord.Announce
	// noticeStores: backup: durability notices stored in the durability
	// stream (result stored or failed; coord.NoticePersister).
	noticeStores *prometheus.CounterVec

	// Recovery.
	transitions *prometheus.CounterVec
	resent      prometheus.Counter
	backendDown prometheus.Counter
	// backendHealthy is 1 while the last health check passed (health.go).
	backendHealthy prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, model string) *metrics {
	cl := prometheus.Labels{"model": model}
	m := &metrics{
		labels: cl,
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
	secs := []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5}
	m.update = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_update_seconds", Help: "Latency of one backend Update (stateful primary).", ConstLabels: cl, Buckets: secs})
	m.snapCopy = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_snapshot_copy_seconds", Help: "Time to copy the state after a batch into a snapshot buffer (ReadState).", ConstLabels: cl, Buckets: secs})
	m.snapDelivery = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_snapshot_delivery_seconds", Help: "From a snapshot's copy to the backup's acknowledgement.", ConstLabels: cl, Buckets: secs})
	m.stateBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hams_sidecar_state_bytes", Help: "Bytes of the model state in the last snapshot.", ConstLabels: cl})
	m.shipped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hams_sidecar_snapshots_shipped_total", Help: "Snapshots acknowledged by the backup.", ConstLabels: cl})
	m.shipRetries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hams_sidecar_snapshot_ship_retries_total", Help: "Snapshot shipments that failed and were resent.", ConstLabels: cl})
	m.shipBulk = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hams_sidecar_snapshot_bulk_total",
		Help: "Snapshots acknowledged after shipping over the bulk stream (large states and deltas) instead of ShipSnapshot.", ConstLabels: cl})
	m.shipSelf = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hams_sidecar_snapshot_ship_self_waits_total", Help: "Times the shipper waited because the topology still named this instance as the backup (promoted, not rewired yet).", ConstLabels: cl})
	m.outlogBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hams_sidecar_output_log_bytes", Help: "Tensor bytes of released outputs kept until their requests complete.", ConstLabels: cl})
	m.outlogItems = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hams_sidecar_output_log_items", Help: "Items (per out-edge) kept in the output log.", ConstLabels: cl})
	m.outlogBlocked = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hams_sidecar_output_log_full_total", Help: "Times a batch was held because the output log was full.", ConstLabels: cl})
	m.applied = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hams_sidecar_backup_applied_total", Help: "Snapshots the backup applied.", ConstLabels: cl})
	m.applySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_backup_apply_seconds", Help: "Backup WriteState latency.", ConstLabels: cl, Buckets: secs})
	m.pending = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hams_sidecar_backup_pending_snapshots", Help: "Snapshots the backup holds, waiting for earlier batches or PFM durability.", ConstLabels: cl})
	m.durableSeq = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hams_sidecar_durable_seq", Help: "Highest request seq covered by an applied snapshot (backup).", ConstLabels: cl})
	m.backupSynced = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hams_sidecar_backup_synced", Help: "1 once the backup applied a snapshot on a base (a full state) from its current primary: it can be promoted without losing state; 0 while it waits for that base (a new or re-chosen backup).", ConstLabels: cl})
	m.updateWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_update_wait_seconds", Help: "From a batch's compute end to its Update being issued (waits for the previous copy).", ConstLabels: cl, Buckets: secs})
	m.copyPin = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_snapshot_capture_seconds", Help: "From a copy's start to the backend capturing the state (updates may go on after it).", ConstLabels: cl, Buckets: secs})
	m.shipSend = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_snapshot_send_seconds", Help: "One ShipSnapshot call to the backup (send and acknowledgement).", ConstLabels: cl, Buckets: secs})
	m.coalesced = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_snapshot_batches", Help: "Batches covered by one shipped snapshot.", ConstLabels: cl,
		Buckets: []float64{0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64}})
	m.deltaBytes = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_snapshot_delta_bytes", Help: "State bytes a batch changed (delta snapshots: what is shipped instead of the whole state).", ConstLabels: cl,
		Buckets: prometheus.ExponentialBuckets(256, 4, 12)})
	m.shipBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hams_sidecar_snapshot_shipped_bytes_total", Help: "State bytes (a delta snapshot's: its ranges) of snapshots the backup acknowledged.", ConstLabels: cl})
	m.applyWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_backup_apply_wait_seconds", Help: "Backup: from a snapshot's arrival to its apply starting (earlier batches, PFM durability, the applier).", ConstLabels: cl, Buckets: secs})
	m.announce = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "hams_sidecar_backup_announce_seconds", Help: "Backup: publishing one durability notice.", ConstLabels: cl, Buckets: secs})
	m.noticeStores = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "hams_sidecar_backup_notice_stores_total",
		Help:        "Backup: attempts to store its newest durability notice in the durability stream (spaced; what catch-up reads and LastDurable see), by result: stored, or failed (retried with backoff).",
		ConstLabels: cl}, []string{"result"})
	m.noticeStores.WithLabelValues("stored") // both series exist from the start (an alert compares them)
	m.noticeStores.WithLabelValues("failed")
	m.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hams_sidecar_role_transitions_total", Help: "Recovery orders carried out (promote, demote, rollback).", ConstLabels: cl}, []string{"kind"})
	m.resent = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hams_sidecar_resent_items_total", Help: "Saved outputs queued again by Resend.", ConstLabels: cl})
	m.backendDown = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hams_sidecar_backend_unreachable_total", Help: "Backend calls that found the model server unreachable (the batch is held and retried, not failed).", ConstLabels: cl})
	m.backendHealthy = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hams_sidecar_backend_healthy", Help: "1 while the backend's last health check passed, 0 after a failed one (and before the first check, or with checks off).", ConstLabels: cl})
	if reg != nil {
		reg.MustRegister(m.transitions, m.resent, m.backendDown, m.backendHealthy, m.itemsIn, m.requests, m.batches, m.batchSize, m.backend, m.lineage, m.queue, m.errors, m.dropped,
			m.update, m.snapCopy, m.snapDelivery, m.stateBytes, m.shipped, m.shipRetries, m.shipSelf, m.shipBulk, m.outlogBytes, m.outlogItems,
			m.outlogBlocked, m.applied, m.applySeconds, m.pending, m.durableSeq, m.backupSynced,
			m.updateWait, m.copyPin, m.shipSend, m.coalesced, m.deltaBytes, m.shipBytes, m.applyWait, m.announce, m.noticeStores)
	}
	return m
}

// Values of hams_sidecar_role's role label: a sidecar is a primary (the
// serving instance; a stateless model's only one), a backup (of a
// replicated stateful model), a standby (a stateless model's hot standby
// before its promotion) or deposed (a primary another instance replaced;
// it serves nothing until demoted or retired).
var metricRoles = []config.Role{config.RolePrimary, config.RoleBackup, config.RoleStandby, RoleDeposed}

// metricRole is the sidecar's role as hams_sidecar_role names it.
func (s *Sidecar) metricRole() config.Role {
	r := s.Role()
	if r == config.RolePrimary && s.cfg.Standby {
		select {
		case <-s.collecting:
		default:
			return config.RoleStandby
		}
	}
	return r
}

// watch registers on reg the metrics read from s when scraped: its role
// (hams_sidecar_role), and for a replicated model the output log's bound
// and the durability lag (the shipper's snapshots the backup has not
// applied). Called once, when s is built.
func (m *metrics) watch(reg prometheus.Registerer, s *Sidecar) {
	var ship *shipper
	if s.prim != nil {
		ship = s.prim.ship
	}
	cs := m.watched(s.metricRole, s.outlog, ship)
	if reg != nil {
		reg.MustRegister(cs...)
	}
}

// watched builds watch's collectors: role reports the current role;
// outlog and ship may be nil (a model that is not replicated).
func (m *metrics) watched(role func() config.Role, outlog *OutputLog, ship *shipper) []prometheus.Collector {
	var cs []prometheus.Collector
	for _, r := range metricRoles {
		l := prometheus.Labels{"role": r.String()}
		for k, v := range m.labels {
			l[k] = v
		}
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hams_sidecar_role", ConstLabels: l,
			Help: "1 for the sidecar's current role (primary, backup, standby, deposed), 0 for the others: an info metric to join on (model, instance); roles change at run time (promotion), the series do not.",
		}, func() float64 {
			if role() == r {
				return 1
			}
			return 0
		}))
	}
	if outlog != nil {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "hams_sidecar_output_log_limit_bytes", ConstLabels: m.labels,
			Help: "Bound of the output log (hams_sidecar_output_log_bytes): at it, no new batch starts until completion notices free space.",
		}, func() float64 { return float64(outlog.limit) }))
	}
	if ship != nil {
		cs = append(cs,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "hams_sidecar_durability_lag_seconds", ConstLabels: m.labels,
				Help: "Primary: age of the oldest copied state the backup has not applied yet (0 when every copied state is durable); replies depending on newer states wait at the frontend.",
			}, func() float64 {
				_, age := ship.lag(time.Now())
				return age.Seconds()
			}),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "hams_sidecar_unapplied_snapshots", ConstLabels: m.labels,
				Help: "Primary: snapshots copied but not yet applied by the backup (queued, being sent, or acknowledged and waiting to be applied).",
			}, func() float64 {
				n, _ := ship.lag(time.Now())
				return float64(n)
			}))
	}
	return cs
}

// lag is the number of snapshots the backup has not applied (queued or
// acknowledged but unapplied) and the age of the oldest one at now.
func (sh *shipper) lag(now time.Time) (n int, oldest time.Duration) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, list := range [][]*snapshot{sh.unapplied, sh.queue} {
		for _, sn := range list {
			n++
			if !sn.copiedAt.IsZero() {
				oldest = max(oldest, now.Sub(sn.copiedAt))
			}
		}
	}
	return n, oldest
}

// MetricCollectors returns fresh, unregistered collectors of every metric
// a sidecar registers (model label "model", every watched metric
// included). The operations kit's test (deploy/) checks that the Grafana
// dashboard and the alert rules name only metrics that exist.
func MetricCollectors() []prometheus.Collector {
	var rec recorder
	m := newMetrics(&rec, "model")
	sh := newShipper(nil)
	return append(rec, m.watched(func() config.Role { return config.RolePrimary }, NewOutputLog(1), sh)...)
}

// recorder is a prometheus.Registerer that keeps what is registered.
type recorder []prometheus.Collector

func (r *recorder) Register(c prometheus.Collector) error   { *r = append(*r, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { *r = append(*r, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }
