package refserver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hams-go/hams/internal/run"
)

// ErrStraggle is wrapped by every StraggleConfig validation and
// ParseStraggle error.
var ErrStraggle = errors.New("refserver: invalid straggle config")

// StraggleConfig describes a seeded straggler schedule: time, counted from
// the server's start, is cut into windows of length Period; window w is
// slow with probability Fraction, decided by a PCG generator seeded with
// (Seed, w) alone, so the schedule is a pure function of (Seed, w) and
// every run, process and benchmark arm with the same seed sees the same
// slow windows. During a slow window every Infer and Compute call waits
// Delay plus a seeded uniform 0..Jitter before it computes; with Freeze it
// instead blocks until the run of slow windows it arrived in ends (a
// frozen instance; Delay and Jitter must then be 0). Waits end at once
// when the request's context ends. Fraction 1 with a huge Period is a
// server that is always slow (or, with Freeze, never answers).
type StraggleConfig struct {
	Seed     uint64
	Period   time.Duration
	Fraction float64
	Delay    time.Duration
	Jitter   time.Duration
	Freeze   bool
}

// Validate checks the config; errors wrap ErrStraggle and name the field.
func (c StraggleConfig) Validate() error {
	switch {
	case c.Period <= 0:
		return fmt.Errorf("%w: period %v, want > 0", ErrStraggle, c.Period)
	case math.IsNaN(c.Fraction) || c.Fraction < 0 || c.Fraction > 1:
		return fmt.Errorf("%w: fraction %v, want 0..1", ErrStraggle, c.Fraction)
	case c.Delay < 0:
		return fmt.Errorf("%w: delay %v, want >= 0", ErrStraggle, c.Delay)
	case c.Jitter < 0:
		return fmt.Errorf("%w: jitter %v, want >= 0", ErrStraggle, c.Jitter)
	case c.Freeze && (c.Delay != 0 || c.Jitter != 0):
		return fmt.Errorf("%w: freeze blocks a call until its slow windows end; delay (%v) and jitter (%v) must be 0 with it", ErrStraggle, c.Delay, c.Jitter)
	case !c.Freeze && c.Fraction > 0 && c.Delay == 0 && c.Jitter == 0:
		return fmt.Errorf("%w: fraction %v with no delay, jitter or freeze slows nothing", ErrStraggle, c.Fraction)
	}
	return nil
}

// String is the spec ParseStraggle reads back.
func (c StraggleConfig) String() string {
	return fmt.Sprintf("seed=%d,period=%v,fraction=%s,delay=%v,jitter=%v,freeze=%t",
		c.Seed, c.Period, strconv.FormatFloat(c.Fraction, 'g', -1, 64), c.Delay, c.Jitter, c.Freeze)
}

// Distinct streams of the per-window generator.
const (
	streamSlow   = 0x736c6f77 // "slow"
	streamJitter = 0x6a697474 // "jitt"
)

// mix64 is SplitMix64's finaliser: consecutive window indices become
// unrelated PCG seeds.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (c StraggleConfig) pcg(stream, w, n uint64) *rand.Rand {
	return rand.New(rand.NewPCG(c.Seed, mix64(mix64(w^(stream<<32))^n)))
}

// Slow reports whether window w is slow: a pure function of (Seed, w) and
// Fraction.
func (c StraggleConfig) Slow(w uint64) bool {
	if c.Fraction <= 0 {
		return false
	}
	return c.pcg(streamSlow, w, 0).Float64() < c.Fraction
}

// JitterAt is the extra wait, uniform in 0..Jitter, of the n-th delayed
// call (counted from 0 by the straggler) in window w: a pure function of
// (Seed, w, n).
func (c StraggleConfig) JitterAt(w, n uint64) time.Duration {
	if c.Jitter <= 0 {
		return 0
	}
	return time.Duration(c.pcg(streamJitter, w, n).Int64N(int64(c.Jitter) + 1))
}

// maxFrozenWindows bounds the search for the end of a run of slow
// windows: a longer run (e.g. Fraction 1) blocks until the call's context
// ends.
const maxFrozenWindows = 1 << 16

// Straggler applies a StraggleConfig to calls; it is safe for concurrent
// use.
type Straggler struct {
	cfg   StraggleConfig
	start time.Time
	now   func() time.Time
	// wait sleeps d or until ctx ends (tests replace it).
	wait func(ctx context.Context, d time.Duration) error
	// calls numbers the delayed calls (the jitter's draw index).
	calls   atomic.Uint64
	delayed atomic.Uint64
	waited  atomic.Int64
}

// NewStraggler validates cfg and returns a straggler whose window 0 begins
// at start; now is its clock (nil: time.Now).
func NewStraggler(cfg StraggleConfig, start time.Time, now func() time.Time) (*Straggler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &Straggler{cfg: cfg, start: start, now: now, wait: waitCtx}, nil
}

// Config returns the straggler's config.
func (s *Straggler) Config() StraggleConfig { return s.cfg }

// Start is the beginning of window 0.
func (s *Straggler) Start() time.Time { return s.start }

// Window is the index of the window holding t (0 before the start).
func (s *Straggler) Window(t time.Time) uint64 {
	d := t.Sub(s.start)
	if d <= 0 {
		return 0
	}
	return uint64(d / s.cfg.Period)
}

// windowStart is when window w begins.
func (s *Straggler) windowStart(w uint64) time.Time {
	return s.start.Add(time.Duration(w) * s.cfg.Period)
}

// SlowAt reports whether the window holding t is slow.
func (s *Straggler) SlowAt(t time.Time) bool { return s.cfg.Slow(s.Window(t)) }

// Plan is how long a call arriving at t waits, and whether it waits at
// all: 0 in a fast window; Delay plus the next jitter draw in a slow one;
// with Freeze, until the run of slow windows holding t ends (forever,
// reported as a negative duration, when no fast window follows within
// 65536 windows). Each slow-window call consumes one jitter draw.
func (s *Straggler) Plan(t time.Time) (time.Duration, bool) {
	w := s.Window(t)
	if !s.cfg.Slow(w) {
		return 0, false
	}
	if s.cfg.Freeze {
		for end := w + 1; end-w <= maxFrozenWindows; end++ {
			if !s.cfg.Slow(end) {
				return max(s.windowStart(end).Sub(t), 0), true
			}
		}
		return -1, true
	}
	n := s.calls.Add(1) - 1
	return s.cfg.Delay + s.cfg.JitterAt(w, n), true
}

// Wait delays the calling request as Plan says for the current time: it
// reports how long it waited and whether the call arrived in a slow
// window, and returns the context's error (at once) if ctx ends first.
func (s *Straggler) Wait(ctx context.Context) (time.Duration, bool, error) {
	d, slow := s.Plan(s.now())
	if !slow {
		return 0, false, nil
	}
	s.delayed.Add(1)
	begin := time.Now()
	var err error
	if d < 0 {
		<-ctx.Done()
		err = ctx.Err()
	} else {
		err = s.wait(ctx, d)
	}
	waited := time.Since(begin)
	s.waited.Add(int64(waited))
	return waited, true, err
}

// Delayed counts the calls that arrived in a slow window.
func (s *Straggler) Delayed() uint64 { return s.delayed.Load() }

// Waited is the total time calls spent waiting.
func (s *Straggler) Waited() time.Duration { return time.Duration(s.waited.Load()) }

// straggleKeys are ParseStraggle's keys, in String's order.
var straggleKeys = []string{"seed", "period", "fraction", "delay", "jitter", "freeze"}

// ParseStraggle reads a spec such as
// "seed=7,period=200ms,fraction=0.2,delay=40ms,jitter=5ms,freeze=false"
// (String's format): comma-separated key=value pairs, each key at most
// once; period and fraction are required, the others default to 0 and
// false. The result is validated; errors wrap ErrStraggle and name the
// bad key or value.
func ParseStraggle(spec string) (StraggleConfig, error) {
	var c StraggleConfig
	if strings.TrimSpace(spec) == "" {
		return c, fmt.Errorf("%w: empty spec (want e.g. %q)", ErrStraggle, "seed=7,period=200ms,fraction=0.2,delay=40ms")
	}
	seen := map[string]bool{}
	for _, kv := range strings.Split(spec, ",") {
		kv = strings.TrimSpace(kv)
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" {
			return c, fmt.Errorf("%w: %q in spec %q is not key=value", ErrStraggle, kv, spec)
		}
		if seen[k] {
			return c, fmt.Errorf("%w: key %q given twice in spec %q", ErrStraggle, k, spec)
		}
		seen[k] = true
		var err error
		switch k {
		case "seed":
			c.Seed, err = strconv.ParseUint(v, 10, 64)
		case "period":
			c.Period, err = time.ParseDuration(v)
		case "fraction":
			c.Fraction, err = strconv.ParseFloat(v, 64)
		case "delay":
			c.Delay, err = time.ParseDuration(v)
		case "jitter":
			c.Jitter, err = time.ParseDuration(v)
		case "freeze":
			c.Freeze, err = strconv.ParseBool(v)
		default:
			return c, fmt.Errorf("%w: unknown key %q in spec %q (keys: %s)", ErrStraggle, k, spec, strings.Join(straggleKeys, ", "))
		}
		if err != nil {
			return c, fmt.Errorf("%w: key %s: bad value %q: %v", ErrStraggle, k, v, err)
		}
	}
	for _, k := range []string{"period", "fraction"} {
		if !seen[k] {
			return c, fmt.Errorf("%w: key %s is required in spec %q", ErrStraggle, k, spec)
		}
	}
	return c, c.Validate()
}

// waitCtx waits d or until ctx ends, returning ctx's error in that case.
func waitCtx(ctx context.Context, d time.Duration) error {
	if !run.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}
