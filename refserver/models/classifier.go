package models

import (
	"embed"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver/nn"
)

// weightFiles holds the embedded weights: the deployed classifier
// fashion-mlp.bin (784-128-10, the original MLP format of EncodeMLP), the
// paper's deployed MLP fashion-paper-mlp.bin and LeNet-5 fashion-lenet.bin,
// and their parity models (ParityWeightsName), all trained by `hams parity
// train` (internal/paritytrain) in the network format of nn.EncodeNet,
// which records how each file was trained and its test accuracy.
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

// Net converts the MLP to an nn.Net (Dense, ReLU, Dense, softmax unless
// Linear) computing the same function.
func (m *MLP) Net() *nn.Net {
	n := nn.MLP(m.In, []int{m.Hidden}, m.Out, !m.Linear)
	d1, d2 := n.Layers[0].(*nn.Dense), n.Layers[2].(*nn.Dense)
	copy(d1.W, m.W1)
	copy(d1.B, m.B1)
	copy(d2.W, m.W2)
	copy(d2.B, m.B2)
	return n
}

// FashionWeights names the embedded deployed Fashion-MNIST classifier
// (the classifier kind's default weights).
const FashionWeights = "fashion-mlp"

// PaperWeights names the embedded deployed MLP of the ParM paper
// (784-200-100-10, ReLU, linear outputs: logits), the mlp kind's default.
const PaperWeights = "fashion-paper-mlp"

// ParityWeightsName is the embedded name of the parity model of deployed
// weights `deployed` for an encoder ("sum" or "concat"), coding groups of
// k and parity index j:
//
//	<prefix>-parity-<encoder>-k<k>          parity 0 (every r; the r = 1 model)
//	<prefix>-parity-<encoder>-k<k>-p<j>     parity j >= 1 (of any r > j)
//
// where prefix is "fashion" for fashion-mlp (the names examples/parm.yaml
// and hams bench --service parm use) and the deployed name otherwise.
// Parity j's target, Σ_i (i+1)^j F(X_i), does not depend on r, so one
// file serves parity j of every code with r > j.
func ParityWeightsName(deployed, encoder string, k, j int) string {
	prefix := deployed
	if deployed == FashionWeights {
		prefix = "fashion"
	}
	name := fmt.Sprintf("%s-parity-%s-k%d", prefix, encoder, k)
	if j > 0 {
		name += fmt.Sprintf("-p%d", j)
	}
	return name
}

// FashionParityWeights names the embedded parity model of the Fashion
// classifier for the sum encoder and coding groups of k.
func FashionParityWeights(k int) string { return ParityWeightsName(FashionWeights, "sum", k, 0) }

// FashionParityKs are the k for which a sum parity model of the Fashion
// classifier is embedded.
var FashionParityKs = []int{2, 3, 4}

// WeightNames lists the embedded weights, sorted.
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

// IsParityWeights reports whether an embedded name is a parity model's
// (it contains "-parity-"): such weights must have linear outputs.
func IsParityWeights(name string) bool { return strings.Contains(name, "-parity-") }

// EmbeddedWeights returns the bytes of the embedded weights of that name.
func EmbeddedWeights(name string) ([]byte, error) {
	if strings.ContainsAny(name, "/\\.") {
		return nil, fmt.Errorf("models: weights %q: not an embedded weights name (known: %v)", name, WeightNames())
	}
	b, err := weightFiles.ReadFile("weights/" + name + ".bin")
	if err != nil {
		return nil, fmt.Errorf("models: weights %q are not embedded (known: %v)", name, WeightNames())
	}
	return b, nil
}

// DecodeWeights parses a weights file of either format: the network format
// of nn.EncodeNet (magic HAMSNETW, versioned), or the original
// one-hidden-layer MLP (HAMSMLP1 softmax output, HAMSMLPL linear output).
func DecodeWeights(b []byte) (*nn.Net, error) {
	if len(b) >= 8 && string(b[:8]) == nn.NetMagic {
		n, err := nn.DecodeNet(b)
		if err != nil {
			return nil, fmt.Errorf("models: %w", err)
		}
		return n, nil
	}
	if len(b) >= 8 && (string(b[:8]) == mlpMagic || string(b[:8]) == mlpLinearMagic) {
		m, err := DecodeMLP(b)
		if err != nil {
			return nil, err
		}
		return m.Net(), nil
	}
	return nil, fmt.Errorf("models: weights: magic %q, want %q (network) or %q / %q (MLP)", b[:min(len(b), 8)], nn.NetMagic, mlpMagic, mlpLinearMagic)
}

// outputKind names a network's output for errors.
func outputKind(softmax bool) string {
	if softmax {
		return "softmax-output (classifier)"
	}
	return "linear-output (parity)"
}

// EmbeddedNet decodes the embedded weights of that name and checks them:
// a parity model (IsParityWeights) must have linear outputs.
func EmbeddedNet(name string) (*nn.Net, error) {
	b, err := EmbeddedWeights(name)
	if err != nil {
		return nil, err
	}
	n, err := DecodeWeights(b)
	if err != nil {
		return nil, fmt.Errorf("models: weights %q: %w", name, err)
	}
	if IsParityWeights(name) && n.Softmax {
		return nil, fmt.Errorf("models: weights %q: a %s network, want a %s one", name, outputKind(true), outputKind(false))
	}
	return n, nil
}

// checkShape verifies a network's input and output widths.
func checkShape(n *nn.Net, in, out int) error {
	if n.InSize() != in || n.OutSize() != out {
		return fmt.Errorf("a network of %d inputs and %d outputs, want %d and %d", n.InSize(), n.OutSize(), in, out)
	}
	return nil
}

// check verifies the MLP's input and output widths and output kind.
func (m *MLP) check(in, out int, linear bool) error {
	if m.Linear != linear {
		return fmt.Errorf("a %s MLP, want a %s one", outputKind(!m.Linear), outputKind(!linear))
	}
	if m.In != in || m.Out != out {
		return fmt.Errorf("shape %d-%d-%d, want %d-*-%d", m.In, m.Hidden, m.Out, in, out)
	}
	return nil
}

// FashionMLP returns the embedded trained classifier (the original
// 784-128-10 softmax MLP).
func FashionMLP() (*MLP, error) {
	b, err := EmbeddedWeights(FashionWeights)
	if err != nil {
		return nil, err
	}
	m, err := DecodeMLP(b)
	if err != nil {
		return nil, fmt.Errorf("models: weights %q: %w", FashionWeights, err)
	}
	if err := m.check(784, 10, false); err != nil {
		return nil, fmt.Errorf("models: weights %q: %w", FashionWeights, err)
	}
	return m, nil
}

// FashionParityMLP returns the embedded parity model of the Fashion
// classifier for the sum encoder over coding groups of k (2, 3 or 4): a
// linear-output network trained so that
// FashionParityMLP(k)(X_1+...+X_k) ≈ F(X_1)+...+F(X_k).
func FashionParityMLP(k int) (*nn.Net, error) {
	if !slices.Contains(FashionParityKs, k) {
		return nil, fmt.Errorf("models: no Fashion parity model for k=%d (have k in %v)", k, FashionParityKs)
	}
	n, err := EmbeddedNet(FashionParityWeights(k))
	if err != nil {
		return nil, err
	}
	if err := checkShape(n, 784, 10); err != nil {
		return nil, fmt.Errorf("models: weights %q: %w", FashionParityWeights(k), err)
	}
	return n, nil
}

// network serves an embedded network: images [N, in] -> scores [N, out].
type network struct {
	// netMu guards net: LoadWeights replaces it while batches compute (a
	// batch runs wholly on the weights it started with).
	netMu           sync.RWMutex
	net             *nn.Net
	r               *nn.Reducer
	inName, outName string
}

func (k *network) compute(in *inputs) ([]*hamsv1.Tensor, any, error) {
	k.netMu.RLock()
	net := k.net
	k.netMu.RUnlock()
	y := net.Forward(k.r, in.float(k.inName), in.n)
	return []*hamsv1.Tensor{out32(k.outName, in.n, net.OutSize(), y)}, nil, nil
}

func init() {
	// classifier: images FP32 [N,784] (pixels 0..1) -> scores FP32 [N,10]
	// over the Fashion-MNIST classes. Param weights picks the embedded
	// network: fashion-mlp (default, the deployed classifier: softmax
	// probabilities) or any other embedded 784 -> 10 network, e.g. a
	// parity model (ParityWeightsName: fashion-parity-sum-k{2,3,4},
	// fashion-parity-concat-k{2,3,4}, fashion-parity-sum-k2-p1, ...),
	// which takes parity queries (sums of k images: values 0..k; or tiled
	// downsampled images) and answers raw scores (no softmax)
	// approximating the coefficient-weighted sum of the k images' scores.
	// Params: weights, deterministic, chunks.
	register("classifier", func(m *config.Model, p *params) (*core, error) {
		return newNetwork(p, FashionWeights, true)
	})
	// mlp: images FP32 [N,in] -> scores FP32 [N,out], the embedded network
	// named by param weights (default fashion-paper-mlp, the ParM paper's
	// deployed MLP 784-200-100-10 with ReLU and logit outputs; any
	// embedded weights, LeNet-5 ones included: fashion-lenet and the
	// parity models of either). Params: weights, input "images", output
	// "scores", deterministic, chunks.
	register("mlp", func(m *config.Model, p *params) (*core, error) {
		return newNetwork(p, PaperWeights, false)
	})
}

// newNetwork builds a network kind from its weights param; fashion
// requires the 784 -> 10 shape of the classifier kind.
func newNetwork(p *params, def string, fashion bool) (*core, error) {
	w := p.str("weights", def)
	inName, outName := "images", "scores"
	if !fashion {
		inName, outName = names(p, inName, outName)
	}
	r := p.reducer()
	if p.err != nil {
		return nil, p.err
	}
	net, err := EmbeddedNet(w)
	if err != nil {
		return nil, err
	}
	if fashion {
		if err := checkShape(net, 784, 10); err != nil {
			return nil, fmt.Errorf("models: weights %q: %w", w, err)
		}
	}
	k := &network{net: net, r: r, inName: inName, outName: outName}
	return &core{ins: []inputSpec{{spec: fp32Spec(inName, int64(net.InSize()))}}, outs: []*hamsv1.TensorSpec{fp32Spec(outName, int64(net.OutSize()))}, k: k}, nil
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
