package triton

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	"github.com/hams-go/hams/refserver/models"
)

// typedOnly fails the test on a ModelInfer that carries raw contents or
// an input with neither typed contents nor a shared-memory region, and
// counts the requests it saw.
func typedOnly(t *testing.T, p *proxy) *atomic.Int64 {
	var n atomic.Int64
	p.before = func(_ context.Context, r *inference.ModelInferRequest) error {
		n.Add(1)
		if len(r.GetRawInputContents()) > 0 {
			t.Errorf("typed inputs: request carries %d raw_input_contents", len(r.GetRawInputContents()))
		}
		for _, in := range r.GetInputs() {
			_, shm := in.GetParameters()[wire.ParamShmRegion]
			if !shm && wire.ContentsCount(in.GetContents()) == 0 {
				t.Errorf("typed inputs: input %q has no typed contents", in.GetName())
			}
		}
		return nil
	}
	return &n
}

// Config.TypedInputs: the same answers as raw inputs, with every input in
// the typed contents fields (the stream ids in bytes_contents; state in
// shared memory as before).
func TestTypedInputs(t *testing.T) {
	s := startServer(t)
	p, addr := startProxy(t, s.addr)
	ctx := ctxT(t)
	seen := typedOnly(t, p)

	b, err := New(Config{Conn: dial(t, addr), Model: "fashion", Timeout: 5 * time.Second, Logger: quiet, TypedInputs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	in := images(3, 1)
	want, err := s.srv.Model("fashion").Infer(&models.Batch{Inputs: []*hamsv1.Tensor{in}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{in}, Rows: []uint32{1, 2}, BatchId: 9, StreamIds: []string{"s", "s"}})
	if err != nil || len(got.GetOutputs()) != 1 || !bytes.Equal(got.GetOutputs()[0].GetData(), want.Outputs[0].Data) {
		t.Fatalf("typed stateless infer: %v %v", got, err)
	}

	// A stateful model with per-row stream ids and shared-memory state:
	// the same outputs and states as the internal-state twin.
	a, err := NewStateful(Config{Conn: dial(t, addr), Model: "seqx", Timeout: 5 * time.Second, Logger: quiet, TypedInputs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	twin := internalTwin(t, "seqx")
	for i := range 3 {
		req := lstmBatch(i)
		got, err := a.Compute(ctx, req)
		if err != nil {
			t.Fatalf("typed compute %d: %v", i, err)
		}
		want, err := twin.Compute(&models.Batch{Inputs: req.Inputs, Rows: req.Rows, StreamIDs: req.StreamIds, BatchID: req.BatchId})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.GetOutputs()[0].GetData(), want.Outputs[0].Data) {
			t.Fatalf("typed compute %d: outputs differ from the internal model", i)
		}
		if err := a.Update(ctx, req.BatchId); err != nil {
			t.Fatal(err)
		}
		if _, err := twin.Update(req.BatchId); err != nil {
			t.Fatal(err)
		}
	}
	if seen.Load() < 4 {
		t.Fatalf("the proxy saw %d ModelInfers", seen.Load())
	}
}
