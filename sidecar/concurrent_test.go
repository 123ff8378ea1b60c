package sidecar

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// slowPool is a ConcurrentBackend standing in for a replica pool: batches
// run at once and finish out of order (a seeded delay each); a batch whose
// first value is 7 comes back marked approximate, as a reconstruction.
type slowPool struct {
	fakeBackend
	slots    int
	inFlight atomic.Int32
	maxSeen  atomic.Int32
	seed     atomic.Uint64
}

func (p *slowPool) Concurrency() int { return p.slots }

func (p *slowPool) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	n := p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	for {
		m := p.maxSeen.Load()
		if n <= m || p.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	rng := rand.New(rand.NewPCG(p.seed.Add(1), 3))
	select {
	case <-time.After(time.Duration(rng.IntN(3000)) * time.Microsecond):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	resp, err := p.fakeBackend.Infer(ctx, req)
	if err != nil {
		return nil, err
	}
	if req.Inputs[0].GetData() != nil && len(req.Rows) == 1 {
		first := req.Inputs[0].GetData()[0:4]
		if first[0] == 0 && first[1] == 0 && first[2] == 0xe0 && first[3] == 0x40 { // float32 7 little-endian
			resp.Approximate = []bool{true}
		}
	}
	return resp, nil
}

const poolGraph = `
name: t
mode: bare
models:
  - {name: a, kind: fake, batch: {size: 1}}
  - {name: b, kind: fake, batch: {size: 1}}
services:
  - name: s
    edges: [[frontend, a], [a, b], [b, frontend]]
`

// A concurrent backend runs several batches at once; they finish out of
// order, yet each request gets exactly one output and one seq, seqs are
// dense, and an approximate output stays marked downstream (b computed
// from it).
func TestConcurrentBackendOutOfOrder(t *testing.T) {
	pa := &slowPool{fakeBackend: fakeBackend{inputs: []string{"x"}, bias: 1}, slots: 4}
	fb := &fakeBackend{inputs: []string{"out"}}
	h := startGraph(t, poolGraph, map[string]Backend{"a": pa, "b": fb})
	defer h.stop()
	const n = 200
	for id := uint64(1); id <= n; id++ {
		h.senders["a"].Send(&hamsv1.Item{ReqId: id, Service: "s", Tensors: []*hamsv1.Tensor{row(float32(id%10), 4)}})
	}
	waitFor(t, "all replies", func() bool { return h.sink.count() >= n })
	if pa.maxSeen.Load() < 2 {
		t.Fatalf("at most %d batches ran at once on a backend of concurrency 4", pa.maxSeen.Load())
	}
	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	seqs := map[uint64]bool{}
	for id := uint64(1); id <= n; id++ {
		got := h.sink.items[id]
		if len(got) != 1 {
			t.Fatalf("req %d arrived %d times", id, len(got))
		}
		it := got[0]
		if want := id%10 == 7; it.GetApproximate() != want {
			t.Errorf("req %d: approximate %v, want %v", id, it.GetApproximate(), want)
		}
		for _, e := range it.GetLineage() {
			if e.GetModel() == "a" {
				if seqs[e.GetSeq()] {
					t.Fatalf("seq %d of a given twice", e.GetSeq())
				}
				seqs[e.GetSeq()] = true
			}
		}
	}
	for s := uint64(1); s <= n; s++ {
		if !seqs[s] {
			t.Fatalf("seq %d of a missing (seqs must be dense)", s)
		}
	}
}
