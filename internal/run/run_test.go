package run

import (
	"context"
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
