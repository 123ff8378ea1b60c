package frontend

import (
	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// maxAbove bounds the seqs a seqSet holds beyond its contiguous prefix;
// beyond it the largest are forgotten (conservative: the prefix then grows
// more slowly).
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

type pairKey struct{ u, v string }

// flowIndex summarises the lineage of the sink items the frontend
// received (it answers GetLineageSummary as the successor of the sink
// models): per graph edge U->V the seqs of U whose output reached V, and
// per model the highest seq named. Pure; the caller locks.
type flowIndex struct {
	pairs  map[pairKey]*seqSet
	maxSeq map[string]uint64
}

func newFlowIndex() *flowIndex {
	return &flowIndex{pairs: map[pairKey]*seqSet{}, maxSeq: map[string]uint64{}}
}

func (f *flowIndex) add(lin []*hamsv1.LineageEntry) {
	for _, e := range lin {
		k := pairKey{e.GetPredModel(), e.GetModel()}
		t := f.pairs[k]
		if t == nil {
			t = &seqSet{}
			f.pairs[k] = t
		}
		t.add(e.GetPredSeq())
		if e.GetSeq() > f.maxSeq[e.GetModel()] {
			f.maxSeq[e.GetModel()] = e.GetSeq()
		}
	}
}

// addSink records that sink model from delivered its item to the frontend:
// the pair from -> frontend gets from's seq in the item's lineage.
func (f *flowIndex) addSink(from string, lin []*hamsv1.LineageEntry) {
	var seq uint64
	for _, e := range lin {
		if e.GetModel() == from {
			seq = max(seq, e.GetSeq())
		}
	}
	if seq == 0 {
		return
	}
	k := pairKey{from, config.Frontend}
	t := f.pairs[k]
	if t == nil {
		t = &seqSet{}
		f.pairs[k] = t
	}
	t.add(seq)
}

// prefixes is max_in_by_pred for target: for every model U upstream of
// target (the frontend included), the smallest contiguous prefix of U over
// the graph edges U->V with V target or upstream of it.
func (f *flowIndex) prefixes(g *config.Graph, target string) map[string]uint64 {
	anc := ancestors(g, target)
	out := map[string]uint64{}
	for u := range anc {
		first := true
		var v uint64
		for _, succ := range g.Succ(u) {
			if succ != target && !anc[succ] {
				continue
			}
			var c uint64
			if t := f.pairs[pairKey{u, succ}]; t != nil {
				c = t.contig
			}
			if first || c < v {
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

// maxOrphans bounds the sink items kept for requests that are not pending.
const maxOrphans = 4096

// orphans keeps the most recent sink items that arrived for a request not
// in the table: items resent to a frontend that is about to take over a
// request (it injects the request after the items arrive), or re-executed
// items that overtook the rollback of the held reply they replace. Bounded
// FIFO; pure.
type orphans struct {
	byID map[uint64][]orphan
	fifo []uint64
}

type orphan struct {
	from string
	it   *hamsv1.Item
}

func newOrphans() *orphans { return &orphans{byID: map[uint64][]orphan{}} }

func (o *orphans) add(from string, it *hamsv1.Item) {
	o.byID[it.GetReqId()] = append(o.byID[it.GetReqId()], orphan{from, it})
	o.fifo = append(o.fifo, it.GetReqId())
	for len(o.fifo) > maxOrphans {
		id := o.fifo[0]
		o.fifo = o.fifo[1:]
		if l := o.byID[id]; len(l) > 1 {
			o.byID[id] = l[1:]
		} else {
			delete(o.byID, id)
		}
	}
}

// take removes and returns the items kept for reqID, oldest first.
func (o *orphans) take(reqID uint64) []orphan {
	l := o.byID[reqID]
	delete(o.byID, reqID)
	return l
}
