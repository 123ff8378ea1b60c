package nn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// lossOf is L = Σ y·w in float64 (so dL/dy = w).
func lossOf(y, w []float32) float64 {
	s := 0.0
	for i := range y {
		s += float64(y[i]) * float64(w[i])
	}
	return s
}

// checkLayerGrad compares a layer's Backward with central differences of
// L = Σ y·w for every parameter and input value (at most maxChecks of
// each, spread evenly).
func checkLayerGrad(t *testing.T, name string, l Layer, n int, seed uint64) {
	t.Helper()
	rng := NewRand(seed)
	for _, p := range l.Params() {
		FillNormal(p, 0.5, rng)
	}
	x := make([]float32, n*l.InSize())
	FillNormal(x, 1, rng)
	w := make([]float32, n*l.OutSize())
	FillNormal(w, 1, rng)
	scratch := make([]float32, l.ScratchSize(n))
	y := make([]float32, n*l.OutSize())
	loss := func() float64 {
		l.Forward(y, x, n, scratch)
		return lossOf(y, w)
	}
	loss()
	g := make([][]float32, len(l.Params()))
	for i, p := range l.Params() {
		g[i] = make([]float32, len(p))
	}
	dx := make([]float32, len(x))
	l.Backward(dx, w, x, slices.Clone(y), n, g, scratch)
	const eps = 1e-2
	check := func(what string, v []float32, grad []float32) {
		t.Helper()
		step := max(1, len(v)/60)
		for i := 0; i < len(v); i += step {
			old := v[i]
			v[i] = old + eps
			lp := loss()
			v[i] = old - eps
			lm := loss()
			v[i] = old
			num := (lp - lm) / (2 * eps)
			if d := math.Abs(num - float64(grad[i])); d > 2e-3+2e-3*math.Abs(num) {
				t.Fatalf("%s: d%s[%d] = %v, finite difference %v", name, what, i, grad[i], num)
			}
		}
	}
	for i, p := range l.Params() {
		check("param"+string(rune('0'+i)), p, g[i])
	}
	check("x", x, dx)
	// Backward accumulates parameter gradients: a second call doubles them.
	if len(g) > 0 {
		g0 := slices.Clone(g[0])
		l.Forward(y, x, n, scratch)
		l.Backward(nil, w, x, y, n, g, scratch)
		for i := range g0 {
			if math.Abs(float64(g[0][i]-2*g0[i])) > 1e-4*(1+math.Abs(float64(g0[i]))) {
				t.Fatalf("%s: second Backward gave %v, want 2·%v", name, g[0][i], g0[i])
			}
		}
	}
}

func TestLayerGradients(t *testing.T) {
	checkLayerGrad(t, "dense", NewDense(7, 5), 3, 1)
	checkLayerGrad(t, "relu", &ReLULayer{N: 11}, 4, 2)
	checkLayerGrad(t, "conv2d pad", NewConv2D(2, 6, 7, 3, 3, 1), 2, 3)
	checkLayerGrad(t, "conv2d", NewConv2D(1, 8, 8, 2, 5, 0), 2, 4)
	checkLayerGrad(t, "maxpool2", &MaxPool2{C: 2, H: 6, W: 5}, 3, 5)
}

// The whole network's Backward (LeNet-5 on 12x12 images, and an MLP)
// against finite differences of the summed loss.
func TestNetGradient(t *testing.T) {
	for _, tc := range []struct {
		name string
		net  *Net
	}{
		{"lenet", LeNet5(1, 12, 12, 4, false)},
		{"mlp", MLP(9, []int{6, 5}, 3, false)},
	} {
		n := tc.net
		if err := n.Check(); err != nil {
			t.Fatal(err)
		}
		rng := NewRand(7)
		for _, p := range n.Params() {
			FillNormal(p, 0.3, rng)
		}
		rows := 3
		x := make([]float32, rows*n.InSize())
		FillNormal(x, 1, rng)
		w := make([]float32, rows*n.OutSize())
		FillNormal(w, 1, rng)
		tape := n.NewTape(rows)
		loss := func() float64 { return lossOf(n.ForwardTrain(tape, x, rows), w) }
		loss()
		g := make([][]float32, 0)
		for _, p := range n.Params() {
			g = append(g, make([]float32, len(p)))
		}
		n.Backward(tape, x, w, rows, g)
		// The serving forward agrees with the training forward.
		if got, want := n.Forward(Deterministic, x, rows), n.ForwardTrain(tape, x, rows); !close32(got, want, 1e-5) {
			t.Fatalf("%s: Forward %v, ForwardTrain %v", tc.name, got, want)
		}
		checked, kinks := 0, 0
		for pi, p := range n.Params() {
			step := max(1, len(p)/15)
			for i := 0; i < len(p); i += step {
				diff := func(eps float32) float64 {
					old := p[i]
					p[i] = old + eps
					lp := loss()
					p[i] = old - eps
					lm := loss()
					p[i] = old
					return (lp - lm) / (2 * float64(eps))
				}
				num, fine := diff(4e-3), diff(1e-3)
				if math.Abs(num-fine) > 1e-2*(1+math.Abs(num)) {
					kinks++ // a ReLU or max-pool switch inside the step
					continue
				}
				checked++
				if d := math.Abs(num - float64(g[pi][i])); d > 5e-3+5e-3*math.Abs(num) {
					t.Fatalf("%s: param %d[%d]: gradient %v, finite difference %v", tc.name, pi, i, g[pi][i], num)
				}
			}
		}
		if kinks > checked/10 {
			t.Fatalf("%s: %d of %d coordinates sit on a kink", tc.name, kinks, kinks+checked)
		}
	}
}

func close32(a, b []float32, tol float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > tol*(1+math.Abs(float64(b[i]))) {
			return false
		}
	}
	return true
}

func TestGemmAndTranspose(t *testing.T) {
	rng := NewRand(9)
	m, k, n := 5, 13, 7
	a, b := make([]float32, m*k), make([]float32, k*n)
	FillNormal(a, 1, rng)
	FillNormal(b, 1, rng)
	a[0], a[1], a[2], a[3] = 0, 0, 0, 0 // a skipped block
	want := naive(a, b, m, k, n)
	c := make([]float32, m*n)
	Gemm(c, a, b, m, k, n, false)
	if !close32(c, want, 1e-5) {
		t.Fatalf("gemm %v want %v", c, want)
	}
	Gemm(c, a, b, m, k, n, true)
	for i := range want {
		want[i] *= 2
	}
	if !close32(c, want, 1e-5) {
		t.Fatal("gemm accumulate")
	}
	at := make([]float32, k*m)
	Transpose(at, a, m, k)
	for i := range m {
		for j := range k {
			if at[j*m+i] != a[i*k+j] {
				t.Fatalf("transpose at %d,%d", i, j)
			}
		}
	}
}

// The weights file round-trips architecture, output kind, meta and
// parameters, and every kind of damage is refused with a clear error.
func TestNetFormat(t *testing.T) {
	n := LeNet5(1, 12, 12, 4, true)
	InitPaper(n, NewRand(3))
	n.Meta = []byte(`{"k":2}`)
	b, err := EncodeNet(n)
	if err != nil {
		t.Fatal(err)
	}
	d, err := DecodeNet(b)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Softmax || string(d.Meta) != `{"k":2}` || len(d.Layers) != len(n.Layers) {
		t.Fatalf("decoded %+v", d)
	}
	for i, p := range n.Params() {
		if !slices.Equal(p, d.Params()[i]) {
			t.Fatalf("param %d differs", i)
		}
	}
	b2, _ := EncodeNet(d)
	if !bytes.Equal(b, b2) {
		t.Fatal("re-encoding changed the bytes")
	}
	hl := int(binary.LittleEndian.Uint32(b[12:]))
	badHeader := func(from, to string) []byte {
		h := strings.Replace(string(b[16:16+hl]), from, to, 1)
		out := append([]byte(nil), b[:12]...)
		out = binary.LittleEndian.AppendUint32(out, uint32(len(h)))
		out = append(out, h...)
		return append(out, b[16+hl:]...)
	}
	version := slices.Clone(b)
	binary.LittleEndian.PutUint32(version[8:], 2)
	nan := slices.Clone(b)
	binary.LittleEndian.PutUint32(nan[len(nan)-4:], math.Float32bits(float32(math.NaN())))
	for name, c := range map[string]struct {
		b    []byte
		want string
	}{
		"magic":     {append([]byte("HAMSMLP1"), b[8:]...), `magic "HAMSMLP1", want "HAMSNETW"`},
		"empty":     {nil, "magic"},
		"version":   {version, "format version 2, this build reads version 1"},
		"truncated": {b[:len(b)-4], "bytes of parameters, the layers need"},
		"long":      {append(slices.Clone(b), 0, 0, 0, 0), "bytes of parameters, the layers need"},
		"header":    {badHeader(`"layers"`, `"layers`), "header"},
		"type":      {badHeader(`"conv2d"`, `"conv3d"`), `unknown layer type "conv3d"`},
		"chain":     {badHeader(`"in":16`, `"in":17`), "takes 17"},
		"output":    {badHeader(`"softmax"`, `"sigmoid"`), `output "sigmoid"`},
		"nan":       {nan, "non-finite"},
	} {
		_, err := DecodeNet(c.b)
		if err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an ErrFormat naming %q", name, err, c.want)
		}
	}
}

func BenchmarkMLPTrainStep(b *testing.B) {
	n := MLP(784, []int{200, 100}, 10, false)
	InitPaper(n, NewRand(1))
	rows := 32
	x := make([]float32, rows*784)
	FillNormal(x, 1, NewRand(2))
	dy := make([]float32, rows*10)
	FillNormal(dy, 1, NewRand(3))
	tape := n.NewTape(rows)
	var g [][]float32
	for _, p := range n.Params() {
		g = append(g, make([]float32, len(p)))
	}
	b.ResetTimer()
	for range b.N {
		n.ForwardTrain(tape, x, rows)
		n.Backward(tape, x, dy, rows, g)
	}
	b.ReportMetric(float64(rows)*float64(b.N)/b.Elapsed().Seconds(), "samples/s")
}
