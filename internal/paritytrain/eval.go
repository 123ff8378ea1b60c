package paritytrain

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/hams-go/hams/protocol/parity"
	"github.com/hams-go/hams/refserver/nn"
)

// Score is how well parity models reconstruct a deployed model's outputs
// over coding groups of a labelled set, with the serving path's encoder
// and decoder (protocol/parity).
type Score struct {
	K, R int
	// Erased is the number of data outputs erased at once (every such
	// pattern of every group is simulated); Parities lists the parity
	// models used (the decoder takes the first Erased of them).
	Erased   int
	Parities []int
	Groups   int
	// Aa is the deployed model's top-1 accuracy over the labelled
	// samples of the set.
	Aa float64
	// Ad (degraded mode) is the top-1 accuracy of the reconstructions
	// against the true labels; NaN when the set has no labels.
	Ad float64
	// Agreement is the fraction of reconstructions whose top-1 is the
	// deployed model's top-1 for the same query.
	Agreement float64
	// Reconstructions is the number of reconstructed outputs scored.
	Reconstructions int
}

// Ao is the overall accuracy when a fraction f of the deployed model's
// outputs is unavailable: (1-f)·Aa + f·Ad (paper section 5.1).
func (s Score) Ao(f float64) float64 { return (1-f)*s.Aa + f*s.Ad }

// String formats the score for logs.
func (s Score) String() string {
	return fmt.Sprintf("k=%d r=%d erased=%d parities=%v groups=%d Aa=%.4f Ad=%.4f agreement=%.4f", s.K, s.R, s.Erased, s.Parities, s.Groups, s.Aa, s.Ad, s.Agreement)
}

// ForwardRows runs net over x [rows, InSize] on up to workers goroutines
// (chunks of rows; each row's result does not depend on the chunking, so
// the output is deterministic).
func ForwardRows(net *nn.Net, x []float32, rows, workers int) []float32 {
	out := make([]float32, rows*net.OutSize())
	in, w := net.InSize(), net.OutSize()
	const chunk = 128
	nChunks := (rows + chunk - 1) / chunk
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = max(1, min(workers, nChunks))
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tape := net.NewTape(chunk)
			for c := g; c < nChunks; c += workers {
				lo, hi := c*chunk, min((c+1)*chunk, rows)
				y := net.ForwardTrain(tape, x[lo*in:hi*in], hi-lo)
				copy(out[lo*w:hi*w], y)
			}
		}()
	}
	wg.Wait()
	if net.Softmax {
		nn.Softmax(out, rows, w)
	}
	return out
}

// EncodeGroups builds parity query j of every group [len(groups), size]
// with enc.
func EncodeGroups(enc parity.Encoder, set *Set, groups [][]int, j int) ([]float32, error) {
	size := enc.QuerySize()
	p := make([]float32, len(groups)*size)
	var queries [][]float32
	for g, idx := range groups {
		queries = queries[:0]
		for _, i := range idx {
			queries = append(queries, set.Q(i))
		}
		if err := enc.Encode(p[g*size:(g+1)*size], queries, j); err != nil {
			return nil, fmt.Errorf("paritytrain: encode group %d: %w", g, err)
		}
	}
	return p, nil
}

// ParityOutputs runs parity model nets[j] over parity query j of every
// group; a nil net gives a nil entry (that parity is unavailable).
func ParityOutputs(nets []*nn.Net, enc parity.Encoder, set *Set, groups [][]int, workers int) ([][]float32, error) {
	outs := make([][]float32, len(nets))
	for j, net := range nets {
		if net == nil {
			continue
		}
		if net.InSize() != enc.QuerySize() || net.OutSize() != set.OutSize {
			return nil, fmt.Errorf("paritytrain: parity model %d maps %d values to %d; queries have %d and outputs %d", j, net.InSize(), net.OutSize(), enc.QuerySize(), set.OutSize)
		}
		p, err := EncodeGroups(enc, set, groups, j)
		if err != nil {
			return nil, err
		}
		outs[j] = ForwardRows(net, p, len(groups), workers)
	}
	return outs, nil
}

// Reconstruct scores parity outputs pouts (pouts[j] [len(groups), width]
// for parity j, nil when unavailable) of code over set: for every group
// and every set of `erased` positions, the erased outputs are
// reconstructed by the serving decoder (parity.Decoder) from the other
// outputs and the first `erased` available parities.
func Reconstruct(code parity.Code, set *Set, groups [][]int, pouts [][]float32, erased int) (Score, error) {
	s := Score{K: code.K, R: code.R, Erased: erased, Groups: len(groups)}
	for j, p := range pouts {
		if p != nil {
			s.Parities = append(s.Parities, j)
		}
	}
	if len(pouts) != code.R {
		return s, fmt.Errorf("paritytrain: %d parity outputs for r=%d", len(pouts), code.R)
	}
	if erased < 1 || erased > code.K || erased > len(s.Parities) {
		return s, fmt.Errorf("paritytrain: %d erased outputs with k=%d and %d parities", erased, code.K, len(s.Parities))
	}
	w := set.OutSize
	labelled, right := 0, 0
	for i := range set.N {
		if l := set.Label[i]; l >= 0 {
			labelled++
			if argmax(set.O(i)) == l {
				right++
			}
		}
	}
	s.Aa = math.NaN()
	if labelled > 0 {
		s.Aa = float64(right) / float64(labelled)
	}
	dec := parity.NewDecoder(code)
	outputs := make([][]float32, code.K)
	parities := make([][]float32, code.R)
	dst := make([][]float32, erased)
	for i := range dst {
		dst[i] = make([]float32, w)
	}
	pos := make([]int, erased) // the erased positions, increasing
	adRight, adTotal, agree := 0, 0, 0
	for g, idx := range groups {
		if len(idx) != code.K {
			return s, fmt.Errorf("paritytrain: group %d has %d samples, k=%d", g, len(idx), code.K)
		}
		for j, p := range pouts {
			parities[j] = nil
			if p != nil {
				parities[j] = p[g*w : (g+1)*w]
			}
		}
		for i := range pos {
			pos[i] = i
		}
		for {
			for i, id := range idx {
				outputs[i] = set.O(id)
			}
			for _, e := range pos {
				outputs[e] = nil
			}
			if err := dec.Reconstruct(dst, outputs, parities); err != nil {
				return s, fmt.Errorf("paritytrain: reconstruct group %d: %w", g, err)
			}
			for b, e := range pos {
				id := idx[e]
				top := argmax(dst[b])
				if top == argmax(set.O(id)) {
					agree++
				}
				if l := set.Label[id]; l >= 0 {
					adTotal++
					if top == l {
						adRight++
					}
				}
				s.Reconstructions++
			}
			if !nextCombination(pos, code.K) {
				break
			}
		}
	}
	s.Ad = math.NaN()
	if adTotal > 0 {
		s.Ad = float64(adRight) / float64(adTotal)
	}
	if s.Reconstructions > 0 {
		s.Agreement = float64(agree) / float64(s.Reconstructions)
	}
	return s, nil
}

// nextCombination advances pos (increasing indices below n) to the next
// combination in lexicographic order; false after the last.
func nextCombination(pos []int, n int) bool {
	m := len(pos)
	for i := m - 1; i >= 0; i-- {
		if pos[i] < n-m+i {
			pos[i]++
			for j := i + 1; j < m; j++ {
				pos[j] = pos[j-1] + 1
			}
			return true
		}
	}
	return false
}

// EvaluateSingle scores parity model net as parity j of spec alone: every
// position of every group erased in turn and reconstructed from parity j
// only (the other parities unavailable).
func EvaluateSingle(spec Spec, net *nn.Net, set *Set, groups [][]int, workers int) (Score, error) {
	code, err := spec.Code()
	if err != nil {
		return Score{}, err
	}
	enc, err := spec.NewEncoder()
	if err != nil {
		return Score{}, err
	}
	nets := make([]*nn.Net, code.R)
	nets[spec.J] = net
	pouts, err := ParityOutputs(nets, enc, set, groups, workers)
	if err != nil {
		return Score{}, err
	}
	return Reconstruct(code, set, groups, pouts, 1)
}
