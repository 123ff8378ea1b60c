package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

const twoStateful = `
name: t2
mode: nspb
models:
  - {name: a, kind: counter, stateful: true, placement: {primary: h1, backup: h2}}
  - {name: p, kind: fake}
  - {name: b, kind: counter, stateful: true, placement: {primary: h1, backup: h2}}
services:
  - name: s
    edges: [[frontend, a], [a, p], [p, b], [b, frontend]]
`

// (c) Figure 6 at the sidecar level: a's snapshot is delayed; b computes
// on a's output and ships its own snapshot, which b's backup buffers but
// neither applies nor announces until a is durable.
func TestFigure6DownstreamWaitsForUpstreamDurability(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		release := make(chan struct{})
		h := startRepl(t, twoStateful,
			map[string]Backend{"a": newCounter(4), "p": &fakeBackend{}, "b": newCounter(4)},
			map[string]Backend{"a": newCounter(4), "b": newCounter(4)},
			replOpts{tweak: func(name string, s *Sidecar) {
				if name == "a" && s.role == config.RolePrimary {
					s.cfg.ShipHook = func(ctx context.Context, batch uint64) {
						select {
						case <-release:
						case <-ctx.Done():
						}
					}
				}
			}})
		defer h.stop()
		h.send(1, 1)
		waitFor(t, "reply released before a is durable", func() bool { return h.sink.count() == 1 })
		bb := h.backups["b"].bk
		waitFor(t, "b's snapshot buffered at its backup", func() bool {
			bb.mu.Lock()
			defer bb.mu.Unlock()
			return len(bb.snaps) == 1
		})
		if id, m, need, have, blocked := func() (uint64, string, uint64, uint64, bool) {
			bb.mu.Lock()
			defer bb.mu.Unlock()
			return bb.alg.Blocker()
		}(); !blocked || id != firstSnapshot(delta) || m != "a" || need != 1 || have != 0 {
			t.Fatalf("b's backup blocker: batch %d model %q need %d have %d blocked %v", id, m, need, have, blocked)
		}
		if seq := maxSeqOf(h.backups["b"]); seq != 0 || h.durable.get("b") != 0 || h.durable.get("a") != 0 {
			t.Fatalf("b applied (%d) or announced (%d) before a is durable", seq, h.durable.get("b"))
		}
		close(release)
		waitFor(t, "b durable", func() bool { return h.durable.get("b") == 1 })
		h.durable.mu.Lock()
		defer h.durable.mu.Unlock()
		ia, ib := -1, -1
		for i, n := range h.durable.order {
			if n.Model == "a" && n.DurableSeq >= 1 && ia < 0 {
				ia = i
			}
			if n.Model == "b" && n.DurableSeq >= 1 && ib < 0 {
				ib = i
			}
		}
		if ia < 0 || ib < ia {
			t.Fatalf("b announced at %d, a at %d: %v", ib, ia, h.durable.order)
		}
	})
}

// (d) remus (and nspb-s1) hold outputs until the backup has the snapshot:
// when an output reaches the downstream receiver, the backup has already
// buffered the snapshot of its batch. nspb releases before: with shipping
// stalled, outputs still arrive.
func TestReleaseOnAckVersusEarlyRelease(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		for _, mode := range []string{"remus", "nspb-s1"} {
			t.Run(mode, func(t *testing.T) {
				var bk atomic.Pointer[backupState]
				var violations atomic.Int64
				h := startRepl(t, fmt.Sprintf(oneStateful, mode), map[string]Backend{"a": newCounter(8)}, map[string]Backend{"a": newCounter(8)},
					replOpts{tweak: func(name string, s *Sidecar) {
						if s.role == config.RoleBackup {
							bk.Store(s.bk)
						}
					}})
				defer h.stop()
				h.sink.check = func(it *hamsv1.Item) {
					b := bk.Load()
					b.mu.Lock()
					defer b.mu.Unlock()
					if seqAt(it, "a") > b.maxRecvSeq {
						violations.Add(1)
					}
				}
				const n = 40
				h.send(1, n)
				waitFor(t, "all replies", func() bool { return h.sink.count() >= n })
				if v := violations.Load(); v != 0 {
					t.Fatalf("%d outputs reached downstream before the backup had their snapshot", v)
				}
			})
		}
		t.Run("nspb", func(t *testing.T) {
			release := make(chan struct{})
			h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": newCounter(8)}, map[string]Backend{"a": newCounter(8)},
				replOpts{tweak: func(name string, s *Sidecar) {
					if s.role == config.RolePrimary {
						s.cfg.ShipHook = func(ctx context.Context, _ uint64) {
							select {
							case <-release:
							case <-ctx.Done():
							}
						}
					}
				}})
			defer h.stop()
			const n = 10
			h.send(1, n)
			waitFor(t, "outputs released while no snapshot reached the backup", func() bool { return h.sink.count() >= n })
			if seq := maxSeqOf(h.backups["a"]); seq != 0 {
				t.Fatalf("backup applied %d while shipping was stalled", seq)
			}
			close(release)
			waitFor(t, "backup catches up", func() bool { return maxSeqOf(h.backups["a"]) == n })
		})
	})
}

func seqAt(it *hamsv1.Item, model string) uint64 {
	for _, e := range it.Lineage {
		if e.Model == model {
			return e.Seq
		}
	}
	return 0
}

// (e) The output log keeps released outputs until completion notices name
// them, and when full holds new batches (never dropping outputs) until a
// completion frees space.
func TestOutputLogGCAndBackpressure(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		prim := newCounter(4)
		var sc atomic.Pointer[Sidecar]
		var computedWhileFull atomic.Int64
		prim.onCompute = func(uint64) {
			if s := sc.Load(); s != nil {
				if full, _ := s.outlog.Full(); full {
					computedWhileFull.Add(1)
				}
			}
		}
		// One request's output is 2 FP32 = 8 bytes; room for 3 requests.
		h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": prim}, map[string]Backend{"a": newCounter(4)},
			replOpts{outputLog: 24, tweak: func(name string, s *Sidecar) {
				if s.role == config.RolePrimary {
					sc.Store(s)
				}
			}})
		defer h.stop()
		s := h.sidecars["a"]
		const n = 10
		for id := uint64(1); id <= n; id++ {
			h.send(id, id)
		}
		waitFor(t, "log full and its outputs delivered", func() bool {
			full, _ := s.outlog.Full()
			r, _, _ := s.outlog.Stats()
			return full && h.sink.count() == r
		})
		got := h.sink.count()
		if got < 3 || got >= n {
			t.Fatalf("%d replies with a log of 3 requests", got)
		}
		reqs, items, bytes := s.outlog.Stats()
		if reqs != got || items != got || bytes != int64(8*got) {
			t.Fatalf("log holds %d requests %d items %d bytes after %d replies", reqs, items, bytes, got)
		}
		if kept := s.outlog.Get(1); len(kept) != 1 || kept[0][0].ReqId != 1 || kept[0][0].EdgeSeq == 0 {
			t.Fatalf("log entry of request 1: %v", kept)
		}
		// Completing everything lets the rest through.
		all := make([]uint64, n)
		for i := range all {
			all[i] = uint64(i + 1)
		}
		h.completeUntil(t, all, "all replies and an empty log", func() bool {
			r, _, _ := s.outlog.Stats()
			return h.sink.count() == n && r == 0
		})
		if v := computedWhileFull.Load(); v != 0 {
			t.Fatalf("%d batches started while the output log was full", v)
		}
		if gaugeValue(s.metrics.outlogBytes) != 0 || gaugeValue(s.metrics.outlogItems) != 0 {
			t.Fatal("output log gauge not back to 0")
		}
	})
}

// (f) A ship stream broken after the backup buffered the snapshot (lost
// response) and one cut mid-snapshot are both resent; the backup applies
// every batch once.
func TestBrokenShipStreamResentWithoutDuplicates(t *testing.T) {
	// The breaks are injected into ShipSnapshot streams (the bulk
	// stream's are TestBulkStreamFaultsAreResent's).
	defer func(n uint64) { bulkMinBytes = n }(bulkMinBytes)
	bulkMinBytes = 1 << 40
	bothStateKinds(t, func(t *testing.T, delta bool) {
		cut := &shipCutter{attempts: map[uint64]int{}}
		prim, back := newCounter(8), newCounter(8)
		h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": prim}, map[string]Backend{"a": back},
			replOpts{tweak: func(name string, s *Sidecar) {
				if s.role == config.RolePrimary {
					s.prim.ship.dialOptions = []grpc.DialOption{grpc.WithStreamInterceptor(cut.intercept)}
				}
			}})
		defer h.stop()
		const n = 12
		for id := uint64(1); id <= n; id++ {
			h.send(id, id)
		}
		waitFor(t, "replies", func() bool { return h.sink.count() >= n })
		waitFor(t, "backup durable", func() bool { return maxSeqOf(h.backups["a"]) == n })
		waitFor(t, "states equal", func() bool { return prim.Digest() == back.Digest() })
		cut.mu.Lock()
		if cut.attempts[1] < 2 || cut.attempts[2] < 2 {
			t.Fatalf("attempts %v: the injected breaks did not happen", cut.attempts)
		}
		cut.mu.Unlock()
		h.stop()
		recs, err := audit.ReadAll[audit.Durable](h.audit, audit.DurableFile)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uint64]int{}
		for _, r := range recs {
			seen[r.Seq]++
		}
		for seq := uint64(1); seq <= n; seq++ {
			if seen[seq] != 1 {
				t.Fatalf("seq %d recorded durable %d times", seq, seen[seq])
			}
		}
	})
}

// shipCutter breaks the first shipment of batch 1 after the backup
// answered (the response is lost) and the first of batch 2 after its
// header (the stream ends without the state).
type shipCutter struct {
	mu       sync.Mutex
	attempts map[uint64]int
}

func (c *shipCutter) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &cutStream{ClientStream: cs, c: c}, nil
}

type cutStream struct {
	grpc.ClientStream
	c     *shipCutter
	batch uint64
	first bool
	sent  int
}

func (s *cutStream) SendMsg(m any) error {
	if ch, ok := m.(*hamsv1.SnapshotChunk); ok && ch.GetHeader() != nil {
		s.batch = ch.GetHeader().GetBatchId()
		s.c.mu.Lock()
		s.c.attempts[s.batch]++
		s.first = s.c.attempts[s.batch] == 1
		s.c.mu.Unlock()
	}
	s.sent++
	if s.batch == 2 && s.first && s.sent > 1 {
		return status.Error(codes.Unavailable, "injected: stream cut mid-snapshot")
	}
	return s.ClientStream.SendMsg(m)
}

func (s *cutStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil && s.batch == 1 && s.first {
		return status.Error(codes.Unavailable, "injected: response lost")
	}
	return err
}

// Bad snapshots are rejected with InvalidArgument/DataLoss, and nothing
// is buffered.
func TestShipSnapshotRejectsBadInput(t *testing.T) {
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), nil, map[string]Backend{"a": newCounter(2)}, replOpts{})
	defer h.stop()
	addr := h.backups["a"].cfg.GRPCListener.Addr().String()
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	rc := hamsv1.NewReplicationClient(cc)
	state := row(3, 2) // FP32 [1,2], 8 bytes
	good := func() *hamsv1.SnapshotHeader {
		return &hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: 1, StateBytes: 8,
			StateTensors: []*hamsv1.TensorSpec{{Name: "x", Datatype: "FP32", Shape: []int64{1, 2}}},
			Requests:     []*hamsv1.RequestRecord{{ReqId: 1, Seq: 1}}}
	}
	digest := deltaDigestOf(state.Data)
	hdr := func(h *hamsv1.SnapshotHeader) *hamsv1.SnapshotChunk {
		return &hamsv1.SnapshotChunk{Part: &hamsv1.SnapshotChunk_Header{Header: h}}
	}
	data := func(b []byte, d string) *hamsv1.SnapshotChunk {
		return &hamsv1.SnapshotChunk{Part: &hamsv1.SnapshotChunk_Data{Data: b}, StateDigest: d}
	}
	mod := func(f func(h *hamsv1.SnapshotHeader)) *hamsv1.SnapshotHeader { h := good(); f(h); return h }
	cases := []struct {
		name   string
		chunks []*hamsv1.SnapshotChunk
		code   codes.Code
	}{
		{"empty", nil, codes.InvalidArgument},
		{"no header", []*hamsv1.SnapshotChunk{data(state.Data, digest)}, codes.InvalidArgument},
		{"other model", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.Model = "zz" })), data(state.Data, digest)}, codes.InvalidArgument},
		{"batch 0", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.BatchId = 0 })), data(state.Data, digest)}, codes.InvalidArgument},
		{"delta before any base", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.Delta, h.DeltaBytes = true, 4 })),
			deltaChunk(state.Data[:4], 0, deltaDigestOf(state.Data[:4]))}, codes.FailedPrecondition},
		{"huge", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.StateBytes = 1 << 40 }))}, codes.ResourceExhausted},
		{"cut", []*hamsv1.SnapshotChunk{hdr(good()), data(state.Data[:4], "")}, codes.InvalidArgument},
		{"too much", []*hamsv1.SnapshotChunk{hdr(good()), data(append(state.Data, 1, 2), digest)}, codes.InvalidArgument},
		{"short", []*hamsv1.SnapshotChunk{hdr(good()), data(state.Data[:4], deltaDigestOf(state.Data[:4]))}, codes.InvalidArgument},
		{"digest", []*hamsv1.SnapshotChunk{hdr(good()), data(state.Data, deltaDigestOf([]byte("x")))}, codes.DataLoss},
		{"after last", []*hamsv1.SnapshotChunk{hdr(good()), data(state.Data, digest), data(nil, "")}, codes.InvalidArgument},
		{"two headers", []*hamsv1.SnapshotChunk{hdr(good()), hdr(good())}, codes.InvalidArgument},
		{"bad spec", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.StateTensors[0].Datatype = "BYTES" })), data(state.Data, digest)}, codes.InvalidArgument},
		{"stale epoch", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.Epoch = 0 })), data(state.Data, digest)}, codes.FailedPrecondition},
		{"spec size", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.StateTensors[0].Shape = []int64{1, 1} })), data(state.Data, digest)}, codes.InvalidArgument},
		{"non-PFM dep", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) {
			h.Requests[0].Lineage = []*hamsv1.LineageEntry{{Model: "a", Seq: 1}}
		})), data(state.Data, digest)}, codes.OK}, // a is not its own PFM: DepsOf ignores it
		// Synced now: a full snapshot without requests is no base any more.
		{"no requests", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.Requests, h.BatchId = nil, 2 })), data(state.Data, digest)}, codes.InvalidArgument},
		{"delta without requests", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.Requests, h.BatchId, h.Delta, h.DeltaBytes = nil, 2, true, 4 })),
			deltaChunk(state.Data[:4], 0, deltaDigestOf(state.Data[:4]))}, codes.InvalidArgument},
		{"delta past the state", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.BatchId, h.Delta, h.DeltaBytes = 2, true, 4 })),
			deltaChunk(state.Data[:4], 6, deltaDigestOf(state.Data[:4]))}, codes.InvalidArgument},
		{"delta bytes", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.BatchId, h.Delta, h.DeltaBytes = 2, true, 8 })),
			deltaChunk(state.Data[:4], 0, deltaDigestOf(state.Data[:4]))}, codes.InvalidArgument},
		{"delta digest", []*hamsv1.SnapshotChunk{hdr(mod(func(h *hamsv1.SnapshotHeader) { h.BatchId, h.Delta, h.DeltaBytes = 2, true, 4 })),
			deltaChunk(state.Data[:4], 4, deltaDigestOf([]byte("x")))}, codes.DataLoss},
	}
	for _, c := range cases {
		st, err := rc.ShipSnapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.chunks {
			if err := st.Send(ch); err != nil {
				break
			}
		}
		_, err = st.CloseAndRecv()
		if status.Code(err) != c.code {
			t.Fatalf("%s: got %v, want %v", c.name, err, c.code)
		}
	}
	waitFor(t, "the one good snapshot applied", func() bool { return maxSeqOf(h.backups["a"]) == 1 })
	if r, err := rc.GetMaxSeq(context.Background(), &hamsv1.GetMaxSeqRequest{Model: "a"}); err != nil || r.MaxSeq != 1 || r.BatchId != 1 {
		t.Fatalf("GetMaxSeq: %v %v", r, err)
	}
	if _, err := rc.GetMaxSeq(context.Background(), &hamsv1.GetMaxSeqRequest{Model: "zz"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetMaxSeq other model: %v", err)
	}
	if _, err := rc.Promote(context.Background(), &hamsv1.PromoteRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Promote at a stale epoch: %v", err)
	}
	if _, err := rc.Promote(context.Background(), &hamsv1.PromoteRequest{Model: "a", Epoch: 2}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Promote of a backup without a resolver: %v", err)
	}
	if _, err := rc.Promote(context.Background(), &hamsv1.PromoteRequest{Model: "zz", Epoch: 2}); status.Code(err) != codes.NotFound {
		t.Fatalf("Promote of another model: %v", err)
	}
	if _, err := rc.Resend(context.Background(), &hamsv1.ResendRequest{ToModel: "frontend"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Resend on a backup: %v", err)
	}
	if _, err := rc.Rollback(context.Background(), &hamsv1.RollbackRequest{Model: "a", Epoch: 2}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Rollback on a backup: %v", err)
	}
}

func deltaChunk(b []byte, off uint64, d string) *hamsv1.SnapshotChunk {
	return &hamsv1.SnapshotChunk{Part: &hamsv1.SnapshotChunk_Data{Data: b}, Offset: off, StateDigest: d}
}

func hamsDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		return -1
	}
	return m.GetGauge().GetValue()
}

func TestNewRejectsBadReplicationConfig(t *testing.T) {
	parse := func(y string) *config.Deployment {
		d, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	nspbDep := parse(fmt.Sprintf(oneStateful, "nspb"))
	bareDep := parse(fmt.Sprintf(oneStateful, "bare"))
	replayDep := parse(fmt.Sprintf(oneStateful, "replay"))
	lis := listen(t)
	defer lis.Close()
	co := noCoord{}
	br := &backupMap{m: map[string]string{}}
	good := Config{Deployment: nspbDep, Model: "a", Backend: newCounter(2), Resolver: edge.NewStaticResolver(nil), GRPCListener: lis,
		Coord: co, BackupResolver: br}
	s, err := New(good)
	if err != nil || !s.replicated {
		t.Fatalf("good config: %v (replicated %v)", err, s != nil && s.replicated)
	}
	goodBackup := good
	goodBackup.Role, goodBackup.Resolver, goodBackup.BackupResolver = config.RoleBackup, nil, nil
	if _, err := New(goodBackup); err != nil {
		t.Fatalf("good backup config: %v", err)
	}
	// Bare and replay: a stateful primary runs without replication and
	// needs neither Coord nor BackupResolver (replay needs its store).
	for _, d := range []*config.Deployment{bareDep, replayDep} {
		c := good
		c.Deployment, c.Coord, c.BackupResolver = d, nil, nil
		if d == replayDep {
			c.Replay = noReplayStore{}
		}
		if s, err := New(c); err != nil || s.replicated {
			t.Fatalf("mode %s: %v", d.Mode, err)
		}
	}
	mods := map[string]func(*Config){
		"bad role":           func(c *Config) { c.Role = "standby" },
		"negative log bound": func(c *Config) { c.OutputLogBytes = -1 },
		"stateless backend":  func(c *Config) { c.Backend = &fakeBackend{} },
		"no coord":           func(c *Config) { c.Coord = nil },
		"no backup resolver": func(c *Config) { c.BackupResolver = nil },
		"backup in bare":     func(c *Config) { c.Role, c.Deployment = config.RoleBackup, bareDep },
		"backup of stateless": func(c *Config) {
			c.Role, c.Deployment = config.RoleBackup, parse(chainGraph)
		},
		"unknown mode": func(c *Config) { d := *nspbDep; d.Mode = "nope"; c.Deployment = &d },
	}
	for name, mod := range mods {
		c := good
		mod(&c)
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

type noCoord struct{}

func (noCoord) Announce(context.Context, *hamsv1.DurabilityNotice) error { return nil }
func (noCoord) WatchDurable(ctx context.Context, _ []string, _ func(*hamsv1.DurabilityNotice)) error {
	<-ctx.Done()
	return nil
}
func (noCoord) WatchCompleted(ctx context.Context, _ func(*hamsv1.CompletionNotice)) error {
	<-ctx.Done()
	return nil
}

// The primary answers the backup-only RPCs with FailedPrecondition, and
// recovery orders it cannot follow with FailedPrecondition or NotFound.
func TestPrimaryReplicationRPCs(t *testing.T) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": newCounter(2)}, map[string]Backend{"a": newCounter(2)}, replOpts{})
		defer h.stop()
		cc, err := grpcx.Dial(h.sidecars["a"].cfg.GRPCListener.Addr().String(), 0)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		rc := hamsv1.NewReplicationClient(cc)
		ctx := context.Background()
		var r *hamsv1.GetMaxSeqResponse
		waitFor(t, "primary serving", func() bool {
			r, err = rc.GetMaxSeq(ctx, &hamsv1.GetMaxSeqRequest{})
			return status.Code(err) != codes.Unavailable
		})
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("GetMaxSeq on primary: %v %v", r, err)
		}
		st, _ := rc.ShipSnapshot(ctx)
		if _, err := st.CloseAndRecv(); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("ShipSnapshot on primary: %v", err)
		}
		calls := map[string]struct {
			call func() error
			code codes.Code
		}{
			"GetLineageSummary unknown model": {func() error {
				_, err := rc.GetLineageSummary(ctx, &hamsv1.LineageSummaryRequest{FailedModel: "zz"})
				return err
			}, codes.NotFound},
			"Resend to a non-successor": {func() error { _, err := rc.Resend(ctx, &hamsv1.ResendRequest{ToModel: "zz"}); return err }, codes.NotFound},
			"Demote stale epoch":        {func() error { _, err := rc.Demote(ctx, &hamsv1.DemoteRequest{}); return err }, codes.FailedPrecondition},
			"Rollback stale epoch":      {func() error { _, err := rc.Rollback(ctx, &hamsv1.RollbackRequest{}); return err }, codes.FailedPrecondition},
			"Rollback other batch": {func() error {
				_, err := rc.Rollback(ctx, &hamsv1.RollbackRequest{Epoch: 2, ToBatchId: 99})
				return err
			}, codes.FailedPrecondition},
			"Promote the primary": {func() error { _, err := rc.Promote(ctx, &hamsv1.PromoteRequest{Epoch: 2}); return err }, codes.FailedPrecondition},
			"Promote bad start seq": {func() error {
				_, err := rc.Promote(metadata.AppendToOutgoingContext(ctx, StartSeqMetadata, "x"), &hamsv1.PromoteRequest{Epoch: 2})
				return err
			}, codes.InvalidArgument},
		}
		for name, c := range calls {
			if err := c.call(); status.Code(err) != c.code {
				t.Fatalf("%s: %v, want %v", name, err, c.code)
			}
		}
		if ls, err := rc.GetLineageSummary(ctx, &hamsv1.LineageSummaryRequest{}); err != nil || ls.Model != "a" {
			t.Fatalf("GetLineageSummary of itself: %v %v", ls, err)
		}
	})
}

// deltaDigestOf is the digest a primary sends with a delta of data b.
func deltaDigestOf(b []byte) string {
	return rangesDigest([]*hamsv1.StateRange{{Data: b}})
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
