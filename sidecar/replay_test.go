package sidecar

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/hams-go/hams/integration/consistency"
	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func rb(epoch, batch, firstSeq uint64, n int) *hamsv1.ReplayBatch {
	b := &hamsv1.ReplayBatch{Model: "m", Epoch: epoch, BatchId: batch, FirstSeq: firstSeq}
	for range n {
		b.Requests = append(b.Requests, &hamsv1.ReplayRequest{})
	}
	return b
}

func chainIDs(c []*hamsv1.ReplayBatch) string {
	var s []string
	for _, b := range c {
		s = append(s, fmt.Sprintf("%d@%d", b.GetBatchId(), b.GetEpoch()))
	}
	return strings.Join(s, " ")
}

// The replayed chain: dense batch ids after the checkpoint, the highest
// epoch per id, never a lower epoch after a higher one (nor below the
// checkpoint's), seqs continuing the numbering.
func TestReplayChain(t *testing.T) {
	cases := []struct {
		name                     string
		recs                     []*hamsv1.ReplayBatch
		ckEpoch, afterB, afterSq uint64
		want                     string
		why                      string
	}{
		{"contiguous, records before the checkpoint ignored", []*hamsv1.ReplayBatch{rb(1, 3, 5, 2), rb(1, 4, 7, 1), rb(1, 5, 8, 3), rb(1, 6, 11, 1)}, 1, 4, 7, "5@1 6@1", "end of the log at batch 7"},
		{"gap stops", []*hamsv1.ReplayBatch{rb(1, 1, 1, 2), rb(1, 3, 5, 1)}, 0, 0, 0, "1@1", "end of the log at batch 2"},
		{"higher epoch overrides a batch id", []*hamsv1.ReplayBatch{rb(1, 1, 1, 2), rb(1, 2, 3, 2), rb(2, 2, 3, 1), rb(2, 3, 4, 1)}, 1, 0, 0, "1@1 2@2 3@2", "end of the log at batch 4"},
		{"a deposed epoch after a newer one stops", []*hamsv1.ReplayBatch{rb(2, 1, 1, 1), rb(1, 2, 2, 1)}, 1, 0, 0, "1@2", "of epoch 1, after epoch 2"},
		{"older than the checkpoint's epoch stops", []*hamsv1.ReplayBatch{rb(1, 9, 20, 1)}, 2, 8, 19, "", "of epoch 1, after epoch 2"},
		{"seq mismatch stops", []*hamsv1.ReplayBatch{rb(1, 1, 1, 2), rb(1, 2, 4, 1)}, 0, 0, 0, "1@1", "starts at seq 4"},
	}
	for _, c := range cases {
		chain, why := replayChain(c.recs, c.ckEpoch, c.afterB, c.afterSq)
		if got := chainIDs(chain); got != c.want || !strings.Contains(why, c.why) {
			t.Errorf("%s: chain %q (%s), want %q (%s)", c.name, got, why, c.want, c.why)
		}
	}
}

const replayChainYAML = `
name: rp
mode: replay
replay: {checkpoint_every: %d, checkpoint_idle: %s}
models:
  - {name: a, kind: fake, batch: {size: 4, max_wait: 1ms}}
  - {name: b, kind: counter, stateful: true, batch: {size: 4, max_wait: 1ms}, placement: {primary: h1, backup: h2}}
services:
  - name: s
    edges: [[frontend, a], [a, b], [b, frontend]]
`

// replayRig is a rig with a replay store on its JetStream.
func replayRig(t *testing.T, every int, idle string) (*rig, *coord.Replay) {
	t.Helper()
	r := newRig(t, fmt.Sprintf(replayChainYAML, every, idle))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := r.co.OpenReplay(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return r, store
}

// startReplay is rig.start with the replay store configured.
func (r *rig) startReplay(store ReplayStore, model string, be Backend, role config.Role, epoch uint64, serve bool) *inst {
	r.t.Helper()
	lis := listen(r.t)
	in := &inst{be: be, addr: lis.Addr().String(), audit: r.t.TempDir(), done: make(chan struct{})}
	sc, err := New(Config{Deployment: r.dep, Model: model, Backend: be, Resolver: r.res, GRPCListener: lis, Role: role,
		Epoch: epoch, AuditDir: in.audit, Coord: r.co, Replay: store, ID: model + "/" + role.String()})
	if err != nil {
		r.t.Fatal(err)
	}
	in.sc = sc
	if serve {
		r.res.Set(model, in.addr, epoch)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	in.kill = func() { cancel(); <-in.done }
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(in.done)
		if err := sc.Run(ctx); err != nil {
			r.t.Errorf("sidecar %s: %v", model, err)
		}
	}()
	return in
}

func durableBySeq(t *testing.T, in *inst) map[uint64]audit.Durable {
	t.Helper()
	out := map[uint64]audit.Durable{}
	for _, d := range durableRecords(t, in) {
		if prev, ok := out[d.Seq]; ok && prev != d {
			t.Fatalf("seq %d recorded twice differently by one instance: %+v vs %+v", d.Seq, prev, d)
		}
		out[d.Seq] = d
	}
	return out
}

// A replay primary logs every batch and checkpoints every N batches and
// when idle: every request ends up covered by a stored checkpoint, with a
// durable record naming that checkpoint's state; the log is trimmed to
// what no checkpoint covers; the newest checkpoint holds the model's state.
func TestReplayPrimaryLogsAndCheckpoints(t *testing.T) {
	r, store := replayRig(t, 3, "20ms")
	r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
	be := newCounter(4)
	b := r.startReplay(store, "b", be, config.RolePrimary, 1, true)
	spare := r.startReplay(store, "b", newCounter(4), config.RoleBackup, 1, false)
	const n = 40
	r.send(1, n)
	waitFor(t, "all replies", func() bool { return r.sink.count() >= n })
	waitFor(t, "every request durable", func() bool { return len(durableBySeq(t, b)) == n })
	ctx := context.Background()
	var ck *hamsv1.ReplayCheckpoint
	waitFor(t, "the idle checkpoint holds the final state", func() bool {
		c, st, err := store.LoadCheckpoint(ctx, "b")
		ck = c
		return err == nil && c.GetSeq() == n && tensor.Digest(st...) == be.Digest()
	})
	if ck.GetEpoch() != 1 || ck.GetBatchId() != b.sc.rp.batch || len(ck.GetFlow()) == 0 || len(ck.GetDedup()) == 0 {
		t.Fatalf("checkpoint epoch %d batch %d (primary at %d), %d flow pairs, %d key sets", ck.GetEpoch(), ck.GetBatchId(), b.sc.rp.batch, len(ck.GetFlow()), len(ck.GetDedup()))
	}
	if d := durableBySeq(t, b)[n]; d.StateDigest != be.Digest() || d.StateDigest != ck.GetStateDigest() {
		t.Fatalf("last record's state %s, model %s, checkpoint %s", d.StateDigest, be.Digest(), ck.GetStateDigest())
	}
	// Every record's output is the one the sink got.
	d := durableBySeq(t, b)
	r.sink.mu.Lock()
	for id, its := range r.sink.items {
		e := its[0].Lineage[len(its[0].Lineage)-1]
		if e.Model != "b" || d[e.Seq].OutputDigest != e.OutputDigest {
			t.Errorf("req %d: b seq %d output %s, durable %s", id, e.Seq, e.OutputDigest, d[e.Seq].OutputDigest)
		}
	}
	r.sink.mu.Unlock()
	waitFor(t, "the log trimmed to what no checkpoint covers", func() bool {
		left, err := store.Batches(ctx, "b", 0)
		return err == nil && len(left) == 0
	})
	if len(durableRecords(t, spare)) != 0 {
		t.Fatal("the idle spare wrote durable records")
	}
}

// noisyCounter is counterBackend whose state picks up a random
// perturbation on every Infer: like the reference models' completion-order
// reductions, re-executing the same batches gives other outputs. (The
// perturbation is not kept below the state's rounding: the counter grows
// into the thousands, where a tiny one would round away.)
type noisyCounter struct{ *counterBackend }

func (n noisyCounter) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	resp, err := n.counterBackend.Infer(ctx, req)
	if err == nil {
		n.mu.Lock()
		n.state[0] += 0.25 + rand.Float32()
		n.mu.Unlock()
	}
	return resp, err
}

// recordReplies writes the sink's items as a frontend's replies.jsonl
// (the first item per request is the released reply).
func recordReplies(t *testing.T, r *rig, dir string) {
	t.Helper()
	l, err := audit.Open(dir, "frontend", audit.RepliesFile)
	if err != nil {
		t.Fatal(err)
	}
	r.sink.mu.Lock()
	for id, its := range r.sink.items {
		it := its[0]
		rep := audit.Reply{ReqID: fmt.Sprint(id), ReplyDigest: tensor.Digest(it.Tensors...)}
		for _, e := range it.Lineage {
			rep.Lineage = append(rep.Lineage, audit.LineageStep{Model: e.Model, Seq: e.Seq, OutputDigest: e.OutputDigest})
		}
		if err := l.Write(rep); err != nil {
			t.Fatal(err)
		}
	}
	r.sink.mu.Unlock()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// Replay failover: the primary dies with batches after its last
// checkpoint; the spare loads the checkpoint, re-executes the logged
// batches in order with their seqs, sends the sink only the outputs beyond
// what it received, drops the resent duplicates, and continues the
// numbering. With a deterministic model the audit is consistent; with a
// non-deterministic one the checker finds the replies released before the
// failure outside the durable history.
// lossyCounter is counterBackend whose Infer number loseAt (counted from
// when it is armed) applies the batch and then loses its answer
// (Unavailable: a connection reset after processing).
type lossyCounter struct {
	*counterBackend
	loseAt atomic.Int32
}

func (l *lossyCounter) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	resp, err := l.counterBackend.Infer(ctx, req)
	if l.loseAt.Add(-1) == 0 {
		return nil, statusErr(codes.Unavailable, "connection reset by peer")
	}
	return resp, err
}

func TestReplayFailover(t *testing.T) {
	// lost-answer: the spare's backend loses the answer of its third
	// re-executed batch after applying it; the recovery starts again from
	// the checkpoint (a repeat would apply the batch twice: the state
	// would differ from the primary's).
	for _, mode := range []string{"deterministic", "nondeterministic", "lost-answer"} {
		noisy := mode == "nondeterministic"
		t.Run(mode, func(t *testing.T) {
			r, store := replayRig(t, 1000, "1h") // only the initial checkpoint
			a := r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
			mk := func() (Backend, *counterBackend) {
				c := newCounter(4)
				if noisy {
					return noisyCounter{c}, c
				}
				return c, c
			}
			be1, c1 := mk()
			be2, c2 := mk()
			var lossy *lossyCounter
			if mode == "lost-answer" {
				lossy = &lossyCounter{counterBackend: c2}
				be2 = lossy
			}
			b1 := r.startReplay(store, "b", be1, config.RolePrimary, 1, true)
			b2 := r.startReplay(store, "b", be2, config.RoleBackup, 1, false)
			const n = 30
			r.send(1, n)
			waitFor(t, "30 replies", func() bool { return r.sink.count() >= n })
			ctx := context.Background()
			waitFor(t, "all batches logged", func() bool {
				bs, err := store.Batches(ctx, "b", 0)
				return err == nil && len(bs) == int(b1.sc.rp.batch)
			})
			primaryState := c1.Digest()
			b1.kill()
			if got := len(durableRecords(t, b1)); got != 0 {
				t.Fatalf("%d durable records before any checkpoint after the initial one", got)
			}
			before := r.sink.count()
			if lossy != nil {
				lossy.loseAt.Store(3)
			}
			md := metadata.Pairs(ReplayAfterMetadata, config.Frontend+"=25")
			pr, err := r.client(b2.addr).Promote(metadata.NewOutgoingContext(ctx, md), &hamsv1.PromoteRequest{Model: "b", Epoch: 2})
			if err != nil || pr.MaxSeq != n {
				t.Fatalf("Promote: %v %v", pr, err)
			}
			if !noisy && c2.Digest() != primaryState {
				t.Fatal("the replayed state differs from the failed primary's (deterministic model)")
			}
			if noisy && c2.Digest() == primaryState {
				t.Fatal("the noisy model replayed to the very same state")
			}
			r.res.Set("b", b2.addr, 2)
			// The sink gets the re-executed outputs of seqs 26..30 only.
			waitFor(t, "re-executed outputs beyond the sink's position", func() bool { return r.sink.count() == before+5 })
			sum, err := r.client(b2.addr).GetLineageSummary(ctx, &hamsv1.LineageSummaryRequest{})
			if err != nil || sum.MaxOutSeq != n || sum.MaxInByPred["a"] != n || sum.MaxInByPred[config.Frontend] != n {
				t.Fatalf("new primary's summary %v %v", sum, err)
			}
			// A resends everything: the duplicates are dropped by key.
			if _, err := r.client(a.addr).Resend(ctx, &hamsv1.ResendRequest{ToModel: "b", ToAddress: b2.addr, AfterEdgeSeq: 0, Epoch: 2}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "resent duplicates dropped", func() bool { return b2.sc.receiver.Duplicates() >= n })
			r.send(n+1, n+10)
			waitFor(t, "new requests served", func() bool { return r.sink.count() == before+5+10 })
			r.sink.mu.Lock()
			for id := uint64(n + 1); id <= n+10; id++ {
				if s := seqAt(r.sink.items[id][0], "b"); s != id {
					t.Errorf("req %d got b seq %d", id, s)
				}
			}
			r.sink.mu.Unlock()
			// The recovery checkpoint makes the re-executed requests
			// durable (seqs 1..30).
			waitFor(t, "re-executed requests durable", func() bool { return len(durableBySeq(t, b2)) >= n })
			d := durableBySeq(t, b2)
			for s := uint64(1); s <= n; s++ {
				if _, ok := d[s]; !ok {
					t.Fatalf("seq %d not durable after recovery", s)
				}
			}
			dir := t.TempDir()
			recordReplies(t, r, dir)
			if err := copyDurable(b2.audit, dir); err != nil {
				t.Fatal(err)
			}
			rep, err := consistency.CheckWith(dir, nil, consistency.Options{Quiescent: false})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("checker: %s", rep.Summary())
			if noisy && rep.ByKind[consistency.KindNotInHistory] == 0 {
				t.Fatalf("non-deterministic replay: the checker found no reply outside the durable history: %s", rep.Summary())
			}
			if !noisy && rep.Conflicts != 0 {
				t.Fatalf("deterministic replay: %s", rep.Summary())
			}
		})
	}
}

// copyDurable copies the durable records under src into dst/replay.
func copyDurable(src, dst string) error {
	recs, err := audit.ReadAll[audit.Durable](src, audit.DurableFile)
	if err != nil {
		return err
	}
	l, err := audit.Open(dst, "replay", audit.DurableFile)
	if err != nil {
		return err
	}
	for _, d := range recs {
		if err := l.Write(d); err != nil {
			return err
		}
	}
	return l.Close()
}

// Demote makes a replay primary an idle spare; a spare asked to sync only
// takes the epoch. New refuses replay mode without a store.
func TestReplayDemoteAndConfig(t *testing.T) {
	r, store := replayRig(t, 3, "20ms")
	r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
	b := r.startReplay(store, "b", newCounter(4), config.RolePrimary, 1, true)
	sp := r.startReplay(store, "b", newCounter(4), config.RoleBackup, 1, false)
	r.send(1, 8)
	waitFor(t, "replies", func() bool { return r.sink.count() >= 8 })
	ctx := context.Background()
	if _, err := r.client(b.addr).Demote(ctx, &hamsv1.DemoteRequest{Model: "b", Epoch: 2, PrimaryAddress: sp.addr}); err != nil {
		t.Fatal(err)
	}
	if b.sc.Role() != config.RoleBackup {
		t.Fatalf("demoted primary is %s", b.sc.Role())
	}
	if _, err := r.client(sp.addr).Demote(ctx, &hamsv1.DemoteRequest{Model: "b", Epoch: 2, PrimaryAddress: b.addr}); err != nil || sp.sc.epochV.Load() != 2 {
		t.Fatalf("spare sync: %v (epoch %d)", err, sp.sc.epochV.Load())
	}
	if _, err := r.client(sp.addr).Resend(ctx, &hamsv1.ResendRequest{ToModel: config.Frontend, AfterEdgeSeq: 0, Epoch: 2}); err == nil {
		t.Fatal("a spare served Resend")
	}
	_, err := New(Config{Deployment: r.dep, Model: "b", Backend: newCounter(4), Resolver: r.res, GRPCListener: listen(t)})
	if err == nil || !strings.Contains(err.Error(), "ReplayStore") {
		t.Fatalf("New without a replay store: %v", err)
	}
	_, err = New(Config{Deployment: r.dep, Model: "b", Backend: &fakeBackend{}, Resolver: r.res, GRPCListener: listen(t), Replay: store})
	if err == nil || !strings.Contains(err.Error(), "ReadState") {
		t.Fatalf("New with a stateless backend: %v", err)
	}
}

// noReplayStore is a ReplayStore that stores nothing (config tests).
type noReplayStore struct{}

func (noReplayStore) Reset(context.Context, string) error { return nil }
func (noReplayStore) Append(_ context.Context, b []*hamsv1.ReplayBatch) ([]uint64, error) {
	return make([]uint64, len(b)), nil
}
func (noReplayStore) Batches(context.Context, string, uint64) ([]*hamsv1.ReplayBatch, error) {
	return nil, nil
}
func (noReplayStore) Trim(context.Context, string, uint64) error { return nil }
func (noReplayStore) SaveCheckpoint(context.Context, *hamsv1.ReplayCheckpoint, []*hamsv1.Tensor) error {
	return nil
}
func (noReplayStore) LoadCheckpoint(context.Context, string) (*hamsv1.ReplayCheckpoint, []*hamsv1.Tensor, error) {
	return nil, nil, coord.ErrNoCheckpoint
}

// A deposed primary that was never demoted (a false suspicion: the
// topology made it a spare while it ran on) can be promoted at a newer
// epoch: it replaces its state with the newest checkpoint and the log
// after it, like a spare.
func TestReplayDeposedPrimaryPromoted(t *testing.T) {
	r, store := replayRig(t, 1000, "1h")
	r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
	be := newCounter(4)
	b := r.startReplay(store, "b", be, config.RolePrimary, 1, true)
	r.send(1, 12)
	waitFor(t, "replies", func() bool { return r.sink.count() >= 12 })
	ctx := context.Background()
	waitFor(t, "all batches logged", func() bool {
		bs, err := store.Batches(ctx, "b", 0)
		return err == nil && len(bs) == int(b.sc.rp.batch)
	})
	// The initial checkpoint is stored off the request path: without it
	// the promotion re-executes the log from the instance's own state
	// (a run under load once promoted before it was stored).
	waitFor(t, "the initial checkpoint stored", func() bool {
		_, _, err := store.LoadCheckpoint(ctx, "b")
		return err == nil
	})
	before := be.Digest()
	md := metadata.Pairs(ReplayAfterMetadata, config.Frontend+"=12")
	pr, err := r.client(b.addr).Promote(metadata.NewOutgoingContext(ctx, md), &hamsv1.PromoteRequest{Model: "b", Epoch: 2})
	if err != nil || pr.MaxSeq != 12 {
		t.Fatalf("Promote of the deposed primary: %v %v", pr, err)
	}
	if b.sc.Role() != config.RolePrimary || b.sc.epochV.Load() != 2 || be.Digest() != before || be.writes == 0 {
		t.Fatalf("role %s epoch %d, state replayed to the same (deterministic) state %v, state writes %d", b.sc.Role(), b.sc.epochV.Load(), be.Digest() == before, be.writes)
	}
	r.res.Set("b", b.addr, 2)
	r.send(13, 16)
	waitFor(t, "served after the promotion", func() bool { return r.sink.count() >= 16 })
}
