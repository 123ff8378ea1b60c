package run

import (
	"context"
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

func TestGroupWaitsForAll(t *testing.T) {
	var g Group
	var n atomic.Int32
	release := make(chan struct{})
	for range 8 {
		g.Go(func() {
			<-release
			n.Add(1)
		})
	}
	close(release)
	g.Wait()
	if n.Load() != 8 {
		t.Fatalf("Wait returned with %d of 8 goroutines done", n.Load())
	}
}
