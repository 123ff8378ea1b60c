package nspb

import "container/heap"

// ReplyGate is the frontend's release rule: a reply is released only when
// every stateful model in its lineage is durable at least up to the seq the
// lineage names for it.
//
// Invariant: Hold and Durable release a request at most once, and only when
// durable[m] >= deps[m] for all m in its deps.
type ReplyGate struct {
	durable map[string]uint64
	waiting map[string]*waitHeap
	// missing counts, per held request, the models it still waits for.
	missing map[uint64]int
}

// NewReplyGate returns an empty gate.
func NewReplyGate() *ReplyGate {
	return &ReplyGate{durable: map[string]uint64{}, waiting: map[string]*waitHeap{}, missing: map[uint64]int{}}
}

// Hold registers request reqID with its dependencies (stateful model -> seq
// in its lineage). It reports whether the reply may leave at once.
func (g *ReplyGate) Hold(reqID uint64, deps map[string]uint64) (release bool) {
	n := 0
	for m, s := range deps {
		if g.durable[m] >= s {
			continue
		}
		h := g.waiting[m]
		if h == nil {
			h = &waitHeap{}
			g.waiting[m] = h
		}
		heap.Push(h, wait{seq: s, req: reqID})
		n++
	}
	if n == 0 {
		return true
	}
	g.missing[reqID] = n
	return false
}

// Durable records model's durable seq and returns the requests it releases.
func (g *ReplyGate) Durable(model string, seq uint64) (released []uint64) {
	if seq <= g.durable[model] {
		return nil
	}
	g.durable[model] = seq
	h := g.waiting[model]
	for h != nil && h.Len() > 0 && (*h)[0].seq <= seq {
		w := heap.Pop(h).(wait)
		n, ok := g.missing[w.req]
		if !ok {
			continue // dropped
		}
		if n == 1 {
			delete(g.missing, w.req)
			released = append(released, w.req)
		} else {
			g.missing[w.req] = n - 1
		}
	}
	return released
}

// Drop forgets a held request (deadline expired, client gone). Its heap
// entries are skipped lazily.
func (g *ReplyGate) Drop(reqID uint64) { delete(g.missing, reqID) }

// Held is the number of requests waiting.
func (g *ReplyGate) Held() int { return len(g.missing) }

// DurableSeq is the durable seq known for model.
func (g *ReplyGate) DurableSeq(model string) uint64 { return g.durable[model] }

type wait struct {
	seq uint64
	req uint64
}

type waitHeap []wait

func (h waitHeap) Len() int           { return len(h) }
func (h waitHeap) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h waitHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *waitHeap) Push(x any)        { *h = append(*h, x.(wait)) }
func (h *waitHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
