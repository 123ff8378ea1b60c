package sidecar

import (
	"context"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A backup started after its model ran, whose primary was lost before the
// first full snapshot reached it, holds the model's initial state. It was
// promoted: the model's state restarted at seq 0 under the seqs of
// released replies (a 30-minute soak, 2026-11-26: a replacement backup
// promoted 1.3 s after it started, 28,374 checker conflicts). It must
// refuse, naming how far the model is durable, and stay a backup.
func TestBackupWithoutBaseRefusesPromotion(t *testing.T) {
	r := newRig(t, failoverChain)
	r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
	first := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
	primary := r.start("b", newCounter(4), config.RolePrimary, 1, true, nil)
	applied := func(in *inst) uint64 { seq, _ := in.sc.backupNow().MaxSeq(); return seq }
	synced := func(in *inst) float64 {
		var m dto.Metric
		if err := in.sc.metrics.backupSynced.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	r.send(1, 10)
	waitFor(t, "the first backup applied the wave", func() bool { return applied(first) == 10 && synced(first) == 1 })
	// Its notices are stored at most one per coord.NoticeStoreSpacing:
	// the wave is durable in the stream once the last one is.
	waitFor(t, "the first backup stored its last notice", func() bool {
		return first.sc.backupNow().persist.Stored().GetDurableSeq() == 10
	})
	// ... and counted in its metrics (the count follows the store).
	waitFor(t, "the stores counted in hams_sidecar_backup_notice_stores_total", func() bool {
		var stores dto.Metric
		if err := first.sc.metrics.noticeStores.WithLabelValues("stored").Write(&stores); err != nil {
			t.Fatal(err)
		}
		n := stores.GetCounter().GetValue()
		return n > 0 && n == float64(first.sc.backupNow().persist.Stores())
	})

	// The new backup is known to nobody that ships: the primary goes on
	// shipping to the first one.
	fresh := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
	r.setBackup("b", first.addr)
	if got := synced(fresh); got != 0 {
		t.Fatalf("a backup that took no base reports synced %v", got)
	}
	primary.kill()
	first.kill()

	_, err := r.client(fresh.addr).Promote(context.Background(), &hamsv1.PromoteRequest{Model: "b", Epoch: 2})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "durable up to seq 10") {
		t.Fatalf("Promote of a backup without a base = %v; want FailedPrecondition naming durable seq 10", err)
	}
	if role := fresh.sc.Role(); role != config.RoleBackup {
		t.Fatalf("after the refused promotion the sidecar is a %s", role)
	}
}

// The deployment's first backup, before any snapshot, holds what the
// primary started from: nothing is durable yet, and it is promoted.
func TestFirstBackupPromotedBeforeAnySnapshot(t *testing.T) {
	r := newRig(t, failoverChain)
	r.start("a", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
	backup := r.start("b", newCounter(4), config.RoleBackup, 1, false, nil)
	primary := r.start("b", newCounter(4), config.RolePrimary, 1, true, nil)
	primary.kill()
	resp, err := r.client(backup.addr).Promote(context.Background(), &hamsv1.PromoteRequest{Model: "b", Epoch: 2})
	if err != nil {
		t.Fatalf("Promote of the first backup with nothing durable: %v", err)
	}
	if resp.GetMaxSeq() != 0 {
		t.Fatalf("promoted at max_seq %d, want 0", resp.GetMaxSeq())
	}
	r.res.Set("b", backup.addr, 2)
	r.send(1, 4)
	waitFor(t, "replies through the promoted backup", func() bool {
		r.sink.mu.Lock()
		defer r.sink.mu.Unlock()
		return len(r.sink.items) == 4
	})
}
