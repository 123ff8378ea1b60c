package models

import (
	"hash/fnv"
	"io"
	"math"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/nn"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// lstm is a stateful LSTM (input, forget, cell, output gates) with one
// hidden/cell state per stream slot. Rows of one item are consecutive time
// steps of its stream; items of one stream run in item order.
type lstm struct {
	r               *nn.Reducer
	d, h, s         int
	w               []float32 // [(d+h), 4h], gate order i, f, g, o
	b               []float32 // [4h]
	hs, cs          []float32 // installed state [s,h]
	inName, outName string
}

// lstmStaged holds the new h,c of the slots a batch touched.
type lstmStaged map[int][2][]float32

// Slot maps a stream id to its state slot: FNV-1a 64 of the id mod slots.
func Slot(streamID string, slots int) int {
	f := fnv.New64a()
	f.Write([]byte(streamID))
	return int(f.Sum64() % uint64(slots))
}

func (k *lstm) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	x := in.float(k.inName)
	streams := in.streamOfRow()
	slot := make([]int, in.n)
	step := make([]int, in.n)
	seen := map[int]int{}
	waves := 0
	for r, id := range streams {
		slot[r] = Slot(id, k.s)
		step[r] = seen[slot[r]]
		seen[slot[r]]++
		waves = max(waves, step[r]+1)
	}
	staged := lstmStaged{}
	cur := func(sl int) ([]float32, []float32) {
		if st, ok := staged[sl]; ok {
			return st[0], st[1]
		}
		return k.hs[sl*k.h : (sl+1)*k.h], k.cs[sl*k.h : (sl+1)*k.h]
	}
	y := make([]float32, in.n*k.h)
	dh := k.d + k.h
	for wv := 0; wv < waves; wv++ {
		var rows []int
		for r := range streams {
			if step[r] == wv {
				rows = append(rows, r)
			}
		}
		nw := len(rows)
		xin := make([]float32, nw*dh)
		for i, r := range rows {
			copy(xin[i*dh:], x[r*k.d:(r+1)*k.d])
			hp, _ := cur(slot[r])
			copy(xin[i*dh+k.d:], hp)
		}
		gates := make([]float32, nw*4*k.h)
		k.r.MatMul(gates, xin, k.w, nw, dh, 4*k.h)
		nn.AddBias(gates, k.b, nw, 4*k.h)
		for i, r := range rows {
			g := gates[i*4*k.h : (i+1)*4*k.h]
			_, cp := cur(slot[r])
			hn, cn := make([]float32, k.h), make([]float32, k.h)
			for j := 0; j < k.h; j++ {
				ig := nn.Sigmoid(g[j])
				fg := nn.Sigmoid(g[k.h+j])
				gg := float32(math.Tanh(float64(g[2*k.h+j])))
				og := nn.Sigmoid(g[3*k.h+j])
				cn[j] = fg*cp[j] + ig*gg
				hn[j] = og * float32(math.Tanh(float64(cn[j])))
			}
			staged[slot[r]] = [2][]float32{hn, cn}
			copy(y[r*k.h:], hn)
		}
	}
	return []*hamsv1.Tensor{out32(k.outName, in.n, k.h, y)}, staged, nil
}

func (k *lstm) install(staged any) {
	for sl, st := range staged.(lstmStaged) {
		copy(k.hs[sl*k.h:(sl+1)*k.h], st[0])
		copy(k.cs[sl*k.h:(sl+1)*k.h], st[1])
	}
}

func (k *lstm) stateSpecs() []*hamsv1.TensorSpec {
	return []*hamsv1.TensorSpec{stateSpec("h", int64(k.s), int64(k.h)), stateSpec("c", int64(k.s), int64(k.h))}
}

func (k *lstm) writeTo(w io.Writer) error {
	if err := writeF32(w, k.hs); err != nil {
		return err
	}
	return writeF32(w, k.cs)
}

// capture copies h and c (install writes them in place); they are small:
// streams x hidden floats each.
func (k *lstm) capture() func(io.Writer) error {
	hs, cs := append([]float32(nil), k.hs...), append([]float32(nil), k.cs...)
	return func(w io.Writer) error {
		if err := writeF32(w, hs); err != nil {
			return err
		}
		return writeF32(w, cs)
	}
}

func (k *lstm) load(data []byte) error {
	rest := readF32(k.hs, data)
	readF32(k.cs, rest)
	return nil
}

func init() {
	// lstm (stateful): x FP32 [N,in_dim] -> y FP32 [N,hidden], the new
	// hidden state of the row's stream. State: h [streams,hidden], c
	// [streams,hidden]; slot = FNV-1a(stream_id) mod streams. Params:
	// in_dim 64, hidden 64, streams 64, seed 3.
	register("lstm", func(m *config.Model, p *params) (*core, error) {
		d, h, s := p.int("in_dim", 64, 1, 1<<16), p.int("hidden", 64, 1, 1<<14), p.int("streams", 64, 1, 1<<20)
		seed := p.int("seed", 3, 0, math.MaxInt32)
		inName, outName := names(p, "x", "y")
		if p.err != nil {
			return nil, p.err
		}
		rng := nn.NewRand(uint64(seed))
		k := &lstm{r: p.reducer(), d: d, h: h, s: s, w: make([]float32, (d+h)*4*h), b: make([]float32, 4*h),
			hs: make([]float32, s*h), cs: make([]float32, s*h), inName: inName, outName: outName}
		nn.FillNormal(k.w, nn.Glorot(d+h, h), rng)
		for j := h; j < 2*h; j++ {
			k.b[j] = 1 // forget-gate bias
		}
		return &core{ins: []inputSpec{{spec: fp32Spec(inName, int64(d))}}, outs: []*hamsv1.TensorSpec{fp32Spec(outName, int64(h))}, k: k, sk: k}, nil
	})
}
