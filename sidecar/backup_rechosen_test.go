package sidecar

import (
	"context"
	"testing"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A backup that was replaced in its epoch (frozen, declared dead, a spare
// made the backup; then the spare lost) and is chosen as the backup again
// keeps its old position: the primary ships it a base (the last state it
// kept) and deltas from there, far beyond what it applied. It must take
// that base as its new start. It took the next snapshot as base only when
// the epoch was newer, so it held every later snapshot as pending behind
// the gap and nothing of the model was durable again: a 10-minute soak
// (2026-11-26) stalled for good after a backup freeze and a later kill of
// its replacement.
func TestBackupChosenAgainInItsEpochTakesANewBase(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		r := newRig(t, failoverChain)
		r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
		first := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
		primary := r.start("b", newCounter(4), config.RolePrimary, 1, true, nil)
		applied := func(in *inst) uint64 { seq, _ := in.sc.bk.MaxSeq(); return seq }
		r.send(1, 10)
		waitFor(t, "the first backup applied the first wave", func() bool { return applied(first) == 10 })

		// The first backup is replaced (it stays alive, a backup of
		// epoch 1 at seq 10).
		spare := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
		r.setBackup("b", spare.addr)
		r.send(11, 30)
		waitFor(t, "the spare applied the second wave", func() bool { return applied(spare) == 30 })
		if got := applied(first); got != 10 {
			t.Fatalf("the replaced backup applied up to %d", got)
		}

		// The spare is lost; the first backup is chosen again.
		spare.kill()
		r.setBackup("b", first.addr)
		ctx := context.Background()
		if _, err := r.client(first.addr).Demote(ctx, &hamsv1.DemoteRequest{Model: "b", Epoch: 1, PrimaryAddress: primary.addr}); err != nil {
			t.Fatalf("SyncBackup of the first backup again: %v", err)
		}
		r.send(31, 50)
		waitFor(t, "the backup chosen again applied the third wave", func() bool { return applied(first) == 50 })
	})
}

// The same, with the SyncBackup of the backup chosen again lost (the
// manager that chose it was killed in that recovery round, and the next
// one found the topology settled: a 30-minute soak, 2026-11-27). The
// primary ships it its last state, a delta far past what it applied; it
// held that as pending behind the gap, and nothing of the model was
// durable again. A snapshot past a gap now makes it ask for a base.
func TestBackupChosenAgainWithoutSyncTakesANewBase(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		r := newRig(t, failoverChain)
		r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
		first := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
		r.start("b", newCounter(4), config.RolePrimary, 1, true, nil)
		applied := func(in *inst) uint64 { seq, _ := in.sc.bk.MaxSeq(); return seq }
		r.send(1, 10)
		waitFor(t, "the first backup applied the first wave", func() bool { return applied(first) == 10 })
		spare := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
		r.setBackup("b", spare.addr)
		r.send(11, 30)
		waitFor(t, "the spare applied the second wave", func() bool { return applied(spare) == 30 })
		spare.kill()
		r.setBackup("b", first.addr) // no SyncBackup this time
		r.send(31, 50)
		waitFor(t, "the backup chosen again applied the third wave", func() bool { return applied(first) == 50 })
	})
}
