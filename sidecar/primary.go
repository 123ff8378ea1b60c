package sidecar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hams-go/hams/internal/run"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protocol"
	"github.com/hams-go/hams/protocol/nspb"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/sidecar/datapath"
)

// Retries of a failed Update or ReadState before the primary gives up (the
// sidecar then stops, fail-stop, and the manager fails it over).
const (
	stateOpAttempts = 5
	stateOpBackoff  = 10 * time.Millisecond
)

// maxUnacked bounds the snapshots copied but not yet acknowledged by the
// backup: beyond it no new batch starts (shipping slower than computing
// would otherwise grow the queue, and memory, without bound).
const maxUnacked = 8

// maxWaiting bounds the snapshots queued behind the one being shipped
// (with capture at compute, one per batch; they coalesce when the shipper
// takes them): beyond it no new batch starts.
const maxWaiting = 256

// foldIdle is how long a folded install waits for a compute to carry it
// before it is issued on its own.
const foldIdle = time.Millisecond

// maxUnapplied bounds the snapshots kept because the backup has not
// applied them yet (it waits for its PFMs' durability): each one may
// become the rollback target, so none can be dropped; beyond it no new
// batch starts.
const maxUnapplied = 64

type eventKind int

const (
	evComputed eventKind = iota
	evUpdated
	evInstalled // the Update of a folded install no compute carried out
	evPinned    // the copy captured the state; its data is still arriving
	evCopied
)

// opDone reports the end of a backend operation the driver started.
type opDone struct {
	kind    eventKind
	batch   uint64
	reqs    []request
	resp    *hamsv1.BatchResponse
	outs    [][]*hamsv1.Tensor
	state   []*hamsv1.Tensor
	version uint64
	pinned  bool // evCopied: an evPinned preceded it
	attempt int
	dur     time.Duration
	err     error
	tr      *batchTrace // evComputed: the batch's spans (tracing.go)
	// install: evComputed: the batch whose Update the compute carried
	// (install_batch_id); 0 none.
	install uint64
}

// computedBatch is a batch between its compute and the moment both its
// release and its snapshot are done.
type computedBatch struct {
	id       uint64
	items    []*hamsv1.Item // one output item per request, before fan-out
	records  []*hamsv1.RequestRecord
	outputs  []*hamsv1.Tensor
	rows     []uint32
	released bool
	copied   bool
	// capture: the state the compute staged, and its version.
	delta   []*hamsv1.StateRange
	version uint64
	tr      *batchTrace // nil: untraced (tracing.go)
}

// snapshot is <requests with lineage, state tensors, outputs> after one
// or more batches (paper IV-D), as shipped to the backup.
type snapshot struct {
	// batch is the snapshot's id (the header's batch_id), dense per
	// primary numbering; set when the shipper takes it (taken).
	batch uint64
	taken bool
	// last is the primary's batch the state is after; batches how many
	// batches' requests the snapshot covers.
	last    uint64
	batches int
	seq     uint64 // highest request seq the state covers
	header  *hamsv1.SnapshotHeader
	// state is the full state (tensors of header.StateTensors); a delta
	// snapshot (header.Delta) has delta instead: the ranges that changed
	// since the previous snapshot's state.
	state    []*hamsv1.Tensor
	delta    []*hamsv1.StateRange
	digest   string // on the wire: XXH64 of the state bytes (a delta's: of its data); set by the shipper
	copiedAt time.Time
	// links: the sidecar.batch spans of the traced requests it covers.
	links []trace.Link
}

// isDelta reports whether sn carries ranges, not the full state.
func (sn *snapshot) isDelta() bool { return sn.header.GetDelta() }

// primaryState is the role of a replicated stateful model's primary: what
// outlives one run of its stage (a role transition stops and restarts
// it). Its stage runs executor (the driver below, on the executor
// goroutine) and workers (the shipper and its watches). It depends on the
// sidecar only through Host, the shared executor and the request path.
//
// Invariants: baseBatch, baseSeq and recoveredEpoch change only in a role
// transition (promotion, rollback), while no stage runs; stateSpecs and
// stateBytes belong to the driver (or a transition); versionSeen only
// grows between bases.
type primaryState struct {
	h    Host
	x    *executor
	path requestPath
	bp   *backendPolicy
	mode nspb.Mode
	ship *shipper
	// baseBatch and baseSeq: where the pipeline and numbering start
	// (after the state it took over or rolled back to).
	baseBatch, baseSeq uint64
	// recoveredEpoch is the epoch of the last promotion or rollback
	// (batch ids and seqs were renumbered then).
	recoveredEpoch atomic.Uint64
	// stateSpecs, stateBytes: the layout of the model state, from the
	// last full state seen (headers of delta snapshots carry it).
	stateSpecs []*hamsv1.TensorSpec
	stateBytes uint64
	// versionSeen is the highest state version the model server holds to
	// this primary's knowledge: the version of the last base state
	// (baseSnapshot) or of a computed batch. Versions only grow between
	// bases, so a computed batch at or below it means the server lost its
	// state (restarted under this sidecar). 0: unknown.
	versionSeen atomic.Uint64
}

func newPrimaryState(h Host, x *executor, path requestPath, bp *backendPolicy, mode nspb.Mode) *primaryState {
	return &primaryState{h: h, x: x, path: path, bp: bp, mode: mode, ship: newShipper(h)}
}

// workers are the primary stage's goroutines besides its executor: the
// shipper, the backup watch (backupwatch.go) and the watch of its own
// durability notices.
func (ps *primaryState) workers() []namedRun {
	ws := []namedRun{{"shipper", ps.ship.run}}
	if watch := ps.ship.backupWatch(); watch != nil {
		ws = append(ws, namedRun{"backup watch", watch})
	}
	return append(ws, namedRun{"own durability watch", func(ctx context.Context) error {
		return ps.ship.watchOwnDurable(ctx, ps.recoveredEpoch.Load)
	}})
}

// primary drives a replicated stateful model's batches through an
// nspb.Pipeline. It runs on the executor goroutine; backend operations run
// on their own goroutines and report on events.
//
// Invariants: at most one Compute runs, and it starts only when the
// pipeline allows it (so compute n+1 never starts before update n, nor
// during copy n in stop-to-copy modes); Update n+1 is issued only after
// copy n finished; every computed batch's outputs are released exactly
// once, in batch order, when the pipeline says so; a batch failing Compute
// consumes no batch id and leaves the state untouched.
type primary struct {
	ps      *primaryState
	pipe    *nspb.Pipeline
	events  chan opDone
	ops     sync.WaitGroup
	batches map[uint64]*computedBatch
	queue   [][]request // validated batches waiting for the pipeline
	busy    bool        // a Compute is running
	blocked bool        // holding batches because the output log is full
	// covered is the last batch whose requests are in a snapshot handed
	// to the shipper; streaming: a pinned copy's data is still arriving.
	covered   uint64
	streaming bool
	// onDemand: copies only when the shipper can take one (non-stop
	// modes); pinEarly: the backend reports the capture of a copy;
	// capture: compute returns the staged state (delta snapshots, no
	// copies at all).
	onDemand, pinEarly, capture bool
	// fold: the backend installs a staged batch at the start of the next
	// compute (install_batch_id); pendingInstall is the batch whose
	// Update was folded into the next compute and not yet carried out;
	// installing: its Update runs on its own because no batch came
	// within foldIdle (no compute starts meanwhile: the two would race
	// at the model server).
	fold           bool
	pendingInstall uint64
	installing     bool
	copyFails      int
	// computedAt: when each batch's compute ended (update-wait metric).
	computedAt map[uint64]time.Time
}

// executor is the primary stage's executor goroutine: it drives batches
// through a new pipeline starting at baseBatch until ctx ends.
func (ps *primaryState) executor(ctx context.Context, work <-chan []*datapath.Joined, idle chan<- struct{}) error {
	if !ps.x.describe(ctx) {
		return nil
	}
	p := &primary{ps: ps, pipe: nspb.NewPipeline(ps.mode, ps.baseBatch), events: make(chan opDone, 8), batches: map[uint64]*computedBatch{},
		covered: ps.baseBatch, computedAt: map[uint64]time.Time{}}
	desc := ps.x.description()
	p.capture = desc.GetStateDelta() && p.pipe.CaptureAtCompute()
	p.fold = p.capture && desc.GetComputeInstalls()
	if ps.ship.Applied() == nil {
		// The rollback target before the backup applied anything: the
		// state this primary starts from.
		ts, v, err := ps.h.StateBackend().ReadState(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read initial state: %w", err)
		}
		base := ps.baseSnapshot(ts, v, nil)
		if p.capture {
			// Deltas need a base at the backup: the initial state goes
			// first, as snapshot 1 (snapshot ids are the shipper's, not
			// batch numbers; 0 is no snapshot).
			base.batch = max(base.batch, 1)
			base.header.BatchId = base.batch
		}
		ps.ship.reset(base, p.capture)
	}
	if !p.capture {
		p.onDemand = p.pipe.CopyOnDemand()
	}
	_, p.pinEarly = ps.h.StateBackend().(PinnedStateReader)
	p.pinEarly = p.pinEarly && p.onDemand
	defer p.ops.Wait()
	idleSent := false
	var installT *time.Timer
	defer func() {
		if installT != nil {
			installT.Stop()
		}
	}()
	for {
		full, space := ps.h.OutputLog().Full()
		if full != p.blocked {
			p.blocked = full
			if full {
				ps.h.Metrics().outlogBlocked.Inc()
				ps.h.Logger().Info("output log full, holding new batches until completions free space")
			} else {
				ps.h.Logger().Info("output log has space again")
			}
		}
		canStart := !p.busy && !p.installing && p.gatesOpen() && p.pipe.CanCompute()
		if canStart && len(p.queue) > 0 {
			reqs := p.queue[0]
			p.queue = p.queue[1:]
			p.startCompute(ctx, reqs)
			continue
		}
		var idleC chan<- struct{}
		if canStart && !idleSent {
			idleC = idle
		}
		var spaceC <-chan struct{}
		if full {
			spaceC = space
		}
		// On demand, ask for a copy whenever the shipper has nothing
		// waiting: the next snapshot is then as fresh as it can be.
		if p.onDemand && !p.streaming && !p.pipe.Copying() && !p.pipe.CopyRequested() && ps.ship.Waiting() == 0 {
			if err := p.step(ctx, nspb.CopyWanted{}); err != nil {
				return err
			}
		}
		// A folded install that no batch carries soon is issued on its
		// own: at quiescence the model server holds the last state.
		var installC <-chan time.Time
		if p.pendingInstall != 0 && !p.busy && !p.installing && len(p.queue) == 0 {
			if installT == nil {
				installT = time.NewTimer(foldIdle)
			}
			installC = installT.C
		} else if installT != nil {
			installT.Stop()
			installT = nil
		}
		select {
		case <-installC:
			installT = nil
			p.install(ctx, p.pendingInstall)
		case idleC <- struct{}{}:
			idleSent = true
		case b := <-work:
			idleSent = false
			if reqs := ps.x.prepare(b); len(reqs) > 0 {
				p.queue = append(p.queue, reqs)
			}
		case ev := <-p.events:
			if err := p.handle(ctx, ev); err != nil {
				return err
			}
		case n := <-ps.ship.acks:
			if err := p.step(ctx, nspb.Acked{Batch: n}); err != nil {
				return err
			}
		case <-ps.ship.appliedC:
		case <-ps.ship.tookC:
		case <-spaceC:
		case <-ctx.Done():
			return nil
		}
	}
}

// spawn runs f on its own goroutine and delivers its report.
func (p *primary) spawn(ctx context.Context, f func() opDone) {
	p.ops.Add(1)
	go func() {
		defer p.ops.Done()
		ev := f()
		select {
		case p.events <- ev:
		case <-ctx.Done():
		}
	}()
}

func (p *primary) startCompute(ctx context.Context, reqs []request) {
	p.busy = true
	computed, _, _, _, _ := p.pipe.Progress()
	id := computed + 1
	ps := p.ps
	// Read on the driver goroutine, which alone writes them.
	stage, install := p.capture, p.pendingInstall
	bt := traceBatch(ps.h, reqs, id) // nil when tracing is off
	p.spawn(ctx, func() opDone {
		ev := opDone{kind: evComputed, batch: id, reqs: reqs, tr: bt, install: install}
		cctx := bt.callCtx(ctx)
		req, err := ps.x.batchRequest(reqs, id)
		if err != nil {
			ev.err = err
			return ev
		}
		req.StageDelta = stage
		req.InstallBatchId = install
		// Compute leaves the installed state untouched but for the folded
		// install of batch install, which is idempotent (installing the
		// batch installed last is a no-op: models.core.updateLocked), so a
		// compute that found the backend unreachable is retried
		// (backendPolicy.retry) even when its first attempt took effect.
		var resp *hamsv1.BatchResponse
		err = ps.bp.retry(ctx, "compute", func() (err error) {
			start := time.Now()
			resp, err = ps.h.StateBackend().Compute(cctx, req)
			ev.dur = time.Since(start)
			ps.h.Metrics().backend.Observe(ev.dur.Seconds())
			ps.h.Metrics().batches.Inc()
			ps.h.Metrics().batchSize.Observe(float64(len(reqs)))
			return err
		})
		if err == nil && stage && !resp.GetHasStateDelta() {
			err = fmt.Errorf("compute of batch %d: the backend advertises state deltas but returned none", id)
		}
		if err == nil {
			ev.resp = resp
			ev.outs, err = splitOutputs(resp, len(reqs))
		}
		bt.callDone(err)
		if err == nil {
			bt.stamp(reqs)
		}
		ev.err = err
		return ev
	})
}

func (p *primary) handle(ctx context.Context, ev opDone) error {
	ps := p.ps
	switch ev.kind {
	case evComputed:
		p.busy = false
		if ev.err != nil {
			ev.tr.end(ev.err)
			return p.computeFailed(ctx, ev)
		}
		if v, seen := ev.resp.GetNextStateVersion(), ps.versionSeen.Load(); v != 0 && seen != 0 && v <= seen {
			// The server computed from a state older than one it already
			// held: it was restarted under this sidecar (a restart no
			// Update noticed) and these outputs come from its initial
			// state. The instance's state is lost: stop, failing nothing
			// (the outputs are never durable; the promoted backup runs
			// the requests after the resend).
			err := fmt.Errorf("%w: compute of batch %d: the model server's next state version %d is not above %d, which it held before (restarted under this sidecar?)", errBackendLost, ev.batch, v, seen)
			ev.tr.end(err)
			return err
		} else if v > seen {
			ps.versionSeen.Store(v)
		}
		if err := p.step(ctx, nspb.ComputeStarted{Batch: ev.batch}); err != nil {
			return err
		}
		p.pendingInstall = 0 // carried out by this compute
		p.batches[ev.batch] = p.record(ev)
		p.computedAt[ev.batch] = time.Now()
		return p.step(ctx, nspb.Computed{Batch: ev.batch})
	case evInstalled:
		p.installing = false
		ps.h.Metrics().update.Observe(ev.dur.Seconds())
		if err := lostStagedState(ctx, ev.err, "install of batch %d", ev.batch); err != nil {
			return err
		}
		if ev.err != nil {
			return fmt.Errorf("install batch %d: %w", ev.batch, ev.err)
		}
		if p.pendingInstall == ev.batch {
			p.pendingInstall = 0
		}
	case evUpdated:
		ps.h.Metrics().update.Observe(ev.dur.Seconds())
		if err := lostStagedState(ctx, ev.err, "update of batch %d", ev.batch); err != nil {
			return err
		}
		if ev.err != nil {
			if ev.attempt+1 >= stateOpAttempts || ctx.Err() != nil {
				return fmt.Errorf("update batch %d: %w", ev.batch, ev.err)
			}
			ps.h.Logger().Warn("update failed, retrying", "batch", ev.batch, "attempt", ev.attempt+1, "err", ev.err)
			p.update(ctx, ev.batch, ev.attempt+1)
			return nil
		}
		return p.step(ctx, nspb.Updated{Batch: ev.batch})
	case evPinned:
		p.streaming = true
		ps.h.Metrics().copyPin.Observe(ev.dur.Seconds())
		return p.copied(ctx, ev.batch)
	case evCopied:
		if ev.err != nil {
			if ev.pinned {
				// The captured state is gone (later updates may have
				// run): the batches it covered wait for a new copy.
				p.streaming = false
				p.copyFails++
				if p.copyFails >= stateOpAttempts || ctx.Err() != nil {
					return fmt.Errorf("copy state after batch %d: %w", ev.batch, ev.err)
				}
				ps.h.Logger().Warn("state copy failed after capture, copying again", "batch", ev.batch, "attempt", p.copyFails, "err", ev.err)
				return p.step(ctx, nspb.CopyLost{Batch: ev.batch})
			}
			if ev.attempt+1 >= stateOpAttempts || ctx.Err() != nil {
				return fmt.Errorf("copy state after batch %d: %w", ev.batch, ev.err)
			}
			ps.h.Logger().Warn("state copy failed, retrying", "batch", ev.batch, "attempt", ev.attempt+1, "err", ev.err)
			p.copyState(ctx, ev.batch, ev.attempt+1)
			return nil
		}
		p.copyFails = 0
		ps.h.Metrics().snapCopy.Observe(ev.dur.Seconds())
		p.streaming = false
		sn := p.snapshotOf(ev.batch, ev.state, ev.version)
		if !ev.pinned {
			if err := p.copied(ctx, ev.batch); err != nil {
				return err
			}
		}
		ps.ship.enqueue(sn)
	}
	return nil
}

// copied tells the pipeline that the copy of the state after batch n is
// captured (Ship is carried out when its data is complete).
func (p *primary) copied(ctx context.Context, n uint64) error {
	return p.step(ctx, nspb.Copied{Batch: n})
}

// step feeds one event to the pipeline (its one entry for events, as
// protocol.Machine) and performs the actions it returns, in order. An
// event the pipeline refuses (out of order) is a driver bug: the stage
// stops with the error (and the instance is failed over), nothing is
// performed.
func (p *primary) step(ctx context.Context, ev protocol.Event) error {
	acts, err := p.pipe.Step(ev)
	if err != nil {
		p.ps.h.Logger().Error("nspb pipeline refused an event", "event", fmt.Sprint(ev), "err", err)
		return fmt.Errorf("nspb pipeline: %w", err)
	}
	return p.do(ctx, acts)
}

// snapshotOf builds the snapshot of the state after batch last (a copy
// of it, or, with state nil, the header of a delta snapshot, specs and
// size from the base state): it covers every batch since the previous
// snapshot.
func (p *primary) snapshotOf(last uint64, state []*hamsv1.Tensor, version uint64) *snapshot {
	ps := p.ps
	var bytes uint64
	var specs []*hamsv1.TensorSpec
	if state != nil {
		specs = specsOf(state)
		for _, t := range state {
			bytes += uint64(len(t.GetData()))
		}
		ps.stateSpecs, ps.stateBytes = specs, bytes
	} else {
		specs, bytes = ps.stateSpecs, ps.stateBytes
	}
	ps.h.Metrics().stateBytes.Set(float64(bytes))
	var (
		records []*hamsv1.RequestRecord
		rows    []uint32
		parts   [][]*hamsv1.Tensor
		maxSeq  uint64
		n       int
		links   []trace.Link
	)
	for id := p.covered + 1; id <= last; id++ {
		b := p.batches[id]
		if b == nil {
			continue // a failed compute consumed no id; never here
		}
		records = append(records, b.records...)
		rows = append(rows, b.rows...)
		parts = append(parts, b.outputs)
		links = append(links, b.tr.links()...)
		for _, r := range b.records {
			maxSeq = max(maxSeq, r.GetSeq())
		}
		b.copied = true
		p.forget(b)
		n++
	}
	p.covered = last
	var outputs []*hamsv1.Tensor
	if len(parts) > 0 {
		var err error
		if outputs, err = concatOutputs(parts); err != nil {
			ps.h.Logger().Warn("outputs of coalesced batches do not concatenate; the backup keeps none of them", "batch", last, "err", err)
			outputs, rows = nil, nil
		}
	}
	return &snapshot{last: last, batches: n, seq: maxSeq, state: state, copiedAt: time.Now(), links: links, header: &hamsv1.SnapshotHeader{
		Model: ps.h.Model(), Epoch: ps.h.Epoch(), StateVersion: version,
		Requests: records, StateTensors: specs, StateBytes: bytes, Outputs: outputs, OutputRows: rows,
	}}
}

// gatesOpen: no bound holds new batches back (output log, unacknowledged,
// unapplied and waiting snapshots).
func (p *primary) gatesOpen() bool {
	full, _ := p.ps.h.OutputLog().Full()
	_, unacked := p.ps.ship.Kept()
	return !full && unacked < maxUnacked && p.ps.ship.Unapplied() < maxUnapplied && p.ps.ship.Waiting() < maxWaiting
}

// lostStagedState returns errBackendLost when err is the model server's
// FailedPrecondition to an update of state it staged (an Update, an
// install on its own, or one folded into a compute): the server no longer
// holds that state, it was restarted under this sidecar (or another writer
// changed it). The instance's state is lost, so the instance is: the
// primary stops without failing a request (the promoted backup runs them
// after the resend); retrying cannot bring the state back. Otherwise nil.
func lostStagedState(ctx context.Context, err error, what string, args ...any) error {
	if err == nil || ctx.Err() != nil || status.Code(err) != codes.FailedPrecondition {
		return nil
	}
	return fmt.Errorf("%w: %s: the model server lost the state it staged (restarted under this sidecar?): %w", errBackendLost, fmt.Sprintf(what, args...), err)
}

// computeFailed fails the batch's requests, or re-queues them one by one
// when the backend rejected the batch as invalid, so only the bad request
// fails. No state was staged, so the batch id is reused. A lost backend
// (errBackendLost) fails nothing: the sidecar stops and the backup, once
// promoted, executes the requests after the predecessors' resend.
func (p *primary) computeFailed(ctx context.Context, ev opDone) error {
	ps := p.ps
	if ctx.Err() != nil {
		return nil // stopping: the requests come again by resend
	}
	if errors.Is(ev.err, errBackendLost) {
		return ev.err
	}
	if ev.install != 0 {
		if err := lostStagedState(ctx, ev.err, "compute of batch %d carrying the update of batch %d", ev.batch, ev.install); err != nil {
			return err
		}
	}
	code := status.Code(ev.err)
	if code == codes.InvalidArgument && len(ev.reqs) > 1 {
		ps.h.Logger().Debug("batch rejected as invalid, re-running requests one by one", "size", len(ev.reqs), "err", ev.err)
		singles := make([][]request, len(ev.reqs))
		for i := range ev.reqs {
			singles[i] = ev.reqs[i : i+1]
		}
		p.queue = append(singles, p.queue...)
		return nil
	}
	if ctx.Err() != nil && code != codes.InvalidArgument {
		code = codes.Unavailable
	}
	msg := ev.err.Error()
	if st, ok := status.FromError(ev.err); ok {
		msg = st.Message()
	}
	for _, r := range ev.reqs {
		ps.path.fail(r.j, code, msg)
	}
	return nil
}

// install issues the Update of a folded install on its own.
func (p *primary) install(ctx context.Context, n uint64) {
	ps := p.ps
	p.installing = true
	p.spawn(ctx, func() opDone {
		start := time.Now()
		err := ps.bp.retry(ctx, "update", func() error { return ps.h.StateBackend().Update(ctx, n) })
		return opDone{kind: evInstalled, batch: n, dur: time.Since(start), err: err}
	})
}

// record assigns seqs and lineage to a computed batch (in batch order) and
// prepares its output items and request records.
func (p *primary) record(ev opDone) *computedBatch {
	ps := p.ps
	start := time.Now()
	parts := make([][]*hamsv1.Item, len(ev.reqs))
	for i, r := range ev.reqs {
		parts[i] = r.j.Parts
	}
	seqs, lineages := ps.x.record(parts, ev.outs)
	b := &computedBatch{id: ev.batch, outputs: ev.resp.GetOutputs(), rows: ev.resp.GetRows(),
		items: make([]*hamsv1.Item, len(ev.reqs)), records: make([]*hamsv1.RequestRecord, len(ev.reqs)),
		delta: ev.resp.GetStateDelta(), version: ev.resp.GetNextStateVersion(), tr: ev.tr}
	ev.tr.seqs(seqs)
	for i, r := range ev.reqs {
		p0 := r.j.Parts[0]
		lin := lineages[i]
		approx := r.approximate || anyApproximate(r.j.Parts)
		b.items[i] = &hamsv1.Item{
			ReqId: r.j.ReqID, Service: p0.GetService(), StreamId: p0.GetStreamId(),
			Tensors: ev.outs[i], Lineage: lin, DeadlineUnixNano: r.j.Deadline, Approximate: approx, TraceContext: r.trace,
		}
		b.records[i] = &hamsv1.RequestRecord{
			ReqId: r.j.ReqID, Seq: seqs[i], StreamId: p0.GetStreamId(), Lineage: lin,
			InputDigest: tensor.Digest(r.inputs...), OutputDigest: lin[len(lin)-1].GetOutputDigest(), Approximate: approx,
		}
	}
	ps.h.Metrics().lineage.Observe(time.Since(start).Seconds())
	ps.h.Metrics().requests.Add(float64(len(ev.reqs)))
	return b
}

// do performs pipeline actions in order. Ship is handled where the
// snapshot is built (Copied).
func (p *primary) do(ctx context.Context, acts []nspb.Action) error {
	for _, a := range acts {
		switch a := a.(type) {
		case nspb.Release:
			p.release(a.Batch)
		case nspb.Update:
			if p.fold {
				// The next compute installs this batch's state first, at
				// the model server, and computes on it: update n before
				// compute n+1 without a round trip of its own. Nothing
				// reads the installed state before (snapshots come from
				// computes), and the pipeline may go on at once.
				p.pendingInstall = a.Batch
				ps := p.ps
				if t, ok := p.computedAt[a.Batch]; ok {
					ps.h.Metrics().updateWait.Observe(time.Since(t).Seconds())
					delete(p.computedAt, a.Batch)
				}
				if err := p.step(ctx, nspb.Updated{Batch: a.Batch}); err != nil {
					return err
				}
				continue
			}
			p.update(ctx, a.Batch, 0)
		case nspb.Copy:
			p.copyState(ctx, a.Batch, 0)
		case nspb.Ship:
			if p.capture {
				p.shipCaptured(a.Batch)
			}
		}
	}
	return nil
}

// shipCaptured hands the delta snapshot of batch n (its compute's staged
// state) to the shipper.
func (p *primary) shipCaptured(n uint64) {
	b := p.batches[n]
	if b == nil {
		p.ps.h.Logger().Error("ship of an unknown batch", "batch", n)
		return
	}
	sn := p.snapshotOf(n, nil, b.version)
	sn.delta = b.delta
	sn.header.Delta, sn.header.DeltaBytes = true, rangeBytes(b.delta)
	b.delta = nil
	p.ps.h.Metrics().deltaBytes.Observe(float64(sn.header.DeltaBytes))
	p.ps.ship.enqueue(sn)
}

func (p *primary) release(n uint64) {
	ps := p.ps
	b := p.batches[n]
	if b == nil {
		ps.h.Logger().Error("release of an unknown batch", "batch", n)
		return
	}
	for _, it := range b.items {
		ps.h.OutputLog().Add(it.ReqId, ps.path.fanOutKeep(it))
	}
	b.released = true
	b.items = nil
	b.tr.end(nil)
	_, items, bytes := ps.h.OutputLog().Stats()
	ps.h.Metrics().outlogItems.Set(float64(items))
	ps.h.Metrics().outlogBytes.Set(float64(bytes))
	p.forget(b)
}

// forget drops a batch once it is both released and in a snapshot.
func (p *primary) forget(b *computedBatch) {
	if b.released && b.copied {
		delete(p.batches, b.id)
	}
}

func (p *primary) update(ctx context.Context, n uint64, attempt int) {
	ps := p.ps
	if t, ok := p.computedAt[n]; ok {
		ps.h.Metrics().updateWait.Observe(time.Since(t).Seconds())
		delete(p.computedAt, n)
	}
	p.spawn(ctx, func() opDone {
		if attempt > 0 && !run.Sleep(ctx, stateOpBackoff<<attempt) {
			return opDone{kind: evUpdated, batch: n, attempt: attempt, err: ctx.Err()}
		}
		start := time.Now()
		err := ps.h.StateBackend().Update(ctx, n)
		return opDone{kind: evUpdated, batch: n, attempt: attempt, dur: time.Since(start), err: err}
	})
}

func (p *primary) copyState(ctx context.Context, n uint64, attempt int) {
	ps := p.ps
	p.spawn(ctx, func() opDone {
		if attempt > 0 && !run.Sleep(ctx, stateOpBackoff<<attempt) {
			return opDone{kind: evCopied, batch: n, attempt: attempt, err: ctx.Err()}
		}
		start := time.Now()
		if pr, ok := ps.h.StateBackend().(PinnedStateReader); ok && p.pinEarly {
			pinned := false
			ts, v, _, err := pr.ReadStatePinned(ctx, func() {
				pinned = true
				select {
				case p.events <- opDone{kind: evPinned, batch: n, dur: time.Since(start)}:
				case <-ctx.Done():
				}
			})
			return opDone{kind: evCopied, batch: n, attempt: attempt, state: ts, version: v, pinned: pinned, dur: time.Since(start), err: err}
		}
		ts, v, err := ps.h.StateBackend().ReadState(ctx)
		return opDone{kind: evCopied, batch: n, attempt: attempt, state: ts, version: v, dur: time.Since(start), err: err}
	})
}

// baseSnapshot is the snapshot of a state this primary starts from
// (initial state, a promoted backup's last applied state, a rollback
// target): batch baseBatch, covering reqs.
func (ps *primaryState) baseSnapshot(state []*hamsv1.Tensor, version uint64, reqs []*hamsv1.RequestRecord) *snapshot {
	var bytes uint64
	specs := specsOf(state)
	for _, t := range state {
		bytes += uint64(len(t.GetData()))
	}
	ps.stateSpecs, ps.stateBytes = specs, bytes
	ps.versionSeen.Store(version)
	return &snapshot{batch: ps.baseBatch, taken: true, last: ps.baseBatch, seq: ps.baseSeq, state: state, copiedAt: time.Now(), header: &hamsv1.SnapshotHeader{
		Model: ps.h.Model(), Epoch: ps.h.Epoch(), BatchId: ps.baseBatch, StateVersion: version,
		Requests: reqs, StateTensors: specs, StateBytes: bytes,
	}}
}
