package run

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestSleepFull(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep of 1 ms with a live context reported an interruption")
	}
}

func TestSleepCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep with an ended context reported the full hour")
	}
	if Sleep(ctx, 0) {
		t.Fatal("Sleep(0) with an ended context reported success")
	}
}

func TestGroupStopCancelsAndWaits(t *testing.T) {
	g := NewGroup(context.Background(), nil)
	var done atomic.Int32
	for range 3 {
		g.Go(func(ctx context.Context) error {
			<-ctx.Done()
			done.Add(1)
			return ctx.Err()
		})
	}
	if err := g.Stop(); err != nil {
		t.Fatalf("Stop: %v (an error after cancellation is not the group's)", err)
	}
	if n := done.Load(); n != 3 {
		t.Fatalf("Stop returned with %d of 3 goroutines done", n)
	}
	if err := g.Stop(); err != nil { // idempotent
		t.Fatalf("second Stop: %v", err)
	}
	g.Go(func(context.Context) error { t.Error("a goroutine started after Stop"); return nil })
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

func TestGroupFirstErrorCancelsTheOthers(t *testing.T) {
	g := NewGroup(context.Background(), nil)
	boom := errors.New("boom")
	g.Go(func(ctx context.Context) error { <-ctx.Done(); return nil })
	g.Go(func(context.Context) error { return boom })
	if err := g.Wait(); !errors.Is(err, boom) {
		t.Fatalf("Wait = %v, want %v", err, boom)
	}
	if g.Context().Err() == nil {
		t.Fatal("the group's context is live after an error")
	}
}

func TestGroupOnErr(t *testing.T) {
	got := make(chan error, 1)
	g := NewGroup(context.Background(), func(err error) { got <- err })
	boom := errors.New("boom")
	g.Go(func(context.Context) error { return boom })
	if err := <-got; !errors.Is(err, boom) {
		t.Fatalf("onErr got %v", err)
	}
	if g.Context().Err() != nil {
		t.Fatal("an error handed to onErr canceled the group")
	}
	if err := g.Stop(); err != nil {
		t.Fatalf("Stop = %v, want nil with an onErr", err)
	}
}
