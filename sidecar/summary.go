package sidecar

import (
	"sort"
	"sync"

	"github.com/hams-go/hams/protocol/lineage"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// maxExecLog bounds the executed requests an execLog keeps individually.
const maxExecLog = edge.DefaultDedupWindow

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
	base *lineage.Flow
	recs []execRec
	// all is base plus recs, kept as requests are added and rebuilt when
	// recs are truncated, so a summary reads it instead of rebuilding it
	// from up to maxExecLog records under the index's lock (hundreds of
	// milliseconds on a loaded machine: a backup's GetLineageSummary ran
	// past the recovery's query timeout, and the backup was given up as
	// dead with its primary, 2026-11-26 soak).
	all *lineage.Flow
}

func newExecLog() *execLog { return &execLog{base: lineage.NewFlow(), all: lineage.NewFlow()} }

func (l *execLog) add(r execRec) {
	l.recs = append(l.recs, r)
	l.all.Add(r.lin)
	if len(l.recs) > maxExecLog {
		n := len(l.recs) / 4
		for _, old := range l.recs[:n] {
			l.base.Add(old.lin)
		}
		clear(l.recs[:n])
		l.recs = append(l.recs[:0:0], l.recs[n:]...)
	}
}

// truncate forgets the requests with seq above seq.
func (l *execLog) truncate(seq uint64) {
	i := sort.Search(len(l.recs), func(i int) bool { return l.recs[i].seq > seq })
	if i == len(l.recs) {
		return
	}
	clear(l.recs[i:])
	l.recs = l.recs[:i]
	l.all = l.base.Clone()
	for _, r := range l.recs {
		l.all.Add(r.lin)
	}
}

// flow is a copy of the flow index of everything logged.
func (l *execLog) flow() *lineage.Flow { return l.all.Clone() }

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
	recv    *lineage.Flow
	exec    *execLog
	lastSeq uint64 // highest seq of this model covered by exec
}

func newLineageIndex() *lineageIndex {
	return &lineageIndex{recv: lineage.NewFlow(), exec: newExecLog()}
}

func (x *lineageIndex) received(items []*hamsv1.Item) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, it := range items {
		x.recv.Add(it.GetLineage())
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
	x.recv, x.exec, x.lastSeq = lineage.NewFlow(), newExecLog(), 0
}

// summary answers LineageSummaryRequest for model self in graph g. A
// backup (fromState) answers every question from the requests its state
// covers; a serving instance answers max_out and max_in about F from what
// it received.
func (x *lineageIndex) summary(g *config.Graph, self, failed string, failedMax uint64, fromState bool) *hamsv1.LineageSummary {
	x.mu.Lock()
	defer x.mu.Unlock()
	ex := x.exec.all // read only, under mu
	if failed == "" {
		return &hamsv1.LineageSummary{Model: self, MaxOutSeq: x.lastSeq, MaxInByPred: ex.Prefixes(g, self)}
	}
	view := x.recv
	if fromState {
		view = ex
	}
	return &hamsv1.LineageSummary{
		Model:          self,
		MaxOutSeq:      view.MaxSeq(failed),
		MaxInByPred:    view.Prefixes(g, failed),
		ConsumedBeyond: ex.MaxSeq(failed) > failedMax,
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
