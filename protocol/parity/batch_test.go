package parity

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// parTestBatchModel is a two-input, two-output linear model without bias
// over batches: y = Wya·a + Wyb·b (y: [rows, 4]) and z = Wz·a (z:
// [rows, 2, 3]), a: [rows, 5], b: [rows, 2, 2].
type parTestBatchModel struct {
	ya, yb, z parTestLinear
}

func newParTestBatchModel(rng *rand.Rand) parTestBatchModel {
	return parTestBatchModel{
		ya: parTestLinear{in: 5, out: 4, w: parTestVec(rng, 20)},
		yb: parTestLinear{in: 4, out: 4, w: parTestVec(rng, 16)},
		z:  parTestLinear{in: 5, out: 6, w: parTestVec(rng, 30)},
	}
}

func (m parTestBatchModel) inputs(rng *rand.Rand, rows int) []*hamsv1.Tensor {
	return []*hamsv1.Tensor{
		tensor.FromFloat32("a", []int64{int64(rows), 5}, parTestVec(rng, rows*5)),
		tensor.FromFloat32("b", []int64{int64(rows), 2, 2}, parTestVec(rng, rows*4)),
	}
}

func (m parTestBatchModel) run(t *testing.T, in []*hamsv1.Tensor) []*hamsv1.Tensor {
	t.Helper()
	a, err := tensor.Float32(in[0])
	if err != nil {
		t.Fatal(err)
	}
	b, err := tensor.Float32(in[1])
	if err != nil {
		t.Fatal(err)
	}
	rows := int(in[0].Shape[0])
	var y, z []float32
	for q := range rows {
		ya := m.ya.apply(a[q*5 : (q+1)*5])
		yb := m.yb.apply(b[q*4 : (q+1)*4])
		for o := range ya {
			y = append(y, ya[o]+yb[o])
		}
		z = append(z, m.z.apply(a[q*5:(q+1)*5])...)
	}
	return []*hamsv1.Tensor{
		tensor.FromFloat32("y", []int64{int64(rows), 4}, y),
		tensor.FromFloat32("z", []int64{int64(rows), 2, 3}, z),
	}
}

func parTestSumFactory(code Code) func(int) (Encoder, error) {
	return func(n int) (Encoder, error) { return NewSumEncoder(code, n) }
}

// TestBatchLinearModelExact runs whole groups with batches of different
// row counts (padding) through EncodeBatch, a linear two-input model as its
// own parity model, and DecodeBatch, for every erasure of up to r of the
// k+r batches.
func TestBatchLinearModelExact(t *testing.T) {
	rng := parTestRand(t)
	model := newParTestBatchModel(rng)
	for _, tc := range []struct {
		k, r int
		rows []uint32
	}{
		{2, 1, []uint32{3, 1}},
		{2, 2, []uint32{1, 4}},
		{3, 1, []uint32{2, 2, 2}},
		{3, 2, []uint32{3, 1, 2}},
		{4, 1, []uint32{1, 5, 2, 3}},
		{4, 3, []uint32{2, 0, 4, 1}},
	} {
		code, _ := NewCode(tc.k, tc.r)
		inputs := make([][]*hamsv1.Tensor, tc.k)
		outputs := make([][]*hamsv1.Tensor, tc.k)
		maxRows := uint32(0)
		for i, n := range tc.rows {
			inputs[i] = model.inputs(rng, int(n))
			outputs[i] = model.run(t, inputs[i])
			maxRows = max(maxRows, n)
		}
		parities := make([][]*hamsv1.Tensor, tc.r)
		for j := range tc.r {
			pin, err := EncodeBatch(code, parTestSumFactory(code), j, inputs)
			if err != nil {
				t.Fatalf("k=%d r=%d: EncodeBatch j=%d: %v", tc.k, tc.r, j, err)
			}
			if len(pin) != 2 || pin[0].Name != "a" || pin[1].Name != "b" || pin[0].Shape[0] != int64(maxRows) || len(pin[1].Shape) != 3 {
				t.Fatalf("k=%d r=%d: parity batch %d: %v", tc.k, tc.r, j, pin)
			}
			parities[j] = model.run(t, pin)
		}
		dec := NewDecoder(code)
		parTestSubsets(tc.k+tc.r, tc.r, func(erased []bool) {
			outs := make([][]*hamsv1.Tensor, tc.k)
			pars := make([][]*hamsv1.Tensor, tc.r)
			var missing []int
			for i := range tc.k {
				if erased[i] {
					missing = append(missing, i)
				} else {
					outs[i] = outputs[i]
				}
			}
			for j := range tc.r {
				if !erased[tc.k+j] {
					pars[j] = parities[j]
				}
			}
			what := fmt.Sprintf("k=%d r=%d rows %v erased %s", tc.k, tc.r, tc.rows, parTestMask(erased))
			got, err := DecodeBatch(dec, outs, tc.rows, pars)
			if err != nil {
				t.Errorf("%s: %v", what, err)
				return
			}
			if len(got) != len(missing) {
				t.Errorf("%s: %d reconstructions for %d missing", what, len(got), len(missing))
				return
			}
			for b, i := range missing {
				if len(got[b]) != 2 {
					t.Errorf("%s: batch %d: %d tensors", what, i, len(got[b]))
					continue
				}
				for ti, want := range outputs[i] {
					g := got[b][ti]
					if g.Name != want.Name || g.Datatype != want.Datatype || fmt.Sprint(g.Shape) != fmt.Sprint(want.Shape) {
						t.Errorf("%s: batch %d: got tensor %s %s %v, want %s %s %v", what, i, g.Name, g.Datatype, g.Shape, want.Name, want.Datatype, want.Shape)
						continue
					}
					gv, _ := tensor.Float32(g)
					wv, _ := tensor.Float32(want)
					if e := parTestRelErr(gv, wv); e > 1e-4 {
						t.Errorf("%s: batch %d tensor %s: relative error %.3g\n got %v\nwant %v", what, i, want.Name, e, gv, wv)
					}
				}
			}
		})
	}
}

func TestEncodeBatchPadding(t *testing.T) {
	code, _ := NewCode(3, 2)
	b0 := []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{2, 2}, []float32{1, 2, 3, 4})}
	b1 := []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{1, 2}, []float32{10, 20})}
	b2 := []*hamsv1.Tensor{tensor.FromFloat32("x", []int64{0, 2}, nil)}
	for _, tc := range []struct {
		j       int
		batches [][]*hamsv1.Tensor
		want    []float32
	}{
		{0, [][]*hamsv1.Tensor{b0, b1, b2}, []float32{11, 22, 3, 4}},
		{1, [][]*hamsv1.Tensor{b0, b1, b2}, []float32{21, 42, 3, 4}},
		{1, [][]*hamsv1.Tensor{b1, b0, nil}, []float32{12, 24, 6, 8}}, // a nil batch has no rows
	} {
		got, err := EncodeBatch(code, parTestSumFactory(code), tc.j, tc.batches)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := tensor.Float32(got[0])
		if fmt.Sprint(got[0].Shape) != "[2 2]" || fmt.Sprint(v) != fmt.Sprint(tc.want) {
			t.Errorf("j=%d: got %v %v, want [2 2] %v", tc.j, got[0].Shape, v, tc.want)
		}
	}
}

func TestEncodeBatchErrors(t *testing.T) {
	code, _ := NewCode(2, 1)
	x := func(name string, rows int64, width ...int64) *hamsv1.Tensor {
		shape := append([]int64{rows}, width...)
		n, _ := tensor.NumElements(shape)
		return tensor.FromFloat32(name, shape, make([]float32, n))
	}
	good := []*hamsv1.Tensor{x("a", 2, 3), x("b", 2, 4)}
	i64 := tensor.FromInt64("b", []int64{2, 4}, make([]int64, 8))
	truncated := x("b", 2, 4)
	truncated.Data = truncated.Data[:12]
	for _, tc := range []struct {
		name    string
		j       int
		batches [][]*hamsv1.Tensor
		factory func(int) (Encoder, error)
		is      error
		parts   []string
	}{
		{"other name", 0, [][]*hamsv1.Tensor{good, {x("a", 1, 3), x("c", 1, 4)}}, nil, ErrShape, []string{"batch 1", `"b"`}},
		{"other width", 0, [][]*hamsv1.Tensor{good, {x("a", 1, 3), x("b", 1, 5)}}, nil, ErrShape, []string{"batch 1", `"b"`, "[5]"}},
		{"other row shape", 0, [][]*hamsv1.Tensor{good, {x("a", 1, 3), x("b", 1, 2, 2)}}, nil, ErrShape, []string{"batch 1", `"b"`}},
		{"not FP32", 0, [][]*hamsv1.Tensor{good, {x("a", 1, 3), i64}}, nil, ErrShape, []string{"batch 1", `"b"`, "INT64", "FP32"}},
		{"not FP32 first", 0, [][]*hamsv1.Tensor{{x("a", 2, 3), i64}, good}, nil, ErrShape, []string{"batch 0", `"b"`, "INT64"}},
		{"truncated data", 0, [][]*hamsv1.Tensor{good, {x("a", 2, 3), truncated}}, nil, ErrShape, []string{"batch 1", `"b"`}},
		{"scalar", 0, [][]*hamsv1.Tensor{{tensor.FromFloat32("s", nil, []float32{1})}, nil}, nil, ErrShape, []string{`"s"`, "scalar"}},
		{"rows differ in a batch", 0, [][]*hamsv1.Tensor{good, {x("a", 1, 3), x("b", 2, 4)}}, nil, ErrShape, []string{"batch 1", `"b"`, "2 rows"}},
		{"tensor count", 0, [][]*hamsv1.Tensor{good, {x("a", 1, 3)}}, nil, ErrShape, []string{"batch 1", "1 tensors"}},
		{"batch count", 0, [][]*hamsv1.Tensor{good}, nil, ErrShape, []string{"1 batches"}},
		{"all nil", 0, [][]*hamsv1.Tensor{nil, nil}, nil, ErrShape, []string{"nil"}},
		{"parity index", 1, [][]*hamsv1.Tensor{good, good}, nil, ErrBadCode, []string{"parity index 1"}},
		{"concat size", 0, [][]*hamsv1.Tensor{good, good}, func(int) (Encoder, error) { return NewConcatEncoder(code, 2, 2, 1) }, ErrShape, []string{`"a"`, "3 values", "queries of 4"}},
		{"factory error", 0, [][]*hamsv1.Tensor{good, good}, func(n int) (Encoder, error) { return NewConcatEncoder(code, n, 0, 1) }, ErrShape, []string{`"a"`, "3x0x1"}},
	} {
		f := tc.factory
		if f == nil {
			f = parTestSumFactory(code)
		}
		_, err := EncodeBatch(code, f, tc.j, tc.batches)
		if !errors.Is(err, tc.is) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.is)
			continue
		}
		for _, p := range tc.parts {
			if !strings.Contains(err.Error(), p) {
				t.Errorf("%s: error %q does not name %s", tc.name, err, p)
			}
		}
	}
}

// parTestOutputsGroup is a k=3, r=1 group of one-output batches ("y", [rows, 2]).
func parTestOutputsGroup() (outputs [][]*hamsv1.Tensor, rows []uint32, parity []*hamsv1.Tensor) {
	outputs = [][]*hamsv1.Tensor{
		{tensor.FromFloat32("y", []int64{2, 2}, []float32{1, 2, 3, 4})},
		{tensor.FromFloat32("y", []int64{1, 2}, []float32{10, 20})},
		{tensor.FromFloat32("y", []int64{2, 2}, []float32{100, 200, 300, 400})},
	}
	parity = []*hamsv1.Tensor{tensor.FromFloat32("y", []int64{2, 2}, []float32{111, 222, 303, 404})}
	return outputs, []uint32{2, 1, 2}, parity
}

func TestDecodeBatchPaddingAndEmpty(t *testing.T) {
	code, _ := NewCode(3, 1)
	dec := NewDecoder(code)
	outputs, rows, parity := parTestOutputsGroup()
	for miss := range 3 {
		outs := append([][]*hamsv1.Tensor(nil), outputs...)
		outs[miss] = nil
		got, err := DecodeBatch(dec, outs, rows, [][]*hamsv1.Tensor{parity})
		if err != nil {
			t.Fatalf("missing %d: %v", miss, err)
		}
		want, _ := tensor.Float32(outputs[miss][0])
		v, _ := tensor.Float32(got[0][0])
		if len(got) != 1 || fmt.Sprint(got[0][0].Shape) != fmt.Sprint(outputs[miss][0].Shape) || fmt.Sprint(v) != fmt.Sprint(want) {
			t.Errorf("missing %d: got %v %v, want %v %v", miss, got[0][0].Shape, v, outputs[miss][0].Shape, want)
		}
	}
	// A missing batch of zero rows needs no parity: with batch 1 (now
	// empty) and batch 0 missing, the one parity suffices.
	outs := [][]*hamsv1.Tensor{nil, nil, outputs[2]}
	parity0 := []*hamsv1.Tensor{tensor.FromFloat32("y", []int64{2, 2}, []float32{101, 202, 303, 404})}
	got, err := DecodeBatch(dec, outs, []uint32{2, 0, 2}, [][]*hamsv1.Tensor{parity0})
	if err != nil {
		t.Fatal(err)
	}
	v0, _ := tensor.Float32(got[0][0])
	if len(got) != 2 || fmt.Sprint(v0) != "[1 2 3 4]" || fmt.Sprint(got[1][0].Shape) != "[0 2]" {
		t.Errorf("got %v and %v", v0, got[1][0].Shape)
	}
	// Nothing missing: nothing to reconstruct.
	if got, err := DecodeBatch(dec, outputs, rows, [][]*hamsv1.Tensor{nil}); err != nil || len(got) != 0 {
		t.Errorf("nothing missing: %v, %v", got, err)
	}
}

func TestDecodeBatchUndecodable(t *testing.T) {
	code, _ := NewCode(3, 1)
	outputs, rows, parity := parTestOutputsGroup()
	_, err := DecodeBatch(NewDecoder(code), [][]*hamsv1.Tensor{nil, outputs[1], nil}, rows, [][]*hamsv1.Tensor{parity})
	if !errors.Is(err, ErrUndecodable) {
		t.Errorf("two missing, r=1: %v, want ErrUndecodable", err)
	}
	_, err = DecodeBatch(NewDecoder(code), [][]*hamsv1.Tensor{nil, outputs[1], outputs[2]}, rows, [][]*hamsv1.Tensor{nil})
	if !errors.Is(err, ErrUndecodable) {
		t.Errorf("one missing, no parity: %v, want ErrUndecodable", err)
	}
}

// TestDecodeBatchGarbageParity: a parity backend answering garbage must
// never corrupt a reply: every mismatch is ErrShape, naming the parity.
func TestDecodeBatchGarbageParity(t *testing.T) {
	code, _ := NewCode(3, 1)
	dec := NewDecoder(code)
	outputs, rows, _ := parTestOutputsGroup()
	outs := [][]*hamsv1.Tensor{nil, outputs[1], outputs[2]}
	truncated := tensor.FromFloat32("y", []int64{2, 2}, make([]float32, 4))
	truncated.Data = truncated.Data[:15]
	for _, tc := range []struct {
		name   string
		parity []*hamsv1.Tensor
		want   string
	}{
		{"wrong width", []*hamsv1.Tensor{tensor.FromFloat32("y", []int64{2, 3}, make([]float32, 6))}, "[3]"},
		{"wrong row shape", []*hamsv1.Tensor{tensor.FromFloat32("y", []int64{2, 2, 1}, make([]float32, 4))}, "[2 1]"},
		{"wrong dtype", []*hamsv1.Tensor{tensor.FromInt64("y", []int64{2, 2}, make([]int64, 4))}, "INT64"},
		{"too few rows", []*hamsv1.Tensor{tensor.FromFloat32("y", []int64{1, 2}, make([]float32, 2))}, "1 rows"},
		{"wrong name", []*hamsv1.Tensor{tensor.FromFloat32("logits", []int64{2, 2}, make([]float32, 4))}, `"y"`},
		{"extra tensor", []*hamsv1.Tensor{tensor.FromFloat32("y", []int64{2, 2}, make([]float32, 4)), tensor.FromFloat32("z", []int64{2, 2}, make([]float32, 4))}, "2 tensors"},
		{"no tensors", []*hamsv1.Tensor{}, "0 tensors"},
		{"truncated data", []*hamsv1.Tensor{truncated}, "data holds 15"},
		{"nil tensor", []*hamsv1.Tensor{nil}, `no tensor "y"`},
	} {
		_, err := DecodeBatch(dec, outs, rows, [][]*hamsv1.Tensor{tc.parity})
		if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "parity batch 0") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want ErrShape naming parity batch 0 and %s", tc.name, err, tc.want)
		}
		if err := CheckParityShape(outputs[0], tc.parity, 2); !errors.Is(err, ErrShape) {
			t.Errorf("%s: CheckParityShape error %v, want ErrShape", tc.name, err)
		}
	}
	// More rows than the longest batch are fine (only the first are used).
	long := []*hamsv1.Tensor{tensor.FromFloat32("y", []int64{3, 2}, []float32{111, 222, 303, 404, 9, 9})}
	if err := CheckParityShape(outputs[0], long, 2); err != nil {
		t.Errorf("CheckParityShape, 3 rows for 2: %v", err)
	}
	got, err := DecodeBatch(dec, outs, rows, [][]*hamsv1.Tensor{long})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := tensor.Float32(got[0][0]); fmt.Sprint(v) != "[1 2 3 4]" || fmt.Sprint(got[0][0].Shape) != "[2 2]" {
		t.Errorf("decoded from a longer parity: %v %v", got[0][0].Shape, v)
	}
	if err := CheckParityShape(outputs[0], nil, 2); !errors.Is(err, ErrShape) {
		t.Errorf("CheckParityShape(nil parity): %v", err)
	}
}

func TestDecodeBatchDataErrors(t *testing.T) {
	code, _ := NewCode(3, 1)
	dec := NewDecoder(code)
	outputs, rows, parity := parTestOutputsGroup()
	pars := [][]*hamsv1.Tensor{parity}
	for _, tc := range []struct {
		name string
		outs [][]*hamsv1.Tensor
		rows []uint32
		pars [][]*hamsv1.Tensor
		want string
	}{
		{"rows disagree with request", [][]*hamsv1.Tensor{nil, outputs[1], outputs[2]}, []uint32{2, 2, 2}, pars, "data batch 1"},
		{"data batches disagree", [][]*hamsv1.Tensor{nil, outputs[1], {tensor.FromFloat32("y", []int64{2, 3}, make([]float32, 6))}}, rows, pars, "data batch 2"},
		{"too few row counts", [][]*hamsv1.Tensor{nil, outputs[1], outputs[2]}, rows[:2], pars, "2 row counts"},
		{"too many parities", [][]*hamsv1.Tensor{nil, outputs[1], outputs[2]}, rows, [][]*hamsv1.Tensor{parity, parity}, "2 parity outputs"},
	} {
		_, err := DecodeBatch(dec, tc.outs, tc.rows, tc.pars)
		if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want ErrShape naming %s", tc.name, err, tc.want)
		}
	}
}
