package sidecar

import (
	"testing"

	"github.com/hams-go/hams/internal/config"
)

// An idle primary syncs a new backup: with nothing to ship, its shipper
// still finds the moved backup and ships the last state as the base (a
// primary held by its unapplied bound queues nothing until a backup
// applies, so waiting for the next snapshot would never end).
func TestIdlePrimarySyncsMovedBackup(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		r := newRig(t, failoverChain)
		r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
		b1 := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
		r.start("b", newCounter(4), config.RolePrimary, 1, true, nil)
		r.send(1, 8)
		waitFor(t, "8 replies", func() bool { return r.sink.count() >= 8 })
		waitFor(t, "the first backup applied all 8", func() bool { return maxSeqOf(b1.sc) == 8 })
		// Quiescent primary; the backup moves (start points the resolver at
		// the new one).
		b1.kill()
		b2 := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
		waitFor(t, "the new backup synced while the primary is idle", func() bool { return maxSeqOf(b2.sc) == 8 })
	})
}
