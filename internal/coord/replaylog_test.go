package coord

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/testing/natstest"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func openReplay(t *testing.T, adjust ...func(*server.Options)) *Replay {
	t.Helper()
	nc := natstest.Connect(t, adjust...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Open(ctx, nc, "rp-1", 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.OpenReplay(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func logged(model string, epoch, batch uint64, payload int) *hamsv1.ReplayBatch {
	return &hamsv1.ReplayBatch{Model: model, Epoch: epoch, BatchId: batch, FirstSeq: batch*2 - 1,
		Request: &hamsv1.BatchRequest{Model: model, BatchId: batch, Rows: []uint32{1, 1},
			Inputs: []*hamsv1.Tensor{{Name: "x", Datatype: "UINT8", Shape: []int64{2, int64(payload / 2)}, Data: bytes.Repeat([]byte{byte(batch)}, payload)}}},
		Requests: []*hamsv1.ReplayRequest{{ReqId: batch * 10}, {ReqId: batch*10 + 1}}}
}

// The input log keeps records per model in order, reads back what is after
// a batch, survives a retried publish once, chunks records over the max
// payload, and Trim drops what a checkpoint covers.
func TestReplayLogAppendReadTrim(t *testing.T) {
	r := openReplay(t, func(o *server.Options) { o.MaxPayload = 64 << 10 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var bs []*hamsv1.ReplayBatch
	for b := uint64(1); b <= 6; b++ {
		size := 64
		if b == 4 {
			size = 200 << 10 // over the max payload: chunked
		}
		bs = append(bs, logged("m", 1, b, size))
	}
	seqs, err := r.Append(ctx, bs)
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) != 6 {
		t.Fatalf("seqs %v", seqs)
	}
	if _, err := r.Append(ctx, bs[5:]); err != nil { // a retry: deduplicated
		t.Fatal(err)
	}
	if _, err := r.Append(ctx, []*hamsv1.ReplayBatch{logged("other", 1, 1, 8)}); err != nil {
		t.Fatal(err)
	}
	got, err := r.Batches(ctx, "m", 2)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, b := range got {
		ids = append(ids, b.GetBatchId())
	}
	if len(ids) != 4 || ids[0] != 3 || ids[3] != 6 {
		t.Fatalf("batches after 2: %v", ids)
	}
	if len(got[1].GetRequest().GetInputs()[0].GetData()) != 200<<10 || got[1].GetRequests()[1].GetReqId() != 41 {
		t.Fatalf("chunked record read back wrong: %d bytes", len(got[1].GetRequest().GetInputs()[0].GetData()))
	}
	if err := r.Trim(ctx, "m", seqs[3]); err != nil {
		t.Fatal(err)
	}
	got, err = r.Batches(ctx, "m", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].GetBatchId() != 5 {
		t.Fatalf("after trim: %d records, first %d", len(got), got[0].GetBatchId())
	}
	if o, err := r.Batches(ctx, "other", 0); err != nil || len(o) != 1 {
		t.Fatalf("other model's log: %d records, %v", len(o), err)
	}
	if err := r.Reset(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Batches(ctx, "m", 0); err != nil || len(got) != 0 {
		t.Fatalf("after reset: %d records, %v", len(got), err)
	}
}

// Checkpoints: the newest epoch's wins, saving deletes older epochs', the
// state round-trips and is verified, and Reset forgets them.
func TestReplayCheckpoints(t *testing.T) {
	r := openReplay(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := r.LoadCheckpoint(ctx, "m"); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty store: %v", err)
	}
	state := func(v float32) []*hamsv1.Tensor {
		big := make([]float32, 300_000) // over one object chunk
		for i := range big {
			big[i] = v + float32(i)
		}
		return []*hamsv1.Tensor{tensor.FromFloat32("h", []int64{2, 2}, []float32{v, v, v, v}), tensor.FromFloat32("w", []int64{300_000}, big)}
	}
	save := func(epoch, batch uint64, v float32) {
		t.Helper()
		ck := &hamsv1.ReplayCheckpoint{Model: "m", Epoch: epoch, BatchId: batch, Seq: batch * 8,
			Records: []*hamsv1.ReplayRecord{{Seq: batch * 8, InputDigest: "in", OutputDigest: "out"}}}
		if err := r.SaveCheckpoint(ctx, ck, state(v)); err != nil {
			t.Fatal(err)
		}
	}
	save(2, 10, 1)
	save(1, 20, 2) // a deposed instance of an older epoch: does not win
	ck, st, err := r.LoadCheckpoint(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	if ck.GetEpoch() != 2 || ck.GetBatchId() != 10 || tensor.Digest(st...) != tensor.Digest(state(1)...) || ck.GetStateDigest() != tensor.Digest(st...) {
		t.Fatalf("loaded epoch %d batch %d", ck.GetEpoch(), ck.GetBatchId())
	}
	if len(ck.GetRecords()) != 1 || st[1].GetShape()[0] != 300_000 {
		t.Fatalf("checkpoint content %v", ck.GetRecords())
	}
	save(3, 30, 3)
	objs, err := r.checkpoints(ctx, "m")
	if err != nil || len(objs) != 1 || objs[0].epoch != 3 {
		t.Fatalf("older epochs not deleted: %v %v", objs, err)
	}
	if err := r.Reset(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.LoadCheckpoint(ctx, "m"); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("after reset: %v", err)
	}
}
