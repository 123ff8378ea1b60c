package coord

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// startWatch starts a WatchDurable of model m on c; it returns the
// notices the watch delivers and stop, which ends the watch and checks
// its error.
func startWatch(t *testing.T, ctx context.Context, c *Coord) (got <-chan *hamsv1.DurabilityNotice, stop func()) {
	t.Helper()
	ch := make(chan *hamsv1.DurabilityNotice, 4)
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- c.WatchDurable(wctx, []string{"m"}, func(n *hamsv1.DurabilityNotice) { ch <- n })
	}()
	return ch, func() {
		wcancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// watchLive is startWatch, then a first (stored) notice announced and
// waited for: from then on the watch is subscribed. It returns the first
// notice too.
func watchLive(t *testing.T, ctx context.Context, c *Coord) (got <-chan *hamsv1.DurabilityNotice, first *hamsv1.DurabilityNotice, stop func()) {
	t.Helper()
	got, stop = startWatch(t, ctx, c)
	first = &hamsv1.DurabilityNotice{Model: "m", Epoch: 1, DurableSeq: 1}
	if err := c.Announce(ctx, first); err != nil {
		t.Fatal(err)
	}
	if n := <-got; !proto.Equal(n, first) {
		t.Fatalf("first notice %v", n)
	}
	return got, first, stop
}

// A live notice reaches the reply gates' watch with no durability stream
// to store it (as while the stream's raft group elects a leader), where
// Announce, waiting for the stream, fails.
func TestAnnounceLiveNeedsNoStreamLeader(t *testing.T) {
	nc := embedded(t)
	c := openT(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The watch subscribes before it reads the stream: once a first
	// notice arrives, it is live.
	got, _, stop := watchLive(t, ctx, c)
	if err := c.js.DeleteStream(ctx, DurableStream("rl")); err != nil {
		t.Fatal(err)
	}
	n := &hamsv1.DurabilityNotice{Model: "m", Epoch: 1, DurableSeq: 7, BatchId: 3}
	actx, acancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if err := c.Announce(actx, n); err == nil {
		t.Fatal("Announce succeeded with no stream to store the notice")
	}
	acancel()
	if err := c.AnnounceLive(n); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-got:
		if !proto.Equal(g, n) {
			t.Fatalf("live notice %v, want %v", g, n)
		}
	case <-ctx.Done():
		t.Fatal("the live notice never reached the watch")
	}
	stop()
}

// The persister stores the newest notice offered, retrying through
// failures; older offers are dropped; the stored copy is what a late
// watcher's catch-up read returns.
func TestNoticePersisterStoresNewest(t *testing.T) {
	nc := embedded(t)
	c := openT(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	failLeft := 3
	var stored []uint64
	p := NewNoticePersister(func(ctx context.Context, n *hamsv1.DurabilityNotice) error {
		mu.Lock()
		if failLeft > 0 {
			failLeft--
			mu.Unlock()
			return errors.New("no stream leader")
		}
		stored = append(stored, n.GetDurableSeq())
		mu.Unlock()
		return c.Announce(ctx, n)
	}, 0)
	var observedStored, observedFailed atomic.Int64
	p.Observe = func(ok bool) {
		if ok {
			observedStored.Add(1)
		} else {
			observedFailed.Add(1)
		}
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	for seq := uint64(1); seq <= 5; seq++ {
		p.Offer(&hamsv1.DurabilityNotice{Model: "m", Epoch: 2, DurableSeq: seq})
	}
	p.Offer(&hamsv1.DurabilityNotice{Model: "m", Epoch: 1, DurableSeq: 99}) // older epoch: ignored
	for p.Stored().GetDurableSeq() != 5 {
		if ctx.Err() != nil {
			t.Fatalf("stored %v after %d failures", p.Stored(), p.Failures())
		}
		time.Sleep(5 * time.Millisecond) // polling the persister's progress
	}
	if p.Failures() != 3 {
		t.Fatalf("failures %d, want 3", p.Failures())
	}
	if f, st := observedFailed.Load(), observedStored.Load(); f != 3 || st != int64(p.Stores()) || st == 0 {
		t.Fatalf("Observe told %d failed and %d stored, want 3 and %d", f, st, p.Stores())
	}
	mu.Lock()
	if len(stored) == 0 || stored[len(stored)-1] != 5 || len(stored) > 5 {
		t.Fatalf("stored seqs %v", stored)
	}
	mu.Unlock()
	got, stopWatch := startWatch(t, ctx, c)
	if n := <-got; n.GetEpoch() != 2 || n.GetDurableSeq() != 5 {
		t.Fatalf("catch-up read %v, want epoch 2 seq 5", n)
	}
	stopWatch()
	rcancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A live notice is not stored by the durability stream: storing is the
// persister's (spaced) job, so at batch 1 the stream stores a few
// notices a second instead of every one.
func TestLiveNoticesNotStored(t *testing.T) {
	nc := embedded(t)
	c := openT(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, first, stop := watchLive(t, ctx, c)
	live := &hamsv1.DurabilityNotice{Model: "m", Epoch: 1, DurableSeq: 2}
	if err := c.AnnounceLive(live); err != nil {
		t.Fatal(err)
	}
	if n := <-got; !proto.Equal(n, live) {
		t.Fatalf("live notice %v", n)
	}
	// The watch got it, so NATS has routed it (to the stream too, were
	// the stream listening).
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	last, err := c.LastDurable(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(last, first) {
		t.Fatalf("the stream stores %v, want the stored notice %v only", last, first)
	}
	stop()
}

// Stores are spaced: while the persister waits out its spacing after a
// store, newer offers replace the pending one, and the next store is the
// newest (two stores for five notices). Without spacing nothing waits.
func TestNoticePersisterSpacesStores(t *testing.T) {
	for _, spacing := range []time.Duration{time.Minute, 0} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var mu sync.Mutex
		var stored []uint64
		p := NewNoticePersister(func(_ context.Context, n *hamsv1.DurabilityNotice) error {
			mu.Lock()
			stored = append(stored, n.GetDurableSeq())
			mu.Unlock()
			return nil
		}, spacing)
		slept := make(chan time.Duration, 1)
		waitSleep := func() time.Duration {
			select {
			case d := <-slept:
				return d
			case <-ctx.Done():
				t.Fatalf("the persister never waited (stored %v)", p.Stored())
				return 0
			}
		}
		release := make(chan struct{})
		p.sleep = func(ctx context.Context, d time.Duration) bool {
			slept <- d
			select {
			case <-release:
				return true
			case <-ctx.Done():
				return false
			}
		}
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		p.Offer(&hamsv1.DurabilityNotice{Model: "m", Epoch: 1, DurableSeq: 1})
		if spacing == 0 {
			for p.Stored().GetDurableSeq() != 1 {
				if ctx.Err() != nil {
					t.Fatal("notice 1 never stored")
				}
				time.Sleep(time.Millisecond) // polling the persister's progress
			}
			for seq := uint64(2); seq <= 5; seq++ {
				p.Offer(&hamsv1.DurabilityNotice{Model: "m", Epoch: 1, DurableSeq: seq})
				for p.Stored().GetDurableSeq() != seq {
					if ctx.Err() != nil {
						t.Fatalf("notice %d never stored", seq)
					}
					time.Sleep(time.Millisecond) // polling the persister's progress
				}
			}
			select {
			case d := <-slept:
				t.Fatalf("the persister waited %v with no spacing", d)
			default:
			}
			if p.Stores() != 5 {
				t.Fatalf("%d stores for 5 notices offered one by one", p.Stores())
			}
		} else {
			if d := waitSleep(); d != spacing {
				t.Fatalf("waited %v after a store, want %v", d, spacing)
			}
			for seq := uint64(2); seq <= 5; seq++ {
				p.Offer(&hamsv1.DurabilityNotice{Model: "m", Epoch: 1, DurableSeq: seq})
			}
			close(release)
			if d := waitSleep(); d != spacing {
				t.Fatalf("waited %v after a store, want %v", d, spacing)
			}
			mu.Lock()
			got := slices.Clone(stored)
			mu.Unlock()
			if !slices.Equal(got, []uint64{1, 5}) {
				t.Fatalf("stored %v, want [1 5]", got)
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
