package sidecar

import (
	"errors"
	"reflect"
	"sort"
	"testing"
	"time"

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

func item(from string, req uint64) *hamsv1.Item {
	return &hamsv1.Item{FromModel: from, ReqId: req}
}

func TestJoinerJoin(t *testing.T) {
	j, err := NewJoiner([]string{"a", "b", "frontend"}, config.FanInJoin, 10)
	if err != nil {
		t.Fatal(err)
	}
	if d, _, _ := j.Add(item("b", 1)); d != nil {
		t.Fatal("completed with one part")
	}
	if d, _, _ := j.Add(item("frontend", 1)); d != nil {
		t.Fatal("completed with two parts")
	}
	if d, _, _ := j.Add(item("a", 2)); d != nil {
		t.Fatal("req 2 completed")
	}
	d, ev, err := j.Add(item("a", 1))
	if err != nil || d == nil || len(ev) != 0 || !d.Complete {
		t.Fatalf("join: %v %v %v", d, ev, err)
	}
	for i, want := range []string{"a", "b", "frontend"} {
		if d.Parts[i].FromModel != want {
			t.Fatalf("part %d from %s, want %s (pred order)", i, d.Parts[i].FromModel, want)
		}
	}
	if j.Waiting() != 1 {
		t.Fatalf("waiting %d", j.Waiting())
	}
	if _, _, err := j.Add(item("a", 2)); !errors.Is(err, ErrDupPart) {
		t.Fatalf("dup part: %v", err)
	}
	if _, _, err := j.Add(item("zzz", 2)); !errors.Is(err, ErrUnknownPred) {
		t.Fatalf("unknown pred: %v", err)
	}
}

func TestJoinerInterleaveAndSinglePred(t *testing.T) {
	j, _ := NewJoiner([]string{"a", "b"}, config.FanInInterleave, 10)
	for _, from := range []string{"a", "b", "a"} {
		d, _, err := j.Add(item(from, 1))
		if err != nil || d == nil || len(d.Parts) != 1 || d.Parts[0].FromModel != from {
			t.Fatalf("interleave: %v %v", d, err)
		}
	}
	j, _ = NewJoiner([]string{"a"}, config.FanInJoin, 10)
	if d, _, _ := j.Add(item("a", 1)); d == nil {
		t.Fatal("single predecessor join waited")
	}
}

func TestJoinerBound(t *testing.T) {
	j, _ := NewJoiner([]string{"a", "b"}, config.FanInJoin, 2)
	j.Add(item("a", 1))
	j.Add(item("a", 2))
	_, ev, _ := j.Add(item("a", 3))
	if len(ev) != 1 || ev[0].ReqID != 1 || ev[0].Complete || ev[0].Parts[0] == nil || ev[0].Parts[1] != nil {
		t.Fatalf("evicted %v", ev)
	}
	if j.Waiting() != 2 {
		t.Fatalf("waiting %d", j.Waiting())
	}
	if _, _, err := j.Add(item("b", 1)); !errors.Is(err, ErrLatePart) {
		t.Fatalf("late part: %v", err)
	}
	if d, _, _ := j.Add(item("b", 3)); d == nil {
		t.Fatal("req 3 not completed")
	}
}

func TestJoinerExpire(t *testing.T) {
	j, _ := NewJoiner([]string{"a", "b"}, config.FanInJoin, 10)
	t0 := time.Unix(1000, 0)
	mk := func(req uint64, dl time.Duration) *hamsv1.Item {
		it := item("a", req)
		if dl != 0 {
			it.DeadlineUnixNano = t0.Add(dl).UnixNano()
		}
		return it
	}
	j.Add(mk(1, 5*time.Millisecond))
	j.Add(mk(2, 0))
	j.Add(mk(3, 2*time.Millisecond))
	if got := j.NextDeadline(); !got.Equal(t0.Add(2 * time.Millisecond)) {
		t.Fatalf("next deadline %v", got)
	}
	if ex := j.Expire(t0.Add(time.Millisecond)); len(ex) != 0 {
		t.Fatalf("expired early %v", ex)
	}
	ex := j.Expire(t0.Add(2 * time.Millisecond))
	if len(ex) != 1 || ex[0].ReqID != 3 {
		t.Fatalf("expired %v", ex)
	}
	if got := j.NextDeadline(); !got.Equal(t0.Add(5 * time.Millisecond)) {
		t.Fatalf("next deadline %v", got)
	}
	ex = j.Expire(t0.Add(time.Second))
	if len(ex) != 1 || ex[0].ReqID != 1 || j.Waiting() != 1 || !j.NextDeadline().IsZero() {
		t.Fatalf("expired %v waiting %d", ex, j.Waiting())
	}
}

func TestNewJoinerRejects(t *testing.T) {
	if _, err := NewJoiner(nil, config.FanInJoin, 1); err == nil {
		t.Fatal("no preds accepted")
	}
	if _, err := NewJoiner([]string{"a"}, "zip", 1); err == nil {
		t.Fatal("bad mode accepted")
	}
}

func TestBatcher(t *testing.T) {
	t0 := time.Unix(0, 0)
	b := NewBatcher[int](3, 10*time.Millisecond)
	if b.Ready(t0) != nil || !b.NextDeadline().IsZero() {
		t.Fatal("empty batcher ready")
	}
	b.Add(1, t0)
	b.Add(2, t0.Add(time.Millisecond))
	if b.Ready(t0.Add(9*time.Millisecond)) != nil {
		t.Fatal("partial batch released before max wait")
	}
	if got := b.NextDeadline(); !got.Equal(t0.Add(10 * time.Millisecond)) {
		t.Fatalf("deadline %v", got)
	}
	got := b.Ready(t0.Add(10 * time.Millisecond))
	if len(got) != 2 || got[0] != 1 || got[1] != 2 || b.Len() != 0 {
		t.Fatalf("partial batch %v", got)
	}
	for i := 1; i <= 7; i++ {
		b.Add(i, t0.Add(20*time.Millisecond))
	}
	if got := b.NextDeadline(); !got.Equal(t0.Add(20 * time.Millisecond)) {
		t.Fatalf("full batch deadline %v", got)
	}
	if got := b.Ready(t0.Add(20 * time.Millisecond)); len(got) != 3 || got[0] != 1 {
		t.Fatalf("full batch %v", got)
	}
	if got := b.Ready(t0.Add(20 * time.Millisecond)); len(got) != 3 || got[0] != 4 {
		t.Fatalf("second full batch %v", got)
	}
	if got := b.Ready(t0.Add(29 * time.Millisecond)); got != nil {
		t.Fatalf("remainder released early %v", got)
	}
	if got := b.Ready(t0.Add(30 * time.Millisecond)); len(got) != 1 || got[0] != 7 {
		t.Fatalf("remainder %v", got)
	}
	// max wait 0: whatever is there goes as soon as asked.
	z := NewBatcher[int](0, 0)
	z.Add(1, t0)
	z.Add(2, t0)
	if got := z.Ready(t0); len(got) != 1 {
		t.Fatalf("size<1 means 1: %v", got)
	}
}

// A superseding part for a completed join (an upstream stateful model's
// re-execution after failover) re-forms the request with the other parts
// remembered, which will not come again; without RememberJoined it starts
// a new join that waits for them.
func TestJoinerRejoinsSupersedingPart(t *testing.T) {
	j, err := NewJoiner([]string{"s", "x", "y"}, config.FanInJoin, 10)
	if err != nil {
		t.Fatal(err)
	}
	j.RememberJoined(2)
	for _, p := range []string{"s", "x", "y"} {
		j.Add(item(p, 1))
	}
	again := item("s", 1)
	again.Lineage = []*hamsv1.LineageEntry{le("frontend", 1, "s", 9)}
	d, _, err := j.Add(again)
	if err != nil || d == nil || !d.Complete || d.Parts[0] != again || d.Parts[1].FromModel != "x" || d.Parts[2].FromModel != "y" {
		t.Fatalf("re-formed join: %+v %v", d, err)
	}
	if j.Waiting() != 0 {
		t.Fatalf("waiting %d after a re-join", j.Waiting())
	}
	// Bounded: the oldest completed joins are forgotten.
	for id := uint64(2); id <= 3; id++ {
		for _, p := range []string{"s", "x", "y"} {
			j.Add(item(p, id))
		}
	}
	if d, _, _ := j.Add(item("s", 1)); d != nil || j.Waiting() != 1 {
		t.Fatalf("forgotten req 1 re-formed: %v (waiting %d)", d, j.Waiting())
	}
	if d, _, _ := j.Add(item("x", 3)); d == nil || !d.Complete {
		t.Fatal("remembered req 3 not re-formed")
	}
	// Off by default.
	j2, _ := NewJoiner([]string{"s", "x"}, config.FanInJoin, 10)
	j2.Add(item("s", 1))
	j2.Add(item("x", 1))
	if d, _, _ := j2.Add(item("s", 1)); d != nil || j2.Waiting() != 1 {
		t.Fatal("re-formed without RememberJoined")
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
