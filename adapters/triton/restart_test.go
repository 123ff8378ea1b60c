package triton

import (
	"bytes"
	"context"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protos/inference"
	"github.com/hams-go/hams/refserver/models"
)

// restartServer stops s and serves again on its address (a model server
// restarted: it holds no registration of the old one).
func restartServer(t *testing.T, s *server) *server {
	t.Helper()
	s.stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lis, err := net.Listen("tcp", s.addr)
		if err == nil {
			return serveOn(t, lis)
		}
		if time.Now().After(deadline) {
			t.Fatalf("listen again on %s: %v", s.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lockstep drives an adapter and the internal-state twin of its model
// with the same batches and checks that outputs, versions and states
// agree after every step.
type lockstep struct {
	t    *testing.T
	a    *Stateful
	twin models.Model
}

func (l *lockstep) step(ctx context.Context, i int) {
	t := l.t
	t.Helper()
	req := lstmBatch(i)
	got, err := l.a.Compute(ctx, req)
	if err != nil {
		t.Fatalf("compute %d: %v", i, err)
	}
	want, err := l.twin.Compute(&models.Batch{Inputs: req.Inputs, Rows: req.Rows, StreamIDs: req.StreamIds, BatchID: req.BatchId})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Outputs) != 1 || !bytes.Equal(got.Outputs[0].Data, want.Outputs[0].Data) || got.NextStateVersion != uint64(i+1) {
		t.Fatalf("batch %d: outputs differ from the model without a restart (next version %d)", i, got.NextStateVersion)
	}
	if err := l.a.Update(ctx, req.BatchId); err != nil {
		t.Fatal(err)
	}
	if _, err := l.twin.Update(req.BatchId); err != nil {
		t.Fatal(err)
	}
	st, v, err := l.a.ReadState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, wst, err := models.StateTensors(l.twin)
	if err != nil {
		t.Fatal(err)
	}
	if v != uint64(i+1) || digest(st) != digest(wst) {
		t.Fatalf("batch %d: state (version %d) differs from the model without a restart", i, v)
	}
}

// TestRestartedServerGetsRegionsAgain restarts the model server on the
// same address while the adapter stays up: the server forgets the state
// regions, its health still passes, and the next Compute registers the
// regions again and succeeds. The state continues from the installed one:
// outputs and states match the internal-state model that saw no restart.
// After three updates region B is current, so an adapter that went back
// to region A (or re-seeded the state) would diverge. The same holds when
// the regions are dropped through the server's API (Unregister of "").
func TestRestartedServerGetsRegionsAgain(t *testing.T) {
	srv := startServer(t)
	ctx := ctxT(t)
	l := &lockstep{t: t, a: stateful(t, srv.addr, "seqx", nil), twin: internalTwin(t, "seqx")}
	for i := range 3 {
		l.step(ctx, i)
	}
	installed, v, err := l.a.ReadState(ctx)
	if err != nil {
		t.Fatal(err)
	}

	srv = restartServer(t, srv)
	if n := srv.srv.SharedMemoryRegions(); len(n) != 0 {
		t.Fatalf("a restarted server holds regions %v", n)
	}
	// Health passes (once the connection is back) although every
	// compute would fail: nothing outside the adapter notices.
	deadline := time.Now().Add(10 * time.Second)
	for err := l.a.Health(ctx); err != nil; err = l.a.Health(ctx) {
		if time.Now().After(deadline) {
			t.Fatalf("restarted server not healthy: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st, v2, err := l.a.ReadState(ctx); err != nil || v2 != v || digest(st) != digest(installed) {
		t.Fatalf("the restart changed the installed state (version %d, was %d; %v)", v2, v, err)
	}
	for i := 3; i < 6; i++ {
		l.step(ctx, i)
	}
	want := l.a.Regions()
	slices.Sort(want)
	if got := srv.srv.SharedMemoryRegions(); !slices.Equal(got, want) {
		t.Fatalf("the restarted server holds %v, want %v", got, want)
	}

	// The same through the API, between a compute and its update.
	ks := inference.NewGRPCInferenceServiceClient(dial(t, srv.addr))
	if _, err := ks.SystemSharedMemoryUnregister(ctx, &inference.SystemSharedMemoryUnregisterRequest{}); err != nil {
		t.Fatal(err)
	}
	l.step(ctx, 6)
	if got := srv.srv.SharedMemoryRegions(); !slices.Equal(got, want) {
		t.Fatalf("after unregister: the server holds %v, want %v", got, want)
	}
}

// TestBadInputIsNotRetried: an InvalidArgument with every region
// registered (or a server without the Status call) is the batch's own
// error: returned with its code, ModelInfer called once, no region
// registered again. A region the server lost is registered again and the
// call made a second time.
func TestBadInputIsNotRetried(t *testing.T) {
	srv := startServer(t)
	p, addr := startProxy(t, srv.addr)
	var infers atomic.Int32
	p.before = func(context.Context, *inference.ModelInferRequest) error {
		infers.Add(1)
		return nil
	}
	ctx := ctxT(t)
	a := stateful(t, addr, "seqx", nil)
	if _, err := a.Compute(ctx, lstmBatch(0)); err != nil {
		t.Fatal(err)
	}
	bad := lstmBatch(1)
	bad.Inputs[0] = tensor.FromFloat32("x", []int64{1, 3}, []float32{1, 2, 3})
	bad.Rows, bad.StreamIds = []uint32{1}, []string{"a"}
	infers.Store(0)
	_, err := a.Compute(ctx, bad)
	wantCode(t, "bad compute", err, codes.InvalidArgument, "x")
	if n := infers.Load(); n != 1 {
		t.Fatalf("ModelInfer called %d times for a bad batch, want 1", n)
	}
	// A server that cannot say which regions it holds: the batch's own
	// error, code unchanged.
	p.noStatus.Store(true)
	_, err = a.Compute(ctx, bad)
	wantCode(t, "bad compute, no status", err, codes.InvalidArgument, "no status here")
	p.noStatus.Store(false)
	// A region the server lost: one failed call, then one after the
	// regions are registered again.
	ks := inference.NewGRPCInferenceServiceClient(dial(t, srv.addr))
	if _, err := ks.SystemSharedMemoryUnregister(ctx, &inference.SystemSharedMemoryUnregisterRequest{Name: a.Regions()[1]}); err != nil {
		t.Fatal(err)
	}
	infers.Store(0)
	if _, err := a.Compute(ctx, lstmBatch(1)); err != nil {
		t.Fatalf("compute with a lost region: %v", err)
	}
	if n := infers.Load(); n != 2 {
		t.Fatalf("ModelInfer called %d times with a lost region, want 2", n)
	}
	if got := srv.srv.SharedMemoryRegions(); len(got) != 6 { // h, c, the stream table: two buffers each
		t.Fatalf("server holds %v", got)
	}
}
