package sidecar

import (
	"sort"
	"sync"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// OutputLog keeps the outputs a stateful primary released (the items as
// sent, one per out-edge) until the frontend's completion notices say
// their requests left the graph, so a failed downstream model can be fed
// again (paper IV-D, "saved outputs"). Safe for concurrent use.
//
// Invariants (under mu): bytes is the sum of the sizes of the entries;
// Full reports bytes >= limit. Add never refuses an entry (the caller
// stops starting batches while Full, so the log overshoots by at most the
// batches already computed); entries leave only by Complete.
type OutputLog struct {
	mu      sync.Mutex
	limit   int64
	bytes   int64
	items   int
	entries map[uint64][]logEntry
	space   chan struct{} // closed and replaced when Complete frees bytes
}

type logEntry struct {
	items []*hamsv1.Item
	bytes int64
}

// NewOutputLog creates a log bounded by limit bytes of tensor data.
func NewOutputLog(limit int64) *OutputLog {
	return &OutputLog{limit: limit, entries: map[uint64][]logEntry{}, space: make(chan struct{})}
}

// ItemsBytes is the tensor data size of items, counting a tensor shared
// between fan-out copies once.
func ItemsBytes(items []*hamsv1.Item) int64 {
	var n int64
	var seen map[*hamsv1.Tensor]bool
	for i, it := range items {
		for _, t := range it.GetTensors() {
			if i > 0 {
				if seen == nil {
					seen = map[*hamsv1.Tensor]bool{}
					for _, t0 := range items[0].GetTensors() {
						seen[t0] = true
					}
				}
				if seen[t] {
					continue
				}
			}
			n += int64(len(t.GetData()))
		}
	}
	return n
}

// Add keeps the items released for request reqID (a request executed
// twice, as with interleaved fan-in, has two entries).
func (l *OutputLog) Add(reqID uint64, items []*hamsv1.Item) {
	b := ItemsBytes(items)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries[reqID] = append(l.entries[reqID], logEntry{items: items, bytes: b})
	l.bytes += b
	l.items += len(items)
}

// Complete drops the entries of reqIDs and reports how many requests it
// dropped.
func (l *OutputLog) Complete(reqIDs []uint64) (dropped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range reqIDs {
		es, ok := l.entries[id]
		if !ok {
			continue
		}
		for _, e := range es {
			l.bytes -= e.bytes
			l.items -= len(e.items)
		}
		delete(l.entries, id)
		dropped++
	}
	if dropped > 0 {
		close(l.space)
		l.space = make(chan struct{})
	}
	return dropped
}

// Full reports whether the log reached its bound, and a channel closed
// when entries are dropped.
func (l *OutputLog) Full() (bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytes >= l.limit, l.space
}

// Get returns the items kept for reqID (nil when none).
func (l *OutputLog) Get(reqID uint64) [][]*hamsv1.Item {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out [][]*hamsv1.Item
	for _, e := range l.entries[reqID] {
		out = append(out, e.items)
	}
	return out
}

// Stats returns the requests, items and bytes kept.
func (l *OutputLog) Stats() (requests, items int, bytes int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries), l.items, l.bytes
}

// Reset drops every entry (a demoted primary's log).
func (l *OutputLog) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.entries)
	l.bytes, l.items = 0, 0
	close(l.space)
	l.space = make(chan struct{})
}

// DropAfter drops the entries whose items carry a seq of model above seq
// (outputs a rollback discards).
func (l *OutputLog) DropAfter(model string, seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, es := range l.entries {
		kept := es[:0]
		for _, e := range es {
			if len(e.items) > 0 && seqOf(e.items[0], model) > seq {
				l.bytes -= e.bytes
				l.items -= len(e.items)
				continue
			}
			kept = append(kept, e)
		}
		if len(kept) == 0 {
			delete(l.entries, id)
		} else {
			l.entries[id] = kept
		}
	}
	close(l.space)
	l.space = make(chan struct{})
}

// ForEdge returns the items kept for out-edge i of n, ordered by model's
// seq: an entry released by this primary holds one item per edge, one
// applied by a backup a single item for all.
func (l *OutputLog) ForEdge(model string, i, n int) []*hamsv1.Item {
	l.mu.Lock()
	var out []*hamsv1.Item
	for _, es := range l.entries {
		for _, e := range es {
			switch {
			case len(e.items) == n:
				out = append(out, e.items[i])
			case len(e.items) == 1:
				out = append(out, e.items[0])
			}
		}
	}
	l.mu.Unlock()
	sort.Slice(out, func(a, b int) bool { return seqOf(out[a], model) < seqOf(out[b], model) })
	return out
}

// seqOf is model's seq in the item's lineage (0 if none).
func seqOf(it *hamsv1.Item, model string) uint64 {
	lin := it.GetLineage()
	for i := len(lin) - 1; i >= 0; i-- {
		if lin[i].GetModel() == model {
			return lin[i].GetSeq()
		}
	}
	return 0
}
