package parity

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
)

// parTestLinear is a linear model without bias, F(x) = W·x, computed in
// float64 and rounded to float32 (as a serving backend would answer).
type parTestLinear struct {
	in, out int
	w       []float32 // out x in, row-major
}

func (m parTestLinear) apply(x []float32) []float32 {
	y := make([]float32, m.out)
	for o := range m.out {
		var s float64
		for i, v := range x {
			s += float64(m.w[o*m.in+i]) * float64(v)
		}
		y[o] = float32(s)
	}
	return y
}

// parTestGroup is a coding group run through a linear model: the k
// queries, their outputs, and the outputs of the r parity queries (the
// parity model is the deployed model itself).
func parTestGroup(t *testing.T, code Code, model parTestLinear, queries [][]float32) (outputs, parities [][]float32) {
	t.Helper()
	enc, err := NewSumEncoder(code, model.in)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queries {
		outputs = append(outputs, model.apply(q))
	}
	p := make([]float32, model.in)
	for j := range code.R {
		if err := enc.Encode(p, queries, j); err != nil {
			t.Fatalf("Encode j=%d: %v", j, err)
		}
		parities = append(parities, model.apply(p))
	}
	return outputs, parities
}

// parTestErase returns the available outputs and parities under an
// erasure mask over the k+r positions (data first), the missing data
// positions, and destinations for them.
func parTestErase(code Code, outputs, parities [][]float32, erased []bool) (outs, pars [][]float32, missing []int, dst [][]float32) {
	outs = make([][]float32, code.K)
	pars = make([][]float32, code.R)
	for i := range code.K {
		if erased[i] {
			missing = append(missing, i)
			dst = append(dst, make([]float32, len(outputs[i])))
		} else {
			outs[i] = outputs[i]
		}
	}
	for j := range code.R {
		if !erased[code.K+j] {
			pars[j] = parities[j]
		}
	}
	return outs, pars, missing, dst
}

func parTestMask(erased []bool) string {
	var b strings.Builder
	for _, e := range erased {
		if e {
			b.WriteByte('x')
		} else {
			b.WriteByte('.')
		}
	}
	return b.String()
}

// TestReconstructLinearModelExact: a linear model without bias is its own
// parity model under the sum encoder, so decoding must give back the
// erased outputs up to float rounding, for every erasure of up to r of the
// k+r outputs (data or parity).
func TestReconstructLinearModelExact(t *testing.T) {
	rng := parTestRand(t)
	for _, k := range []int{2, 3, 4} {
		for _, r := range []int{1, 2, 3} {
			code, err := NewCode(k, r)
			if err != nil {
				t.Fatal(err)
			}
			model := parTestLinear{in: 24, out: 10, w: parTestVec(rng, 24*10)}
			queries := make([][]float32, k)
			for i := range queries {
				queries[i] = parTestVec(rng, model.in)
			}
			outputs, parities := parTestGroup(t, code, model, queries)
			dec := NewDecoder(code)
			patterns := 0
			parTestSubsets(k+r, r, func(erased []bool) {
				outs, pars, missing, dst := parTestErase(code, outputs, parities, erased)
				if err := dec.Reconstruct(dst, outs, pars); err != nil {
					t.Errorf("k=%d r=%d erased %s: %v", k, r, parTestMask(erased), err)
					return
				}
				for b, i := range missing {
					if e := parTestRelErr(dst[b], outputs[i]); e > 1e-4 {
						t.Errorf("k=%d r=%d erased %s: output %d relative error %.3g > 1e-4\n got %v\nwant %v", k, r, parTestMask(erased), i, e, dst[b], outputs[i])
					}
				}
				patterns++
			})
			if patterns == 0 {
				t.Fatalf("k=%d r=%d: no patterns tried", k, r)
			}
		}
	}
}

// TestMDSEveryErasurePattern is the test of the coefficient choice: for
// every code up to k=8, r=4, every erasure of at most r of the k+r outputs
// is decodable (CanDecode) and decoded correctly (Reconstruct), and every
// erasure of more data outputs than parities present is refused by both.
func TestMDSEveryErasurePattern(t *testing.T) {
	rng := parTestRand(t)
	const n = 6
	for k := 2; k <= 8; k++ {
		for r := 1; r <= 4; r++ {
			code, err := NewCode(k, r)
			if err != nil {
				t.Fatal(err)
			}
			outputs := make([][]float32, k)
			for i := range outputs {
				outputs[i] = parTestVec(rng, n)
			}
			parities := make([][]float32, r)
			for j := range parities {
				parities[j] = make([]float32, n)
				for e := range n {
					var s float64
					for i := range k {
						s += float64(Coefficient(j, i)) * float64(outputs[i][e])
					}
					parities[j][e] = float32(s)
				}
			}
			dec := NewDecoder(code)
			parTestSubsets(k+r, k+r, func(erased []bool) {
				haveData, havePar := make([]bool, k), make([]bool, r)
				missing, present := 0, 0
				for i := range k {
					haveData[i] = !erased[i]
					if erased[i] {
						missing++
					}
				}
				for j := range r {
					havePar[j] = !erased[k+j]
					if !erased[k+j] {
						present++
					}
				}
				decodable := missing <= present
				if got := code.CanDecode(haveData, havePar); got != decodable {
					t.Errorf("k=%d r=%d erased %s: CanDecode = %v, want %v", k, r, parTestMask(erased), got, decodable)
				}
				outs, pars, miss, dst := parTestErase(code, outputs, parities, erased)
				err := dec.Reconstruct(dst, outs, pars)
				if !decodable {
					if !errors.Is(err, ErrUndecodable) {
						t.Errorf("k=%d r=%d erased %s: Reconstruct error %v, want ErrUndecodable", k, r, parTestMask(erased), err)
					}
					return
				}
				if err != nil {
					t.Errorf("k=%d r=%d erased %s: %v", k, r, parTestMask(erased), err)
					return
				}
				for b, i := range miss {
					// The parities are rounded to float32 and carry
					// coefficients up to 8^3, so the tolerance grows with them.
					if e := parTestRelErr(dst[b], outputs[i]); e > 1e-3 {
						t.Errorf("k=%d r=%d erased %s: output %d relative error %.3g", k, r, parTestMask(erased), i, e)
					}
				}
			})
		}
	}
}

func TestReconstructUndecodable(t *testing.T) {
	code, _ := NewCode(3, 1)
	dec := NewDecoder(code)
	a, p := []float32{1, 2}, []float32{3, 4}
	err := dec.Reconstruct([][]float32{make([]float32, 2), make([]float32, 2)}, [][]float32{nil, a, nil}, [][]float32{p})
	if !errors.Is(err, ErrUndecodable) {
		t.Errorf("two missing, r=1: error %v, want ErrUndecodable", err)
	}
	err = dec.Reconstruct([][]float32{make([]float32, 2)}, [][]float32{nil, a, a}, [][]float32{nil})
	if !errors.Is(err, ErrUndecodable) {
		t.Errorf("one missing, parity missing: error %v, want ErrUndecodable", err)
	}
	code2, _ := NewCode(3, 2)
	err = NewDecoder(code2).Reconstruct([][]float32{make([]float32, 2), make([]float32, 2)}, [][]float32{nil, a, nil}, [][]float32{nil, p})
	if !errors.Is(err, ErrUndecodable) {
		t.Errorf("two missing, one of two parities: error %v, want ErrUndecodable", err)
	}
}

func TestReconstructShapeErrors(t *testing.T) {
	code, _ := NewCode(3, 2)
	dec := NewDecoder(code)
	v := func(n int) []float32 { return make([]float32, n) }
	for _, tc := range []struct {
		name           string
		dst, outs, par [][]float32
		want           string
	}{
		{"data lengths differ", [][]float32{v(3)}, [][]float32{nil, v(3), v(4)}, [][]float32{v(3), nil}, "data output 2 holds 4"},
		{"parity length differs", [][]float32{v(3)}, [][]float32{nil, v(3), v(3)}, [][]float32{v(3), v(2)}, "parity output 1 holds 2"},
		{"destination length", [][]float32{v(2)}, [][]float32{nil, v(3), v(3)}, [][]float32{v(3), nil}, "destination 0"},
		{"destination count", [][]float32{v(3), v(3)}, [][]float32{nil, v(3), v(3)}, [][]float32{v(3), nil}, "2 destinations for 1 missing"},
		{"too few outputs", [][]float32{v(3)}, [][]float32{nil, v(3)}, [][]float32{v(3), nil}, "2 data outputs"},
		{"too many parities", [][]float32{v(3)}, [][]float32{nil, v(3), v(3)}, [][]float32{v(3), nil, nil}, "3 parity outputs"},
	} {
		err := dec.Reconstruct(tc.dst, tc.outs, tc.par)
		if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want ErrShape naming %q", tc.name, err, tc.want)
		}
	}
	if err := NewDecoder(Code{K: 1, R: 1}).Reconstruct(nil, [][]float32{nil}, [][]float32{nil}); !errors.Is(err, ErrBadCode) {
		t.Errorf("invalid code literal: error %v, want ErrBadCode", err)
	}
	// Nothing missing: nothing to do.
	if err := dec.Reconstruct(nil, [][]float32{v(2), v(2), v(2)}, [][]float32{nil, nil}); err != nil {
		t.Errorf("nothing missing: %v", err)
	}
}

// TestReconstructUsesFirstAvailableParities: with one output missing and
// two parities present, the decoder uses parity 0 only; a garbage parity 1
// must not change the result. With parity 0 missing it uses parity 1.
func TestReconstructUsesFirstAvailableParities(t *testing.T) {
	code, _ := NewCode(3, 2)
	dec := NewDecoder(code)
	x := [][]float32{{1, 2}, {3, 4}, {5, 6}}
	p0 := []float32{9, 12}                  // x0+x1+x2
	p1 := []float32{1 + 6 + 15, 2 + 8 + 18} // x0+2x1+3x2
	nan := float32(math.NaN())
	dst := [][]float32{make([]float32, 2)}
	if err := dec.Reconstruct(dst, [][]float32{x[0], nil, x[2]}, [][]float32{p0, {nan, nan}}); err != nil {
		t.Fatal(err)
	}
	if dst[0][0] != 3 || dst[0][1] != 4 {
		t.Errorf("with parity 0: got %v, want [3 4]", dst[0])
	}
	if err := dec.Reconstruct(dst, [][]float32{x[0], nil, x[2]}, [][]float32{nil, p1}); err != nil {
		t.Fatal(err)
	}
	if dst[0][0] != 3 || dst[0][1] != 4 {
		t.Errorf("with parity 1: got %v, want [3 4]", dst[0])
	}
}

// TestDecoderConcurrent runs many patterns from several goroutines on one
// decoder (run with -race): the shared cache must stay consistent.
func TestDecoderConcurrent(t *testing.T) {
	code, _ := NewCode(6, 3)
	rng := parTestRand(t)
	model := parTestLinear{in: 8, out: 5, w: parTestVec(rng, 40)}
	queries := make([][]float32, code.K)
	for i := range queries {
		queries[i] = parTestVec(rng, model.in)
	}
	outputs, parities := parTestGroup(t, code, model, queries)
	var masks [][]bool
	parTestSubsets(code.K+code.R, code.R, func(erased []bool) { masks = append(masks, erased) })
	dec := NewDecoder(code)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range len(masks) {
				erased := masks[(n*7+g*13)%len(masks)]
				outs, pars, missing, dst := parTestErase(code, outputs, parities, erased)
				if err := dec.Reconstruct(dst, outs, pars); err != nil {
					errs <- err
					return
				}
				for b, i := range missing {
					if e := parTestRelErr(dst[b], outputs[i]); e > 1e-4 {
						errs <- fmt.Errorf("erased %s: output %d relative error %.3g", parTestMask(erased), i, e)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
