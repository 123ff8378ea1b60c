package lineage

import "sort"

// PairState is the persisted form of one graph edge of a Flow: the seqs of
// From whose output reached To, as a contiguous prefix plus the seqs
// above it (sorted).
type PairState struct {
	From, To string
	Contig   uint64
	Above    []uint64
}

// Export returns f's edges (sorted by From, To) and its per-model maximum
// seqs, so a Flow can be stored (replay mode's checkpoints) and rebuilt
// with Import.
func (f *Flow) Export() (pairs []PairState, maxSeq map[string]uint64) {
	for k, t := range f.pairs {
		p := PairState{From: k.u, To: k.v, Contig: t.contig}
		for x := range t.above {
			p.Above = append(p.Above, x)
		}
		sort.Slice(p.Above, func(i, j int) bool { return p.Above[i] < p.Above[j] })
		pairs = append(pairs, p)
	}
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i].From != pairs[j].From {
			return pairs[i].From < pairs[j].From
		}
		return pairs[i].To < pairs[j].To
	})
	maxSeq = make(map[string]uint64, len(f.maxSeq))
	for m, s := range f.maxSeq {
		maxSeq[m] = s
	}
	return pairs, maxSeq
}

// Import rebuilds a Flow from Export's output. Seqs above a pair's prefix
// that continue it are folded into the prefix.
func Import(pairs []PairState, maxSeq map[string]uint64) *Flow {
	f := NewFlow()
	for _, p := range pairs {
		t := &seqSet{contig: p.Contig}
		for _, x := range p.Above {
			t.add(x)
		}
		f.pairs[pairKey{p.From, p.To}] = t
	}
	for m, s := range maxSeq {
		f.maxSeq[m] = s
	}
	return f
}
