package sidecar

import (
	"sort"
	"sync"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// maxAbove bounds the seqs a seqSet holds beyond its contiguous prefix;
// beyond it the largest are forgotten (the prefix then only grows more
// slowly: forgetting is conservative).
const maxAbove = 1 << 14

// maxExecLog bounds the executed requests an execLog keeps individually.
const maxExecLog = edge.DefaultDedupWindow

// seqSet is the set of seqs of one model seen so far, summarised as its
// contiguous prefix from 1 plus the seqs above it.
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

// flowIndex summarises a set of lineages: per graph edge U->V, the seqs of
// U (pred_seq) whose output reached V; per model, the highest seq named.
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

func (f *flowIndex) clone() *flowIndex {
	c := newFlowIndex()
	for k, t := range f.pairs {
		c.pairs[k] = t.clone()
	}
	for k, v := range f.maxSeq {
		c.maxSeq[k] = v
	}
	return c
}

// prefixes computes max_in_by_pred for target: for every model U upstream
// of target (the frontend included), the smallest contiguous prefix of U
// over the graph edges U->V with V target or upstream of it (a U seq
// reaches target along every such edge).
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

// execRec is one request a model executed (primary) or whose snapshot it
// applied (backup).
type execRec struct {
	seq  uint64
	lin  []*hamsv1.LineageEntry // output lineage (the model's entries last)
	keys []fromKey              // dedup keys of the items that formed it
}

type fromKey struct {
	from string
	key  uint64
}

// execLog is the lineage of the requests the model's state covers, in seq
// order: a flow index of the requests forgotten (beyond maxExecLog) plus
// the recent ones individually, so a rollback or promotion can cut it at
// a seq and reseed the receiver's duplicate filter.
type execLog struct {
	base *flowIndex
	recs []execRec
}

func newExecLog() *execLog { return &execLog{base: newFlowIndex()} }

func (l *execLog) add(r execRec) {
	l.recs = append(l.recs, r)
	if len(l.recs) > maxExecLog {
		n := len(l.recs) / 4
		for _, old := range l.recs[:n] {
			l.base.add(old.lin)
		}
		clear(l.recs[:n])
		l.recs = append(l.recs[:0:0], l.recs[n:]...)
	}
}

// truncate forgets the requests with seq above seq.
func (l *execLog) truncate(seq uint64) {
	i := sort.Search(len(l.recs), func(i int) bool { return l.recs[i].seq > seq })
	clear(l.recs[i:])
	l.recs = l.recs[:i]
}

// flow is the flow index of everything logged.
func (l *execLog) flow() *flowIndex {
	f := l.base.clone()
	for _, r := range l.recs {
		f.add(r.lin)
	}
	return f
}

// keys groups the remembered dedup keys per inbound edge.
func (l *execLog) keys() map[string][]uint64 {
	out := map[string][]uint64{}
	for _, r := range l.recs {
		for _, k := range r.keys {
			out[k.from] = append(out[k.from], k.key)
		}
	}
	return out
}

// lineageIndex is what a sidecar knows for GetLineageSummary: the lineage
// of the items it received (recv) and of the requests its state covers
// (exec). Safe for concurrent use.
type lineageIndex struct {
	mu      sync.Mutex
	recv    *flowIndex
	exec    *execLog
	lastSeq uint64 // highest seq of this model covered by exec
}

func newLineageIndex() *lineageIndex {
	return &lineageIndex{recv: newFlowIndex(), exec: newExecLog()}
}

func (x *lineageIndex) received(items []*hamsv1.Item) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, it := range items {
		x.recv.add(it.GetLineage())
	}
}

func (x *lineageIndex) executed(recs []execRec) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, r := range recs {
		x.exec.add(r)
		x.lastSeq = max(x.lastSeq, r.seq)
	}
}

// cut keeps only the requests up to seq (rollback, promotion) and makes
// the received view equal to the executed one; it returns the dedup keys
// to seed the receiver with.
func (x *lineageIndex) cut(seq uint64) map[string][]uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.exec.truncate(seq)
	x.lastSeq = seq
	x.recv = x.exec.flow()
	return x.exec.keys()
}

// reset forgets everything (demotion).
func (x *lineageIndex) reset() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.recv, x.exec, x.lastSeq = newFlowIndex(), newExecLog(), 0
}

// summary answers LineageSummaryRequest for model self in graph g. A
// backup (fromState) answers every question from the requests its state
// covers; a serving instance answers max_out and max_in about F from what
// it received.
func (x *lineageIndex) summary(g *config.Graph, self, failed string, failedMax uint64, fromState bool) *hamsv1.LineageSummary {
	x.mu.Lock()
	defer x.mu.Unlock()
	ex := x.exec.flow()
	if failed == "" {
		return &hamsv1.LineageSummary{Model: self, MaxOutSeq: x.lastSeq, MaxInByPred: ex.prefixes(g, self)}
	}
	view := x.recv
	if fromState {
		view = ex
	}
	return &hamsv1.LineageSummary{
		Model:          self,
		MaxOutSeq:      view.maxSeq[failed],
		MaxInByPred:    view.prefixes(g, failed),
		ConsumedBeyond: ex.maxSeq[failed] > failedMax,
	}
}

// recordsOf builds execRecs from applied snapshot records: the dedup key
// of each part is recomputed from the ancestor closure of the sender's
// entry in the merged lineage.
func recordsOf(model string, reqs []*hamsv1.RequestRecord, stateful func(string) bool) []execRec {
	out := make([]execRec, 0, len(reqs))
	for _, rq := range reqs {
		r := execRec{seq: rq.GetSeq(), lin: rq.GetLineage()}
		for _, e := range rq.GetLineage() {
			if e.GetModel() != model || e.GetSeq() != rq.GetSeq() {
				continue
			}
			var part []*hamsv1.LineageEntry
			if e.GetPredModel() != config.Frontend {
				part = edge.Closure(rq.GetLineage(), e.GetPredModel(), e.GetPredSeq())
			}
			r.keys = append(r.keys, fromKey{e.GetPredModel(), edge.DedupKey(rq.GetReqId(), part, stateful)})
		}
		out = append(out, r)
	}
	return out
}
