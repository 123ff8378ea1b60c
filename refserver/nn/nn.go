package nn

import (
	"math"
	"math/rand/v2"
	"sync"
)

// Reducer computes matrix products. The zero value is the parallel,
// completion-order reducer with default chunking.
type Reducer struct {
	// Deterministic sums partials in chunk order (bit-exact results).
	Deterministic bool
	// MaxChunks bounds the number of chunks (goroutines) of one product;
	// default 4.
	MaxChunks int
	// MinWork is the number of multiply-adds per chunk below which a
	// product is not split; default 1<<15.
	MinWork int
	// MinChunkK is the minimum number of K indices per chunk; default 16.
	MinChunkK int
}

// Parallel is the default completion-order reducer.
var Parallel = &Reducer{}

// Deterministic is the chunk-order reducer.
var Deterministic = &Reducer{Deterministic: true}

func (r *Reducer) chunks(m, k, n int) int {
	maxc, minw, mink := r.MaxChunks, r.MinWork, r.MinChunkK
	if maxc <= 0 {
		maxc = 4
	}
	if minw <= 0 {
		minw = 1 << 15
	}
	if mink <= 0 {
		mink = 16
	}
	c := maxc
	if w := m * k * n / minw; w < c {
		c = w
	}
	if kk := k / mink; kk < c {
		c = kk
	}
	if c < 1 {
		c = 1
	}
	return c
}

var partialPool = sync.Pool{New: func() any { return new([]float32) }}

func getPartial(size int) *[]float32 {
	p := partialPool.Get().(*[]float32)
	if cap(*p) < size {
		*p = make([]float32, size)
	}
	*p = (*p)[:size]
	clear(*p)
	return p
}

// MatMul sets c = a·b with a [m,k], b [k,n], c [m,n], all row-major. It
// panics if a slice is too short (callers validate shapes first).
func (r *Reducer) MatMul(c, a, b []float32, m, k, n int) {
	_ = c[m*n-1]
	_ = a[m*k-1]
	_ = b[k*n-1]
	nc := r.chunks(m, k, n)
	if nc == 1 {
		clear(c[:m*n])
		gemmRange(c, a, b, m, k, n, 0, k)
		return
	}
	bounds := func(i int) (int, int) { return i * k / nc, (i + 1) * k / nc }
	parts := make([]*[]float32, nc)
	for i := range parts {
		parts[i] = getPartial(m * n)
	}
	done := make(chan int, nc)
	for i := 0; i < nc; i++ {
		go func(i int) {
			k0, k1 := bounds(i)
			gemmRange(*parts[i], a, b, m, k, n, k0, k1)
			done <- i
		}(i)
	}
	if r.Deterministic {
		for i := 0; i < nc; i++ {
			<-done
		}
		copy(c, *parts[0])
		for i := 1; i < nc; i++ {
			addTo(c[:m*n], *parts[i])
		}
	} else {
		// Invariant: partials are added in completion order; this is the
		// source of replica divergence.
		first := true
		for j := 0; j < nc; j++ {
			i := <-done
			if first {
				copy(c, *parts[i])
				first = false
			} else {
				addTo(c[:m*n], *parts[i])
			}
		}
	}
	for _, p := range parts {
		partialPool.Put(p)
	}
}

func addTo(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}

// gemmRange accumulates a[:,k0:k1]·b[k0:k1,:] into c.
func gemmRange(c, a, b []float32, m, k, n, k0, k1 int) {
	for i := 0; i < m; i++ {
		ci := c[i*n : (i+1)*n]
		ai := a[i*k : (i+1)*k]
		p := k0
		for ; p+4 <= k1; p += 4 {
			a0, a1, a2, a3 := ai[p], ai[p+1], ai[p+2], ai[p+3]
			b0 := b[p*n : (p+1)*n]
			b1 := b[(p+1)*n : (p+2)*n]
			b2 := b[(p+2)*n : (p+3)*n]
			b3 := b[(p+3)*n : (p+4)*n]
			b0, b1, b2, b3 = b0[:len(ci)], b1[:len(ci)], b2[:len(ci)], b3[:len(ci)]
			for j := range ci {
				ci[j] += a0*b0[j] + a1*b1[j] + a2*b2[j] + a3*b3[j]
			}
		}
		for ; p < k1; p++ {
			av := ai[p]
			if av == 0 {
				continue
			}
			bp := b[p*n : (p+1)*n]
			bp = bp[:len(ci)]
			for j := range ci {
				ci[j] += av * bp[j]
			}
		}
	}
}

// MatMulATB sets c = aᵀ·b with a [m,k], b [m,n], c [k,n] (deterministic).
func MatMulATB(c, a, b []float32, m, k, n int) {
	clear(c[:k*n])
	for p := 0; p < m; p++ {
		ap := a[p*k : (p+1)*k]
		bp := b[p*n : (p+1)*n]
		for i, av := range ap {
			if av == 0 {
				continue
			}
			ci := c[i*n : (i+1)*n]
			for j := range ci {
				ci[j] += av * bp[j]
			}
		}
	}
}

// MatMulABT sets c = a·bᵀ with a [m,k], b [n,k], c [m,n] (deterministic).
func MatMulABT(c, a, b []float32, m, k, n int) {
	for i := 0; i < m; i++ {
		ai := a[i*k : (i+1)*k]
		for j := 0; j < n; j++ {
			bj := b[j*k : (j+1)*k]
			bj = bj[:len(ai)]
			var s float32
			for p := range ai {
				s += ai[p] * bj[p]
			}
			c[i*n+j] = s
		}
	}
}

// AddBias adds bias [n] to every row of c [m,n].
func AddBias(c, bias []float32, m, n int) {
	for i := 0; i < m; i++ {
		row := c[i*n : (i+1)*n]
		for j := range row {
			row[j] += bias[j]
		}
	}
}

// ReLU applies max(0,x) in place.
func ReLU(x []float32) {
	for i, v := range x {
		if v < 0 {
			x[i] = 0
		}
	}
}

// Tanh applies tanh in place.
func Tanh(x []float32) {
	for i, v := range x {
		x[i] = float32(math.Tanh(float64(v)))
	}
}

// Sigmoid returns 1/(1+e^-x).
func Sigmoid(v float32) float32 { return float32(1 / (1 + math.Exp(-float64(v)))) }

// Softmax normalises each row of x [m,n] in place.
func Softmax(x []float32, m, n int) {
	for i := 0; i < m; i++ {
		row := x[i*n : (i+1)*n]
		mx := row[0]
		for _, v := range row {
			if v > mx {
				mx = v
			}
		}
		var s float64
		for j, v := range row {
			e := math.Exp(float64(v - mx))
			row[j] = float32(e)
			s += e
		}
		for j := range row {
			row[j] = float32(float64(row[j]) / s)
		}
	}
}

// NewRand returns a seeded PCG generator.
func NewRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// FillNormal fills w with N(0, std²) samples.
func FillNormal(w []float32, std float64, rng *rand.Rand) {
	for i := range w {
		w[i] = float32(rng.NormFloat64() * std)
	}
}

// Glorot returns the Glorot/Xavier normal std for a fanIn x fanOut layer.
func Glorot(fanIn, fanOut int) float64 { return math.Sqrt(2 / float64(fanIn+fanOut)) }
