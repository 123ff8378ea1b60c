package models

import (
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/nn"
)

// olearn is an online-learning classifier whose weights are its state. Its
// hidden layer is E blocks ("experts") of `expert_width` units; a fixed
// seeded sign-projection hash of the input picks one block per row, so the
// state can be hundreds of MB while a row costs in_dim·expert_width
// multiply-adds. Rows with a label >= 0 take one SGD step on their block.
//
// Staging is copy-on-write per block: Compute copies only the blocks its
// labelled rows touch (≈ 4·(in_dim+classes+1)·expert_width bytes each) and
// Update swaps the block pointers in; the state is never copied whole.
type olearn struct {
	r, gate            *nn.Reducer
	d, c, he, e        int
	lr                 float32
	proj               []float32 // [d, 16] gate projection (not state)
	experts            []*expert
	inName, labelsName string
	outName            string
	// The seeded initial weights are drawn on first use (initOnce runs
	// initFn), not at construction: a model server that starts as a spare
	// or a backup gets its state overwritten whole before any use (load
	// skips the draw), and drawing 64 MiB of normals costs ~0.4 s of CPU
	// that a failover's state transfer would otherwise compete with.
	initOnce sync.Once
	initFn   func()
	// dropped counts SGD steps dropped for non-finite weights.
	dropped atomic.Uint64
}

type expert struct{ w1, b1, w2, b2 []float32 } // w1 [d,he], b1 [he], w2 [he,c], b2 [c]

// maxWeight bounds an online-learned weight: a step past it comes from
// extreme inputs (training on normalised inputs keeps weights near 1),
// and weights that large turn every client's scores into NaN soon after.
const maxWeight = 1e4

// finite reports whether every weight of x is finite and within
// ±maxWeight (NaN fails every comparison).
func (x *expert) finite() bool {
	for _, part := range [][]float32{x.w1, x.b1, x.w2, x.b2} {
		for _, v := range part {
			if !(v <= maxWeight && v >= -maxWeight) {
				return false
			}
		}
	}
	return true
}

// ready draws the initial weights unless they were drawn or loaded.
func (k *olearn) ready() { k.initOnce.Do(k.initFn) }

func (k *olearn) expertFloats() int { return k.d*k.he + k.he + k.he*k.c + k.c }

func (k *olearn) route(x []float32, n int) []int {
	z := make([]float32, n*16)
	k.gate.MatMul(z, x, k.proj, n, k.d, 16)
	out := make([]int, n)
	for r := 0; r < n; r++ {
		var code uint64 = 1469598103934665603
		for j := 0; j < 16; j++ {
			bit := uint64(0)
			if z[r*16+j] > 0 {
				bit = 1
			}
			code = (code ^ bit) * 1099511628211
		}
		out[r] = int(code % uint64(k.e))
	}
	return out
}

func (k *olearn) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	k.ready()
	x := in.float(k.inName)
	var labels []int64
	if lt := in.byName[k.labelsName]; lt != nil {
		var err error
		if labels, err = tensor.Int64s(lt); err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrInvalidInput, err)
		}
		if len(labels) != in.n {
			return nil, nil, fmt.Errorf("%w: tensor %q: %d labels for %d rows", ErrInvalidInput, k.labelsName, len(labels), in.n)
		}
		for i, l := range labels {
			if l >= int64(k.c) {
				return nil, nil, fmt.Errorf("%w: tensor %q: label %d at row %d is not below %d", ErrInvalidInput, k.labelsName, l, i, k.c)
			}
		}
	}
	route := k.route(x, in.n)
	groups := map[int][]int{}
	var order []int
	for r, e := range route {
		if _, ok := groups[e]; !ok {
			order = append(order, e)
		}
		groups[e] = append(groups[e], r)
	}
	scores := make([]float32, in.n*k.c)
	staged := map[int]*expert{}
	for _, e := range order {
		rows := groups[e]
		ex := k.experts[e]
		n := len(rows)
		xs := make([]float32, n*k.d)
		for i, r := range rows {
			copy(xs[i*k.d:], x[r*k.d:(r+1)*k.d])
		}
		h := make([]float32, n*k.he)
		k.r.MatMul(h, xs, ex.w1, n, k.d, k.he)
		nn.AddBias(h, ex.b1, n, k.he)
		nn.ReLU(h)
		s := make([]float32, n*k.c)
		k.r.MatMul(s, h, ex.w2, n, k.he, k.c)
		nn.AddBias(s, ex.b2, n, k.c)
		nn.Softmax(s, n, k.c)
		for i, r := range rows {
			copy(scores[r*k.c:], s[i*k.c:(i+1)*k.c])
		}
		// SGD on the labelled rows of this block
		var lab []int
		for i, r := range rows {
			if labels != nil && labels[r] >= 0 {
				lab = append(lab, i)
			}
		}
		if len(lab) == 0 {
			continue
		}
		m := len(lab)
		ds := make([]float32, m*k.c)
		hl := make([]float32, m*k.he)
		xl := make([]float32, m*k.d)
		for j, i := range lab {
			copy(ds[j*k.c:], s[i*k.c:(i+1)*k.c])
			ds[j*k.c+int(labels[rows[i]])]--
			copy(hl[j*k.he:], h[i*k.he:(i+1)*k.he])
			copy(xl[j*k.d:], xs[i*k.d:(i+1)*k.d])
		}
		gw2 := make([]float32, k.he*k.c)
		nn.MatMulATB(gw2, hl, ds, m, k.he, k.c)
		dh := make([]float32, m*k.he)
		nn.MatMulABT(dh, ds, ex.w2, m, k.c, k.he)
		for i := range dh {
			if hl[i] <= 0 {
				dh[i] = 0
			}
		}
		gw1 := make([]float32, k.d*k.he)
		k.r.MatMul(gw1, transpose(xl, m, k.d), dh, k.d, m, k.he)
		step := k.lr / float32(m)
		nx := &expert{w1: append([]float32(nil), ex.w1...), b1: append([]float32(nil), ex.b1...), w2: append([]float32(nil), ex.w2...), b2: append([]float32(nil), ex.b2...)}
		for i, g := range gw1 {
			nx.w1[i] -= step * g
		}
		for i, g := range gw2 {
			nx.w2[i] -= step * g
		}
		for j := 0; j < m; j++ {
			for u := 0; u < k.he; u++ {
				nx.b1[u] -= step * dh[j*k.he+u]
			}
			for u := 0; u < k.c; u++ {
				nx.b2[u] -= step * ds[j*k.c+u]
			}
		}
		if !nx.finite() {
			// A step that leaves a weight NaN, infinite or past
			// maxWeight (non-finite or extreme inputs) is dropped: the
			// block keeps its weights, and the clients routed to it keep
			// getting finite scores.
			k.dropped.Add(1)
			continue
		}
		staged[e] = nx
	}
	return []*hamsv1.Tensor{out32(k.outName, in.n, k.c, scores)}, staged, nil
}

func transpose(a []float32, m, n int) []float32 {
	t := make([]float32, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			t[j*m+i] = a[i*n+j]
		}
	}
	return t
}

func (k *olearn) install(staged any) {
	for e, ex := range staged.(map[int]*expert) {
		k.experts[e] = ex
	}
}

func (k *olearn) stateSpecs() []*hamsv1.TensorSpec {
	e, d, he, c := int64(k.e), int64(k.d), int64(k.he), int64(k.c)
	return []*hamsv1.TensorSpec{stateSpec("w1", e, d, he), stateSpec("b1", e, he), stateSpec("w2", e, he, c), stateSpec("b2", e, c)}
}

func (k *olearn) parts() []func(*expert) []float32 {
	return []func(*expert) []float32{
		func(x *expert) []float32 { return x.w1 }, func(x *expert) []float32 { return x.b1 },
		func(x *expert) []float32 { return x.w2 }, func(x *expert) []float32 { return x.b2 },
	}
}

func (k *olearn) writeTo(w io.Writer) error {
	k.ready()
	for _, part := range k.parts() {
		for _, ex := range k.experts {
			if err := writeF32(w, part(ex)); err != nil {
				return err
			}
		}
	}
	return nil
}

// capture keeps the block pointers only: blocks are never written after
// they are installed (install swaps in fresh copies, load allocates fresh
// blocks), so the captured version stays intact while later updates run.
func (k *olearn) capture() func(io.Writer) error {
	k.ready()
	experts := append([]*expert(nil), k.experts...)
	return func(w io.Writer) error {
		for _, part := range k.parts() {
			for _, ex := range experts {
				if err := writeF32(w, part(ex)); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

func (k *olearn) load(data []byte) error {
	// Blocks may be shared with an earlier staged copy; fresh blocks keep
	// load from writing into memory a reader might hold.
	fresh := make([]*expert, k.e)
	for i := range fresh {
		fresh[i] = &expert{w1: make([]float32, k.d*k.he), b1: make([]float32, k.he), w2: make([]float32, k.he*k.c), b2: make([]float32, k.c)}
	}
	for _, part := range k.parts() {
		for _, ex := range fresh {
			data = readF32(part(ex), data)
		}
	}
	k.initOnce.Do(func() {})
	k.experts = fresh
	return nil
}

func init() {
	// olearn (stateful): x FP32 [N,in_dim] (+ optional labels INT64 [N])
	// -> scores FP32 [N,classes]. State (the weights): w1 [E,in_dim,
	// expert_width], b1 [E,expert_width], w2 [E,expert_width,classes], b2
	// [E,classes] with E = state_mb MiB / block size. Params: in_dim 784,
	// classes 10, state_mb 4 (1..1024), expert_width 64, lr 0.05, seed 5,
	// input "x", labels "labels", output "scores".
	register("olearn", func(m *config.Model, p *params) (*core, error) {
		d, c := p.int("in_dim", 784, 1, 1<<16), p.int("classes", 10, 2, 1<<12)
		mb, he := p.int("state_mb", 4, 1, 1024), p.int("expert_width", 64, 1, 1<<12)
		lr := p.float("lr", 0.05, 0, 10)
		seed := p.int("seed", 5, 0, math.MaxInt32)
		inName, outName := names(p, "x", "scores")
		labels := p.str("labels", "labels")
		if p.err != nil {
			return nil, p.err
		}
		k := &olearn{r: p.reducer(), gate: nn.Deterministic, d: d, c: c, he: he, lr: float32(lr), inName: inName, labelsName: labels, outName: outName}
		k.e = max(1, mb<<20/(4*k.expertFloats()))
		rng := nn.NewRand(uint64(seed))
		k.proj = make([]float32, d*16)
		nn.FillNormal(k.proj, 1, rng)
		k.initFn = func() {
			k.experts = make([]*expert, k.e)
			for i := range k.experts {
				ex := &expert{w1: make([]float32, d*he), b1: make([]float32, he), w2: make([]float32, he*c), b2: make([]float32, c)}
				nn.FillNormal(ex.w1, math.Sqrt(2/float64(d)), rng)
				nn.FillNormal(ex.w2, nn.Glorot(he, c), rng)
				k.experts[i] = ex
			}
		}
		ls := &hamsv1.TensorSpec{Name: labels, Datatype: tensor.Int64, Shape: []int64{-1}}
		return &core{ins: []inputSpec{{spec: fp32Spec(inName, int64(d))}, {spec: ls, optional: true}},
			outs: []*hamsv1.TensorSpec{fp32Spec(outName, int64(c))}, k: k, sk: k}, nil
	})
}
