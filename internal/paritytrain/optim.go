package paritytrain

import (
	"fmt"
	"math"
	"strings"
)

// Loss is a training objective over a minibatch of output rows.
type Loss int

const (
	// MSE is the mean over every element of the minibatch of (y - t)²
	// (PyTorch's MSELoss): the paper's loss, on raw parity outputs.
	MSE Loss = iota + 1
	// CrossEntropy is the mean over rows of -Σ_c t_c·log softmax(y)_c
	// against a target distribution t (the concat encoder's summed
	// one-hot labels, normalised).
	CrossEntropy
)

func (l Loss) String() string {
	switch l {
	case MSE:
		return "mse"
	case CrossEntropy:
		return "ce"
	}
	return fmt.Sprintf("Loss(%d)", int(l))
}

// ParseLoss maps "mse" or "ce" to a Loss.
func ParseLoss(s string) (Loss, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "mse":
		return MSE, nil
	case "ce", "cross-entropy", "crossentropy":
		return CrossEntropy, nil
	}
	return 0, fmt.Errorf("paritytrain: loss %q: want mse or ce", s)
}

// lossGrad evaluates the loss of rows output rows y [rows,width] against
// targets t, as part of a minibatch of batch rows, and writes dL/dy into
// dy. It returns the rows' share of the minibatch loss (the shares of a
// minibatch's shards add up to its loss).
func (l Loss) lossGrad(dy, y, t []float32, rows, width, batch int) float64 {
	y, t, dy = y[:rows*width], t[:rows*width], dy[:rows*width]
	sum := 0.0
	switch l {
	case MSE:
		scale := 2 / float32(batch*width)
		for i, v := range y {
			d := v - t[i]
			sum += float64(d) * float64(d)
			dy[i] = d * scale
		}
		return sum / float64(batch*width)
	case CrossEntropy:
		inv := 1 / float32(batch)
		for r := range rows {
			yr, tr, dr := y[r*width:(r+1)*width], t[r*width:(r+1)*width], dy[r*width:(r+1)*width]
			mx := yr[0]
			for _, v := range yr {
				mx = max(mx, v)
			}
			z := 0.0
			for _, v := range yr {
				z += math.Exp(float64(v - mx))
			}
			lz := math.Log(z)
			for c, v := range yr {
				logp := float64(v-mx) - lz
				sum -= float64(tr[c]) * logp
				dr[c] = (float32(math.Exp(logp)) - tr[c]) * inv
			}
		}
		return sum / float64(batch)
	}
	panic(fmt.Sprintf("paritytrain: unknown loss %d", int(l)))
}

// Adam is the Adam optimiser with L2 weight decay added to the gradient,
// as PyTorch's torch.optim.Adam(lr, weight_decay) (the ParM authors'
// optimiser): for each parameter w with gradient g at step t,
//
//	g ← g + wd·w
//	m ← β1·m + (1-β1)·g
//	v ← β2·v + (1-β2)·g²
//	w ← w - (lr / (1-β1^t)) · m / (√v / √(1-β2^t) + ε)
//
// in float32, element by element (so any split of the elements over
// goroutines gives the same result).
type Adam struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	t                                  int
	m, v                               [][]float32
}

// NewAdam returns Adam with β1 0.9, β2 0.999, ε 1e-8 for params.
func NewAdam(params [][]float32, lr, weightDecay float64) *Adam {
	a := &Adam{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: weightDecay}
	for _, p := range params {
		a.m = append(a.m, make([]float32, len(p)))
		a.v = append(a.v, make([]float32, len(p)))
	}
	return a
}

// Steps is the number of steps taken.
func (a *Adam) Steps() int { return a.t }

// adamStep holds one step's scalars.
type adamStep struct {
	b1, b2, eps, wd, stepSize, sqrtBC2 float32
}

// begin advances the step count and returns its scalars.
func (a *Adam) begin() adamStep {
	a.t++
	bc1 := 1 - math.Pow(a.Beta1, float64(a.t))
	bc2 := 1 - math.Pow(a.Beta2, float64(a.t))
	return adamStep{b1: float32(a.Beta1), b2: float32(a.Beta2), eps: float32(a.Eps), wd: float32(a.WeightDecay),
		stepSize: float32(a.LR / bc1), sqrtBC2: float32(math.Sqrt(bc2))}
}

// update applies the step to elements lo..hi-1 of parameter i.
func (a *Adam) update(s adamStep, i int, w, g []float32, lo, hi int) {
	m, v := a.m[i][lo:hi], a.v[i][lo:hi]
	w, g = w[lo:hi], g[lo:hi]
	for e := range w {
		ge := g[e] + s.wd*w[e]
		m[e] = s.b1*m[e] + (1-s.b1)*ge
		v[e] = s.b2*v[e] + (1-s.b2)*ge*ge
		denom := float32(math.Sqrt(float64(v[e])))/s.sqrtBC2 + s.eps
		w[e] -= s.stepSize * m[e] / denom
	}
}

// Step applies one update to params with gradients grads (single
// goroutine; Trainer splits the same update over its workers).
func (a *Adam) Step(params, grads [][]float32) {
	s := a.begin()
	for i, p := range params {
		a.update(s, i, p, grads[i], 0, len(p))
	}
}
