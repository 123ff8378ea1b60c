package loadgen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	// Frontends are the indexes (into RunConfig.Frontends) of the
	// frontends the request was sent to, in order: more than one when it
	// was retried; the last one gave the result. Nil without Frontends.
	Frontends []int
}

// RunConfig configures a closed-loop run.
type RunConfig struct {
	// Client is the frontend every client sends to, unless Frontends is
	// set.
	Client hamsv1.FrontendClient
	// Frontends, if set, are several frontends of one deployment: client
	// i sends to Frontends[i mod len] first, and a request that fails
	// with Unavailable (the frontend died, shuts down, or could not
	// accept it now) is sent again, with the same request_id, to the next
	// frontend, until it is answered or its deadline passes (a frontend
	// with the request log answers a retried request_id with the answer
	// of the first attempt). Between two rounds over all frontends a
	// client pauses ErrorBackoff (at least 5 ms).
	Frontends []hamsv1.FrontendClient
	// Retries, if positive, bounds the retries of one request.
	Retries int
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
	if (cfg.Client == nil && len(cfg.Frontends) == 0) || cfg.NewRequest == nil {
		return Stats{}, fmt.Errorf("loadgen: Client (or Frontends) and NewRequest are required")
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
	var (
		resp  *hamsv1.PredictResponse
		err   error
		tried []int
	)
	if len(cfg.Frontends) == 0 {
		resp, err = cfg.Client.Predict(rctx, req)
	} else {
		resp, tried, err = predictRetrying(rctx, cfg, i, req)
	}
	lat := time.Since(start)
	cancel()
	if err != nil {
		rec.Err(1)
	} else {
		rec.OK(lat, 1)
	}
	if cfg.OnResult != nil {
		cfg.OnResult(Result{Client: i, Request: req, Reply: resp, Err: err, Sent: start, Latency: lat, Frontends: tried})
	}
	if err != nil && cfg.ErrorBackoff > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(cfg.ErrorBackoff):
		}
	}
}

// predictRetrying sends req to client i's frontend and, while the answer
// is Unavailable, to the next ones (the same request: its request_id
// joins the attempt the request log holds), until an answer, the
// deadline of ctx, or cfg.Retries retries. tried lists the frontends in
// attempt order, consecutive attempts on one frontend once.
func predictRetrying(ctx context.Context, cfg *RunConfig, i int, req *hamsv1.PredictRequest) (*hamsv1.PredictResponse, []int, error) {
	n := len(cfg.Frontends)
	pause := max(cfg.ErrorBackoff, 5*time.Millisecond)
	var tried []int
	for attempt := 0; ; attempt++ {
		f := (i + attempt) % n
		if len(tried) == 0 || tried[len(tried)-1] != f {
			tried = append(tried, f)
		}
		resp, err := cfg.Frontends[f].Predict(ctx, req)
		if status.Code(err) != codes.Unavailable || (cfg.Retries > 0 && attempt >= cfg.Retries) || ctx.Err() != nil {
			return resp, tried, err
		}
		if (attempt+1)%n == 0 {
			select {
			case <-ctx.Done():
				return resp, tried, err
			case <-time.After(pause):
			}
		}
	}
}
