package loadgen

import (
	"math"
	"slices"
	"sync"
	"time"

	"gonum.org/v1/gonum/stat"
)

// Stats is a summary of recorded latencies.
type Stats struct {
	Requests      int     `json:"requests"`
	Replies       int     `json:"replies"`
	Errors        int     `json:"errors"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	MeanMs        float64 `json:"mean_ms"`
	ThroughputRPS float64 `json:"throughput_rps"`
	ElapsedS      float64 `json:"elapsed_s"`
}

// Recorder collects latencies of successful requests and error counts.
// Safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	start   time.Time
	end     time.Time
	lat     []time.Duration
	errs    int
	started int
}

// NewRecorder starts the wall clock now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Restart resets the wall clock (after a warm-up) and drops what was recorded.
func (r *Recorder) Restart() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.start, r.end, r.lat, r.errs, r.started = time.Now(), time.Time{}, nil, 0, 0
}

// Sent counts a request sent.
func (r *Recorder) Sent(n int) {
	r.mu.Lock()
	r.started += n
	r.mu.Unlock()
}

// OK records n successful requests that took d each (n > 1 for a batch).
func (r *Recorder) OK(d time.Duration, n int) {
	r.mu.Lock()
	for range n {
		r.lat = append(r.lat, d)
	}
	r.mu.Unlock()
}

// Err records n failed requests.
func (r *Recorder) Err(n int) {
	r.mu.Lock()
	r.errs += n
	r.mu.Unlock()
}

// Stop freezes the wall clock used for throughput.
func (r *Recorder) Stop() {
	r.mu.Lock()
	if r.end.IsZero() {
		r.end = time.Now()
	}
	r.mu.Unlock()
}

// Latencies returns a copy of the recorded latencies.
func (r *Recorder) Latencies() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lat)
}

// Stats summarises what was recorded so far.
func (r *Recorder) Stats() Stats {
	r.mu.Lock()
	lat := slices.Clone(r.lat)
	end := r.end
	if end.IsZero() {
		end = time.Now()
	}
	s := Stats{Requests: r.started, Replies: len(lat), Errors: r.errs, ElapsedS: end.Sub(r.start).Seconds()}
	r.mu.Unlock()
	if s.Requests < s.Replies+s.Errors {
		s.Requests = s.Replies + s.Errors
	}
	Summarize(lat, &s)
	return s
}

// Summarize fills the latency fields of s from lat (sorted in place) and
// the throughput from s.Replies and s.ElapsedS.
func Summarize(lat []time.Duration, s *Stats) {
	if s.ElapsedS > 0 {
		s.ThroughputRPS = round3(float64(s.Replies) / s.ElapsedS)
	}
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	s.P50Ms = round3(ms(Percentile(lat, 50)))
	s.P99Ms = round3(ms(Percentile(lat, 99)))
	s.MeanMs = round3(ms(sum / time.Duration(len(lat))))
}

// Percentile is the nearest-rank p-th percentile (0 <= p <= 100) of
// sorted latencies: the smallest sample with at least p% of the samples at
// or below it, the 1-based rank ceil(p/100*n). It is gonum's stat.Quantile
// with stat.Empirical, which is that definition (no interpolation).
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	x := make([]float64, len(sorted))
	for i, d := range sorted {
		x[i] = float64(d)
	}
	return time.Duration(stat.Quantile(min(max(p/100, 0), 1), stat.Empirical, x, nil))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }
