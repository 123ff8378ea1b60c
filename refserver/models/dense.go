package models

import (
	"math/rand/v2"

	"github.com/hams-go/hams/refserver/nn"
)

// dense is a fully connected layer y = x·w + b, w [in,out].
type dense struct {
	in, out int
	w, b    []float32
}

func newDense(rng *rand.Rand, in, out int) *dense {
	d := &dense{in: in, out: out, w: make([]float32, in*out), b: make([]float32, out)}
	nn.FillNormal(d.w, nn.Glorot(in, out), rng)
	return d
}

func (d *dense) forward(r *nn.Reducer, x []float32, n int) []float32 {
	y := make([]float32, n*d.out)
	r.MatMul(y, x, d.w, n, d.in, d.out)
	nn.AddBias(y, d.b, n, d.out)
	return y
}
