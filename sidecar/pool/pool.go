// Package pool is a replica pool for a stateless model: several instances
// of the same model behind one sidecar, one queue (an idle instance takes
// the next batch), with optional straggler protection: Equal-Resources
// (more copies), hedging (a slow batch is sent again to an idle copy) or
// ParM (coding groups of k batches, parity models, reconstruction of a
// missing output; docs/design.md "Parity models").
//
// The decisions are protocol/parity's Machine (pure); this package is its
// driver: it performs the machine's actions (calls on instances, encoding
// off the dispatch path, decoding) and feeds it their outcomes. Every
// event goes through the machine's Step (Pool.step), under mu; the reads
// (NextDeadline, QueueDepth) and hedge's delay (SetHedgeAfter) are plain
// methods, as package protocol's doc has it. A Pool is a
// sidecar.ConcurrentBackend: the sidecar runs several batches through it
// at once, and one output comes back per batch (a reconstruction is marked
// approximate in BatchResponse.approximate).
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gonum.org/v1/gonum/stat"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/paritytrain"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protocol"
	"github.com/hams-go/hams/protocol/parity"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/sidecar"
)

// ErrConfig is wrapped by New's validation errors.
var ErrConfig = errors.New("pool: invalid config")

// ErrStopped answers calls made after the pool stopped.
var ErrStopped = errors.New("pool: stopped")

// Config of a Pool.
type Config struct {
	// Model names the pool in logs and metrics.
	Model string
	// Data are the instances serving the deployed model (under er and
	// hedge the extra copies too); Parity the parity model instances
	// (parm). The pool does not close them.
	Data, Parity []sidecar.Backend
	// ParityModel is the parity model's name at the parity backends;
	// ParityModels, when set, names parity model j for each j < r (each
	// parity instance hosts all of them), else every j uses ParityModel.
	ParityModel  string
	ParityModels []string
	Redundancy   parity.Redundancy
	Code         parity.Code
	// Encoder: sum or concat (Image is then height, width, channels).
	Encoder parity.EncoderKind
	Image   [3]int
	// DecodeAfter and FillAfter: see parity.Config.
	DecodeAfter, FillAfter time.Duration
	// HedgeAfter: hedge's delay; 0 follows the observed p95 service time.
	HedgeAfter time.Duration
	// Online, when set, trains the parity models from live traffic and
	// swaps them into the parity instances, which must implement
	// WeightLoader (parm only).
	Online *OnlineConfig
	// CallTimeout bounds one call on an instance (default 5 s).
	CallTimeout time.Duration
	Logger      *slog.Logger
	Registry    prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Pool is a replica pool; see the package doc.
type Pool struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	dec     *parity.Decoder
	online  *online // nil unless parity models are trained online
	epoch   time.Time

	mu       sync.Mutex
	m        *parity.Machine
	nextID   parity.BatchID
	calls    map[parity.BatchID]*call
	groups   map[parity.GroupID]*group
	encodeQ  []encodeJob
	samples  []float64 // recent data service times (seconds), for hedge's p95
	nSamples int
	// recent are the last originals answered (parm), stand-ins for groups
	// closed short of k members (parity.Config.FillAfter).
	recent  []standIn
	stopped bool

	dataWork []chan dataJob
	parWork  []chan parityJob
	kick     chan struct{} // the machine's next deadline may have changed
	encKick  chan struct{}
	started  chan struct{}
	runCtx   context.Context
}

type call struct {
	id  parity.BatchID
	req *hamsv1.BatchRequest
	// ctx carries the Infer's values (the request identity) without its
	// cancellation: a late original still feeds the agreement metric.
	ctx     context.Context
	done    chan result
	resp    *hamsv1.BatchResponse // the first original that arrived
	recon   []*hamsv1.Tensor      // its reconstruction, once decoded
	lastErr error
	group   parity.GroupID
}

type result struct {
	resp *hamsv1.BatchResponse
	err  error
}

// standIn is an answered batch standing in for a missing member of a
// group: its inputs are encoded, its outputs are known.
type standIn struct {
	inputs, outputs []*hamsv1.Tensor
	rows            uint32
}

// maxRecent bounds the stand-ins kept.
const maxRecent = 8

type group struct {
	members  []parity.BatchID
	standIns []standIn
	parity   []*hamsv1.BatchRequest // encoded parity batches
	outputs  [][]*hamsv1.Tensor     // parity outputs
	maxRows  uint32
}

type dataJob struct {
	c *call
}

type parityJob struct {
	g   parity.GroupID
	j   int
	req *hamsv1.BatchRequest
}

type encodeJob struct {
	g      parity.GroupID
	j      int
	inputs [][]*hamsv1.Tensor
}

// New validates cfg (no I/O).
func New(cfg Config) (*Pool, error) {
	var errs []error
	if len(cfg.Data) == 0 {
		errs = append(errs, fmt.Errorf("%w: model %q: no data instances", ErrConfig, cfg.Model))
	}
	if cfg.Redundancy == parity.RedundancyParM {
		if len(cfg.Parity) < cfg.Code.R {
			errs = append(errs, fmt.Errorf("%w: model %q: %d parity instances for r = %d", ErrConfig, cfg.Model, len(cfg.Parity), cfg.Code.R))
		}
		if len(cfg.ParityModels) > 0 && len(cfg.ParityModels) != cfg.Code.R {
			errs = append(errs, fmt.Errorf("%w: model %q: %d parity model names for r = %d", ErrConfig, cfg.Model, len(cfg.ParityModels), cfg.Code.R))
		}
		if cfg.ParityModel == "" && len(cfg.ParityModels) == 0 {
			errs = append(errs, fmt.Errorf("%w: model %q: no parity model name", ErrConfig, cfg.Model))
		}
		if cfg.Encoder == parity.EncoderConcat {
			if _, err := parity.NewConcatEncoder(cfg.Code, cfg.Image[0], cfg.Image[1], cfg.Image[2]); err != nil {
				errs = append(errs, fmt.Errorf("%w: model %q: %v", ErrConfig, cfg.Model, err))
			}
		}
		if cfg.Online != nil {
			for i, b := range cfg.Parity {
				if _, ok := b.(WeightLoader); !ok {
					errs = append(errs, fmt.Errorf("%w: model %q: online parity training needs parity instances whose weights can be replaced (backend type reference); parity instance %d is a %T", ErrConfig, cfg.Model, i, b))
				}
			}
		}
	} else {
		cfg.Parity = nil
		cfg.Online = nil
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	hedge := cfg.HedgeAfter
	if hedge == 0 {
		hedge = initialHedge
	}
	m, err := parity.NewMachine(parity.Config{
		Redundancy: cfg.Redundancy, Code: cfg.Code, DataInstances: len(cfg.Data), ParityInstances: len(cfg.Parity),
		DecodeAfter: cfg.DecodeAfter, HedgeAfter: hedge, FillAfter: cfg.FillAfter,
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("%w: model %q: %v", ErrConfig, cfg.Model, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	p := &Pool{
		cfg: cfg, log: log, metrics: newMetrics(reg, cfg.Model), m: m,
		calls: map[parity.BatchID]*call{}, groups: map[parity.GroupID]*group{},
		kick: make(chan struct{}, 1), encKick: make(chan struct{}, 1), started: make(chan struct{}),
	}
	if cfg.Redundancy == parity.RedundancyParM {
		p.dec = parity.NewDecoder(cfg.Code)
	}
	if cfg.Online != nil {
		oc := cfg.Online.withDefaults()
		var loaders []WeightLoader
		for _, b := range cfg.Parity {
			loaders = append(loaders, b.(WeightLoader))
		}
		p.online = &online{cfg: oc, code: cfg.Code, enc: cfg.Encoder, models: p.parityModel, loaders: loaders,
			log: log.With("component", "online parity training"), m: newOnlineMetrics(reg, cfg.Model), offers: make(chan offered, 256)}
		if cfg.Encoder == parity.EncoderConcat && oc.Image.Size() == 0 {
			p.online.cfg.Image = paritytrain.Image{H: cfg.Image[0], W: cfg.Image[1], C: cfg.Image[2]}
		}
	}
	for range cfg.Data {
		p.dataWork = append(p.dataWork, make(chan dataJob, 1))
	}
	for range cfg.Parity {
		p.parWork = append(p.parWork, make(chan parityJob, 1))
	}
	return p, nil
}

// initialHedge is hedge's delay until enough service times were observed.
const initialHedge = 20 * time.Millisecond

// hedgeSamples: the p95 is taken over this many recent service times and
// recomputed every hedgeEvery of them.
const (
	hedgeSamples = 1024
	hedgeEvery   = 64
)

// Concurrency is how many batches the sidecar may have in the pool at
// once: every instance busy and one batch ready behind them. A straggler
// holds an instance; a batch reconstructed meanwhile frees its executor.
func (p *Pool) Concurrency() int { return len(p.cfg.Data) + 1 }

// Run runs the instance workers, the encoder and the timer until ctx ends.
// Calls in flight then fail with ErrStopped.
func (p *Pool) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.runCtx != nil {
		p.mu.Unlock()
		return errors.New("pool: Run called twice")
	}
	p.runCtx = ctx
	p.epoch = p.cfg.Now()
	p.mu.Unlock()
	var wg sync.WaitGroup
	for i := range p.cfg.Data {
		wg.Go(func() { p.dataWorker(ctx, i) })
	}
	for i := range p.cfg.Parity {
		wg.Go(func() { p.parityWorker(ctx, i) })
	}
	if p.cfg.Redundancy == parity.RedundancyParM {
		wg.Go(func() { p.encoder(ctx) })
	}
	if p.online != nil {
		wg.Go(func() { p.online.run(ctx) })
	}
	wg.Go(func() { p.timer(ctx) })
	close(p.started)
	<-ctx.Done()
	wg.Wait()
	p.mu.Lock()
	p.stopped = true
	for id, c := range p.calls {
		select {
		case c.done <- result{err: status.Error(codes.Unavailable, ErrStopped.Error())}:
		default:
		}
		delete(p.calls, id)
	}
	p.mu.Unlock()
	return nil
}

// now is the machine's clock: time since Run started.
func (p *Pool) now() time.Duration { return p.cfg.Now().Sub(p.epoch) }

// Describe asks the data instances in turn (the first that answers).
func (p *Pool) Describe(ctx context.Context) (*hamsv1.ModelDescription, error) {
	var errs []error
	for i, b := range p.cfg.Data {
		d, err := b.Describe(ctx)
		if err == nil {
			if d.GetStateful() {
				return nil, status.Errorf(codes.FailedPrecondition, "pool %s: instance %d serves a stateful model: a replica pool is for stateless models", p.cfg.Model, i)
			}
			return d, nil
		}
		errs = append(errs, fmt.Errorf("instance %d: %w", i, err))
	}
	return nil, fmt.Errorf("pool %s: describe: %w", p.cfg.Model, errors.Join(errs...))
}

// Health is healthy while some data instance is.
func (p *Pool) Health(ctx context.Context) error {
	var errs []error
	for i, b := range p.cfg.Data {
		if err := b.Health(ctx); err == nil {
			return nil
		} else {
			errs = append(errs, fmt.Errorf("instance %d: %w", i, err))
		}
	}
	return status.Errorf(codes.Unavailable, "pool %s: no data instance healthy: %v", p.cfg.Model, errors.Join(errs...))
}

// Close is a no-op: Run's context stops the pool, and whoever built the
// instances closes them.
func (p *Pool) Close() error { return nil }

// Infer runs one batch through the pool and returns its original output
// or, marked approximate, its reconstruction.
func (p *Pool) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	select {
	case <-p.started:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c := &call{req: req, ctx: context.WithoutCancel(ctx), done: make(chan result, 1)}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return nil, status.Error(codes.Unavailable, ErrStopped.Error())
	}
	p.nextID++
	c.id = p.nextID
	p.calls[c.id] = c
	if err := p.step(parity.Submitted{Batch: c.id, Now: p.now()}); err != nil {
		// The machine did not take the batch: nothing would ever answer it.
		delete(p.calls, c.id)
		p.mu.Unlock()
		return nil, status.Errorf(codes.Internal, "pool %s: submit batch: %v", p.cfg.Model, err)
	}
	p.mu.Unlock()
	p.wake()
	select {
	case r := <-c.done:
		return r.resp, r.err
	case <-ctx.Done():
		p.mu.Lock()
		_ = p.step(parity.Cancelled{Batch: c.id, Now: p.now()}) // logged and counted by step
		p.mu.Unlock()
		p.wake()
		return nil, ctx.Err()
	}
}

func (p *Pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// step feeds one event to the machine and performs the actions it returns
// (caller holds mu). An error from Step is a bug of this driver (an event
// the machine does not handle, or one its state forbids, e.g. a batch
// submitted twice): the machine is unchanged, so step logs it with the
// event, counts it in hams_pool_driver_errors_total and returns it; it
// never panics. Callers whose event had to create work (Submitted) answer
// their caller with it; for the others nothing more can be done.
func (p *Pool) step(ev protocol.Event) error {
	acts, err := p.m.Step(ev)
	if err != nil {
		p.metrics.driverErrors.Inc()
		p.log.Error("pool driver bug: the parity machine refused an event", "event", ev.String(), "err", err)
		return fmt.Errorf("pool %s: step %v: %w", p.cfg.Model, ev, err)
	}
	p.perform(protocol.Select[parity.Action](acts))
	return nil
}

// perform carries out the machine's actions in order (caller holds mu).
// Nothing here blocks: instance channels have room (the machine names
// idle instances only) and encoding is queued for the encoder goroutine.
func (p *Pool) perform(acts []parity.Action) {
	debug := p.log.Enabled(context.Background(), slog.LevelDebug)
	for _, a := range acts {
		if debug {
			p.log.Debug("pool action", "action", a.String(), "at", p.now())
		}
		switch a.Kind {
		case parity.ActRunData:
			c := p.calls[a.Batch]
			if c == nil {
				// Cannot happen (calls live until answered and settled);
				// tell the machine the instance is free again.
				_ = p.step(parity.DataFailed{Batch: a.Batch, Instance: a.Instance, Retryable: false, Now: p.now()})
				continue
			}
			if a.Hedge {
				p.metrics.hedges.Inc()
			}
			p.dataWork[a.Instance] <- dataJob{c: c}
		case parity.ActEncode:
			g := p.groupOf(a.Group)
			g.members = a.Members
			if p.online != nil && !p.online.ready.Load() {
				// No parity model trained yet: no reconstruction.
				p.metrics.parityFailed.WithLabelValues("untrained").Inc()
				_ = p.step(parity.ParityEncoded{Group: a.Group, Parity: a.Parity, OK: false, Now: p.now()})
				continue
			}
			if a.Fill > 0 && g.standIns == nil {
				if len(p.recent) < a.Fill {
					// Nothing answered yet to stand in: this group gets
					// no parity.
					_ = p.step(parity.ParityEncoded{Group: a.Group, Parity: a.Parity, OK: false, Now: p.now()})
					continue
				}
				g.standIns = slices.Clone(p.recent[len(p.recent)-a.Fill:])
				p.metrics.standIns.Add(float64(a.Fill))
			}
			job := encodeJob{g: a.Group, j: a.Parity}
			for _, id := range a.Members {
				c := p.calls[id]
				c.group = a.Group
				job.inputs = append(job.inputs, c.req.GetInputs())
				g.maxRows = max(g.maxRows, rowsOf(c.req))
			}
			for _, si := range g.standIns {
				job.inputs = append(job.inputs, si.inputs)
				g.maxRows = max(g.maxRows, si.rows)
			}
			p.encodeQ = append(p.encodeQ, job)
			select {
			case p.encKick <- struct{}{}:
			default:
			}
		case parity.ActRunParity:
			g := p.groups[a.Group]
			p.parWork[a.Instance] <- parityJob{g: a.Group, j: a.Parity, req: g.parity[a.Parity]}
		case parity.ActRelease:
			c := p.calls[a.Batch]
			p.metrics.outcome.WithLabelValues("original").Inc()
			c.done <- result{resp: c.resp}
			if p.online != nil {
				p.online.offer(c.req, c.resp)
			}
			if p.cfg.FillAfter > 0 {
				if len(p.recent) == maxRecent {
					p.recent = slices.Delete(p.recent, 0, 1)
				}
				p.recent = append(p.recent, standIn{inputs: c.req.GetInputs(), outputs: c.resp.GetOutputs(), rows: rowsOf(c.req)})
			}
			if c.group == 0 && p.cfg.Redundancy != parity.RedundancyParM {
				delete(p.calls, a.Batch)
			}
		case parity.ActDecode:
			p.decode(a)
		case parity.ActReleaseDecoded:
			c := p.calls[a.Batch]
			p.metrics.outcome.WithLabelValues("reconstructed").Inc()
			n := len(c.req.GetRows())
			ap := make([]bool, n)
			for i := range ap {
				ap[i] = true
			}
			c.done <- result{resp: &hamsv1.BatchResponse{Outputs: c.recon, Rows: c.req.GetRows(), BatchId: c.req.GetBatchId(), Approximate: ap}}
		case parity.ActFail:
			c := p.calls[a.Batch]
			p.metrics.outcome.WithLabelValues("failed").Inc()
			err := c.lastErr
			if err == nil {
				err = status.Errorf(codes.Unavailable, "pool %s: batch failed on every attempt", p.cfg.Model)
			}
			c.done <- result{err: err}
			if p.cfg.Redundancy != parity.RedundancyParM {
				delete(p.calls, a.Batch)
			}
		case parity.ActCompare:
			p.compare(p.calls[a.Batch])
		case parity.ActWithdraw:
			p.metrics.withdrawn.Inc()
			if p.cfg.Redundancy != parity.RedundancyParM {
				delete(p.calls, a.Batch)
			}
		case parity.ActDropParity:
			p.metrics.parityDropped.Inc()
			if g := p.groups[a.Group]; g != nil && a.Parity < len(g.parity) {
				g.parity[a.Parity] = nil
			}
		case parity.ActForget:
			if g := p.groups[a.Group]; g != nil {
				for _, id := range g.members {
					delete(p.calls, id)
				}
			}
			delete(p.groups, a.Group)
		}
	}
	dq, pq := p.m.QueueDepth()
	p.metrics.queue.WithLabelValues("data").Set(float64(dq))
	p.metrics.queue.WithLabelValues("parity").Set(float64(pq))
}

func (p *Pool) groupOf(id parity.GroupID) *group {
	g := p.groups[id]
	if g == nil {
		g = &group{parity: make([]*hamsv1.BatchRequest, p.cfg.Code.R), outputs: make([][]*hamsv1.Tensor, p.cfg.Code.R)}
		p.groups[id] = g
	}
	return g
}

func rowsOf(req *hamsv1.BatchRequest) uint32 {
	var n uint32
	for _, r := range req.GetRows() {
		n += r
	}
	return n
}

// decode reconstructs a.Missing and tells the machine (caller holds mu).
func (p *Pool) decode(a parity.Action) {
	g := p.groups[a.Group]
	start := time.Now()
	k := len(g.members) + len(g.standIns)
	outs := make([][]*hamsv1.Tensor, k)
	rows := make([]uint32, k)
	for i, si := range g.standIns {
		outs[len(g.members)+i], rows[len(g.members)+i] = si.outputs, si.rows
	}
	var missing []*call
	for i, id := range g.members {
		c := p.calls[id]
		rows[i] = rowsOf(c.req)
		if slices.Contains(a.Missing, id) {
			missing = append(missing, c)
			continue
		}
		outs[i] = c.resp.GetOutputs()
	}
	pars := make([][]*hamsv1.Tensor, p.cfg.Code.R)
	for _, j := range a.Parities {
		pars[j] = g.outputs[j]
	}
	recon, err := parity.DecodeBatch(p.dec, outs, rows, pars)
	p.metrics.decode.Observe(time.Since(start).Seconds())
	if err != nil {
		p.metrics.parityFailed.WithLabelValues("decode").Inc()
		p.log.Warn("parity output unusable, reconstruction skipped", "group", a.Group, "parities", a.Parities, "err", err)
		_ = p.step(parity.GroupDecoded{Group: a.Group, Parities: a.Parities, OK: false, Now: p.now()})
		return
	}
	for i, c := range missing {
		c.recon = recon[i]
	}
	_ = p.step(parity.GroupDecoded{Group: a.Group, Parities: a.Parities, OK: true, Now: p.now()})
}

// compare scores a reconstruction against the late original: top-1
// agreement per row of the first output tensor, and the largest absolute
// difference over every output.
func (p *Pool) compare(c *call) {
	if c == nil || c.resp == nil || c.recon == nil {
		return
	}
	agree, rows := 0, 0
	var maxDiff float64
	for ti, o := range c.resp.GetOutputs() {
		if ti >= len(c.recon) || o.GetDatatype() != "FP32" || c.recon[ti].GetDatatype() != "FP32" {
			continue
		}
		a, err1 := tensor.Float32(o)
		b, err2 := tensor.Float32(c.recon[ti])
		if err1 != nil || err2 != nil || len(a) != len(b) || len(a) == 0 {
			continue
		}
		for i := range a {
			maxDiff = max(maxDiff, abs(float64(a[i]-b[i])))
		}
		if ti == 0 {
			n := tensor.Rows(o)
			if n <= 0 {
				continue
			}
			w := len(a) / int(n)
			for r := 0; r < int(n) && w > 0; r++ {
				rows++
				if argmax(a[r*w:(r+1)*w]) == argmax(b[r*w:(r+1)*w]) {
					agree++
				}
			}
		}
	}
	p.metrics.lateRows.WithLabelValues("agree").Add(float64(agree))
	p.metrics.lateRows.WithLabelValues("disagree").Add(float64(rows - agree))
	p.metrics.lateDiff.Observe(maxDiff)
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func argmax(v []float32) int {
	best := 0
	for i := range v {
		if v[i] > v[best] {
			best = i
		}
	}
	return best
}

// retryable: the instance, not the request, failed.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Unknown, codes.Canceled, codes.ResourceExhausted:
		return true
	}
	return false
}

// callCtx is the context of one instance call: the Infer's values, the
// pool's lifetime, the call timeout.
func (p *Pool) callCtx(ctx context.Context, values context.Context) (context.Context, context.CancelFunc) {
	c, cancel := context.WithTimeout(values, p.cfg.CallTimeout)
	stop := context.AfterFunc(ctx, cancel)
	return c, func() { stop(); cancel() }
}

func (p *Pool) dataWorker(ctx context.Context, i int) {
	be := p.cfg.Data[i]
	for {
		var job dataJob
		select {
		case job = <-p.dataWork[i]:
		case <-ctx.Done():
			return
		}
		c := job.c
		cctx, cancel := p.callCtx(ctx, c.ctx)
		start := time.Now()
		resp, err := be.Infer(cctx, c.req)
		cancel()
		elapsed := time.Since(start)
		if err == nil {
			err = checkResponse(c.req, resp)
		}
		p.metrics.instance.WithLabelValues("data").Observe(elapsed.Seconds())
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		var ev protocol.Event
		if err == nil {
			if c.resp == nil {
				c.resp = resp
			}
			p.sample(elapsed)
			ev = parity.DataDone{Batch: c.id, Instance: parity.Instance(i), Now: p.now()}
		} else {
			c.lastErr = err
			p.log.Debug("pool instance call failed", "replica", i, "err", err)
			p.metrics.instanceErrors.WithLabelValues("data", status.Code(err).String()).Inc()
			ev = parity.DataFailed{Batch: c.id, Instance: parity.Instance(i), Retryable: retryable(err), Now: p.now()}
		}
		_ = p.step(ev) // logged and counted by step
		p.mu.Unlock()
		p.wake()
	}
}

// checkResponse refuses an answer that does not fit the batch (one row
// count per request, outputs present).
func checkResponse(req *hamsv1.BatchRequest, resp *hamsv1.BatchResponse) error {
	if resp == nil || len(resp.GetOutputs()) == 0 {
		return status.Error(codes.Internal, "instance answered no outputs")
	}
	if len(req.GetRows()) != len(resp.GetRows()) {
		return status.Errorf(codes.Internal, "instance answered %d requests, batch has %d", len(resp.GetRows()), len(req.GetRows()))
	}
	return nil
}

// sample records a data service time; hedge's delay follows the p95.
func (p *Pool) sample(d time.Duration) {
	if p.cfg.Redundancy != parity.RedundancyHedge || p.cfg.HedgeAfter != 0 {
		return
	}
	if len(p.samples) < hedgeSamples {
		p.samples = append(p.samples, d.Seconds())
	} else {
		p.samples[p.nSamples%hedgeSamples] = d.Seconds()
	}
	p.nSamples++
	if p.nSamples%hedgeEvery != 0 {
		return
	}
	sorted := slices.Clone(p.samples)
	slices.Sort(sorted)
	q := stat.Quantile(0.95, stat.Empirical, sorted, nil)
	d95 := time.Duration(q * float64(time.Second))
	p.m.SetHedgeAfter(d95)
	p.metrics.hedgeAfter.Set(d95.Seconds())
}

func (p *Pool) parityWorker(ctx context.Context, i int) {
	be := p.cfg.Parity[i]
	for {
		var job parityJob
		select {
		case job = <-p.parWork[i]:
		case <-ctx.Done():
			return
		}
		cctx, cancel := p.callCtx(ctx, ctx)
		start := time.Now()
		resp, err := be.Infer(cctx, job.req)
		cancel()
		p.metrics.instance.WithLabelValues("parity").Observe(time.Since(start).Seconds())
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		inst := parity.Instance(i)
		var ev protocol.Event
		g := p.groups[job.g]
		switch {
		case g == nil:
			ev = parity.ParityDone{Group: job.g, Parity: job.j, Instance: inst, Now: p.now()} // forgotten: frees the instance
		case err != nil:
			p.metrics.parityFailed.WithLabelValues(status.Code(err).String()).Inc()
			ev = parity.ParityFailed{Group: job.g, Parity: job.j, Instance: inst, Retryable: retryable(err), Now: p.now()}
		default:
			if err := p.checkParity(g, resp); err != nil {
				// Garbage from a parity model costs the reconstruction only.
				p.metrics.parityFailed.WithLabelValues("shape").Inc()
				p.log.Warn("parity output refused", "group", job.g, "parity", job.j, "err", err)
				ev = parity.ParityFailed{Group: job.g, Parity: job.j, Instance: inst, Retryable: false, Now: p.now()}
			} else {
				g.outputs[job.j] = resp.GetOutputs()
				ev = parity.ParityDone{Group: job.g, Parity: job.j, Instance: inst, Now: p.now()}
			}
		}
		_ = p.step(ev) // logged and counted by step
		p.mu.Unlock()
		p.wake()
	}
}

// checkParity checks a parity output against an original of its group when
// one is in (DecodeBatch checks again against all of them).
func (p *Pool) checkParity(g *group, resp *hamsv1.BatchResponse) error {
	if resp == nil || len(resp.GetOutputs()) == 0 {
		return errors.New("no outputs")
	}
	for _, id := range g.members {
		if c := p.calls[id]; c != nil && c.resp != nil {
			return parity.CheckParityShape(c.resp.GetOutputs(), resp.GetOutputs(), g.maxRows)
		}
	}
	return nil
}

// encoder builds parity batches, one at a time, off the dispatch path.
func (p *Pool) encoder(ctx context.Context) {
	newEnc := func(size int) (parity.Encoder, error) {
		if p.cfg.Encoder == parity.EncoderConcat {
			return parity.NewConcatEncoder(p.cfg.Code, p.cfg.Image[0], p.cfg.Image[1], p.cfg.Image[2])
		}
		return parity.NewSumEncoder(p.cfg.Code, size)
	}
	for {
		p.mu.Lock()
		var job encodeJob
		have := len(p.encodeQ) > 0
		if have {
			job = p.encodeQ[0]
			p.encodeQ = p.encodeQ[1:]
		}
		p.mu.Unlock()
		if !have {
			select {
			case <-p.encKick:
				continue
			case <-ctx.Done():
				return
			}
		}
		start := time.Now()
		ins, err := parity.EncodeBatch(p.cfg.Code, newEnc, job.j, job.inputs)
		p.metrics.encode.Observe(time.Since(start).Seconds())
		p.mu.Lock()
		ok := err == nil
		if ok {
			if g := p.groups[job.g]; g != nil {
				g.parity[job.j] = &hamsv1.BatchRequest{
					Model: p.parityModel(job.j), Inputs: ins, Rows: []uint32{g.maxRows}, StreamIds: []string{""},
					BatchId: 1<<63 | uint64(job.g)<<4 | uint64(job.j),
				}
			}
		} else {
			p.metrics.parityFailed.WithLabelValues("encode").Inc()
			p.log.Warn("group does not encode, no parity", "group", job.g, "parity", job.j, "err", err)
		}
		_ = p.step(parity.ParityEncoded{Group: job.g, Parity: job.j, OK: ok, Now: p.now()}) // logged and counted by step
		p.mu.Unlock()
		p.wake()
	}
}

// timer ticks the machine at its next deadline.
func (p *Pool) timer(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		p.mu.Lock()
		now := p.now()
		next, ok := p.m.NextDeadline(now)
		p.mu.Unlock()
		if ok {
			t.Reset(next - now)
		} else {
			t.Stop()
		}
		select {
		case <-t.C:
			p.mu.Lock()
			_ = p.step(parity.TimePassed{Now: p.now()}) // logged and counted by step
			p.mu.Unlock()
		case <-p.kick:
		case <-ctx.Done():
			return
		}
	}
}

// parityModel is the name of parity model j at the parity instances.
func (p *Pool) parityModel(j int) string {
	if j < len(p.cfg.ParityModels) {
		return p.cfg.ParityModels[j]
	}
	return p.cfg.ParityModel
}
