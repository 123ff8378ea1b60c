package sidecar

import (
	"context"
	"fmt"
	"time"
)

// A primary cut off from its backup while both still reach the manager
// (issue 18: a partition between the two) ships nothing, so nothing it
// computes becomes durable and the frontend releases no reply: without
// a report the deployment stalls for the whole partition, since the
// manager hears both heartbeats. The primary's sidecar watches its
// shipper: when a snapshot has waited for the backup's acknowledgement,
// with no acknowledgement at all, for backupStuckFactor times the
// manager's suspicion timeout (at least minBackupStuck), it reports the
// backup to the manager (BackupReporter: Manager.ReportFailure with
// itself as reporter), which replaces it (manager/backupreport.go). The
// primary keeps its role and holds its replies meanwhile: nothing is
// released before it is durable at a backup; the snapshots stay queued
// and go to whichever backup the topology names next.
//
// The factor keeps the report behind the manager's own detection of a
// backup that died (one suspicion timeout), so a dead backup is replaced
// once, by the manager, and a report only covers a backup that is alive
// but unreachable from its primary. The floor keeps a slow shipment of a
// large state (tens of MiB) from reading as a partition.
const (
	backupStuckFactor = 3
	minBackupStuck    = 500 * time.Millisecond
	// defaultBackupStuck applies until the manager told its suspicion
	// timeout.
	defaultBackupStuck = 2 * time.Second
	// backupReportTimeout bounds one report.
	backupReportTimeout = 2 * time.Second
)

// BackupReporter is implemented by a BackupResolver that can report the
// backup to the manager (manager/client.Client): the watch runs only
// then.
type BackupReporter interface {
	// ReportBackup reports that this instance, model's primary, cannot
	// ship to the backup at addr.
	ReportBackup(ctx context.Context, model, addr, reason string) error
	// SuspicionTimeout is the manager's (0: not known yet).
	SuspicionTimeout() time.Duration
}

// backupStuckAfter is the report bound for a suspicion timeout st.
func backupStuckAfter(st time.Duration) time.Duration {
	if st <= 0 {
		return defaultBackupStuck
	}
	return max(backupStuckFactor*st, minBackupStuck)
}

// shipWatch decides when a primary reports its backup. Pure: observations
// in, a verdict out; the caller's clock. Invariant: since is the first
// observation, at the current backup address and acknowledgement mark,
// of a snapshot waiting (zero when none waits); a report is due when
// that lasted bound, and then at most once per bound.
type shipWatch struct {
	addr  string
	mark  uint64
	since time.Time
}

// observe records the shipper's state at now: the backup address the
// topology resolves (ok false: none, or this instance itself), whether
// a snapshot waits for its acknowledgement, and the last acknowledged
// batch. report says a report is due: shipping to addr made no progress
// for stuck (>= bound).
func (w *shipWatch) observe(now time.Time, addr string, ok, pending bool, mark uint64, bound time.Duration) (stuck time.Duration, report bool) {
	if !ok || !pending {
		*w = shipWatch{addr: addr, mark: mark}
		return 0, false
	}
	if addr != w.addr || mark != w.mark || w.since.IsZero() {
		*w = shipWatch{addr: addr, mark: mark, since: now}
		return 0, false
	}
	if d := now.Sub(w.since); d >= bound {
		w.since = now
		return d, true
	}
	return 0, false
}

// shipProgress is what the watch reads of the shipper: whether a
// snapshot waits for an acknowledgement, and the last acknowledged batch.
func (sh *shipper) shipProgress() (pending bool, mark uint64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.kept != nil {
		mark = sh.kept.batch
	}
	return len(sh.queue) > 0, mark
}

// backupWatch returns the watch of a replicated primary's shipping, or
// nil when its BackupResolver cannot report (runs in the primary's stage:
// a promotion starts it afresh).
func (sh *shipper) backupWatch() func(context.Context) error {
	rep, ok := sh.h.Backups().(BackupReporter)
	if !ok {
		return nil
	}
	h := sh.h
	return func(ctx context.Context) error {
		var w shipWatch
		self := h.Addr()
		for {
			bound := backupStuckAfter(rep.SuspicionTimeout())
			t := time.NewTimer(max(bound/8, 5*time.Millisecond))
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			addr, _, ok := h.Backups().ResolveBackup(h.Model())
			pending, mark := sh.shipProgress()
			stuck, report := w.observe(time.Now(), addr, ok && addr != self, pending, mark, bound)
			if !report {
				continue
			}
			reason := fmt.Sprintf("no snapshot acknowledged by the backup for %v (bound %v: %d x the suspicion timeout)",
				stuck.Round(time.Millisecond), bound, backupStuckFactor)
			h.Logger().Warn("cannot ship to the backup; reporting it to the manager", "backup", addr, "stuck", stuck, "bound", bound)
			rctx, cancel := context.WithTimeout(ctx, backupReportTimeout)
			err := rep.ReportBackup(rctx, h.Model(), addr, reason)
			cancel()
			if err != nil && ctx.Err() == nil {
				// Reported again after another bound if still stuck.
				h.Logger().Warn("report of the unreachable backup failed", "backup", addr, "err", err)
			}
		}
	}
}
