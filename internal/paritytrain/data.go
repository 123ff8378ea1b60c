package paritytrain

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/hams-go/hams/refserver/nn"
)

// Sample is one query of the deployed model and what it answered: the
// unit a parity model is trained from, whatever the source (a dataset
// labelled offline, a black-box server, live traffic).
type Sample struct {
	// Query is the deployed model's input row.
	Query []float32
	// Output is the deployed model's output row for Query, F(Query).
	Output []float32
	// Label is the true class, or -1 when unknown (black-box or live
	// samples): degraded accuracy is then not measured, agreement is.
	Label int
}

// Set is a fixed collection of samples stored contiguously. Invariant:
// len(Query) == N·QuerySize, len(Output) == N·OutSize, len(Label) == N.
type Set struct {
	QuerySize, OutSize int
	N                  int
	Query, Output      []float32
	Label              []int
}

// NewSet returns an empty set of the given row widths.
func NewSet(querySize, outSize int) *Set {
	return &Set{QuerySize: querySize, OutSize: outSize}
}

// Add appends a sample; its widths must be the set's.
func (s *Set) Add(x Sample) error {
	if len(x.Query) != s.QuerySize || len(x.Output) != s.OutSize {
		return fmt.Errorf("paritytrain: add sample: query of %d and output of %d values, the set holds %d and %d", len(x.Query), len(x.Output), s.QuerySize, s.OutSize)
	}
	s.Query = append(s.Query, x.Query...)
	s.Output = append(s.Output, x.Output...)
	s.Label = append(s.Label, x.Label)
	s.N++
	return nil
}

// FromArrays wraps row-major arrays (not copied) as a set: queries
// [n,querySize], outputs [n,outSize], labels [n] (nil: all unknown).
func FromArrays(query []float32, querySize int, output []float32, outSize int, labels []int) (*Set, error) {
	if querySize <= 0 || outSize <= 0 || len(query)%querySize != 0 {
		return nil, fmt.Errorf("paritytrain: set: %d query values are not rows of %d", len(query), querySize)
	}
	n := len(query) / querySize
	if len(output) != n*outSize {
		return nil, fmt.Errorf("paritytrain: set: %d output values for %d rows of %d", len(output), n, outSize)
	}
	if labels == nil {
		labels = make([]int, n)
		for i := range labels {
			labels[i] = -1
		}
	}
	if len(labels) != n {
		return nil, fmt.Errorf("paritytrain: set: %d labels for %d rows", len(labels), n)
	}
	return &Set{QuerySize: querySize, OutSize: outSize, N: n, Query: query, Output: output, Label: labels}, nil
}

// Q is query i; O is output i (aliases).
func (s *Set) Q(i int) []float32 { return s.Query[i*s.QuerySize : (i+1)*s.QuerySize] }
func (s *Set) O(i int) []float32 { return s.Output[i*s.OutSize : (i+1)*s.OutSize] }

// Subset copies the samples at idx into a new set.
func (s *Set) Subset(idx []int) *Set {
	out := &Set{QuerySize: s.QuerySize, OutSize: s.OutSize, N: len(idx),
		Query: make([]float32, 0, len(idx)*s.QuerySize), Output: make([]float32, 0, len(idx)*s.OutSize), Label: make([]int, 0, len(idx))}
	for _, i := range idx {
		out.Query = append(out.Query, s.Q(i)...)
		out.Output = append(out.Output, s.O(i)...)
		out.Label = append(out.Label, s.Label[i])
	}
	return out
}

// Split holds out a seeded random n samples for validation: it returns
// (training, validation) copies.
func (s *Set) Split(n int, seed uint64) (*Set, *Set, error) {
	if n <= 0 || n >= s.N {
		return nil, nil, fmt.Errorf("paritytrain: split: %d validation samples of %d", n, s.N)
	}
	perm := nn.NewRand(seed ^ 0x5eed).Perm(s.N)
	return s.Subset(perm[n:]), s.Subset(perm[:n]), nil
}

// Groups cuts a seeded permutation of 0..n-1 into n/k coding groups of k
// indices (the n mod k left over are in no group). The same function as
// refserver/models.ParityGroups, so the evaluation groups of a
// seed are the ones the reference models report.
func Groups(n, k int, rng *rand.Rand) [][]int {
	if k <= 0 || n < k {
		return nil
	}
	perm := rng.Perm(n)
	groups := make([][]int, n/k)
	for g := range groups {
		groups[g] = perm[g*k : (g+1)*k : (g+1)*k]
	}
	return groups
}

// Buffer keeps a bounded, uniform sample of a stream of samples
// (reservoir sampling): memory is capacity rows whatever the length of
// the stream. It is safe for concurrent use (online training adds from
// the serving path while a trainer snapshots).
type Buffer struct {
	mu   sync.Mutex
	set  *Set // invariant: set.N <= capacity
	cap  int
	seen int64
	rng  *rand.Rand
}

// NewBuffer returns an empty buffer of capacity samples of the given
// widths, seeded for reproducible replacement.
func NewBuffer(capacity, querySize, outSize int, seed uint64) (*Buffer, error) {
	if capacity < 1 || querySize < 1 || outSize < 1 {
		return nil, fmt.Errorf("paritytrain: buffer: capacity %d, query size %d, output size %d must be positive", capacity, querySize, outSize)
	}
	return &Buffer{set: NewSet(querySize, outSize), cap: capacity, rng: nn.NewRand(seed)}, nil
}

// Add offers one sample; it is kept with probability capacity/seen.
func (b *Buffer) Add(x Sample) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(x.Query) != b.set.QuerySize || len(x.Output) != b.set.OutSize {
		return fmt.Errorf("paritytrain: buffer: sample of %d and %d values, the buffer holds %d and %d (did the deployed model change its output shape?)",
			len(x.Query), len(x.Output), b.set.QuerySize, b.set.OutSize)
	}
	b.seen++
	if b.set.N < b.cap {
		return b.set.Add(x)
	}
	if j := b.rng.Int64N(b.seen); j < int64(b.cap) {
		i := int(j)
		copy(b.set.Q(i), x.Query)
		copy(b.set.O(i), x.Output)
		b.set.Label[i] = x.Label
	}
	return nil
}

// Len is the number of samples held; Seen the number offered.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.set.N
}

func (b *Buffer) Seen() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seen
}

// Snapshot copies the samples held (for a training round).
func (b *Buffer) Snapshot() *Set {
	b.mu.Lock()
	defer b.mu.Unlock()
	all := make([]int, b.set.N)
	for i := range all {
		all[i] = i
	}
	return b.set.Subset(all)
}

// Deployed is the deployed model seen as a black box: Infer answers the
// outputs [rows, width] of queries x [rows, in].
type Deployed interface {
	Infer(ctx context.Context, x []float32, rows int) (out []float32, width int, err error)
}

// Label runs every query of x [n, in] through d in batches of batch rows
// and returns the outputs [n, width]. Every batch must answer rows of
// the first batch's width: a model that changes its output shape part
// way is an error naming the batch.
func Label(ctx context.Context, d Deployed, x []float32, in, batch int, progress func(done, total int)) ([]float32, int, error) {
	if in <= 0 || len(x)%in != 0 || batch <= 0 {
		return nil, 0, fmt.Errorf("paritytrain: label: %d values in rows of %d, batches of %d", len(x), in, batch)
	}
	n := len(x) / in
	var out []float32
	width := -1
	for lo := 0; lo < n; lo += batch {
		hi := min(lo+batch, n)
		y, w, err := d.Infer(ctx, x[lo*in:hi*in], hi-lo)
		if err != nil {
			return nil, 0, fmt.Errorf("paritytrain: label rows %d..%d: %w", lo, hi-1, err)
		}
		if w <= 0 || len(y) != (hi-lo)*w {
			return nil, 0, fmt.Errorf("paritytrain: label rows %d..%d: the deployed model answered %d values for %d rows of width %d", lo, hi-1, len(y), hi-lo, w)
		}
		if width < 0 {
			width = w
			out = make([]float32, 0, n*w)
		} else if w != width {
			return nil, 0, fmt.Errorf("paritytrain: label rows %d..%d: the deployed model answered rows of %d values, earlier batches %d: its output shape changed", lo, hi-1, w, width)
		}
		out = append(out, y...)
		if progress != nil {
			progress(hi, n)
		}
	}
	return out, width, nil
}
