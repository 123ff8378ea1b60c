package models

import (
	"fmt"
	"math"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/nn"
)

// ---- linear: y = x·W, no bias, no nonlinearity ----

// linear is a bias-free linear map, so F(a+b) = F(a)+F(b) up to float
// rounding: with the sum encoder it is its own exact parity model (ParM
// exactness tests of the serving path).
type linear struct {
	r               *nn.Reducer
	in, out         int
	w               []float32 // [in,out]
	inName, outName string
}

// LinearWeights returns the matrix W [in,out] (row-major) of the linear
// kind for seed: N(0, 1/in) entries, so outputs keep the inputs' scale.
func LinearWeights(in, out int, seed uint64) []float32 {
	w := make([]float32, in*out)
	nn.FillNormal(w, 1/math.Sqrt(float64(in)), nn.NewRand(seed))
	return w
}

func (k *linear) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	y := make([]float32, in.n*k.out)
	k.r.MatMul(y, in.float(k.inName), k.w, in.n, k.in, k.out)
	return []*hamsv1.Tensor{out32(k.outName, in.n, k.out, y)}, nil, nil
}

func init() {
	// linear: images FP32 [N,in] -> scores FP32 [N,out], scores =
	// images·W with W a seeded N(0, 1/in) matrix [in,out] (LinearWeights),
	// no bias, no nonlinearity: linear in its input, so it is its own
	// parity model for the sum encoder. Params: in 784, out 10, seed 1,
	// input "images", output "scores", deterministic, chunks.
	register("linear", func(m *config.Model, p *params) (*core, error) {
		in, out := p.int("in", 784, 1, 1<<20), p.int("out", 10, 1, 1<<16)
		seed := p.int("seed", 1, 0, math.MaxInt32)
		inName, outName := names(p, "images", "scores")
		if p.err == nil && in*out > 1<<26 {
			p.err = fmt.Errorf("in·out = %d weights is more than %d", in*out, 1<<26)
		}
		if p.err != nil {
			return nil, p.err
		}
		k := &linear{r: p.reducer(), in: in, out: out, w: LinearWeights(in, out, uint64(seed)), inName: inName, outName: outName}
		return &core{ins: []inputSpec{{spec: fp32Spec(inName, int64(in))}}, outs: []*hamsv1.TensorSpec{fp32Spec(outName, int64(out))}, k: k}, nil
	})
}
