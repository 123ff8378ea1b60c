package lineage

import (
	"reflect"
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func TestExportImportRoundTrip(t *testing.T) {
	f := NewFlow()
	for _, s := range []uint64{1, 2, 3, 7, 9} {
		f.Add([]*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: s, Model: "a", Seq: s}, {PredModel: "a", PredSeq: s, Model: "b", Seq: s + 100}})
	}
	pairs, mx := f.Export()
	want := []PairState{
		{From: "a", To: "b", Contig: 3, Above: []uint64{7, 9}},
		{From: "frontend", To: "a", Contig: 3, Above: []uint64{7, 9}},
	}
	if !reflect.DeepEqual(pairs, want) || mx["a"] != 9 || mx["b"] != 109 {
		t.Fatalf("export %+v %v", pairs, mx)
	}
	g := Import(pairs, mx)
	g.AddPair("a", "b", 4)
	if g.Contig("a", "b") != 4 || f.Contig("a", "b") != 3 || g.MaxSeq("b") != 109 {
		t.Fatalf("import: contig %d (orig %d) max %d", g.Contig("a", "b"), f.Contig("a", "b"), g.MaxSeq("b"))
	}
	for _, s := range []uint64{5, 6, 8} {
		g.AddPair("a", "b", s)
	}
	if g.Contig("a", "b") != 9 {
		t.Fatalf("imported above-set not kept: contig %d", g.Contig("a", "b"))
	}
}
