package paritytrain

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/hams-go/hams/protocol/parity"
	"github.com/hams-go/hams/refserver/nn"
)

// Image is a query's layout as an image, height x width x channels (the
// concat encoder tiles images; a CNN reads them channel-major, which for
// one channel is the same as row-major HWC).
type Image struct{ H, W, C int }

// Size is the number of values of one image.
func (im Image) Size() int { return im.H * im.W * im.C }

// FashionImage is a Fashion-MNIST query: 28x28 grey pixels, 0..1.
var FashionImage = Image{H: 28, W: 28, C: 1}

// NewArch builds a network (zero weights, then InitPaper with rng) for
// arch, a query of image layout im and out outputs:
//
//	mlp           the paper's MLP: in-200-100-out, ReLU
//	mlp:H1,H2,... an MLP with those hidden widths (mlp:128 is the
//	              reference classifier's 784-128-10)
//	lenet         LeNet-5 (nn.LeNet5) over the image
//
// softmax marks a classifier (probabilities out); a parity model is
// linear.
func NewArch(arch string, im Image, out int, softmax bool, rng *rand.Rand) (*nn.Net, error) {
	var n *nn.Net
	switch a := strings.TrimSpace(arch); {
	case a == "mlp":
		n = nn.MLP(im.Size(), []int{200, 100}, out, softmax)
	case strings.HasPrefix(a, "mlp:"):
		var hidden []int
		for _, f := range strings.Split(a[4:], ",") {
			h, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || h < 1 || h > 1<<14 {
				return nil, fmt.Errorf("paritytrain: arch %q: hidden width %q, want 1..%d", arch, f, 1<<14)
			}
			hidden = append(hidden, h)
		}
		n = nn.MLP(im.Size(), hidden, out, softmax)
	case a == "lenet":
		if im.H < 12 || im.W < 12 {
			return nil, fmt.Errorf("paritytrain: arch lenet needs images of at least 12x12, have %dx%d", im.H, im.W)
		}
		n = nn.LeNet5(im.C, im.H, im.W, out, softmax)
	default:
		return nil, fmt.Errorf("paritytrain: unknown arch %q (want mlp, mlp:H1,H2,... or lenet)", arch)
	}
	if out < 1 || im.Size() < 1 {
		return nil, fmt.Errorf("paritytrain: arch %q with %d inputs and %d outputs", arch, im.Size(), out)
	}
	nn.InitPaper(n, rng)
	return n, nil
}

// Spec is what a parity model is trained for: parity model J of a (K, R)
// code whose parity queries the Encoder builds, learning
// Σ_i parity.Coefficient(J,i)·F(X_i) over the K queries X_i of a group.
type Spec struct {
	K, R, J int
	Encoder parity.EncoderKind
	// Image is the query layout (concat needs it; sum uses its size).
	Image Image
	// Loss: MSE against the coefficient-weighted sum of the deployed
	// outputs (the paper), or CrossEntropy against the group's one-hot
	// labels summed and normalised (the paper's concat encoder; J = 0
	// only, as the decoder's coefficients mean nothing for a
	// distribution). A sample without a true label counts with the
	// deployed model's top-1.
	Loss Loss
}

// Code validates K and R and returns the code.
func (s Spec) Code() (parity.Code, error) {
	c, err := parity.NewCode(s.K, s.R)
	if err != nil {
		return parity.Code{}, fmt.Errorf("paritytrain: %w", err)
	}
	if s.J < 0 || s.J >= s.R {
		return parity.Code{}, fmt.Errorf("paritytrain: parity index j=%d out of range 0..%d for r=%d", s.J, s.R-1, s.R)
	}
	return c, nil
}

// NewEncoder builds the serving path's encoder for the spec (the very
// same code that encodes live parity queries).
func (s Spec) NewEncoder() (parity.Encoder, error) {
	code, err := s.Code()
	if err != nil {
		return nil, err
	}
	var enc parity.Encoder
	switch s.Encoder {
	case parity.EncoderSum:
		enc, err = parity.NewSumEncoder(code, s.Image.Size())
	case parity.EncoderConcat:
		enc, err = parity.NewConcatEncoder(code, s.Image.H, s.Image.W, s.Image.C)
	default:
		return nil, fmt.Errorf("paritytrain: encoder %v: want sum or concat", s.Encoder)
	}
	if err != nil {
		return nil, fmt.Errorf("paritytrain: %w", err)
	}
	return enc, nil
}

func (s Spec) validate() error {
	if _, err := s.NewEncoder(); err != nil {
		return err
	}
	switch s.Loss {
	case MSE:
	case CrossEntropy:
		if s.J != 0 {
			return fmt.Errorf("paritytrain: loss ce for parity j=%d: only parity 0 can be trained for a distribution; use mse", s.J)
		}
	default:
		return fmt.Errorf("paritytrain: loss %v: want mse or ce", s.Loss)
	}
	return nil
}

// Options are the optimisation settings; zero fields take the paper's.
type Options struct {
	// LR and WeightDecay of Adam: default 1e-3 and 1e-5.
	LR, WeightDecay float64
	// Batch is the number of coding groups per step: default 64 for
	// k = 2, 32 otherwise (the authors').
	Batch int
	// Shards splits every minibatch into this many parts computed in
	// parallel and summed in shard order (default 4). Part of a run's
	// identity: the same seed and Shards give bit-identical weights on
	// any number of cores.
	Shards int
	// Workers is the number of goroutines (default GOMAXPROCS).
	Workers int
}

func (o Options) withDefaults(k int) Options {
	if o.LR == 0 {
		o.LR = 1e-3
	}
	if o.WeightDecay == 0 {
		o.WeightDecay = 1e-5
	}
	if o.Batch == 0 {
		o.Batch = 32
		if k == 2 {
			o.Batch = 64
		}
	}
	if o.Shards == 0 {
		o.Shards = 4
	}
	if o.Workers == 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	return o
}

// batcher fills a shard's input rows and targets from its items (coding
// groups, or single samples when training a classifier).
type batcher interface {
	// fill writes row r of x [rows, in] and t [rows, out] for items[r].
	fill(x, t []float32, set *Set, items [][]int, scratch [][]float32) error
	// itemSize is the number of samples per item.
	itemSize() int
}

// parityBatch encodes groups with the serving encoder and targets
// Σ_i c(J,i)·F(X_i) (MSE) or the normalised sum of one-hot labels (CE).
type parityBatch struct {
	spec Spec
	enc  parity.Encoder
}

func (b *parityBatch) itemSize() int { return b.spec.K }

func (b *parityBatch) fill(x, t []float32, set *Set, items [][]int, queries [][]float32) error {
	in, out := b.enc.QuerySize(), set.OutSize
	for r, g := range items {
		for i, idx := range g {
			queries[i] = set.Q(idx)
		}
		if err := b.enc.Encode(x[r*in:(r+1)*in], queries[:len(g)], b.spec.J); err != nil {
			return fmt.Errorf("paritytrain: encode group: %w", err)
		}
		tr := t[r*out : (r+1)*out]
		clear(tr)
		for i, idx := range g {
			if b.spec.Loss == CrossEntropy {
				tr[classOf(set, idx)] += 1 / float32(len(g))
				continue
			}
			c := parity.Coefficient(b.spec.J, i)
			for e, v := range set.O(idx) {
				tr[e] += c * v
			}
		}
	}
	return nil
}

// classOf is sample i's true label, or the deployed model's top-1 when
// unknown.
func classOf(set *Set, i int) int {
	if l := set.Label[i]; l >= 0 && l < set.OutSize {
		return l
	}
	return argmax(set.O(i))
}

// classifierBatch trains a deployed classifier: one sample per item,
// target its one-hot label (CE).
type classifierBatch struct{}

func (classifierBatch) itemSize() int { return 1 }

func (classifierBatch) fill(x, t []float32, set *Set, items [][]int, _ [][]float32) error {
	in, out := set.QuerySize, set.OutSize
	for r, it := range items {
		copy(x[r*in:(r+1)*in], set.Q(it[0]))
		tr := t[r*out : (r+1)*out]
		clear(tr)
		tr[classOf(set, it[0])] = 1
	}
	return nil
}

// Trainer trains one network by minibatch Adam, data-parallel: each
// minibatch is split into Shards parts whose gradients are computed on
// Workers goroutines and summed in shard order, then the Adam update is
// split over the workers element-wise. Every step is therefore a pure
// function of the weights and the minibatch: a seed gives bit-identical
// weights. A Trainer is used by one goroutine at a time.
type Trainer struct {
	net    *nn.Net
	opt    Options
	loss   Loss
	b      batcher
	adam   *Adam
	params [][]float32
	grad   [][]float32 // the minibatch's summed gradient
	shards []*shard
	spec   *Spec // nil for a classifier
}

type shard struct {
	tape    *nn.Tape
	x, t    []float32
	dy      []float32
	grads   [][]float32
	queries [][]float32
	loss    float64
	rows    int
	err     error
}

// NewTrainer returns a trainer of parity model net for spec. net's input
// and output widths must be the encoder's query size and the deployed
// model's output width (checked at the first step against the set).
func NewTrainer(spec Spec, net *nn.Net, opt Options) (*Trainer, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	enc, _ := spec.NewEncoder()
	if err := net.Check(); err != nil {
		return nil, fmt.Errorf("paritytrain: %w", err)
	}
	if net.InSize() != enc.QuerySize() {
		return nil, fmt.Errorf("paritytrain: the parity model takes %d values, a %v query has %d", net.InSize(), spec.Encoder, enc.QuerySize())
	}
	if net.Softmax {
		return nil, fmt.Errorf("paritytrain: a parity model must have linear outputs (its target is a sum of outputs, not a distribution)")
	}
	s := spec
	return newTrainer(net, opt.withDefaults(spec.K), spec.Loss, &parityBatch{spec: spec, enc: enc}, &s), nil
}

// NewClassifierTrainer returns a trainer of a deployed classifier net
// (softmax output) on true labels with cross-entropy.
func NewClassifierTrainer(net *nn.Net, opt Options) (*Trainer, error) {
	if err := net.Check(); err != nil {
		return nil, fmt.Errorf("paritytrain: %w", err)
	}
	if opt.Batch == 0 {
		opt.Batch = 64
	}
	return newTrainer(net, opt.withDefaults(2), CrossEntropy, classifierBatch{}, nil), nil
}

func newTrainer(net *nn.Net, opt Options, loss Loss, b batcher, spec *Spec) *Trainer {
	t := &Trainer{net: net, opt: opt, loss: loss, b: b, spec: spec, params: net.Params()}
	t.adam = NewAdam(t.params, opt.LR, opt.WeightDecay)
	for _, p := range t.params {
		t.grad = append(t.grad, make([]float32, len(p)))
	}
	rows := (opt.Batch + opt.Shards - 1) / opt.Shards
	for range opt.Shards {
		sh := &shard{tape: net.NewTape(rows), x: make([]float32, rows*net.InSize()),
			t: make([]float32, rows*net.OutSize()), dy: make([]float32, rows*net.OutSize()),
			queries: make([][]float32, b.itemSize())}
		for _, p := range t.params {
			sh.grads = append(sh.grads, make([]float32, len(p)))
		}
		t.shards = append(t.shards, sh)
	}
	return t
}

// Net is the network being trained (its weights change with each step).
func (t *Trainer) Net() *nn.Net { return t.net }

// Options are the effective options.
func (t *Trainer) Options() Options { return t.opt }

// Steps is the number of optimiser steps taken.
func (t *Trainer) Steps() int { return t.adam.Steps() }

// checkSet verifies that set's rows fit the network.
func (t *Trainer) checkSet(set *Set) error {
	if set.OutSize != t.net.OutSize() {
		return fmt.Errorf("paritytrain: the deployed model's outputs have %d values, the network gives %d", set.OutSize, t.net.OutSize())
	}
	if t.spec == nil && set.QuerySize != t.net.InSize() {
		return fmt.Errorf("paritytrain: queries of %d values, the network takes %d", set.QuerySize, t.net.InSize())
	}
	if t.spec != nil && set.QuerySize != t.spec.Image.Size() {
		return fmt.Errorf("paritytrain: queries of %d values, the spec's image has %d", set.QuerySize, t.spec.Image.Size())
	}
	return nil
}

// run calls f(i) for i in 0..n-1 on up to Workers goroutines and waits
// for all of them.
func (t *Trainer) run(n int, f func(i int)) {
	w := min(t.opt.Workers, n)
	if w <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var wg sync.WaitGroup
	for g := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += w {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// Step takes one optimiser step on the minibatch items (coding groups of
// K sample indices of set; single indices for a classifier) and returns
// the minibatch loss. len(items) must be 1..Batch.
func (t *Trainer) Step(set *Set, items [][]int) (float64, error) {
	if len(items) == 0 || len(items) > t.opt.Batch {
		return 0, fmt.Errorf("paritytrain: step of %d items, want 1..%d", len(items), t.opt.Batch)
	}
	if err := t.checkSet(set); err != nil {
		return 0, err
	}
	for _, it := range items {
		if len(it) != t.b.itemSize() {
			return 0, fmt.Errorf("paritytrain: an item of %d samples, want %d", len(it), t.b.itemSize())
		}
		for _, i := range it {
			if i < 0 || i >= set.N {
				return 0, fmt.Errorf("paritytrain: sample index %d out of range 0..%d", i, set.N-1)
			}
		}
	}
	batch := len(items)
	in, out := t.net.InSize(), t.net.OutSize()
	S := len(t.shards)
	t.run(S, func(s int) {
		sh := t.shards[s]
		lo, hi := s*batch/S, (s+1)*batch/S
		sh.rows, sh.loss, sh.err = hi-lo, 0, nil
		for _, g := range sh.grads {
			clear(g)
		}
		if sh.rows == 0 {
			return
		}
		if err := t.b.fill(sh.x[:sh.rows*in], sh.t[:sh.rows*out], set, items[lo:hi], sh.queries); err != nil {
			sh.err = err
			return
		}
		y := t.net.ForwardTrain(sh.tape, sh.x, sh.rows)
		sh.loss = t.loss.lossGrad(sh.dy, y, sh.t, sh.rows, out, batch)
		t.net.Backward(sh.tape, sh.x, sh.dy, sh.rows, sh.grads)
	})
	loss := 0.0
	for _, sh := range t.shards {
		if sh.err != nil {
			return 0, sh.err
		}
		loss += sh.loss
	}
	// Sum the shards' gradients in shard order and apply Adam, element
	// ranges split over the workers (element-wise, so the split does not
	// change the result).
	st := t.adam.begin()
	const chunk = 1 << 14
	type span struct{ p, lo, hi int }
	var spans []span
	for p, w := range t.params {
		for lo := 0; lo < len(w); lo += chunk {
			spans = append(spans, span{p, lo, min(lo+chunk, len(w))})
		}
	}
	t.run(len(spans), func(i int) {
		sp := spans[i]
		g := t.grad[sp.p][sp.lo:sp.hi]
		copy(g, t.shards[0].grads[sp.p][sp.lo:sp.hi])
		for _, sh := range t.shards[1:] {
			for e, v := range sh.grads[sp.p][sp.lo:sp.hi] {
				g[e] += v
			}
		}
		t.adam.update(st, sp.p, t.params[sp.p], t.grad[sp.p], sp.lo, sp.hi)
	})
	return loss, nil
}

// Epoch draws fresh items from rng (a permutation of the set cut into
// coding groups of K; single samples for a classifier), steps through
// them in minibatches (the last one may be short) and returns the mean
// minibatch loss and the number of items. It stops early, with ctx's
// error, when ctx ends.
func (t *Trainer) Epoch(ctx context.Context, set *Set, rng *rand.Rand) (float64, int, error) {
	items := Groups(set.N, t.b.itemSize(), rng)
	if len(items) == 0 {
		return 0, 0, fmt.Errorf("paritytrain: epoch over %d samples: not one group of %d", set.N, t.b.itemSize())
	}
	loss, steps := 0.0, 0
	for lo := 0; lo < len(items); lo += t.opt.Batch {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		l, err := t.Step(set, items[lo:min(lo+t.opt.Batch, len(items))])
		if err != nil {
			return 0, 0, err
		}
		loss += l
		steps++
	}
	return loss / float64(steps), len(items), nil
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}
