package models

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/nn"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// fashionWeights is the trained 784-128-10 MLP (see EncodeMLP for the
// format; trained by `go run ./adapters/refserver/models/cmd/train-fashion`).
//
//go:embed weights/fashion-mlp.bin
var fashionWeights []byte

const mlpMagic = "HAMSMLP1"

// MLP is a two-layer perceptron: softmax(relu(x·W1+b1)·W2+b2).
type MLP struct {
	In, Hidden, Out int
	W1, B1, W2, B2  []float32
}

// EncodeMLP serialises m: magic "HAMSMLP1", uint32 In, Hidden, Out, then
// W1 [In,Hidden], B1, W2 [Hidden,Out], B2 as float32 little-endian.
func EncodeMLP(m *MLP) []byte {
	b := []byte(mlpMagic)
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

// DecodeMLP parses EncodeMLP's format.
func DecodeMLP(b []byte) (*MLP, error) {
	if len(b) < 20 || string(b[:8]) != mlpMagic {
		return nil, errors.New("models: decode mlp: bad magic")
	}
	m := &MLP{In: int(binary.LittleEndian.Uint32(b[8:])), Hidden: int(binary.LittleEndian.Uint32(b[12:])), Out: int(binary.LittleEndian.Uint32(b[16:]))}
	if m.In <= 0 || m.Hidden <= 0 || m.Out <= 0 || m.In*m.Hidden > 1<<26 {
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

// Forward returns softmax scores [n,Out] for x [n,In].
func (m *MLP) Forward(r *nn.Reducer, x []float32, n int) []float32 {
	h := make([]float32, n*m.Hidden)
	r.MatMul(h, x, m.W1, n, m.In, m.Hidden)
	nn.AddBias(h, m.B1, n, m.Hidden)
	nn.ReLU(h)
	y := make([]float32, n*m.Out)
	r.MatMul(y, h, m.W2, n, m.Hidden, m.Out)
	nn.AddBias(y, m.B2, n, m.Out)
	nn.Softmax(y, n, m.Out)
	return y
}

// FashionMLP returns the embedded trained classifier.
func FashionMLP() (*MLP, error) { return DecodeMLP(fashionWeights) }

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
	// (softmax over the Fashion-MNIST classes). Params: deterministic, chunks.
	register("classifier", func(m *config.Model, p *params) (*core, error) {
		mlp, err := FashionMLP()
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
