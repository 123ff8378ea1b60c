package sidecar

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protocol/nspb"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// snap builds a copied snapshot covering batches batches with one request
// per entry of pfmSeqs (seqs from firstSeq; the PFM "p" at pfmSeqs[i]),
// each with rows[i] output rows of width 2 (row values: seq*10+row).
func snap(firstSeq uint64, batches int, pfmSeqs []uint64, rows []uint32, stateVal float32, at time.Time) *snapshot {
	var (
		recs []*hamsv1.RequestRecord
		out  []float32
		n    int64
		seq  uint64
	)
	for i, ps := range pfmSeqs {
		seq = firstSeq + uint64(i)
		recs = append(recs, &hamsv1.RequestRecord{ReqId: seq + 100, Seq: seq, Lineage: []*hamsv1.LineageEntry{
			{PredModel: "frontend", PredSeq: seq + 100, Model: "p", Seq: ps},
			{PredModel: "p", PredSeq: ps, Model: "m", Seq: seq, OutputDigest: fmt.Sprint("o", seq)},
		}})
		for r := range rows[i] {
			out = append(out, float32(seq*10+uint64(r)), float32(seq*10+uint64(r)))
			n++
		}
	}
	state := []*hamsv1.Tensor{tensor.FromFloat32("s", []int64{2}, []float32{stateVal, stateVal})}
	return &snapshot{last: firstSeq, batches: batches, seq: seq, state: state, copiedAt: at, header: &hamsv1.SnapshotHeader{
		Model: "m", Epoch: 1, StateVersion: uint64(stateVal), Requests: recs,
		StateTensors: []*hamsv1.TensorSpec{{Name: "s", Datatype: tensor.FP32, Shape: []int64{2}}}, StateBytes: 8,
		Outputs: []*hamsv1.Tensor{tensor.FromFloat32("out", []int64{n, 2}, out)}, OutputRows: rows,
	}}
}

func testShipper() *shipper {
	return newShipper(&sidecarHost{log: slog.New(slog.DiscardHandler), metrics: newMetrics(prometheus.NewRegistry(), "m")})
}

// Coalescing keeps the records of every covered batch in order, ships the
// newest state, joins outputs row-wise so each request's rows are its
// own, and yields deps that are the maxima over all covered requests.
func TestMergeSnapshots(t *testing.T) {
	t0 := time.Unix(100, 0)
	sns := []*snapshot{
		snap(1, 1, []uint64{5, 3}, []uint32{1, 1}, 1, t0),
		snap(3, 2, []uint64{9, 7, 8}, []uint32{1, 2, 1}, 2, t0.Add(time.Second)),
		snap(6, 1, []uint64{6}, []uint32{3}, 3, t0.Add(2*time.Second)),
	}
	if m, err := mergeSnapshots(sns[:1]); err != nil || m != sns[0] {
		t.Fatalf("merge of one snapshot: %v %v", m, err)
	}
	m, err := mergeSnapshots(sns)
	if err != nil {
		t.Fatal(err)
	}
	h := m.header
	var seqs []uint64
	for _, r := range h.GetRequests() {
		seqs = append(seqs, r.GetSeq())
	}
	if !slices.Equal(seqs, []uint64{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("merged records %v", seqs)
	}
	if m.batches != 4 || m.seq != 6 || !m.copiedAt.Equal(t0) || m.taken || m.batch != 0 {
		t.Fatalf("merged: batches %d seq %d copiedAt %v taken %v batch %d", m.batches, m.seq, m.copiedAt, m.taken, m.batch)
	}
	if tensor.Digest(m.state...) != tensor.Digest(sns[2].state...) || h.GetStateVersion() != 3 || h.GetStateBytes() != 8 {
		t.Fatal("merged snapshot does not carry the newest state")
	}
	if !slices.Equal(h.GetOutputRows(), []uint32{1, 1, 1, 2, 1, 3}) {
		t.Fatalf("output rows %v", h.GetOutputRows())
	}
	outs, err := splitOutputs(&hamsv1.BatchResponse{Outputs: h.GetOutputs(), Rows: h.GetOutputRows()}, len(h.GetRequests()))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range h.GetRequests() {
		v, err := tensor.Float32(outs[i][0])
		if err != nil || len(v) != 2*int(h.GetOutputRows()[i]) {
			t.Fatalf("request %d output %v %v", r.GetSeq(), v, err)
		}
		for k, x := range v {
			if want := float32(r.GetSeq()*10 + uint64(k/2)); x != want {
				t.Fatalf("request seq %d output %v: row %d is %v, want %v", r.GetSeq(), v, k/2, x, want)
			}
		}
	}
	lins := make([][]*hamsv1.LineageEntry, len(h.GetRequests()))
	for i, r := range h.GetRequests() {
		lins[i] = r.GetLineage()
	}
	if deps := nspb.DepsOf([]string{"p"}, lins...); len(deps) != 1 || deps["p"] != 9 {
		t.Fatalf("deps of the merged snapshot %v, want p:9", deps)
	}
	// The inputs are untouched.
	if len(sns[0].header.GetRequests()) != 2 || sns[2].batches != 1 {
		t.Fatal("merge modified its inputs")
	}
	// Outputs that do not concatenate are an error.
	bad := snap(7, 1, []uint64{1}, []uint32{1}, 4, t0)
	bad.header.Outputs = append(bad.header.Outputs, bad.header.Outputs[0])
	if _, err := mergeSnapshots([]*snapshot{sns[0], bad}); err == nil {
		t.Fatal("merge of snapshots with different output tensors succeeded")
	}
}

// The shipper takes every waiting snapshot as one under the next dense
// id; a snapshot whose outputs do not concatenate with the others' is
// sent alone, the others follow under the next ids.
func TestShipperCoalescesUnderDenseIDs(t *testing.T) {
	sh := testShipper()
	t0 := time.Now()
	take := func() *snapshot {
		t.Helper()
		sn := sh.head()
		if sn == nil || !sn.taken || sn.header.GetBatchId() != sn.batch {
			t.Fatalf("head %+v", sn)
		}
		if again := sh.head(); again != sn {
			t.Fatal("head of a taken snapshot changed")
		}
		return sn
	}
	acked := func(sn *snapshot) {
		sh.mu.Lock()
		if sh.queue[0] != sn {
			t.Fatal("acked snapshot is not the head")
		}
		sh.queue = sh.queue[1:]
		sh.mu.Unlock()
	}
	if sh.head() != nil {
		t.Fatal("head of an empty queue")
	}
	sh.enqueue(snap(1, 1, []uint64{1}, []uint32{1}, 1, t0))
	sh.enqueue(snap(2, 1, []uint64{2}, []uint32{1}, 2, t0))
	sh.enqueue(snap(3, 2, []uint64{3, 4}, []uint32{1, 1}, 3, t0))
	if w := sh.Waiting(); w != 3 {
		t.Fatalf("waiting %d", w)
	}
	s1 := take()
	if s1.batch != 1 || s1.batches != 4 || len(s1.header.GetRequests()) != 4 || sh.Waiting() != 0 {
		t.Fatalf("first shipment: id %d batches %d requests %d", s1.batch, s1.batches, len(s1.header.GetRequests()))
	}
	// Copies made while it is sent wait for it.
	sh.enqueue(snap(5, 1, []uint64{5}, []uint32{1}, 5, t0))
	sh.enqueue(snap(6, 1, []uint64{6}, []uint32{1}, 6, t0))
	if sh.head() != s1 {
		t.Fatal("head moved past an unacknowledged snapshot")
	}
	acked(s1)
	s2 := take()
	if s2.batch != 2 || s2.batches != 2 || s2.seq != 6 {
		t.Fatalf("second shipment: id %d batches %d seq %d", s2.batch, s2.batches, s2.seq)
	}
	acked(s2)
	// Not concatenable: sent one by one.
	bad := snap(7, 1, []uint64{7}, []uint32{1}, 7, t0)
	bad.header.Outputs = append(bad.header.Outputs, bad.header.Outputs[0])
	sh.enqueue(bad)
	sh.enqueue(snap(8, 1, []uint64{8}, []uint32{1}, 8, t0))
	s3 := take()
	if s3 != bad || s3.batch != 3 || sh.Waiting() != 1 {
		t.Fatalf("uncoalescable: id %d, waiting %d", s3.batch, sh.Waiting())
	}
	acked(s3)
	if s4 := take(); s4.batch != 4 || s4.seq != 8 {
		t.Fatalf("after the uncoalescable one: id %d seq %d", s4.batch, s4.seq)
	}
	// After a promotion or rollback, ids continue after the base's.
	base := snap(1, 1, []uint64{1}, []uint32{1}, 1, t0)
	base.batch, base.taken = 7, true
	sh.reset(base, false)
	sh.enqueue(snap(9, 1, []uint64{9}, []uint32{1}, 9, t0))
	if s := take(); s.batch != 8 {
		t.Fatalf("id after a base of 7: %d", s.batch)
	}
}

// With the shipper held back while the primary runs on, and then
// released: the coalesced snapshots bring the backup to the primary's
// state, and every request seq is recorded durable exactly once.
func TestHeldShipperCatchesUp(t *testing.T) {
	prim, back := newCounter(8), newCounter(8)
	release := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var held int
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": prim}, map[string]Backend{"a": back}, replOpts{
		tweak: func(_ string, s *Sidecar) {
			if s.role == config.RoleBackup {
				s.cfg.ID = "sidecar/a/backup#1"
				return
			}
			s.cfg.ShipHook = func(ctx context.Context, batch uint64) {
				mu.Lock()
				held++
				mu.Unlock()
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
		},
	})
	defer h.stop()
	defer once.Do(func() { close(release) })
	const n = 80
	for id := uint64(1); id <= n; id += 4 {
		h.send(id, min(id+3, n))
	}
	waitFor(t, "all replies while shipping is held", func() bool { return h.sink.count() >= n })
	if seq := maxSeqOf(h.backups["a"]); seq != 0 {
		t.Fatalf("backup durable to %d while shipping was held", seq)
	}
	pa := h.sidecars["a"]
	waitFor(t, "copies waiting behind the held shipment", func() bool { return pa.prim.ship.Waiting() > 0 })
	once.Do(func() { close(release) })
	waitFor(t, "backup durable to n", func() bool { return maxSeqOf(h.backups["a"]) == n })
	waitFor(t, "durability notice of n", func() bool { return h.durable.get("a") == n })
	waitFor(t, "backup state equals the primary's", func() bool { return prim.Digest() == back.Digest() })
	mu.Lock()
	shipments := held
	mu.Unlock()
	prim.mu.Lock()
	computes := prim.computes
	prim.mu.Unlock()
	if shipments >= computes {
		t.Fatalf("%d shipments for %d batches: nothing coalesced", shipments, computes)
	}
	h.stop()
	// The backup's audit file is its own: <model>-backup-<id>.
	if _, err := os.Stat(filepath.Join(h.audit, "a-backup-sidecar_a_backup_1", audit.DurableFile)); err != nil {
		t.Fatalf("backup audit file: %v", err)
	}
	recs, err := audit.ReadAll[audit.Durable](h.audit, audit.DurableFile)
	if err != nil {
		t.Fatal(err)
	}
	count := map[uint64]int{}
	for _, r := range recs {
		if r.Model != "a" || r.InputDigest == "" || r.OutputDigest == "" || r.StateDigest == "" {
			t.Fatalf("bad audit record %+v", r)
		}
		count[r.Seq]++
	}
	for seq := uint64(1); seq <= n; seq++ {
		if count[seq] != 1 {
			t.Fatalf("seq %d recorded durable %d times", seq, count[seq])
		}
	}
	if len(count) != n {
		t.Fatalf("%d seqs recorded durable, want %d", len(count), n)
	}
}

// Every instance writes its own durable.jsonl: named by its id (made one
// file-name element), else by the process id.
func TestAuditSubdirPerInstance(t *testing.T) {
	for _, c := range []struct{ id, want string }{
		{"", fmt.Sprintf("m-backup-%d", os.Getpid())},
		{"sidecar/m/backup", "m-backup-sidecar_m_backup"},
		{"b-2.x_y", "m-backup-b-2.x_y"},
		{"..", "m-backup-_"},
		{"a b/../c", "m-backup-a_b_.._c"},
	} {
		if got := auditSubdir("m", c.id, "backup"); got != c.want {
			t.Errorf("id %q: %q, want %q", c.id, got, c.want)
		}
	}
}

// A new backup first gets every acknowledged snapshot no backup applied,
// in order and unmerged (the old backup may have died after acknowledging
// them, and applying the last makes them all durable), then the rest.
func TestRebaseCarriesUnappliedSnapshots(t *testing.T) {
	t0 := time.Unix(100, 0)
	sh := testShipper()
	a := snap(1, 1, []uint64{1, 2}, []uint32{1, 1}, 1, t0)
	b := snap(3, 1, []uint64{3}, []uint32{1}, 2, t0)
	c := snap(4, 1, []uint64{4, 5}, []uint32{1, 2}, 3, t0)
	d := snap(6, 1, []uint64{6}, []uint32{1}, 4, t0)
	for i, sn := range []*snapshot{a, b, c, d} {
		sn.batch, sn.taken = uint64(i+1), true
		sn.header.BatchId = sn.batch
	}
	// a applied by the old backup; b and c acknowledged, not applied; d
	// being sent when the old backup failed.
	sh.applied, sh.unapplied, sh.kept, sh.sentTo, sh.queue = a, []*snapshot{b, c}, c, "old:1", []*snapshot{d}
	if sh.rebase("old:1") {
		t.Fatal("rebase to the same backup")
	}
	if !sh.rebase("new:2") {
		t.Fatal("no rebase for a new backup")
	}
	if len(sh.queue) != 3 || sh.queue[0] != b || sh.queue[1] != c || sh.queue[2] != d {
		t.Fatalf("queue after rebase: %d snapshots", len(sh.queue))
	}
	if sh.rebase("new:2") {
		t.Fatal("rebased twice before the base was acknowledged")
	}
	// Everything applied: the base is kept itself.
	sh2 := testShipper()
	sh2.applied, sh2.kept, sh2.sentTo = c, c, "old:1"
	if !sh2.rebase("new:2") || len(sh2.queue) != 1 || sh2.queue[0] != c {
		t.Fatal("applied kept state not rebased as is")
	}
}

// The backup's durability notice can overtake the return of the ack of the
// same snapshot: the applied batch must still become the rollback target
// when the ack is recorded (otherwise a rollback would reinstall a state
// older than one already announced durable).
func TestNoticeBeforeAckStillMovesRollbackTarget(t *testing.T) {
	sh := testShipper()
	t0 := time.Unix(100, 0)
	base := snap(1, 1, []uint64{1}, []uint32{1}, 1, t0)
	base.batch = 1
	sh.reset(base, false)
	s2 := snap(2, 1, []uint64{2}, []uint32{1}, 2, t0)
	s2.batch = 2
	s3 := snap(3, 1, []uint64{3}, []uint32{1}, 3, t0)
	s3.batch = 3
	sh.mu.Lock()
	sh.setApplied(2) // the notice of batch 2 arrives first
	sh.mu.Unlock()
	if a := sh.Applied(); a != base {
		t.Fatalf("applied moved before any ack: %v", a.batch)
	}
	sh.recordAck(s2, "b:1", false) // the ack without applied set, recorded late
	if a := sh.Applied(); a != s2 {
		t.Fatalf("rollback target is batch %d after the notice and ack of batch 2", a.batch)
	}
	sh.recordAck(s3, "b:1", false)
	if a := sh.Applied(); a != s2 || sh.Unapplied() != 1 {
		t.Fatalf("batch 3 counted applied without a notice: target %d, unapplied %d", a.batch, sh.Unapplied())
	}
	sh.reset(s3, false)
	sh.mu.Lock()
	sh.setApplied(2) // an old notice after a reset does not reach later batches
	sh.mu.Unlock()
	s4 := snap(4, 1, []uint64{4}, []uint32{1}, 4, t0)
	s4.batch = 4
	sh.recordAck(s4, "b:1", false)
	if a := sh.Applied(); a != s3 {
		t.Fatalf("target %d after reset to 3 and ack of 4", a.batch)
	}
}
