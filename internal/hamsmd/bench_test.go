package hamsmd

import (
	"context"
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func BenchmarkAppendOutgoing(b *testing.B) {
	c := []*hamsv1.CallLineage{{ReqId: 12345, Service: "fashion", StreamId: "12345", Model: "fashion",
		Lineage: []*hamsv1.LineageEntry{{PredModel: "frontend", PredSeq: 12345, Model: "prep", Seq: 99}}}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_ = AppendOutgoing(ctx, c, DefaultBudget)
	}
}
