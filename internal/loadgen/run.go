package loadgen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Result is one request's outcome, handed to RunConfig.OnResult.
type Result struct {
	Client  int
	Request *hamsv1.PredictRequest
	Reply   *hamsv1.PredictResponse
	Err     error
	Sent    time.Time
	Latency time.Duration
}

// RunConfig configures a closed-loop run.
type RunConfig struct {
	Client hamsv1.FrontendClient
	// NewRequest builds client i's next request (inputs, service, ids); it
	// is called from client i's goroutine only.
	NewRequest func(client int, n uint64) *hamsv1.PredictRequest
	// Concurrency is the number of closed-loop clients (default 1).
	Concurrency int
	// Waves: the clients send in lockstep, one request each per wave, and
	// a wave starts only when every request of the previous one ended.
	// Each wave is then one batch of Concurrency requests crossing the
	// graph alone, so latency is the latency of a batch (the HAMS paper's
	// measure) rather than Concurrency over saturated throughput.
	Waves bool
	// Duration and Requests bound the run; the first reached ends it (zero
	// means no bound; at least one must be set unless ctx ends the run).
	Duration time.Duration
	Requests int
	// Timeout is the per-request deadline (default 5s).
	Timeout time.Duration
	// Recorder receives every result (default: a new one).
	Recorder *Recorder
	// OnResult, if set, is called for every result from the client's goroutine.
	OnResult func(Result)
	// ErrorBackoff is how long a client pauses after a failed request
	// before sending the next (0: none), so a component that fails fast
	// while down is not flooded by clients spinning on errors.
	ErrorBackoff time.Duration
}

// Run drives closed-loop load and returns the recorder's statistics.
func Run(ctx context.Context, cfg RunConfig) (Stats, error) {
	if cfg.Client == nil || cfg.NewRequest == nil {
		return Stats{}, fmt.Errorf("loadgen: Client and NewRequest are required")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Duration < 0 || cfg.Requests < 0 {
		return Stats{}, fmt.Errorf("loadgen: negative duration or request count")
	}
	rec := cfg.Recorder
	if rec == nil {
		rec = NewRecorder()
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	var budget atomic.Int64
	budget.Store(int64(cfg.Requests))
	if cfg.Waves {
		for n := uint64(0); ctx.Err() == nil; n++ {
			var wg sync.WaitGroup
			for i := range cfg.Concurrency {
				if cfg.Requests > 0 && budget.Add(-1) < 0 {
					break
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					one(ctx, &cfg, rec, i, n)
				}()
			}
			wg.Wait()
			if cfg.Requests > 0 && budget.Load() <= 0 {
				break
			}
		}
		rec.Stop()
		return rec.Stats(), nil
	}
	var wg sync.WaitGroup
	for i := range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := uint64(0); ctx.Err() == nil; n++ {
				if cfg.Requests > 0 && budget.Add(-1) < 0 {
					return
				}
				one(ctx, &cfg, rec, i, n)
			}
		}()
	}
	wg.Wait()
	rec.Stop()
	return rec.Stats(), nil
}

// one sends client i's request n and records its result.
func one(ctx context.Context, cfg *RunConfig, rec *Recorder, i int, n uint64) {
	req := cfg.NewRequest(i, n)
	rec.Sent(1)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Timeout)
	start := time.Now()
	resp, err := cfg.Client.Predict(rctx, req)
	lat := time.Since(start)
	cancel()
	if err != nil {
		rec.Err(1)
	} else {
		rec.OK(lat, 1)
	}
	if cfg.OnResult != nil {
		cfg.OnResult(Result{Client: i, Request: req, Reply: resp, Err: err, Sent: start, Latency: lat})
	}
	if err != nil && cfg.ErrorBackoff > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(cfg.ErrorBackoff):
		}
	}
}
