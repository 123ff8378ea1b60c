package sidecar

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A primary failed over while it could not hear (a false suspicion: its
// backup was promoted at epoch 2) learns it from the topology and stops
// acting as primary before any order reaches it: no snapshot is shipped
// (the topology still names its old backup, now the new primary, as the
// backup here: shipping would be refused and retried forever), traffic is
// refused, a Promote is refused; a Demote makes it a backup that syncs from
// the new primary.
func TestDeposedPrimaryStopsActingAsPrimary(t *testing.T) {
	r := newRig(t, fmt.Sprintf(oneStateful, "nspb"))
	be1, be2 := newCounter(8), newCounter(8)
	b2 := r.start("a", be2, config.RoleBackup, 1, false, nil)
	var shipsAfter atomic.Int64
	var deposed atomic.Bool
	b1 := r.start("a", be1, config.RolePrimary, 1, true, func(s *Sidecar) {
		s.cfg.ShipHook = func(context.Context, uint64) {
			if deposed.Load() {
				shipsAfter.Add(1)
			}
		}
	})
	r.send(1, 20)
	waitFor(t, "20 replies", func() bool { return r.sink.count() == 20 })
	waitFor(t, "backup durable", func() bool { s, _ := b2.sc.bk.MaxSeq(); return s == 20 })
	ctx := context.Background()
	if _, err := r.client(b2.addr).Promote(ctx, &hamsv1.PromoteRequest{Model: "a", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	// The rewire: b2 serves a at epoch 2. The old primary's backup
	// resolver is left naming b2 (as a stale topology would).
	r.res.Set("a", b2.addr, 2)
	waitFor(t, "the old primary deposed", func() bool { return b1.sc.Role() == RoleDeposed })
	deposed.Store(true)
	if got := b1.sc.epochV.Load(); got != 1 {
		t.Fatalf("deposed primary's epoch %d, want its own 1", got)
	}
	rc1 := r.client(b1.addr)
	if _, err := rc1.Promote(ctx, &hamsv1.PromoteRequest{Model: "a", Epoch: 3}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Promote of a deposed primary = %v, want FailedPrecondition", err)
	}
	if _, err := rc1.Resend(ctx, &hamsv1.ResendRequest{ToModel: config.Frontend, Epoch: 2}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Resend from a deposed primary = %v, want FailedPrecondition", err)
	}
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
		t.Fatalf("deposed primary accepted traffic: %v", ack)
	}
	// Traffic goes on at the new primary; the deposed one ships nothing.
	r.setBackup("a", b1.addr)
	r.send(21, 30)
	waitFor(t, "replies to all 30 requests", func() bool { return r.sink.distinct() == 30 })
	if n := shipsAfter.Load(); n != 0 {
		t.Fatalf("the deposed primary shipped %d snapshots", n)
	}
	// Demoted: a backup synced from the new primary.
	if _, err := rc1.Demote(ctx, &hamsv1.DemoteRequest{Model: "a", Epoch: 2, PrimaryAddress: b2.addr}); err != nil {
		t.Fatalf("Demote of a deposed primary: %v", err)
	}
	if b1.sc.Role() != config.RoleBackup {
		t.Fatalf("demoted deposed primary is a %s", b1.sc.Role())
	}
	r.send(31, 40)
	waitFor(t, "replies to all 40 requests", func() bool { return r.sink.distinct() == 40 })
	waitFor(t, "demoted primary in sync", func() bool {
		s, _ := b1.sc.backupNow().MaxSeq()
		return s == 40 && be1.Digest() == be2.Digest()
	})
}

// A deposed primary that the topology lists as its model's backup (the
// manager re-roled it, as after an upstream failover that rolled this
// model back) demotes itself without waiting for the Demote RPC: the new
// primary's snapshots are taken, replies flow, and the Demote that comes
// later is a no-op.
func TestDeposedPrimaryListedAsBackupDemotesItself(t *testing.T) {
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
	// The rewire: b2 serves a at epoch 2, b1 is its backup.
	r.setBackup("a", b1.addr)
	r.res.Set("a", b2.addr, 2)
	waitFor(t, "the old primary a backup without a Demote", func() bool { return b1.sc.Role() == config.RoleBackup })
	r.send(21, 40)
	waitFor(t, "replies to all 40 requests", func() bool { return r.sink.distinct() == 40 })
	waitFor(t, "the self-demoted primary in sync", func() bool {
		s, _ := b1.sc.backupNow().MaxSeq()
		return s == 40 && be1.Digest() == be2.Digest()
	})
	if _, err := r.client(b1.addr).Demote(ctx, &hamsv1.DemoteRequest{Model: "a", Epoch: 2, PrimaryAddress: b2.addr}); err != nil {
		t.Fatalf("a late Demote: %v", err)
	}
	if b1.sc.Role() != config.RoleBackup {
		t.Fatalf("after a late Demote: %s", b1.sc.Role())
	}
}
