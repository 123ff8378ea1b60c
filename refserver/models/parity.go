package models

import (
	"fmt"

	"github.com/hams-go/hams/refserver/nn"
)

// ParityEvalSeed draws the coding groups of a parity model's reported
// accuracy (ParityGroups over the 10,000 Fashion-MNIST test images).
const ParityEvalSeed = 1

// ParityGroups cuts a seeded permutation of 0..n-1 into n/k coding groups
// of k indices (the n mod k left over are in no group).
func ParityGroups(n, k int, seed uint64) [][]int {
	if k <= 0 || n < k {
		return nil
	}
	perm := nn.NewRand(seed).Perm(n)
	groups := make([][]int, n/k)
	for g := range groups {
		groups[g] = perm[g*k : (g+1)*k : (g+1)*k]
	}
	return groups
}

// SumEncode is the sum encoder: row g of the result [len(groups), width]
// is the element-wise sum of the rows of x [*, width] in groups[g].
func SumEncode(x []float32, width int, groups [][]int) []float32 {
	p := make([]float32, len(groups)*width)
	for g, idx := range groups {
		row := p[g*width : (g+1)*width]
		for _, i := range idx {
			src := x[i*width : (i+1)*width]
			for j := range row {
				row[j] += src[j]
			}
		}
	}
	return p
}

// SubtractDecode is the subtraction decoder: the reconstruction of
// F(X_e) for erased position e of a coding group is the parity output
// minus the other positions' outputs. f holds the deployed model's
// outputs [*, width] indexed by the group's rows; the result has width
// values.
func SubtractDecode(parityOut, f []float32, width int, group []int, e int) []float32 {
	r := append([]float32(nil), parityOut[:width]...)
	for pos, i := range group {
		if pos == e {
			continue
		}
		src := f[i*width : (i+1)*width]
		for j := range r {
			r[j] -= src[j]
		}
	}
	return r
}

// ParityScore is how well a parity model reconstructs a classifier's
// predictions: every position of every coding group is erased in turn
// and reconstructed with SubtractDecode.
type ParityScore struct {
	K      int `json:"k"`
	Groups int `json:"groups"`
	// Aa is the deployed model's top-1 accuracy over all labelled images.
	Aa float64 `json:"aa"`
	// Ad (degraded mode) is the top-1 accuracy of the reconstructions.
	Ad float64 `json:"ad"`
	// Agreement is the fraction of reconstructions whose top-1 is the
	// deployed model's top-1 for the same image.
	Agreement float64 `json:"agreement"`
}

// String formats the score for logs.
func (s ParityScore) String() string {
	return fmt.Sprintf("k=%d groups=%d Aa=%.4f Ad=%.4f agreement=%.4f", s.K, s.Groups, s.Aa, s.Ad, s.Agreement)
}

// ScoreParity scores parity outputs p [len(groups), classes] against the
// deployed model's outputs f [n, classes] and the labels [n].
func ScoreParity(f, p []float32, classes int, labels []int, groups [][]int) ParityScore {
	s := ParityScore{Groups: len(groups)}
	if len(groups) > 0 {
		s.K = len(groups[0])
	}
	ok := 0
	for i, l := range labels {
		if Argmax(f[i*classes:(i+1)*classes]) == l {
			ok++
		}
	}
	if len(labels) > 0 {
		s.Aa = float64(ok) / float64(len(labels))
	}
	right, agree, total := 0, 0, 0
	for g, idx := range groups {
		for e, i := range idx {
			r := Argmax(SubtractDecode(p[g*classes:(g+1)*classes], f, classes, idx, e))
			if r == labels[i] {
				right++
			}
			if r == Argmax(f[i*classes:(i+1)*classes]) {
				agree++
			}
			total++
		}
	}
	if total > 0 {
		s.Ad, s.Agreement = float64(right)/float64(total), float64(agree)/float64(total)
	}
	return s
}

// Forwarder is a model that maps rows of inputs to rows of outputs (an
// *MLP or an *nn.Net).
type Forwarder interface {
	Forward(r *nn.Reducer, x []float32, n int) []float32
}

// EvalParity scores parity model pm of deployed model dm on images x
// [n, width] with labels, over the coding groups of k drawn with seed:
// the Aa, Ad and agreement of ParM's sum encoder and subtraction decoder.
// (internal/paritytrain scores every encoder and code with the serving
// path's encoder and decoder; this is the sum/subtract special case.)
func EvalParity(dm, pm Forwarder, x []float32, labels []int, k int, seed uint64) (ParityScore, error) {
	n := len(labels)
	switch {
	case k < 1 || n < k:
		return ParityScore{}, fmt.Errorf("models: eval parity: k=%d with %d images", k, n)
	case len(x)%n != 0:
		return ParityScore{}, fmt.Errorf("models: eval parity: %d values for %d images", len(x), n)
	}
	width := len(x) / n
	f := dm.Forward(nn.Deterministic, x, n)
	classes := len(f) / n
	groups := ParityGroups(n, k, seed)
	p := pm.Forward(nn.Deterministic, SumEncode(x, width, groups), len(groups))
	if len(p) != len(groups)*classes {
		return ParityScore{}, fmt.Errorf("models: eval parity: the parity model answers %d values per row, the deployed model %d", len(p)/len(groups), classes)
	}
	return ScoreParity(f, p, classes, labels, groups), nil
}
