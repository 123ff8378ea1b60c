package sidecar

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hams-go/hams/sidecar/datapath"
)

// A stage owns its goroutines: Wait returns only once every one returned,
// Cancel and Wait may be repeated and called before Start, and an error a
// goroutine returns while the stage runs goes to fatal (named), one after
// Cancel does not.
func TestStageOwnsItsGoroutinesAndStopsIdempotently(t *testing.T) {
	var idle idleStage
	idle.Cancel() // before Start: nothing to do
	idle.Wait()
	idle.Start(context.Background(), func(err error) { t.Errorf("fatal from an idle stage: %v", err) })
	idle.Cancel()
	idle.Cancel()
	idle.Wait()
	idle.Wait()

	var running, returned atomic.Int32
	boom := errors.New("boom")
	fatal := make(chan error, 4)
	worker := func(ctx context.Context) error {
		running.Add(1)
		<-ctx.Done()
		time.Sleep(10 * time.Millisecond) // returns well after Cancel
		returned.Add(1)
		return boom // after Cancel: not fatal
	}
	st := &servingStage{
		namedGroup: namedGroup{model: "m"},
		workers:    []namedRun{{"w1", worker}, {"w2", worker}},
		executors:  3,
		executor: func(ctx context.Context, _ <-chan []*datapath.Joined, _ chan<- struct{}) error {
			return worker(ctx)
		},
		loop: func(ctx context.Context, _ chan<- []*datapath.Joined, _ <-chan struct{}) { _ = worker(ctx) },
	}
	st.Start(context.Background(), func(err error) { fatal <- err })
	waitFor(t, "every goroutine of the stage running", func() bool { return running.Load() == 6 })
	st.Cancel()
	st.Wait()
	if n := returned.Load(); n != 6 {
		t.Fatalf("Wait returned with %d of 6 goroutines returned", n)
	}
	st.Cancel()
	st.Wait()
	select {
	case err := <-fatal:
		t.Fatalf("an error after Cancel went to fatal: %v", err)
	default:
	}

	failing := &backupStage{namedGroup: namedGroup{model: "m"}}
	failing.begin(context.Background(), func(err error) { fatal <- err })
	failing.goRun("applier", func(context.Context) error { return boom })
	err := <-fatal
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "sidecar m: applier:") {
		t.Fatalf("fatal got %v, want boom named by model and goroutine", err)
	}
	failing.Cancel()
	failing.Wait()
}
