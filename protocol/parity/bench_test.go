package parity

import (
	"fmt"
	"testing"
)

// Sizes of the benchmarks: a Fashion-MNIST query (28x28x1 = 784 floats)
// and a 1000-class output.
const (
	parBenchQuery  = 784
	parBenchOutput = 1000
)

// parBenchEncodeArgs builds an encoder's arguments: k random queries and a
// destination.
func parBenchEncodeArgs(tb testing.TB, k, size int) (dst []float32, queries [][]float32) {
	rng := parTestRand(tb)
	queries = make([][]float32, k)
	for i := range queries {
		queries[i] = parTestVec(rng, size)
	}
	return make([]float32, size), queries
}

// parBenchDecodeArgs builds a decoding problem: k outputs of n values with
// the given data positions erased and all r parities present.
func parBenchDecodeArgs(tb testing.TB, code Code, n int, erased ...int) (dec *Decoder, dst, outs, pars [][]float32) {
	rng := parTestRand(tb)
	outs = make([][]float32, code.K)
	for i := range outs {
		outs[i] = parTestVec(rng, n)
	}
	pars = make([][]float32, code.R)
	for j := range pars {
		pars[j] = parTestVec(rng, n) // values do not matter for timing
	}
	for _, i := range erased {
		outs[i] = nil
		dst = append(dst, make([]float32, n))
	}
	return NewDecoder(code), dst, outs, pars
}

func BenchmarkEncodeSum(b *testing.B) {
	for _, k := range []int{2, 3, 4} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			code, _ := NewCode(k, 1)
			enc, err := NewSumEncoder(code, parBenchQuery)
			if err != nil {
				b.Fatal(err)
			}
			dst, queries := parBenchEncodeArgs(b, k, parBenchQuery)
			b.ReportAllocs()
			for b.Loop() {
				if err := enc.Encode(dst, queries, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncodeConcat(b *testing.B) {
	for _, k := range []int{2, 4} {
		b.Run(fmt.Sprintf("k=%d", k), func(b *testing.B) {
			code, _ := NewCode(k, 1)
			enc, err := NewConcatEncoder(code, 28, 28, 1)
			if err != nil {
				b.Fatal(err)
			}
			dst, queries := parBenchEncodeArgs(b, k, parBenchQuery)
			b.ReportAllocs()
			for b.Loop() {
				if err := enc.Encode(dst, queries, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, tc := range []struct {
		k, r   int
		erased []int
	}{
		{2, 1, []int{1}},
		{3, 1, []int{1}},
		{4, 1, []int{1}},
		{2, 2, []int{0, 1}},
	} {
		b.Run(fmt.Sprintf("k=%d,r=%d,missing=%d", tc.k, tc.r, len(tc.erased)), func(b *testing.B) {
			code, _ := NewCode(tc.k, tc.r)
			dec, dst, outs, pars := parBenchDecodeArgs(b, code, parBenchOutput, tc.erased...)
			b.ReportAllocs()
			for b.Loop() {
				if err := dec.Reconstruct(dst, outs, pars); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestZeroAllocs: encoding and decoding allocate nothing in steady state
// (the r > 1 decoder after its cache holds the pattern).
func TestZeroAllocs(t *testing.T) {
	for _, k := range []int{2, 4} {
		code, _ := NewCode(k, 2)
		sum, _ := NewSumEncoder(code, parBenchQuery)
		concat, _ := NewConcatEncoder(code, 28, 28, 1)
		dst, queries := parBenchEncodeArgs(t, k, parBenchQuery)
		queries[k-1] = nil // padding too
		for _, enc := range []Encoder{sum, concat} {
			for j := range 2 {
				if n := testing.AllocsPerRun(20, func() {
					if err := enc.Encode(dst, queries, j); err != nil {
						t.Fatal(err)
					}
				}); n != 0 {
					t.Errorf("k=%d %v Encode j=%d: %v allocations, want 0", k, enc.Kind(), j, n)
				}
			}
		}
	}
	for _, tc := range []struct {
		k, r   int
		erased []int
	}{
		{2, 1, []int{0}},
		{4, 1, []int{2}},
		{4, 2, []int{1}},    // one missing: parity 0, the subtraction
		{4, 2, []int{1, 3}}, // two missing: the cached inverse
		{6, 4, []int{0, 2, 3, 5}},
	} {
		code, _ := NewCode(tc.k, tc.r)
		dec, dst, outs, pars := parBenchDecodeArgs(t, code, parBenchOutput, tc.erased...)
		if err := dec.Reconstruct(dst, outs, pars); err != nil { // warm the cache
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(20, func() {
			if err := dec.Reconstruct(dst, outs, pars); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("k=%d r=%d missing %v: Reconstruct: %v allocations, want 0", tc.k, tc.r, tc.erased, n)
		}
	}
	// One missing with parity 0 absent uses parity 1 without the cache.
	code, _ := NewCode(3, 2)
	dec, dst, outs, pars := parBenchDecodeArgs(t, code, 10, 1)
	pars[0] = nil
	if n := testing.AllocsPerRun(20, func() {
		if err := dec.Reconstruct(dst, outs, pars); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("one missing via parity 1: %v allocations, want 0", n)
	}
}
