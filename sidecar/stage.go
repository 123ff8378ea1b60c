package sidecar

import (
	"context"
	"fmt"

	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/run"
	"github.com/hams-go/hams/sidecar/datapath"
)

// Stage is the set of goroutines of one role: the sidecar starts the
// stage of its current role, and a role transition stops it (Cancel,
// Wait), switches and starts the next one (replication.go). A stage owns
// every goroutine it starts: Wait returns once all of them returned.
// Cancel and Wait may be called any number of times, and before Start
// (they then do nothing): shutdown is idempotent.
//
// The roles depend on the sidecar only through Host: the backup
// (backup.go), the replicated primary (primaryState, primary.go) and
// replay mode (replayState, replay.go); the serving roles also use the
// shared executor (executor.go) and, through requestPath, the request
// path's fan-out. The sidecar builds the serving stage from its loop and
// the role's executor and workers (startStage).
type Stage interface {
	// Start starts the stage's goroutines under a child of ctx; an error
	// one of them returns while the stage runs goes to fatal (which stops
	// the sidecar).
	Start(ctx context.Context, fatal func(error))
	// Cancel ends the stage's context without waiting.
	Cancel()
	// Wait waits for every goroutine the stage started.
	Wait()
}

// namedGroup is a run.Group that names each goroutine in its error: a
// stage's, and the sidecar's own (Run).
type namedGroup struct {
	model string
	g     *run.Group
}

func (sg *namedGroup) begin(ctx context.Context, fatal func(error)) { sg.g = run.NewGroup(ctx, fatal) }

// goRun runs f in the stage (after begin).
func (sg *namedGroup) goRun(name string, f func(context.Context) error) {
	sg.g.Go(func(ctx context.Context) error {
		if err := f(ctx); err != nil {
			return fmt.Errorf("sidecar %s: %s: %w", sg.model, name, err)
		}
		return nil
	})
}

func (sg *namedGroup) Cancel() {
	if sg.g != nil {
		sg.g.Cancel()
	}
}

func (sg *namedGroup) Wait() {
	if sg.g != nil {
		_ = sg.g.Wait() // errors went to fatal
	}
}

// idleStage runs nothing: a deposed instance (fenced until a Demote,
// deposed.go) or a replay spare (idle until promoted).
type idleStage struct{ namedGroup }

func (st *idleStage) Start(ctx context.Context, fatal func(error)) { st.begin(ctx, fatal) }

// backupStage runs a backup: it applies the primary's snapshots in order
// (backupState.run, Algorithm 2). The backupState outlives the stage: the
// Replication RPCs hand it snapshots, and a promotion takes its state.
type backupStage struct {
	namedGroup
	bk *backupState
}

func newBackupStage(bk *backupState) *backupStage {
	return &backupStage{namedGroup: namedGroup{model: bk.h.Model()}, bk: bk}
}

func (st *backupStage) Start(ctx context.Context, fatal func(error)) {
	st.begin(ctx, fatal)
	st.goRun("backup", st.bk.run)
}

// namedRun is one goroutine of a stage.
type namedRun struct {
	name string
	run  func(context.Context) error
}

// executorFunc runs batches handed out by the loop: it reports on idle
// when it can take one and receives it on work.
type executorFunc func(ctx context.Context, work <-chan []*datapath.Joined, idle chan<- struct{}) error

// servingStage runs a role that takes traffic (a primary, replicated or
// not, or a model in replay mode): the out-edges' senders, the role's own
// goroutines (workers), its executors, and the loop that joins, batches
// and hands batches to idle executors.
type servingStage struct {
	namedGroup
	senders   []*edge.Sender
	workers   []namedRun
	executor  executorFunc
	executors int
	loop      func(ctx context.Context, work chan<- []*datapath.Joined, idle <-chan struct{})
}

func (st *servingStage) Start(ctx context.Context, fatal func(error)) {
	st.begin(ctx, fatal)
	for _, snd := range st.senders {
		st.goRun("sender", snd.Run)
	}
	work := make(chan []*datapath.Joined)
	idle := make(chan struct{})
	for _, w := range st.workers {
		st.goRun(w.name, w.run)
	}
	for range st.executors {
		st.goRun("executor", func(ctx context.Context) error { return st.executor(ctx, work, idle) })
	}
	st.goRun("loop", func(ctx context.Context) error { st.loop(ctx, work, idle); return nil })
}
