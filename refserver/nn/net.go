package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Layer is one stage of a feed-forward Net. Every layer maps rows of
// InSize() values to rows of OutSize() values (one row per sample; an
// image is laid out channel-major, CHW). Forward and Backward run on the
// caller's goroutine with a fixed summation order, so they are bit-exact
// for given inputs: training parallelises over samples, never inside a
// layer.
type Layer interface {
	InSize() int
	OutSize() int
	// Params are the layer's parameter tensors in a fixed order (weights
	// then bias), aliasing its storage; nil for a layer without any.
	Params() [][]float32
	// ScratchSize is the number of float32 values Forward and Backward
	// need as scratch for n rows.
	ScratchSize(n int) int
	// Forward sets y [n,OutSize] from x [n,InSize].
	Forward(y, x []float32, n int, scratch []float32)
	// Backward takes the x and y of Forward and dy = dL/dy; it adds
	// dL/dparam to g (aligned with Params) and sets dx = dL/dx, unless dx
	// is nil (the first layer needs no input gradient).
	Backward(dx, dy, x, y []float32, n int, g [][]float32, scratch []float32)
	// Spec describes the layer for the weights file.
	Spec() LayerSpec
}

// LayerSpec describes a layer's type and shape (the weights file's
// header). Fields a type does not use are zero.
type LayerSpec struct {
	// Type is "dense", "relu", "conv2d" or "maxpool2".
	Type string `json:"type"`
	// In and Out are a dense layer's widths; Size a relu's.
	In   int `json:"in,omitempty"`
	Out  int `json:"out,omitempty"`
	Size int `json:"size,omitempty"`
	// C, H, W are the input image of conv2d and maxpool2 (CHW).
	C int `json:"c,omitempty"`
	H int `json:"h,omitempty"`
	W int `json:"w,omitempty"`
	// OutC, Kernel and Pad are a conv2d's output channels, square
	// kernel side and zero padding (stride 1).
	OutC   int `json:"out_c,omitempty"`
	Kernel int `json:"kernel,omitempty"`
	Pad    int `json:"pad,omitempty"`
}

// maxLayerValues bounds any one tensor or activation row of a layer built
// from a spec (a corrupt header must not allocate gigabytes).
const maxLayerValues = 1 << 26

// NewLayer builds a layer (zero parameters) from its spec, checking its
// shape.
func NewLayer(s LayerSpec) (Layer, error) {
	pos := func(name string, v int) error {
		if v <= 0 || v > maxLayerValues {
			return fmt.Errorf("nn: layer %s: %s=%d out of range 1..%d", s.Type, name, v, maxLayerValues)
		}
		return nil
	}
	switch s.Type {
	case "dense":
		for _, e := range []error{pos("in", s.In), pos("out", s.Out)} {
			if e != nil {
				return nil, e
			}
		}
		if s.In*s.Out > maxLayerValues {
			return nil, fmt.Errorf("nn: layer dense %dx%d: too many weights", s.In, s.Out)
		}
		return NewDense(s.In, s.Out), nil
	case "relu":
		if err := pos("size", s.Size); err != nil {
			return nil, err
		}
		return &ReLULayer{N: s.Size}, nil
	case "conv2d":
		for _, e := range []error{pos("c", s.C), pos("h", s.H), pos("w", s.W), pos("out_c", s.OutC), pos("kernel", s.Kernel)} {
			if e != nil {
				return nil, e
			}
		}
		if s.Pad < 0 || s.Pad >= s.Kernel {
			return nil, fmt.Errorf("nn: layer conv2d: pad %d, want 0..kernel-1 (%d)", s.Pad, s.Kernel-1)
		}
		if s.H+2*s.Pad < s.Kernel || s.W+2*s.Pad < s.Kernel {
			return nil, fmt.Errorf("nn: layer conv2d: kernel %d larger than the padded %dx%d image", s.Kernel, s.H+2*s.Pad, s.W+2*s.Pad)
		}
		if s.C*s.H*s.W > maxLayerValues || s.OutC*s.C*s.Kernel*s.Kernel > maxLayerValues || s.OutC*s.H*s.W > maxLayerValues {
			return nil, fmt.Errorf("nn: layer conv2d: %dx%dx%d -> %d channels is too large", s.C, s.H, s.W, s.OutC)
		}
		return NewConv2D(s.C, s.H, s.W, s.OutC, s.Kernel, s.Pad), nil
	case "maxpool2":
		for _, e := range []error{pos("c", s.C), pos("h", s.H), pos("w", s.W)} {
			if e != nil {
				return nil, e
			}
		}
		if s.H < 2 || s.W < 2 || s.C*s.H*s.W > maxLayerValues {
			return nil, fmt.Errorf("nn: layer maxpool2: image %dx%dx%d cannot be pooled 2x2", s.C, s.H, s.W)
		}
		return &MaxPool2{C: s.C, H: s.H, W: s.W}, nil
	}
	return nil, fmt.Errorf("nn: unknown layer type %q (known: dense, relu, conv2d, maxpool2)", s.Type)
}

// ---- dense ----

// Dense is y = x·W + B with W [In,Out] row-major.
type Dense struct {
	In, Out int
	W, B    []float32
}

// NewDense returns a zero In x Out dense layer.
func NewDense(in, out int) *Dense {
	return &Dense{In: in, Out: out, W: make([]float32, in*out), B: make([]float32, out)}
}

func (d *Dense) InSize() int           { return d.In }
func (d *Dense) OutSize() int          { return d.Out }
func (d *Dense) Params() [][]float32   { return [][]float32{d.W, d.B} }
func (d *Dense) ScratchSize(n int) int { return d.In*n + d.In*d.Out }
func (d *Dense) Spec() LayerSpec       { return LayerSpec{Type: "dense", In: d.In, Out: d.Out} }

func (d *Dense) Forward(y, x []float32, n int, _ []float32) {
	Gemm(y, x, d.W, n, d.In, d.Out, false)
	AddBias(y, d.B, n, d.Out)
}

func (d *Dense) Backward(dx, dy, x, _ []float32, n int, g [][]float32, scratch []float32) {
	// dW += xᵀ·dy, through xᵀ [In,n] so the product streams rows of dy.
	xt := scratch[:d.In*n]
	Transpose(xt, x, n, d.In)
	Gemm(g[0], xt, dy, d.In, n, d.Out, true)
	gb := g[1][:d.Out]
	for i := range n {
		for j, v := range dy[i*d.Out : (i+1)*d.Out] {
			gb[j] += v
		}
	}
	if dx != nil {
		wt := scratch[d.In*n : d.In*n+d.In*d.Out]
		Transpose(wt, d.W, d.In, d.Out)
		Gemm(dx, dy, wt, n, d.Out, d.In, false)
	}
}

// ---- relu ----

// ReLULayer is y = max(0, x) over N values.
type ReLULayer struct{ N int }

func (r *ReLULayer) InSize() int         { return r.N }
func (r *ReLULayer) OutSize() int        { return r.N }
func (r *ReLULayer) Params() [][]float32 { return nil }
func (r *ReLULayer) ScratchSize(int) int { return 0 }
func (r *ReLULayer) Spec() LayerSpec     { return LayerSpec{Type: "relu", Size: r.N} }

func (r *ReLULayer) Forward(y, x []float32, n int, _ []float32) {
	x = x[:n*r.N]
	y = y[:len(x)]
	for i, v := range x {
		y[i] = max(v, 0)
	}
}

func (r *ReLULayer) Backward(dx, dy, _, y []float32, n int, _ [][]float32, _ []float32) {
	if dx == nil {
		return
	}
	y = y[:n*r.N]
	dy, dx = dy[:len(y)], dx[:len(y)]
	for i, v := range y {
		if v > 0 {
			dx[i] = dy[i]
		} else {
			dx[i] = 0
		}
	}
}

// ---- conv2d ----

// Conv2D is a stride-1 2-D convolution with zero padding over CHW images:
// C x H x W in, OutC x OH x OW out (OH = H + 2·Pad - Kernel + 1), weights
// Wt [OutC, C·Kernel·Kernel] (row o is output channel o's kernel, input
// channel major), bias B [OutC]. It runs as im2col + matrix product.
type Conv2D struct {
	C, H, W, OutC, Kernel, Pad int
	Wt, B                      []float32
}

// NewConv2D returns a zero convolution layer.
func NewConv2D(c, h, w, outC, kernel, pad int) *Conv2D {
	return &Conv2D{C: c, H: h, W: w, OutC: outC, Kernel: kernel, Pad: pad,
		Wt: make([]float32, outC*c*kernel*kernel), B: make([]float32, outC)}
}

// OutHW is the output image's height and width.
func (l *Conv2D) OutHW() (int, int) {
	return l.H + 2*l.Pad - l.Kernel + 1, l.W + 2*l.Pad - l.Kernel + 1
}

func (l *Conv2D) InSize() int { return l.C * l.H * l.W }
func (l *Conv2D) OutSize() int {
	oh, ow := l.OutHW()
	return l.OutC * oh * ow
}
func (l *Conv2D) Params() [][]float32 { return [][]float32{l.Wt, l.B} }
func (l *Conv2D) Spec() LayerSpec {
	return LayerSpec{Type: "conv2d", C: l.C, H: l.H, W: l.W, OutC: l.OutC, Kernel: l.Kernel, Pad: l.Pad}
}

func (l *Conv2D) ScratchSize(int) int {
	oh, ow := l.OutHW()
	ckk, ohw := l.C*l.Kernel*l.Kernel, oh*ow
	return 3*ckk*ohw + ckk*l.OutC // cols, colsᵀ, dcols, Wtᵀ
}

// im2col fills cols [C·K·K, OH·OW] from one image: row (c,ky,kx), column
// (oy,ox) holds x[c][oy+ky-Pad][ox+kx-Pad], zero outside the image.
func (l *Conv2D) im2col(cols, x []float32) {
	oh, ow := l.OutHW()
	k := l.Kernel
	r := 0
	for c := range l.C {
		img := x[c*l.H*l.W : (c+1)*l.H*l.W]
		for ky := range k {
			for kx := range k {
				row := cols[r*oh*ow : (r+1)*oh*ow]
				r++
				for oy := range oh {
					iy := oy + ky - l.Pad
					dst := row[oy*ow : (oy+1)*ow]
					if iy < 0 || iy >= l.H {
						clear(dst)
						continue
					}
					src := img[iy*l.W : (iy+1)*l.W]
					for ox := range dst {
						ix := ox + kx - l.Pad
						if ix < 0 || ix >= l.W {
							dst[ox] = 0
						} else {
							dst[ox] = src[ix]
						}
					}
				}
			}
		}
	}
}

// col2im adds cols [C·K·K, OH·OW] back into the image dx (the adjoint of
// im2col).
func (l *Conv2D) col2im(dx, cols []float32) {
	oh, ow := l.OutHW()
	k := l.Kernel
	r := 0
	for c := range l.C {
		img := dx[c*l.H*l.W : (c+1)*l.H*l.W]
		for ky := range k {
			for kx := range k {
				row := cols[r*oh*ow : (r+1)*oh*ow]
				r++
				for oy := range oh {
					iy := oy + ky - l.Pad
					if iy < 0 || iy >= l.H {
						continue
					}
					dst := img[iy*l.W : (iy+1)*l.W]
					for ox, v := range row[oy*ow : (oy+1)*ow] {
						if ix := ox + kx - l.Pad; ix >= 0 && ix < l.W {
							dst[ix] += v
						}
					}
				}
			}
		}
	}
}

func (l *Conv2D) Forward(y, x []float32, n int, scratch []float32) {
	oh, ow := l.OutHW()
	ckk, ohw := l.C*l.Kernel*l.Kernel, oh*ow
	in, out := l.InSize(), l.OutSize()
	cols := scratch[:ckk*ohw]
	for s := range n {
		l.im2col(cols, x[s*in:(s+1)*in])
		ys := y[s*out : (s+1)*out]
		Gemm(ys, l.Wt, cols, l.OutC, ckk, ohw, false)
		for o := range l.OutC {
			b := l.B[o]
			row := ys[o*ohw : (o+1)*ohw]
			for i := range row {
				row[i] += b
			}
		}
	}
}

func (l *Conv2D) Backward(dx, dy, x, _ []float32, n int, g [][]float32, scratch []float32) {
	oh, ow := l.OutHW()
	ckk, ohw := l.C*l.Kernel*l.Kernel, oh*ow
	in, out := l.InSize(), l.OutSize()
	cols := scratch[:ckk*ohw]
	colsT := scratch[ckk*ohw : 2*ckk*ohw]
	dcols := scratch[2*ckk*ohw : 3*ckk*ohw]
	wt := scratch[3*ckk*ohw : 3*ckk*ohw+ckk*l.OutC]
	if dx != nil {
		Transpose(wt, l.Wt, l.OutC, ckk)
	}
	gw, gb := g[0], g[1]
	for s := range n {
		dys := dy[s*out : (s+1)*out]
		l.im2col(cols, x[s*in:(s+1)*in])
		Transpose(colsT, cols, ckk, ohw)
		// dWt += dy_s [OutC, OHW] · colsᵀ [OHW, CKK]
		Gemm(gw, dys, colsT, l.OutC, ohw, ckk, true)
		for o := range l.OutC {
			var sum float32
			for _, v := range dys[o*ohw : (o+1)*ohw] {
				sum += v
			}
			gb[o] += sum
		}
		if dx != nil {
			// dcols = Wtᵀ [CKK, OutC] · dy_s [OutC, OHW], then back to pixels.
			Gemm(dcols, wt, dys, ckk, l.OutC, ohw, false)
			dxs := dx[s*in : (s+1)*in]
			clear(dxs)
			l.col2im(dxs, dcols)
		}
	}
}

// ---- maxpool2 ----

// MaxPool2 is 2x2 max pooling with stride 2 over C x H x W images (an odd
// last row or column is dropped).
type MaxPool2 struct{ C, H, W int }

func (p *MaxPool2) InSize() int         { return p.C * p.H * p.W }
func (p *MaxPool2) OutSize() int        { return p.C * (p.H / 2) * (p.W / 2) }
func (p *MaxPool2) Params() [][]float32 { return nil }
func (p *MaxPool2) ScratchSize(int) int { return 0 }
func (p *MaxPool2) Spec() LayerSpec     { return LayerSpec{Type: "maxpool2", C: p.C, H: p.H, W: p.W} }

func (p *MaxPool2) Forward(y, x []float32, n int, _ []float32) {
	oh, ow := p.H/2, p.W/2
	in, out := p.InSize(), p.OutSize()
	for s := range n {
		xs, ys := x[s*in:(s+1)*in], y[s*out:(s+1)*out]
		for c := range p.C {
			img := xs[c*p.H*p.W:]
			for oy := range oh {
				r0, r1 := img[2*oy*p.W:], img[(2*oy+1)*p.W:]
				dst := ys[(c*oh+oy)*ow : (c*oh+oy+1)*ow]
				for ox := range dst {
					dst[ox] = max(r0[2*ox], r0[2*ox+1], r1[2*ox], r1[2*ox+1])
				}
			}
		}
	}
}

// Backward routes each output's gradient to the first input of its
// window (row-major) that equals the window's maximum.
func (p *MaxPool2) Backward(dx, dy, x, y []float32, n int, _ [][]float32, _ []float32) {
	if dx == nil {
		return
	}
	oh, ow := p.H/2, p.W/2
	in, out := p.InSize(), p.OutSize()
	clear(dx[:n*in])
	for s := range n {
		xs, ys, dys, dxs := x[s*in:(s+1)*in], y[s*out:(s+1)*out], dy[s*out:(s+1)*out], dx[s*in:(s+1)*in]
		for c := range p.C {
			base := c * p.H * p.W
			for oy := range oh {
				for ox := range ow {
					o := (c*oh+oy)*ow + ox
					m := ys[o]
					i0 := base + 2*oy*p.W + 2*ox
					for _, i := range [4]int{i0, i0 + 1, i0 + p.W, i0 + p.W + 1} {
						if xs[i] == m {
							dxs[i] += dys[o]
							break
						}
					}
				}
			}
		}
	}
}

// ---- matrix helpers (single goroutine, fixed order) ----

// Gemm sets c = a·b (or adds a·b to c when acc) with a [m,k], b [k,n],
// c [m,n], all row-major, summing over k in increasing order (four terms
// at a time). Blocks of four zero entries of a are skipped (images and
// ReLU outputs are sparse); skipping adds nothing but -0/NaN subtleties.
func Gemm(c, a, b []float32, m, k, n int, acc bool) {
	if m == 0 || n == 0 {
		return
	}
	_ = c[m*n-1]
	if !acc {
		clear(c[:m*n])
	}
	if k == 0 {
		return
	}
	_ = a[m*k-1]
	_ = b[k*n-1]
	for i := range m {
		ci := c[i*n : (i+1)*n]
		ai := a[i*k : (i+1)*k]
		p := 0
		for ; p+4 <= k; p += 4 {
			a0, a1, a2, a3 := ai[p], ai[p+1], ai[p+2], ai[p+3]
			if a0 == 0 && a1 == 0 && a2 == 0 && a3 == 0 {
				continue
			}
			b0 := b[p*n : (p+1)*n][:len(ci)]
			b1 := b[(p+1)*n : (p+2)*n][:len(ci)]
			b2 := b[(p+2)*n : (p+3)*n][:len(ci)]
			b3 := b[(p+3)*n : (p+4)*n][:len(ci)]
			for j := range ci {
				ci[j] += a0*b0[j] + a1*b1[j] + a2*b2[j] + a3*b3[j]
			}
		}
		for ; p < k; p++ {
			av := ai[p]
			if av == 0 {
				continue
			}
			bp := b[p*n : (p+1)*n][:len(ci)]
			for j := range ci {
				ci[j] += av * bp[j]
			}
		}
	}
}

// Transpose sets dst [cols,rows] to the transpose of src [rows,cols].
func Transpose(dst, src []float32, rows, cols int) {
	const blk = 32
	for i0 := 0; i0 < rows; i0 += blk {
		i1 := min(i0+blk, rows)
		for j0 := 0; j0 < cols; j0 += blk {
			j1 := min(j0+blk, cols)
			for i := i0; i < i1; i++ {
				row := src[i*cols : (i+1)*cols]
				for j := j0; j < j1; j++ {
					dst[j*rows+i] = row[j]
				}
			}
		}
	}
}

// ---- network ----

// Net is a feed-forward network: Layers in order, then a row softmax when
// Softmax is set (a classifier's probabilities; a parity model has raw,
// linear outputs). Meta is free-form JSON stored with the weights (what
// the network was trained for).
type Net struct {
	Layers  []Layer
	Softmax bool
	Meta    []byte
}

// InSize is the width of an input row.
func (n *Net) InSize() int { return n.Layers[0].InSize() }

// OutSize is the width of an output row.
func (n *Net) OutSize() int { return n.Layers[len(n.Layers)-1].OutSize() }

// Check verifies that the net has layers and that each takes what the
// previous one gives.
func (n *Net) Check() error {
	if len(n.Layers) == 0 {
		return fmt.Errorf("nn: net has no layers")
	}
	for i := 1; i < len(n.Layers); i++ {
		if a, b := n.Layers[i-1].OutSize(), n.Layers[i].InSize(); a != b {
			return fmt.Errorf("nn: layer %d (%s) gives %d values per row, layer %d (%s) takes %d", i-1, n.Layers[i-1].Spec().Type, a, i, n.Layers[i].Spec().Type, b)
		}
	}
	return nil
}

// Params lists every parameter tensor, layer by layer (aliases).
func (n *Net) Params() [][]float32 {
	var ps [][]float32
	for _, l := range n.Layers {
		ps = append(ps, l.Params()...)
	}
	return ps
}

// NumParams is the number of parameters.
func (n *Net) NumParams() int {
	t := 0
	for _, p := range n.Params() {
		t += len(p)
	}
	return t
}

// Clone returns a deep copy (parameters included).
func (n *Net) Clone() *Net {
	c := &Net{Softmax: n.Softmax, Meta: slices.Clone(n.Meta)}
	for _, l := range n.Layers {
		nl, err := NewLayer(l.Spec())
		if err != nil {
			panic(fmt.Sprintf("nn: clone of a valid layer failed: %v", err)) // a layer's own spec is valid
		}
		for i, p := range l.Params() {
			copy(nl.Params()[i], p)
		}
		c.Layers = append(c.Layers, nl)
	}
	return c
}

// CopyParams copies src's parameters into n (same architecture).
func (n *Net) CopyParams(src *Net) {
	d, s := n.Params(), src.Params()
	for i := range d {
		copy(d[i], s[i])
	}
}

// Forward returns the outputs [rows, OutSize] for x [rows, InSize] (for
// serving). Dense layers use r's matrix products (r's reduction order);
// the other layers are deterministic.
func (n *Net) Forward(r *Reducer, x []float32, rows int) []float32 {
	cur := x
	var scratch []float32
	for _, l := range n.Layers {
		y := make([]float32, rows*l.OutSize())
		if d, ok := l.(*Dense); ok && r != nil {
			r.MatMul(y, cur, d.W, rows, d.In, d.Out)
			AddBias(y, d.B, rows, d.Out)
		} else {
			if s := l.ScratchSize(rows); cap(scratch) < s {
				scratch = make([]float32, s)
			}
			l.Forward(y, cur, rows, scratch[:l.ScratchSize(rows)])
		}
		cur = y
	}
	if n.Softmax {
		Softmax(cur, rows, n.OutSize())
	}
	return cur
}

// Tape holds one shard's activations and scratch for training a Net on
// up to Rows rows at a time. A Tape is used by one goroutine at a time.
type Tape struct {
	Rows    int
	acts    [][]float32 // acts[i]: output of layer i
	da, db  []float32   // gradient ping-pong buffers
	scratch []float32
}

// NewTape allocates a tape for up to rows rows.
func (n *Net) NewTape(rows int) *Tape {
	t := &Tape{Rows: rows}
	widest, scr := 0, 0
	for _, l := range n.Layers {
		t.acts = append(t.acts, make([]float32, rows*l.OutSize()))
		widest = max(widest, l.InSize(), l.OutSize())
		scr = max(scr, l.ScratchSize(rows))
	}
	t.da, t.db = make([]float32, rows*widest), make([]float32, rows*widest)
	t.scratch = make([]float32, scr)
	return t
}

// ForwardTrain runs x [rows, InSize] through the layers, keeping every
// activation on the tape, and returns the raw outputs (no softmax; they
// alias the tape until the next call).
func (n *Net) ForwardTrain(t *Tape, x []float32, rows int) []float32 {
	cur := x
	for i, l := range n.Layers {
		y := t.acts[i][:rows*l.OutSize()]
		l.Forward(y, cur, rows, t.scratch)
		cur = y
	}
	return cur
}

// Backward propagates dy = dL/d(raw output) [rows, OutSize] through the
// activations of the last ForwardTrain on t (whose input was x) and adds
// the parameter gradients to g (aligned with Params). No gradient is
// formed for the input.
func (n *Net) Backward(t *Tape, x, dy []float32, rows int, g [][]float32) {
	gi := len(g)
	cur := dy
	for i := len(n.Layers) - 1; i >= 0; i-- {
		l := n.Layers[i]
		np := len(l.Params())
		gi -= np
		in := x
		if i > 0 {
			in = t.acts[i-1][:rows*l.InSize()]
		}
		var dx []float32
		if i > 0 {
			dx = t.da[:rows*l.InSize()]
			if &dx[0] == &cur[0] {
				dx = t.db[:rows*l.InSize()]
			}
		}
		l.Backward(dx, cur, in, t.acts[i][:rows*l.OutSize()], rows, g[gi:gi+np], t.scratch)
		cur = dx
	}
}

// ---- initialisation ----

// InitPaper initialises the net as the ParM authors' trainer does: dense
// weights N(0, 0.01²) (standard deviation 0.01), convolution kernels
// Xavier-uniform with the ReLU gain √2, every bias 0.
func InitPaper(n *Net, rng *rand.Rand) {
	for _, l := range n.Layers {
		switch l := l.(type) {
		case *Dense:
			FillNormal(l.W, 0.01, rng)
			clear(l.B)
		case *Conv2D:
			kk := l.Kernel * l.Kernel
			bound := math.Sqrt2 * math.Sqrt(6/float64(l.C*kk+l.OutC*kk))
			for i := range l.Wt {
				l.Wt[i] = float32((2*rng.Float64() - 1) * bound)
			}
			clear(l.B)
		}
	}
}

// MLP returns a ReLU multi-layer perceptron in → hidden... → out with
// zero weights.
func MLP(in int, hidden []int, out int, softmax bool) *Net {
	n := &Net{Softmax: softmax}
	prev := in
	for _, h := range hidden {
		n.Layers = append(n.Layers, NewDense(prev, h), &ReLULayer{N: h})
		prev = h
	}
	n.Layers = append(n.Layers, NewDense(prev, out))
	return n
}

// LeNet5 returns the LeNet-5 layout for c x h x w images (h, w >= 12)
// with zero weights: conv 5x5 (pad 2) to 6 channels, ReLU, 2x2 max pool,
// conv 5x5 to 16 channels, ReLU, 2x2 max pool, dense 120, ReLU, dense 84,
// ReLU, dense out.
func LeNet5(c, h, w, out int, softmax bool) *Net {
	c1 := NewConv2D(c, h, w, 6, 5, 2)
	h1, w1 := c1.OutHW()
	p1 := &MaxPool2{C: 6, H: h1, W: w1}
	c2 := NewConv2D(6, h1/2, w1/2, 16, 5, 0)
	h2, w2 := c2.OutHW()
	p2 := &MaxPool2{C: 16, H: h2, W: w2}
	flat := p2.OutSize()
	return &Net{Softmax: softmax, Layers: []Layer{
		c1, &ReLULayer{N: c1.OutSize()}, p1,
		c2, &ReLULayer{N: c2.OutSize()}, p2,
		NewDense(flat, 120), &ReLULayer{N: 120},
		NewDense(120, 84), &ReLULayer{N: 84},
		NewDense(84, out),
	}}
}
