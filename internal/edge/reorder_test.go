package edge

import (
	"errors"
	"testing"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func item(seq uint64) *hamsv1.Item { return &hamsv1.Item{EdgeSeq: seq, ReqId: seq * 10} }

func seqs(items []*hamsv1.Item) []uint64 {
	out := make([]uint64, len(items))
	for i, it := range items {
		out[i] = it.EdgeSeq
	}
	return out
}

func eq(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestReorder(t *testing.T) {
	type step struct {
		seq     uint64
		want    []uint64
		wantErr error
		max     uint64
	}
	cases := []struct {
		name  string
		bound int
		steps []step
	}{
		{"in order", 8, []step{{1, []uint64{1}, nil, 1}, {2, []uint64{2}, nil, 2}, {3, []uint64{3}, nil, 3}}},
		{"out of order", 8, []step{{3, nil, nil, 0}, {2, nil, nil, 0}, {1, []uint64{1, 2, 3}, nil, 3}, {4, []uint64{4}, nil, 4}}},
		{"duplicates released", 8, []step{{1, []uint64{1}, nil, 1}, {1, nil, nil, 1}, {2, []uint64{2}, nil, 2}, {1, nil, nil, 2}}},
		{"duplicates pending", 8, []step{{3, nil, nil, 0}, {3, nil, nil, 0}, {1, []uint64{1}, nil, 1}, {2, []uint64{2, 3}, nil, 3}, {3, nil, nil, 3}}},
		{"gap stays", 8, []step{{1, []uint64{1}, nil, 1}, {3, nil, nil, 1}, {5, nil, nil, 1}, {2, []uint64{2, 3}, nil, 3}, {4, []uint64{4, 5}, nil, 5}}},
		{"bound", 3, []step{{3, nil, nil, 0}, {4, nil, ErrTooFarAhead, 0}, {1, []uint64{1}, nil, 1}, {4, nil, nil, 1}, {2, []uint64{2, 3, 4}, nil, 4}}},
		{"zero seq", 3, []step{{0, nil, ErrZeroSeq, 0}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := NewReorder(c.bound)
			for i, s := range c.steps {
				got, err := r.Offer(item(s.seq))
				if !errors.Is(err, s.wantErr) || (s.wantErr == nil && err != nil) {
					t.Fatalf("step %d (seq %d): err %v, want %v", i, s.seq, err, s.wantErr)
				}
				if !eq(seqs(got), s.want) {
					t.Fatalf("step %d (seq %d): released %v, want %v", i, s.seq, seqs(got), s.want)
				}
				if r.MaxInOrder() != s.max {
					t.Fatalf("step %d: max_in_order %d, want %d", i, r.MaxInOrder(), s.max)
				}
			}
		})
	}
}

func TestReorderPendingBounded(t *testing.T) {
	r := NewReorder(16)
	for s := uint64(2); s < 100; s++ {
		_, _ = r.Offer(item(s))
	}
	if r.Pending() > 15 {
		t.Fatalf("pending %d exceeds bound", r.Pending())
	}
	got, err := r.Offer(item(1))
	if err != nil || !eq(seqs(got), []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}) {
		t.Fatalf("released %v err %v", seqs(got), err)
	}
	if r.Pending() != 0 {
		t.Fatalf("pending %d after release", r.Pending())
	}
}

func TestReorderRestore(t *testing.T) {
	r := NewReorder(0)
	_, _ = r.Offer(item(5))
	_, _ = r.Offer(item(9))
	r.Restore(6)
	if r.Pending() != 1 || r.MaxInOrder() != 6 {
		t.Fatalf("after restore pending %d max %d", r.Pending(), r.MaxInOrder())
	}
	if got, _ := r.Offer(item(5)); len(got) != 0 {
		t.Fatal("released a restored-over item")
	}
	got, _ := r.Offer(item(7))
	if !eq(seqs(got), []uint64{7}) {
		t.Fatalf("released %v", seqs(got))
	}
}

func TestReorderPermutationsExactlyOnce(t *testing.T) {
	// Every arrival order with duplicates releases 1..n exactly once, in order.
	orders := [][]uint64{
		{5, 4, 3, 2, 1}, {2, 1, 2, 1, 3, 5, 4, 5}, {1, 3, 5, 2, 4, 4, 3, 1},
	}
	for _, o := range orders {
		r := NewReorder(8)
		var all []uint64
		for _, s := range o {
			got, err := r.Offer(item(s))
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, seqs(got)...)
		}
		if !eq(all, []uint64{1, 2, 3, 4, 5}) {
			t.Fatalf("order %v released %v", o, all)
		}
	}
}
