package parity

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Helpers shared by this package's tests.

// parTestRand is a deterministic source for a test.
func parTestRand(t testing.TB) *rand.Rand {
	t.Helper()
	return rand.New(rand.NewPCG(uint64(len(t.Name())), 0x5eed))
}

// parTestVec is n uniform values in [-1, 1).
func parTestVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.Float64()*2 - 1)
	}
	return v
}

// parTestRelErr is max|got-want| / max|want|: the error relative to the
// vector's scale (element-wise relative error is meaningless near zero).
func parTestRelErr(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var diff, scale float64
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		diff = max(diff, d)
		scale = max(scale, math.Abs(float64(want[i])))
	}
	if scale == 0 {
		return diff
	}
	return diff / scale
}

// parTestSubsets calls f with every subset of 0..n-1 of at most maxSize
// elements, as a membership mask.
func parTestSubsets(n, maxSize int, f func(erased []bool)) {
	for bits := 0; bits < 1<<n; bits++ {
		erased := make([]bool, n)
		size := 0
		for i := range n {
			if bits&(1<<i) != 0 {
				erased[i] = true
				size++
			}
		}
		if size <= maxSize {
			f(erased)
		}
	}
}

func TestCoefficient(t *testing.T) {
	for i := range 16 {
		if got := Coefficient(0, i); got != 1 {
			t.Errorf("c(0,%d) = %v, want 1 (parity 0 is the plain sum)", i, got)
		}
		if got := Coefficient(1, i); got != float32(i+1) {
			t.Errorf("c(1,%d) = %v, want %d", i, got, i+1)
		}
	}
	if got := Coefficient(2, 2); got != 9 {
		t.Errorf("c(2,2) = %v, want 9", got)
	}
	if got := Coefficient(3, 15); got != 4096 {
		t.Errorf("c(3,15) = %v, want 4096", got)
	}
}

func TestNewCode(t *testing.T) {
	for _, tc := range []struct {
		k, r int
		want string // substring of the error; "" for success
	}{
		{2, 1, ""},
		{16, 4, ""},
		{4, 2, ""},
		{1, 1, "k=1"},
		{0, 1, "k=0"},
		{17, 1, "k=17"},
		{2, 0, "r=0"},
		{2, 5, "r=5"},
		{-3, 2, "k=-3"},
	} {
		c, err := NewCode(tc.k, tc.r)
		if tc.want == "" {
			if err != nil || c.K != tc.k || c.R != tc.r {
				t.Errorf("NewCode(%d, %d) = %+v, %v; want a code", tc.k, tc.r, c, err)
			}
			continue
		}
		if !errors.Is(err, ErrBadCode) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewCode(%d, %d) error = %v; want ErrBadCode naming %q", tc.k, tc.r, err, tc.want)
		}
	}
}

// parTestDet is the exact determinant of an integer matrix (Bareiss'
// fraction-free elimination; every intermediate value is a minor, so it is
// an exact integer, here at most a 4x4 minor of values <= 4096).
func parTestDet(a [][]int64) int64 {
	n := len(a)
	m := make([][]int64, n)
	for i := range a {
		m[i] = append([]int64(nil), a[i]...)
	}
	sign, prev := int64(1), int64(1)
	for k := 0; k < n-1; k++ {
		if m[k][k] == 0 {
			swap := -1
			for i := k + 1; i < n; i++ {
				if m[i][k] != 0 {
					swap = i
					break
				}
			}
			if swap < 0 {
				return 0
			}
			m[k], m[swap] = m[swap], m[k]
			sign = -sign
		}
		for i := k + 1; i < n; i++ {
			for j := k + 1; j < n; j++ {
				m[i][j] = (m[i][j]*m[k][k] - m[i][k]*m[k][j]) / prev
			}
		}
		prev = m[k][k]
	}
	return sign * m[n-1][n-1]
}

// TestEverySquareSubmatrixNonsingular checks, in exact integer arithmetic,
// the property the decoder relies on for every code NewCode accepts: every
// square submatrix of the r x k coefficients (rows: parity indices,
// columns: data positions) has a nonzero determinant. It is in fact
// positive: the matrix is totally positive (positive increasing nodes,
// increasing exponents).
func TestEverySquareSubmatrixNonsingular(t *testing.T) {
	const k, r = 16, 4
	checked := 0
	parTestSubsets(r, r, func(rowSet []bool) {
		var rowsIdx []int
		for j, in := range rowSet {
			if in {
				rowsIdx = append(rowsIdx, j)
			}
		}
		if len(rowsIdx) == 0 {
			return
		}
		parTestSubsets(k, len(rowsIdx), func(colSet []bool) {
			var cols []int
			for i, in := range colSet {
				if in {
					cols = append(cols, i)
				}
			}
			if len(cols) != len(rowsIdx) {
				return
			}
			a := make([][]int64, len(rowsIdx))
			for x, j := range rowsIdx {
				a[x] = make([]int64, len(cols))
				for y, i := range cols {
					a[x][y] = int64(Coefficient(j, i))
				}
			}
			if d := parTestDet(a); d <= 0 {
				t.Errorf("submatrix rows %v cols %v: determinant %d, want > 0", rowsIdx, cols, d)
			}
			checked++
		})
	})
	// sum over m of C(4,m)·C(16,m)
	if want := 4*16 + 6*120 + 4*560 + 1820; checked != want {
		t.Errorf("checked %d submatrices, want %d", checked, want)
	}
}

func TestCanDecode(t *testing.T) {
	c, _ := NewCode(3, 2)
	for _, tc := range []struct {
		data, par []bool
		want      bool
	}{
		{[]bool{true, true, true}, []bool{false, false}, true},
		{[]bool{false, true, true}, []bool{false, true}, true},
		{[]bool{false, true, false}, []bool{true, true}, true},
		{[]bool{false, true, false}, []bool{true, false}, false},
		{[]bool{false, false, false}, []bool{true, true}, false},
		{[]bool{true, true}, []bool{true, true}, false},              // wrong length
		{[]bool{true, true, true}, []bool{true}, false},              // wrong length
		{[]bool{false, true, true}, []bool{true, true, true}, false}, // wrong length
	} {
		if got := c.CanDecode(tc.data, tc.par); got != tc.want {
			t.Errorf("CanDecode(%v, %v) = %v, want %v", tc.data, tc.par, got, tc.want)
		}
	}
}
