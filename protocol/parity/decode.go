package parity

import (
	"fmt"
	"slices"
	"sync"

	"gonum.org/v1/gonum/mat"
)

// Decoder reconstructs missing data outputs (decoder "subtract"; for r > 1 it solves the small linear
// system of the coefficients, using gonum/mat to invert the |missing|x|missing| submatrix, cached per
// (missing set, parity set) pattern so steady state allocates nothing).
//
// With M the missing data positions (m = |M|) and P the first m available
// parities, every element e satisfies, for each j in P,
//
//	parity_j[e] - sum_{i not in M} c(j,i)·out_i[e] = sum_{b in M} c(j,b)·out_b[e]
//
// The left side is the residual; the m x m matrix A[j][b] = c(j,b) is a
// square submatrix of the coefficients, hence nonsingular, and
// out_M = A⁻¹·residual. A Decoder is safe for concurrent use: only the
// cache of inverses is shared, and it is guarded by a mutex.
type Decoder struct {
	code Code

	mu sync.RWMutex
	// inverses maps a pattern key (decodeKey) to A⁻¹ for that pattern.
	// Entries are immutable once stored.
	inverses map[uint32]*decodeInverse
}

// decodeInverse is A⁻¹ of one pattern, row b (missing position M[b]) by
// column a (parity P[a]); only the top-left m x m block is used.
type decodeInverse [codeMaxR][codeMaxR]float64

// decodeKey packs a pattern: bits 0..15 the missing data positions, bits
// 16..19 the parities used (K <= 16, R <= 4).
func decodeKey(missing uint32, used uint32) uint32 { return missing | used<<16 }

// NewDecoder returns a decoder for code. An invalid code (a literal not
// from NewCode) makes every Reconstruct fail with ErrBadCode.
func NewDecoder(code Code) *Decoder {
	return &Decoder{code: code, inverses: make(map[uint32]*decodeInverse)}
}

// Code is the decoder's code.
func (d *Decoder) Code() Code { return d.code }

// Reconstruct: outputs[i] (i < k) is data output i or nil when missing; parities[j] (j < r) parity
// output j or nil. dst has one slice per missing data position, in increasing position order, each with
// the outputs' length; it receives the reconstruction. Uses the first |missing| available parities.
// ErrUndecodable when more data outputs are missing than parities are present; ErrShape when lengths differ.
// Zero allocations for r = 1 and for cached patterns. Must be safe for concurrent use (use a mutex or
// sync.Map around the cache only).
//
// len(outputs) must be K and len(parities) R (else ErrShape). dst must not
// overlap outputs or parities. With nothing missing, dst must be empty and
// Reconstruct does nothing.
func (d *Decoder) Reconstruct(dst [][]float32, outputs [][]float32, parities [][]float32) error {
	code := d.code
	if err := code.validate(); err != nil {
		return fmt.Errorf("reconstructing outputs: %w", err)
	}
	if len(outputs) != code.K || len(parities) != code.R {
		return fmt.Errorf("%w: reconstructing outputs: got %d data outputs and %d parity outputs, code %v wants %d and %d",
			ErrShape, len(outputs), len(parities), code, code.K, code.R)
	}
	n := -1 // the common length, once one slice is seen
	var missing [codeMaxK]int
	m := 0
	var missingBits uint32
	for i, o := range outputs {
		if o == nil {
			missing[m] = i
			m++
			missingBits |= 1 << i
			continue
		}
		if n < 0 {
			n = len(o)
		} else if len(o) != n {
			return fmt.Errorf("%w: reconstructing outputs: data output %d holds %d values, others %d", ErrShape, i, len(o), n)
		}
	}
	if len(dst) != m {
		return fmt.Errorf("%w: reconstructing outputs: %d destinations for %d missing data outputs", ErrShape, len(dst), m)
	}
	if m == 0 {
		return nil
	}
	var used [codeMaxR]int
	u := 0
	var usedBits uint32
	for j, p := range parities {
		if p == nil {
			continue
		}
		if n < 0 {
			n = len(p)
		} else if len(p) != n {
			return fmt.Errorf("%w: reconstructing outputs: parity output %d holds %d values, data outputs %d", ErrShape, j, len(p), n)
		}
		if u < m {
			used[u] = j
			u++
			usedBits |= 1 << j
		}
	}
	if u < m {
		return fmt.Errorf("%w: %d data outputs missing, %d parity outputs present (code %v)", ErrUndecodable, m, u, code)
	}
	for b, s := range dst {
		if len(s) != n {
			return fmt.Errorf("%w: reconstructing outputs: destination %d (data output %d) holds %d values, outputs %d", ErrShape, b, missing[b], len(s), n)
		}
	}

	if m == 1 && used[0] == 0 {
		// Plain subtraction (every c(0,i) = 1): the r = 1 path.
		subtract(dst[0], parities[0], outputs)
		return nil
	}
	var inv *decodeInverse
	if m == 1 {
		inv = &decodeInverse{{1 / float64(Coefficient(used[0], missing[0]))}}
	} else {
		var err error
		if inv, err = d.inverse(missing[:m], used[:m], decodeKey(missingBits, usedBits)); err != nil {
			return err
		}
	}
	solve(dst, outputs, parities, missing[:m], used[:m], inv)
	return nil
}

// subtract sets dst = parity - sum of the present outputs, in float32,
// fusing up to three outputs per pass over the data.
func subtract(dst, parity []float32, outputs [][]float32) {
	var present [codeMaxK][]float32
	p := 0
	for _, o := range outputs {
		if o != nil {
			present[p] = o
			p++
		}
	}
	n := len(dst)
	src := parity[:n]
	rest := present[:p]
	// Invariant between passes: dst = parity - the outputs already consumed
	// (src is parity for the first pass, dst itself afterwards).
	for first := true; first || len(rest) > 0; first = false {
		switch len(rest) {
		case 0:
			copy(dst, src)
		case 1:
			vecSub1(dst, src, rest[0])
			rest = rest[1:]
		case 2:
			vecSub2(dst, src, rest[0], rest[1])
			rest = rest[2:]
		default:
			vecSub3(dst, src, rest[0], rest[1], rest[2])
			rest = rest[3:]
		}
		src = dst
	}
}

// The vec helpers below are the inner loops of the encoders and the
// decoder, unrolled by four (the compiler neither unrolls nor vectorises;
// unrolling halves the time). Every operand has at least len(dst) values.

// vecSub1 sets dst = s - a.
func vecSub1(dst, s, a []float32) {
	n := len(dst)
	s, a = s[:n], a[:n]
	e := 0
	for ; e+4 <= n; e += 4 {
		d, s, a := dst[e:e+4:e+4], s[e:e+4:e+4], a[e:e+4:e+4]
		d[0] = s[0] - a[0]
		d[1] = s[1] - a[1]
		d[2] = s[2] - a[2]
		d[3] = s[3] - a[3]
	}
	for ; e < n; e++ {
		dst[e] = s[e] - a[e]
	}
}

// vecSub2 sets dst = s - a - b.
func vecSub2(dst, s, a, b []float32) {
	n := len(dst)
	s, a, b = s[:n], a[:n], b[:n]
	e := 0
	for ; e+4 <= n; e += 4 {
		d, s, a, b := dst[e:e+4:e+4], s[e:e+4:e+4], a[e:e+4:e+4], b[e:e+4:e+4]
		d[0] = s[0] - a[0] - b[0]
		d[1] = s[1] - a[1] - b[1]
		d[2] = s[2] - a[2] - b[2]
		d[3] = s[3] - a[3] - b[3]
	}
	for ; e < n; e++ {
		dst[e] = s[e] - a[e] - b[e]
	}
}

// vecSub3 sets dst = s - a - b - c.
func vecSub3(dst, s, a, b, c []float32) {
	n := len(dst)
	s, a, b, c = s[:n], a[:n], b[:n], c[:n]
	e := 0
	for ; e+4 <= n; e += 4 {
		d, s, a, b, c := dst[e:e+4:e+4], s[e:e+4:e+4], a[e:e+4:e+4], b[e:e+4:e+4], c[e:e+4:e+4]
		d[0] = s[0] - a[0] - b[0] - c[0]
		d[1] = s[1] - a[1] - b[1] - c[1]
		d[2] = s[2] - a[2] - b[2] - c[2]
		d[3] = s[3] - a[3] - b[3] - c[3]
	}
	for ; e < n; e++ {
		dst[e] = s[e] - a[e] - b[e] - c[e]
	}
}

// vecAdd sets dst += a.
func vecAdd(dst, a []float32) {
	n := len(dst)
	a = a[:n]
	e := 0
	for ; e+4 <= n; e += 4 {
		d, a := dst[e:e+4:e+4], a[e:e+4:e+4]
		d[0] += a[0]
		d[1] += a[1]
		d[2] += a[2]
		d[3] += a[3]
	}
	for ; e < n; e++ {
		dst[e] += a[e]
	}
}

// vecAxpy sets dst += c·a.
func vecAxpy(dst []float32, c float32, a []float32) {
	n := len(dst)
	a = a[:n]
	e := 0
	for ; e+4 <= n; e += 4 {
		d, a := dst[e:e+4:e+4], a[e:e+4:e+4]
		d[0] += c * a[0]
		d[1] += c * a[1]
		d[2] += c * a[2]
		d[3] += c * a[3]
	}
	for ; e < n; e++ {
		dst[e] += c * a[e]
	}
}

// vecScale sets dst = c·a.
func vecScale(dst []float32, c float32, a []float32) {
	n := len(dst)
	a = a[:n]
	e := 0
	for ; e+4 <= n; e += 4 {
		d, a := dst[e:e+4:e+4], a[e:e+4:e+4]
		d[0] = c * a[0]
		d[1] = c * a[1]
		d[2] = c * a[2]
		d[3] = c * a[3]
	}
	for ; e < n; e++ {
		dst[e] = c * a[e]
	}
}

// solveChunk is how many elements solve handles per pass: its float64
// residuals (codeMaxR x solveChunk) live on the stack.
const solveChunk = 64

// solve is the general path: the m residuals in float64, then
// out_M = A⁻¹·residual. It works through the elements in chunks so that
// every inner loop streams over one slice.
func solve(dst, outputs, parities [][]float32, missing, used []int, inv *decodeInverse) {
	m := len(missing)
	n := len(dst[0])
	var present [codeMaxK][]float32
	var coef [codeMaxR][codeMaxK]float64 // coef[a][x] = c(used[a], present position x)
	p := 0
	for i, o := range outputs {
		if o == nil {
			continue
		}
		present[p] = o[:n]
		for a, j := range used {
			coef[a][p] = float64(Coefficient(j, i))
		}
		p++
	}
	var res [codeMaxR][solveChunk]float64
	for lo := 0; lo < n; lo += solveChunk {
		hi := min(lo+solveChunk, n)
		for a := range m {
			r := res[a][:hi-lo]
			for e, v := range parities[used[a]][lo:hi] {
				r[e] = float64(v)
			}
			for x := range p {
				c := coef[a][x]
				for e, v := range present[x][lo:hi] {
					r[e] -= c * float64(v)
				}
			}
		}
		for b := range m {
			d := dst[b][lo:hi]
			switch m {
			case 1:
				i0, r0 := inv[b][0], res[0][:len(d)]
				for e := range d {
					d[e] = float32(i0 * r0[e])
				}
			case 2:
				i0, i1 := inv[b][0], inv[b][1]
				r0, r1 := res[0][:len(d)], res[1][:len(d)]
				for e := range d {
					d[e] = float32(i0*r0[e] + i1*r1[e])
				}
			default:
				for e := range d {
					var v float64
					for a := range m {
						v += inv[b][a] * res[a][e]
					}
					d[e] = float32(v)
				}
			}
		}
	}
}

// inverse returns A⁻¹ for the pattern, computing and caching it on first
// use. A[a][b] = c(used[a], missing[b]).
func (d *Decoder) inverse(missing, used []int, key uint32) (*decodeInverse, error) {
	d.mu.RLock()
	inv, ok := d.inverses[key]
	d.mu.RUnlock()
	if ok {
		return inv, nil
	}
	m := len(missing)
	a := mat.NewDense(m, m, nil)
	for r, j := range used {
		for c, i := range missing {
			a.Set(r, c, float64(Coefficient(j, i)))
		}
	}
	var ai mat.Dense
	if err := ai.Inverse(a); err != nil {
		// Unreachable for a valid code (every square submatrix of the
		// coefficients is nonsingular and well within float64's range).
		// Clones: formatting the caller's stack arrays would move them
		// to the heap on every call.
		return nil, fmt.Errorf("%w: inverting coefficients of parities %v for missing data outputs %v: %v", ErrUndecodable, slices.Clone(used), slices.Clone(missing), err)
	}
	inv = new(decodeInverse)
	for r := range m {
		for c := range m {
			inv[r][c] = ai.At(r, c)
		}
	}
	d.mu.Lock()
	if prev, ok := d.inverses[key]; ok {
		inv = prev // a concurrent caller stored it first; keep one entry
	} else {
		d.inverses[key] = inv
	}
	d.mu.Unlock()
	return inv, nil
}
