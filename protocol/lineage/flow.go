// Package lineage summarises sets of request lineages (the lineages the
// HAMS paper's Algorithm 1 records) for recovery: per graph edge U->V, the
// seqs of U whose output reached V (kept as a contiguous prefix plus the
// seqs above it), and per model the highest seq named. Sidecars and the
// frontend answer GetLineageSummary from it (paper IV-E). Pure, in the
// vocabulary of package protocol (a Flow's Step records Observed and
// PairObserved events and returns no action); callers lock.
package lineage

import (
	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// maxAbove bounds the seqs a seqSet holds beyond its contiguous prefix;
// beyond it the largest are forgotten (the prefix then only grows more
// slowly: forgetting is conservative).
const maxAbove = 1 << 14

// seqSet is a set of seqs summarised as its contiguous prefix from 1 plus
// the seqs above it.
type seqSet struct {
	contig uint64
	above  map[uint64]struct{}
}

func (t *seqSet) add(x uint64) {
	switch {
	case x <= t.contig:
	case x == t.contig+1:
		t.contig++
		for len(t.above) > 0 {
			if _, ok := t.above[t.contig+1]; !ok {
				break
			}
			delete(t.above, t.contig+1)
			t.contig++
		}
	default:
		if t.above == nil {
			t.above = map[uint64]struct{}{}
		}
		t.above[x] = struct{}{}
		if len(t.above) > maxAbove {
			var hi uint64
			for k := range t.above {
				hi = max(hi, k)
			}
			delete(t.above, hi)
		}
	}
}

func (t *seqSet) clone() *seqSet {
	c := &seqSet{contig: t.contig}
	if len(t.above) > 0 {
		c.above = make(map[uint64]struct{}, len(t.above))
		for k := range t.above {
			c.above[k] = struct{}{}
		}
	}
	return c
}

type pairKey struct{ u, v string }

// Flow is the summary of a set of lineages.
type Flow struct {
	pairs  map[pairKey]*seqSet
	maxSeq map[string]uint64
}

// NewFlow returns an empty summary.
func NewFlow() *Flow {
	return &Flow{pairs: map[pairKey]*seqSet{}, maxSeq: map[string]uint64{}}
}

// Add records every entry of one lineage.
func (f *Flow) Add(lin []*hamsv1.LineageEntry) {
	for _, e := range lin {
		f.AddPair(e.GetPredModel(), e.GetModel(), e.GetPredSeq())
		if e.GetSeq() > f.maxSeq[e.GetModel()] {
			f.maxSeq[e.GetModel()] = e.GetSeq()
		}
	}
}

// AddPair records that seq of u reached v.
func (f *Flow) AddPair(u, v string, seq uint64) {
	k := pairKey{u, v}
	t := f.pairs[k]
	if t == nil {
		t = &seqSet{}
		f.pairs[k] = t
	}
	t.add(seq)
}

// Contig is the contiguous prefix of u's seqs that reached v.
func (f *Flow) Contig(u, v string) uint64 {
	if t := f.pairs[pairKey{u, v}]; t != nil {
		return t.contig
	}
	return 0
}

// MaxSeq is the highest seq of model named.
func (f *Flow) MaxSeq(model string) uint64 { return f.maxSeq[model] }

// Clone is a deep copy.
func (f *Flow) Clone() *Flow {
	c := NewFlow()
	for k, t := range f.pairs {
		c.pairs[k] = t.clone()
	}
	for k, v := range f.maxSeq {
		c.maxSeq[k] = v
	}
	return c
}

// Prefixes is max_in_by_pred for target: for every model U upstream of
// target (the frontend included), the smallest contiguous prefix of U over
// the graph edges U->V with V target or upstream of it (a U seq reaches
// target along every such edge).
func (f *Flow) Prefixes(g *config.Graph, target string) map[string]uint64 {
	anc := ancestors(g, target)
	out := map[string]uint64{}
	for u := range anc {
		first := true
		var v uint64
		for _, succ := range g.Succ(u) {
			if succ != target && !anc[succ] {
				continue
			}
			if c := f.Contig(u, succ); first || c < v {
				v, first = c, false
			}
		}
		out[u] = v
	}
	return out
}

// ancestors of m in g (the frontend included when it feeds them).
func ancestors(g *config.Graph, m string) map[string]bool {
	out := map[string]bool{}
	todo := []string{m}
	for len(todo) > 0 {
		x := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		for _, p := range g.Pred(x) {
			if !out[p] {
				out[p] = true
				if p != config.Frontend {
					todo = append(todo, p)
				}
			}
		}
	}
	return out
}
