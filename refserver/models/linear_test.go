package models

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func infer1(t *testing.T, m Model, in *hamsv1.Tensor) []float32 {
	t.Helper()
	res, err := m.Infer(&Batch{Inputs: []*hamsv1.Tensor{in}, BatchID: 1})
	if err != nil {
		t.Fatal(err)
	}
	v, err := tensor.Float32(res.Outputs[0])
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// maxRelDiff is max |a-b| over max |a|.
func maxRelDiff(a, b []float32) float64 {
	var d, s float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
		s = max(s, math.Abs(float64(a[i])))
	}
	return d / max(s, 1e-30)
}

// The linear kind is linear: F(x+y) = F(x)+F(y) and F(c·x) = c·F(x) within
// float rounding, so it is its own parity model for the sum encoder.
func TestLinearIsLinear(t *testing.T) {
	for _, params := range []map[string]any{nil, {"deterministic": 1}, {"in": 37, "out": 3, "seed": 9}} {
		m := mk(t, "linear", params)
		d := m.Describe()
		in := int(d.Inputs[0].Shape[1])
		out := int(d.Outputs[0].Shape[1])
		if d.Inputs[0].Name != "images" || d.Outputs[0].Name != "scores" || d.Stateful {
			t.Fatalf("describe: %v", d)
		}
		x, y := randT("images", 8, in, 1), randT("images", 8, in, 2)
		xv, _ := tensor.Float32(x)
		yv, _ := tensor.Float32(y)
		sum := make([]float32, len(xv))
		for i := range sum {
			sum[i] = xv[i] + yv[i]
		}
		fx, fy := infer1(t, m, x), infer1(t, m, y)
		fs := infer1(t, m, tensor.FromFloat32("images", []int64{8, int64(in)}, sum))
		if len(fs) != 8*out {
			t.Fatalf("%d outputs, want %d", len(fs), 8*out)
		}
		want := make([]float32, len(fx))
		for i := range want {
			want[i] = fx[i] + fy[i]
		}
		if r := maxRelDiff(want, fs); r > 1e-5 {
			t.Fatalf("%v: F(x+y) differs from F(x)+F(y) by %.3g (relative)", params, r)
		}
		// The k = 4 subtraction decoder reconstructs any one exactly.
		x3, x4 := randT("images", 8, in, 3), randT("images", 8, in, 4)
		x3v, _ := tensor.Float32(x3)
		x4v, _ := tensor.Float32(x4)
		for i := range sum {
			sum[i] += x3v[i] + x4v[i]
		}
		p := infer1(t, m, tensor.FromFloat32("images", []int64{8, int64(in)}, sum))
		f3, f4 := infer1(t, m, x3), infer1(t, m, x4)
		rec := make([]float32, len(p))
		for i := range rec {
			rec[i] = p[i] - fy[i] - f3[i] - f4[i]
		}
		if r := maxRelDiff(fx, rec); r > 1e-4 {
			t.Fatalf("%v: reconstruction of F(x) off by %.3g (relative)", params, r)
		}
	}
}

// x·W with W = LinearWeights(in, out, seed), checked by hand.
func TestLinearComputesXW(t *testing.T) {
	m := mk(t, "linear", map[string]any{"in": 3, "out": 2, "seed": 5, "input": "x", "output": "y"})
	w := LinearWeights(3, 2, 5)
	x := []float32{1, 2, 3, -1, 0, 0.5}
	got := infer1(t, m, tensor.FromFloat32("x", []int64{2, 3}, x))
	for r := range 2 {
		for j := range 2 {
			var s float64
			for i := range 3 {
				s += float64(x[r*3+i]) * float64(w[i*2+j])
			}
			if math.Abs(s-float64(got[r*2+j])) > 1e-5 {
				t.Fatalf("y[%d,%d] = %v, want %v", r, j, got[r*2+j], s)
			}
		}
	}
	if d := m.Describe(); d.Inputs[0].Name != "x" || d.Outputs[0].Name != "y" {
		t.Fatalf("names: %v", d)
	}
}

func TestLinearDeterministicPerSeed(t *testing.T) {
	x := randT("images", 16, 784, 3)
	a := infer1(t, mk(t, "linear", map[string]any{"deterministic": 1}), x)
	b := infer1(t, mk(t, "linear", map[string]any{"deterministic": 1, "seed": 1}), x)
	if !slices.Equal(a, b) {
		t.Fatal("same seed (default 1), different outputs")
	}
	// The default (parallel) reducer may differ in the low bits only.
	if r := maxRelDiff(a, infer1(t, mk(t, "linear", nil), x)); r > 1e-5 {
		t.Fatalf("parallel reducer off by %.3g", r)
	}
	if c := infer1(t, mk(t, "linear", map[string]any{"deterministic": 1, "seed": 2}), x); maxRelDiff(a, c) < 0.1 {
		t.Fatal("seeds 1 and 2 give the same map")
	}
	if !slices.Equal(LinearWeights(10, 3, 4), LinearWeights(10, 3, 4)) {
		t.Fatal("LinearWeights is not a function of its seed")
	}
}

func TestLinearBadParams(t *testing.T) {
	for _, p := range []map[string]any{{"in": 0}, {"out": -1}, {"in": 1 << 20, "out": 1 << 10}, {"seed": "x"}, {"input": 3}} {
		_, err := New(&config.Model{Name: "lin", Kind: "linear", Params: p})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `"lin"`) {
			t.Errorf("%v: %v", p, err)
		}
	}
	m := mk(t, "linear", map[string]any{"in": 4})
	if _, err := m.Infer(&Batch{Inputs: []*hamsv1.Tensor{randT("images", 1, 5, 1)}}); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("wrong width: %v", err)
	}
}
