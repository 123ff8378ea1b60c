package lineage

import (
	"testing"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// On a join (frontend -> a, frontend -> b, a -> c, b -> c) a frontend seq
// counts as reaching c only along both branches: the prefix is the smaller
// contiguous prefix, not the maximum.
func TestPrefixesTakeTheContiguousMinimumOverBranches(t *testing.T) {
	g := (&config.Service{Edges: [][2]string{{"frontend", "a"}, {"frontend", "b"}, {"a", "c"}, {"b", "c"}, {"c", "frontend"}}}).Graph()
	f := NewFlow()
	for _, s := range []uint64{1, 2, 3, 5} { // 4 missing on a's branch
		f.Add([]*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: s, Model: "a", Seq: s}, {PredModel: "a", PredSeq: s, Model: "c", Seq: s}})
	}
	for _, s := range []uint64{1, 2} {
		f.Add([]*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: s, Model: "b", Seq: s}, {PredModel: "b", PredSeq: s, Model: "c", Seq: s}})
	}
	p := f.Prefixes(g, "c")
	if p[config.Frontend] != 2 || p["a"] != 3 || p["b"] != 2 {
		t.Fatalf("prefixes %v, want frontend 2, a 3, b 2", p)
	}
	if f.MaxSeq("a") != 5 || f.Contig("a", "c") != 3 {
		t.Fatalf("max %d contig %d", f.MaxSeq("a"), f.Contig("a", "c"))
	}
	c := f.Clone()
	c.AddPair("a", "c", 4)
	if f.Contig("a", "c") != 3 || c.Contig("a", "c") != 5 {
		t.Fatalf("clone not independent: %d %d", f.Contig("a", "c"), c.Contig("a", "c"))
	}
}
