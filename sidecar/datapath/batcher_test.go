package datapath

import (
	"testing"
	"time"
)

func TestBatcher(t *testing.T) {
	t0 := time.Unix(0, 0)
	b := NewBatcher[int](3, 10*time.Millisecond)
	if b.Ready(t0) != nil || !b.NextDeadline().IsZero() {
		t.Fatal("empty batcher ready")
	}
	b.Add(1, t0)
	b.Add(2, t0.Add(time.Millisecond))
	if b.Ready(t0.Add(9*time.Millisecond)) != nil {
		t.Fatal("partial batch released before max wait")
	}
	if got := b.NextDeadline(); !got.Equal(t0.Add(10 * time.Millisecond)) {
		t.Fatalf("deadline %v", got)
	}
	got := b.Ready(t0.Add(10 * time.Millisecond))
	if len(got) != 2 || got[0] != 1 || got[1] != 2 || b.Len() != 0 {
		t.Fatalf("partial batch %v", got)
	}
	for i := 1; i <= 7; i++ {
		b.Add(i, t0.Add(20*time.Millisecond))
	}
	if got := b.NextDeadline(); !got.Equal(t0.Add(20 * time.Millisecond)) {
		t.Fatalf("full batch deadline %v", got)
	}
	if got := b.Ready(t0.Add(20 * time.Millisecond)); len(got) != 3 || got[0] != 1 {
		t.Fatalf("full batch %v", got)
	}
	if got := b.Ready(t0.Add(20 * time.Millisecond)); len(got) != 3 || got[0] != 4 {
		t.Fatalf("second full batch %v", got)
	}
	if got := b.Ready(t0.Add(29 * time.Millisecond)); got != nil {
		t.Fatalf("remainder released early %v", got)
	}
	if got := b.Ready(t0.Add(30 * time.Millisecond)); len(got) != 1 || got[0] != 7 {
		t.Fatalf("remainder %v", got)
	}
	// max wait 0: whatever is there goes as soon as asked.
	z := NewBatcher[int](0, 0)
	z.Add(1, t0)
	z.Add(2, t0)
	if got := z.Ready(t0); len(got) != 1 {
		t.Fatalf("size<1 means 1: %v", got)
	}
}
