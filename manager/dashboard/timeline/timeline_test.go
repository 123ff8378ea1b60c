package timeline

import (
	"testing"
	"time"
)

func TestRingKeepsNewestAndMergesSuspicions(t *testing.T) {
	r := NewRing(3)
	t0 := time.Unix(100, 0)
	ch := r.Changed()
	r.Emit(Event{At: t0, Kind: Suspicion, Model: "m", Component: "c"})
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed by Emit")
	}
	r.Emit(Event{At: t0.Add(time.Millisecond), Kind: Suspicion, Model: "m", Component: "c"})
	r.Emit(Event{At: t0.Add(5 * time.Millisecond), Kind: Suspicion, Model: "m", Component: "s"})
	r.Emit(Event{At: t0.Add(10 * time.Millisecond), Kind: Promotion, Model: "m", Duration: time.Millisecond})
	r.Emit(Event{At: t0.Add(20 * time.Millisecond), Kind: Failover, Model: "m,n", Duration: 20 * time.Millisecond})
	r.Emit(Event{At: t0.Add(50 * time.Millisecond), Kind: RedundancyRestored, Model: "m"})
	ev := r.Events()
	if len(ev) != 3 {
		t.Fatalf("kept %d events, want 3: %+v", len(ev), ev)
	}
	if ev[0].Kind != Promotion || ev[0].FromFailure != 10*time.Millisecond || ev[0].Seq != 3 {
		t.Errorf("promotion: %+v (want 10ms from the first suspicion, seq 3)", ev[0])
	}
	if ev[2].Kind != RedundancyRestored || ev[2].FromFailure != 50*time.Millisecond {
		t.Errorf("restored: %+v", ev[2])
	}
	// A new failure after the failover starts a new incident.
	r.Emit(Event{At: t0.Add(time.Second), Kind: Suspicion, Model: "m", Component: "x"})
	r.Emit(Event{At: t0.Add(time.Second + 7*time.Millisecond), Kind: Promotion, Model: "m"})
	if ev := r.Events(); ev[2].FromFailure != 7*time.Millisecond {
		t.Errorf("second incident: %+v", ev[2])
	}
	first := NewRing(0)
	first.Emit(Event{Kind: Suspicion, Component: "c"})
	first.Emit(Event{Kind: Suspicion, Component: "c"})
	if ev := first.Events(); len(ev) != 1 || ev[0].Count != 2 {
		t.Errorf("merge: %+v", ev)
	}
}
