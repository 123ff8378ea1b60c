package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/bigmem"
	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/run"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/tracing"
	"github.com/hams-go/hams/protocol"
	"github.com/hams-go/hams/protocol/nspb"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// maxSnapshotBytes bounds the state a backup accepts in one snapshot
// when its model server does not describe its state's size.
const maxSnapshotBytes = 1 << 34

const (
	// maxReceiving bounds the snapshots a backup receives at once (on
	// both transports): a primary ships one at a time; the rest covers a
	// deposed primary's last shipment and a retry overlapping the
	// attempt it replaces.
	maxReceiving = 4
	// maxDeltaStates bounds a delta's announced bytes in states: ranges
	// of one batch do not overlap, and merged ones dedupe their repeats.
	maxDeltaStates = 4
	// describeForLimit bounds the Describe that learns the state's size
	// when a snapshot arrives before warmUp learnt it.
	describeForLimit = time.Second
)

// errNeedBase is in the FailedPrecondition a backup answers to a delta
// snapshot it has no base state for; the primary then ships a full one.
const errNeedBase = "needs a full base state first"

// received is a snapshot buffered by the backup until it is applied:
// the full state (data: it becomes cur when installed, and later deltas
// may patch it in place) or, for a delta snapshot, the ranges to patch
// into the previous one's state.
type received struct {
	header *hamsv1.SnapshotHeader
	data   []byte
	delta  []*hamsv1.StateRange
	// digest: a full state's SHA-256 (the audit contract's) when the
	// backup computed it ("" otherwise); a delta's wire digest.
	digest string
	// hash: the full state's running hash, kept as the backup's cur
	// hash when installed (stateHash).
	hash *stateHash
	at   time.Time
	// trace: the ShipSnapshot call that brought it (tracing.go; invalid
	// when untraced).
	trace trace.SpanContext
}

// backupState is a backup sidecar's state manager: it buffers snapshots
// from the primary, feeds nspb.Backup (Algorithm 2) with them and with its
// PFMs' durability notices, and performs the resulting actions in order:
// Apply = install the state in the sidecar's copy (cur) + keep the outputs
// + audit records, Announce = Coord.Announce. A writer writes the applied
// state to the backup's model server behind the applies (write-behind:
// only the newest state matters, so writes coalesce; with a model server
// that takes partial writes, only the ranges that changed).
//
// Durability is the state held on the backup's host: the sidecar's copy
// and its model server fail together (one host; the supervisor kills the
// survivor of a pair), so a state is as durable in the copy as in the
// model server, and the write to the model server stays off the path
// replies wait on. A promotion first writes whatever the model server
// lacks (flush), so the new primary computes on the durable state.
//
// Invariants (under mu): snaps holds exactly the snapshots alg has pending
// (received, not yet applied); acts holds the actions alg returned that
// the applier has not performed yet, in the order returned. doneBatch and
// doneSeq advance only after the applier installed a state in cur and
// wrote its audit records. cur is the state after doneBatch (specs
// curSpecs, version curVersion); while the running write streams cur
// whole (inFull aliases it), a delta patches a copy of cur instead, and a
// pending whole write (wFull) follows cur's patches. warm holds
// prefaulted state-sized buffers for the first base and its first copy.
// The model server holds version written plus the pending write (wFull,
// then wRanges, up to wVersion) and the one the writer is running
// (inFull, inRanges, up to inVersion).
type backupState struct {
	// h is the sidecar as the backup sees it: nothing else of it.
	h Host

	mu        sync.Mutex
	alg       *nspb.Backup
	snaps     map[uint64]*received
	acts      []nspb.Action
	applying  map[uint64]*received // taken out of snaps with their Apply
	doneBatch uint64
	doneSeq   uint64
	// maxRecvSeq is the highest request seq of any snapshot buffered.
	maxRecvSeq uint64
	wake       chan struct{}
	// epoch: snapshots of an older epoch are refused. synced: a snapshot
	// was taken as the base (the first one received, or the first of a
	// newer epoch: a new primary's full state); syncEpoch its epoch.
	epoch     uint64
	synced    bool
	syncEpoch uint64
	// last is the last snapshot applied (a promotion starts from it).
	last *received
	// durable holds the last PFM notices seen (replayed into a new alg).
	pfmDurable map[string]uint64

	cur        []byte
	curSpecs   []*hamsv1.TensorSpec
	curVersion uint64
	// warm: buffers of the state's size whose pages are mapped already
	// (warmUp), taken by the base received and the first copy of cur.
	warm [][]byte
	// baseAt, baseBatch: when the last base (a full state) was installed,
	// and its batch (the writer holds back its whole write, holdLocked).
	baseAt    time.Time
	baseBatch uint64
	// curDigest: the SHA-256 of cur when it is a received full state not
	// patched since ("" otherwise); a whole-state write passes it on.
	curDigest string
	// curHash hashes cur for the audit's state digests, resuming at the
	// lowest change of each delta (only the apply goroutine uses it).
	curHash *stateHash
	// Write-behind to the model server.
	written           uint64
	wFull, inFull     []byte
	wRanges, inRanges []*hamsv1.StateRange
	wVersion          uint64
	inVersion         uint64
	wDirty, inBusy    bool
	// inFailed: an attempt of the running write failed (it may have
	// landed all the same).
	inFailed  bool
	writeWake chan struct{}
	// rangesAt: when the writer last started a range write (it spaces
	// them, spacingLocked).
	rangesAt time.Time
	// knownBytes is the state's size as the model server describes it (0
	// until known, guarded by mu): the most a snapshot may announce.
	knownBytes uint64
	// knownAsked: when stateLimit last asked the model server (at most
	// once per describeForLimit).
	knownAsked time.Time
	// receiving holds a token per snapshot being received.
	receiving chan struct{}
	// live publishes durability notices without waiting for JetStream,
	// and persist stores them (run owns its goroutine); both nil when the
	// Coord cannot (a test's), and the notice is announced and awaited.
	live    LiveAnnouncer
	persist *coord.NoticePersister
}

// LiveAnnouncer is an optional Coord extension (*coord.Coord has it):
// AnnounceLive hands a notice to the reply gates at once, whether or not
// the durability stream has a leader, without waiting for it to be stored.
type LiveAnnouncer interface {
	AnnounceLive(n *hamsv1.DurabilityNotice) error
}

// DurableReader is an optional Coord extension (*coord.Coord has it):
// LastDurable reads the newest stored durability notice of a model (nil
// when there is none). A promotion checks the backup against it.
type DurableReader interface {
	LastDurable(ctx context.Context, model string) (*hamsv1.DurabilityNotice, error)
}

// newBackupState is the backup of h's model; it takes snapshots of epoch
// and later ones.
func newBackupState(h Host, epoch uint64) *backupState {
	pfm, nfm := h.Neighbours()
	b := &backupState{
		h: h, alg: nspb.NewBackup(h.Model(), pfm, nfm, 0, 0),
		snaps: map[uint64]*received{}, applying: map[uint64]*received{}, wake: make(chan struct{}, 1),
		epoch: epoch, pfmDurable: map[string]uint64{}, writeWake: make(chan struct{}, 1),
		receiving: make(chan struct{}, maxReceiving),
	}
	if la, ok := h.Coord().(LiveAnnouncer); ok {
		b.live, b.persist = la, coord.NewNoticePersister(h.Coord().Announce, coord.NoticeStoreSpacing)
		stores := h.Metrics().noticeStores
		b.persist.Observe = func(stored bool) {
			if stored {
				stores.WithLabelValues("stored").Inc()
			} else {
				stores.WithLabelValues("failed").Inc()
			}
		}
	}
	h.Metrics().backupSynced.Set(0)
	return b
}

// beginReceive takes a receiving token for snapshot h, or refuses it
// (Unavailable: the shipper retries) when maxReceiving are under way;
// done gives the token back.
func (b *backupState) beginReceive(h *hamsv1.SnapshotHeader) (done func(), err error) {
	select {
	case b.receiving <- struct{}{}:
		return func() { <-b.receiving }, nil
	default:
		return nil, status.Errorf(codes.Unavailable, "ship snapshot %d: this backup is receiving %d snapshots already", h.GetBatchId(), maxReceiving)
	}
}

// setKnown records the state's size as the model server describes it.
func (b *backupState) setKnown(n uint64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.knownBytes = n
	b.mu.Unlock()
}

// stateLimit is the most state bytes a snapshot may announce: the
// model's state size as its model server describes it (learnt by warmUp,
// or asked now), else maxSnapshotBytes (a model server that does not
// say).
func (b *backupState) stateLimit() (limit uint64, known bool) {
	b.mu.Lock()
	n := b.knownBytes
	ask := n == 0 && b.h.Backend() != nil && time.Since(b.knownAsked) >= describeForLimit
	if ask {
		b.knownAsked = time.Now()
	}
	b.mu.Unlock()
	if n > 0 {
		return n, true
	}
	if ask {
		ctx, cancel := context.WithTimeout(context.Background(), describeForLimit)
		defer cancel()
		if d, err := b.h.Backend().Describe(ctx); err == nil && d.GetStateBytes() > 0 {
			b.setKnown(d.GetStateBytes())
			return d.GetStateBytes(), true
		}
	}
	return maxSnapshotBytes, false
}

// rebase makes snapshot batch the next one applied (caller holds mu):
// pending snapshots of the old primary are dropped.
func (b *backupState) rebase(batch, epoch uint64) {
	pfm, nfm := b.h.Neighbours()
	b.alg = nspb.NewBackup(b.h.Model(), pfm, nfm, batch-1, 0)
	for m, seq := range b.pfmDurable {
		// A new machine holds no snapshot: nothing to apply yet.
		b.step(nspb.Durable{Model: m, Seq: seq})
	}
	clear(b.snaps)
	b.synced, b.syncEpoch = true, epoch
	b.doneSeq = 0
	b.h.Logger().Info("backup takes a new base snapshot", "batch", batch, "epoch", epoch)
}

// push queues actions (caller holds mu) and wakes the applier.
func (b *backupState) push(acts []nspb.Action) {
	kept := acts[:0:0]
	for _, a := range acts {
		if ap, ok := a.(nspb.Apply); ok {
			queued := b.applying[ap.BatchID] != nil
			b.applying[ap.BatchID] = b.snaps[ap.BatchID]
			delete(b.snaps, ap.BatchID)
			if queued {
				// A new base (rebase) re-decided a batch whose Apply is
				// still queued: that one applies the snapshot just
				// received (the same batch of the same primary and epoch,
				// the same state). A second Apply would find it taken.
				continue
			}
		}
		kept = append(kept, a)
	}
	acts = kept
	b.acts = append(b.acts, acts...)
	b.h.Metrics().pending.Set(float64(len(b.snaps)))
	if len(acts) > 0 {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
}

// pfm are the previous stateful models, whose durability gates applies.
func (b *backupState) pfm() []string {
	pfm, _ := b.h.Neighbours()
	return pfm
}

// durable is the PFM watch callback.
func (b *backupState) durable(n *hamsv1.DurabilityNotice) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pfmDurable[n.GetModel()] = max(b.pfmDurable[n.GetModel()], n.GetDurableSeq())
	b.step(nspb.Durable{Model: n.GetModel(), Seq: n.GetDurableSeq()})
}

// step feeds one event that cannot be refused (Durable) to the
// Algorithm 2 machine and queues its actions (caller holds mu); a refusal
// would be a bug in the machine, logged.
func (b *backupState) step(ev protocol.Event) {
	acts, err := b.alg.Step(ev)
	if err != nil {
		b.h.Logger().Error("nspb backup refused an event", "event", fmt.Sprint(ev), "err", err)
		return
	}
	b.push(acts)
}

// handover is what a promotion takes of a backup whose stage stopped: the
// last snapshot applied, the seq and batch it covers, the state (cur,
// specs; the new primary's base owns it from then on) and its audit
// marks, and how many snapshots were still pending (dropped).
type handover struct {
	last       *received
	seq, batch uint64
	pending    int
	cur        []byte
	specs      []*hamsv1.TensorSpec
	marks      [][]byte
}

// handover writes the applied state to the model server first (flush,
// bounded by ctx: the new primary computes on it), then returns it.
func (b *backupState) handover(ctx context.Context) (handover, error) {
	if err := b.flush(ctx); err != nil {
		return handover{}, err
	}
	b.mu.Lock()
	ho := handover{last: b.last, seq: b.doneSeq, batch: b.doneBatch, pending: len(b.snaps), cur: b.cur, specs: b.curSpecs}
	b.mu.Unlock()
	// The audit hash of cur (its apply goroutine is stopped): a new
	// backup that audits resumes from its marks instead of hashing the
	// whole base again (~46 ms for 64 MiB on the failover path).
	if b.curHash != nil && len(ho.cur) > 0 {
		ho.marks = b.curHash.Marks(ho.cur)
	}
	return ho, nil
}

// gapBeforeLocked reports whether batch lies past the next one this
// backup can take: beyond every batch it applied, is applying or holds
// (caller holds mu).
func (b *backupState) gapBeforeLocked(batch uint64) bool {
	top, _ := b.alg.Applied()
	for id := range b.snaps {
		top = max(top, id)
	}
	for id := range b.applying {
		top = max(top, id)
	}
	return batch > top+1
}

// resync makes the next full snapshot of epoch (or a later one) the
// backup's new base, whatever it applied before (Demote of a backup:
// SyncBackup, replication.go).
func (b *backupState) resync(epoch uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if epoch > b.epoch {
		b.epoch = epoch
	}
	b.synced = false
	b.h.Metrics().backupSynced.Set(0)
}

// MaxSeq is the highest request seq and batch covered by an applied
// (written) snapshot.
func (b *backupState) MaxSeq() (seq, batch uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.doneSeq, b.doneBatch
}

// run watches the PFMs' durability and applies snapshots until ctx ends.
func (b *backupState) run(ctx context.Context) error {
	var alog *audit.Log
	if dir := b.h.AuditDir(); dir != "" {
		var err error
		if alog, err = audit.Open(dir, b.h.AuditSubdir("backup"), audit.DurableFile); err != nil {
			return err
		}
		defer alog.Close()
	}
	// The first error of the writer or the durability watch ends the
	// others and the applier; every goroutine is waited for.
	g := run.NewGroup(ctx, nil)
	g.Go(func(ctx context.Context) error { b.warmUp(ctx); return nil })
	if b.persist != nil {
		g.Go(func(ctx context.Context) error { _ = b.persist.Run(ctx); return nil })
	}
	g.Go(b.writer)
	if pfm := b.pfm(); len(pfm) > 0 {
		g.Go(func(ctx context.Context) error {
			if err := b.h.Coord().WatchDurable(ctx, pfm, b.durable); err != nil {
				return fmt.Errorf("watch durability of %v: %w", pfm, err)
			}
			return nil
		})
	}
	err := b.applier(g.Context(), alog)
	if gerr := g.Stop(); gerr != nil {
		err = errors.Join(err, gerr)
	}
	return err
}

// auditSubdir is the directory under AuditDir of this instance's
// durable.jsonl: <model>-<kind>-<instance id> (kind backup or replay).
// Instances never share a file, so a record torn by a killed process is
// never followed by another process's records.
func auditSubdir(model, id, kind string) string {
	if id == "" {
		id = strconv.Itoa(os.Getpid())
	}
	return model + "-" + kind + "-" + fileSafe(id)
}

// fileSafe replaces every byte outside [A-Za-z0-9._-] by '_' (a
// component id such as sidecar/m/backup becomes one path element).
func fileSafe(id string) string {
	b := []byte(id)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	if s := string(b); s != "." && s != ".." {
		return s
	}
	return "_"
}

func (b *backupState) applier(ctx context.Context, alog *audit.Log) error {
	for {
		select {
		case <-b.wake:
		case <-ctx.Done():
			return nil
		}
		b.mu.Lock()
		acts := b.acts
		b.acts = nil
		b.mu.Unlock()
		if len(acts) == 0 {
			continue
		}
		if err := b.perform(ctx, acts, alog); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// perform applies a run of actions: each snapshot's state is installed
// in cur in batch order, its requests recorded (lineage index, kept
// outputs, audit with the digest of the state after it), then the
// writer is woken and the highest durable seq announced.
func (b *backupState) perform(ctx context.Context, acts []nspb.Action, alog *audit.Log) (err error) {
	var applies []*received
	var last *nspb.Announce
	for _, a := range acts {
		switch a := a.(type) {
		case nspb.Apply:
			b.mu.Lock()
			r := b.applying[a.BatchID]
			delete(b.applying, a.BatchID)
			b.mu.Unlock()
			if r == nil {
				return fmt.Errorf("apply of batch %d, which was not received", a.BatchID)
			}
			applies = append(applies, r)
		case nspb.Announce:
			an := a
			last = &an
		}
	}
	if len(applies) == 0 {
		return nil
	}
	now := time.Now()
	var maxSeq uint64
	for _, r := range applies {
		if sp := traceApply(b.h.Model(), b.h.ID(), r); sp != nil {
			// Ends once the state is durable: applied and announced.
			defer func() { tracing.EndErr(sp, err) }()
		}
		b.h.Metrics().applyWait.Observe(now.Sub(r.at).Seconds())
		h := r.header
		start := time.Now()
		if err := b.install(r); err != nil {
			return fmt.Errorf("apply batch %d: %w", h.GetBatchId(), err)
		}
		b.h.Metrics().applySeconds.Observe(time.Since(start).Seconds())
		var stateDigest string
		if alog != nil {
			// The contract's state_digest: of the whole state after
			// this snapshot's batches (cur is only written by this
			// goroutine).
			stateDigest = r.digest
			if r.delta != nil {
				if b.curHash == nil {
					b.curHash = newStateHash()
				}
				stateDigest = b.curHash.Sum(b.cur)
			}
		}
		b.h.Executed(recordsOf(b.h.Model(), h.GetRequests(), b.h.IsStateful))
		outs, oerr := splitOutputs(&hamsv1.BatchResponse{Outputs: h.GetOutputs(), Rows: h.GetOutputRows()}, len(h.GetRequests()))
		if oerr != nil && len(h.GetRequests()) > 0 {
			b.h.Logger().Warn("snapshot outputs do not split per request; not kept", "batch", h.GetBatchId(), "err", oerr)
		}
		for i, rq := range h.GetRequests() {
			maxSeq = max(maxSeq, rq.GetSeq())
			if oerr == nil {
				b.h.OutputLog().Add(rq.GetReqId(), []*hamsv1.Item{{
					ReqId: rq.GetReqId(), StreamId: rq.GetStreamId(), Tensors: outs[i], Lineage: rq.GetLineage(),
					Approximate: rq.GetApproximate(),
				}})
			}
			if werr := alog.Write(audit.Durable{Model: b.h.Model(), Seq: rq.GetSeq(), InputDigest: rq.GetInputDigest(),
				OutputDigest: rq.GetOutputDigest(), StateDigest: stateDigest}); werr != nil {
				return werr
			}
		}
		b.h.Metrics().applied.Inc()
	}
	if err := alog.Flush(); err != nil {
		return fmt.Errorf("flush audit log: %w", err)
	}
	top := applies[len(applies)-1]
	b.mu.Lock()
	b.doneBatch = top.header.GetBatchId()
	b.doneSeq = max(b.doneSeq, maxSeq)
	b.last = top
	done := b.doneSeq
	if b.synced {
		// Under mu: a resync (which sets it to 0) cannot come between.
		b.h.Metrics().backupSynced.Set(1)
	}
	b.mu.Unlock()
	select {
	case b.writeWake <- struct{}{}:
	default:
	}
	b.h.Metrics().durableSeq.Set(float64(done))
	_, items, bytes := b.h.OutputLog().Stats()
	b.h.Metrics().outlogItems.Set(float64(items))
	b.h.Metrics().outlogBytes.Set(float64(bytes))
	if last == nil {
		return nil
	}
	n := &hamsv1.DurabilityNotice{Model: last.Model, Epoch: b.h.Epoch(), DurableSeq: last.DurableSeq, BatchId: last.BatchID}
	if b.live != nil {
		// The reply gates get the notice as NATS routes it; storing it
		// (for catch-up reads) is the persister's, off this path: the
		// next apply does not wait for the stream, which after the loss
		// of its leader's node has none for the raft election timeout
		// (4-9 s; docs/coordination.md, "Node failures").
		t0 := time.Now()
		err := b.live.AnnounceLive(n)
		b.h.Metrics().announce.Observe(time.Since(t0).Seconds())
		if err == nil {
			b.persist.Offer(n)
			b.h.Logger().Debug("durable", "seq", n.DurableSeq, "batch", n.BatchId)
			return nil
		}
		b.h.Logger().Warn("live durability announcement failed; announcing through the stream", "seq", n.DurableSeq, "err", err)
	}
	backoff := stateOpBackoff
	for {
		t0 := time.Now()
		err := b.h.Coord().Announce(ctx, n)
		b.h.Metrics().announce.Observe(time.Since(t0).Seconds())
		if err == nil {
			b.h.Logger().Debug("durable", "seq", n.DurableSeq, "batch", n.BatchId)
			return nil
		}
		b.h.Logger().Warn("durability announcement failed, retrying", "seq", n.DurableSeq, "err", err)
		if !run.Sleep(ctx, backoff) {
			return ctx.Err()
		}
		backoff = min(2*backoff, time.Second)
	}
}

// install makes r's state the current one and queues it for the model
// server (applier goroutine; cur is written here only).
func (b *backupState) install(r *received) error {
	h := r.header
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.delta == nil {
		b.cur, b.curSpecs, b.curVersion, b.curDigest = r.data, h.GetStateTensors(), h.GetStateVersion(), r.digest
		b.curHash, r.hash = r.hash, nil // it follows cur's patches from now on
		b.wFull, b.wRanges = r.data, nil
		b.baseAt, b.baseBatch = time.Now(), h.GetBatchId()
	} else {
		b.curDigest = ""
		if b.cur == nil {
			return fmt.Errorf("delta snapshot without a base state")
		}
		if err := checkRanges(r.delta, uint64(len(b.cur))); err != nil {
			return err
		}
		if b.inBusy && aliases(b.inFull, b.cur) {
			// The running write streams cur: patch a copy. A pending
			// whole write (wFull == cur) is not started and takes cur
			// as patched.
			cp := b.takeWarmLocked(len(b.cur))
			if cp == nil {
				cp = makeNoZero(len(b.cur)) // the copy fills it
			}
			bigmem.Copy(cp, b.cur)
			b.cur = cp
		}
		patchRanges(b.cur, r.delta)
		if b.curHash != nil {
			for _, d := range r.delta {
				b.curHash.Changed(int(d.GetOffset()))
			}
		}
		b.curVersion = h.GetStateVersion()
		if b.wFull == nil {
			b.wRanges = append(b.wRanges, r.delta...)
		}
		if b.wFull != nil || b.rangeWriter() == nil {
			// The model server takes whole states only; or a full
			// write is pending anyway: write cur whole.
			b.wFull, b.wRanges = b.cur, nil
		}
	}
	b.wVersion, b.wDirty = b.curVersion, true
	return nil
}

// aliases reports whether x and y start at the same byte.
func aliases(x, y []byte) bool { return len(x) > 0 && len(y) > 0 && &x[0] == &y[0] }

// warmMinBytes is the smallest state warmUp prefaults buffers for: below
// it the faults cost less than a millisecond.
const warmMinBytes = 4 << 20

// warmUp prefaults two buffers of the state's size while this backup has
// no base yet (a spare, or a backup before its first snapshot): the base
// it will receive, and the copy of cur its first delta patches while the
// base is being written to the model server. Both would otherwise take a
// page fault per page on the failover path (~40 ms each for the 64 MiB
// olv learner on the development machine; BenchmarkFirstCopy in
// internal/bigmem).
func (b *backupState) warmUp(ctx context.Context) {
	wait := describeRetry
	var n uint64
	for {
		d, err := b.h.Backend().Describe(ctx)
		if err == nil {
			n = d.GetStateBytes()
			b.setKnown(n)
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
	if n < warmMinBytes || n > maxSnapshotBytes {
		return
	}
	b.mu.Lock()
	need := !b.synced && len(b.warm) == 0
	b.mu.Unlock()
	if !need {
		return
	}
	bufs := [][]byte{bigmem.Prefaulted(int(n)), bigmem.Prefaulted(int(n))}
	b.mu.Lock()
	if !b.synced && len(b.warm) == 0 {
		b.warm = bufs
	}
	b.mu.Unlock()
	b.h.Logger().Debug("state buffers prefaulted", "bytes", n, "buffers", len(bufs))
}

// takeWarmLocked hands out a warm buffer of exactly n bytes, nil if there
// is none (caller holds mu).
func (b *backupState) takeWarmLocked(n int) []byte {
	for i, w := range b.warm {
		if len(w) == n {
			b.warm = append(b.warm[:i], b.warm[i+1:]...)
			return w
		}
	}
	return nil
}

func (b *backupState) rangeWriter() StateRangeWriter {
	w, _ := b.h.StateBackend().(StateRangeWriter)
	return w
}

// writer writes the applied state to the model server behind the
// applies, until ctx ends. A write that keeps failing stops the backup
// (fail-stop: a backup whose model server cannot take the state cannot
// be promoted).
//
// ctx ending (a role change) does not cut the write in progress: a write
// cut off on the client side may still land on the model server, after
// the writes that follow it (a whole write is not fenced by a base
// version), so a promotion waits for it and flush starts from what the
// model server answered.
func (b *backupState) writer(ctx context.Context) error {
	for ctx.Err() == nil {
		b.mu.Lock()
		now := time.Now()
		hold := b.holdLocked(now)
		if hold == 0 {
			hold = b.spacingLocked(now)
		}
		if hold == 0 && !b.inBusy && b.wDirty {
			b.inFull, b.inRanges, b.inVersion, b.inBusy, b.inFailed = b.wFull, b.wRanges, b.wVersion, true, false
			b.wFull, b.wRanges, b.wDirty = nil, nil, false
			if b.inFull == nil {
				b.rangesAt = now
			}
		}
		busy := b.inBusy
		b.mu.Unlock()
		if !busy {
			var held <-chan time.Time
			if hold > 0 {
				held = time.After(hold)
			}
			select {
			case <-b.writeWake:
				continue
			case <-held:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		if err := b.writeInFlight(ctx, b.h.RunContext()); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	return nil
}

// wholeWriteHold bounds how long the writer holds back the whole write of
// a base just installed.
var wholeWriteHold = 150 * time.Millisecond

// holdLocked is how long the writer still holds back the pending whole
// write of the base just installed (caller holds mu): until a snapshot
// after the base is applied, at most wholeWriteHold after the base; 0:
// write now. A backup that has just received a base (a spare made the
// backup of a promoted primary) is applying the new primary's first
// deltas next, and every reply of the failover waits for their
// durability; the whole write is the largest job on the host (for a
// 64 MiB state the model server receives, verifies and loads it: ~170 ms
// of CPU on the development machine). The first delta then also patches
// cur in place instead of a copy (no write streams it yet). A promotion's
// flush does not wait.
func (b *backupState) holdLocked(now time.Time) time.Duration {
	if b.inBusy || !b.wDirty || b.wFull == nil || b.baseAt.IsZero() || b.doneBatch > b.baseBatch {
		return 0
	}
	return max(0, wholeWriteHold-now.Sub(b.baseAt))
}

// rangeWriteSpacing is the least time between the starts of two range
// writes to the model server; a var for tests.
//
// Write-behind coalesces the deltas applied while a write runs into the
// next one, but at batch 1 each write is over before the next snapshot
// arrives, so every snapshot was one WriteState call: at 150-200 requests
// a second through the ap service's two stateful models, their backup
// model servers used 0.56-0.60 ms of CPU per request, nearly all of it
// these calls (gRPC, a region copy and the checks of each), and 0.19-0.30
// ms with the writes spaced (docs/measurements.md, "Issue 22, eighth
// session"). Spaced writes merge the ranges of the snapshots applied
// meanwhile (mergeRanges: later bytes win), so an LSTM's state rewritten
// by every request moves once per spacing. Nothing waits on these
// writes: durability is the state in the sidecar's copy, and a promotion
// writes what is pending at once (flush), so a promoted backup's model
// server lags by at most what arrived in one spacing.
var rangeWriteSpacing = 20 * time.Millisecond

// spacingLocked is how long the writer still holds back a pending range
// write (caller holds mu); 0: write now. A whole write is not held here
// (holdLocked is its rule): it replaces the model server's state, and
// the base of the deltas that follow.
func (b *backupState) spacingLocked(now time.Time) time.Duration {
	if b.inBusy || !b.wDirty || b.wFull != nil || b.rangesAt.IsZero() {
		return 0
	}
	return max(0, rangeWriteSpacing-now.Sub(b.rangesAt))
}

// takeWholeLocked makes the taken write cur whole at curVersion and drops
// the pending write, which cur covers (caller holds mu).
func (b *backupState) takeWholeLocked() {
	b.inFull, b.inRanges, b.inVersion, b.inBusy = b.cur, nil, b.curVersion, true
	b.wFull, b.wRanges, b.wDirty = nil, nil, false
}

// writeInFlight writes the taken write, retrying while ctx lasts; each
// attempt runs under wctx (bounded by stateWriteTimeout), which the
// writer does not end with ctx. Caller: the writer, or flush with the
// writer stopped.
//
// A range write that failed may have landed all the same (its answer
// lost): the model server is then past the base the write names, and
// every range write on that base is refused. So once a range write has
// failed, a failure of the next one turns the write into cur whole.
func (b *backupState) writeInFlight(ctx, wctx context.Context) error {
	var err error
	for attempt := 0; attempt < stateOpAttempts; attempt++ {
		if attempt > 0 && !run.Sleep(ctx, stateOpBackoff<<attempt) {
			return ctx.Err()
		}
		b.mu.Lock()
		full, ranges, version, base, specs := b.inFull, b.inRanges, b.inVersion, b.written, b.curSpecs
		digest := ""
		if aliases(full, b.cur) {
			digest = b.curDigest
		}
		b.mu.Unlock()
		actx, cancel := context.WithTimeout(wctx, stateWriteTimeout)
		if full != nil {
			var ts []*hamsv1.Tensor
			if ts, err = tensor.SplitBySpecs(specs, full); err != nil {
				cancel()
				return fmt.Errorf("write state version %d: %w", version, err)
			}
			if dw, ok := b.h.StateBackend().(DigestStateWriter); ok && digest != "" {
				err = dw.WriteStateDigest(actx, ts, version, digest)
			} else {
				err = b.h.StateBackend().WriteState(actx, ts, version)
			}
		} else {
			err = b.rangeWriter().WriteStateRanges(actx, specs, base, version, mergeRanges(ranges))
		}
		cancel()
		if err == nil {
			break
		}
		b.h.Logger().Warn("write state to the model server failed", "version", version, "ranges", full == nil, "attempt", attempt+1, "err", err)
		b.mu.Lock()
		if full == nil && b.inFailed {
			b.takeWholeLocked()
		}
		b.inFailed = true
		b.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("write state version %d to the model server: %w", b.inVersion, err)
	}
	b.mu.Lock()
	b.written, b.inFull, b.inRanges, b.inBusy, b.inFailed = b.inVersion, nil, nil, false, false
	b.mu.Unlock()
	return nil
}

// flush writes whatever the model server lacks of cur (the writer is
// stopped: a promotion, with the role stage down).
//
// A failed range write and ranges pending after it go out as one range
// write on the failed write's base (later ranges override earlier ones),
// which moves the deltas only instead of the whole state (64 MiB for the
// olv learner: most of a promotion's time). If the failed write landed
// after all, that write is refused and writeInFlight writes cur whole.
func (b *backupState) flush(ctx context.Context) error {
	b.mu.Lock()
	switch {
	case b.inBusy && b.wDirty && b.inFull == nil && b.wFull == nil && b.rangeWriter() != nil:
		b.inRanges = append(append([]*hamsv1.StateRange(nil), b.inRanges...), b.wRanges...)
		b.inVersion = b.wVersion
		b.wFull, b.wRanges, b.wDirty = nil, nil, false
	case b.inBusy && b.wDirty:
		// A failed and a pending write, one of them whole: write cur
		// whole.
		b.takeWholeLocked()
	case b.wDirty:
		b.inFull, b.inRanges, b.inVersion, b.inBusy, b.inFailed = b.wFull, b.wRanges, b.wVersion, true, false
		b.wFull, b.wRanges, b.wDirty = nil, nil, false
	}
	busy := b.inBusy
	b.mu.Unlock()
	if !busy {
		return nil
	}
	return b.writeInFlight(ctx, ctx)
}

// receive reads one snapshot from a ShipSnapshot stream and checks it:
// header first, no data past state_bytes, the digest on the last chunk
// and matching the data.
func (b *backupState) receive(stream hamsv1.Replication_ShipSnapshotServer) (*received, error) {
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return nil, status.Error(codes.InvalidArgument, "ship snapshot: empty stream")
	}
	if err != nil {
		return nil, err
	}
	h := first.GetHeader()
	if h == nil {
		return nil, status.Error(codes.InvalidArgument, "ship snapshot: first chunk has no header")
	}
	done, err := b.beginReceive(h)
	if err != nil {
		return nil, err
	}
	defer done()
	sink, err := b.newSink(h)
	if err != nil {
		return nil, err
	}
	digest := first.GetStateDigest()
	for {
		ch, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if digest != "" {
			return nil, status.Errorf(codes.InvalidArgument, "ship snapshot %d: chunk after the one with the state digest", h.GetBatchId())
		}
		if ch.GetHeader() != nil {
			return nil, status.Errorf(codes.InvalidArgument, "ship snapshot %d: second header", h.GetBatchId())
		}
		if err := sink.add(ch.GetOffset(), ch.GetData()); err != nil {
			return nil, err
		}
		digest = ch.GetStateDigest()
	}
	return sink.finish(digest)
}

// snapshotSink takes one snapshot's data as it arrives, from either
// transport (ShipSnapshot chunks, the bulk stream): a full state into one
// buffer (a warm one when there is one), a delta's ranges; it checks the
// wire's XXH64 as the bytes come in and, with audit logs on, computes a
// full state's SHA-256 as they come in too (overlapping the transfer, not
// in a pass after the last byte), kept for the digests of the deltas
// applied on top (stateHash).
type snapshotSink struct {
	h      *hamsv1.SnapshotHeader
	data   []byte
	ranges []*hamsv1.StateRange
	got    uint64
	// kind: the wire digest the header announced (headerDigestKind),
	// check: its running sum of the data.
	kind  uint64
	check wireHash
	// aeadOK: the snapshot arrives on a TLS connection, so a header may
	// announce digestAEAD (no digest of the data).
	aeadOK bool
	sum    *stateHash
	// audit: the contract's SHA-256 is wanted; marks: the sender's
	// intermediate states to resume it from (then sum stays nil until
	// finish).
	audit bool
	marks [][]byte
}

// newSink checks h and returns the sink for its data.
func (b *backupState) newSink(h *hamsv1.SnapshotHeader) (*snapshotSink, error) {
	switch {
	case h.GetModel() != b.h.Model():
		return nil, status.Errorf(codes.InvalidArgument, "ship snapshot: model %q, this is the backup of %q", h.GetModel(), b.h.Model())
	case h.GetBatchId() == 0:
		return nil, status.Error(codes.InvalidArgument, "ship snapshot: batch id 0")
	case len(h.GetRequests()) == 0 && h.GetDelta():
		// Only a full state (a base) may cover no request.
		return nil, status.Errorf(codes.InvalidArgument, "ship snapshot: delta batch %d covers no request", h.GetBatchId())
	}
	// Checked before anything is allocated for the data.
	limit, known := b.stateLimit()
	what := "the model's state size"
	if !known {
		what = "limit"
	}
	switch {
	case h.GetStateBytes() > limit:
		return nil, status.Errorf(codes.ResourceExhausted, "ship snapshot %d: %d state bytes (%s %d)", h.GetBatchId(), h.GetStateBytes(), what, limit)
	case h.GetDelta() && h.GetDeltaBytes() > maxDeltaStates*h.GetStateBytes():
		return nil, status.Errorf(codes.ResourceExhausted, "ship snapshot %d: %d delta bytes for a %d-byte state (limit %d states)", h.GetBatchId(), h.GetDeltaBytes(), h.GetStateBytes(), maxDeltaStates)
	}
	kind := headerDigestKind(h)
	k := &snapshotSink{h: h, kind: kind, check: newWireHash(kind)}
	if h.GetDelta() {
		k.ranges = []*hamsv1.StateRange{}
		return k, nil
	}
	b.mu.Lock()
	k.data = b.takeWarmLocked(int(h.GetStateBytes()))[:0]
	b.mu.Unlock()
	if k.data == nil {
		// Not zeroed: every byte is received into it before any is
		// read (finish checks the count; a short snapshot is dropped).
		k.data = makeNoZero(int(h.GetStateBytes()))[:0]
	}
	if k.audit = b.h.AuditDir() != ""; k.audit {
		if m := h.GetSha256Marks(); len(m) > 0 && len(m) == (int(h.GetStateBytes())+stateHashMark-1)/stateHashMark {
			k.marks = m
		} else {
			k.sum = newStateHash()
		}
	}
	return k, nil
}

// add takes the next bytes: of a full state in order (off is ignored), of
// a delta the range at off. d is not retained for a full state; a delta
// keeps it as the range's data.
func (k *snapshotSink) add(off uint64, d []byte) error {
	h := k.h
	if h.GetDelta() {
		if err := k.checkRange(off, d); err != nil {
			return err
		}
		_, _ = k.check.Write(d)
		k.check.EndRange()
		k.ranges = append(k.ranges, &hamsv1.StateRange{Offset: off, Data: d})
		return nil
	}
	if uint64(len(k.data)+len(d)) > h.GetStateBytes() {
		return status.Errorf(codes.InvalidArgument, "ship snapshot %d: more than the announced %d state bytes", h.GetBatchId(), h.GetStateBytes())
	}
	k.data = append(k.data, d...)
	k.hash(d)
	return nil
}

// addHashed is add of a delta's range whose bytes were fed to check
// already (the bulk stream hashes them as they arrive).
func (k *snapshotSink) addHashed(off uint64, d []byte) error {
	if err := k.checkRange(off, d); err != nil {
		return err
	}
	k.ranges = append(k.ranges, &hamsv1.StateRange{Offset: off, Data: d})
	return nil
}

// checkRange counts a delta's range against the announced total and
// checks that it lies inside the state.
func (k *snapshotSink) checkRange(off uint64, d []byte) error {
	h := k.h
	if k.got += uint64(len(d)); k.got > h.GetDeltaBytes() {
		return status.Errorf(codes.InvalidArgument, "ship snapshot %d: more than the announced %d delta bytes", h.GetBatchId(), h.GetDeltaBytes())
	}
	if err := checkRanges([]*hamsv1.StateRange{{Offset: off, Data: d}}, h.GetStateBytes()); err != nil {
		return status.Errorf(codes.InvalidArgument, "ship snapshot %d: %v", h.GetBatchId(), err)
	}
	return nil
}

// hash feeds bytes of a full state that are in data already.
func (k *snapshotSink) hash(d []byte) {
	_, _ = k.check.Write(d)
	if k.sum != nil {
		k.sum.Write(d)
	}
}

// finish checks the sizes and the wire digest and returns the snapshot.
func (k *snapshotSink) finish(digest string) (*received, error) {
	h := k.h
	if digest == "" {
		return nil, status.Errorf(codes.InvalidArgument, "ship snapshot %d: stream ended without the state digest", h.GetBatchId())
	}
	if k.kind == digestAEAD && !k.aeadOK {
		return nil, status.Errorf(codes.InvalidArgument, "ship snapshot %d: no digest of the data, on a connection without TLS", h.GetBatchId())
	}
	if h.GetDelta() {
		if k.got != h.GetDeltaBytes() {
			return nil, status.Errorf(codes.InvalidArgument, "ship snapshot %d: %d of %d delta bytes", h.GetBatchId(), k.got, h.GetDeltaBytes())
		}
		if got := formatWireDigest(k.kind, k.check.Sum64()); got != digest {
			return nil, status.Errorf(codes.DataLoss, "ship snapshot %d: delta digest %s does not match the data (%s)", h.GetBatchId(), digest, got)
		}
		return &received{header: h, delta: k.ranges, digest: digest, at: time.Now()}, nil
	}
	if uint64(len(k.data)) != h.GetStateBytes() {
		return nil, status.Errorf(codes.InvalidArgument, "ship snapshot %d: %d of %d state bytes", h.GetBatchId(), len(k.data), h.GetStateBytes())
	}
	if got := formatWireDigest(k.kind, k.check.Sum64()); got != digest {
		return nil, status.Errorf(codes.DataLoss, "ship snapshot %d: state digest %s does not match the data (%s)", h.GetBatchId(), digest, got)
	}
	if _, err := tensor.SplitBySpecs(h.GetStateTensors(), k.data); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "ship snapshot %d: %v", h.GetBatchId(), err)
	}
	// digest: the contract's SHA-256 of the state where it is wanted,
	// resumed from the sender's marks when it sent them.
	if k.audit && k.sum == nil {
		var ok bool
		if k.sum, ok = stateHashFromMarks(k.marks, k.data); !ok {
			k.sum = newStateHash()
			k.sum.Write(k.data)
		}
	}
	sha := ""
	if k.sum != nil {
		sha = k.sum.Sum(k.data)
	}
	return &received{header: h, data: k.data, digest: sha, hash: k.sum, at: time.Now()}, nil
}

// shipSnapshot serves Replication.ShipSnapshot: it answers as soon as the
// snapshot is buffered; applying it follows Algorithm 2.
func (b *backupState) shipSnapshot(stream hamsv1.Replication_ShipSnapshotServer) error {
	r, err := b.receive(stream)
	if err != nil {
		return err
	}
	r.trace = receivedTrace(stream.Context())
	resp, err := b.accept(r)
	if err != nil {
		return err
	}
	return stream.SendAndClose(resp)
}

// accept buffers a received snapshot for Algorithm 2 and returns the
// acknowledgement (either transport).
func (b *backupState) accept(r *received) (*hamsv1.ShipSnapshotResponse, error) {
	h := r.header
	lineages := make([][]*hamsv1.LineageEntry, len(h.GetRequests()))
	var maxSeq uint64
	for i, rq := range h.GetRequests() {
		lineages[i] = rq.GetLineage()
		maxSeq = max(maxSeq, rq.GetSeq())
	}
	meta := nspb.SnapshotMeta{BatchID: h.GetBatchId(), MaxSeq: maxSeq, Deps: nspb.DepsOf(b.pfm(), lineages...)}
	b.mu.Lock()
	if h.GetEpoch() < b.epoch {
		b.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "ship snapshot %d: stale epoch %d < %d", h.GetBatchId(), h.GetEpoch(), b.epoch)
	}
	if b.synced && h.GetEpoch() == b.syncEpoch && b.gapBeforeLocked(meta.BatchID) {
		// The primary's snapshot ids are dense and it ships them in order,
		// so the ones between went to another backup: this one was
		// replaced in its epoch and is chosen again, and the SyncBackup
		// that would have made it take a new base did not reach it (a
		// manager killed in the middle of that recovery round: a 30-minute
		// soak, 2026-11-27, no durability for the model for good). The
		// missing batches never come here; take a new base instead.
		b.h.Logger().Info("snapshot past a gap: the batches between went to another backup; taking a new base",
			"batch", meta.BatchID, "epoch", h.GetEpoch(), "delta", h.GetDelta())
		b.synced = false
		b.h.Metrics().backupSynced.Set(0)
	}
	if (!b.synced || h.GetEpoch() > b.syncEpoch) && h.GetDelta() {
		b.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "ship snapshot %d: delta snapshot, and this backup %s", h.GetBatchId(), errNeedBase)
	}
	base := !b.synced || h.GetEpoch() > b.syncEpoch
	if applied, _ := b.alg.Applied(); !base && len(h.GetRequests()) == 0 && meta.BatchID > applied && b.snaps[meta.BatchID] == nil {
		b.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "ship snapshot %d: covers no request (only a base state may)", h.GetBatchId())
	}
	if base {
		b.epoch = max(b.epoch, h.GetEpoch())
		b.h.RaiseEpoch(b.epoch) // announce at the primary's epoch
		b.rebase(h.GetBatchId(), h.GetEpoch())
	}
	applied, _ := b.alg.Applied()
	_, pending := b.snaps[meta.BatchID]
	dup := meta.BatchID <= applied || pending
	if !dup {
		b.snaps[meta.BatchID] = r
		acts, err := b.alg.Step(nspb.SnapshotReceived{Snapshot: meta})
		if err != nil {
			delete(b.snaps, meta.BatchID)
			b.mu.Unlock()
			return nil, status.Errorf(codes.InvalidArgument, "ship snapshot %d: %v", meta.BatchID, err)
		}
		b.push(acts)
		b.maxRecvSeq = max(b.maxRecvSeq, maxSeq)
	}
	// Applied in the acknowledgement means installed and recorded:
	// alg's Applied only says the Apply was decided (the applier may not
	// have installed that state and written its audit records yet). A
	// primary that took a decided apply for a done one would leave the
	// batch's requests out of a new backup's base (shipper.rebaseSnapshot)
	// and move its rollback target past the state its backup holds.
	applied, _ = b.alg.Applied()
	applied = min(applied, b.doneBatch)
	b.mu.Unlock()
	if dup {
		b.h.Logger().Debug("duplicate snapshot dropped", "batch", meta.BatchID)
	} else {
		b.h.Logger().Debug("snapshot buffered", "batch", meta.BatchID, "max_seq", maxSeq, "deps", meta.Deps)
	}
	return &hamsv1.ShipSnapshotResponse{BatchId: meta.BatchID, Applied: meta.BatchID <= applied}, nil
}
