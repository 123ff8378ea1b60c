package models

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func stateBytes(t testing.TB, m Model) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := m.ReadState(func(StateInfo) (io.Writer, error) { return &buf, nil }); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func applyRanges(state []byte, rs []Range) []byte {
	out := append([]byte(nil), state...)
	for _, r := range rs {
		copy(out[r.Off:], r.Data)
	}
	return out
}

// The staged delta of a compute is exactly the difference its update
// makes: state n-1 patched with delta n is state n, byte for byte, and a
// replica at state n-1 that writes the ranges reaches state n too.
func TestComputeDeltaIsTheUpdate(t *testing.T) {
	for _, kind := range []string{"lstm", "olearn"} {
		p := map[string]any{"in_dim": 8, "state_mb": 1, "hidden": 8, "streams": 16}
		prim, repl := mk(t, kind, p), mk(t, kind, p)
		if !prim.Describe().GetStateDelta() {
			t.Fatalf("%s: Describe does not advertise state deltas", kind)
		}
		x := randT("x", 6, 8, 5)
		lab := tensor.FromInt64("labels", []int64{6}, []int64{1, -1, 3, 2, 0, 4})
		for i := uint64(1); i <= 4; i++ {
			before := stateBytes(t, prim)
			res, err := prim.Compute(&Batch{Inputs: []*hamsv1.Tensor{x, lab}, Rows: []uint32{2, 1, 3}, StreamIDs: []string{"p", "q", "p"}, BatchID: i, StageDelta: true})
			if err != nil {
				t.Fatal(err)
			}
			if !res.HasDelta || len(res.Delta) == 0 {
				t.Fatalf("%s batch %d: no delta", kind, i)
			}
			for j := 1; j < len(res.Delta); j++ {
				if prev := res.Delta[j-1]; prev.Off+uint64(len(prev.Data)) > res.Delta[j].Off {
					t.Fatalf("%s: ranges overlap or are out of order: %d+%d > %d", kind, prev.Off, len(prev.Data), res.Delta[j].Off)
				}
			}
			if _, err := prim.Update(i); err != nil {
				t.Fatal(err)
			}
			after := stateBytes(t, prim)
			if bytes.Equal(before, after) {
				t.Fatalf("%s batch %d: update changed nothing", kind, i)
			}
			if !bytes.Equal(applyRanges(before, res.Delta), after) {
				t.Fatalf("%s batch %d: state n-1 + delta n != state n", kind, i)
			}
			if v, err := repl.WriteStateRanges(i-1, i, res.Delta); err != nil || v != i {
				t.Fatalf("%s: write ranges: %v %v", kind, v, err)
			}
			if !bytes.Equal(stateBytes(t, repl), after) {
				t.Fatalf("%s batch %d: replica differs after writing the delta", kind, i)
			}
		}
		if _, err := repl.WriteStateRanges(2, 9, nil); !errors.Is(err, ErrStaleBase) {
			t.Fatalf("%s: stale base accepted: %v", kind, err)
		}
		if _, err := repl.WriteStateRanges(4, 5, []Range{{Off: 2, Data: make([]byte, 4)}}); !errors.Is(err, ErrInvalidState) {
			t.Fatalf("%s: unaligned range accepted: %v", kind, err)
		}
		total := uint64(len(stateBytes(t, repl)))
		if _, err := repl.WriteStateRanges(4, 5, []Range{{Off: total - 4, Data: make([]byte, 8)}}); !errors.Is(err, ErrInvalidState) {
			t.Fatalf("%s: range past the end accepted: %v", kind, err)
		}
	}
	if _, err := mk(t, "prep", nil).WriteStateRanges(0, 1, nil); !errors.Is(err, ErrNoDelta) {
		t.Fatalf("stateless model took ranges: %v", err)
	}
}

// A partial write never changes what an earlier capture writes (olearn
// copies a block before writing it; lstm's capture copies h and c).
func TestWriteStateRangesKeepsCaptures(t *testing.T) {
	for _, kind := range []string{"lstm", "olearn"} {
		m := mk(t, kind, map[string]any{"in_dim": 8, "state_mb": 1, "hidden": 8, "streams": 16})
		before := stateBytes(t, m)
		var got bytes.Buffer
		err := m.ReadState(func(StateInfo) (io.Writer, error) {
			// Captured: patch every byte of the first 64 before writing.
			if _, err := m.WriteStateRanges(0, 1, []Range{{Off: 0, Data: bytes.Repeat([]byte{7}, 64)}}); err != nil {
				t.Fatal(err)
			}
			return &got, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), before) {
			t.Fatalf("%s: a partial write changed a captured state", kind)
		}
		if after := stateBytes(t, m); !bytes.Equal(after[:64], bytes.Repeat([]byte{7}, 64)) || !bytes.Equal(after[64:], before[64:]) {
			t.Fatalf("%s: the partial write did not land where it should", kind)
		}
	}
}

// Compute with InstallID installs the named staged batch first (as
// Update), so consecutive batches need no Update in between; an invalid
// batch installs nothing; a wrong id is ErrNotStaged.
func TestComputeInstallsStagedBatch(t *testing.T) {
	b := mk(t, "lstm", map[string]any{"in_dim": 4, "hidden": 4, "streams": 8, "deterministic": 1})
	c := mk(t, "lstm", map[string]any{"in_dim": 4, "hidden": 4, "streams": 8, "deterministic": 1})
	if !b.Describe().GetComputeInstalls() {
		t.Fatal("Describe does not advertise compute_installs")
	}
	x := randT("x", 2, 4, 9)
	batch := func(id, install uint64) *Batch {
		return &Batch{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1, 1}, StreamIDs: []string{"p", "q"}, BatchID: id, InstallID: install}
	}
	// b: compute, update, compute, update; c: compute, compute+install, update.
	for id := uint64(1); id <= 2; id++ {
		if _, err := b.Compute(batch(id, 0)); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Update(id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Compute(batch(1, 0)); err != nil {
		t.Fatal(err)
	}
	bad := &Batch{Inputs: []*hamsv1.Tensor{randT("x", 2, 3, 1)}, BatchID: 2, InstallID: 1}
	if _, err := c.Compute(bad); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("invalid batch: %v", err)
	}
	if v, _ := digest(t, c); v != 0 {
		t.Fatal("an invalid batch installed the staged state")
	}
	if _, err := c.Compute(batch(2, 7)); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("install of an unstaged batch: %v", err)
	}
	if _, err := c.Compute(batch(2, 1)); err != nil {
		t.Fatal(err)
	}
	if v, _ := digest(t, c); v != 1 {
		t.Fatalf("version %d after compute with install of 1", v)
	}
	if _, err := c.Update(2); err != nil {
		t.Fatal(err)
	}
	_, db := digest(t, b)
	if _, dc := digest(t, c); dc != db {
		t.Fatal("install-on-compute reached another state than compute/update")
	}
}

// The online learner draws its seeded initial weights on first use: two
// fresh instances hold the same state, and one whose state is written
// whole before any use never draws them (a spare or a backup starts cheap)
// and holds exactly what was written.
func TestOLearnInitialWeightsDrawnOnFirstUseOnly(t *testing.T) {
	p := map[string]any{"in_dim": 8, "state_mb": 1}
	a, b := mk(t, "olearn", p), mk(t, "olearn", p)
	want := stateBytes(t, a)
	if !bytes.Equal(want, stateBytes(t, b)) {
		t.Fatal("two fresh instances hold different initial weights")
	}
	c := mk(t, "olearn", p)
	k := c.(*core).k.(*olearn)
	drawn := false
	draw := k.initFn
	k.initFn = func() { drawn = true; draw() }
	written := applyRanges(want, []Range{{Off: 0, Data: []byte{1, 2, 3, 4}}})
	if _, err := c.WriteState(7, written); err != nil {
		t.Fatal(err)
	}
	if got := stateBytes(t, c); !bytes.Equal(got, written) {
		t.Fatal("state read back differs from the state written")
	}
	if _, err := c.Compute(&Batch{Inputs: []*hamsv1.Tensor{randT("x", 2, 8, 1)}, Rows: []uint32{2}, BatchID: 1}); err != nil {
		t.Fatal(err)
	}
	if drawn {
		t.Fatal("the initial weights were drawn although the state was written whole first")
	}
}

// A Compute that folds the install of the previous batch, repeated after
// its answer was lost (the sidecar retries a compute that found the server
// unreachable), installs nothing twice and stages the same next state: the
// repeat answers what the first call answered and the state after
// Update(2) is the one of a run without the repeat. Before, the repeat
// failed with ErrNotStaged (and so did the sidecar's later install of
// batch 1, until it stopped).
func TestComputeWithInstallRepeated(t *testing.T) {
	params := map[string]any{"in_dim": 4, "hidden": 4, "streams": 8, "deterministic": 1}
	x := randT("x", 2, 4, 9)
	batch := func(id, install uint64) *Batch {
		return &Batch{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{1, 1}, StreamIDs: []string{"p", "q"}, BatchID: id, InstallID: install}
	}
	run := func(repeat bool) (*Result, []byte) {
		m := mk(t, "lstm", params)
		if _, err := m.Compute(batch(1, 0)); err != nil {
			t.Fatal(err)
		}
		r, err := m.Compute(batch(2, 1))
		if err != nil {
			t.Fatal(err)
		}
		if repeat {
			if r, err = m.Compute(batch(2, 1)); err != nil {
				t.Fatalf("repeated Compute(2, install 1): %v", err)
			}
		}
		if v, err := m.Update(2); err != nil || v != 2 {
			t.Fatalf("Update(2): version %d, %v", v, err)
		}
		return r, stateBytes(t, m)
	}
	// Out of order is still refused: batch 2 is staged, and a compute of
	// batch 3 that installs batch 1 again would skip batch 2.
	m := mk(t, "lstm", params)
	if _, err := m.Compute(batch(1, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Compute(batch(2, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Compute(batch(3, 1)); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("Compute(3, install 1) with batch 2 staged: %v, want ErrNotStaged", err)
	}
	once, stOnce := run(false)
	twice, stTwice := run(true)
	if !bytes.Equal(once.Outputs[0].Data, twice.Outputs[0].Data) || once.NextStateVersion != twice.NextStateVersion {
		t.Fatal("the repeated compute answered differently")
	}
	if !bytes.Equal(stOnce, stTwice) {
		t.Fatal("the state after a repeated compute differs")
	}
}

// olearn's patch allocates a part a range covers whole without copying
// it and copies a part it writes partly: either way the state is the old
// one with the ranges written, and a capture taken before reads the old
// state.
func TestOLearnPatchWholeAndPartialParts(t *testing.T) {
	m := mk(t, "olearn", map[string]any{"in_dim": 8, "state_mb": 1, "expert_width": 4})
	k := m.(*core).k.(*olearn)
	k.ready()
	w1 := uint64(4 * len(k.experts[0].w1)) // bytes of one block's w1
	before := stateBytes(t, m)
	rs := []Range{
		{Off: w1, Data: bytes.Repeat([]byte{1}, int(w1))},        // block 1's w1, whole
		{Off: 2*w1 + 4, Data: bytes.Repeat([]byte{2}, 8)},        // two floats inside block 2's w1
		{Off: 3*w1 - 4, Data: bytes.Repeat([]byte{3}, 8)},        // the end of block 2's w1 and block 3's first float
		{Off: w1 + 8, Data: bytes.Repeat([]byte{4}, 4)},          // block 1's w1 again, after it was made whole
		{Off: uint64(len(before)) - 4, Data: []byte{5, 5, 5, 5}}, // the state's last float
	}
	var captured bytes.Buffer
	err := m.ReadState(func(StateInfo) (io.Writer, error) {
		if _, err := m.WriteStateRanges(0, 1, rs); err != nil {
			t.Fatal(err)
		}
		return &captured, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(captured.Bytes(), before) {
		t.Fatal("the patch changed a captured state")
	}
	if got := stateBytes(t, m); !bytes.Equal(got, applyRanges(before, rs)) {
		t.Fatal("patched state is not the old one with the ranges written")
	}
}
