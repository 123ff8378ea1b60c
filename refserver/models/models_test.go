package models

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/nn"
)

func mk(t testing.TB, kind string, params map[string]any) Model {
	t.Helper()
	m, err := New(&config.Model{Name: "m-" + kind, Kind: kind, Params: params})
	if err != nil {
		t.Fatalf("new %s: %v", kind, err)
	}
	return m
}

func randT(name string, rows, w int, seed uint64) *hamsv1.Tensor {
	v := make([]float32, rows*w)
	nn.FillNormal(v, 1, nn.NewRand(seed))
	return tensor.FromFloat32(name, []int64{int64(rows), int64(w)}, v)
}

func TestFashionAccuracy(t *testing.T) {
	x, y, err := LoadFashion(FashionDir, "t10k")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("dataset missing in CI: %v", err)
		}
		t.Skipf("Fashion-MNIST not installed: %v", err)
	}
	m := mk(t, "classifier", nil)
	n := len(y)
	res, err := m.Infer(&Batch{Inputs: []*hamsv1.Tensor{tensor.FromFloat32("images", []int64{int64(n), 784}, x)}})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := tensor.Float32(res.Outputs[0])
	ok := 0
	for i, l := range y {
		if Argmax(s[i*10:(i+1)*10]) == l {
			ok++
		}
	}
	acc := float64(ok) / float64(n)
	t.Logf("Fashion-MNIST test accuracy: %.4f (%d/%d)", acc, ok, n)
	if acc < 0.85 {
		t.Fatalf("accuracy %.4f < 0.85", acc)
	}
}

func TestIDXErrors(t *testing.T) {
	dir := t.TempDir()
	p := dir + "/bad"
	os.WriteFile(p, []byte{1, 2, 3, 4, 5}, 0o644)
	if _, _, err := ReadIDX(p); err == nil {
		t.Fatal("bad magic accepted")
	}
	os.WriteFile(p, []byte{0, 0, 8, 1, 0, 0, 0, 5, 1, 2}, 0o644)
	if _, _, err := ReadIDX(p); err == nil {
		t.Fatal("truncated data accepted")
	}
	os.WriteFile(p, []byte{0, 0, 8, 1, 0, 0, 0, 2, 7, 9}, 0o644)
	dims, data, err := ReadIDX(p)
	if err != nil || len(dims) != 1 || dims[0] != 2 || !bytes.Equal(data, []byte{7, 9}) {
		t.Fatalf("good idx: %v %v %v", dims, data, err)
	}
	if _, _, err := ReadIDX(dir + "/missing"); err == nil {
		t.Fatal("missing file accepted")
	}
}

// every kind: run a batch of three items, check the declared output shape.
func TestAllKindsRun(t *testing.T) {
	cases := map[string]map[string]any{
		"classifier":  nil,
		"mlp":         nil,
		"linear":      {"in": 20, "out": 5},
		"cnn":         {"in_dim": 64, "out_dim": 8},
		"transcriber": {"in_dim": 100, "width": 32, "out_dim": 16},
		"lstm":        {"in_dim": 8, "hidden": 16, "streams": 4},
		"olearn":      {"in_dim": 20, "state_mb": 1},
		"knn":         {"in_dim": 16, "history": 256},
		"arima":       {"in_dim": 32},
		"astar":       {"in_dim": 64, "grid": 8},
		"concat":      nil,
		"prep":        {"in_dim": 10, "mode": "minmax"},
	}
	if len(cases) != len(Kinds()) {
		t.Fatalf("kinds %v not all covered", Kinds())
	}
	for kind, params := range cases {
		t.Run(kind, func(t *testing.T) {
			m := mk(t, kind, params)
			d := m.Describe()
			if d.Kind != kind || len(d.Inputs) == 0 || len(d.Outputs) == 0 {
				t.Fatalf("describe: %v", d)
			}
			var ins []*hamsv1.Tensor
			for i, s := range d.Inputs {
				if s.Datatype != tensor.FP32 {
					continue
				}
				w := int(s.Shape[1])
				if w < 0 {
					w = 5
				}
				name := s.Name
				if name == AnyInput {
					ins = append(ins, randT("a", 6, 3, 1), randT("b", 6, 4, 2))
					continue
				}
				ins = append(ins, randT(name, 6, w, uint64(i)))
			}
			b := &Batch{Inputs: ins, Rows: []uint32{1, 2, 3}, StreamIDs: []string{"s1", "s2", "s1"}, BatchID: 1}
			res, err := m.Infer(b)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Outputs) != len(d.Outputs) {
				t.Fatalf("%d outputs, declared %d", len(res.Outputs), len(d.Outputs))
			}
			for i, o := range res.Outputs {
				if err := tensor.Validate(o); err != nil || o.Shape[0] != 6 || o.Name != d.Outputs[i].Name {
					t.Fatalf("output %v: %v", o.Shape, err)
				}
				if want := d.Outputs[i].Shape; len(want) > 1 && want[1] >= 0 && o.Shape[1] != want[1] {
					t.Fatalf("output shape %v, declared %v", o.Shape, want)
				}
				if o.Datatype == tensor.FP32 {
					v, _ := tensor.Float32(o)
					for _, x := range v {
						if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
							t.Fatalf("non-finite output %v", x)
						}
					}
				}
			}
			if d.Stateful != (d.StateBytes > 0) {
				t.Fatalf("stateful %v with %d state bytes", d.Stateful, d.StateBytes)
			}
		})
	}
}

// A transcriber with a context input reads each row of x together with
// the same row of the context: its answer for a row changes with that
// row's context only, and the context is required.
func TestTranscriberContext(t *testing.T) {
	m := mk(t, "transcriber", map[string]any{"in_dim": 12, "width": 16, "out_dim": 4, "context": "scores", "context_dim": 3})
	if d := m.Describe(); len(d.Inputs) != 2 || d.Inputs[1].Name != "scores" || d.Inputs[1].Shape[1] != 3 {
		t.Fatalf("inputs %v", d.Inputs)
	}
	x := randT("x", 2, 12, 1)
	run := func(ctx *hamsv1.Tensor) []float32 {
		t.Helper()
		res, err := m.Infer(&Batch{Inputs: []*hamsv1.Tensor{x, ctx}, Rows: []uint32{2}, BatchID: 1})
		if err != nil {
			t.Fatal(err)
		}
		v, _ := tensor.Float32(res.Outputs[0])
		return v
	}
	c1 := randT("scores", 2, 3, 2)
	c2 := randT("scores", 2, 3, 2)
	v, _ := tensor.Float32(c2)
	v[4] += 1 // row 1's context only
	c2 = tensor.FromFloat32("scores", []int64{2, 3}, v)
	a, b := run(c1), run(c2)
	if !slices.Equal(a[:4], b[:4]) {
		t.Fatalf("row 0 changed with row 1's context: %v vs %v", a[:4], b[:4])
	}
	if slices.Equal(a[4:], b[4:]) {
		t.Fatalf("row 1 did not change with its context: %v", a[4:])
	}
	if _, err := m.Infer(&Batch{Inputs: []*hamsv1.Tensor{x}, Rows: []uint32{2}, BatchID: 2}); !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), `"scores"`) {
		t.Fatalf("without the context: %v", err)
	}
}

func TestBadConfig(t *testing.T) {
	for _, c := range []config.Model{
		{Name: "x", Kind: "nope"},
		{Name: "x", Kind: "lstm", Params: map[string]any{"hidden": "big"}},
		{Name: "x", Kind: "lstm", Params: map[string]any{"hidden": -1}},
		{Name: "x", Kind: "prep", Params: map[string]any{"mode": "weird"}},
		{Name: "x", Kind: "arima", Params: map[string]any{"in_dim": 5, "p": 4}},
		{Name: "x", Kind: "cnn", Params: map[string]any{"in_dim": 3, "kernel": 5}},
		{Name: "x", Kind: "knn", Params: map[string]any{"history": 3, "k": 5}},
		{Name: "x", Kind: "olearn", Params: map[string]any{"state_mb": 4096}},
		{Name: "x", Kind: "transcriber", Params: map[string]any{"context": "scores"}},
		{Name: "x", Kind: "transcriber", Params: map[string]any{"context_dim": 10}},
		{Name: "x", Kind: "transcriber", Params: map[string]any{"context": "x", "context_dim": 10}},
	} {
		if _, err := New(&c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s %v: err %v", c.Kind, c.Params, err)
		}
	}
}

func TestBadInputs(t *testing.T) {
	m := mk(t, "lstm", map[string]any{"in_dim": 4, "hidden": 4})
	good := randT("x", 2, 4, 1)
	for name, b := range map[string]*Batch{
		"nil tensor":     {Inputs: []*hamsv1.Tensor{nil}},
		"no inputs":      {},
		"missing":        {Inputs: []*hamsv1.Tensor{randT("other", 2, 4, 1)}},
		"dtype":          {Inputs: []*hamsv1.Tensor{tensor.FromInt64("x", []int64{2, 4}, make([]int64, 8))}},
		"width":          {Inputs: []*hamsv1.Tensor{randT("x", 2, 5, 1)}},
		"rank":           {Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{8}, make([]float32, 8))}},
		"scalar":         {Inputs: []*hamsv1.Tensor{tensor.FromFloat32("x", nil, make([]float32, 1))}},
		"short data":     {Inputs: []*hamsv1.Tensor{{Name: "x", Datatype: "FP32", Shape: []int64{2, 4}, Data: make([]byte, 7)}}},
		"bad dtype name": {Inputs: []*hamsv1.Tensor{{Name: "x", Datatype: "FP33", Shape: []int64{2, 4}, Data: make([]byte, 32)}}},
		"rows mismatch":  {Inputs: []*hamsv1.Tensor{good}, Rows: []uint32{1, 2}},
		"stream ids":     {Inputs: []*hamsv1.Tensor{good}, Rows: []uint32{1, 1}, StreamIDs: []string{"a"}},
		"empty":          {Inputs: []*hamsv1.Tensor{randT("x", 0, 4, 1)}},
	} {
		if _, err := m.Compute(b); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: err %v", name, err)
		}
	}
	ol := mk(t, "olearn", map[string]any{"in_dim": 4, "state_mb": 1})
	for name, lab := range map[string]*hamsv1.Tensor{
		"label range": tensor.FromInt64("labels", []int64{2}, []int64{0, 10}),
		"label dtype": tensor.FromFloat32("labels", []int64{2}, []float32{0, 1}),
		"label rows":  tensor.FromInt64("labels", []int64{3}, []int64{0, 1, 2}),
	} {
		if _, err := ol.Compute(&Batch{Inputs: []*hamsv1.Tensor{good, lab}}); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: err %v", name, err)
		}
	}
	cc := mk(t, "concat", nil)
	if _, err := cc.Compute(&Batch{Inputs: []*hamsv1.Tensor{good, tensor.FromInt64("i", []int64{2}, []int64{1, 2})}}); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("concat int64: %v", err)
	}
	if _, err := cc.Compute(&Batch{Inputs: []*hamsv1.Tensor{good, randT("y", 3, 1, 1)}}); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("concat rows: %v", err)
	}
}

func digest(t testing.TB, m Model) (uint64, string) {
	t.Helper()
	h := sha256.New()
	var v uint64
	err := m.ReadState(func(i StateInfo) (io.Writer, error) { v = i.Version; return h, nil })
	if err != nil {
		t.Fatal(err)
	}
	return v, hex.EncodeToString(h.Sum(nil))
}

func TestComputeUpdateSplit(t *testing.T) {
	m := mk(t, "lstm", map[string]any{"in_dim": 4, "hidden": 4, "streams": 8})
	v0, d0 := digest(t, m)
	b := &Batch{Inputs: []*hamsv1.Tensor{randT("x", 2, 4, 1)}, Rows: []uint32{1, 1}, StreamIDs: []string{"a", "b"}, BatchID: 7}
	res, err := m.Compute(b)
	if err != nil {
		t.Fatal(err)
	}
	if res.NextStateVersion != v0+1 {
		t.Fatalf("next version %d", res.NextStateVersion)
	}
	if v, d := digest(t, m); v != v0 || d != d0 {
		t.Fatal("compute changed the installed state")
	}
	if _, err := m.Update(8); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("update of unstaged batch: %v", err)
	}
	v, err := m.Update(7)
	if err != nil || v != v0+1 {
		t.Fatalf("update: %v %v", v, err)
	}
	if _, d := digest(t, m); d == d0 {
		t.Fatal("update did not change the state")
	}
	if v2, err := m.Update(7); err != nil || v2 != v {
		t.Fatalf("repeated update: %v %v", v2, err)
	}
	if _, err := m.Update(9); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("update with nothing staged: %v", err)
	}
	// a new compute replaces the staged state
	m.Compute(&Batch{Inputs: b.Inputs, BatchID: 10})
	m.Compute(&Batch{Inputs: b.Inputs, BatchID: 11})
	if _, err := m.Update(10); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("update of replaced batch: %v", err)
	}
	if _, err := m.Update(11); err != nil {
		t.Fatal(err)
	}
	// stateless: update is a no-op
	s := mk(t, "prep", nil)
	if _, err := s.Update(3); err != nil {
		t.Fatal(err)
	}
}

func TestWriteStateRoundTrip(t *testing.T) {
	for _, kind := range []string{"lstm", "olearn"} {
		p := map[string]any{"in_dim": 8, "state_mb": 1}
		a, b := mk(t, kind, p), mk(t, kind, p)
		x := randT("x", 4, 8, 3)
		lab := tensor.FromInt64("labels", []int64{4}, []int64{1, -1, 3, 2})
		for i := 0; i < 3; i++ {
			if _, err := a.Infer(&Batch{Inputs: []*hamsv1.Tensor{x, lab}, Rows: []uint32{2, 2}, StreamIDs: []string{"p", "q"}, BatchID: uint64(i + 1)}); err != nil {
				t.Fatal(err)
			}
		}
		_, da := digest(t, a)
		_, db := digest(t, b)
		if da == db {
			t.Fatalf("%s: state did not change", kind)
		}
		var buf bytes.Buffer
		a.ReadState(func(StateInfo) (io.Writer, error) { return &buf, nil })
		if v, err := b.WriteState(3, buf.Bytes()); err != nil || v != 3 {
			t.Fatal(v, err)
		}
		if v, d := digest(t, b); d != da || v != 3 {
			t.Fatalf("%s: state after write differs", kind)
		}
		if _, err := b.WriteState(4, buf.Bytes()[1:]); !errors.Is(err, ErrInvalidState) {
			t.Fatalf("short state accepted: %v", err)
		}
		_, vs, err := StateTensors(a)
		if err != nil || len(vs) < 2 {
			t.Fatal(err)
		}
	}
	if _, err := mk(t, "prep", nil).WriteState(1, []byte{1}); !errors.Is(err, ErrInvalidState) {
		t.Fatal("stateless accepted state bytes")
	}
}

func TestOlearnLearnsOnlyFromLabels(t *testing.T) {
	m := mk(t, "olearn", map[string]any{"in_dim": 8, "state_mb": 1, "deterministic": 1})
	x := randT("x", 4, 8, 3)
	_, d0 := digest(t, m)
	unl := tensor.FromInt64("labels", []int64{4}, []int64{-1, -1, -1, -1})
	for _, ins := range [][]*hamsv1.Tensor{{x}, {x, unl}} {
		if _, err := m.Infer(&Batch{Inputs: ins, BatchID: 1}); err != nil {
			t.Fatal(err)
		}
		if _, d := digest(t, m); d != d0 {
			t.Fatal("unlabelled rows changed the weights")
		}
	}
	// repeated SGD on one labelled row raises its score
	one := randT("x", 1, 8, 9)
	lab := tensor.FromInt64("labels", []int64{1}, []int64{3})
	first := -1.0
	for i := 0; i < 30; i++ {
		r, err := m.Infer(&Batch{Inputs: []*hamsv1.Tensor{one, lab}, BatchID: uint64(i + 2)})
		if err != nil {
			t.Fatal(err)
		}
		s, _ := tensor.Float32(r.Outputs[0])
		if first < 0 {
			first = float64(s[3])
		}
		if i == 29 && float64(s[3]) <= first {
			t.Fatalf("score of the trained label did not rise: %v -> %v", first, s[3])
		}
	}
}

// TestStatefulDivergence: two LSTM replicas with identical seeds, fed
// identical batches, end with different state bytes (completion-order
// summation) while staying numerically close. It runs until the bytes
// differ, up to a bound far beyond what is needed in practice.
func TestStatefulDivergence(t *testing.T) {
	// Completion order needs goroutines running in parallel; with one P
	// it changes only on preemption.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0))))
	p := map[string]any{"in_dim": 64, "hidden": 128, "streams": 16, "chunks": 8}
	a, b := mk(t, "lstm", p), mk(t, "lstm", p)
	ids := []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"}
	rows := []uint32{1, 1, 1, 1, 1, 1, 1, 1}
	const minBatches, maxBatches = 50, 5000
	differAt := 0
	for i := 1; i <= maxBatches; i++ {
		x := randT("x", 8, 64, uint64(i))
		for _, m := range []Model{a, b} {
			if _, err := m.Infer(&Batch{Inputs: []*hamsv1.Tensor{x}, Rows: rows, StreamIDs: ids, BatchID: uint64(i)}); err != nil {
				t.Fatal(err)
			}
		}
		if i%25 == 0 || i == maxBatches {
			_, da := digest(t, a)
			_, db := digest(t, b)
			if da != db && differAt == 0 {
				differAt = i
			}
			if differAt > 0 && i >= minBatches {
				break
			}
		}
	}
	if differAt == 0 {
		t.Fatalf("state bytes identical after %d batches", maxBatches)
	}
	_, sa, _ := StateTensors(a)
	_, sb, _ := StateTensors(b)
	va, _ := tensor.Float32(sa[0])
	vb, _ := tensor.Float32(sb[0])
	maxd, ndiff := 0.0, 0
	for i := range va {
		if va[i] != vb[i] {
			ndiff++
		}
		maxd = math.Max(maxd, math.Abs(float64(va[i]-vb[i])))
	}
	t.Logf("state bytes differ by batch %d: %d/%d h values differ, max |diff| %.3g", differAt, ndiff, len(va), maxd)
	if maxd > 1e-3 {
		t.Fatalf("replicas drifted too far: %g", maxd)
	}
	// the deterministic reducer never drifts
	p["deterministic"] = 1
	c, d := mk(t, "lstm", p), mk(t, "lstm", p)
	for i := 1; i <= 20; i++ {
		x := randT("x", 8, 64, uint64(i))
		c.Infer(&Batch{Inputs: []*hamsv1.Tensor{x}, Rows: rows, StreamIDs: ids, BatchID: uint64(i)})
		d.Infer(&Batch{Inputs: []*hamsv1.Tensor{x}, Rows: rows, StreamIDs: ids, BatchID: uint64(i)})
	}
	if _, dc := digest(t, c); func() bool { _, dd := digest(t, d); return dd != dc }() {
		t.Fatal("deterministic replicas differ")
	}
}

// TestReadNeverSeesHalfUpdate: readers run while slow updates install;
// every (version, bytes) a reader sees must be the state recorded for that
// version, never a mix of two.
func TestReadNeverSeesHalfUpdate(t *testing.T) {
	for _, kind := range []string{"lstm", "olearn"} {
		t.Run(kind, func(t *testing.T) {
			m := mk(t, kind, map[string]any{"in_dim": 8, "hidden": 8, "streams": 8, "state_mb": 1})
			entered := make(chan struct{}, 1)
			release := make(chan struct{})
			SetUpdateHook(m, func() {
				entered <- struct{}{}
				<-release
			})
			var mu sync.Mutex
			seen := map[uint64]map[string]bool{}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for r := 0; r < 3; r++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						v, d := digest(t, m)
						mu.Lock()
						if seen[v] == nil {
							seen[v] = map[string]bool{}
						}
						seen[v][d] = true
						mu.Unlock()
					}
				}()
			}
			want := map[uint64]string{}
			v, d := digest(t, m)
			want[v] = d
			lab := tensor.FromInt64("labels", []int64{4}, []int64{1, 2, 3, 4})
			for i := 1; i <= 20; i++ {
				x := randT("x", 4, 8, uint64(i))
				if _, err := m.Compute(&Batch{Inputs: []*hamsv1.Tensor{x, lab}, Rows: []uint32{1, 1, 1, 1}, StreamIDs: []string{"a", "b", "c", "d"}, BatchID: uint64(i)}); err != nil {
					t.Fatal(err)
				}
				done := make(chan uint64)
				go func() {
					v, err := m.Update(uint64(i))
					if err != nil {
						t.Error(err)
					}
					done <- v
				}()
				<-entered
				// Update holds the lock now; readers and Compute of nothing
				// else may proceed. Let it install.
				release <- struct{}{}
				nv := <-done
				_, d := digest(t, m)
				want[nv] = d
			}
			close(stop)
			wg.Wait()
			for v, ds := range seen {
				for d := range ds {
					if want[v] != d {
						t.Fatalf("reader saw version %d with bytes %s, installed %s", v, d[:8], want[v][:8])
					}
				}
			}
			if len(seen) < 2 {
				t.Logf("readers observed %d versions", len(seen))
			}
		})
	}
}

func TestAstarAndArimaSanity(t *testing.T) {
	a := &astar{f: 4, g: 4, density: 0}
	dx, dy, l := a.firstMove(make([]float32, 4))
	if l != 6 || dx+dy != 1 {
		t.Fatalf("open grid: move (%d,%d) length %d", dx, dy, l)
	}
	ar := &arima{p: 2, d: 1, q: 1, w: 32}
	x := make([]float32, 32)
	for i := range x {
		x[i] = float32(2*i + 5)
	}
	fc, _, _, slope := ar.forecast(x)
	if math.Abs(fc-69) > 0.5 || math.Abs(slope-2) > 1e-6 {
		t.Fatalf("linear series: forecast %v (want 69), slope %v", fc, slope)
	}
}
