package datapath

import "time"

// Batcher groups requests into batches of at most size, letting a partial
// batch wait at most maxWait after its first request arrived. It is a pure
// state machine (no goroutines, time passed in); the caller asks Ready only
// when the backend is free, so one batch is in flight at a time.
//
// Invariant: q holds the waiting requests in arrival order; since[i] is
// when q[i] was added.
type Batcher[T any] struct {
	size    int
	maxWait time.Duration
	q       []T
	since   []time.Time
}

// NewBatcher creates a Batcher (size < 1 means 1).
func NewBatcher[T any](size int, maxWait time.Duration) *Batcher[T] {
	if size < 1 {
		size = 1
	}
	if maxWait < 0 {
		maxWait = 0
	}
	return &Batcher[T]{size: size, maxWait: maxWait}
}

// Add queues one request arrived at now.
func (b *Batcher[T]) Add(r T, now time.Time) {
	b.q = append(b.q, r)
	b.since = append(b.since, now)
}

// Len is the number of queued requests.
func (b *Batcher[T]) Len() int { return len(b.q) }

// Ready returns the next batch if one is due at now: a full batch, or a
// partial one whose oldest request waited maxWait. Otherwise nil.
func (b *Batcher[T]) Ready(now time.Time) []T {
	n := len(b.q)
	if n == 0 {
		return nil
	}
	if n < b.size && now.Before(b.since[0].Add(b.maxWait)) {
		return nil
	}
	n = min(n, b.size)
	out := make([]T, n)
	copy(out, b.q[:n])
	var zero T
	for i := 0; i < n; i++ {
		b.q[i] = zero
	}
	b.q = b.q[n:]
	b.since = b.since[n:]
	if len(b.q) == 0 {
		b.q, b.since = b.q[:0], b.since[:0]
	}
	return out
}

// NextDeadline is when a partial batch becomes due (zero time when the
// queue is empty; a full batch is due at once).
func (b *Batcher[T]) NextDeadline() time.Time {
	if len(b.q) == 0 {
		return time.Time{}
	}
	if len(b.q) >= b.size {
		return b.since[0]
	}
	return b.since[0].Add(b.maxWait)
}
