package reference

import (
	"bytes"
	"context"
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// State writes go through the write region once the server's description
// offers it (whole and partial writes, the server reading the region);
// ranges that do not fit the region, and a write after the server lost
// the region (a restart), go inline and land all the same; the next write
// registers a new region.
func TestStateWritesThroughRegion(t *testing.T) {
	_, cc := refBackendConn(t)
	rec := &lastChunkConn{ClientConnInterface: cc}
	b := New(rec, "seq", 0)
	b.write.retryEvery = 0
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()
	if _, err := b.Describe(ctx); err != nil {
		t.Fatal(err)
	}
	ts, v, err := b.ReadState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	specs := make([]*hamsv1.TensorSpec, len(ts))
	var state []byte
	for i, x := range ts {
		specs[i] = &hamsv1.TensorSpec{Name: x.Name, Datatype: x.Datatype, Shape: x.Shape}
		state = append(state, x.Data...)
	}
	wantState := func(what string, version uint64) {
		t.Helper()
		got, gv, err := b.ReadState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var all []byte
		for _, x := range got {
			all = append(all, x.Data...)
		}
		if gv != version || !bytes.Equal(all, state) {
			t.Fatalf("%s: version %d (want %d), state as written: %v", what, gv, version, bytes.Equal(all, state))
		}
	}
	wantRegion := func(what string, region bool) {
		t.Helper()
		first := rec.firstChunk()
		if got := first.GetRegion() != ""; got != region {
			t.Fatalf("%s: the write's region %q, want one: %v", what, first.GetRegion(), region)
		}
	}
	patch := func(ranges []*hamsv1.StateRange) {
		for _, r := range ranges {
			copy(state[r.Offset:], r.Data)
		}
	}
	ranges := []*hamsv1.StateRange{{Offset: 8, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}}, {Offset: 256, Data: bytes.Repeat([]byte{9}, 64)}}

	if err := b.WriteStateRanges(ctx, specs, v, v+1, ranges); err != nil {
		t.Fatal(err)
	}
	patch(ranges)
	wantRegion("partial", true)
	wantState("partial", v+1)
	if b.write.name != "hams_write_seq" || !b.write.inUse {
		t.Fatalf("write region %q, in use %v", b.write.name, b.write.inUse)
	}

	for i := range state {
		state[i] = byte(i * 3)
	}
	whole := make([]*hamsv1.Tensor, len(ts))
	off := 0
	for i, x := range ts {
		whole[i] = &hamsv1.Tensor{Name: x.Name, Datatype: x.Datatype, Shape: x.Shape, Data: state[off : off+len(x.Data)]}
		off += len(x.Data)
	}
	if err := b.WriteState(ctx, whole, 20); err != nil {
		t.Fatal(err)
	}
	wantRegion("whole", true)
	wantState("whole", 20)

	// Two ranges of the whole state each: more than the region holds.
	big := []*hamsv1.StateRange{{Offset: 0, Data: bytes.Repeat([]byte{1}, len(state))}, {Offset: 0, Data: bytes.Repeat([]byte{2}, len(state))}}
	if err := b.WriteStateRanges(ctx, specs, 20, 21, big); err != nil {
		t.Fatal(err)
	}
	patch(big)
	wantRegion("overlapping ranges", false)
	wantState("overlapping ranges", 21)

	// The server loses the region: this write goes inline, the next one
	// through a new region.
	if _, err := inference.NewGRPCInferenceServiceClient(cc).SystemSharedMemoryUnregister(ctx, &inference.SystemSharedMemoryUnregisterRequest{Name: "hams_write_seq"}); err != nil {
		t.Fatal(err)
	}
	if err := b.WriteStateRanges(ctx, specs, 21, 22, ranges); err != nil {
		t.Fatalf("write after the server lost the region: %v", err)
	}
	patch(ranges)
	wantRegion("after the region was lost", false)
	wantState("after the region was lost", 22)
	if b.write.m != nil {
		t.Fatal("the region the server lost is still lent")
	}
	if err := b.WriteStateRanges(ctx, specs, 22, 23, ranges); err != nil {
		t.Fatal(err)
	}
	wantRegion("next write", true)
	wantState("next write", 23)
}
