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
// its replacement. The manager now sends it SyncBackup (a Demote); when
// that is lost (the manager that chose it was killed in that recovery
// round, and the next one found the topology settled: a 30-minute soak,
// 2026-11-27), the snapshot past the gap makes it ask for a base.
func TestBackupChosenAgainInItsEpochTakesANewBase(t *testing.T) {
	for _, sync := range []bool{true, false} {
		t.Run(map[bool]string{true: "synced", false: "sync lost"}[sync], func(t *testing.T) {
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
				if sync {
					ctx := context.Background()
					if _, err := r.client(first.addr).Demote(ctx, &hamsv1.DemoteRequest{Model: "b", Epoch: 1, PrimaryAddress: primary.addr}); err != nil {
						t.Fatalf("SyncBackup of the first backup again: %v", err)
					}
				}
				r.send(31, 50)
				waitFor(t, "the backup chosen again applied the third wave", func() bool { return applied(first) == 50 })
			})
		})
	}
}
