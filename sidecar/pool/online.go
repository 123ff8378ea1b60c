package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hams-go/hams/internal/paritytrain"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protocol/parity"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/nn"
)

// WeightLoader is a parity instance whose weights can be replaced while
// it serves (the reference model server's ModelRuntime.LoadWeights).
type WeightLoader interface {
	LoadWeights(ctx context.Context, model string, weights []byte, version uint64) error
}

// OnlineConfig trains the pool's parity models from live traffic (the
// paper's answer when the training set is unavailable): the pool samples
// the queries it serves with the deployed model's outputs as labels,
// trains in the background, evaluates on held-out live samples, and
// swaps the weights into every parity instance only when they agree with
// the deployed model better than the current ones. Until the first swap
// no reconstruction is released (the parity path is off).
type OnlineConfig struct {
	// Arch of the parity models (paritytrain.NewArch: mlp, mlp:H1,...,
	// lenet); default mlp.
	Arch string
	// Image is the query layout (concat, lenet); zero: one row of the
	// query's width.
	Image paritytrain.Image
	// Buffer bounds the training samples kept (reservoir sampling over
	// the whole stream), Holdout the evaluation samples (every tenth
	// row served goes there). Memory: (Buffer+Holdout) x (query+output)
	// floats. Defaults 20000 and 2000.
	Buffer, Holdout int
	// MinSamples: no round before this many training samples (default
	// 4000); Every: at most one round this often (default 30 s).
	MinSamples int
	Every      time.Duration
	// Epochs per round (default 2) and Workers (cores; default 1): the
	// CPU training takes.
	Epochs, Workers int
	// MinAgreement: weights whose agreement with the deployed model's
	// top-1 (on the held-out samples, every erased position) is below
	// this are never swapped in (default 0.5).
	MinAgreement float64
	Seed         uint64
}

func (c *OnlineConfig) withDefaults() OnlineConfig {
	o := *c
	if o.Arch == "" {
		o.Arch = "mlp"
	}
	if o.Buffer <= 0 {
		o.Buffer = 20000
	}
	if o.Holdout <= 0 {
		o.Holdout = 2000
	}
	if o.MinSamples <= 0 {
		o.MinSamples = 4000
	}
	if o.Every <= 0 {
		o.Every = 30 * time.Second
	}
	if o.Epochs <= 0 {
		o.Epochs = 2
	}
	if o.Workers <= 0 {
		o.Workers = 1
	}
	if o.MinAgreement <= 0 {
		o.MinAgreement = 0.5
	}
	return o
}

// online is the pool's background parity trainer.
type online struct {
	cfg     OnlineConfig
	code    parity.Code
	enc     parity.EncoderKind
	models  func(j int) string
	loaders []WeightLoader
	log     *slog.Logger
	m       *onlineMetrics

	offers chan offered // live samples, dropped when training lags
	// Owned by run.
	train, hold *paritytrain.Buffer
	rows        int64
	nets        []*nn.Net // weights serving now (nil before the first swap)
	// work are the weights under training, carried from round to round
	// (a round that does not beat the serving weights is not lost).
	work     []*nn.Net
	version  uint64
	disabled error

	ready atomic.Bool
	// agreement of the weights serving now (math.Float64bits).
	agreement atomic.Uint64
}

type offered struct{ req, resp []*hamsv1.Tensor }

type onlineMetrics struct {
	agreement        prometheus.Gauge
	samples, held    prometheus.Gauge
	rounds, swaps    prometheus.Counter
	dropped          prometheus.Counter
	trainSeconds     prometheus.Counter
	candidateAgreees prometheus.Gauge
	// rowsAtFirstSwap: rows served (sampled or not) when the first
	// weights were swapped in.
	rowsAtFirstSwap prometheus.Gauge
}

func newOnlineMetrics(reg prometheus.Registerer, model string) *onlineMetrics {
	cl := prometheus.Labels{"model": model}
	m := &onlineMetrics{
		agreement: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hams_pool_online_agreement",
			Help: "Agreement with the deployed model's top-1 of the parity models serving now (held-out live samples; 0 before the first swap).", ConstLabels: cl}),
		candidateAgreees: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hams_pool_online_candidate_agreement",
			Help: "Agreement of the last parity models trained (swapped in only when better).", ConstLabels: cl}),
		samples: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hams_pool_online_samples",
			Help: "Live samples held for training.", ConstLabels: cl}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hams_pool_online_holdout_samples",
			Help: "Live samples held out for evaluation.", ConstLabels: cl}),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Name: "hams_pool_online_rounds_total",
			Help: "Training rounds run.", ConstLabels: cl}),
		swaps: prometheus.NewCounter(prometheus.CounterOpts{Name: "hams_pool_online_swaps_total",
			Help: "Weights swapped into the parity instances.", ConstLabels: cl}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "hams_pool_online_dropped_total",
			Help: "Served batches not sampled because training lagged.", ConstLabels: cl}),
		trainSeconds: prometheus.NewCounter(prometheus.CounterOpts{Name: "hams_pool_online_train_seconds_total",
			Help: "Wall time spent training.", ConstLabels: cl}),
		rowsAtFirstSwap: prometheus.NewGauge(prometheus.GaugeOpts{Name: "hams_pool_online_rows_before_first_swap",
			Help: "Queries (rows) the pool had served when the first trained weights were swapped in (0: none yet).", ConstLabels: cl}),
	}
	reg.MustRegister(m.agreement, m.candidateAgreees, m.samples, m.held, m.rounds, m.swaps, m.dropped, m.trainSeconds, m.rowsAtFirstSwap)
	return m
}

// offer hands a served batch to the trainer without waiting (called
// under the pool's lock: a full channel drops the batch).
func (o *online) offer(req *hamsv1.BatchRequest, resp *hamsv1.BatchResponse) {
	select {
	case o.offers <- offered{req.GetInputs(), resp.GetOutputs()}:
	default:
		o.m.dropped.Inc()
	}
}

// run samples the offered batches and trains every Every until ctx ends.
func (o *online) run(ctx context.Context) {
	t := time.NewTicker(o.cfg.Every)
	defer t.Stop()
	for {
		select {
		case b := <-o.offers:
			o.add(b)
		case <-t.C:
			if o.disabled == nil && o.train != nil && o.train.Len() >= o.cfg.MinSamples && o.hold.Len() >= min(o.cfg.Holdout, 100) {
				if err := o.round(ctx); err != nil && ctx.Err() == nil {
					o.log.Warn("online parity training round failed", "err", err)
				}
			}
		case <-ctx.Done():
			return
		}
	}
}

// add splits a served batch into rows: one FP32 input and its first
// FP32 output per sample; every tenth row is held out.
func (o *online) add(b offered) {
	if o.disabled != nil || len(b.req) == 0 || len(b.resp) == 0 {
		return
	}
	if len(b.req) != 1 || b.req[0].GetDatatype() != tensor.FP32 || b.resp[0].GetDatatype() != tensor.FP32 {
		o.disabled = fmt.Errorf("online training takes models of one FP32 input and an FP32 first output; this one has %d inputs (%s) and output %s",
			len(b.req), b.req[0].GetDatatype(), b.resp[0].GetDatatype())
		o.log.Error("online parity training disabled", "err", o.disabled)
		return
	}
	x, err1 := tensor.Float32(b.req[0])
	y, err2 := tensor.Float32(b.resp[0])
	rows := int(tensor.Rows(b.req[0]))
	if err := errors.Join(err1, err2); err != nil || rows <= 0 || len(x)%rows != 0 || len(y)%rows != 0 {
		return
	}
	qs, os := len(x)/rows, len(y)/rows
	if o.train == nil {
		if o.cfg.Image.Size() == 0 {
			o.cfg.Image = paritytrain.Image{H: 1, W: qs, C: 1}
		}
		if o.cfg.Image.Size() != qs {
			o.disabled = fmt.Errorf("online training: queries of %d values, image %v has %d", qs, o.cfg.Image, o.cfg.Image.Size())
			o.log.Error("online parity training disabled", "err", o.disabled)
			return
		}
		var err error
		if o.train, err = paritytrain.NewBuffer(o.cfg.Buffer, qs, os, o.cfg.Seed); err == nil {
			o.hold, err = paritytrain.NewBuffer(o.cfg.Holdout, qs, os, o.cfg.Seed^0x686f6c64)
		}
		if err != nil {
			o.disabled = err
			return
		}
	}
	for r := range rows {
		s := paritytrain.Sample{Query: x[r*qs : (r+1)*qs], Output: y[r*os : (r+1)*os], Label: -1}
		buf := o.train
		if o.rows%10 == 9 {
			buf = o.hold
		}
		o.rows++
		if err := buf.Add(s); err != nil {
			o.log.Warn("online sample refused", "err", err)
			return
		}
	}
	o.m.samples.Set(float64(o.train.Len()))
	o.m.held.Set(float64(o.hold.Len()))
}

// round trains one candidate per parity model on a snapshot of the
// samples, scores it and the current weights on the same held-out
// groups, and swaps the candidate in when it agrees better.
func (o *online) round(ctx context.Context) error {
	start := time.Now()
	defer func() { o.m.trainSeconds.Add(time.Since(start).Seconds()) }()
	o.m.rounds.Inc()
	trainSet, holdSet := o.train.Snapshot(), o.hold.Snapshot()
	cands := make([]*nn.Net, o.code.R)
	candAgree, curAgree := 1.0, 1.0
	rng := nn.NewRand(o.cfg.Seed + o.version)
	for j := range o.code.R {
		spec := paritytrain.Spec{K: o.code.K, R: o.code.R, J: j, Encoder: o.enc, Image: o.cfg.Image, Loss: paritytrain.MSE}
		if o.work == nil {
			o.work = make([]*nn.Net, o.code.R)
		}
		if o.work[j] == nil {
			net, err := paritytrain.NewArch(o.cfg.Arch, o.cfg.Image, trainSet.OutSize, false, rng)
			if err != nil {
				return fmt.Errorf("parity model %d: %w", j, err)
			}
			o.work[j] = net
		}
		net := o.work[j]
		tr, err := paritytrain.NewTrainer(spec, net, paritytrain.Options{Workers: o.cfg.Workers})
		if err != nil {
			return fmt.Errorf("parity model %d: %w", j, err)
		}
		validate := paritytrain.ParityValidator(spec, holdSet, o.cfg.Seed, o.cfg.Workers)
		res, err := paritytrain.Fit(ctx, tr, trainSet, validate, o.cfg.Epochs, rng, nil)
		if err != nil {
			return fmt.Errorf("parity model %d: %w", j, err)
		}
		cands[j] = res.Net
		o.work[j] = res.Net.Clone() // the next round goes on from the best epoch
		candAgree = min(candAgree, res.BestVal.Agreement)
		if o.nets == nil {
			curAgree = 0
		} else {
			cur, err := validate(o.nets[j])
			if err != nil {
				return fmt.Errorf("parity model %d: score current weights: %w", j, err)
			}
			curAgree = min(curAgree, cur.Agreement)
		}
	}
	o.m.candidateAgreees.Set(candAgree)
	o.log.Info("online parity training round", "samples", trainSet.N, "held_out", holdSet.N, "candidate_agreement", candAgree,
		"current_agreement", curAgree, "took", time.Since(start))
	if candAgree < o.cfg.MinAgreement || candAgree <= curAgree {
		return nil
	}
	if err := o.swap(ctx, cands); err != nil {
		return err
	}
	if o.nets == nil {
		o.m.rowsAtFirstSwap.Set(float64(o.rows))
	}
	o.nets = cands
	o.agreement.Store(math.Float64bits(candAgree))
	o.m.agreement.Set(candAgree)
	o.ready.Store(true)
	return nil
}

// swap loads the candidate weights into every parity instance; the
// parity path turns on only when all of them have them.
func (o *online) swap(ctx context.Context, nets []*nn.Net) error {
	o.version++
	for j, net := range nets {
		b, err := nn.EncodeNet(net)
		if err != nil {
			return fmt.Errorf("encode parity model %d: %w", j, err)
		}
		for i, l := range o.loaders {
			if err := l.LoadWeights(ctx, o.models(j), b, o.version); err != nil {
				// Instances may now differ: keep the parity path off until
				// a swap reaches them all.
				o.ready.Store(false)
				return fmt.Errorf("swap parity model %d into instance %d: %w", j, i, err)
			}
		}
	}
	o.m.swaps.Inc()
	o.log.Info("parity weights swapped in", "version", o.version)
	return nil
}

// OnlineAgreement is the agreement with the deployed model of the parity
// weights trained online that serve now (ok false: not trained online, or
// nothing swapped in yet).
func (p *Pool) OnlineAgreement() (float64, bool) {
	if p.online == nil || !p.online.ready.Load() {
		return 0, false
	}
	return math.Float64frombits(p.online.agreement.Load()), true
}
