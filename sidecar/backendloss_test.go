package sidecar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A stateless model in a protected mode (a standby takes over when its
// host fails).
const protectedChainGraph = `
name: t
mode: nspb
models:
  - {name: a, kind: fake, batch: {size: 4}}
services:
  - name: s
    edges: [[frontend, a], [a, frontend]]
`

// flakyBackend fails with Unavailable (a killed model server: connection
// reset) while down is set, counting the failed calls.
type flakyBackend struct {
	fakeBackend
	down   atomic.Bool
	failed atomic.Int64
}

func (f *flakyBackend) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	if f.down.Load() {
		f.failed.Add(1)
		return nil, errors.Join(errors.New("reference a compute"), statusErr(codes.Unavailable, "connection reset by peer"))
	}
	return f.fakeBackend.Infer(ctx, req)
}

// runOne runs one sidecar for model "a" of yaml with a sink and a
// frontend sender; Run's result arrives on the returned channel.
func runOne(t *testing.T, yaml string, be Backend, lostAfter time.Duration) (*collector, *edge.Sender, <-chan error, func()) {
	t.Helper()
	return runOneWith(t, yaml, be, func(c *Config) { c.BackendLostAfter = lostAfter })
}

// runOneWith is runOne with the sidecar's Config adjusted by set.
func runOneWith(t *testing.T, yaml string, be Backend, set func(*Config)) (*collector, *edge.Sender, <-chan error, func()) {
	t.Helper()
	dep, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	res := edge.NewStaticResolver(nil)
	sink := &collector{items: map[uint64][]*hamsv1.Item{}}
	flis := listen(t)
	res.Set(config.Frontend, flis.Addr().String(), 0)
	srv := grpc.NewServer()
	hamsv1.RegisterDataplaneServer(srv, edge.NewReceiver(config.Frontend, sink.deliver, nil))
	go func() { _ = srv.Serve(flis) }()
	lis := listen(t)
	res.Set("a", lis.Addr().String(), 0)
	cfg := Config{Deployment: dep, Model: "a", Backend: be, Resolver: res, GRPCListener: lis}
	set(&cfg)
	sc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- sc.Run(ctx) }()
	snd, err := edge.NewSender(edge.SenderConfig{From: config.Frontend, To: "a", Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	sndDone := make(chan struct{})
	go func() { defer close(sndDone); _ = snd.Run(ctx) }()
	return sink, snd, runErr, func() { cancel(); <-sndDone; srv.Stop() }
}

// A model server that is unreachable for a while (restarting, or killed
// and about to take its sidecar along) does not turn the requests in hand
// into client errors in a protected mode: the batch is held and retried.
func TestBackendUnavailableHoldsBatchInProtectedMode(t *testing.T) {
	fb := &flakyBackend{fakeBackend: fakeBackend{inputs: []string{"x"}}}
	fb.down.Store(true)
	sink, snd, runErr, stop := runOne(t, protectedChainGraph, fb, time.Minute)
	defer stop()
	for id := uint64(1); id <= 6; id++ {
		snd.Send(&hamsv1.Item{ReqId: id, Tensors: []*hamsv1.Tensor{row(1, 2)}})
	}
	waitFor(t, "retries of the held batch", func() bool { return fb.failed.Load() >= 3 })
	if n := sink.count(); n != 0 {
		t.Fatalf("%d items reached the sink while the backend was down", n)
	}
	fb.down.Store(false)
	waitFor(t, "replies after the backend came back", func() bool { return sink.count() >= 6 })
	sink.mu.Lock()
	for id := uint64(1); id <= 6; id++ {
		if it := sink.items[id][0]; it.GetError() != "" || len(it.GetTensors()) != 1 {
			t.Fatalf("req %d: %v", id, it)
		}
	}
	sink.mu.Unlock()
	select {
	case err := <-runErr:
		t.Fatalf("sidecar stopped: %v", err)
	default:
	}
}

// A backend that stays unreachable is a failed host: the sidecar stops
// (fail-stop, so the manager fails it over) without failing the requests.
func TestBackendLostStopsSidecar(t *testing.T) {
	fb := &flakyBackend{fakeBackend: fakeBackend{inputs: []string{"x"}}}
	fb.down.Store(true)
	sink, snd, runErr, stop := runOne(t, protectedChainGraph, fb, 100*time.Millisecond)
	defer stop()
	snd.Send(&hamsv1.Item{ReqId: 1, Tensors: []*hamsv1.Tensor{row(1, 2)}})
	wantBackendLost(t, runErr, "")
	if n := sink.count(); n != 0 {
		t.Fatalf("%d items reached the sink (the request must not fail)", n)
	}
}

func TestNegativeBackendLostAfterRejected(t *testing.T) {
	dep, err := config.Parse([]byte(protectedChainGraph))
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{Deployment: dep, Model: "a", Backend: &fakeBackend{}, Resolver: edge.NewStaticResolver(nil),
		GRPCListener: listen(t), BackendLostAfter: -time.Second})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("New: %v, want ErrConfig", err)
	}
}

func statusErr(c codes.Code, msg string) error { return status.Error(c, msg) }

// wantBackendLost waits for the sidecar's Run to end with errBackendLost
// whose message holds says.
func wantBackendLost(t *testing.T, runErr <-chan error, says string) {
	t.Helper()
	select {
	case err := <-runErr:
		if !errors.Is(err, errBackendLost) || !strings.Contains(err.Error(), says) {
			t.Fatalf("Run: %v, want errBackendLost saying %q", err, says)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sidecar still running with its backend lost")
	}
}

// heldWriter is a counter backend whose WriteState blocks until release
// is closed (a backup's model server that is slow or about to die).
type heldWriter struct {
	*counterBackend
	release chan struct{}
}

func (h *heldWriter) WriteState(ctx context.Context, ts []*hamsv1.Tensor, version uint64) error {
	select {
	case <-h.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return h.counterBackend.WriteState(ctx, ts, version)
}

// A backup acknowledges a snapshot as applied only once it installed the
// state and recorded its requests (audit, lineage index): the ack that
// answers the shipment comes before that. The model server write is not
// waited for (write-behind; the promotion flushes it).
func TestBackupAckAppliedMeansRecorded(t *testing.T) {
	hw := &heldWriter{counterBackend: newCounter(2), release: make(chan struct{})}
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), nil, map[string]Backend{"a": hw}, replOpts{})
	defer h.stop()
	rc := replicationClient(t, h.backups["a"])
	state := row(3, 2)
	ship := func(batch uint64) *hamsv1.ShipSnapshotResponse {
		t.Helper()
		return shipOneChunk(t, rc, &hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: batch, StateBytes: 8,
			StateTensors: []*hamsv1.TensorSpec{{Name: "x", Datatype: "FP32", Shape: []int64{1, 2}}},
			Requests:     []*hamsv1.RequestRecord{{ReqId: batch, Seq: batch}}}, 0, state.Data)
	}
	// No PFM: the apply of batch 1 is decided at once; the answer to the
	// shipment does not wait for it.
	if r := ship(1); r.GetApplied() {
		t.Fatal("batch 1 acknowledged as applied on receipt")
	}
	waitFor(t, "batch 1 applied", func() bool { return maxSeqOf(h.backups["a"]) == 1 })
	recs, err := audit.ReadAll[audit.Durable](h.audit, audit.DurableFile)
	if err != nil || len(recs) != 1 || recs[0].Seq != 1 {
		t.Fatalf("audit records of an applied batch: %v %v", recs, err)
	}
	// A duplicate of an applied batch is acknowledged as applied, while
	// the model server write is still held.
	if r := ship(1); !r.GetApplied() {
		t.Fatal("applied batch 1 not acknowledged as applied")
	}
	hw.mu.Lock()
	writes := hw.writes
	hw.mu.Unlock()
	if writes != 0 {
		t.Fatalf("the held write completed (%d writes)", writes)
	}
	close(hw.release)
	waitFor(t, "the model server written", func() bool { return hw.Digest() == hamsDigest(state.Data) })
}

// heldRangeWriter is a delta counter whose writes (whole and partial)
// block until release is closed, and report each call on entered.
type heldRangeWriter struct {
	*counterBackend
	release chan struct{}
	entered chan struct{}
}

func (h *heldRangeWriter) hold(ctx context.Context) error {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *heldRangeWriter) WriteState(ctx context.Context, ts []*hamsv1.Tensor, version uint64) error {
	if err := h.hold(ctx); err != nil {
		return err
	}
	return h.counterBackend.WriteState(ctx, ts, version)
}

func (h *heldRangeWriter) WriteStateRanges(ctx context.Context, specs []*hamsv1.TensorSpec, base, version uint64, ranges []*hamsv1.StateRange) error {
	if err := h.hold(ctx); err != nil {
		return err
	}
	return h.counterBackend.WriteStateRanges(ctx, specs, base, version, ranges)
}

// A backup applies (and acknowledges, and announces) without waiting for
// its model server: the write follows behind. A promotion writes what the
// model server lacks before the new primary runs, so it computes on the
// durable state.
func TestBackupWritesBehindAndPromotionFlushes(t *testing.T) {
	r := newRig(t, fmt.Sprintf(oneStateful, "nspb"))
	hw := &heldRangeWriter{counterBackend: newDeltaCounter(8), release: make(chan struct{}), entered: make(chan struct{}, 1)}
	back := r.start("a", hw, config.RoleBackup, 1, false, nil)
	pbe := newDeltaCounter(8)
	prim := r.start("a", pbe, config.RolePrimary, 1, true, nil)
	r.send(1, 12)
	waitFor(t, "12 replies", func() bool { return r.sink.count() == 12 })
	waitFor(t, "the backup applied every request", func() bool { return maxSeqOf(back.sc) == 12 })
	waitFor(t, "the primary knows", func() bool { a := prim.sc.prim.ship.Applied(); return a != nil && a.seq == 12 })
	// The primary installs its last batch a little after computing it.
	waitFor(t, "the primary installed what the backup applied", func() bool { return pbe.Digest() == bkStateDigest(back.sc) })
	hw.mu.Lock()
	writes := hw.writes
	hw.mu.Unlock()
	if writes != 0 {
		t.Fatalf("%d writes reached the held model server", writes)
	}
	prim.kill()
	<-hw.entered // the writer's held write
	canceled := stageCanceled(t, back.sc)
	done := make(chan error, 1)
	go func() {
		_, err := r.client(back.addr).Promote(context.Background(), &hamsv1.PromoteRequest{Model: "a", Epoch: 2})
		done <- err
	}()
	<-canceled
	// The promotion waits for the write in progress (a write cut off on
	// the client side may land later, over the promotion's own).
	select {
	case err := <-done:
		t.Fatalf("Promote returned (%v) before the model server had the state", err)
	default:
	}
	close(hw.release)
	if err := <-done; err != nil {
		t.Fatalf("Promote: %v", err)
	}
	if got := hw.Digest(); got != pbe.Digest() {
		t.Fatalf("promoted model server holds %s, the durable state is %s", got, pbe.Digest())
	}
}

// rangeWritesOf counts the range writes a delta counter took (the
// base's whole write is counted by writes too, once).
func rangeWritesOf(c *counterBackend) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// At batch 1 every snapshot used to be one write to the backup's model
// server. Range writes are spaced (rangeWriteSpacing): the snapshots
// applied in between go out as one write of their merged ranges, and a
// promotion writes what is still pending, so the promoted model server
// holds the durable state. Without the spacing (0) every snapshot is a
// write of its own: the check below sees it.
func TestBackupSpacesRangeWrites(t *testing.T) {
	for _, tc := range []struct {
		name    string
		spacing time.Duration
		spaced  bool
	}{{"spaced", time.Hour, true}, {"unspaced", 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(d time.Duration) { rangeWriteSpacing = d }(rangeWriteSpacing)
			rangeWriteSpacing = tc.spacing
			r := newRig(t, fmt.Sprintf(oneStateful, "nspb"))
			bbe := newDeltaCounter(8)
			back := r.start("a", bbe, config.RoleBackup, 1, false, nil)
			pbe := newDeltaCounter(8)
			prim := r.start("a", pbe, config.RolePrimary, 1, true, nil)
			const requests = 10
			for i := uint64(1); i <= requests; i++ {
				r.send(i, i)
				waitFor(t, "the backup applied the request", func() bool { return maxSeqOf(back.sc) == i })
				if !tc.spaced {
					// Each write goes before the next request.
					waitFor(t, "the model server has it", func() bool { return bbe.Digest() == bkStateDigest(back.sc) })
				}
			}
			waitFor(t, "the primary installed what the backup applied", func() bool { return pbe.Digest() == bkStateDigest(back.sc) })
			// base (whole) + the first range write, then all held.
			writes := rangeWritesOf(bbe)
			if tc.spaced && writes > 2 {
				t.Fatalf("%d writes for %d snapshots with range writes spaced by %v", writes, requests, tc.spacing)
			}
			if !tc.spaced {
				if writes < requests {
					t.Fatalf("%d writes for %d snapshots written one by one", writes, requests)
				}
				return
			}
			if bbe.Digest() == pbe.Digest() {
				t.Fatal("the held writes reached the model server before the promotion")
			}
			prim.kill()
			if err := <-r.promoteAsync(back); err != nil {
				t.Fatalf("Promote: %v", err)
			}
			if got := bbe.Digest(); got != pbe.Digest() {
				t.Fatalf("promoted model server holds %s, the durable state is %s", got, pbe.Digest())
			}
			if writes := rangeWritesOf(bbe); writes != 3 {
				t.Fatalf("the promotion wrote the pending ranges in %d writes, want 1 (3 in all)", writes-2)
			}
		})
	}
}

// stageCanceled returns a channel closed when sc's role stage is
// canceled (a transition has begun and waits for the stage's goroutines).
func stageCanceled(t *testing.T, sc *Sidecar) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	hook := func(s *Sidecar) {
		if s == sc {
			once.Do(func() { close(ch) })
		}
	}
	testHookStageCanceled.Store(&hook)
	t.Cleanup(func() { testHookStageCanceled.Store(nil) })
	return ch
}

// A verdict for a gated range write.
type verdict int

const (
	// pass: the write goes to the model server and its answer back.
	pass verdict = iota
	// landLost: the write lands on the model server, its answer is
	// lost (the caller gets Unavailable).
	landLost
)

// gatedDeltaWriter is a delta counter whose whole-state writes pass (and
// are counted) and whose range writes each report on entered and wait
// for a verdict on gate. A range write whose caller gives up (ctx ends)
// is still carried out with the verdict it gets later, as a write cut
// off on the client side may land on a model server.
type gatedDeltaWriter struct {
	*counterBackend
	entered chan struct{}
	gate    chan verdict
	full    atomic.Int32
}

func newGatedDeltaWriter() *gatedDeltaWriter {
	return &gatedDeltaWriter{counterBackend: newDeltaCounter(8), entered: make(chan struct{}, 16), gate: make(chan verdict)}
}

func (h *gatedDeltaWriter) WriteState(ctx context.Context, ts []*hamsv1.Tensor, version uint64) error {
	h.full.Add(1)
	return h.counterBackend.WriteState(ctx, ts, version)
}

func (h *gatedDeltaWriter) WriteStateRanges(ctx context.Context, specs []*hamsv1.TensorSpec, base, version uint64, ranges []*hamsv1.StateRange) error {
	h.entered <- struct{}{}
	carry := func(v verdict) error {
		err := h.counterBackend.WriteStateRanges(context.Background(), specs, base, version, ranges)
		if err == nil && v == landLost {
			return status.Error(codes.Unavailable, "connection reset (the write landed)")
		}
		return err
	}
	select {
	case v := <-h.gate:
		return carry(v)
	case <-ctx.Done():
		go func() { _ = carry(<-h.gate) }()
		return ctx.Err()
	}
}

// enter waits for the next range write to reach the model server.
func (h *gatedDeltaWriter) enter(t *testing.T) {
	t.Helper()
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("no range write reached the model server (%d whole-state writes)", h.full.Load())
	}
}

// oneStatefulPair runs the primary and the backup of a stateful model a
// with delta snapshots; the backup writes to w. It returns them once the
// backup's writer is held in its first range write, with a dozen more
// requests answered and applied behind it, and the primary's model
// server (which installs its last batch a little after computing it) at
// the state the backup applied.
func oneStatefulPair(t *testing.T, w *gatedDeltaWriter) (r *rig, prim, back *inst, pbe *counterBackend) {
	r = newRig(t, fmt.Sprintf(oneStateful, "nspb"))
	back = r.start("a", w, config.RoleBackup, 1, false, nil)
	pbe = newDeltaCounter(8)
	prim = r.start("a", pbe, config.RolePrimary, 1, true, nil)
	// A delta that arrives while the base is pending joins the base's
	// whole write, so requests go in small groups until a range write
	// reaches the model server.
	next := uint64(1)
	for held := false; !held; {
		if next > 200 {
			t.Fatalf("no range write reached the model server after %d requests", next-1)
		}
		r.send(next, next+3)
		next += 4
		waitFor(t, "replies", func() bool { return r.sink.count() == int(next-1) })
		select {
		case <-w.entered:
			held = true
		case <-time.After(50 * time.Millisecond):
		}
	}
	last := next + 11
	r.send(next, last)
	waitFor(t, "replies behind the held write", func() bool { return r.sink.count() == int(last) })
	waitFor(t, "the backup applied every request", func() bool { return maxSeqOf(back.sc) == last })
	waitFor(t, "the primary knows", func() bool { a := prim.sc.prim.ship.Applied(); return a != nil && a.seq == last })
	waitFor(t, "the primary installed what the backup applied", func() bool { return pbe.Digest() == bkStateDigest(back.sc) })
	if w.full.Load() != 1 {
		t.Fatalf("%d whole-state writes before the promotion, want 1 (the base)", w.full.Load())
	}
	return r, prim, back, pbe
}

// promote asks back to become the primary at epoch 2, in the background.
func (r *rig) promoteAsync(back *inst) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := r.client(back.addr).Promote(context.Background(), &hamsv1.PromoteRequest{Model: "a", Epoch: 2})
		done <- err
	}()
	return done
}

// A promotion that finds the write-behind in the middle of a range write
// lets it finish, then writes the deltas applied after it as a range
// write: the model server ends at the durable state without a
// whole-state write.
func TestPromotionFlushWritesOnlyTheUnwrittenDeltas(t *testing.T) {
	w := newGatedDeltaWriter()
	r, prim, back, pbe := oneStatefulPair(t, w)
	prim.kill()
	canceled := stageCanceled(t, back.sc)
	done := r.promoteAsync(back)
	<-canceled
	w.gate <- pass // the writer's write completes
	w.enter(t)     // the promotion's flush of the later deltas
	w.gate <- pass
	if err := <-done; err != nil {
		t.Fatalf("Promote: %v", err)
	}
	if got := w.Digest(); got != pbe.Digest() {
		t.Fatalf("promoted model server holds %s, the durable state is %s", got, pbe.Digest())
	}
	if n := w.full.Load(); n != 1 {
		t.Fatalf("the promotion wrote the whole state (%d whole-state writes)", n)
	}
}

// A range write that landed on the model server but whose answer was
// lost, with the role changing meanwhile: the promotion's range write on
// the old base is refused, and the promotion writes the whole state.
func TestPromotionFlushAfterALostAnswerWritesTheWholeState(t *testing.T) {
	w := newGatedDeltaWriter()
	r, prim, back, pbe := oneStatefulPair(t, w)
	prim.kill()
	canceled := stageCanceled(t, back.sc)
	done := r.promoteAsync(back)
	<-canceled
	w.gate <- landLost // the writer's write lands; the writer stops without retrying
	w.enter(t)         // the flush: failed and pending ranges on the old base
	w.gate <- pass     // refused: the model server is past that base
	if err := <-done; err != nil {
		t.Fatalf("Promote: %v", err)
	}
	if got := w.Digest(); got != pbe.Digest() {
		t.Fatalf("promoted model server holds %s, the durable state is %s", got, pbe.Digest())
	}
	if n := w.full.Load(); n != 2 {
		t.Fatalf("%d whole-state writes, want 2 (the base and the promotion's)", n)
	}
}

// A range write that landed but whose answer was lost, in steady state:
// the retry on the same base is refused, and the writer writes the whole
// state instead of failing the backup.
func TestBackupWriteWhoseAnswerWasLostTurnsWhole(t *testing.T) {
	w := newGatedDeltaWriter()
	_, _, back, pbe := oneStatefulPair(t, w)
	w.gate <- landLost
	w.enter(t) // the retry
	w.gate <- pass
	waitFor(t, "the backup's model server at the durable state", func() bool { return w.Digest() == pbe.Digest() })
	if d := bkStateDigest(back.sc); d != pbe.Digest() {
		t.Fatalf("backup applied %s, primary is at %s", d, pbe.Digest())
	}
	if n := w.full.Load(); n != 2 {
		t.Fatalf("%d whole-state writes, want 2 (the base and the one after the refusal)", n)
	}
}

// A backup with no base yet (a spare) prefaults two state-sized buffers:
// the base it receives lands in one, and the first delta, arriving while
// the base is being written to the model server, patches a copy made in
// the other. Neither faults fresh pages on the failover path.
func TestSpareReceivesIntoWarmBuffers(t *testing.T) {
	const width = warmMinBytes / 4 // FP32 elements: a 4 MiB state
	hw := &heldRangeWriter{counterBackend: newDeltaCounter(width), release: make(chan struct{}), entered: make(chan struct{}, 1)}
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), nil, map[string]Backend{"a": hw}, replOpts{})
	defer h.stop()
	bk := h.backups["a"].backupNow()
	var warm [][]byte
	waitFor(t, "two warm buffers", func() bool {
		bk.mu.Lock()
		defer bk.mu.Unlock()
		warm = slices.Clone(bk.warm)
		return len(warm) == 2
	})
	rc := replicationClient(t, h.backups["a"])
	ship := func(hdr *hamsv1.SnapshotHeader, off uint64, data []byte) { shipOneChunk(t, rc, hdr, off, data) }
	specs := []*hamsv1.TensorSpec{{Name: "counter", Datatype: "FP32", Shape: []int64{width}}}
	base := make([]byte, 4*width)
	for i := range base {
		base[i] = byte(i * 7)
	}
	ship(&hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: 1, StateBytes: uint64(len(base)), StateTensors: specs,
		Requests: []*hamsv1.RequestRecord{{ReqId: 1, Seq: 1}}}, 0, base)
	waitFor(t, "the base applied", func() bool { return maxSeqOf(h.backups["a"]) == 1 })
	inWarm := func(b []byte) int {
		for i, w := range warm {
			if aliases(b, w) {
				return i
			}
		}
		return -1
	}
	bk.mu.Lock()
	first := inWarm(bk.cur)
	bk.mu.Unlock()
	if first < 0 {
		t.Fatal("the base was not received into a warm buffer")
	}
	<-hw.entered // the base is being written to the model server (held)
	patch := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	ship(&hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: 2, StateBytes: uint64(len(base)), StateTensors: specs, Delta: true,
		DeltaBytes: uint64(len(patch)), Requests: []*hamsv1.RequestRecord{{ReqId: 2, Seq: 2}}}, 64, patch)
	waitFor(t, "the delta applied", func() bool { return maxSeqOf(h.backups["a"]) == 2 })
	want := slices.Clone(base)
	copy(want[64:], patch)
	bk.mu.Lock()
	second, left, cur := inWarm(bk.cur), len(bk.warm), slices.Clone(bk.cur)
	bk.mu.Unlock()
	if second < 0 || second == first || left != 0 {
		t.Fatalf("the delta's copy of cur: warm buffer %d (base in %d), %d warm left; want the other one, none left", second, first, left)
	}
	if !bytes.Equal(cur, want) {
		t.Fatal("the backup's state is not the base with the delta patched in")
	}
	if !bytes.Equal(warm[first], base) {
		t.Fatal("the base being written was patched under the write")
	}
	close(hw.release)
	waitFor(t, "the model server at the applied state", func() bool { return hw.Digest() == hamsDigest(want) })
}

// replicationClient is a Replication client of sidecar sc, closed with the
// test.
func replicationClient(t *testing.T, sc *Sidecar) hamsv1.ReplicationClient {
	t.Helper()
	cc, err := grpcx.Dial(sc.cfg.GRPCListener.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return hamsv1.NewReplicationClient(cc)
}

// shipOneChunk ships a snapshot whose data is one chunk at off.
func shipOneChunk(t *testing.T, rc hamsv1.ReplicationClient, hdr *hamsv1.SnapshotHeader, off uint64, data []byte) *hamsv1.ShipSnapshotResponse {
	t.Helper()
	st, err := rc.ShipSnapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&hamsv1.SnapshotChunk{Part: &hamsv1.SnapshotChunk_Header{Header: hdr}}); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&hamsv1.SnapshotChunk{Part: &hamsv1.SnapshotChunk_Data{Data: data}, Offset: off, StateDigest: deltaDigestOf(data)}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.CloseAndRecv()
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// The whole write of a base just installed waits for the first delta
// after it (bounded by wholeWriteHold, here longer than the test): the
// model server gets one whole write of the state with the delta patched
// in, not the base and then the delta.
func TestBaseWholeWriteWaitsForTheFirstDelta(t *testing.T) {
	defer func(d time.Duration) { wholeWriteHold = d }(wholeWriteHold)
	wholeWriteHold = time.Hour
	const width = 16
	be := newDeltaCounter(width)
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), nil, map[string]Backend{"a": be}, replOpts{})
	defer h.stop()
	rc := replicationClient(t, h.backups["a"])
	specs := []*hamsv1.TensorSpec{{Name: "counter", Datatype: "FP32", Shape: []int64{width}}}
	base := make([]byte, 4*width)
	for i := range base {
		base[i] = byte(3 * i)
	}
	shipOneChunk(t, rc, &hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: 1, StateBytes: uint64(len(base)), StateTensors: specs,
		Requests: []*hamsv1.RequestRecord{{ReqId: 1, Seq: 1}}}, 0, base)
	waitFor(t, "the base applied", func() bool { return maxSeqOf(h.backups["a"]) == 1 })
	patch := []byte{9, 9, 9, 9}
	shipOneChunk(t, rc, &hamsv1.SnapshotHeader{Model: "a", Epoch: 1, BatchId: 2, StateBytes: uint64(len(base)), StateTensors: specs, Delta: true,
		DeltaBytes: uint64(len(patch)), Requests: []*hamsv1.RequestRecord{{ReqId: 2, Seq: 2}}}, 8, patch)
	want := slices.Clone(base)
	copy(want[8:], patch)
	waitFor(t, "the model server at the patched state", func() bool { return be.Digest() == hamsDigest(want) })
	if w := be.Written(); len(w) != 1 {
		t.Fatalf("%d writes to the model server, want one whole write after the delta", len(w))
	}
}

// stateAdvancingBackend advances its state on every Infer that reaches it
// (as a stateful model server does); while lose is set, the answer of such
// a call is lost (Unavailable: a connection reset after processing).
type stateAdvancingBackend struct {
	fakeBackend
	lose    atomic.Bool
	applied atomic.Int64
}

func (f *stateAdvancingBackend) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	f.applied.Add(1)
	if f.lose.Load() {
		return nil, statusErr(codes.Unavailable, "connection reset by peer")
	}
	return f.fakeBackend.Infer(ctx, req)
}

// statelessStatefulGraph: one stateful model served ha: stateless (a
// standby, no state replication).
const statelessStatefulGraph = `
name: t
mode: nspb
models:
  - {name: a, kind: fake, stateful: true, ha: stateless, batch: {size: 1}}
services:
  - name: s
    edges: [[frontend, a], [a, frontend]]
`

// The Infer of a stateful model is never repeated after a lost answer (the
// server may have applied it): the sidecar stops at once (fail-stop) with
// the batch applied once and its requests not failed, where a stateless
// model's batch is held and retried (TestBackendUnavailableHoldsBatch...).
func TestStatefulInferNotRepeatedAfterLostAnswer(t *testing.T) {
	// run() is the live path of every mode (the replay baseline's too) and
	// replay's re-execution calls the same backendPolicy.call.
	for _, mode := range []string{"ha-stateless", "ha-off"} {
		t.Run(mode, func(t *testing.T) {
			y := statelessStatefulGraph
			if mode == "ha-off" {
				y = strings.Replace(y, "ha: stateless", "ha: off", 1)
			}
			fb := &stateAdvancingBackend{fakeBackend: fakeBackend{inputs: []string{"x"}}}
			fb.lose.Store(true)
			sink, snd, runErr, stop := runOne(t, y, fb, time.Minute)
			defer stop()
			snd.Send(&hamsv1.Item{ReqId: 1, Tensors: []*hamsv1.Tensor{row(1, 2)}})
			wantBackendLost(t, runErr, "")
			if n := fb.applied.Load(); n != 1 {
				t.Fatalf("the batch reached the stateful backend %d times, want 1", n)
			}
			if n := sink.count(); n != 0 {
				t.Fatalf("%d items reached the sink (the request must not fail)", n)
			}
		})
	}
}

// repeatableBackend is stateAdvancingBackend for an adapter that owns the
// state (RepeatableInfer): a lost answer changed nothing in the server.
type repeatableBackend struct{ stateAdvancingBackend }

func (*repeatableBackend) InferRepeatable() bool { return true }

// A stateful model whose adapter owns its state (TF Serving, Triton) keeps
// the stateless rule: the batch is held and retried while the backend is
// unreachable, and the sidecar keeps running.
func TestRepeatableStatefulInferHeld(t *testing.T) {
	y := statelessStatefulGraph
	fb := &repeatableBackend{stateAdvancingBackend{fakeBackend: fakeBackend{inputs: []string{"x"}}}}
	fb.lose.Store(true)
	sink, snd, runErr, stop := runOne(t, y, fb, time.Minute)
	defer stop()
	snd.Send(&hamsv1.Item{ReqId: 1, Tensors: []*hamsv1.Tensor{row(1, 2)}})
	waitFor(t, "retries of the held batch", func() bool { return fb.applied.Load() >= 3 })
	fb.lose.Store(false)
	waitFor(t, "the reply after the backend came back", func() bool { return sink.count() >= 1 })
	select {
	case err := <-runErr:
		t.Fatalf("sidecar stopped: %v", err)
	default:
	}
}

// restartingCounter is a counter model server that can be restarted under
// its sidecar: from restart on, it has lost whatever it staged (a fresh
// process), so an Update names a batch it never computed.
type restartingCounter struct {
	*counterBackend
	restarted atomic.Bool
	// fresh: the restart happened between an Update and the next
	// Compute, so no Update fails: the next Compute runs on the initial
	// state (version 0) of a fresh process.
	fresh atomic.Bool
}

func (r *restartingCounter) Compute(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	if r.restarted.Load() && req.InstallBatchId != 0 {
		// A fresh process has nothing staged for the folded update (the
		// reference server's answer).
		return nil, status.Errorf(codes.FailedPrecondition, "update of batch %d, nothing staged", req.InstallBatchId)
	}
	if r.fresh.CompareAndSwap(true, false) {
		r.mu.Lock()
		clear(r.staged)
		clear(r.state)
		r.version = 0
		r.mu.Unlock()
	}
	return r.counterBackend.Compute(ctx, req)
}

func (r *restartingCounter) Update(ctx context.Context, batch uint64) error {
	if r.restarted.Load() {
		r.mu.Lock()
		clear(r.staged)
		r.mu.Unlock()
	}
	return r.counterBackend.Update(ctx, batch)
}

// A model server restarted under a living primary sidecar has lost the
// state: its Update answers FailedPrecondition (nothing staged). That is
// the loss of the instance: the sidecar stops at once (errBackendLost, so
// the manager fails it over) and fails no request to a client; it does not
// retry an Update that cannot succeed.
func TestModelServerRestartedUnderPrimaryStopsIt(t *testing.T) {
	for _, c := range []struct {
		name, says string
		restart    func(*restartingCounter)
	}{
		{"update finds nothing staged", "lost the state it staged", func(r *restartingCounter) { r.restarted.Store(true) }},
		{"compute from the initial state", "is not above", func(r *restartingCounter) { r.fresh.Store(true) }},
	} {
		t.Run(c.name, func(t *testing.T) { modelServerRestartedUnderPrimary(t, newCounter(16), c.restart, c.says) })
	}
	// With deltas the next compute carries the update (install_batch_id):
	// its FailedPrecondition is the same loss.
	t.Run("compute carrying the update finds nothing staged", func(t *testing.T) {
		modelServerRestartedUnderPrimary(t, newDeltaCounter(16), func(r *restartingCounter) { r.restarted.Store(true) }, "lost the state it staged")
	})
}

func modelServerRestartedUnderPrimary(t *testing.T, be *counterBackend, restart func(*restartingCounter), says string) {
	prim := &restartingCounter{counterBackend: be}
	lost := make(chan error, 1)
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": prim}, map[string]Backend{"a": newCounter(16)}, replOpts{
		runErr: func(name string, err error) bool {
			if name == "a" && errors.Is(err, errBackendLost) {
				lost <- err
				return true
			}
			return false
		},
	})
	defer h.stop()
	h.send(1, 8)
	waitFor(t, "replies before the restart", func() bool { return h.sink.count() >= 8 })
	restart(prim)
	h.send(9, 40)
	select {
	case err := <-lost:
		if !strings.Contains(err.Error(), says) {
			t.Fatalf("Run: %v, want the lost staged state named", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the primary sidecar still runs on a model server that lost its state")
	}
	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	for id, its := range h.sink.items {
		for _, it := range its {
			if it.GetError() != "" {
				t.Fatalf("request %d failed to the client: %s", id, it.GetError())
			}
		}
	}
}
