// Package parmload drives labelled classification traffic at a service
// through the frontend and scores what comes back: latency percentiles
// (p50 .. p99.9, max), the fraction of approximate (ParM-reconstructed)
// replies, and top-1 accuracy against the dataset's labels, for exact and
// approximate replies apart. hams demo --service parm and hams bench
// --service parm use it.
//
// Load is closed-loop (a fixed number of clients) or open-loop (Poisson
// arrivals at a rate, each request sent on its own schedule whatever the
// replies do, as the ParM paper measures).
package parmload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gonum.org/v1/gonum/stat"

	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Config of a run.
type Config struct {
	// Clients are the frontends (requests are spread over them).
	Clients []hamsv1.FrontendClient
	Service string
	// Input and Output name the image tensor sent and the scores read
	// (defaults images, scores).
	Input, Output string
	// Data supplies images and labels (loadgen.Fashion(); nil: seeded
	// random pixels, no labels).
	Data *loadgen.Dataset
	// Rows per request (default 1).
	Rows int
	// Rate > 0: open loop, Poisson arrivals at Rate requests/s.
	// Otherwise closed loop with Concurrency clients.
	Rate        float64
	Concurrency int
	// Requests stops after this many requests (0: Duration).
	Requests int
	Duration time.Duration
	Timeout  time.Duration
	Seed     uint64
	// Progress, if set, is called after every reply.
	Progress func(Result)
}

// Result of a run (or of the part run so far).
type Result struct {
	Requests, Replies, Errors int
	Approximate               int
	// Rows scored against labels, and those right, by exact and
	// approximate replies.
	LabelledExact, CorrectExact   int
	LabelledApprox, CorrectApprox int
	Elapsed                       time.Duration
	latencies                     []float64 // ms
}

// Add merges o into r (rounds of one arm).
func (r *Result) Add(o Result) {
	r.Requests += o.Requests
	r.Replies += o.Replies
	r.Errors += o.Errors
	r.Approximate += o.Approximate
	r.LabelledExact += o.LabelledExact
	r.CorrectExact += o.CorrectExact
	r.LabelledApprox += o.LabelledApprox
	r.CorrectApprox += o.CorrectApprox
	r.Elapsed += o.Elapsed
	r.latencies = append(r.latencies, o.latencies...)
}

// Summary is a Result's figures.
type Summary struct {
	Requests       int     `json:"requests"`
	Replies        int     `json:"replies"`
	Errors         int     `json:"errors"`
	P50Ms          float64 `json:"p50_ms"`
	P99Ms          float64 `json:"p99_ms"`
	P999Ms         float64 `json:"p999_ms"`
	MaxMs          float64 `json:"max_ms"`
	MeanMs         float64 `json:"mean_ms"`
	ThroughputRPS  float64 `json:"throughput_rps"`
	Approximate    float64 `json:"approximate"`
	Accuracy       float64 `json:"accuracy"`
	AccuracyExact  float64 `json:"accuracy_exact"`
	AccuracyApprox float64 `json:"accuracy_approximate"`
	ApproxReplies  int     `json:"approximate_replies"`
}

// Summary computes percentiles (gonum's empirical quantiles) and
// fractions; accuracies are -1 where nothing was labelled.
func (r Result) Summary() Summary {
	s := Summary{Requests: r.Requests, Replies: r.Replies, Errors: r.Errors, ApproxReplies: r.Approximate,
		Accuracy: -1, AccuracyExact: -1, AccuracyApprox: -1}
	if n := len(r.latencies); n > 0 {
		sorted := slices.Clone(r.latencies)
		slices.Sort(sorted)
		q := func(p float64) float64 { return round3(stat.Quantile(p, stat.Empirical, sorted, nil)) }
		s.P50Ms, s.P99Ms, s.P999Ms, s.MaxMs = q(0.5), q(0.99), q(0.999), round3(sorted[n-1])
		s.MeanMs = round3(stat.Mean(sorted, nil))
	}
	if r.Elapsed > 0 {
		s.ThroughputRPS = round3(float64(r.Replies) / r.Elapsed.Seconds())
	}
	if r.Replies > 0 {
		s.Approximate = round4(float64(r.Approximate) / float64(r.Replies))
	}
	frac := func(a, b int) float64 {
		if b == 0 {
			return -1
		}
		return round4(float64(a) / float64(b))
	}
	s.Accuracy = frac(r.CorrectExact+r.CorrectApprox, r.LabelledExact+r.LabelledApprox)
	s.AccuracyExact = frac(r.CorrectExact, r.LabelledExact)
	s.AccuracyApprox = frac(r.CorrectApprox, r.LabelledApprox)
	return s
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }
func round4(x float64) float64 { return math.Round(x*10000) / 10000 }

// ErrConfig is wrapped by Run's validation errors.
var ErrConfig = errors.New("parmload: invalid config")

// Run drives the load and returns what it measured. It stops when the
// requests are sent and answered, the duration is over, or ctx ends.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if len(cfg.Clients) == 0 || cfg.Service == "" {
		return Result{}, fmt.Errorf("%w: no frontend client or no service", ErrConfig)
	}
	if cfg.Requests <= 0 && cfg.Duration <= 0 {
		return Result{}, fmt.Errorf("%w: neither requests nor duration", ErrConfig)
	}
	if cfg.Rate <= 0 && cfg.Concurrency <= 0 {
		return Result{}, fmt.Errorf("%w: neither a rate nor a concurrency", ErrConfig)
	}
	if cfg.Input == "" {
		cfg.Input = "images"
	}
	if cfg.Output == "" {
		cfg.Output = "scores"
	}
	cfg.Rows = max(cfg.Rows, 1)
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	d := &driver{cfg: cfg}
	start := time.Now()
	var err error
	if cfg.Rate > 0 {
		err = d.open(ctx)
	} else {
		err = d.closed(ctx)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.res.Elapsed = time.Since(start)
	return d.res, err
}

type driver struct {
	cfg  Config
	sent atomic.Int64
	mu   sync.Mutex
	res  Result
}

// next reserves request number i (false: the run has sent enough).
func (d *driver) next(end time.Time) (int64, bool) {
	if d.cfg.Duration > 0 && time.Now().After(end) {
		return 0, false
	}
	i := d.sent.Add(1)
	if d.cfg.Requests > 0 && i > int64(d.cfg.Requests) {
		return 0, false
	}
	return i, true
}

func (d *driver) open(ctx context.Context) error {
	rng := rand.New(rand.NewPCG(d.cfg.Seed, 0x706f6973))
	end := time.Now().Add(d.cfg.Duration)
	var wg sync.WaitGroup
	defer wg.Wait()
	at := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		i, ok := d.next(end)
		if !ok {
			return nil
		}
		// Poisson arrivals: exponential gaps from a seeded source, on a
		// schedule that does not wait for replies.
		at = at.Add(time.Duration(rng.ExpFloat64() / d.cfg.Rate * float64(time.Second)))
		t.Reset(time.Until(at))
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Go(func() { d.one(ctx, i) })
	}
}

func (d *driver) closed(ctx context.Context) error {
	end := time.Now().Add(d.cfg.Duration)
	var wg sync.WaitGroup
	for range d.cfg.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				i, ok := d.next(end)
				if !ok {
					return
				}
				d.one(ctx, i)
			}
		})
	}
	wg.Wait()
	return ctx.Err()
}

// one sends request i (rows drawn by i from the dataset) and scores it.
func (d *driver) one(ctx context.Context, i int64) {
	rows := d.cfg.Rows
	x := make([]float32, 0, rows*784)
	labels := make([]int64, rows)
	data := d.cfg.Data
	rng := rand.New(rand.NewPCG(d.cfg.Seed, uint64(i)))
	for r := range rows {
		if data != nil && len(data.Images) > 0 {
			j := rng.IntN(len(data.Images))
			x = append(x, data.Images[j]...)
			labels[r] = data.Labels[j]
		} else {
			for range 784 {
				x = append(x, rng.Float32())
			}
			labels[r] = -1
		}
	}
	req := &hamsv1.PredictRequest{
		Service: d.cfg.Service, RequestId: fmt.Sprintf("parm-%d-%d", d.cfg.Seed, i),
		Inputs: []*hamsv1.Tensor{tensor.FromFloat32(d.cfg.Input, []int64{int64(rows), int64(len(x) / rows)}, x)},
	}
	cl := d.cfg.Clients[int(i)%len(d.cfg.Clients)]
	cctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	start := time.Now()
	resp, err := cl.Predict(cctx, req)
	lat := time.Since(start)
	cancel()
	d.mu.Lock()
	defer func() {
		snap := d.res
		d.mu.Unlock()
		if d.cfg.Progress != nil {
			d.cfg.Progress(snap)
		}
	}()
	d.res.Requests++
	if err != nil {
		d.res.Errors++
		return
	}
	d.res.Replies++
	d.res.latencies = append(d.res.latencies, float64(lat)/float64(time.Millisecond))
	approx := resp.GetApproximate()
	if approx {
		d.res.Approximate++
	}
	scores := findScores(resp, d.cfg.Output)
	if scores == nil {
		return
	}
	w := len(scores) / rows
	for r := range rows {
		if labels[r] < 0 || w == 0 {
			continue
		}
		right := int64(argmax(scores[r*w:(r+1)*w])) == labels[r]
		if approx {
			d.res.LabelledApprox++
			if right {
				d.res.CorrectApprox++
			}
		} else {
			d.res.LabelledExact++
			if right {
				d.res.CorrectExact++
			}
		}
	}
}

func findScores(resp *hamsv1.PredictResponse, name string) []float32 {
	for _, o := range resp.GetOutputs() {
		for _, t := range o.GetTensors() {
			if t.GetName() == name {
				v, err := tensor.Float32(t)
				if err == nil {
					return v
				}
			}
		}
	}
	return nil
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
