package models

import (
	"embed"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/nn"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// weightFiles holds the embedded MLP weights: the trained 784-128-10
// classifier fashion-mlp.bin (trained by `go run
// ./adapters/refserver/models/cmd/train-fashion`) and its parity models
// fashion-parity-sum-k{2,3,4}.bin (`go run
// ./adapters/refserver/models/cmd/train-parity`); see EncodeMLP for the
// format.
//
//go:embed weights/*.bin
var weightFiles embed.FS

const (
	// mlpMagic opens a softmax-output MLP (a classifier).
	mlpMagic = "HAMSMLP1"
	// mlpLinearMagic opens a linear-output MLP (no softmax: a parity
	// model, whose output is a sum of probability vectors).
	mlpLinearMagic = "HAMSMLPL"
)

// MLP is a two-layer perceptron: softmax(relu(x·W1+b1)·W2+b2), or without
// the softmax when Linear is set.
type MLP struct {
	In, Hidden, Out int
	W1, B1, W2, B2  []float32
	// Linear drops the output softmax: a parity model's output is a sum
	// of probability vectors, not one.
	Linear bool
}

// EncodeMLP serialises m: magic "HAMSMLP1" (softmax output) or "HAMSMLPL"
// (Linear: no softmax), uint32 In, Hidden, Out, then W1 [In,Hidden], B1,
// W2 [Hidden,Out], B2 as float32 little-endian.
func EncodeMLP(m *MLP) []byte {
	magic := mlpMagic
	if m.Linear {
		magic = mlpLinearMagic
	}
	b := []byte(magic)
	for _, v := range []int{m.In, m.Hidden, m.Out} {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	for _, s := range [][]float32{m.W1, m.B1, m.W2, m.B2} {
		for _, v := range s {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	return b
}

// DecodeMLP parses EncodeMLP's format (either magic).
func DecodeMLP(b []byte) (*MLP, error) {
	if len(b) < 20 || (string(b[:8]) != mlpMagic && string(b[:8]) != mlpLinearMagic) {
		return nil, fmt.Errorf("models: decode mlp: bad magic %q, want %q (softmax output) or %q (linear output)", b[:min(len(b), 8)], mlpMagic, mlpLinearMagic)
	}
	m := &MLP{In: int(binary.LittleEndian.Uint32(b[8:])), Hidden: int(binary.LittleEndian.Uint32(b[12:])), Out: int(binary.LittleEndian.Uint32(b[16:])),
		Linear: string(b[:8]) == mlpLinearMagic}
	if m.In <= 0 || m.Hidden <= 0 || m.Out <= 0 || m.In*m.Hidden > 1<<26 || m.Hidden*m.Out > 1<<26 {
		return nil, fmt.Errorf("models: decode mlp: bad dims %d,%d,%d", m.In, m.Hidden, m.Out)
	}
	n := m.In*m.Hidden + m.Hidden + m.Hidden*m.Out + m.Out
	if len(b) != 20+4*n {
		return nil, fmt.Errorf("models: decode mlp: %d bytes, want %d", len(b), 20+4*n)
	}
	m.W1, m.B1, m.W2, m.B2 = make([]float32, m.In*m.Hidden), make([]float32, m.Hidden), make([]float32, m.Hidden*m.Out), make([]float32, m.Out)
	rest := b[20:]
	for _, s := range [][]float32{m.W1, m.B1, m.W2, m.B2} {
		rest = readF32(s, rest)
	}
	return m, nil
}

// Forward returns the scores [n,Out] for x [n,In]: softmax
// probabilities, or the raw outputs of a Linear MLP.
func (m *MLP) Forward(r *nn.Reducer, x []float32, n int) []float32 {
	h := make([]float32, n*m.Hidden)
	r.MatMul(h, x, m.W1, n, m.In, m.Hidden)
	nn.AddBias(h, m.B1, n, m.Hidden)
	nn.ReLU(h)
	y := make([]float32, n*m.Out)
	r.MatMul(y, h, m.W2, n, m.Hidden, m.Out)
	nn.AddBias(y, m.B2, n, m.Out)
	if !m.Linear {
		nn.Softmax(y, n, m.Out)
	}
	return y
}

// FashionWeights names the embedded deployed Fashion-MNIST classifier
// (the classifier kind's default weights).
const FashionWeights = "fashion-mlp"

// FashionParityWeights names the embedded parity model of the Fashion
// classifier for the sum encoder and coding groups of k.
func FashionParityWeights(k int) string { return fmt.Sprintf("fashion-parity-sum-k%d", k) }

// FashionParityKs are the k for which a parity model is embedded.
var FashionParityKs = []int{2, 3, 4}

// WeightNames lists the embedded MLP weights, sorted.
func WeightNames() []string {
	ents, _ := weightFiles.ReadDir("weights")
	var out []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".bin"); ok {
			out = append(out, n)
		}
	}
	return out
}

// EmbeddedMLP decodes the embedded weights of that name and checks that
// they are a Fashion-MNIST MLP of the right kind: fashion-mlp has a
// softmax output, fashion-parity-* a linear one; both map 784 pixels to
// 10 scores.
func EmbeddedMLP(name string) (*MLP, error) {
	if strings.ContainsAny(name, "/\\.") {
		return nil, fmt.Errorf("models: weights %q: not an embedded weights name (known: %v)", name, WeightNames())
	}
	b, err := weightFiles.ReadFile("weights/" + name + ".bin")
	if err != nil {
		return nil, fmt.Errorf("models: weights %q are not embedded (known: %v)", name, WeightNames())
	}
	m, err := DecodeMLP(b)
	if err != nil {
		return nil, fmt.Errorf("models: weights %q: %w", name, err)
	}
	wantLinear := strings.HasPrefix(name, "fashion-parity-")
	if err := m.check(784, 10, wantLinear); err != nil {
		return nil, fmt.Errorf("models: weights %q: %w", name, err)
	}
	return m, nil
}

// check verifies the MLP's input and output widths and output kind.
func (m *MLP) check(in, out int, linear bool) error {
	kind := func(l bool) string {
		if l {
			return "linear-output (parity)"
		}
		return "softmax-output (classifier)"
	}
	if m.Linear != linear {
		return fmt.Errorf("a %s MLP, want a %s one", kind(m.Linear), kind(linear))
	}
	if m.In != in || m.Out != out {
		return fmt.Errorf("shape %d-%d-%d, want %d-*-%d", m.In, m.Hidden, m.Out, in, out)
	}
	return nil
}

// FashionMLP returns the embedded trained classifier.
func FashionMLP() (*MLP, error) { return EmbeddedMLP(FashionWeights) }

// FashionParityMLP returns the embedded parity model of the Fashion
// classifier for the sum encoder over coding groups of k (2, 3 or 4): the
// classifier's architecture without the softmax, trained so that
// FashionParityMLP(k)(X_1+...+X_k) ≈ F(X_1)+...+F(X_k).
func FashionParityMLP(k int) (*MLP, error) {
	if !slices.Contains(FashionParityKs, k) {
		return nil, fmt.Errorf("models: no Fashion parity model for k=%d (have k in %v)", k, FashionParityKs)
	}
	return EmbeddedMLP(FashionParityWeights(k))
}

type classifier struct {
	mlp *MLP
	r   *nn.Reducer
}

func (k *classifier) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	y := k.mlp.Forward(k.r, in.float("images"), in.n)
	return []*hamsv1.Tensor{out32("scores", in.n, k.mlp.Out, y)}, nil, nil
}

func init() {
	// classifier: images FP32 [N,784] (pixels 0..1) -> scores FP32 [N,10]
	// (softmax over the Fashion-MNIST classes). Param weights picks the
	// embedded MLP: fashion-mlp (default, the deployed classifier) or
	// fashion-parity-sum-k{2,3,4}, its parity model for the sum encoder,
	// which takes sums of k images (values 0..k) and answers raw scores
	// (no softmax) approximating the sum of the k images' probability
	// vectors. Params: weights, deterministic, chunks.
	register("classifier", func(m *config.Model, p *params) (*core, error) {
		w := p.str("weights", FashionWeights)
		if p.err != nil {
			return nil, p.err
		}
		mlp, err := EmbeddedMLP(w)
		if err != nil {
			return nil, err
		}
		k := &classifier{mlp: mlp, r: p.reducer()}
		return &core{ins: []inputSpec{{spec: fp32Spec("images", 784)}}, outs: []*hamsv1.TensorSpec{fp32Spec("scores", 10)}, k: k}, nil
	})
}

// Argmax returns the index of the largest element.
func Argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}
