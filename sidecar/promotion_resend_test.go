package sidecar

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

const statelessSink = `
name: sk
mode: nspb
models:
  - {name: c, kind: fake, batch: {size: 4, max_wait: 1ms}}
services:
  - name: s
    edges: [[frontend, c], [c, frontend]]
`

// serveCollector runs a frontend stand-in's sink receiver on a fresh
// listener until the test ends.
func serveCollector(t *testing.T) (*collector, string) {
	t.Helper()
	c := &collector{items: map[uint64][]*hamsv1.Item{}}
	lis := listen(t)
	srv := grpc.NewServer()
	hamsv1.RegisterDataplaneServer(srv, edge.NewReceiver(config.Frontend, c.deliver, nil))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	return c, lis.Addr().String()
}

// A new leader frontend asks a stateless sink to resend what it keeps for
// the frontend edge: the sink resends its retained (acknowledged, not
// completed) items to the new frontend's address at the given epoch.
func TestStatelessSinkResendsToFrontend(t *testing.T) {
	r := newRig(t, statelessSink)
	c := r.start("c", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
	const n = 10
	r.send(1, n)
	waitFor(t, "all replies at the first frontend", func() bool { return r.sink.count() == n })
	snd := c.sc.out.current()[0]
	waitFor(t, "sink edge acknowledged", func() bool { return snd.Retained() == n })
	// Requests 1..3 were answered and completed; the others are not.
	c.sc.completed(&hamsv1.CompletionNotice{ReqIds: []uint64{1, 2, 3}})
	fe2, addr2 := serveCollector(t)
	ctx := context.Background()
	rc := r.client(c.addr)
	rs, err := rc.Resend(ctx, &hamsv1.ResendRequest{ToModel: config.Frontend, ToAddress: addr2, AfterEdgeSeq: 0, Epoch: 1})
	if err != nil || rs.Resent != n-3 {
		t.Fatalf("Resend to the frontend: %v %v", rs, err)
	}
	waitFor(t, "uncompleted replies at the new frontend", func() bool { return fe2.count() == n-3 })
	fe2.mu.Lock()
	r.sink.mu.Lock()
	for id := uint64(4); id <= n; id++ {
		got, want := fe2.items[id], r.sink.items[id]
		if len(got) != 1 || len(want) != 1 || len(got[0].Lineage) == 0 || got[0].Lineage[0].OutputDigest != want[0].Lineage[0].OutputDigest {
			t.Fatalf("req %d: resent %v, first sent %v", id, got, want)
		}
	}
	r.sink.mu.Unlock()
	fe2.mu.Unlock()
	// New traffic follows the resend's address until the topology names
	// a frontend at that epoch.
	r.send(n+1, n+1)
	waitFor(t, "new reply at the new frontend", func() bool { return fe2.count() == n-2 })
	// Bad input: an edge the sink does not have.
	if _, err := rc.Resend(ctx, &hamsv1.ResendRequest{ToModel: "nope", ToAddress: addr2}); status.Code(err) != codes.NotFound {
		t.Fatalf("Resend to a non-successor: %v", err)
	}
}

// orderCoord wraps a Coord: before every Announce it calls hook (which
// may block), and it fails announcements while fail is set.
type orderCoord struct {
	Coord
	mu   sync.Mutex
	hook func(*hamsv1.DurabilityNotice)
	fail bool
}

func (c *orderCoord) Announce(ctx context.Context, n *hamsv1.DurabilityNotice) error {
	c.mu.Lock()
	hook, fail := c.hook, c.fail
	c.mu.Unlock()
	if fail {
		return errors.New("injected announce failure")
	}
	if hook != nil {
		hook(n)
	}
	return c.Coord.Announce(ctx, n)
}

// noticeLog collects the durability notices of a model in stream order.
type noticeLog struct {
	mu sync.Mutex
	ns []*hamsv1.DurabilityNotice
}

func (l *noticeLog) add(n *hamsv1.DurabilityNotice) {
	l.mu.Lock()
	l.ns = append(l.ns, n)
	l.mu.Unlock()
}

func (l *noticeLog) snapshot() []*hamsv1.DurabilityNotice {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*hamsv1.DurabilityNotice(nil), l.ns...)
}

// A promoted stateful primary publishes DurabilityNotice{model, new
// epoch, its max applied seq} before it executes or resends anything of
// the new epoch, and before any other notice of that epoch; a failed
// announcement fails the promotion and leaves the backup as it was. A
// rollback announces its new epoch the same way.
func TestPromotionAnnouncesEpochFirst(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		r := newRig(t, failoverChain)
		var notices noticeLog
		r.wg.Add(1)
		go func() { defer r.wg.Done(); _ = r.co.WatchDurable(r.ctx, []string{"b"}, notices.add) }()
		var mu sync.Mutex
		// Snapshot 1 covers the first batch (with deltas: 2; 1 is the
		// initial state).
		first := firstSnapshot(delta)
		limit := first
		a := r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
		b2be := newCounter(4)
		oc := &orderCoord{}
		b2 := r.start("b", b2be, config.RoleBackup, 1, false, func(s *Sidecar) { oc.Coord = s.cfg.Coord; s.cfg.Coord = oc })
		b1 := r.start("b", newCounter(4), config.RolePrimary, 1, true, holdShipping(&limit, &mu))
		const n = 30
		r.send(1, 4)
		waitFor(t, "b's backup applied the first snapshot", func() bool { _, batch := b2.sc.bk.MaxSeq(); return batch == first })
		r.send(5, n)
		waitFor(t, "replies from b's first primary", func() bool { return r.sink.count() >= n })
		b1.kill()
		maxSeq, _ := b2.sc.bk.MaxSeq()
		if maxSeq == 0 || maxSeq >= n {
			t.Fatalf("backup max seq %d: the test needs released outputs beyond it", maxSeq)
		}
		// Traffic for b goes to the backup from now on; it is refused until
		// the promotion, then executed.
		r.res.Set("b", b2.addr, 2)
		ctx := context.Background()
		rb := r.client(b2.addr)

		oc.mu.Lock()
		oc.fail = true
		oc.mu.Unlock()
		if _, err := rb.Promote(ctx, &hamsv1.PromoteRequest{Model: "b", Epoch: 2}); status.Code(err) != codes.Unavailable {
			t.Fatalf("Promote with Coord down: %v, want Unavailable", err)
		}
		if b2.sc.Role() != config.RoleBackup {
			t.Fatal("a promotion whose announcement failed changed the role")
		}
		if ms, err := rb.GetMaxSeq(ctx, &hamsv1.GetMaxSeqRequest{Model: "b"}); err != nil || ms.MaxSeq != maxSeq {
			t.Fatalf("backup after the failed promotion: %v %v", ms, err)
		}

		type seen struct {
			role     config.Role
			computes int
			resends  uint64
		}
		var at []seen
		oc.mu.Lock()
		oc.fail = false
		oc.hook = func(nt *hamsv1.DurabilityNotice) {
			if nt.GetEpoch() != 2 || len(at) > 0 {
				return
			}
			b2be.mu.Lock()
			c := b2be.computes
			b2be.mu.Unlock()
			var rs uint64
			for _, snd := range b2.sc.out.current() {
				rs += snd.Stats().Resends
			}
			at = append(at, seen{b2.sc.Role(), c, rs})
		}
		oc.mu.Unlock()
		pr, err := rb.Promote(ctx, &hamsv1.PromoteRequest{Model: "b", Epoch: 2})
		if err != nil || pr.MaxSeq != maxSeq {
			t.Fatalf("Promote: %v %v", pr, err)
		}
		oc.mu.Lock()
		got := at
		oc.mu.Unlock()
		if len(got) != 1 || got[0].role != config.RoleBackup || got[0].computes != 0 || got[0].resends != 0 {
			t.Fatalf("state when the epoch-2 notice was published: %+v (want backup, nothing computed or resent)", got)
		}
		// The promoted primary resends its kept outputs and executes new
		// requests only now; every reply completes.
		if _, err := rb.Resend(ctx, &hamsv1.ResendRequest{ToModel: config.Frontend, Epoch: 0}); err != nil {
			t.Fatalf("Resend from the promoted primary: %v", err)
		}
		if _, err := r.client(a.addr).Resend(ctx, &hamsv1.ResendRequest{ToModel: "b", ToAddress: b2.addr, AfterEdgeSeq: maxSeq, Epoch: 2}); err != nil {
			t.Fatal(err)
		}
		r.send(n+1, n+4)
		waitFor(t, "the promoted primary executed requests", func() bool {
			b2be.mu.Lock()
			defer b2be.mu.Unlock()
			return b2be.computes > 0
		})
		// In stream order, the first notice of epoch 2 is the promotion's,
		// at the backup's max applied seq.
		waitFor(t, "the epoch-2 notice", func() bool {
			for _, nt := range notices.snapshot() {
				if nt.GetEpoch() >= 2 {
					return true
				}
			}
			return false
		})
		for _, nt := range notices.snapshot() {
			if nt.GetEpoch() < 2 {
				continue
			}
			if nt.GetEpoch() != 2 || nt.GetDurableSeq() != maxSeq || nt.GetModel() != "b" {
				t.Fatalf("first notice of the new epoch: %v, want b epoch 2 durable %d", nt, maxSeq)
			}
			break
		}

		// Rollback to the kept state at epoch 3 announces that state first.
		b2.sc.roleMu.Lock()
		kept := b2.sc.prim.ship.Applied()
		b2.sc.roleMu.Unlock()
		if _, err := rb.Rollback(ctx, &hamsv1.RollbackRequest{Model: "b", Epoch: 3}); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		b2.sc.roleMu.Lock()
		wantSeq := b2.sc.prim.baseSeq
		b2.sc.roleMu.Unlock()
		if kept == nil || wantSeq < maxSeq {
			t.Fatalf("rollback target seq %d (kept %v), below the promotion's %d", wantSeq, kept != nil, maxSeq)
		}
		waitFor(t, "the epoch-3 notice", func() bool {
			for _, nt := range notices.snapshot() {
				if nt.GetEpoch() == 3 {
					if nt.GetDurableSeq() != wantSeq {
						t.Fatalf("rollback notice %v, want durable %d", nt, wantSeq)
					}
					return true
				}
			}
			return false
		})
	})
}

// cutResolver sends a sidecar's frontend edge to a dead address: its
// outputs to the frontend never leave it.
type cutResolver struct{ edge.Resolver }

func (c cutResolver) Resolve(model string) (string, uint64, bool) {
	if model == config.Frontend {
		return "127.0.0.1:1", 0, true
	}
	return c.Resolver.Resolve(model)
}

func cutFrontendEdge(t *testing.T) func(*Sidecar) {
	return func(s *Sidecar) {
		s.cfg.Resolver = cutResolver{s.cfg.Resolver}
		if err := s.newSenders(); err != nil {
			t.Fatal(err)
		}
	}
}

// The lost primary's outputs never left it (its edge to the frontend was
// cut) while its backup applied them with the state (remus releases
// outputs only then; in nspb they may sit on an edge). Nobody runs those
// requests again, since the promoted state covers them, so the promoted
// backup sends them from its output log: every request reaches the sink.
// (Found by `hams chaos --mode remus`: one request lost per few kills.)
func TestPromotedBackupSendsTheOutputsTheLostPrimaryHeld(t *testing.T) {
	for _, mode := range []string{"nspb", "remus"} {
		t.Run(mode, func(t *testing.T) {
			r := newRig(t, strings.Replace(failoverChain, "mode: nspb", "mode: "+mode, 1))
			r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
			b2 := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
			b1 := r.start("b", newCounter(4), config.RolePrimary, 1, true, cutFrontendEdge(t))
			const n = 20
			r.send(1, n)
			waitFor(t, "b's backup applied every request", func() bool { seq, _ := b2.sc.bk.MaxSeq(); return seq == n })
			if c := r.sink.count(); c != 0 {
				t.Fatalf("%d items reached the sink through the cut edge", c)
			}
			b1.kill()
			if _, err := r.client(b2.addr).Promote(context.Background(), &hamsv1.PromoteRequest{Model: "b", Epoch: 2}); err != nil {
				t.Fatalf("Promote: %v", err)
			}
			r.res.Set("b", b2.addr, 2)
			waitFor(t, "every request at the sink", func() bool {
				r.sink.mu.Lock()
				defer r.sink.mu.Unlock()
				return len(r.sink.items) == n
			})
		})
	}
}
