package edge

import (
	"errors"
	"fmt"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Sentinel errors of the package.
var (
	// ErrTooFarAhead: an item's edge_seq is beyond max_in_order+maxPending;
	// the receiver does not buffer it (the sender resends after reconnect).
	ErrTooFarAhead = errors.New("edge: item too far ahead of max_in_order")
	// ErrZeroSeq: an item carries no edge_seq (they are dense from 1).
	ErrZeroSeq = errors.New("edge: item without edge_seq")
)

// DefaultMaxPending bounds the out-of-order items a Reorder holds.
const DefaultMaxPending = 4096

// Reorder is a per-edge reorder buffer with duplicate drop. It is a pure
// state machine (no goroutines, no clock, not safe for concurrent use).
//
// Invariants: every item with edge_seq <= maxInOrder has been released
// exactly once; pending holds only items with maxInOrder+1 < edge_seq <=
// maxInOrder+maxPending, one per edge_seq.
type Reorder struct {
	maxPending int
	maxInOrder uint64
	pending    map[uint64]*hamsv1.Item
}

// NewReorder creates a Reorder buffering at most maxPending items ahead of
// max_in_order (DefaultMaxPending if maxPending <= 0).
func NewReorder(maxPending int) *Reorder {
	if maxPending <= 0 {
		maxPending = DefaultMaxPending
	}
	return &Reorder{maxPending: maxPending}
}

// MaxInOrder is the highest edge_seq up to which every item was released.
func (r *Reorder) MaxInOrder() uint64 { return r.maxInOrder }

// Pending is the number of buffered out-of-order items.
func (r *Reorder) Pending() int { return len(r.pending) }

// Restore sets max_in_order (recovery: a restarted receiver resumes an edge
// whose items up to n are already accounted for) and drops pending items at
// or below it.
func (r *Reorder) Restore(n uint64) {
	r.maxInOrder = n
	for s := range r.pending {
		if s <= n {
			delete(r.pending, s)
		}
	}
}

// Offer takes one item and returns the items now released in edge_seq order
// (possibly none). A duplicate is dropped without error.
func (r *Reorder) Offer(it *hamsv1.Item) (ready []*hamsv1.Item, err error) {
	return r.Append(nil, it)
}

// Append is Offer that appends the released items to dst (no allocation on
// the in-order path when dst has room).
func (r *Reorder) Append(dst []*hamsv1.Item, it *hamsv1.Item) ([]*hamsv1.Item, error) {
	s := it.GetEdgeSeq()
	switch {
	case s == 0:
		return dst, ErrZeroSeq
	case s <= r.maxInOrder:
		return dst, nil // duplicate of a released item
	case s == r.maxInOrder+1:
		dst = append(dst, it)
		r.maxInOrder = s
		for len(r.pending) > 0 {
			next, ok := r.pending[r.maxInOrder+1]
			if !ok {
				break
			}
			delete(r.pending, r.maxInOrder+1)
			dst = append(dst, next)
			r.maxInOrder++
		}
		return dst, nil
	case s-r.maxInOrder > uint64(r.maxPending):
		return dst, fmt.Errorf("%w: edge_seq %d, max_in_order %d, bound %d", ErrTooFarAhead, s, r.maxInOrder, r.maxPending)
	}
	if r.pending == nil {
		r.pending = make(map[uint64]*hamsv1.Item)
	}
	if _, dup := r.pending[s]; !dup {
		r.pending[s] = it
	}
	return dst, nil
}
