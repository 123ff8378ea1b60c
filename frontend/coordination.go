package frontend

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/hams-go/hams/internal/run"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Coord is what the frontend needs of the coordination engine
// (*coord.Coord satisfies it).
type Coord interface {
	// WatchDurable calls fn for the last durability notice of each of
	// models and then for every new one, until ctx ends (nil) or the watch
	// fails (an error). fn runs on one goroutine.
	WatchDurable(ctx context.Context, models []string, fn func(*hamsv1.DurabilityNotice)) error
	// Complete publishes that requests left the graph.
	Complete(ctx context.Context, n *hamsv1.CompletionNotice) error
}

// Timing of the coordination loops.
const (
	// completionFlush is how long answered req_ids wait to be batched into
	// one completion notice; completionBatch ids flush at once.
	completionFlush = 25 * time.Millisecond
	completionBatch = 1024
	// completionCallTimeout bounds one Complete call.
	completionCallTimeout = 2 * time.Second
	// finalFlushTimeout bounds the completion flush after shutdown.
	finalFlushTimeout = 2 * time.Second
	// auditFlush is the period of the audit log's flush.
	auditFlush = 100 * time.Millisecond
	// Backoff of the durability watch and of failed completion notices.
	minBackoff = 20 * time.Millisecond
	maxBackoff = 2 * time.Second
	// stableWatch is how long a durability watch must have run for the next
	// failure to restart it after minBackoff again.
	stableWatch = 10 * time.Second
)

// watchDurability keeps a durability watch on every replicated stateful
// model of the deployment until ctx ends, restarting it with backoff when
// it fails, and feeds its notices to the gate.
func (f *Frontend) watchDurability(ctx context.Context) {
	backoff := minBackoff
	for {
		start := time.Now()
		err := f.cfg.Coord.WatchDurable(ctx, f.watchModels, f.onDurable)
		if ctx.Err() != nil {
			return
		}
		f.m.watchRestarts.Inc()
		if time.Since(start) >= stableWatch {
			backoff = minBackoff
		}
		f.log.Warn("durability watch ended; restarting", "err", err, "backoff", backoff)
		if !run.Sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// onDurable applies one durability notice: the replies it makes releasable
// go to their callers.
func (f *Frontend) onDurable(n *hamsv1.DurabilityNotice) {
	if !f.stateful[n.GetModel()] {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holds == nil {
		return
	}
	now := f.now()
	released, rolled, newEpoch := f.holds.notice(n.GetModel(), n.GetEpoch(), n.GetDurableSeq())
	if newEpoch {
		// A new primary of the model took over from its backup's state at
		// durable_seq: what the model produced beyond it is lost. Parts
		// that came from it are dropped; rolled-back replies go back to
		// the table to await the re-executed items.
		model, seq, epoch := n.GetModel(), n.GetDurableSeq(), n.GetEpoch()
		dropped := f.table.dropParts(model, seq, epoch)
		var again []*completion
		for _, r := range rolled {
			keep := map[string]*hamsv1.Item{}
			for s, it := range r.comp.parts {
				if !namesLost(it.GetLineage(), model, seq, epoch) {
					keep[s] = it
				}
			}
			f.m.rolledBack.Inc()
			if c := f.table.readd(r.comp, keep); c != nil {
				again = append(again, c)
				continue
			}
			// Items kept aside while the reply was held: copies of the
			// lost execution (its seq, output and epoch) go; a
			// re-execution that overtook this notice completes the
			// request, even one that repeats the lost seq and output.
			lost := map[string]bool{}
			for _, it := range r.comp.parts {
				for _, l := range it.GetLineage() {
					if lostEntry(l, model, seq, epoch) {
						lost[fmt.Sprint(l.GetSeq(), "/", l.GetOutputDigest(), "/", l.GetEpoch())] = true
					}
				}
			}
			for _, o := range f.orphans.take(r.reqID) {
				old := false
				for _, l := range o.it.GetLineage() {
					if l.GetModel() == model && lost[fmt.Sprint(l.GetSeq(), "/", l.GetOutputDigest(), "/", l.GetEpoch())] {
						old = true
					}
				}
				if !old {
					f.deliverLocked(o.from, o.it)
				}
			}
		}
		for _, c := range again {
			f.completeLocked(c)
		}
		f.log.Info("stateful model failed over: replies depending on lost state rolled back",
			"model", n.GetModel(), "epoch", n.GetEpoch(), "durable_seq", n.GetDurableSeq(), "rolled_back", len(rolled), "parts_dropped", dropped)
		signal(f.kick)
	}
	for _, r := range released {
		f.m.gatingWait.Observe(now.Sub(r.since).Seconds())
		if c := f.calls[r.reqID]; c != nil {
			f.finishLocked(c, r.resp, nil, true)
		}
	}
}

// noteAnsweredLocked queues the req_id of an answered request for its
// completion notice and, for a reply not audited yet, its audit record.
// Called with mu held, once per request (from finishLocked).
func (f *Frontend) noteAnsweredLocked(reqID uint64, resp *hamsv1.PredictResponse, err error, audited bool) {
	if f.cfg.Coord != nil {
		f.doneIDs = append(f.doneIDs, reqID)
		switch len(f.doneIDs) {
		case 1:
			signal(f.complKick)
		case completionBatch:
			signal(f.complFull)
		}
	}
	if f.cfg.AuditDir != "" && err == nil && resp != nil && !audited {
		f.auditQ = append(f.auditQ, resp)
	}
}

// completionLoop publishes the req_ids of answered requests in completion
// notices: a batch leaves completionFlush after its first id, or at once
// when it holds completionBatch ids.
func (f *Frontend) completionLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.complKick:
		}
		timer.Reset(completionFlush)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		case <-f.complFull:
			timer.Stop()
		}
		f.flushCompletions(ctx)
	}
}

// flushCompletions publishes every queued req_id, completionBatch ids per
// notice. A failed notice is retried as the same batch (so the
// coordination engine's duplicate window absorbs a retry of a notice that
// was in fact published) until it succeeds or ctx ends; what is left then
// goes back to the front of the queue. It reports whether the queue was
// emptied.
func (f *Frontend) flushCompletions(ctx context.Context) bool {
	f.mu.Lock()
	ids := f.doneIDs
	f.doneIDs = nil
	f.mu.Unlock()
	backoff := minBackoff
	for len(ids) > 0 {
		n := min(len(ids), completionBatch)
		cctx, cancel := context.WithTimeout(ctx, completionCallTimeout)
		err := f.cfg.Coord.Complete(cctx, &hamsv1.CompletionNotice{Frontend: f.name, ReqIds: ids[:n:n]})
		cancel()
		if err == nil {
			f.m.completions.Add(float64(n))
			ids = ids[n:]
			backoff = minBackoff
			continue
		}
		f.m.completionErrors.Inc()
		f.log.Warn("completion notice failed; retrying", "req_ids", n, "err", err, "backoff", backoff)
		if !run.Sleep(ctx, backoff) {
			f.mu.Lock()
			f.doneIDs = append(ids, f.doneIDs...)
			f.mu.Unlock()
			return false
		}
		backoff = min(2*backoff, maxBackoff)
	}
	return true
}

// finalCompletions publishes what is still queued once Run's goroutines
// ended (the answers shutdown gave included).
func (f *Frontend) finalCompletions() {
	ctx, cancel := context.WithTimeout(context.Background(), finalFlushTimeout)
	defer cancel()
	if !f.flushCompletions(ctx) {
		f.mu.Lock()
		n := len(f.doneIDs)
		f.doneIDs = nil
		f.mu.Unlock()
		f.log.Warn("completion notices not published at shutdown", "req_ids", n)
	}
}

// auditLoop writes the queued reply records and flushes the log every
// auditFlush until ctx ends.
func (f *Frontend) auditLoop(ctx context.Context, log *audit.Log) {
	t := time.NewTicker(auditFlush)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.writeAudit(log)
		if err := log.Flush(); err != nil {
			f.log.Warn("audit flush failed", "err", err)
		}
	}
}

// writeAudit writes one record per queued reply. Digests are computed here,
// off the request path and outside mu.
func (f *Frontend) writeAudit(log *audit.Log) {
	f.mu.Lock()
	q := f.auditQ
	f.auditQ = nil
	f.mu.Unlock()
	for _, resp := range q {
		if err := log.Write(auditReply(resp)); err != nil {
			f.m.auditErrors.Inc()
			f.log.Warn("audit write failed", "req_id", resp.GetReqId(), "err", err)
		}
	}
}

// auditNow writes the audit record of a reply and hands it to the file
// (one write call) before the reply is released: a frontend killed right
// after releasing a reply still leaves its record (a SIGKILL loses what
// a process buffers, not what it wrote). Used for recorded answers (the
// request log path), whose frontend may die while others go on.
func (f *Frontend) auditNow(resp *hamsv1.PredictResponse) {
	err := f.auditLog.Write(auditReply(resp))
	if err == nil {
		err = f.auditLog.Flush()
	}
	if err != nil {
		f.m.auditErrors.Inc()
		f.log.Warn("audit write failed", "req_id", resp.GetReqId(), "err", err)
	}
}

// auditReply is the replies.jsonl record of a released reply: the frontend
// req_id (so records join with the lineage the sidecars saw, even when the
// client named its own request_id), the merged lineage in traversal order
// with one step per (model, seq), the digest of every output tensor in
// reply order (outputs sorted by model, tensors in order), and whether the
// reply is approximate (a parity reconstruction).
func auditReply(resp *hamsv1.PredictResponse) audit.Reply {
	rec := audit.Reply{ReqID: strconv.FormatUint(resp.GetReqId(), 10), Lineage: []audit.LineageStep{}, Approximate: resp.GetApproximate()}
	type step struct {
		model string
		seq   uint64
	}
	seen := map[step]bool{}
	for _, l := range resp.GetLineage() {
		k := step{l.GetModel(), l.GetSeq()}
		if seen[k] {
			continue
		}
		seen[k] = true
		rec.Lineage = append(rec.Lineage, audit.LineageStep{Model: l.GetModel(), Seq: l.GetSeq(), OutputDigest: l.GetOutputDigest()})
	}
	var ts []*hamsv1.Tensor
	for _, o := range resp.GetOutputs() {
		ts = append(ts, o.GetTensors()...)
	}
	rec.ReplyDigest = tensor.Digest(ts...)
	return rec
}

// signal wakes a loop without blocking (a pending wake-up suffices).
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
