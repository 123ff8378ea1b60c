package harness

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/loadgen"
)

func TestSteady(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		prev, cur time.Duration
		synced    bool
		want      bool
	}{
		{0, 100 * ms, true, false},         // one run says nothing
		{100 * ms, 110 * ms, true, true},   // alike
		{110 * ms, 100 * ms, true, true},   // alike, faster
		{500 * ms, 100 * ms, true, false},  // still settling
		{100 * ms, 130 * ms, true, false},  // 23% apart
		{100 * ms, 100 * ms, false, false}, // a backup waits for its base
	} {
		if got := steady(c.prev, c.cur, c.synced); got != c.want {
			t.Errorf("steady(%v, %v, synced %t) = %t, want %t", c.prev, c.cur, c.synced, got, c.want)
		}
	}
}

// A 512 MiB learner's first runs are slow while its base is shipped and
// written; the warm-up lasts until the backup is synced and the runs
// settle, and says so. Fixed mode runs once; a failed run ends it.
func TestWarmUpUntilSteady(t *testing.T) {
	ms := time.Millisecond
	durs := []time.Duration{900 * ms, 700 * ms, 200 * ms, 190 * ms, 195 * ms}
	var calls int
	run := func(_ context.Context, n int) (*loadgen.Recorder, time.Duration, error) {
		d := durs[min(calls, len(durs)-1)]
		calls++
		return nil, d, nil
	}
	syncedAfter := 2 // the backup holds its base from the second check on
	checks := 0
	synced := func() bool { checks++; return checks >= syncedAfter }
	w, err := warmUp(context.Background(), 128, 512, true, time.Hour, synced, run)
	if err != nil {
		t.Fatal(err)
	}
	if w.Ended != warmupSteady || w.Requests != 128+3*512 || calls != 4 {
		t.Fatalf("warm-up = %+v after %d runs; want steady after 4 runs (900, 700, 200, 190 ms)", w, calls)
	}

	calls = 0
	w, err = warmUp(context.Background(), 128, 512, false, time.Hour, synced, run)
	if err != nil || w.Ended != warmupFixed || calls != 1 || w.Requests != 128 {
		t.Fatalf("fixed warm-up = %+v, %v after %d runs; want one run", w, err, calls)
	}

	// --warmup as large as a chunk: the first run (the start-up) is still
	// not one of the two compared.
	durs = []time.Duration{200 * ms, 210 * ms, 205 * ms}
	calls, checks = 0, syncedAfter
	w, err = warmUp(context.Background(), 512, 512, true, time.Hour, synced, run)
	if err != nil || w.Ended != warmupSteady || calls != 3 {
		t.Fatalf("warm-up with --warmup = chunk: %+v, %v after %d runs; want steady after 3 (the first not compared)", w, err, calls)
	}

	// A backup that never syncs: the limit ends the warm-up.
	calls = 0
	w, err = warmUp(context.Background(), 128, 512, true, 0, func() bool { return false }, run)
	if err != nil || w.Ended != warmupTimeout || calls != 1 {
		t.Fatalf("warm-up of a backup that never syncs = %+v, %v after %d runs; want timeout", w, err, calls)
	}

	boom := errors.New("deadline")
	_, err = warmUp(context.Background(), 128, 512, true, time.Hour, nil, func(context.Context, int) (*loadgen.Recorder, time.Duration, error) {
		return nil, 0, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("a failed warm-up run: err = %v", err)
	}
}

func TestQuiet(t *testing.T) {
	w := 250 * time.Millisecond
	if !quiet(0.02, w) { // 0.08 cores: heartbeats
		t.Error("0.08 cores is quiet")
	}
	if quiet(0.2, w) { // 0.8 cores: a backup still writing a state
		t.Error("0.8 cores is not quiet")
	}
	if quiet(0, 0) {
		t.Error("nothing measured is not quiet")
	}
}
