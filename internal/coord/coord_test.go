package coord

import (
	"context"
	"github.com/hams-go/hams/internal/testing/natstest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func embedded(t testing.TB) *nats.Conn { return natstest.Connect(t) }

type seen struct {
	mu sync.Mutex
	d  map[string]uint64
	n  int
}

func (s *seen) get(m string) uint64 { s.mu.Lock(); defer s.mu.Unlock(); return s.d[m] }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestDurabilityNoticesLateWatcherSeesLastPerModel(t *testing.T) {
	nc := embedded(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := Open(ctx, nc, "t-1", 1)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 5; seq++ {
		if err := c.Announce(ctx, &hamsv1.DurabilityNotice{Model: "a", DurableSeq: seq}); err != nil {
			t.Fatal(err)
		}
	}
	// A retried publish is deduplicated by its message id.
	if err := c.Announce(ctx, &hamsv1.DurabilityNotice{Model: "a", DurableSeq: 5}); err != nil {
		t.Fatal(err)
	}
	c.Announce(ctx, &hamsv1.DurabilityNotice{Model: "b", DurableSeq: 7})
	c.Announce(ctx, &hamsv1.DurabilityNotice{Model: "zz", DurableSeq: 9})

	s := &seen{d: map[string]uint64{}}
	done := make(chan error, 1)
	go func() {
		done <- c.WatchDurable(ctx, []string{"a", "b"}, func(n *hamsv1.DurabilityNotice) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.n++
			if n.DurableSeq > s.d[n.Model] {
				s.d[n.Model] = n.DurableSeq
			}
		})
	}()
	waitFor(t, "last notices", func() bool { return s.get("a") == 5 && s.get("b") == 7 })
	s.mu.Lock()
	if s.n != 2 {
		t.Errorf("late watcher got %d notices, want the last one per model (2)", s.n)
	}
	s.mu.Unlock()
	c.Announce(ctx, &hamsv1.DurabilityNotice{Model: "a", DurableSeq: 6})
	waitFor(t, "new notice", func() bool { return s.get("a") == 6 })
	if s.get("zz") != 0 {
		t.Fatal("watcher got a model it did not ask for")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestCompletionNotices(t *testing.T) {
	nc := embedded(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := Open(ctx, nc, "t2", 1)
	if err != nil {
		t.Fatal(err)
	}
	// A notice published before anyone watches is still delivered.
	if err := c.Complete(ctx, &hamsv1.CompletionNotice{Frontend: "f", ReqIds: []uint64{1000}}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []uint64
	ready := make(chan struct{})
	go func() {
		close(ready)
		c.WatchCompleted(ctx, func(n *hamsv1.CompletionNotice) {
			mu.Lock()
			got = append(got, n.ReqIds...)
			mu.Unlock()
		})
	}()
	<-ready
	// The watcher delivers only new notices; publish until it has seen one.
	next := uint64(1)
	waitFor(t, "completion", func() bool {
		c.Complete(ctx, &hamsv1.CompletionNotice{Frontend: "f", ReqIds: []uint64{next, next + 1, next + 2}})
		next += 3
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= 4
	})
	mu.Lock()
	defer mu.Unlock()
	if got[0] != 1000 {
		t.Fatalf("first completion delivered %d, want the one published before the watch (1000)", got[0])
	}
}

// A watch passes on only notices that advance their model: a newer epoch
// (even at a lower seq: a promotion from the backup's state) or a higher
// seq in the same epoch; a stale epoch's notice is dropped.
func TestDurabilityWatchDeliversOnlyAdvances(t *testing.T) {
	nc := embedded(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := Open(ctx, nc, "t-2", 1)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []*hamsv1.DurabilityNotice
	done := make(chan error, 1)
	go func() {
		done <- c.WatchDurable(ctx, []string{"a"}, func(n *hamsv1.DurabilityNotice) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, n)
		})
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(got) }
	announce := func(epoch, seq uint64) {
		if err := c.Announce(ctx, &hamsv1.DurabilityNotice{Model: "a", Epoch: epoch, DurableSeq: seq}); err != nil {
			t.Fatal(err)
		}
	}
	announce(1, 5)
	waitFor(t, "first notice", func() bool { return count() == 1 })
	announce(1, 4) // older
	announce(2, 3) // promotion at a lower seq
	waitFor(t, "the new epoch", func() bool { return count() == 2 })
	announce(1, 9) // a stale primary's
	announce(2, 6)
	waitFor(t, "epoch 2 seq 6", func() bool { return count() == 3 })
	mu.Lock()
	for i, want := range [][2]uint64{{1, 5}, {2, 3}, {2, 6}} {
		if got[i].Epoch != want[0] || got[i].DurableSeq != want[1] {
			t.Fatalf("notice %d: epoch %d seq %d, want %v", i, got[i].Epoch, got[i].DurableSeq, want)
		}
	}
	mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// LastDurable reads the newest stored notice of one model, and nil for a
// model that never had one (a model with no history can be promoted from
// an empty backup; one with history cannot).
func TestLastDurable(t *testing.T) {
	nc := embedded(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := Open(ctx, nc, "t-last", 1)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.LastDurable(ctx, "a"); err != nil || n != nil {
		t.Fatalf("LastDurable of a model with no notice = %v, %v; want nil, nil", n, err)
	}
	for _, n := range []*hamsv1.DurabilityNotice{
		{Model: "a", Epoch: 1, DurableSeq: 4},
		{Model: "b", Epoch: 1, DurableSeq: 40},
		{Model: "a", Epoch: 2, DurableSeq: 9},
	} {
		if err := c.Announce(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	n, err := c.LastDurable(ctx, "a")
	if err != nil || n.GetEpoch() != 2 || n.GetDurableSeq() != 9 {
		t.Fatalf("LastDurable(a) = %v, %v; want epoch 2 seq 9", n, err)
	}
}
