package nn

import (
	"math"
	"runtime"
	"testing"
)

func naive(a, b []float32, m, k, n int) []float32 {
	c := make([]float32, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			for p := 0; p < k; p++ {
				s += float64(a[i*k+p]) * float64(b[p*n+j])
			}
			c[i*n+j] = float32(s)
		}
	}
	return c
}

func TestMatMulMatchesNaive(t *testing.T) {
	rng := NewRand(1)
	for _, sz := range [][3]int{{1, 1, 1}, {3, 5, 7}, {16, 300, 40}, {8, 1024, 64}} {
		m, k, n := sz[0], sz[1], sz[2]
		a, b := make([]float32, m*k), make([]float32, k*n)
		FillNormal(a, 1, rng)
		FillNormal(b, 1, rng)
		want := naive(a, b, m, k, n)
		for _, r := range []*Reducer{Parallel, Deterministic, {MinWork: 1, MaxChunks: 8}} {
			c := make([]float32, m*n)
			r.MatMul(c, a, b, m, k, n)
			for i := range c {
				if d := math.Abs(float64(c[i] - want[i])); d > 1e-3*math.Sqrt(float64(k)) {
					t.Fatalf("%v: c[%d]=%v want %v", sz, i, c[i], want[i])
				}
			}
		}
	}
}

func TestDeterministicIsExact(t *testing.T) {
	rng := NewRand(2)
	m, k, n := 4, 2048, 64
	a, b := make([]float32, m*k), make([]float32, k*n)
	FillNormal(a, 1, rng)
	FillNormal(b, 1, rng)
	r := &Reducer{Deterministic: true, MinWork: 1, MaxChunks: 8}
	c1, c2 := make([]float32, m*n), make([]float32, m*n)
	r.MatMul(c1, a, b, m, k, n)
	for i := 0; i < 50; i++ {
		r.MatMul(c2, a, b, m, k, n)
		for j := range c1 {
			if math.Float32bits(c1[j]) != math.Float32bits(c2[j]) {
				t.Fatalf("run %d: element %d differs", i, j)
			}
		}
	}
}

// TestParallelDrifts shows completion-order summation produces differing
// low bits across runs (polls up to many runs; a real race, not a flag).
func TestParallelDrifts(t *testing.T) {
	// Completion order needs goroutines running in parallel; with one P
	// it changes only on preemption.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0))))
	rng := NewRand(3)
	m, k, n := 2, 4096, 64
	a, b := make([]float32, m*k), make([]float32, k*n)
	FillNormal(a, 1, rng)
	FillNormal(b, 1, rng)
	r := &Reducer{MinWork: 1, MaxChunks: 8}
	ref := make([]float32, m*n)
	r.MatMul(ref, a, b, m, k, n)
	c := make([]float32, m*n)
	for i := 0; i < 50000; i++ {
		r.MatMul(c, a, b, m, k, n)
		for j := range c {
			if math.Float32bits(c[j]) != math.Float32bits(ref[j]) {
				t.Logf("bits differ after %d runs", i+1)
				return
			}
		}
	}
	t.Fatal("50000 parallel products were bit-identical")
}

func TestATBAndABT(t *testing.T) {
	rng := NewRand(4)
	m, k, n := 5, 7, 3
	a, b := make([]float32, m*k), make([]float32, m*n)
	FillNormal(a, 1, rng)
	FillNormal(b, 1, rng)
	c := make([]float32, k*n)
	MatMulATB(c, a, b, m, k, n)
	at := make([]float32, k*m)
	for i := 0; i < m; i++ {
		for j := 0; j < k; j++ {
			at[j*m+i] = a[i*k+j]
		}
	}
	want := naive(at, b, k, m, n)
	for i := range c {
		if math.Abs(float64(c[i]-want[i])) > 1e-4 {
			t.Fatalf("ATB[%d]=%v want %v", i, c[i], want[i])
		}
	}
	// a·bᵀ with b [n,k]: use bt = transpose of b2 [k,n]
	b2 := make([]float32, k*n)
	FillNormal(b2, 1, rng)
	bt := make([]float32, n*k)
	for i := 0; i < k; i++ {
		for j := 0; j < n; j++ {
			bt[j*k+i] = b2[i*n+j]
		}
	}
	c2 := make([]float32, m*n)
	MatMulABT(c2, a, bt, m, k, n)
	want2 := naive(a, b2, m, k, n)
	for i := range c2 {
		if math.Abs(float64(c2[i]-want2[i])) > 1e-4 {
			t.Fatalf("ABT[%d]=%v want %v", i, c2[i], want2[i])
		}
	}
}

func TestSoftmax(t *testing.T) {
	x := []float32{1, 2, 3, 1000, 1000, 1000}
	Softmax(x, 2, 3)
	for i := 0; i < 2; i++ {
		var s float32
		for _, v := range x[i*3 : i*3+3] {
			s += v
		}
		if math.Abs(float64(s-1)) > 1e-5 {
			t.Fatalf("row %d sums to %v", i, s)
		}
	}
}
