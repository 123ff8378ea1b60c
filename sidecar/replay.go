package sidecar

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/run"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protocol/lineage"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/sidecar/datapath"
)

// Replay mode (deployment mode "replay", the Lineage-Stash-style baseline
// of the HAMS paper's Table II) for a stateful model with ha stateful.
//
// Serving: the primary runs the bare request path (Backend.Infer, one
// batch at a time, outputs released at once, no snapshot per batch) plus:
//   - an input log: after each batch, the executor queues a
//     hamsv1.ReplayBatch (the exact BatchRequest the backend got, and per
//     request the items that formed it, without tensors) and a logger
//     goroutine appends queued batches to ReplayStore asynchronously, off
//     the request path (the executor waits only when replayLogQueue
//     batches are queued: backpressure, never loss);
//   - checkpoints: every Config.Deployment.Replay.CheckpointEvery batches,
//     and when batches not yet covered have been idle for CheckpointIdle,
//     the executor reads the state between two batches (the model is not
//     computing: Lineage Stash stops the operator to checkpoint) and a
//     checkpointer goroutine stores it with what a replacement needs (last
//     batch and seq, the lineage flow index, recent request keys) and the
//     records of the requests it newly covers. At most one checkpoint is
//     in flight; the interval stretches when storing is slower.
//
// Durable records (audit, durable.jsonl): replay mode makes a request's
// outcome durable only when a checkpoint covering it is stored. The
// checkpointer then writes one record per newly covered request: {seq,
// input digest, output digest of the execution the checkpoint includes,
// the checkpoint's state digest} (state is only read at checkpoints, so
// every record of one checkpoint carries the state after its last batch).
// A replacement writes the records of the checkpoint it loads again
// (identical), and those of the batches it re-executed once its recovery
// checkpoint is stored: where re-execution is non-deterministic, a reply
// released before the failure names an output the durable history does
// not have, which is what the consistency checker reports.
//
// Recovery: the model's spare sidecar (role backup, a model server of its
// own, idle, taking no traffic) is promoted by the manager. It loads the
// newest checkpoint, writes its state to its backend, reads the input log
// after it and re-executes the logged batches in order (replayChain), with
// the logged requests' seqs; then it takes a recovery checkpoint, seeds
// its duplicate filter with the requests its state covers, and sends each
// successor the re-executed outputs beyond what that successor received
// (Promote metadata ReplayAfterMetadata, from the successors' lineage
// summaries). The manager then has the predecessors resend after the
// positions the new state covers; duplicates of logged requests are
// dropped by request key. Nothing downstream is rolled back or promoted.
//
// Invariants: batch ids in the log are dense per model and continue across
// recoveries; a record of a lower epoch never follows a higher one in a
// replayed chain; a durable record is written only after the checkpoint
// covering it is stored.

// ReplayStore is replay mode's input log and checkpoint store (satisfied
// by *coord.Replay).
type ReplayStore interface {
	// Reset forgets model's log and checkpoints (a fresh history).
	Reset(ctx context.Context, model string) error
	// Append logs batches in order and returns their log positions.
	Append(ctx context.Context, batches []*hamsv1.ReplayBatch) ([]uint64, error)
	// Batches returns model's logged batches with batch_id above after.
	Batches(ctx context.Context, model string, after uint64) ([]*hamsv1.ReplayBatch, error)
	// Trim drops model's log up to position seq (inclusive).
	Trim(ctx context.Context, model string, seq uint64) error
	// SaveCheckpoint stores ck with state (filling in its state fields).
	SaveCheckpoint(ctx context.Context, ck *hamsv1.ReplayCheckpoint, state []*hamsv1.Tensor) error
	// LoadCheckpoint returns model's newest checkpoint, or an error
	// wrapping coord.ErrNoCheckpoint.
	LoadCheckpoint(ctx context.Context, model string) (*hamsv1.ReplayCheckpoint, []*hamsv1.Tensor, error)
}

// ReplayAfterMetadata is the gRPC metadata key of a Promote in replay
// mode: one value "successor=seq" per successor (config.Frontend for the
// sink edge), the highest seq of this model that successor received; the
// promoted spare sends it the re-executed outputs above it (all of them to
// a successor not named).
const ReplayAfterMetadata = "hams-replay-after"

const (
	// replayLogQueue bounds the batches waiting to be logged.
	replayLogQueue = 4096
	// replayLogBurst is the most batches one Append carries.
	replayLogBurst = 256
	// replayDedupKeys is the number of most recent requests whose keys a
	// checkpoint keeps for a replacement's duplicate filter.
	replayDedupKeys = 8192
	// replayRecoverTimeout bounds loading and re-executing on promotion.
	replayRecoverTimeout = 2 * time.Minute
	// replayFlushTimeout bounds logging what is queued when a stage stops.
	replayFlushTimeout = 2 * time.Second
)

// replayEnabled reports whether cfg's model runs in replay mode: stateful,
// ha stateful, deployment mode replay.
func replayEnabled(cfg Config) bool {
	return cfg.Deployment.Replays(cfg.Deployment.Model(cfg.Model))
}

// ckptJob is one checkpoint: the state after batch, read by the executor,
// and the requests it newly covers.
type ckptJob struct {
	epoch, batch, seq, version uint64
	state                      []*hamsv1.Tensor
	records                    []*hamsv1.ReplayRecord
	flow                       []*hamsv1.ReplayFlowPair
	flowMax                    map[string]uint64
	dedup                      []*hamsv1.ReplayDedupKeys
	taken                      time.Time
}

// replayState is the replay-mode role of a sidecar (see the comment at the
// top of this file): its stage's executor, input logger and checkpointer,
// and the recovery a promotion runs. It depends on the sidecar only
// through Host, the shared executor (x: the bare request path, whose
// batches it logs as x's batchLog) and the lineage index it checkpoints
// and restores.
type replayState struct {
	h     Host
	x     *executor
	bp    *backendPolicy
	idx   *lineageIndex
	store ReplayStore
	sbe   StatefulBackend
	every int
	idle  time.Duration

	// Owned by the primary stage's executor, or by a transition while the
	// stage is stopped.
	batch    uint64                 // last batch executed (logged or replayed)
	since    int                    // batches since the last checkpoint job
	lastExec time.Time              // when the last batch finished
	records  []*hamsv1.ReplayRecord // requests executed since the last job
	initial  bool                   // the initial checkpoint is still to take

	mu       sync.Mutex
	fresh    bool                  // the store is still to be reset (first primary)
	reset    bool                  // the store was reset (or needs none)
	logq     []*hamsv1.ReplayBatch // queued, not yet logged
	logWake  chan struct{}
	logSpace chan struct{}     // closed and replaced when the queue shrinks
	acked    map[uint64]uint64 // batch id -> log position, above the last trim
	jobs     []*ckptJob        // jobs[0] is being stored
	ckWake   chan struct{}
	alog     *audit.Log
	closed   bool
}

// newReplayState builds the replay role of h's model; fresh: this
// instance starts the model's history (the initial primary). x is set
// once the executor is built (New).
func newReplayState(h Host, bp *backendPolicy, idx *lineageIndex, rc config.Replay, store ReplayStore, sbe StatefulBackend, fresh bool) *replayState {
	return &replayState{h: h, bp: bp, idx: idx, store: store, sbe: sbe, every: rc.CheckpointEvery, idle: rc.CheckpointIdle.D(),
		fresh: fresh, reset: !fresh, initial: fresh, logWake: make(chan struct{}, 1), logSpace: make(chan struct{}),
		acked: map[uint64]uint64{}, ckWake: make(chan struct{}, 1)}
}

func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// auditLog opens this instance's durable.jsonl on first use (nil without
// Config.AuditDir).
func (rp *replayState) auditLog() (*audit.Log, error) {
	if rp.h.AuditDir() == "" {
		return nil, nil
	}
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.closed {
		return nil, errors.New("replay state closed")
	}
	if rp.alog == nil {
		l, err := audit.Open(rp.h.AuditDir(), rp.h.AuditSubdir("replay"), audit.DurableFile)
		if err != nil {
			return nil, err
		}
		rp.alog = l
	}
	return rp.alog, nil
}

// writeRecords appends durable records of a stored checkpoint.
func (rp *replayState) writeRecords(recs []*hamsv1.ReplayRecord, stateDigest string) error {
	l, err := rp.auditLog()
	if err != nil || l == nil {
		return err
	}
	for _, r := range recs {
		if err := l.Write(audit.Durable{Model: rp.h.Model(), Seq: r.GetSeq(), InputDigest: r.GetInputDigest(),
			OutputDigest: r.GetOutputDigest(), StateDigest: stateDigest}); err != nil {
			return err
		}
	}
	if err := l.Flush(); err != nil {
		return fmt.Errorf("flush audit log: %w", err)
	}
	return nil
}

// close closes the audit log (Run's end).
func (rp *replayState) close() {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	rp.closed = true
	if rp.alog != nil {
		if err := rp.alog.Close(); err != nil {
			rp.h.Logger().Warn("close replay audit log", "err", err)
		}
		rp.alog = nil
	}
}

// --- serving ---

// executed is the executor's batchLog (executor.go finish): the batch
// (req, the request the backend got) is queued for the input log and its
// requests wait for a checkpoint. It blocks only while replayLogQueue
// batches are queued.
func (rp *replayState) executed(ctx context.Context, req *hamsv1.BatchRequest, reqs []request, seqs []uint64, lins [][]*hamsv1.LineageEntry) {
	if req == nil || len(reqs) == 0 {
		return
	}
	rp.batch++
	b := &hamsv1.ReplayBatch{Model: rp.h.Model(), Epoch: rp.h.Epoch(), BatchId: rp.batch, FirstSeq: seqs[0], Request: req,
		Requests: make([]*hamsv1.ReplayRequest, len(reqs))}
	for i, r := range reqs {
		parts := make([]*hamsv1.Item, len(r.j.Parts))
		for k, p := range r.j.Parts {
			parts[k] = &hamsv1.Item{ReqId: p.GetReqId(), Service: p.GetService(), StreamId: p.GetStreamId(), Lineage: p.GetLineage(),
				EdgeSeq: p.GetEdgeSeq(), FromModel: p.GetFromModel(), Approximate: p.GetApproximate()} // no deadline: it is this host's clock, and the log is replayed on another
		}
		in := tensor.Digest(r.inputs...)
		out := lins[i][len(lins[i])-1].GetOutputDigest()
		b.Requests[i] = &hamsv1.ReplayRequest{ReqId: r.j.ReqID, Parts: parts, InputDigest: in, OutputDigest: out}
		rp.records = append(rp.records, &hamsv1.ReplayRecord{Seq: seqs[i], ReqId: r.j.ReqID, InputDigest: in, OutputDigest: out})
	}
	rp.since++
	rp.lastExec = time.Now()
	for {
		rp.mu.Lock()
		if len(rp.logq) < replayLogQueue {
			rp.logq = append(rp.logq, b)
			rp.mu.Unlock()
			wake(rp.logWake)
			return
		}
		space := rp.logSpace
		rp.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			// The stage stops: queue it anyway (the flush or the next
			// stage logs it).
			rp.mu.Lock()
			rp.logq = append(rp.logq, b)
			rp.mu.Unlock()
			return
		}
	}
}

// executor is the replay primary's executor: the bare executor plus the
// checkpoint policy (every N batches, and after an idle period).
func (rp *replayState) executor(ctx context.Context, work <-chan []*datapath.Joined, idle chan<- struct{}) error {
	if !rp.x.describe(ctx) {
		return nil
	}
	if rp.initial {
		// The initial state: a replacement starts from it if this
		// primary fails before its first checkpoint.
		if err := rp.checkpoint(ctx); err != nil {
			return err
		}
		rp.initial = false
	}
	for {
		select {
		case idle <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		b, err := rp.next(ctx, work)
		if err != nil || b == nil {
			return err
		}
		if err := rp.x.execute(ctx, b); err != nil {
			return err
		}
		if rp.since >= rp.every {
			if err := rp.checkpoint(ctx); err != nil {
				return err
			}
		}
	}
}

// next waits for the next batch; while it waits with batches not covered
// by a checkpoint, it checkpoints them once they have been idle rp.idle.
// It returns nil when ctx ends.
func (rp *replayState) next(ctx context.Context, work <-chan []*datapath.Joined) ([]*datapath.Joined, error) {
	for {
		var t *time.Timer
		var tc <-chan time.Time
		if rp.since > 0 {
			t = time.NewTimer(max(time.Until(rp.lastExec.Add(rp.idle)), 0))
			tc = t.C
		}
		select {
		case b := <-work:
			if t != nil {
				t.Stop()
			}
			return b, nil
		case <-tc:
			if err := rp.checkpoint(ctx); err != nil {
				return nil, err
			}
			if rp.since > 0 {
				// Not taken (one is still being stored): try again after
				// another idle period.
				rp.lastExec = time.Now()
			}
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return nil, nil
		}
	}
}

// checkpoint reads the state (between batches) and queues a checkpoint
// job, unless one is still being stored. It fails only when the backend
// is lost.
func (rp *replayState) checkpoint(ctx context.Context) error {
	rp.mu.Lock()
	busy := len(rp.jobs) > 0
	rp.mu.Unlock()
	if busy {
		return nil
	}
	var ts []*hamsv1.Tensor
	var version uint64
	err := rp.bp.retry(ctx, "read state", func() (err error) {
		ts, version, err = rp.sbe.ReadState(ctx)
		return err
	})
	if errors.Is(err, errBackendLost) {
		return err
	}
	if err != nil {
		if ctx.Err() == nil {
			rp.h.Logger().Warn("replay: read state for a checkpoint failed; trying again later", "batch", rp.batch, "err", err)
		}
		return nil
	}
	rp.queueJob(ts, version)
	return nil
}

// queueJob hands the state read after rp.batch to the checkpointer with
// the records collected since the last job.
func (rp *replayState) queueJob(ts []*hamsv1.Tensor, version uint64) {
	j := &ckptJob{epoch: rp.h.Epoch(), batch: rp.batch, seq: rp.x.seq(), version: version, state: ts,
		records: rp.records, taken: time.Now()}
	j.flow, j.flowMax, j.dedup = rp.idx.replayExport(replayDedupKeys)
	rp.records, rp.since = nil, 0
	rp.mu.Lock()
	rp.jobs = append(rp.jobs, j)
	rp.mu.Unlock()
	wake(rp.ckWake)
}

// logger appends queued batches to the store (after resetting it for a
// fresh history) until ctx ends, then tries to log what is left.
func (rp *replayState) logger(ctx context.Context) error {
	if err := rp.resetStore(ctx); err != nil {
		return err
	}
	backoff := stateOpBackoff
	for {
		select {
		case <-rp.logWake:
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replayFlushTimeout)
			defer cancel()
			for rp.logSome(fctx) > 0 {
			}
			return nil
		}
		for {
			n := rp.logSome(ctx)
			if n == 0 {
				break
			}
			if n < 0 {
				if !run.Sleep(ctx, backoff) {
					break
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			backoff = stateOpBackoff
		}
	}
}

// logSome appends up to replayLogBurst queued batches: the number logged,
// 0 when the queue is empty, -1 on error.
func (rp *replayState) logSome(ctx context.Context) int {
	rp.mu.Lock()
	n := min(len(rp.logq), replayLogBurst)
	batch := append([]*hamsv1.ReplayBatch(nil), rp.logq[:n]...)
	rp.mu.Unlock()
	if n == 0 {
		return 0
	}
	seqs, err := rp.store.Append(ctx, batch)
	done := len(seqs)
	rp.mu.Lock()
	for i := range done {
		rp.acked[batch[i].GetBatchId()] = seqs[i]
	}
	clear(rp.logq[:done])
	rp.logq = rp.logq[done:]
	if done > 0 {
		close(rp.logSpace)
		rp.logSpace = make(chan struct{})
	}
	rp.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			rp.h.Logger().Warn("replay: input log append failed; retrying", "batches", n, "logged", done, "err", err)
		}
		return -1
	}
	return done
}

// resetStore forgets the model's earlier history once, before the first
// primary logs or checkpoints anything.
func (rp *replayState) resetStore(ctx context.Context) error {
	rp.mu.Lock()
	fresh := rp.fresh
	rp.mu.Unlock()
	if !fresh {
		return nil
	}
	backoff := stateOpBackoff
	for {
		err := rp.store.Reset(ctx, rp.h.Model())
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		rp.h.Logger().Warn("replay: reset of the input log and checkpoints failed; retrying", "err", err)
		if !run.Sleep(ctx, backoff) {
			return nil
		}
		backoff = min(2*backoff, time.Second)
	}
	rp.mu.Lock()
	rp.fresh, rp.reset = false, true
	rp.mu.Unlock()
	wake(rp.ckWake)
	return nil
}

// checkpointer stores queued checkpoint jobs in order until ctx ends.
func (rp *replayState) checkpointer(ctx context.Context) error {
	backoff := stateOpBackoff
	for {
		select {
		case <-rp.ckWake:
		case <-ctx.Done():
			return nil
		}
		for {
			rp.mu.Lock()
			var j *ckptJob
			if rp.reset && len(rp.jobs) > 0 {
				j = rp.jobs[0]
			}
			rp.mu.Unlock()
			if j == nil {
				break
			}
			if err := rp.store1(ctx, j); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				rp.h.Logger().Warn("replay: storing a checkpoint failed; retrying", "batch", j.batch, "err", err)
				if !run.Sleep(ctx, backoff) {
					return nil
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			backoff = stateOpBackoff
			rp.mu.Lock()
			rp.jobs = rp.jobs[1:]
			rp.mu.Unlock()
		}
	}
}

// store1 stores one checkpoint, writes the durable records of the
// requests it newly covers, and trims the input log it makes unneeded.
func (rp *replayState) store1(ctx context.Context, j *ckptJob) error {
	log := rp.h.Logger()
	ck := &hamsv1.ReplayCheckpoint{Model: rp.h.Model(), Epoch: j.epoch, BatchId: j.batch, Seq: j.seq, StateVersion: j.version,
		Records: j.records, Flow: j.flow, FlowMaxSeq: j.flowMax, Dedup: j.dedup, TakenUnixNano: j.taken.UnixNano()}
	start := time.Now()
	if err := rp.store.SaveCheckpoint(ctx, ck, j.state); err != nil {
		return err
	}
	if err := rp.writeRecords(j.records, ck.GetStateDigest()); err != nil {
		// The checkpoint is stored: its records are what a replacement
		// writes again; the audit is this instance's own problem.
		log.Error("replay: write durable records", "batch", j.batch, "err", err)
	}
	log.Debug("replay: checkpoint stored", "batch", j.batch, "seq", j.seq, "requests", len(j.records),
		"state_bytes", ck.GetStateBytes(), "took", time.Since(start))
	rp.mu.Lock()
	var trim uint64
	for b, seq := range rp.acked {
		if b <= j.batch {
			trim = max(trim, seq)
			delete(rp.acked, b)
		}
	}
	rp.mu.Unlock()
	if trim > 0 {
		if err := rp.store.Trim(ctx, rp.h.Model(), trim); err != nil && ctx.Err() == nil {
			log.Warn("replay: trim input log", "through", trim, "err", err)
		}
	}
	return nil
}

// --- recovery ---

// replayChain picks, from the log records read after a checkpoint of
// epoch ckEpoch that covers batches up to afterBatch and seqs up to
// afterSeq, the batches to re-execute, in order: for each next batch id
// the record of the highest epoch; it stops at a missing batch id, at a
// record of an epoch lower than one already taken (or than the
// checkpoint's: a deposed instance's history), or at a record whose first
// seq does not continue the numbering. why says where it stopped.
func replayChain(recs []*hamsv1.ReplayBatch, ckEpoch, afterBatch, afterSeq uint64) (chain []*hamsv1.ReplayBatch, why string) {
	best := map[uint64]*hamsv1.ReplayBatch{}
	for _, r := range recs {
		if b := best[r.GetBatchId()]; b == nil || r.GetEpoch() > b.GetEpoch() {
			best[r.GetBatchId()] = r
		}
	}
	ep, seq := ckEpoch, afterSeq
	for id := afterBatch + 1; ; id++ {
		r := best[id]
		switch {
		case r == nil:
			return chain, fmt.Sprintf("end of the log at batch %d", id)
		case r.GetEpoch() < ep:
			return chain, fmt.Sprintf("batch %d is of epoch %d, after epoch %d", id, r.GetEpoch(), ep)
		case r.GetFirstSeq() != seq+1 || len(r.GetRequests()) == 0:
			return chain, fmt.Sprintf("batch %d starts at seq %d with %d requests, want seq %d", id, r.GetFirstSeq(), len(r.GetRequests()), seq+1)
		}
		chain = append(chain, r)
		ep, seq = r.GetEpoch(), seq+uint64(len(r.GetRequests()))
	}
}

// replayStats describes one recovery.
type replayStats struct {
	ckptBatch, ckptSeq uint64
	batches, requests  int
	diverged           int // re-executed outputs that differ from the logged ones
	stop               string
	load, reexec       time.Duration
	// fromCheckpoint: the backend's state was written from a checkpoint
	// (a recovery that failed can start again from it); notRepeated: a
	// re-execution lost its answer and was not repeated (backendPolicy.once).
	fromCheckpoint, notRepeated bool
}

// replayRestarts bounds how often one promotion starts its recovery again
// from the checkpoint after a re-execution lost its answer.
const replayRestarts = 3

// recover loads the newest checkpoint into the backend and re-executes
// the logged batches after it; it returns the re-executed outputs (one
// item per request, in seq order) and the request keys the state covers.
// Caller: a transition (stage stopped).
func (rp *replayState) recover(ctx context.Context) ([]*hamsv1.Item, map[string][]uint64, replayStats, error) {
	log := rp.h.Logger()
	var st replayStats
	rp.records, rp.since = nil, 0
	start := time.Now()
	ck, state, err := rp.store.LoadCheckpoint(ctx, rp.h.Model())
	keys := map[string][]uint64{}
	var ckEpoch uint64
	switch {
	case errors.Is(err, coord.ErrNoCheckpoint):
		// The primary failed before its initial checkpoint: this spare's
		// own state is the initial one.
		rp.idx.reset()
		rp.x.renumber(0, 0)
		rp.batch = 0
		log.Warn("replay: no checkpoint; re-executing the whole log from this instance's state")
	case err != nil:
		return nil, nil, st, status.Errorf(codes.Unavailable, "load checkpoint: %v", err)
	default:
		err := rp.bp.retry(ctx, "write state", func() error { return rp.sbe.WriteState(ctx, state, ck.GetStateVersion()) })
		if err != nil {
			return nil, nil, st, status.Errorf(codes.Unavailable, "write checkpoint state of batch %d: %v", ck.GetBatchId(), err)
		}
		pairs := make([]lineage.PairState, len(ck.GetFlow()))
		for i, p := range ck.GetFlow() {
			pairs[i] = lineage.PairState{From: p.GetFromModel(), To: p.GetToModel(), Contig: p.GetContig(), Above: p.GetAbove()}
		}
		rp.idx.replayRestore(lineage.Import(pairs, ck.GetFlowMaxSeq()), ck.GetSeq())
		for _, d := range ck.GetDedup() {
			keys[d.GetFromModel()] = append(keys[d.GetFromModel()], d.GetKeys()...)
		}
		rp.x.renumber(ck.GetSeq(), 0)
		rp.batch, ckEpoch = ck.GetBatchId(), ck.GetEpoch()
		st.ckptBatch, st.ckptSeq = ck.GetBatchId(), ck.GetSeq()
		st.fromCheckpoint = true
		// Its records may not have been written (the primary failed
		// between storing and writing): write them (again, identical).
		if err := rp.writeRecords(ck.GetRecords(), ck.GetStateDigest()); err != nil {
			log.Error("replay: write durable records of the loaded checkpoint", "err", err)
		}
	}
	recs, err := rp.store.Batches(ctx, rp.h.Model(), rp.batch)
	if err != nil {
		return nil, nil, st, status.Errorf(codes.Unavailable, "read input log: %v", err)
	}
	st.load = time.Since(start)
	chain, why := replayChain(recs, ckEpoch, rp.batch, rp.x.seq())
	st.stop = why
	start = time.Now()
	var items []*hamsv1.Item
	for _, b := range chain {
		var resp *hamsv1.BatchResponse
		// Not repeated on a lost answer (backendPolicy.once): the recovery starts
		// again from the checkpoint (Promote).
		rp.x.noteReplayed(b)
		err := rp.bp.call()(ctx, "re-execute", func() (err error) {
			resp, err = rp.sbe.Infer(ctx, b.GetRequest())
			return err
		})
		if err != nil {
			st.notRepeated = errors.Is(err, errNotRepeated)
			return nil, nil, st, status.Errorf(codes.Unavailable, "re-execute batch %d: %v", b.GetBatchId(), err)
		}
		outs, err := splitOutputs(resp, len(b.GetRequests()))
		if err != nil {
			return nil, nil, st, status.Errorf(codes.Internal, "re-execute batch %d: %v", b.GetBatchId(), err)
		}
		parts := make([][]*hamsv1.Item, len(b.GetRequests()))
		for i, r := range b.GetRequests() {
			parts[i] = r.GetParts()
		}
		seqs, lins := rp.x.number(parts, outs)
		for i, r := range b.GetRequests() {
			out := lins[i][len(lins[i])-1].GetOutputDigest()
			if out != r.GetOutputDigest() {
				st.diverged++
			}
			rp.records = append(rp.records, &hamsv1.ReplayRecord{Seq: seqs[i], ReqId: r.GetReqId(), InputDigest: r.GetInputDigest(), OutputDigest: out})
			p0 := r.GetParts()[0]
			items = append(items, &hamsv1.Item{ReqId: r.GetReqId(), Service: p0.GetService(), StreamId: p0.GetStreamId(),
				Tensors: outs[i], Lineage: lins[i], DeadlineUnixNano: p0.GetDeadlineUnixNano(), Approximate: anyApproximate(r.GetParts())})
		}
		rp.batch = b.GetBatchId()
		st.batches++
		st.requests += len(b.GetRequests())
	}
	st.reexec = time.Since(start)
	// Received = covered now; the keys of the re-executed requests join
	// the checkpoint's.
	for from, ks := range rp.idx.cut(rp.x.seq()) {
		keys[from] = append(keys[from], ks...)
	}
	// The recovery checkpoint: the re-executed requests become durable
	// (and the next failure need not re-execute them again).
	rp.since = len(chain)
	var version uint64
	var ts []*hamsv1.Tensor
	err = rp.bp.retry(ctx, "read state", func() (err error) {
		ts, version, err = rp.sbe.ReadState(ctx)
		return err
	})
	if err != nil {
		return nil, nil, st, status.Errorf(codes.Unavailable, "read state after re-execution: %v", err)
	}
	rp.queueJob(ts, version)
	return items, keys, st, nil
}

// takeOver readies a spare (or a deposed primary) to be promoted: whatever
// an earlier role left queued belongs to an older history, and this
// instance never starts the model's history afresh. Caller: a transition
// (stage stopped).
func (rp *replayState) takeOver() {
	rp.mu.Lock()
	rp.logq, rp.jobs, rp.fresh, rp.reset = nil, nil, false, true
	clear(rp.acked)
	rp.mu.Unlock()
	rp.initial = false
}

// drop forgets what a demoted primary had queued for the log and the
// checkpointer (the new primary's history supersedes it) and returns how
// many items that was. Caller: a transition (stage stopped).
func (rp *replayState) drop() int {
	rp.mu.Lock()
	dropped := len(rp.logq) + len(rp.jobs)
	rp.logq, rp.jobs = nil, nil
	clear(rp.acked)
	rp.mu.Unlock()
	rp.records, rp.since = nil, 0
	return dropped
}

// replayAfter parses ReplayAfterMetadata.
func replayAfter(ctx context.Context) (map[string]uint64, error) {
	out := map[string]uint64{}
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return out, nil
	}
	for _, v := range md.Get(ReplayAfterMetadata) {
		for _, kv := range strings.Split(v, ",") {
			k, val, found := strings.Cut(strings.TrimSpace(kv), "=")
			if !found || k == "" {
				return nil, status.Errorf(codes.InvalidArgument, "Promote: metadata %s: %q is not successor=seq", ReplayAfterMetadata, kv)
			}
			n, err := strconv.ParseUint(val, 10, 64)
			if err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "Promote: metadata %s: %q: %v", ReplayAfterMetadata, kv, err)
			}
			out[k] = n
		}
	}
	return out, nil
}

// --- lineage index persistence ---

// replayExport is what a checkpoint keeps of the index: the flow of the
// requests the state covers and the keys of the last k of them.
func (x *lineageIndex) replayExport(k int) ([]*hamsv1.ReplayFlowPair, map[string]uint64, []*hamsv1.ReplayDedupKeys) {
	x.mu.Lock()
	f := x.exec.flow()
	recs := x.exec.recs[max(len(x.exec.recs)-k, 0):]
	byFrom := map[string][]uint64{}
	for _, r := range recs {
		for _, fk := range r.keys {
			byFrom[fk.from] = append(byFrom[fk.from], fk.key)
		}
	}
	x.mu.Unlock()
	pairs, mx := f.Export()
	out := make([]*hamsv1.ReplayFlowPair, len(pairs))
	for i, p := range pairs {
		out[i] = &hamsv1.ReplayFlowPair{FromModel: p.From, ToModel: p.To, Contig: p.Contig, Above: p.Above}
	}
	froms := make([]string, 0, len(byFrom))
	for f := range byFrom {
		froms = append(froms, f)
	}
	sort.Strings(froms)
	keys := make([]*hamsv1.ReplayDedupKeys, len(froms))
	for i, f := range froms {
		keys[i] = &hamsv1.ReplayDedupKeys{FromModel: f, Keys: byFrom[f]}
	}
	return out, mx, keys
}

// replayRestore makes the index cover exactly a loaded checkpoint: f up
// to lastSeq, nothing received beyond it.
func (x *lineageIndex) replayRestore(f *lineage.Flow, lastSeq uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.exec = &execLog{base: f, all: f.Clone()}
	x.recv = f.Clone()
	x.lastSeq = lastSeq
}

// replaySetup checks what replay mode needs of cfg and builds its state
// (nil when the model does not run in replay mode). Called by New.
func replaySetup(cfg Config, h Host, bp *backendPolicy, idx *lineageIndex, role config.Role) (*replayState, error) {
	if !replayEnabled(cfg) {
		return nil, nil
	}
	var errs []error
	sbe, ok := cfg.Backend.(StatefulBackend)
	if !ok {
		errs = append(errs, fmt.Errorf("%w: model %q runs in replay mode but its backend %T has no ReadState/WriteState", ErrConfig, cfg.Model, cfg.Backend))
	}
	if cfg.Replay == nil {
		errs = append(errs, fmt.Errorf("%w: model %q runs in replay mode and needs a ReplayStore", ErrConfig, cfg.Model))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	// The initial primary starts the model's history afresh; a spare
	// takes over an existing one.
	return newReplayState(h, bp, idx, cfg.Deployment.Replay, cfg.Replay, sbe, role == config.RolePrimary), nil
}
