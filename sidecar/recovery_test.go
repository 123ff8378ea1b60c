package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// rig runs sidecar instances that can be killed, promoted and demoted one
// by one, over a real Coord on an embedded JetStream, with a frontend
// stand-in (one sender per entry model, a collecting sink receiver).
type rig struct {
	t    *testing.T
	dep  *config.Deployment
	co   *coord.Coord
	res  *edge.StaticResolver
	bres *backupMap
	sink *collector
	fe   map[string]*edge.Sender
	ctx  context.Context
	wg   sync.WaitGroup
	stop context.CancelFunc
}

// inst is one running sidecar.
type inst struct {
	sc    *Sidecar
	be    Backend
	addr  string
	audit string
	kill  context.CancelFunc
	done  chan struct{}
}

func newRig(t *testing.T, yaml string) *rig {
	t.Helper()
	dep, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	nc := natsConn(t)
	ctx, cancel := context.WithCancel(context.Background())
	co, err := coord.Open(ctx, nc, dep.Name, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, dep: dep, co: co, res: edge.NewStaticResolver(nil), bres: &backupMap{m: map[string]string{}},
		sink: &collector{items: map[uint64][]*hamsv1.Item{}}, fe: map[string]*edge.Sender{}, ctx: ctx, stop: cancel}
	t.Cleanup(r.close)
	flis := listen(t)
	r.res.Set(config.Frontend, flis.Addr().String(), 0)
	srv := grpc.NewServer()
	hamsv1.RegisterDataplaneServer(srv, edge.NewReceiver(config.Frontend, r.sink.deliver, nil))
	r.wg.Add(2)
	go func() { defer r.wg.Done(); _ = srv.Serve(flis) }()
	go func() { defer r.wg.Done(); <-ctx.Done(); srv.Stop() }()
	for _, entry := range dep.Services[0].Graph().Entries() {
		s, err := edge.NewSender(edge.SenderConfig{From: config.Frontend, To: entry, Resolver: r.res})
		if err != nil {
			t.Fatal(err)
		}
		r.fe[entry] = s
		r.wg.Add(1)
		go func() { defer r.wg.Done(); _ = s.Run(ctx) }()
	}
	return r
}

func (r *rig) close() {
	r.stop()
	r.wg.Wait()
}

// start runs a sidecar of model in role at epoch. A primary (or stateless
// active) is made the resolver's target when serve is set.
func (r *rig) start(model string, be Backend, role config.Role, epoch uint64, serve bool, tweak func(*Sidecar)) *inst {
	r.t.Helper()
	lis := listen(r.t)
	in := &inst{be: be, addr: lis.Addr().String(), audit: r.t.TempDir(), done: make(chan struct{})}
	cfg := Config{Deployment: r.dep, Model: model, Backend: be, Resolver: r.res, GRPCListener: lis, Role: role,
		Epoch: epoch, AuditDir: in.audit}
	if os.Getenv("HAMS_TEST_LOG") != "" { // debug logs of every rig sidecar, to stderr
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("inst", role.String()+"@"+in.addr)
	}
	if m := r.dep.Model(model); m.Stateful {
		cfg.Coord, cfg.BackupResolver = r.co, r.bres
	}
	sc, err := New(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	in.sc = sc
	if tweak != nil {
		tweak(sc)
	}
	if serve {
		r.res.Set(model, in.addr, epoch)
	}
	if role == config.RoleBackup {
		r.bres.mu.Lock()
		r.bres.m[model] = in.addr
		r.bres.mu.Unlock()
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

func (r *rig) setBackup(model, addr string) {
	r.bres.mu.Lock()
	r.bres.m[model] = addr
	r.bres.mu.Unlock()
}

// send sends requests first..last (one row of value id each).
func (r *rig) send(first, last uint64) {
	for id := first; id <= last; id++ {
		for _, s := range r.fe {
			s.Send(&hamsv1.Item{ReqId: id, Service: "s", StreamId: "s1", Tensors: []*hamsv1.Tensor{row(float32(id), 2)}})
		}
	}
}

func (r *rig) client(addr string) hamsv1.ReplicationClient {
	r.t.Helper()
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = cc.Close() })
	return hamsv1.NewReplicationClient(cc)
}

// durableRecords reads the durable audit records of instances.
func durableRecords(t *testing.T, ins ...*inst) []audit.Durable {
	t.Helper()
	var out []audit.Durable
	for _, in := range ins {
		recs, err := audit.ReadAll[audit.Durable](in.audit, audit.DurableFile)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, recs...)
	}
	return out
}

const failoverChain = `
name: fo
mode: nspb
models:
  - {name: a, kind: fake, batch: {size: 4, max_wait: 1ms}}
  - {name: b, kind: counter, stateful: true, batch: {size: 4, max_wait: 1ms}, placement: {primary: h1, backup: h2}}
services:
  - name: s
    edges: [[frontend, a], [a, b], [b, frontend]]
`

// holdShipping blocks the shipment of every batch above limit until ctx
// ends: the backup lags behind released outputs.
func holdShipping(limit *uint64, mu *sync.Mutex) func(*Sidecar) {
	return func(s *Sidecar) {
		s.cfg.ShipHook = func(ctx context.Context, batch uint64) {
			mu.Lock()
			l := *limit
			mu.Unlock()
			if batch > l {
				<-ctx.Done()
			}
		}
	}
}

// (a) Stateful failover: b's primary dies with outputs released beyond
// what its backup applied; the backup is promoted, a resends after the
// position the backup's state covers, a fresh backup is synced. Every
// request reaches the sink with a b output that is durable, no b seq is
// durable twice with different outputs, and the new primary continued
// from the backup's state.
func TestStatefulFailover(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		r := newRig(t, failoverChain)
		var mu sync.Mutex
		// Snapshot 1 covers the first batch only (the first copy follows the
		// first update); later ones coalesce whatever is computed meanwhile.
		first := firstSnapshot(delta)
		limit := first
		a := r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
		b2be := newCounter(4)
		b2 := r.start("b", b2be, config.RoleBackup, 1, false, nil)
		b1 := r.start("b", newCounter(4), config.RolePrimary, 1, true, holdShipping(&limit, &mu))
		_ = a
		const n = 60
		// A first wave the first snapshot covers, then one the backup
		// never gets.
		r.send(1, 4)
		waitFor(t, "b's backup applied the first snapshot", func() bool { _, batch := b2.sc.bk.MaxSeq(); return batch == first })
		r.send(5, 30)
		waitFor(t, "30 replies from b's first primary", func() bool { return r.sink.count() >= 30 })
		b1.kill()
		rb := r.client(b2.addr)
		ctx := context.Background()
		ms, err := rb.GetMaxSeq(ctx, &hamsv1.GetMaxSeqRequest{Model: "b"})
		if err != nil || ms.BatchId != first || ms.MaxSeq == 0 || ms.MaxSeq >= 30 {
			t.Fatalf("GetMaxSeq: %v %v", ms, err)
		}
		pos, err := rb.GetLineageSummary(ctx, &hamsv1.LineageSummaryRequest{})
		if err != nil || pos.MaxOutSeq != ms.MaxSeq || pos.MaxInByPred["a"] != ms.MaxSeq || pos.MaxInByPred[config.Frontend] != ms.MaxSeq {
			t.Fatalf("backup's own summary: %v %v (max seq %d)", pos, err, ms.MaxSeq)
		}
		// What the backup applied (its model server may still trail it:
		// the promotion writes it first).
		stateAtPromotion := bkStateDigest(b2.sc)
		// A fresh backup for the new primary, then the promotion.
		b3 := r.start("b", newCounter(4), config.RoleBackup, 2, false, nil)
		pr, err := rb.Promote(ctx, &hamsv1.PromoteRequest{Model: "b", Epoch: 2})
		if err != nil || pr.MaxSeq != ms.MaxSeq {
			t.Fatalf("Promote: %v %v", pr, err)
		}
		if _, err := rb.Promote(ctx, &hamsv1.PromoteRequest{Model: "b", Epoch: 2}); err != nil {
			t.Fatalf("repeated Promote: %v", err)
		}
		if _, err := rb.GetMaxSeq(ctx, &hamsv1.GetMaxSeqRequest{Model: "b"}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("GetMaxSeq on the promoted primary: %v", err)
		}
		r.res.Set("b", b2.addr, 2)
		if _, err := r.client(b3.addr).Demote(ctx, &hamsv1.DemoteRequest{Model: "b", Epoch: 2, PrimaryAddress: b2.addr}); err != nil {
			t.Fatalf("SyncBackup: %v", err)
		}
		// A conservative position: requests the promoted state covers come
		// again and must be dropped by request, not executed twice.
		// (Saturating: the first batch, all the backup applied, may hold
		// fewer than 4 requests.)
		after := pos.MaxInByPred["a"] - min(pos.MaxInByPred["a"], 4)
		rs, err := r.client(a.addr).Resend(ctx, &hamsv1.ResendRequest{ToModel: "b", ToAddress: b2.addr, AfterEdgeSeq: after, Epoch: 2})
		if err != nil || rs.Resent == 0 {
			t.Fatalf("Resend: %v %v", rs, err)
		}
		t.Logf("backup max_seq %d, positions %v, resent %d", ms.MaxSeq, pos.MaxInByPred, rs.Resent)
		r.send(31, n)
		// Durable b outputs per seq; every request needs a reply whose b
		// output is among them.
		durable := func() map[uint64]string {
			m := map[uint64]string{}
			for _, d := range durableRecords(t, b2, b3) {
				if d.Model != "b" {
					t.Fatalf("audit record of %q", d.Model)
				}
				if o, ok := m[d.Seq]; ok && o != d.OutputDigest {
					t.Fatalf("b seq %d durable with two outputs", d.Seq)
				}
				m[d.Seq] = d.OutputDigest
			}
			return m
		}
		consistent := func() (int, map[uint64]*hamsv1.Item) {
			d := durable()
			got := map[uint64]*hamsv1.Item{}
			r.sink.mu.Lock()
			defer r.sink.mu.Unlock()
			for id, its := range r.sink.items {
				for _, it := range its {
					for _, e := range it.Lineage {
						if e.Model == "b" && d[e.Seq] == e.OutputDigest && e.OutputDigest != "" {
							if prev := got[id]; prev != nil && tensor.Digest(prev.Tensors...) != tensor.Digest(it.Tensors...) {
								t.Fatalf("req %d: two durable replies with different outputs", id)
							}
							got[id] = it
						}
					}
				}
			}
			return len(got), got
		}
		waitFor(t, "a durable reply for every request", func() bool { k, _ := consistent(); return k == n })
		// The new primary continued from the backup's state: the new backup's
		// base is the state the old backup had applied at max_seq.
		var oldAt, newAt string
		for _, d := range durableRecords(t, b2) {
			if d.Seq == ms.MaxSeq {
				oldAt = d.StateDigest
			}
		}
		for _, d := range durableRecords(t, b3) {
			if d.Seq == ms.MaxSeq {
				newAt = d.StateDigest
			}
		}
		if oldAt != stateAtPromotion || newAt != stateAtPromotion {
			t.Fatalf("state at promotion %s; old backup applied %s, new backup's base %s", stateAtPromotion, oldAt, newAt)
		}
		waitFor(t, "new backup in sync", func() bool { return b3.be.(*counterBackend).Digest() == b2be.Digest() })
		// Resent from after: the ones up to the backup's position are
		// covered by its state.
		if d, want := b2.sc.receiver.Duplicates(), pos.MaxInByPred["a"]-after; d < want {
			t.Fatalf("new primary dropped %d resent requests its state covers, want >= %d", d, want)
		}
		// b's outputs after the failover carry epoch 2: the stale primary's
		// epoch would be refused by a receiver that knows b's epoch.
		if e := b2.sc.host.Epoch(); e != 2 {
			t.Fatalf("new primary stamps epoch %d", e)
		}
	})
}

const statelessChain = `
name: sl
mode: bare
models:
  - {name: a, kind: fake, batch: {size: 4, max_wait: 1ms}}
  - {name: q, kind: fake, batch: {size: 4, max_wait: 1ms}}
  - {name: c, kind: fake, batch: {size: 4, max_wait: 1ms}}
services:
  - name: s
    edges: [[frontend, a], [a, q], [q, c], [c, frontend]]
`

// (b) Stateless failover: q's active dies mid-stream; the standby is
// promoted with start_seq = max_out from q's successor, a resends from a
// conservative position, and c drops what it already had: every request
// reaches the sink exactly once, and the standby's seqs follow start_seq.
func TestStatelessFailover(t *testing.T) {
	r := newRig(t, statelessChain)
	a := r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
	q1 := r.start("q", &stallAfter{Backend: &fakeBackend{bias: 10}, calls: 3}, config.RolePrimary, 1, true, nil)
	q2 := r.start("q", &fakeBackend{bias: 10}, config.RolePrimary, 1, false, nil) // hot standby
	c := r.start("c", &fakeBackend{bias: 100}, config.RolePrimary, 1, true, nil)
	r.send(1, 40)
	waitFor(t, "some replies", func() bool { return r.sink.count() >= 1 })
	q1.kill()
	ctx := context.Background()
	sum, err := r.client(c.addr).GetLineageSummary(ctx, &hamsv1.LineageSummaryRequest{FailedModel: "q"})
	if err != nil || sum.MaxOutSeq == 0 || sum.MaxOutSeq >= 40 || sum.MaxInByPred["a"] == 0 || sum.MaxInByPred[config.Frontend] == 0 {
		t.Fatalf("successor's summary: %v %v", sum, err)
	}
	if _, ok := sum.MaxInByPred["c"]; ok {
		t.Fatalf("summary names a model downstream of q: %v", sum.MaxInByPred)
	}
	pr, err := r.client(q2.addr).Promote(ctx, &hamsv1.PromoteRequest{Model: "q", Epoch: 2, StartSeq: sum.MaxOutSeq})
	if err != nil || pr.MaxSeq != sum.MaxOutSeq {
		t.Fatalf("Promote standby: %v %v", pr, err)
	}
	r.res.Set("q", q2.addr, 2)
	after := sum.MaxInByPred["a"] - min(sum.MaxInByPred["a"], 5)
	rs, err := r.client(a.addr).Resend(ctx, &hamsv1.ResendRequest{ToModel: "q", ToAddress: q2.addr, AfterEdgeSeq: after, Epoch: 2})
	if err != nil || rs.Resent == 0 {
		t.Fatalf("Resend: %v %v", rs, err)
	}
	r.send(41, 60)
	waitFor(t, "every request at the sink", func() bool {
		r.sink.mu.Lock()
		defer r.sink.mu.Unlock()
		return len(r.sink.items) == 60
	})
	dups := sum.MaxInByPred["a"] - after
	waitFor(t, "duplicates dropped by c", func() bool { return c.sc.receiver.Duplicates() >= dups })
	r.sink.mu.Lock()
	defer r.sink.mu.Unlock()
	for id, its := range r.sink.items {
		if len(its) != 1 {
			t.Fatalf("req %d reached the sink %d times", id, len(its))
		}
		if qs := seqAt(its[0], "q"); id > 40 && qs <= sum.MaxOutSeq {
			t.Fatalf("req %d: standby's q seq %d not after start_seq %d", id, qs, sum.MaxOutSeq)
		}
	}
}

// (c) Rollback (correlated failure): the backup lags and dies; the primary
// reinstalls exactly the state the backup last applied, forgets what came
// after, and re-executes resent requests with seqs after the kept one,
// dropping resent requests its kept state covers.
func TestRollbackRestoresKeptState(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		r := newRig(t, fmt.Sprintf(oneStateful, "nspb"))
		var mu sync.Mutex
		limit := firstSnapshot(delta)
		pbe, bbe := newCounter(8), newCounter(8)
		back := r.start("a", bbe, config.RoleBackup, 1, false, nil)
		prim := r.start("a", pbe, config.RolePrimary, 1, true, holdShipping(&limit, &mu))
		// A first wave the first snapshot covers, then one the backup
		// never gets.
		r.send(1, 4)
		waitFor(t, "backup applied the first snapshot", func() bool { _, b := back.sc.bk.MaxSeq(); return b == limit })
		r.send(5, 20)
		waitFor(t, "20 replies", func() bool { return r.sink.count() == 20 })
		// The primary learns of the apply asynchronously (the ack's applied
		// flag or the durability notice): its rollback target must be batch 2
		// before the backup dies.
		waitFor(t, "primary knows the first snapshot applied", func() bool { a := prim.sc.prim.ship.Applied(); return a != nil && a.batch == limit })
		keptSeq, _ := back.sc.bk.MaxSeq()
		waitFor(t, "the backup's model server has what it applied", func() bool { return bbe.Digest() == bkStateDigest(back.sc) })
		kept := bbe.Digest()
		bbe.mu.Lock()
		keptVersion := bbe.version
		bbe.mu.Unlock()
		if pbe.Digest() == kept {
			t.Fatal("primary did not move past the backup")
		}
		back.kill()
		ctx := context.Background()
		rc := r.client(prim.addr)
		rb, err := rc.Rollback(ctx, &hamsv1.RollbackRequest{Model: "a", Epoch: 2})
		if err != nil || rb.StateVersion != keptVersion {
			t.Fatalf("Rollback: %v %v (kept version %d)", rb, err, keptVersion)
		}
		if got := pbe.Digest(); got != kept {
			t.Fatalf("state after rollback %s, backup applied %s", got, kept)
		}
		sum, err := rc.GetLineageSummary(ctx, &hamsv1.LineageSummaryRequest{})
		if err != nil || sum.MaxOutSeq != keptSeq || sum.MaxInByPred[config.Frontend] != keptSeq {
			t.Fatalf("summary after rollback: %v %v (kept seq %d)", sum, err, keptSeq)
		}
		r.res.Set("a", prim.addr, 2)
		// Fully conservative resend: the kept requests come again too
		// (all of them acknowledged, so all retained: acks are paced).
		waitFor(t, "entry edge acknowledged", func() bool { return r.fe["a"].Backlog() == 0 })
		if n := r.fe["a"].Resend(edge.ResendSpec{After: 0}); n != 20 {
			t.Fatalf("frontend resent %d", n)
		}
		want := 20 + int(20-keptSeq)
		waitFor(t, "re-executed requests", func() bool { return r.sink.count() >= want })
		waitFor(t, "kept requests dropped", func() bool { return prim.sc.receiver.Duplicates() == keptSeq })
		r.sink.mu.Lock()
		defer r.sink.mu.Unlock()
		if r.sink.n != want {
			t.Fatalf("%d sink items, want %d", r.sink.n, want)
		}
		for id := keptSeq + 1; id <= 20; id++ {
			its := r.sink.items[id]
			if len(its) != 2 || seqAt(its[1], "a") <= keptSeq {
				t.Fatalf("req %d after rollback: %v", id, its)
			}
		}
	})
}

// (d) Demote: the backup is promoted while the old primary lives; the old
// primary becomes a backup, refuses traffic, and after syncing holds the
// new primary's state exactly.
func TestDemotedPrimarySyncsFromNewPrimary(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		r := newRig(t, fmt.Sprintf(oneStateful, "nspb"))
		be1, be2 := newCounter(8), newCounter(8)
		b2 := r.start("a", be2, config.RoleBackup, 1, false, nil)
		b1 := r.start("a", be1, config.RolePrimary, 1, true, nil)
		r.send(1, 20)
		waitFor(t, "20 replies", func() bool { return r.sink.count() == 20 })
		waitFor(t, "backup durable", func() bool { s, _ := b2.sc.bk.MaxSeq(); return s == 20 })
		ctx := context.Background()
		if _, err := r.client(b2.addr).Promote(ctx, &hamsv1.PromoteRequest{Model: "a", Epoch: 2}); err != nil {
			t.Fatal(err)
		}
		r.setBackup("a", b1.addr)
		r.res.Set("a", b2.addr, 2)
		rc1 := r.client(b1.addr)
		if _, err := rc1.Demote(ctx, &hamsv1.DemoteRequest{Model: "a", Epoch: 2, PrimaryAddress: b2.addr}); err != nil {
			t.Fatalf("Demote: %v", err)
		}
		if _, err := rc1.Demote(ctx, &hamsv1.DemoteRequest{Model: "a", Epoch: 2, PrimaryAddress: b2.addr}); err != nil {
			t.Fatalf("repeated Demote: %v", err)
		}
		if _, err := rc1.Demote(ctx, &hamsv1.DemoteRequest{Model: "a", Epoch: 1}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("Demote at an older epoch: %v", err)
		}
		if b1.sc.Role() != config.RoleBackup {
			t.Fatalf("old primary is a %s", b1.sc.Role())
		}
		r.send(21, 40)
		// Not count: the promoted primary resent replies 1-20, which
		// this sink keeps, so the total passes 40 once 21-40 arrive.
		waitFor(t, "replies to all 40 requests", func() bool { return r.sink.distinct() == 40 })
		// Each execution names the epoch of the instance that ran it (a
		// re-execution after a failover is a new item downstream even
		// when it repeats seq and output).
		r.sink.mu.Lock()
		for id, its := range r.sink.items {
			want := uint64(1)
			if id > 20 {
				want = 2
			}
			for _, it := range its {
				if ep := it.GetLineage()[len(it.GetLineage())-1].GetEpoch(); ep != want {
					r.sink.mu.Unlock()
					t.Fatalf("req %d executed at epoch %d, want %d", id, ep, want)
				}
			}
		}
		r.sink.mu.Unlock()
		waitFor(t, "demoted primary in sync", func() bool {
			s, _ := b1.sc.backupNow().MaxSeq()
			return s == 40 && be1.Digest() == be2.Digest()
		})
		// A demoted primary refuses data-plane traffic.
		cc, err := grpcx.Dial(b1.addr, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		st, err := hamsv1.NewDataplaneClient(cc).Forward(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&hamsv1.ForwardBatch{FromModel: config.Frontend, ToModel: "a", Items: []*hamsv1.Item{{EdgeSeq: 1, ReqId: 99}}}); err != nil {
			t.Fatal(err)
		}
		if ack, err := st.Recv(); err == nil && ack.Error == "" {
			t.Fatalf("backup accepted traffic: %v", ack)
		}
	})
}

// A promoted backup's shipper does not ship to itself while the topology
// still names it as the backup (before the manager rewires): it waits for
// the change, where it used to stream the whole state to itself and be
// refused (FailedPrecondition, a retry, tens of ms of every failover).
func TestPromotedBackupWaitsForRewireInsteadOfShippingToItself(t *testing.T) {
	r := newRig(t, fmt.Sprintf(oneStateful, "nspb"))
	be1, be2 := newCounter(8), newCounter(8)
	b2 := r.start("a", be2, config.RoleBackup, 1, false, nil)
	b1 := r.start("a", be1, config.RolePrimary, 1, true, nil)
	r.send(1, 20)
	waitFor(t, "backup durable", func() bool { s, _ := b2.sc.bk.MaxSeq(); return s == 20 })
	ctx := context.Background()
	if _, err := r.client(b2.addr).Promote(ctx, &hamsv1.PromoteRequest{Model: "a", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	// The backup resolver still names b2 itself.
	r.res.Set("a", b2.addr, 2)
	r.send(21, 30)
	waitFor(t, "the new primary's replies", func() bool { return r.sink.distinct() == 30 })
	waitFor(t, "shipper waiting for the rewire", func() bool { return counterOf(b2.sc.metrics.shipSelf) > 0 })
	if n := counterOf(b2.sc.metrics.shipRetries); n != 0 {
		t.Fatalf("%v shipments failed before the rewire (shipped to itself)", n)
	}
	// Rewired: the old primary becomes the backup and catches up.
	if _, err := r.client(b1.addr).Demote(ctx, &hamsv1.DemoteRequest{Model: "a", Epoch: 2, PrimaryAddress: b2.addr}); err != nil {
		t.Fatal(err)
	}
	r.setBackup("a", b1.addr)
	waitFor(t, "demoted primary in sync", func() bool {
		s, _ := b1.sc.backupNow().MaxSeq()
		return s == 30 && be1.Digest() == be2.Digest()
	})
}

// (e) Stale epochs: once the topology knows a model at a newer epoch, the
// deposed instance's batches are refused; the promoted one's (stamped with
// the new epoch) pass.
func TestStaleEpochTrafficRefused(t *testing.T) {
	r := newRig(t, statelessChain)
	a1 := r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
	a2 := r.start("a", &fakeBackend{bias: 2}, config.RolePrimary, 1, false, nil)
	r.start("q", &fakeBackend{}, config.RolePrimary, 1, true, nil)
	r.start("c", &fakeBackend{}, config.RolePrimary, 1, true, nil)
	r.send(1, 5)
	waitFor(t, "replies via a1", func() bool { return r.sink.count() == 5 })
	if _, err := r.client(a2.addr).Promote(context.Background(), &hamsv1.PromoteRequest{Model: "a", Epoch: 2, StartSeq: 5}); err != nil {
		t.Fatal(err)
	}
	r.res.Set("a", a2.addr, 2)
	r.send(6, 10)
	waitFor(t, "replies via a2", func() bool { return r.sink.count() == 10 })
	// The deposed a1 still gets traffic from a stale frontend.
	stale := edge.NewStaticResolver(map[string]string{"a": a1.addr})
	snd, err := edge.NewSender(edge.SenderConfig{From: config.Frontend, To: "a", Resolver: stale})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = snd.Run(ctx) }()
	defer func() { cancel(); <-done }()
	snd.Send(&hamsv1.Item{ReqId: 100, Tensors: []*hamsv1.Tensor{row(1, 2)}})
	waitFor(t, "a1 executed the stale request", func() bool { return snd.Backlog() == 0 })
	waitFor(t, "a1's batch to q refused", func() bool {
		for _, s := range a1.sc.out.current() {
			if s.Stats().Reconnects > 0 && s.Backlog() > 0 {
				return true
			}
		}
		return false
	})
	r.sink.mu.Lock()
	_, leaked := r.sink.items[100]
	r.sink.mu.Unlock()
	if leaked {
		t.Fatal("the deposed instance's output reached the sink")
	}
	if e := a2.sc.host.Epoch(); e != 2 {
		t.Fatalf("promoted instance stamps epoch %d", e)
	}
	// Orders that make no sense for a stateless model.
	rc := r.client(a2.addr)
	bg := context.Background()
	if _, err := rc.Demote(bg, &hamsv1.DemoteRequest{Model: "a", Epoch: 3}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Demote of a stateless model: %v", err)
	}
	if _, err := rc.Rollback(bg, &hamsv1.RollbackRequest{Model: "a", Epoch: 3}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Rollback of a stateless model: %v", err)
	}
	if _, err := rc.Promote(bg, &hamsv1.PromoteRequest{Model: "a", Epoch: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Promote at an older epoch: %v", err)
	}
	if _, err := rc.GetMaxSeq(bg, &hamsv1.GetMaxSeqRequest{Model: "a"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("GetMaxSeq of a stateless model: %v", err)
	}
}

// (f) LineageSummary on a join graph: max_in_by_pred is the contiguous
// prefix, not the maximum; consumed_beyond looks at executed requests.
func TestLineageSummaryJoinGraph(t *testing.T) {
	dep, err := config.Parse([]byte(`
name: j
mode: bare
models:
  - {name: a, kind: fake}
  - {name: b, kind: fake}
  - {name: c, kind: fake}
services:
  - name: s
    edges: [[frontend, a], [frontend, b], [a, b], [b, c], [c, frontend]]
`))
	if err != nil {
		t.Fatal(err)
	}
	g := dep.Services[0].Graph()
	// b joins frontend and a and executes req 2 before req 1.
	bseq := map[uint64]uint64{1: 2, 2: 1, 3: 3, 4: 4, 5: 5, 6: 6}
	lin := func(req uint64) []*hamsv1.LineageEntry {
		return []*hamsv1.LineageEntry{
			{PredModel: config.Frontend, PredSeq: req, Model: "a", Seq: req},
			{PredModel: config.Frontend, PredSeq: req, Model: "b", Seq: bseq[req]},
			{PredModel: "a", PredSeq: req, Model: "b", Seq: bseq[req]},
		}
	}
	x := newLineageIndex()
	for _, req := range []uint64{2, 1, 3, 4, 6} { // 5 is still on its way
		x.received([]*hamsv1.Item{{ReqId: req, FromModel: "b", Lineage: lin(req)}})
		own := append(lin(req), &hamsv1.LineageEntry{PredModel: "b", PredSeq: bseq[req], Model: "c", Seq: req})
		x.executed([]execRec{{seq: req, lin: own}})
	}
	s := x.summary(g, "c", "b", 5, false)
	if s.MaxOutSeq != 6 || s.MaxInByPred["a"] != 4 || s.MaxInByPred[config.Frontend] != 4 || len(s.MaxInByPred) != 2 || !s.ConsumedBeyond {
		t.Fatalf("summary about b: %v", s)
	}
	if s := x.summary(g, "c", "b", 6, false); s.ConsumedBeyond {
		t.Fatalf("consumed beyond 6: %v", s)
	}
	x.received([]*hamsv1.Item{{ReqId: 5, FromModel: "b", Lineage: lin(5)}})
	if s := x.summary(g, "c", "b", 6, false); s.MaxInByPred["a"] != 6 || s.MaxInByPred[config.Frontend] != 6 {
		t.Fatalf("after the gap filled: %v", s)
	}
	// About itself: c's executed requests (b seqs 1..4 and 6 reached c).
	self := x.summary(g, "c", "", 0, false)
	if self.MaxOutSeq != 6 || self.MaxInByPred["b"] != 4 || self.MaxInByPred["a"] != 4 || self.ConsumedBeyond {
		t.Fatalf("own summary: %v", self)
	}
	// A cut (rollback to seq 2) forgets the rest, including the dedup
	// keys of the forgotten requests.
	x.cut(2)
	if self := x.summary(g, "c", "", 0, false); self.MaxOutSeq != 2 || self.MaxInByPred["b"] != 2 {
		t.Fatalf("after cut: %v", self)
	}
}

// stallAfter serves calls batches, then blocks every Infer until its
// context ends (a host that stops answering).
type stallAfter struct {
	Backend
	mu    sync.Mutex
	calls int
}

func (b *stallAfter) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	b.mu.Lock()
	b.calls--
	stall := b.calls < 0
	b.mu.Unlock()
	if stall {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return b.Backend.Infer(ctx, req)
}

// Failover of a stateful model fed by a stateful one through a stateless
// hop: a (stateful primary) resends from its output log to the first hop
// p, which runs the resent requests again (they are exact resends, not
// duplicates to drop) toward b's promoted backup, which drops the ones its
// state covers.
func TestResendThroughStatelessFirstHop(t *testing.T) {
	r := newRig(t, twoStateful)
	var mu sync.Mutex
	limit := uint64(2)
	r.start("a", newCounter(4), config.RoleBackup, 1, false, nil)
	a := r.start("a", newCounter(4), config.RolePrimary, 1, true, nil)
	p := r.start("p", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
	b2be := newCounter(4)
	b2 := r.start("b", b2be, config.RoleBackup, 1, false, nil)
	b1 := r.start("b", newCounter(4), config.RolePrimary, 1, true, holdShipping(&limit, &mu))
	const n = 8
	r.send(1, n)
	waitFor(t, "all replies", func() bool { return r.sink.count() == n })
	waitFor(t, "b's backup applied batch 2", func() bool { _, batch := b2.sc.bk.MaxSeq(); return batch == 2 })
	b1.kill()
	ctx := context.Background()
	rb := r.client(b2.addr)
	pos, err := rb.GetLineageSummary(ctx, &hamsv1.LineageSummaryRequest{})
	if err != nil || pos.MaxInByPred["a"] == 0 || pos.MaxInByPred["p"] == 0 {
		t.Fatalf("backup's positions: %v %v", pos, err)
	}
	b3 := r.start("b", newCounter(4), config.RoleBackup, 2, false, nil)
	if _, err := rb.Promote(ctx, &hamsv1.PromoteRequest{Model: "b", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	r.res.Set("b", b2.addr, 2)
	after := pos.MaxInByPred["a"] - min(pos.MaxInByPred["a"], 2)
	rs, err := r.client(a.addr).Resend(ctx, &hamsv1.ResendRequest{ToModel: "p", ToAddress: p.addr, AfterEdgeSeq: after, Epoch: 1})
	if err != nil || rs.Resent != uint64(n)-after {
		t.Fatalf("Resend from the output log: %v %v (after %d)", rs, err, after)
	}
	waitFor(t, "a durable b output for every request", func() bool {
		d := map[uint64]string{}
		for _, rec := range durableRecords(t, b2, b3) {
			d[rec.Seq] = rec.OutputDigest
		}
		r.sink.mu.Lock()
		defer r.sink.mu.Unlock()
		ok := 0
		for _, its := range r.sink.items {
		found:
			for _, it := range its {
				for _, e := range it.Lineage {
					if e.Model == "b" && d[e.Seq] == e.OutputDigest {
						ok++
						break found
					}
				}
			}
		}
		return ok == n
	})
	if d := b2.sc.receiver.Duplicates(); d < pos.MaxInByPred["a"]-after {
		t.Fatalf("promoted b dropped %d covered requests, want >= %d", d, pos.MaxInByPred["a"]-after)
	}
}

// counterOf reads a counter.
func counterOf(c prometheus.Counter) float64 {
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
