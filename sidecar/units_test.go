package sidecar

import (
	"reflect"
	"sort"
	"testing"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protocol/lineage"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func le(pred string, ps uint64, m string, s uint64) *hamsv1.LineageEntry {
	return &hamsv1.LineageEntry{PredModel: pred, PredSeq: ps, Model: m, Seq: s}
}

func TestPredSeq(t *testing.T) {
	cases := []struct {
		name string
		it   *hamsv1.Item
		want uint64
	}{
		{"frontend edge uses req_id, not the renumbered edge_seq", &hamsv1.Item{FromModel: config.Frontend, EdgeSeq: 7, ReqId: 12}, 12},
		{"last entry of sender", &hamsv1.Item{FromModel: "b", EdgeSeq: 99, Lineage: []*hamsv1.LineageEntry{
			le("frontend", 1, "a", 3), le("a", 3, "b", 5), le("x", 1, "b", 6), le("b", 6, "c", 2)}}, 6},
		{"sender absent", &hamsv1.Item{FromModel: "z", Lineage: []*hamsv1.LineageEntry{le("frontend", 1, "a", 3)}}, 0},
	}
	for _, c := range cases {
		if got := PredSeq(c.it); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

func TestLineageChain(t *testing.T) {
	l := NewLineage("b", 0, 0)
	out := []*hamsv1.Tensor{tensor.FromFloat32("y", []int64{1, 1}, []float32{1})}
	in1 := &hamsv1.Item{FromModel: "a", Lineage: []*hamsv1.LineageEntry{le("frontend", 4, "a", 2)}}
	in2 := &hamsv1.Item{FromModel: "a", Lineage: []*hamsv1.LineageEntry{le("frontend", 3, "a", 1)}}
	seqs, lins := l.RecordBatch([][]*hamsv1.Item{{in1}, {in2}}, [][]*hamsv1.Tensor{out, out})
	if seqs[0] != 1 || seqs[1] != 2 || l.Seq() != 2 {
		t.Fatalf("seqs %v", seqs)
	}
	if len(lins[0]) != 2 || !sameEntry(lins[0][1], le("a", 2, "b", 1)) || !sameEntry(lins[0][0], in1.Lineage[0]) {
		t.Fatalf("lineage 0: %v", lins[0])
	}
	if !sameEntry(lins[1][1], le("a", 1, "b", 2)) {
		t.Fatalf("lineage 1: %v", lins[1])
	}
	if lins[0][1].OutputDigest != tensor.Digest(out...) {
		t.Fatalf("digest %s, want %s", lins[0][1].OutputDigest, tensor.Digest(out...))
	}
	// Appending to one lineage must not overwrite the next one's entries.
	_ = append(lins[0], le("x", 0, "y", 0))
	if !sameEntry(lins[1][0], in2.Lineage[0]) {
		t.Fatal("lineages share backing storage")
	}
	// Seqs continue across batches.
	seqs, _ = l.RecordBatch([][]*hamsv1.Item{{in1}}, [][]*hamsv1.Tensor{out})
	if seqs[0] != 3 {
		t.Fatalf("third seq %d", seqs[0])
	}
}

func TestLineageJoinMergesWithoutDuplicates(t *testing.T) {
	// frontend -> a -> {b, c} -> d: b's and c's lineages share a's entry
	// (decoded separately, so equal but not identical pointers).
	fromB := &hamsv1.Item{FromModel: "b", Lineage: []*hamsv1.LineageEntry{le("frontend", 9, "a", 5), le("a", 5, "b", 4)}}
	fromC := &hamsv1.Item{FromModel: "c", Lineage: []*hamsv1.LineageEntry{le("frontend", 9, "a", 5), le("a", 5, "c", 8)}}
	fromF := &hamsv1.Item{FromModel: config.Frontend, EdgeSeq: 3, ReqId: 12}
	l := NewLineage("d", 10, 0)
	seqs, lins := l.RecordBatch([][]*hamsv1.Item{{fromB, fromC, fromF}}, [][]*hamsv1.Tensor{nil})
	if seqs[0] != 11 {
		t.Fatalf("seq %d", seqs[0])
	}
	want := []*hamsv1.LineageEntry{
		le("frontend", 9, "a", 5), le("a", 5, "b", 4), le("a", 5, "c", 8),
		le("b", 4, "d", 11), le("c", 8, "d", 11), le("frontend", 12, "d", 11),
	}
	if len(lins[0]) != len(want) {
		t.Fatalf("lineage %v", lins[0])
	}
	for i := range want {
		if !sameEntry(lins[0][i], want[i]) {
			t.Fatalf("entry %d: %v, want %v", i, lins[0][i], want[i])
		}
	}
}

// The flow an execLog keeps as requests are added is the one rebuilt from
// its records, across compaction and truncation (summaries read it
// instead of rebuilding it under the index's lock).
func TestExecLogFlowKeptIncrementally(t *testing.T) {
	l := newExecLog()
	rebuilt := func() *lineage.Flow {
		f := l.base.Clone()
		for _, r := range l.recs {
			f.Add(r.lin)
		}
		return f
	}
	same := func(what string) {
		t.Helper()
		a, am := l.all.Export()
		b, bm := rebuilt().Export()
		sortPairs := func(p []lineage.PairState) {
			sort.Slice(p, func(i, j int) bool { return p[i].From+">"+p[i].To < p[j].From+">"+p[j].To })
		}
		sortPairs(a)
		sortPairs(b)
		if !reflect.DeepEqual(a, b) || !reflect.DeepEqual(am, bm) {
			t.Fatalf("%s: kept flow %v %v, rebuilt %v %v", what, a, am, b, bm)
		}
	}
	n := uint64(maxExecLog + maxExecLog/2)
	for seq := uint64(1); seq <= n; seq++ {
		l.add(execRec{seq: seq, lin: []*hamsv1.LineageEntry{
			{PredModel: "frontend", Model: "a", PredSeq: seq, Seq: seq},
			{PredModel: "a", Model: "b", PredSeq: seq, Seq: seq},
		}})
	}
	same("after compaction")
	l.truncate(n - 10)
	same("after truncation")
	if got := l.all.MaxSeq("b"); got != n-10 {
		t.Fatalf("max seq of b after truncating at %d: %d", n-10, got)
	}
	l.truncate(n) // nothing above: unchanged
	same("after an empty truncation")
}

// BenchmarkExecLogFlow: what a summary of a full exec log costs, rebuilt
// from the records as it was (rebuild) and read from the kept flow (kept).
func BenchmarkExecLogFlow(b *testing.B) {
	l := newExecLog()
	for seq := uint64(1); seq <= maxExecLog; seq++ {
		l.add(execRec{seq: seq, lin: []*hamsv1.LineageEntry{
			{PredModel: "frontend", Model: "a", PredSeq: seq, Seq: seq},
			{PredModel: "a", Model: "b", PredSeq: seq, Seq: seq},
			{PredModel: "a", Model: "c", PredSeq: seq, Seq: seq},
			{PredModel: "b", Model: "d", PredSeq: seq, Seq: seq},
			{PredModel: "c", Model: "d", PredSeq: seq, Seq: seq},
		}})
	}
	b.Run("rebuild", func(b *testing.B) {
		for b.Loop() {
			f := l.base.Clone()
			for _, r := range l.recs {
				f.Add(r.lin)
			}
			_ = f.MaxSeq("d")
		}
	})
	b.Run("kept", func(b *testing.B) {
		for b.Loop() {
			_ = l.all.MaxSeq("d")
		}
	})
}
