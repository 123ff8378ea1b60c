package models

import (
	"container/heap"
	"fmt"
	"math"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/nn"
)

// ---- cnn: conv1d (stride 2) + ReLU + dense ----

type cnn struct {
	r                     *nn.Reducer
	in, ch, kern, l, outD int
	conv                  *dense // [kern, ch]
	fc                    *dense // [ch*l, outD]
	inName, outName       string
}

func (k *cnn) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	x := in.float(k.inName)
	n := in.n
	patches := make([]float32, n*k.l*k.kern)
	for r := 0; r < n; r++ {
		row := x[r*k.in : (r+1)*k.in]
		for p := 0; p < k.l; p++ {
			copy(patches[(r*k.l+p)*k.kern:(r*k.l+p+1)*k.kern], row[2*p:2*p+k.kern])
		}
	}
	feat := k.conv.forward(k.r, patches, n*k.l) // [n*l, ch] == [n, l*ch]
	nn.ReLU(feat)
	y := k.fc.forward(k.r, feat, n)
	return []*hamsv1.Tensor{out32(k.outName, n, k.outD, y)}, nil, nil
}

// ---- transcriber: a stack of tanh dense layers ----

type transcriber struct {
	r               *nn.Reducer
	layers          []*dense
	inD, outD       int
	inName, outName string
	// ctxName names an optional second input of ctxD columns appended to
	// each row of the first before the first layer (ctxD 0: none).
	ctxName string
	ctxD    int
}

func (k *transcriber) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	h := in.float(k.inName)
	if k.ctxD > 0 {
		c := in.float(k.ctxName)
		w := k.inD + k.ctxD
		j := make([]float32, in.n*w)
		for r := 0; r < in.n; r++ {
			copy(j[r*w:], h[r*k.inD:(r+1)*k.inD])
			copy(j[r*w+k.inD:], c[r*k.ctxD:(r+1)*k.ctxD])
		}
		h = j
	}
	for i, l := range k.layers {
		h = l.forward(k.r, h, in.n)
		if i < len(k.layers)-1 {
			nn.Tanh(h)
		}
	}
	return []*hamsv1.Tensor{out32(k.outName, in.n, k.outD, h)}, nil, nil
}

// ---- prep: per-row normalisation ----

type prep struct {
	width                       int
	mode                        string
	inName, outName, labelsName string
}

func (k *prep) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	x := in.float(k.inName)
	t := in.byName[k.inName]
	w := 1
	for _, d := range t.Shape[1:] {
		w *= int(d)
	}
	y := make([]float32, len(x))
	for r := 0; r < in.n; r++ {
		row, out := x[r*w:(r+1)*w], y[r*w:(r+1)*w]
		switch k.mode {
		case "zscore":
			var s, s2 float64
			for _, v := range row {
				s += float64(v)
				s2 += float64(v) * float64(v)
			}
			mean := s / float64(w)
			std := math.Sqrt(math.Max(s2/float64(w)-mean*mean, 0)) + 1e-6
			for i, v := range row {
				out[i] = float32((float64(v) - mean) / std)
			}
		case "minmax":
			lo, hi := row[0], row[0]
			for _, v := range row {
				lo, hi = min(lo, v), max(hi, v)
			}
			span := hi - lo
			if span == 0 {
				span = 1
			}
			for i, v := range row {
				out[i] = (v - lo) / span
			}
		case "l2":
			var s float64
			for _, v := range row {
				s += float64(v) * float64(v)
			}
			norm := float32(math.Sqrt(s) + 1e-12)
			for i, v := range row {
				out[i] = v / norm
			}
		}
	}
	outs := []*hamsv1.Tensor{out32(k.outName, in.n, w, y)}
	if k.labelsName != "" {
		lt := in.byName[k.labelsName]
		var labels []int64
		if lt == nil {
			labels = make([]int64, in.n)
			for i := range labels {
				labels[i] = -1
			}
		} else {
			var err error
			if labels, err = tensor.Int64s(lt); err != nil {
				return nil, nil, fmt.Errorf("%w: %v", ErrInvalidInput, err)
			}
		}
		outs = append(outs, tensor.FromInt64(k.labelsName, []int64{int64(in.n)}, labels))
	}
	return outs, nil, nil
}

// ---- concat: every input joined along dim 1 ----

type concat struct{ outName string }

func (k *concat) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	widths := make([]int, len(in.b.Inputs))
	vals := make([][]float32, len(in.b.Inputs))
	total := 0
	for i, t := range in.b.Inputs {
		if t.Datatype != tensor.FP32 {
			return nil, nil, fmt.Errorf("%w: tensor %q: datatype %s, concat joins FP32 only", ErrInvalidInput, t.Name, t.Datatype)
		}
		v, err := tensor.Float32(t)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrInvalidInput, err)
		}
		vals[i] = v
		widths[i] = len(v) / in.n
		total += widths[i]
	}
	y := make([]float32, in.n*total)
	for r := 0; r < in.n; r++ {
		off := r * total
		for i, v := range vals {
			copy(y[off:], v[r*widths[i]:(r+1)*widths[i]])
			off += widths[i]
		}
	}
	return []*hamsv1.Tensor{out32(k.outName, in.n, total, y)}, nil, nil
}

// ---- knn over a seeded random-walk price history ----

type knn struct {
	r               *nn.Reducer
	w, hist, k      int
	refT            []float32 // [w, hist] normalised windows, transposed
	refNorm         []float32 // |window|^2
	next            []float32 // next-step move after each window, in window std units
	inName, outName string
}

func normWindow(dst, src []float32) float64 {
	var s, s2 float64
	for _, v := range src {
		s += float64(v)
		s2 += float64(v) * float64(v)
	}
	mean := s / float64(len(src))
	std := math.Sqrt(math.Max(s2/float64(len(src))-mean*mean, 0)) + 1e-6
	for i, v := range src {
		dst[i] = float32((float64(v) - mean) / std)
	}
	return std
}

func newKNN(w, hist, k int, seed uint64) *knn {
	rng := nn.NewRand(seed)
	series := make([]float32, hist+w+1)
	series[0] = 100
	for i := 1; i < len(series); i++ {
		series[i] = series[i-1] + float32(rng.NormFloat64())
	}
	kn := &knn{w: w, hist: hist, k: k, refT: make([]float32, w*hist), refNorm: make([]float32, hist), next: make([]float32, hist)}
	win := make([]float32, w)
	for i := 0; i < hist; i++ {
		std := normWindow(win, series[i:i+w])
		for j, v := range win {
			kn.refT[j*hist+i] = v
			kn.refNorm[i] += v * v
		}
		kn.next[i] = float32(float64(series[i+w]-series[i+w-1]) / std)
	}
	return kn
}

func (k *knn) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	x := in.float(k.inName)
	q := make([]float32, len(x))
	stds := make([]float64, in.n)
	for r := 0; r < in.n; r++ {
		stds[r] = normWindow(q[r*k.w:(r+1)*k.w], x[r*k.w:(r+1)*k.w])
	}
	dots := make([]float32, in.n*k.hist)
	k.r.MatMul(dots, q, k.refT, in.n, k.w, k.hist)
	y := make([]float32, in.n*2)
	idx := make([]int, 0, k.k)
	for r := 0; r < in.n; r++ {
		var qn float32
		for _, v := range q[r*k.w : (r+1)*k.w] {
			qn += v * v
		}
		d := dots[r*k.hist : (r+1)*k.hist]
		// top-k by insertion (k is small); ties keep the lower index
		top := idx[:0]
		for i := range d {
			d[i] = qn + k.refNorm[i] - 2*d[i]
			if len(top) == k.k && d[i] >= d[top[k.k-1]] {
				continue
			}
			if len(top) < k.k {
				top = append(top, i)
			} else {
				top[k.k-1] = i
			}
			for j := len(top) - 1; j > 0 && d[top[j]] < d[top[j-1]]; j-- {
				top[j], top[j-1] = top[j-1], top[j]
			}
		}
		var mv, md float64
		for _, i := range top {
			mv += float64(k.next[i])
			md += math.Sqrt(math.Max(float64(d[i]), 0))
		}
		last := float64(x[(r+1)*k.w-1])
		y[2*r] = float32(last + mv/float64(k.k)*stds[r])
		y[2*r+1] = float32(md / float64(k.k))
	}
	return []*hamsv1.Tensor{out32(k.outName, in.n, 2, y)}, nil, nil
}

// ---- arima(p,d,q): Hannan-Rissanen fit per window, one-step forecast ----

type arima struct {
	p, d, q, w      int
	inName, outName string
}

// solve solves a·x = b (n×n) by Gaussian elimination with partial
// pivoting; a small ridge keeps it well posed.
func solve(a []float64, b []float64, n int) []float64 {
	for i := 0; i < n; i++ {
		a[i*n+i] += 1e-6
	}
	for c := 0; c < n; c++ {
		p := c
		for r := c + 1; r < n; r++ {
			if math.Abs(a[r*n+c]) > math.Abs(a[p*n+c]) {
				p = r
			}
		}
		if p != c {
			for j := 0; j < n; j++ {
				a[c*n+j], a[p*n+j] = a[p*n+j], a[c*n+j]
			}
			b[c], b[p] = b[p], b[c]
		}
		if a[c*n+c] == 0 {
			continue
		}
		for r := c + 1; r < n; r++ {
			f := a[r*n+c] / a[c*n+c]
			for j := c; j < n; j++ {
				a[r*n+j] -= f * a[c*n+j]
			}
			b[r] -= f * b[c]
		}
	}
	x := make([]float64, n)
	for r := n - 1; r >= 0; r-- {
		s := b[r]
		for j := r + 1; j < n; j++ {
			s -= a[r*n+j] * x[j]
		}
		if a[r*n+r] != 0 {
			x[r] = s / a[r*n+r]
		}
	}
	return x
}

// lsq fits y ≈ X·beta (X rows of width m) by normal equations.
func lsq(X [][]float64, y []float64, m int) []float64 {
	a := make([]float64, m*m)
	b := make([]float64, m)
	for t, row := range X {
		for i := 0; i < m; i++ {
			b[i] += row[i] * y[t]
			for j := 0; j < m; j++ {
				a[i*m+j] += row[i] * row[j]
			}
		}
	}
	return solve(a, b, m)
}

func (k *arima) forecast(x []float32) (fc, mean, std, slope float64) {
	n := len(x)
	var s, s2, st, stt, sxt float64
	for t, v := range x {
		fv := float64(v)
		s += fv
		s2 += fv * fv
		st += float64(t)
		stt += float64(t * t)
		sxt += float64(t) * fv
	}
	mean = s / float64(n)
	std = math.Sqrt(math.Max(s2/float64(n)-mean*mean, 0))
	slope = (float64(n)*sxt - st*s) / (float64(n)*stt - st*st)
	// difference d times, remembering the last value of every level
	z := make([]float64, n)
	for i, v := range x {
		z[i] = float64(v)
	}
	lasts := make([]float64, 0, k.d)
	for i := 0; i < k.d; i++ {
		lasts = append(lasts, z[len(z)-1])
		for j := 0; j+1 < len(z); j++ {
			z[j] = z[j+1] - z[j]
		}
		z = z[:len(z)-1]
	}
	var zm float64
	for _, v := range z {
		zm += v
	}
	zm /= float64(len(z))
	for i := range z {
		z[i] -= zm
	}
	// step 1: long AR(m) by least squares, residuals e
	m := min(k.p+k.q+2, len(z)/3)
	e := make([]float64, len(z))
	if m > 0 {
		var X [][]float64
		var y []float64
		for t := m; t < len(z); t++ {
			row := make([]float64, m)
			for i := 0; i < m; i++ {
				row[i] = z[t-1-i]
			}
			X = append(X, row)
			y = append(y, z[t])
		}
		beta := lsq(X, y, m)
		for t := m; t < len(z); t++ {
			var pr float64
			for i := 0; i < m; i++ {
				pr += beta[i] * z[t-1-i]
			}
			e[t] = z[t] - pr
		}
	}
	// step 2: regress z_t on p lags of z and q lags of e
	pq := k.p + k.q
	start := max(k.p, k.q+m)
	var next float64
	if pq > 0 && len(z)-start > pq {
		var X [][]float64
		var y []float64
		for t := start; t < len(z); t++ {
			row := make([]float64, pq)
			for i := 0; i < k.p; i++ {
				row[i] = z[t-1-i]
			}
			for j := 0; j < k.q; j++ {
				row[k.p+j] = e[t-1-j]
			}
			X = append(X, row)
			y = append(y, z[t])
		}
		beta := lsq(X, y, pq)
		T := len(z)
		for i := 0; i < k.p; i++ {
			next += beta[i] * z[T-1-i]
		}
		for j := 0; j < k.q; j++ {
			next += beta[k.p+j] * e[T-1-j]
		}
	}
	fc = next + zm
	for i := len(lasts) - 1; i >= 0; i-- {
		fc += lasts[i]
	}
	return fc, mean, std, slope
}

func (k *arima) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	x := in.float(k.inName)
	y := make([]float32, in.n*4)
	for r := 0; r < in.n; r++ {
		fc, mean, std, slope := k.forecast(x[r*k.w : (r+1)*k.w])
		y[4*r], y[4*r+1], y[4*r+2], y[4*r+3] = float32(fc), float32(mean), float32(std), float32(slope)
	}
	return []*hamsv1.Tensor{out32(k.outName, in.n, 4, y)}, nil, nil
}

// ---- astar on a grid derived from the input ----

type astar struct {
	f, g            int
	density         float64
	inName, outName string
}

type node struct{ pos, f, g, order int }
type openSet []node

func (o openSet) Len() int { return len(o) }
func (o openSet) Less(i, j int) bool {
	if o[i].f != o[j].f {
		return o[i].f < o[j].f
	}
	return o[i].order < o[j].order
}
func (o openSet) Swap(i, j int) { o[i], o[j] = o[j], o[i] }
func (o *openSet) Push(x any)   { *o = append(*o, x.(node)) }
func (o *openSet) Pop() any {
	old := *o
	x := old[len(old)-1]
	*o = old[:len(old)-1]
	return x
}

// firstMove returns the first step (dx, dy) of a shortest 4-connected path
// from (0,0) to (g-1,g-1), and the path length (-1: no path).
func (k *astar) firstMove(x []float32) (int, int, int) {
	g := k.g
	blocked := make([]bool, g*g)
	for c := range blocked {
		v := math.Abs(float64(x[c%k.f]))*7919 + 0.6180339887*float64(c)
		blocked[c] = v-math.Floor(v) < k.density
	}
	goal := g*g - 1
	blocked[0], blocked[goal] = false, false
	h := func(p int) int { return (g - 1 - p%g) + (g - 1 - p/g) }
	gs := make([]int, g*g)
	from := make([]int, g*g)
	for i := range gs {
		gs[i], from[i] = -1, -1
	}
	gs[0] = 0
	open := &openSet{{pos: 0, f: h(0)}}
	order := 1
	for open.Len() > 0 {
		cur := heap.Pop(open).(node)
		if cur.g != gs[cur.pos] {
			continue
		}
		if cur.pos == goal {
			break
		}
		cx, cy := cur.pos%g, cur.pos/g
		for _, d := range [4][2]int{{1, 0}, {0, 1}, {-1, 0}, {0, -1}} {
			nx, ny := cx+d[0], cy+d[1]
			if nx < 0 || ny < 0 || nx >= g || ny >= g {
				continue
			}
			np := ny*g + nx
			if blocked[np] {
				continue
			}
			if ng := cur.g + 1; gs[np] < 0 || ng < gs[np] {
				gs[np], from[np] = ng, cur.pos
				heap.Push(open, node{pos: np, g: ng, f: ng + h(np), order: order})
				order++
			}
		}
	}
	if gs[goal] < 0 {
		return 0, 0, -1
	}
	if goal == 0 {
		return 0, 0, 0
	}
	p := goal
	for from[p] != 0 {
		p = from[p]
	}
	return p % g, p / g, gs[goal]
}

func (k *astar) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	x := in.float(k.inName)
	y := make([]float32, in.n*2)
	for r := 0; r < in.n; r++ {
		dx, dy, _ := k.firstMove(x[r*k.f : (r+1)*k.f])
		y[2*r], y[2*r+1] = float32(dx), float32(dy)
	}
	return []*hamsv1.Tensor{out32(k.outName, in.n, 2, y)}, nil, nil
}

func names(p *params, in, out string) (string, string) {
	return p.str("input", in), p.str("output", out)
}

func init() {
	// cnn: x FP32 [N,in_dim] -> y FP32 [N,out_dim]. conv1d (kernel,
	// channels, stride 2) + ReLU + dense. Params: in_dim 256, channels 8,
	// kernel 5, out_dim 16, seed 1, input "x", output "y".
	register("cnn", func(m *config.Model, p *params) (*core, error) {
		inD, ch, kern, outD := p.int("in_dim", 256, 1, 1<<20), p.int("channels", 8, 1, 1024), p.int("kernel", 5, 1, 64), p.int("out_dim", 16, 1, 1<<16)
		seed := p.int("seed", 1, 0, math.MaxInt32)
		inName, outName := names(p, "x", "y")
		if p.err != nil {
			return nil, p.err
		}
		if kern > inD {
			return nil, fmt.Errorf("kernel %d wider than in_dim %d", kern, inD)
		}
		rng := nn.NewRand(uint64(seed))
		l := (inD-kern)/2 + 1
		k := &cnn{r: p.reducer(), in: inD, ch: ch, kern: kern, l: l, outD: outD, conv: newDense(rng, kern, ch), fc: newDense(rng, ch*l, outD), inName: inName, outName: outName}
		return &core{ins: []inputSpec{{spec: fp32Spec(inName, int64(inD))}}, outs: []*hamsv1.TensorSpec{fp32Spec(outName, int64(outD))}, k: k}, nil
	})
	// transcriber: x FP32 [N,in_dim] -> y FP32 [N,out_dim] through
	// `layers` tanh dense layers of `width` (cost per row ≈
	// in_dim·width + (layers-1)·width² + width·out_dim multiply-adds).
	// Params: in_dim 1600, width 512, layers 2, out_dim 64, seed 2;
	// context (an input name) with context_dim > 0 adds a second FP32
	// input [N,context_dim] whose row is appended to x's before the first
	// layer (a model that reads its inputs together with an upstream
	// model's answer about them, e.g. images and the learner's scores).
	register("transcriber", func(m *config.Model, p *params) (*core, error) {
		inD, width, layers, outD := p.int("in_dim", 1600, 1, 1<<20), p.int("width", 512, 1, 1<<14), p.int("layers", 2, 1, 64), p.int("out_dim", 64, 1, 1<<16)
		seed := p.int("seed", 2, 0, math.MaxInt32)
		ctxName, ctxD := p.str("context", ""), p.int("context_dim", 0, 0, 1<<20)
		inName, outName := names(p, "x", "y")
		if p.err != nil {
			return nil, p.err
		}
		if (ctxName == "") != (ctxD == 0) {
			return nil, fmt.Errorf("context %q with context_dim %d: give both or neither", ctxName, ctxD)
		}
		if ctxName != "" && ctxName == inName {
			return nil, fmt.Errorf("context %q is the input's own name", ctxName)
		}
		rng := nn.NewRand(uint64(seed))
		k := &transcriber{r: p.reducer(), inD: inD, outD: outD, inName: inName, outName: outName, ctxName: ctxName, ctxD: ctxD}
		prev := inD + ctxD
		for i := 0; i < layers; i++ {
			k.layers = append(k.layers, newDense(rng, prev, width))
			prev = width
		}
		k.layers = append(k.layers, newDense(rng, prev, outD))
		ins := []inputSpec{{spec: fp32Spec(inName, int64(inD))}}
		if ctxD > 0 {
			ins = append(ins, inputSpec{spec: fp32Spec(ctxName, int64(ctxD))})
		}
		return &core{ins: ins, outs: []*hamsv1.TensorSpec{fp32Spec(outName, int64(outD))}, k: k}, nil
	})
	// prep: x FP32 [N,in_dim] -> y FP32 [N,in_dim], each row normalised
	// (mode zscore | minmax | l2). in_dim 0 accepts any width. Param
	// labels names an optional INT64 [N] input passed through unchanged
	// (rows without it get -1), so labels reach a downstream olearn.
	register("prep", func(m *config.Model, p *params) (*core, error) {
		inD := p.int("in_dim", 0, 0, 1<<24)
		mode := p.str("mode", "zscore")
		labels := p.str("labels", "")
		inName, outName := names(p, "x", "y")
		if p.err != nil {
			return nil, p.err
		}
		if mode != "zscore" && mode != "minmax" && mode != "l2" {
			return nil, fmt.Errorf("mode %q is not zscore, minmax or l2", mode)
		}
		w := int64(inD)
		if inD == 0 {
			w = -1
		}
		c := &core{ins: []inputSpec{{spec: fp32Spec(inName, w)}}, outs: []*hamsv1.TensorSpec{fp32Spec(outName, w)},
			k: &prep{width: inD, mode: mode, inName: inName, outName: outName, labelsName: labels}}
		if labels != "" {
			ls := &hamsv1.TensorSpec{Name: labels, Datatype: tensor.Int64, Shape: []int64{-1}}
			c.ins = append(c.ins, inputSpec{spec: ls, optional: true})
			c.outs = append(c.outs, ls)
		}
		return c, nil
	})
	// concat: every input (declared "*") FP32 [N,...] -> y FP32
	// [N,sum of widths], joined along dim 1 in input order.
	register("concat", func(m *config.Model, p *params) (*core, error) {
		outName := p.str("output", "y")
		return &core{ins: []inputSpec{{spec: &hamsv1.TensorSpec{Name: AnyInput, Datatype: tensor.FP32, Shape: []int64{-1, -1}}}},
			outs: []*hamsv1.TensorSpec{fp32Spec(outName, -1)}, k: &concat{outName: outName}}, p.err
	})
	// knn: x FP32 [N,in_dim] (a price window) -> y FP32 [N,2] (forecast of
	// the next price, mean distance of the k nearest windows). Reference
	// windows come from a seeded random walk of `history` steps. Params:
	// in_dim 32, history 4096, k 5, seed 7.
	register("knn", func(m *config.Model, p *params) (*core, error) {
		w, hist, kk := p.int("in_dim", 32, 2, 4096), p.int("history", 4096, 1, 1<<20), p.int("k", 5, 1, 1024)
		seed := p.int("seed", 7, 0, math.MaxInt32)
		inName, outName := names(p, "x", "y")
		if p.err != nil {
			return nil, p.err
		}
		if kk > hist {
			return nil, fmt.Errorf("k %d larger than history %d", kk, hist)
		}
		k := newKNN(w, hist, kk, uint64(seed))
		k.r, k.inName, k.outName = p.reducer(), inName, outName
		return &core{ins: []inputSpec{{spec: fp32Spec(inName, int64(w))}}, outs: []*hamsv1.TensorSpec{fp32Spec(outName, 2)}, k: k}, nil
	})
	// arima: x FP32 [N,in_dim] (a window) -> y FP32 [N,4]: one-step ARIMA(p,d,q)
	// forecast (Hannan-Rissanen fit per window), window mean, std, slope.
	// Params: p 2, d 1, q 1, in_dim 32.
	register("arima", func(m *config.Model, p *params) (*core, error) {
		ap, ad, aq, w := p.int("p", 2, 0, 16), p.int("d", 1, 0, 3), p.int("q", 1, 0, 16), p.int("in_dim", 32, 4, 1<<16)
		inName, outName := names(p, "x", "y")
		if p.err != nil {
			return nil, p.err
		}
		if w < 3*(ap+aq+ad+2) {
			return nil, fmt.Errorf("in_dim %d too short for ARIMA(%d,%d,%d)", w, ap, ad, aq)
		}
		return &core{ins: []inputSpec{{spec: fp32Spec(inName, int64(w))}}, outs: []*hamsv1.TensorSpec{fp32Spec(outName, 4)},
			k: &arima{p: ap, d: ad, q: aq, w: w, inName: inName, outName: outName}}, nil
	})
	// astar: x FP32 [N,in_dim] -> y FP32 [N,2]: the first move (dx,dy) of
	// a shortest path across a grid×grid map whose blocked cells derive
	// from the input (density of blocked cells); (0,0) when no path.
	// Params: in_dim 64, grid 16, density 0.3.
	register("astar", func(m *config.Model, p *params) (*core, error) {
		f, g, dens := p.int("in_dim", 64, 1, 1<<20), p.int("grid", 16, 2, 512), p.float("density", 0.3, 0, 0.9)
		inName, outName := names(p, "x", "y")
		if p.err != nil {
			return nil, p.err
		}
		return &core{ins: []inputSpec{{spec: fp32Spec(inName, int64(f))}}, outs: []*hamsv1.TensorSpec{fp32Spec(outName, 2)},
			k: &astar{f: f, g: g, density: dens, inName: inName, outName: outName}}, nil
	})
}
