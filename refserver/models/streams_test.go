package models

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// lstmP: a small deterministic LSTM with 8 stream slots.
func lstmP(streams int) map[string]any {
	return map[string]any{"in_dim": 4, "hidden": 4, "streams": streams, "deterministic": 1}
}

// rowsOf builds a batch of one row per item from per-item vectors.
func rowsOf(id uint64, streams []string, vals [][]float32) *Batch {
	var v []float32
	rows := make([]uint32, len(vals))
	for i, r := range vals {
		v = append(v, r...)
		rows[i] = 1
	}
	return &Batch{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{int64(len(vals)), 4}, v)}, Rows: rows, StreamIDs: streams, BatchID: id}
}

func outRow(t *testing.T, r *Result, i int) []byte {
	t.Helper()
	return r.Outputs[0].Data[i*16 : (i+1)*16]
}

// TestStreamPoisoningIsolated: a stream fed extreme values (±1e30, NaN,
// +Inf), whose id the old mapping (FNV mod slots) put in the victim's
// slot, in the same batches as the victim, never changes the victim's
// outputs: bit for bit what the victim gets alone.
func TestStreamPoisoningIsolated(t *testing.T) {
	const slots = 8
	victim := "victim"
	attacker := ""
	for i := 0; attacker == ""; i++ {
		if id := fmt.Sprintf("attacker-%d", i); Slot(id, slots) == Slot(victim, slots) {
			attacker = id
		}
	}
	alone, shared := mk(t, "lstm", lstmP(slots)), mk(t, "lstm", lstmP(slots))
	poison := [][]float32{{1e30, -1e30, 1e30, -1e30}, {float32(math.NaN()), 0, 0, 0}, {float32(math.Inf(1)), 1, 1, 1}}
	for i := uint64(1); i <= 12; i++ {
		x := []float32{float32(i) / 10, -0.3, 0.7, float32(i%3) - 1}
		want, err := alone.Infer(rowsOf(i, []string{victim}, [][]float32{x}))
		if err != nil {
			t.Fatal(err)
		}
		got, err := shared.Infer(rowsOf(i, []string{attacker, victim, attacker}, [][]float32{poison[i%3], x, poison[(i+1)%3]}))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(outRow(t, got, 1), outRow(t, want, 0)) {
			t.Fatalf("batch %d: the victim's output changed with the attacker's stream in its batches", i)
		}
	}
	if live, n, ev, ok := StreamTable(shared); !ok || live != 2 || n != slots || ev != 0 {
		t.Fatalf("stream table: %d live of %d, %d evictions, %v", live, n, ev, ok)
	}
}

// TestStreamTableLRU: beyond the table's size the least recently used
// stream not in the batch is evicted (counted) and a stream that comes
// back after its eviction starts from zero state, as a new one does; a
// batch of more streams than slots is refused.
func TestStreamTableLRU(t *testing.T) {
	m := mk(t, "lstm", lstmP(4))
	x := []float32{0.5, -0.5, 0.25, 1}
	id := uint64(0)
	run := func(streams ...string) *Result {
		t.Helper()
		vals := make([][]float32, len(streams))
		for i := range vals {
			vals[i] = x
		}
		id++
		r, err := m.Infer(rowsOf(id, streams, vals))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first := outRow(t, run("a"), 0) // a's first step from zero state
	run("b", "c")
	run("d", "a") // a used last, b and c before, d now
	run("e")      // evicts b (the oldest, lower slot than c)
	if _, _, ev, _ := StreamTable(m); ev != 1 {
		t.Fatalf("%d evictions, want 1", ev)
	}
	if got := outRow(t, run("a"), 0); bytes.Equal(got, first) {
		t.Fatal("a, still live, restarted from zero state")
	}
	if got := outRow(t, run("b"), 0); !bytes.Equal(got, first) {
		t.Fatal("b, evicted, did not restart from zero state")
	}
	if live, n, ev, _ := StreamTable(m); live != 4 || n != 4 || ev != 2 {
		t.Fatalf("%d live of %d, %d evictions; want 4 of 4, 2", live, n, ev)
	}
	_, err := m.Infer(rowsOf(99, []string{"p", "q", "r", "s", "t"}, [][]float32{x, x, x, x, x}))
	if !errors.Is(err, ErrInvalidInput) || !bytesContains(err.Error(), "5 streams") {
		t.Fatalf("a batch of 5 streams for 4 slots: %v", err)
	}
}

func bytesContains(s, sub string) bool { return bytes.Contains([]byte(s), []byte(sub)) }

// TestStreamTableReplicated: the table travels with the state, byte for
// byte, as deltas and as whole states: a replica that follows the
// primary's deltas (with evictions among them) and is then promoted
// assigns every stream the slot the primary would, and computes what the
// primary computes from there.
func TestStreamTableReplicated(t *testing.T) {
	prim, repl := mk(t, "lstm", lstmP(4)), mk(t, "lstm", lstmP(4))
	names := []string{"s0", "s1", "s2", "s3", "s4", "s5"}
	batch := func(i uint64) *Batch {
		a, b := names[i%6], names[(i*5+1)%6]
		if a == b {
			b = names[(i+2)%6]
		}
		return rowsOf(i, []string{a, b}, [][]float32{{float32(i), 1, -1, 0.5}, {0.1, float32(i) / 7, 0, -2}})
	}
	for i := uint64(1); i <= 30; i++ {
		b := batch(i)
		b.StageDelta = true
		res, err := prim.Compute(b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := prim.Update(i); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			if _, err := repl.WriteState(i, stateBytes(t, prim)); err != nil {
				t.Fatal(err)
			}
		} else if _, err := repl.WriteStateRanges(i-1, i, res.Delta); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(stateBytes(t, repl), stateBytes(t, prim)) {
			t.Fatalf("batch %d: replica state differs", i)
		}
	}
	if _, _, ev, _ := StreamTable(prim); ev == 0 {
		t.Fatal("no eviction in the run")
	}
	pl, _, _, _ := StreamTable(prim)
	rl, _, _, _ := StreamTable(repl)
	if pl != rl {
		t.Fatalf("live streams: primary %d, replica %d", pl, rl)
	}
	// Promoted: both continue with the same batches.
	for i := uint64(31); i <= 40; i++ {
		a, err := prim.Infer(batch(i))
		if err != nil {
			t.Fatal(err)
		}
		b, err := repl.Infer(batch(i))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.Outputs[0].Data, b.Outputs[0].Data) {
			t.Fatalf("batch %d: the promoted replica answers differently", i)
		}
	}
	if !bytes.Equal(stateBytes(t, repl), stateBytes(t, prim)) {
		t.Fatal("states differ after the promotion")
	}
}

// TestExplicitStreamTable: served with explicit state, the table is a
// state tensor like h and c (INT32), and the model computes what the
// internal-state model computes.
func TestExplicitStreamTable(t *testing.T) {
	p := lstmP(4)
	internal := mk(t, "lstm", p)
	pe := map[string]any{"state": "explicit"}
	for k, v := range p {
		pe[k] = v
	}
	ex := mk(t, "lstm", pe)
	specs, ok := Explicit(ex)
	if !ok || len(specs) != 3 || specs[2].GetName() != "streams" || specs[2].GetDatatype() != "INT32" {
		t.Fatalf("explicit state specs %v", specs)
	}
	_, state, err := StateTensors(internal)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 8; i++ {
		b := rowsOf(i, []string{fmt.Sprint("s", i%5), fmt.Sprint("s", (i+2)%5)}, [][]float32{{1, 2, 3, float32(i)}, {0, -1, float32(i), 2}})
		want, err := internal.Infer(b)
		if err != nil {
			t.Fatal(err)
		}
		eb := rowsOf(i, b.StreamIDs, [][]float32{{1, 2, 3, float32(i)}, {0, -1, float32(i), 2}})
		for _, s := range state {
			eb.Inputs = append(eb.Inputs, &hamsv1.Tensor{Name: s.Name + StateIn, Datatype: s.Datatype, Shape: s.Shape, Data: s.Data})
		}
		got, err := ex.Infer(eb)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Outputs[0].Data, want.Outputs[0].Data) {
			t.Fatalf("batch %d: explicit output differs", i)
		}
		state = nil
		for _, o := range got.Outputs[1:] {
			state = append(state, &hamsv1.Tensor{Name: o.Name[:len(o.Name)-len(StateOut)], Datatype: o.Datatype, Shape: o.Shape, Data: o.Data})
		}
	}
	_, want, _ := StateTensors(internal)
	for i := range want {
		if !bytes.Equal(want[i].Data, state[i].Data) {
			t.Fatalf("state %s differs", want[i].Name)
		}
	}
}

// TestOLearnDropsNonFiniteSteps: an online learner's weights are shared
// by every client, so an SGD step that would leave a weight NaN or
// infinite (NaN, infinite or extreme inputs with labels) is dropped: the
// state is unchanged and every later score is finite.
func TestOLearnDropsNonFiniteSteps(t *testing.T) {
	m := mk(t, "olearn", map[string]any{"in_dim": 4, "state_mb": 1, "deterministic": 1})
	before := stateBytes(t, m)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for i, x := range [][]float32{{nan, 0, 0, 0}, {inf, 1, 1, 1}, {1e38, -1e38, 1e38, -1e38}} {
		b := &Batch{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{1, 4}, x), tensor.FromInt64("labels", []int64{1}, []int64{3})}, BatchID: uint64(i + 1)}
		if _, err := m.Infer(b); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(stateBytes(t, m), before) {
		t.Fatal("a non-finite step changed the weights")
	}
	if n := m.(*core).k.(*olearn).dropped.Load(); n != 3 {
		t.Fatalf("%d steps dropped, want 3", n)
	}
	r, err := m.Infer(&Batch{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{1, 4}, []float32{0.5, 0.1, -0.2, 1})}, BatchID: 9})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := tensor.Float32(r.Outputs[0])
	for _, s := range v {
		if math.IsNaN(float64(s)) || math.IsInf(float64(s), 0) {
			t.Fatalf("scores %v", v)
		}
	}
	// A finite step still trains.
	if _, err := m.Infer(&Batch{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{1, 4}, []float32{0.5, 0.1, -0.2, 1}), tensor.FromInt64("labels", []int64{1}, []int64{2})}, BatchID: 10}); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(stateBytes(t, m), before) {
		t.Fatal("a finite step did not train")
	}
}
