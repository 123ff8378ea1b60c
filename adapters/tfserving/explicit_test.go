package tfserving

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/models"
)

// explicitYAML: seq is an LSTM served with its state as tensors (state:
// explicit: the reference model server keeps no state, its TF Serving
// signature follows the state convention: state/h, state/c in,
// state_next/h, state_next/c out, hams_stream_ids); ref is the same LSTM
// with internal state, the bit-exact reference (deterministic: 1 makes the
// reductions' order fixed).
const explicitYAML = `
name: x
models:
  - {name: seq, kind: lstm, stateful: true, ha: off, params: {input: x, output: y, in_dim: 4, hidden: 8, streams: 4, seed: 5, deterministic: 1, state: explicit}}
  - {name: ref, kind: lstm, stateful: true, ha: off, params: {input: x, output: y, in_dim: 4, hidden: 8, streams: 4, seed: 5, deterministic: 1}}
services:
  - {name: s1, edges: [[frontend, seq], [seq, frontend]]}
  - {name: s2, edges: [[frontend, ref], [ref, frontend]]}
`

// lstmBatch is batch k: three requests of one row each, of streams a, b, a.
func lstmBatch(k uint64) *hamsv1.BatchRequest {
	v := make([]float32, 3*4)
	for i := range v {
		v[i] = float32((int(k)*7+i*3)%11)/11 - 0.5
	}
	return &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{3, 4}, v)}, Rows: []uint32{1, 1, 1},
		StreamIds: []string{"a", "b", "a"}, BatchId: k}
}

// refInfer runs batch k on the internal-state reference model.
func refInfer(t *testing.T, m models.Model, req *hamsv1.BatchRequest) []*hamsv1.Tensor {
	t.Helper()
	res, err := m.Infer(&models.Batch{Inputs: req.Inputs, Rows: req.Rows, StreamIDs: req.StreamIds, BatchID: req.BatchId})
	if err != nil {
		t.Fatal(err)
	}
	return res.Outputs
}

// refState is the reference model's state tensors, sorted by name (the
// adapter's state order).
func refState(t *testing.T, m models.Model) []*hamsv1.Tensor {
	t.Helper()
	_, ts, err := models.StateTensors(m)
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts
}

func sameBytes(t *testing.T, what string, got, want []*hamsv1.Tensor) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tensors, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i].GetName() != want[i].GetName() || !bytes.Equal(got[i].GetData(), want[i].GetData()) {
			t.Fatalf("%s: tensor %d %q differs from %q (%d vs %d bytes)", what, i, got[i].GetName(), want[i].GetName(), len(got[i].GetData()), len(want[i].GetData()))
		}
	}
}

// TestExplicitStateAgainstRefserver drives the adapter's stateful path
// against the reference model server's TF Serving API (a real gRPC
// server, not a fake): Describe hides the state convention's tensors;
// compute/update match the internal-state model bit for bit, outputs and
// state; a compute's state is installed only by its update; a backup
// adapter on a second server, given the primary's state (WriteState, as
// a backup applies a snapshot), holds exactly the primary's state and,
// after a failover, continues each stream as the primary would have.
func TestExplicitStateAgainstRefserver(t *testing.T) {
	pe := startRefWith(t, explicitYAML, discard(), "seq", "ref")
	be := startRefWith(t, explicitYAML, discard(), "seq")
	d, err := config.Parse([]byte(explicitYAML))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := models.New(d.Model("ref"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	pa, err := New(pe.cc, Config{Model: "seq", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	desc, err := pa.Describe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !desc.GetStateful() || desc.GetStateBytes() != 2*4*8*4+4*6*4 || len(desc.GetInputs()) != 1 || desc.GetInputs()[0].GetName() != "x" ||
		len(desc.GetOutputs()) != 1 || desc.GetOutputs()[0].GetName() != "y" {
		t.Fatalf("Describe: %v", desc)
	}
	for k := uint64(1); k <= 6; k++ {
		req := lstmBatch(k)
		resp, err := pa.Compute(ctx, req)
		if err != nil {
			t.Fatalf("compute %d: %v", k, err)
		}
		want := refInfer(t, ref, req)
		sameBytes(t, "outputs", resp.GetOutputs(), want)
		if st, _, _ := pa.ReadState(ctx); k > 1 && bytes.Equal(st[0].GetData(), refState(t, ref)[0].GetData()) {
			t.Fatalf("batch %d: the computed state is current before its update", k)
		}
		if err := pa.Update(ctx, k); err != nil {
			t.Fatalf("update %d: %v", k, err)
		}
		st, ver, err := pa.ReadState(ctx)
		if err != nil || ver != k {
			t.Fatalf("read state after %d: version %d, %v", k, ver, err)
		}
		sameBytes(t, "state", st, refState(t, ref))
	}
	// A write drops a staged state: its update is refused.
	if _, err := pa.Compute(ctx, lstmBatch(7)); err != nil {
		t.Fatal(err)
	}
	st, ver, _ := pa.ReadState(ctx)
	if err := pa.WriteState(ctx, st, ver); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "update after a write", pa.Update(ctx, 7), codes.FailedPrecondition)

	// The backup: the primary's state written, then the next batches on
	// both, and on the reference: the same outputs and states.
	ba, err := New(be.cc, Config{Model: "seq", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := ba.WriteState(ctx, st, ver); err != nil {
		t.Fatal(err)
	}
	bst, bver, _ := ba.ReadState(ctx)
	sameBytes(t, "backup state", bst, st)
	if bver != ver {
		t.Fatalf("backup version %d, primary %d", bver, ver)
	}
	for k := uint64(8); k <= 10; k++ {
		req := lstmBatch(k)
		want := refInfer(t, ref, req)
		for name, a := range map[string]*Backend{"primary": pa, "backup": ba} {
			resp, err := a.Infer(ctx, req)
			if err != nil {
				t.Fatalf("%s batch %d: %v", name, k, err)
			}
			sameBytes(t, name+" outputs", resp.GetOutputs(), want)
		}
		pst, _, _ := pa.ReadState(ctx)
		bst, _, _ := ba.ReadState(ctx)
		sameBytes(t, "primary state", pst, refState(t, ref))
		sameBytes(t, "backup state", bst, pst)
	}
}

// TestExplicitInitialState: Config.InitialState is where a stateful
// signature starts (the reference model's state after two batches here);
// one that does not fit the signature is refused at Describe.
func TestExplicitInitialState(t *testing.T) {
	pe := startRefWith(t, explicitYAML, discard(), "seq")
	d, _ := config.Parse([]byte(explicitYAML))
	ref, err := models.New(d.Model("ref"))
	if err != nil {
		t.Fatal(err)
	}
	refInfer(t, ref, lstmBatch(1))
	refInfer(t, ref, lstmBatch(2))
	ctx := ctxT(t)
	a, err := New(pe.cc, Config{Model: "seq", InitialState: refState(t, ref)})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.Infer(ctx, lstmBatch(3))
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "outputs from the initial state", resp.GetOutputs(), refInfer(t, ref, lstmBatch(3)))
	bad, _ := New(pe.cc, Config{Model: "seq", InitialState: refState(t, ref)[:1]})
	_, err = bad.Describe(ctx)
	wantCode(t, "initial state missing a tensor", err, codes.FailedPrecondition, "initial state")
}

// logRecords collects a slog JSON handler's records.
type logRecords struct {
	mu   sync.Mutex
	recs []map[string]any
}

func (l *logRecords) Write(p []byte) (int, error) {
	var m map[string]any
	if json.Unmarshal(p, &m) == nil {
		l.mu.Lock()
		l.recs = append(l.recs, m)
		l.mu.Unlock()
	}
	return len(p), nil
}

// TestExplicitStateDebugLog: at debug level the reference server logs the
// digest of the state each explicit-state Predict started from and
// produced (what integration/tfserving_test.go reads), in the adapter's
// state order, so it equals the digest of the adapter's own state.
func TestExplicitStateDebugLog(t *testing.T) {
	rec := &logRecords{}
	pe := startRefWith(t, explicitYAML, slog.New(slog.NewJSONHandler(rec, &slog.HandlerOptions{Level: slog.LevelDebug})), "seq")
	ctx := ctxT(t)
	a, err := New(pe.cc, Config{Model: "seq"})
	if err != nil {
		t.Fatal(err)
	}
	before, _, _ := a.ReadState(ctx)
	if _, err := a.Infer(ctx, lstmBatch(1)); err != nil {
		t.Fatal(err)
	}
	after, _, _ := a.ReadState(ctx)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, r := range rec.recs {
		if r["msg"] == "explicit state call" {
			if r["state_in"] != tensor.Digest(before...) || r["state_out"] != tensor.Digest(after...) || r["streams"] != float64(3) {
				t.Fatalf("log record %v; want state_in %s, state_out %s", r, tensor.Digest(before...), tensor.Digest(after...))
			}
			return
		}
	}
	t.Fatalf("no explicit state record among %d", len(rec.recs))
}
