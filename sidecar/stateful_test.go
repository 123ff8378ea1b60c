package sidecar

import (
	"context"
	"fmt"
	"github.com/hams-go/hams/internal/testing/natstest"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/coord"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// counterBackend is a fake stateful model: its state is a counter vector
// of width FP32 values. Compute outputs x + state[0] per row and stages
// state + (batch id) + (sum of inputs); Update installs it. With
// slowUpdate, Update writes the two halves of the state with a yield in
// between (a copy taken during an update would see a mix). Every state it
// ever installed is remembered by digest.
type counterBackend struct {
	width      int
	slowUpdate bool
	onCompute  func(batch uint64)
	// delta: Describe advertises state deltas; a batch changes only
	// elements 0 and 1+batch%(width-1), and Compute returns them as
	// ranges when asked; WriteStateRanges patches.
	delta bool

	mu       sync.Mutex
	state    []float32
	version  uint64
	staged   map[uint64][]float32
	history  map[string]uint64 // digest -> version
	computes int
	folded   int // updates carried out by a compute (install_batch_id)
	writes   int
	// written: digests of every state a write installed, in order.
	written []string
}

// newDeltaCounter is newCounter with state deltas.
func newDeltaCounter(width int) *counterBackend {
	c := newCounter(width)
	c.delta = true
	return c
}

// firstSnapshot is the id of the first snapshot covering requests: with
// delta snapshots, snapshot 1 is the initial state, the backup's base.
func firstSnapshot(delta bool) uint64 {
	if delta {
		return 2
	}
	return 1
}

// bkStateDigest is the digest of the state a backup applied (its copy).
func bkStateDigest(s *Sidecar) string {
	bk := s.backupNow()
	bk.mu.Lock()
	defer bk.mu.Unlock()
	return hamsDigest(bk.cur)
}

// touched is the elements batch changes (delta mode), increasing.
func (c *counterBackend) touched(batch uint64) []int {
	if !c.delta {
		return nil
	}
	j := 1 + int(batch%uint64(c.width-1))
	return []int{0, j}
}

// deltaCounters: newCounter makes counters with state deltas
// (bothStateKinds sets it).
var deltaCounters bool

// bothStateKinds runs f once with counters that ship full states (copy
// after update) and once with counters whose compute returns deltas
// (capture at compute, delta snapshots).
func bothStateKinds(t *testing.T, f func(t *testing.T, delta bool)) {
	for _, d := range []bool{false, true} {
		t.Run(map[bool]string{false: "full", true: "delta"}[d], func(t *testing.T) {
			deltaCounters = d
			defer func() { deltaCounters = false }()
			f(t, d)
		})
	}
}

func newCounter(width int) *counterBackend {
	c := &counterBackend{width: width, state: make([]float32, width), staged: map[uint64][]float32{}, history: map[string]uint64{}, delta: deltaCounters}
	c.history[c.digestLocked()] = 0
	return c
}

func (c *counterBackend) digestLocked() string {
	return tensor.Digest(tensor.FromFloat32("counter", []int64{int64(c.width)}, c.state))
}

// settled reports whether every staged update was installed. With
// deltas captured at compute the backup may apply a batch's state before
// the primary's model server installs it (the install is folded into the
// next compute, or runs foldIdle after the last one), so a comparison of
// the two waits for this first.
func (c *counterBackend) settled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.staged) == 0
}

func (c *counterBackend) Digest() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.digestLocked()
}

func (c *counterBackend) Describe(context.Context) (*hamsv1.ModelDescription, error) {
	return &hamsv1.ModelDescription{Name: "counter", Kind: "counter", Stateful: true,
		Inputs: []*hamsv1.TensorSpec{{Name: AnyInput}}, StateBytes: uint64(4 * c.width), StateDelta: c.delta, ComputeInstalls: c.delta}, nil
}

func (c *counterBackend) Compute(_ context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	if c.onCompute != nil {
		c.onCompute(req.BatchId)
	}
	x, err := tensor.Float32(req.Inputs[0])
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.InstallBatchId != 0 {
		if !c.delta {
			return nil, status.Error(codes.InvalidArgument, "install_batch_id not supported")
		}
		c.mu.Lock()
		_, staged := c.staged[req.InstallBatchId]
		c.mu.Unlock()
		if staged {
			if err := c.Update(context.Background(), req.InstallBatchId); err != nil {
				return nil, err
			}
			c.mu.Lock()
			c.folded++
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.computes++
	out := make([]float32, len(x))
	var sum float32
	for i, v := range x {
		out[i] = v + c.state[0]
		sum += v
	}
	next := make([]float32, c.width)
	for i := range next {
		next[i] = c.state[i] + float32(req.BatchId) + sum
	}
	resp := &hamsv1.BatchResponse{Outputs: []*hamsv1.Tensor{tensor.FromFloat32("out", req.Inputs[0].Shape, out)},
		Rows: req.Rows, BatchId: req.BatchId, NextStateVersion: c.version + 1}
	if c.delta {
		copy(next, c.state)
		for _, i := range c.touched(req.BatchId) {
			next[i] = c.state[i] + float32(req.BatchId) + sum
			if req.StageDelta {
				resp.StateDelta = append(resp.StateDelta, &hamsv1.StateRange{Offset: uint64(4 * i),
					Data: tensor.FromFloat32("", []int64{1}, next[i:i+1]).Data})
			}
		}
		resp.HasStateDelta = req.StageDelta
	}
	c.staged[req.BatchId] = next
	return resp, nil
}

func (c *counterBackend) Update(_ context.Context, batch uint64) error {
	c.mu.Lock()
	next, ok := c.staged[batch]
	if !ok {
		c.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "no staged state for batch %d", batch)
	}
	delete(c.staged, batch)
	half := c.width / 2
	copy(c.state[:half], next[:half])
	if c.slowUpdate {
		c.mu.Unlock()
		runtime.Gosched()
		time.Sleep(50 * time.Microsecond) // widen the window a racing copy would hit
		c.mu.Lock()
	}
	copy(c.state[half:], next[half:])
	c.version++
	c.history[c.digestLocked()] = c.version
	c.mu.Unlock()
	return nil
}

func (c *counterBackend) ReadState(context.Context) ([]*hamsv1.Tensor, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return []*hamsv1.Tensor{tensor.FromFloat32("counter", []int64{int64(c.width)}, append([]float32(nil), c.state...))}, c.version, nil
}

func (c *counterBackend) WriteState(_ context.Context, ts []*hamsv1.Tensor, version uint64) error {
	if len(ts) != 1 {
		return status.Errorf(codes.InvalidArgument, "%d state tensors", len(ts))
	}
	v, err := tensor.Float32(ts[0])
	if err != nil || len(v) != c.width {
		return status.Errorf(codes.InvalidArgument, "state tensor: %v (%d values)", err, len(v))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	copy(c.state, v)
	c.version = version
	c.writes++
	c.written = append(c.written, c.digestLocked())
	return nil
}

func (c *counterBackend) WriteStateRanges(_ context.Context, specs []*hamsv1.TensorSpec, base, version uint64, ranges []*hamsv1.StateRange) error {
	if !c.delta {
		return status.Error(codes.Unimplemented, "no state ranges")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.version != base {
		return status.Errorf(codes.FailedPrecondition, "base version %d, installed %d", base, c.version)
	}
	for _, r := range ranges {
		v, err := tensor.Float32(&hamsv1.Tensor{Datatype: tensor.FP32, Shape: []int64{int64(len(r.Data) / 4)}, Data: r.Data})
		if err != nil || r.Offset%4 != 0 || int(r.Offset/4)+len(v) > c.width {
			return status.Errorf(codes.InvalidArgument, "range at %d: %v", r.Offset, err)
		}
		copy(c.state[r.Offset/4:], v)
	}
	c.version = version
	c.writes++
	c.written = append(c.written, c.digestLocked())
	return nil
}

// Written returns the digests of the states writes installed.
func (c *counterBackend) Written() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.written)
}

func (c *counterBackend) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	resp, err := c.Compute(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp, c.Update(ctx, req.BatchId)
}

func (c *counterBackend) Health(context.Context) error { return nil }
func (c *counterBackend) Close() error                 { return nil }

// backupMap is a BackupResolver over a table.
type backupMap struct {
	mu sync.Mutex
	m  map[string]string
}

func (b *backupMap) ResolveBackup(model string) (string, uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.m[model]
	return a, 1, ok
}

func natsConn(t testing.TB) *nats.Conn { return natstest.Connect(t) }

// durableSeen records durability notices in arrival order.
type durableSeen struct {
	mu    sync.Mutex
	max   map[string]uint64
	order []*hamsv1.DurabilityNotice
}

func (d *durableSeen) add(n *hamsv1.DurabilityNotice) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.order = append(d.order, n)
	if n.DurableSeq > d.max[n.Model] {
		d.max[n.Model] = n.DurableSeq
	}
}

func (d *durableSeen) get(m string) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.max[m]
}

type replHarness struct {
	*harness
	coord    *coord.Coord
	backups  map[string]*Sidecar
	durable  *durableSeen
	audit    string
	complete int
}

type replOpts struct {
	outputLog int64
	tweak     func(name string, s *Sidecar) // before Run
	// runErr, when set, is given a primary's or backup's Run error; it
	// reports whether the test expected it (else the test fails).
	runErr func(name string, err error) bool
	// certs, when set, runs every hop over mutual TLS: the sidecars with
	// certificates of their models, the frontend stand-in and its
	// senders with a frontend's.
	certs *testCerts
}

// startRepl runs a primary sidecar per primaries entry, a backup sidecar
// per backups entry, the frontend stand-in, and a Coord on an embedded
// JetStream; it watches the durability notices of every model.
func startRepl(t testing.TB, yaml string, primaries, backups map[string]Backend, o replOpts) *replHarness {
	t.Helper()
	dep, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	nc := natsConn(t)
	ctx, cancel := context.WithCancel(context.Background())
	co, err := coord.Open(ctx, nc, dep.Name, 1)
	if err != nil {
		t.Fatal(err)
	}
	h := &replHarness{
		harness: &harness{t: t, res: edge.NewStaticResolver(nil), sink: &collector{items: map[uint64][]*hamsv1.Item{}},
			senders: map[string]*edge.Sender{}, sidecars: map[string]*Sidecar{}, cancel: cancel},
		coord: co, backups: map[string]*Sidecar{}, durable: &durableSeen{max: map[string]uint64{}}, audit: t.TempDir(),
	}
	var models []string
	for _, m := range dep.Models {
		models = append(models, m.Name)
	}
	h.wg.Add(1)
	go func() { defer h.wg.Done(); _ = co.WatchDurable(ctx, models, h.durable.add) }()
	flis := listen(t)
	h.res.Set(config.Frontend, flis.Addr().String(), 0)
	var srvOpts []grpc.ServerOption
	var feDial []grpc.DialOption
	if o.certs != nil {
		fe := o.certs.source(t, dep.Name, pki.Identity{Role: pki.RoleFrontend, Instance: "0"})
		srvOpts = append(srvOpts, grpcx.ServerTLS(fe))
		feDial = append(feDial, grpcx.DialTLS(fe))
	}
	srv := grpc.NewServer(srvOpts...)
	hamsv1.RegisterDataplaneServer(srv, edge.NewReceiver(config.Frontend, h.sink.deliver, nil))
	h.wg.Add(1)
	go func() { defer h.wg.Done(); _ = srv.Serve(flis) }()
	h.wg.Add(1)
	go func() { defer h.wg.Done(); <-ctx.Done(); srv.Stop() }()
	bres := &backupMap{m: map[string]string{}}
	run := func(name string, sc *Sidecar) {
		if o.tweak != nil {
			o.tweak(name, sc)
		}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			if err := sc.Run(ctx); err != nil && (o.runErr == nil || !o.runErr(name, err)) {
				t.Errorf("sidecar %s (%s): %v", name, sc.role, err)
			}
		}()
	}
	for name, be := range backups {
		lis := listen(t)
		bres.m[name] = lis.Addr().String()
		sc, err := New(Config{Deployment: dep, Model: name, Backend: be, GRPCListener: lis, Role: config.RoleBackup,
			Coord: co, AuditDir: h.audit, Epoch: 1, TLS: o.certs.sidecar(t, dep.Name, name, "b")})
		if err != nil {
			t.Fatal(err)
		}
		h.backups[name] = sc
		run(name, sc)
	}
	for name, be := range primaries {
		lis := listen(t)
		h.res.Set(name, lis.Addr().String(), 1)
		sc, err := New(Config{Deployment: dep, Model: name, Backend: be, Resolver: h.res, GRPCListener: lis,
			Coord: co, BackupResolver: bres, Epoch: 1, OutputLogBytes: o.outputLog, TLS: o.certs.sidecar(t, dep.Name, name, "a")})
		if err != nil {
			t.Fatal(err)
		}
		h.sidecars[name] = sc
		run(name, sc)
	}
	for _, entry := range dep.Services[0].Graph().Entries() {
		s, err := edge.NewSender(edge.SenderConfig{From: config.Frontend, To: entry, Resolver: h.res, DialOptions: feDial})
		if err != nil {
			t.Fatal(err)
		}
		h.senders[entry] = s
		h.wg.Add(1)
		go func() { defer h.wg.Done(); _ = s.Run(ctx) }()
	}
	return h
}

// send sends requests first..last (one row of value id each) to every
// entry model.
func (h *replHarness) send(first, last uint64) {
	for id := first; id <= last; id++ {
		for _, s := range h.senders {
			s.Send(&hamsv1.Item{ReqId: id, Service: "s", StreamId: "s1", Tensors: []*hamsv1.Tensor{row(float32(id), 2)}})
		}
	}
}

// completeAll publishes completion notices for ids until cond holds
// (republished under a fresh frontend name, so a notice published before
// a watcher subscribed is not the only one).
func (h *replHarness) completeUntil(t *testing.T, ids []uint64, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	next := time.Now()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		if time.Now().After(next) {
			h.complete++
			if err := h.coord.Complete(context.Background(), &hamsv1.CompletionNotice{Frontend: fmt.Sprint("fe", h.complete), ReqIds: ids}); err != nil {
				t.Fatal(err)
			}
			next = time.Now().Add(200 * time.Millisecond)
		}
		time.Sleep(time.Millisecond)
	}
}

func maxSeqOf(s *Sidecar) uint64 {
	seq, _ := s.bk.MaxSeq()
	return seq
}

const oneStateful = `
name: t1
mode: %s
models:
  - {name: a, kind: counter, stateful: true, batch: {size: 4, max_wait: 1ms}, placement: {primary: h1, backup: h2}}
services:
  - name: s
    edges: [[frontend, a], [a, frontend]]
`

// (a) After N requests and quiescence the backup's state equals the
// primary's, every request is durable, and the audit log has one record
// per request.
func TestBackupConvergesToPrimary(t *testing.T) {
	bothTransports(t, func(t *testing.T, bulk bool) { backupConvergesToPrimary(t, bulk) })
}

// bothTransports runs f with every snapshot over ShipSnapshot, then over
// the bulk stream (every snapshot, however small).
func bothTransports(t *testing.T, f func(t *testing.T, bulk bool)) {
	for _, bulk := range []bool{false, true} {
		t.Run(map[bool]string{false: "grpc", true: "bulk"}[bulk], func(t *testing.T) {
			defer func(n uint64) { bulkMinBytes = n }(bulkMinBytes)
			bulkMinBytes = 0
			if !bulk {
				bulkMinBytes = 1 << 40
			}
			f(t, bulk)
		})
	}
}

func backupConvergesToPrimary(t *testing.T, bulk bool) {
	bothStateKinds(t, func(t *testing.T, delta bool) {
		for _, mode := range []string{"nspb", "remus", "nspb-s1", "nspb-s2"} {
			t.Run(mode, func(t *testing.T) {
				prim, back := newCounter(16), newCounter(16)
				h := startRepl(t, fmt.Sprintf(oneStateful, mode), map[string]Backend{"a": prim}, map[string]Backend{"a": back}, replOpts{})
				defer h.stop()
				defer func() {
					// The transport under test carried the snapshots.
					if got := counterValue(h.sidecars["a"].metrics.shipBulk) > 0; got != bulk && !t.Failed() {
						t.Errorf("snapshots over the bulk stream: %v, want %v", got, bulk)
					}
				}()
				const n = 60
				h.send(1, n)
				waitFor(t, "all replies", func() bool { return h.sink.count() >= n })
				waitFor(t, "backup durable to n", func() bool { return maxSeqOf(h.backups["a"]) == n })
				waitFor(t, "durability notice of n", func() bool { return h.durable.get("a") == n })
				waitFor(t, "the primary installed its last update", prim.settled)
				if d := bkStateDigest(h.backups["a"]); prim.Digest() != d {
					t.Fatalf("backup applied state %s != primary state %s", d, prim.Digest())
				}
				// Its model server follows (write-behind) and only ever
				// holds states the primary had.
				waitFor(t, "backup model server in sync", func() bool { return prim.Digest() == back.Digest() })
				prim.mu.Lock()
				folded := prim.folded
				prim.mu.Unlock()
				if delta && (mode == "nspb" || mode == "nspb-s1") && folded == 0 {
					t.Fatal("no update was carried out by the next compute (60 requests queue up behind batches of 4)")
				}
				for i, d := range back.Written() {
					if _, ok := prim.history[d]; !ok {
						t.Fatalf("write %d installed state %s, which the primary never had", i, d)
					}
				}
				h.sink.mu.Lock()
				for id := uint64(1); id <= n; id++ {
					if got := h.sink.items[id]; len(got) != 1 || got[0].Error != "" {
						t.Fatalf("req %d: %v", id, got)
					}
				}
				h.sink.mu.Unlock()
				h.stop()
				recs, err := audit.ReadAll[audit.Durable](h.audit, audit.DurableFile)
				if err != nil {
					t.Fatal(err)
				}
				seen := map[uint64]bool{}
				for _, r := range recs {
					if r.Model != "a" || seen[r.Seq] || r.InputDigest == "" || r.OutputDigest == "" || r.StateDigest == "" {
						t.Fatalf("bad or duplicate audit record %+v", r)
					}
					seen[r.Seq] = true
					// The state digest after each batch is a state the
					// primary had (for deltas: the backup's resumed hash).
					if _, ok := prim.history[r.StateDigest]; !ok {
						t.Fatalf("audit record of seq %d: state %s, which the primary never had", r.Seq, r.StateDigest)
					}
					if r.Seq == n && r.StateDigest != prim.Digest() {
						t.Fatalf("audit record of seq %d: state %s, primary ends at %s", n, r.StateDigest, prim.Digest())
					}
				}
				if len(seen) != n {
					t.Fatalf("%d audit records, want %d", len(seen), n)
				}
			})
		}
	})
}

// (b) Every shipped snapshot is a state the primary had after some batch,
// even when Update writes the state in two halves.
func TestSnapshotsNeverHalfUpdated(t *testing.T) {
	prim, back := newCounter(1024), newCounter(1024)
	prim.slowUpdate = true
	var mu sync.Mutex
	var shipped []string
	h := startRepl(t, fmt.Sprintf(oneStateful, "nspb"), map[string]Backend{"a": prim}, map[string]Backend{"a": back}, replOpts{
		tweak: func(name string, s *Sidecar) {
			if s.role != config.RolePrimary {
				return
			}
			s.cfg.ShipHook = func(_ context.Context, batch uint64) {
				sh := s.prim.ship.head()
				mu.Lock()
				shipped = append(shipped, tensor.Digest(sh.state...))
				mu.Unlock()
			}
		},
	})
	defer h.stop()
	const n = 150
	for id := uint64(1); id <= n; id++ {
		h.send(id, id) // one at a time: batches of 1, a snapshot per request
	}
	waitFor(t, "all replies", func() bool { return h.sink.count() >= n })
	waitFor(t, "backup durable", func() bool { return maxSeqOf(h.backups["a"]) == n })
	prim.mu.Lock()
	defer prim.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if len(shipped) == 0 {
		t.Fatal("nothing shipped")
	}
	for i, d := range shipped {
		if _, ok := prim.history[d]; !ok {
			t.Fatalf("shipment %d carries state %s, which the primary never had after a batch", i, d)
		}
	}
}
