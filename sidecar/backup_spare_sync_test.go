package sidecar

import (
	"context"
	"testing"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A backup lost while the primary's snapshots are on their way to it is
// replaced by a spare: recovery points the topology at the spare (the
// primary ships it a base at once) and then sends it SyncBackup, which may
// come before, during or after that base. Whatever the order, and with no
// request after the loss (closed-loop clients all wait for replies that
// depend on those snapshots), everything the primary copied becomes
// durable at the spare. Written for a CI chaos run (TestChaosFreezes,
// 2026-11-27) that stalled for good after such a loss; it passed on that
// build too, so this order is not that stall's cause: it pins the
// behaviour.
// (A stateful model's spare runs as a backup; it is registered as a
// standby until recovery rewires it.)
func TestSpareMadeBackupAppliesWhatItsLostPredecessorHadPending(t *testing.T) {
	for _, when := range []string{"before the base", "with the base", "after the base"} {
		t.Run(when, func(t *testing.T) {
			bothStateKinds(t, func(t *testing.T, delta bool) {
				r := newRig(t, failoverChain)
				r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
				first := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
				primary := r.start("b", newCounter(4), config.RolePrimary, 1, true, nil)
				applied := func(in *inst) uint64 { seq, _ := in.sc.bk.MaxSeq(); return seq }
				r.send(1, 10)
				waitFor(t, "the first backup applied the first wave", func() bool { return applied(first) == 10 })

				spare := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
				sync := func() {
					if _, err := r.client(spare.addr).Demote(context.Background(), &hamsv1.DemoteRequest{Model: "b", Epoch: 1, PrimaryAddress: primary.addr}); err != nil {
						t.Errorf("SyncBackup of the spare: %v", err)
					}
				}
				// The second wave is under way when the first backup is lost.
				r.send(11, 30)
				first.kill()
				if when == "before the base" {
					sync()
				}
				r.setBackup("b", spare.addr)
				switch when {
				case "with the base":
					sync()
				case "after the base":
					waitFor(t, "the spare took a base", func() bool { return applied(spare) > 0 })
					sync()
				}
				waitFor(t, "the spare applied the second wave", func() bool { return applied(spare) == 30 })
				r.send(31, 40)
				waitFor(t, "the spare applied the third wave", func() bool { return applied(spare) == 40 })
			})
		})
	}
}
