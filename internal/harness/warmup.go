package harness

import (
	"context"
	"time"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/loadgen"
	"github.com/hams-go/hams/internal/run"
)

// MaxSteadyWarmup bounds the warm-up of one mode's deployment when it
// waits for the steady state (--warmup-until-steady).
const MaxSteadyWarmup = 90 * time.Second

// steadyWaves is the warm-up's run size after the first one, in batches
// (waves of --batch requests).
const steadyWaves = 8

// steadyTolerance: two warm-up runs in a row whose durations differ by at
// most this fraction of the longer one are steady.
const steadyTolerance = 0.2

// Why a warm-up ended (warmupRun.Ended).
const (
	warmupFixed   = "fixed"   // --warmup-until-steady=false: one run
	warmupSteady  = "steady"  // synced, two runs in a row alike
	warmupTimeout = "timeout" // MaxSteadyWarmup passed first
)

// warmupRun is what a warm-up took.
type warmupRun struct {
	Requests int
	Elapsed  time.Duration
	Ended    string
}

// steady reports whether a warm-up may end after a run that took cur,
// the run before it prev (0: none yet): every replicated model's backup
// holds its base (synced) and the two runs took about as long. A
// replicated model's first snapshot is its whole state (a base of 512 MiB
// takes seconds to ship and to write to the backup's model server), and
// the first fold and buffers are filled then: one-time costs of starting
// a backup, not of replicating a batch, which the rounds measure.
func steady(prev, cur time.Duration, synced bool) bool {
	if !synced || prev <= 0 || cur <= 0 {
		return false
	}
	longer, shorter := max(prev, cur), min(prev, cur)
	return float64(longer-shorter) <= steadyTolerance*float64(longer)
}

// warmUp sends n unmeasured requests through run, then, when untilSteady,
// runs of chunk more until steady (synced nil: nothing to sync, as for
// direct) or limit passed. Runs of a few batches are too short to tell a
// one-time cost from noise: the bench's chunk is eight waves.
func warmUp(ctx context.Context, n, chunk int, untilSteady bool, limit time.Duration, synced func() bool,
	run func(ctx context.Context, n int) (*loadgen.Recorder, time.Duration, error)) (warmupRun, error) {
	w := warmupRun{Ended: warmupFixed}
	start := time.Now()
	// prev: the last run of chunk requests (the first run, of n, is
	// never compared: it may differ in size and it carries the start-up).
	var prev time.Duration
	for i := 0; ; i++ {
		k := n
		if i > 0 {
			k = chunk
		}
		_, el, err := run(ctx, k)
		w.Requests += k
		w.Elapsed = time.Since(start)
		if err != nil {
			return w, err
		}
		if !untilSteady {
			return w, nil
		}
		if i > 0 && steady(prev, el, synced == nil || synced()) {
			w.Ended = warmupSteady
			return w, nil
		}
		if w.Elapsed >= limit {
			w.Ended = warmupTimeout
			return w, nil
		}
		if i > 0 {
			prev = el
		}
	}
}

// Settling between rounds (settle).
const (
	// settleLimit bounds one wait for quiet.
	settleLimit = 30 * time.Second
	// settleWindow is the interval CPU use is measured over, and
	// settleCores the use (in cores, every process of every deployment
	// of the run together) below which the run is quiet: heartbeats and
	// scrapes, not a backup still applying or writing.
	settleWindow = 250 * time.Millisecond
	settleCores  = 0.15
)

// settle waits until the children of deps together use less than
// settleCores over a settleWindow, at most limit, and returns how long it
// waited (at least one window: quiet is measured, not assumed).
func settle(ctx context.Context, deps []*cluster.Deployment, limit time.Duration) time.Duration {
	start := time.Now()
	total := func() float64 {
		var sum float64
		for _, d := range deps {
			for name, v := range sampleCPU(d) {
				if name != clientProc {
					sum += v
				}
			}
		}
		return sum
	}
	for {
		t0, c0 := time.Now(), total()
		if !run.Sleep(ctx, settleWindow) {
			return time.Since(start)
		}
		if quiet(total()-c0, time.Since(t0)) || time.Since(start) >= limit {
			return time.Since(start)
		}
	}
}

// quiet reports whether cpuSeconds used over wall is below settleCores.
func quiet(cpuSeconds float64, wall time.Duration) bool {
	return wall > 0 && cpuSeconds/wall.Seconds() < settleCores
}
