package models

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/refserver/nn"
)

func smallMLP(linear bool) *MLP {
	m := &MLP{In: 3, Hidden: 2, Out: 2, Linear: linear,
		W1: []float32{1, 2, 3, 4, 5, 6}, B1: []float32{0.5, -0.5}, W2: []float32{1, -1, 2, 0.25}, B2: []float32{0.1, 0.2}}
	return m
}

// The weights format: the classifier's file is unchanged, a parity model
// is marked by its own magic, and the loader refuses the wrong kind,
// shape or length with an error naming what is wrong.
func TestMLPFormat(t *testing.T) {
	for _, linear := range []bool{false, true} {
		m := smallMLP(linear)
		b := EncodeMLP(m)
		wantMagic := map[bool]string{false: "HAMSMLP1", true: "HAMSMLPL"}[linear]
		if string(b[:8]) != wantMagic {
			t.Fatalf("linear=%v: magic %q", linear, b[:8])
		}
		d, err := DecodeMLP(b)
		if err != nil || d.Linear != linear || d.In != 3 || d.Hidden != 2 || d.Out != 2 || !slices.Equal(d.W2, m.W2) || !slices.Equal(d.B2, m.B2) {
			t.Fatalf("linear=%v: round trip %+v, %v", linear, d, err)
		}
		// Linear drops the softmax: raw relu(x·W1+b1)·W2+b2.
		y := d.Forward(nn.Deterministic, []float32{1, 0, 1}, 1)
		h0, h1 := float32(1+5+0.5), float32(2+6-0.5)
		raw := []float32{h0*1 + h1*2 + 0.1, h0*-1 + h1*0.25 + 0.2}
		if linear && !slices.Equal(y, raw) {
			t.Fatalf("linear forward %v, want %v", y, raw)
		}
		if !linear && math.Abs(float64(y[0]+y[1])-1) > 1e-6 {
			t.Fatalf("softmax forward %v does not sum to 1", y)
		}
	}
	b := EncodeMLP(smallMLP(true))
	for name, c := range map[string]struct {
		b    []byte
		want string
	}{
		"magic":     {append([]byte("HAMSMLP9"), b[8:]...), "bad magic"},
		"short":     {b[:10], "bad magic"},
		"truncated": {b[:len(b)-4], "bytes, want"},
		"long":      {append(slices.Clone(b), 0, 0, 0, 0), "bytes, want"},
		"dims":      {binary.LittleEndian.AppendUint32(append([]byte(nil), b[:16]...), 0), "bad dims"},
	} {
		if _, err := DecodeMLP(c.b); err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "models: ") {
			t.Errorf("%s: %v, want an error naming %q", name, err, c.want)
		}
	}
	// The deployed classifier's file is in the original format, byte for byte.
	fm, err := FashionMLP()
	if err != nil || fm.Linear || fm.In != 784 || fm.Out != 10 {
		t.Fatalf("FashionMLP: %+v, %v", fm, err)
	}
	orig, _ := weightFiles.ReadFile("weights/fashion-mlp.bin")
	if !bytes.Equal(EncodeMLP(fm), orig) {
		t.Fatal("EncodeMLP(FashionMLP()) changed the classifier's file")
	}
	// check refuses the wrong kind and shape, naming both.
	if err := fm.check(784, 10, true); err == nil || !strings.Contains(err.Error(), "softmax-output (classifier) MLP, want a linear-output (parity)") {
		t.Errorf("softmax file as a parity model: %v", err)
	}
	if err := smallMLP(true).check(784, 10, true); err == nil || !strings.Contains(err.Error(), "shape 3-2-2, want 784-*-10") {
		t.Errorf("wrong shape: %v", err)
	}
	for _, name := range []string{"nope", "../weights/fashion-mlp", "fashion-mlp.bin"} {
		if _, err := EmbeddedNet(name); err == nil || !strings.Contains(err.Error(), "fashion-mlp") {
			t.Errorf("EmbeddedNet(%q): %v, want an error listing the embedded weights", name, err)
		}
	}
	if _, err := FashionParityMLP(5); err == nil || !strings.Contains(err.Error(), "k=5") {
		t.Errorf("k=5: %v", err)
	}
	// The legacy MLP and its network form compute the same function.
	for _, linear := range []bool{false, true} {
		m := smallMLP(linear)
		x := []float32{1, 0, 1, 0.5, -1, 2}
		if got, want := m.Net().Forward(nn.Deterministic, x, 2), m.Forward(nn.Deterministic, x, 2); !slices.Equal(got, want) {
			t.Fatalf("linear=%v: Net() %v, MLP %v", linear, got, want)
		}
	}
	// DecodeWeights reads both formats and names both in its error.
	if _, err := DecodeWeights([]byte("HAMSXXXX0000")); err == nil || !strings.Contains(err.Error(), `"HAMSNETW" (network) or "HAMSMLP1" / "HAMSMLPL" (MLP)`) {
		t.Errorf("unknown magic: %v", err)
	}
	if _, err := DecodeWeights(append([]byte("HAMSNETW"), 9, 0, 0, 0, 0, 0, 0, 0)); err == nil || !strings.Contains(err.Error(), "format version 9") {
		t.Errorf("unknown version: %v", err)
	}
}

func TestEmbeddedParityModels(t *testing.T) {
	names := WeightNames()
	for _, k := range FashionParityKs {
		if !slices.Contains(names, FashionParityWeights(k)) {
			t.Fatalf("%s not embedded (have %v)", FashionParityWeights(k), names)
		}
		pm, err := FashionParityMLP(k)
		if err != nil {
			t.Fatal(err)
		}
		if pm.Softmax || pm.InSize() != 784 || pm.OutSize() != 10 {
			t.Fatalf("k=%d: %d -> %d softmax=%v", k, pm.InSize(), pm.OutSize(), pm.Softmax)
		}
		// Served as kind classifier with param weights: inputs beyond
		// 0..1 are accepted and the scores are the raw parity outputs.
		m := mk(t, "classifier", map[string]any{"weights": FashionParityWeights(k), "deterministic": 1})
		x := make([]float32, 3*784)
		for i := range x {
			x[i] = float32(k) * float32(i%97) / 96
		}
		got := infer1(t, m, tensor.FromFloat32("images", []int64{3, 784}, x))
		want := pm.Forward(nn.Deterministic, x, 3)
		if !slices.Equal(got, want) {
			t.Fatalf("k=%d: served scores %v, want %v", k, got[:10], want[:10])
		}
		var s float32
		for _, v := range got[:10] {
			s += v
		}
		if math.Abs(float64(s)-1) < 1e-3 {
			t.Fatalf("k=%d: parity scores %v sum to 1: a softmax was applied", k, got[:10])
		}
	}
	_, err := New(&config.Model{Name: "p", Kind: "classifier", Params: map[string]any{"weights": "fashion-parity-sum-k9"}})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "fashion-parity-sum-k2") {
		t.Fatalf("unknown weights: %v", err)
	}
	if got := ParityWeightsName("fashion-paper-mlp", "concat", 4, 1); got != "fashion-paper-mlp-parity-concat-k4-p1" {
		t.Fatalf("ParityWeightsName: %s", got)
	}
}

func TestSumEncodeSubtractDecode(t *testing.T) {
	g := ParityGroups(10, 3, 1)
	if len(g) != 3 {
		t.Fatalf("%d groups of 3 from 10", len(g))
	}
	seen := map[int]bool{}
	for _, grp := range g {
		for _, i := range grp {
			if seen[i] || i < 0 || i >= 10 {
				t.Fatalf("groups %v", g)
			}
			seen[i] = true
		}
	}
	if !slices.EqualFunc(g, ParityGroups(10, 3, 1), slices.Equal) || slices.EqualFunc(g, ParityGroups(10, 3, 2), slices.Equal) {
		t.Fatal("groups are not a function of the seed")
	}
	x := []float32{1, 2, 10, 20, 100, 200}
	p := SumEncode(x, 2, [][]int{{0, 2}, {1}})
	if !slices.Equal(p, []float32{101, 202, 10, 20}) {
		t.Fatalf("sum encode %v", p)
	}
	if r := SubtractDecode(p, x, 2, []int{0, 2}, 1); !slices.Equal(r, []float32{100, 200}) {
		t.Fatalf("decode %v", r)
	}
	// An exact parity model (the identity here) reconstructs everything.
	f := []float32{0.9, 0.1, 0.2, 0.8, 0.6, 0.4, 0.3, 0.7}
	labels := []int{0, 1, 1, 1}
	groups := [][]int{{0, 1}, {2, 3}}
	s := ScoreParity(f, SumEncode(f, 2, groups), 2, labels, groups)
	if s.K != 2 || s.Groups != 2 || s.Aa != 0.75 || s.Ad != 0.75 || s.Agreement != 1 {
		t.Fatalf("exact parity: %v", s)
	}
}
