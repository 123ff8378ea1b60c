package manager

import (
	"reflect"
	"testing"
	"time"
)

// fakeClock is advanced by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time                { return c.t }
func (c *fakeClock) add(d time.Duration) time.Time { c.t = c.t.Add(d); return c.t }

func TestMembershipMissedHeartbeatsThenAlive(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	ms := NewMembership(70 * time.Millisecond)

	if got := ms.Registered("a", clk.now()); !reflect.DeepEqual(got, []Action{{ID: "a", Alive: true}}) {
		t.Fatalf("Registered(a) = %v, want alive action", got)
	}
	ms.Registered("b", clk.now())

	// Heartbeats every 20 ms keep both alive.
	for range 10 {
		now := clk.add(20 * time.Millisecond)
		for _, id := range []string{"a", "b"} {
			acts, known := ms.Heartbeat(id, Progress{MaxSeq: 1}, now)
			if !known || acts != nil {
				t.Fatalf("Heartbeat(%s) = %v, %v; want no action, known", id, acts, known)
			}
		}
		if acts := ms.Tick(now); acts != nil {
			t.Fatalf("Tick with fresh heartbeats = %v, want none", acts)
		}
	}

	// b stops; a keeps going. Exactly at the timeout b is still alive; past
	// it b is dead, reported once.
	last := clk.now()
	for clk.now().Sub(last) < 60*time.Millisecond {
		now := clk.add(20 * time.Millisecond)
		ms.Heartbeat("a", Progress{}, now)
		if acts := ms.Tick(now); acts != nil {
			t.Fatalf("Tick %v after b's last heartbeat = %v, want none", now.Sub(last), acts)
		}
	}
	now := clk.add(10 * time.Millisecond) // 70 ms: not beyond the timeout
	ms.Heartbeat("a", Progress{}, now)
	if acts := ms.Tick(now); acts != nil {
		t.Fatalf("Tick at exactly the timeout = %v, want none", acts)
	}
	now = clk.add(time.Millisecond)
	ms.Heartbeat("a", Progress{}, now)
	if acts := ms.Tick(now); !reflect.DeepEqual(acts, []Action{{ID: "b", Alive: false}}) {
		t.Fatalf("Tick past the timeout = %v, want b dead", acts)
	}
	if acts := ms.Tick(clk.add(time.Second)); !reflect.DeepEqual(acts, []Action{{ID: "a", Alive: false}}) {
		t.Fatalf("Tick after a second of silence = %v, want only a (b reported once)", acts)
	}
	if alive, known := ms.Alive("b"); alive || !known {
		t.Fatalf("Alive(b) = %v, %v; want dead, known", alive, known)
	}
	if total, alive := ms.Counts(); total != 2 || alive != 0 {
		t.Fatalf("Counts = %d, %d; want 2, 0", total, alive)
	}

	// A heartbeat brings b back, reported once.
	now = clk.add(time.Millisecond)
	acts, known := ms.Heartbeat("b", Progress{MaxSeq: 7, DurableSeq: 5}, now)
	if !known || !reflect.DeepEqual(acts, []Action{{ID: "b", Alive: true}}) {
		t.Fatalf("Heartbeat(b) after death = %v, %v; want alive action", acts, known)
	}
	if p, _ := ms.Progress("b"); p != (Progress{MaxSeq: 7, DurableSeq: 5}) {
		t.Fatalf("Progress(b) = %+v, want the last heartbeat's", p)
	}
	if acts, _ := ms.Heartbeat("b", Progress{}, now); acts != nil {
		t.Fatalf("second Heartbeat(b) = %v, want none", acts)
	}
	// Re-registering a dead member also brings it back.
	if acts := ms.Registered("a", now); !reflect.DeepEqual(acts, []Action{{ID: "a", Alive: true}}) {
		t.Fatalf("Registered(a) after death = %v, want alive action", acts)
	}
	if acts := ms.Registered("a", now); acts != nil {
		t.Fatalf("Registered(a) while alive = %v, want none", acts)
	}
}

func TestMembershipUnknownHeartbeat(t *testing.T) {
	ms := NewMembership(time.Second)
	if acts, known := ms.Heartbeat("ghost", Progress{}, time.Unix(1, 0)); known || acts != nil {
		t.Fatalf("Heartbeat(ghost) = %v, %v; want unknown", acts, known)
	}
	if _, known := ms.Alive("ghost"); known {
		t.Fatal("ghost became a member")
	}
}

func TestMembershipClockGoingBackwards(t *testing.T) {
	// A late event with an older timestamp must not shorten a member's life.
	ms := NewMembership(50 * time.Millisecond)
	t0 := time.Unix(100, 0)
	ms.Registered("a", t0)
	ms.Heartbeat("a", Progress{}, t0.Add(40*time.Millisecond))
	ms.Heartbeat("a", Progress{}, t0.Add(10*time.Millisecond))
	if acts := ms.Tick(t0.Add(80 * time.Millisecond)); acts != nil {
		t.Fatalf("Tick = %v, want none (last seen at +40ms)", acts)
	}
	if acts := ms.Tick(t0.Add(91 * time.Millisecond)); len(acts) != 1 {
		t.Fatalf("Tick = %v, want a dead", acts)
	}
}

func TestMembershipSeedAndRemove(t *testing.T) {
	ms := NewMembership(50 * time.Millisecond)
	t0 := time.Unix(100, 0)
	ms.Seed("alive", true, t0)
	ms.Seed("dead", false, t0)
	if total, alive := ms.Counts(); total != 2 || alive != 1 {
		t.Fatalf("Counts = %d, %d; want 2, 1", total, alive)
	}
	if acts, _ := ms.Heartbeat("dead", Progress{}, t0); len(acts) != 1 || !acts[0].Alive {
		t.Fatalf("Heartbeat(dead seed) = %v, want alive action", acts)
	}
	ms.Remove("alive")
	if acts := ms.Tick(t0.Add(time.Second)); !reflect.DeepEqual(acts, []Action{{ID: "dead", Alive: false}}) {
		t.Fatalf("Tick = %v, want only the remaining member", acts)
	}
}

// An observer that did not run for a while forgives that silence: a member
// heard just before the stall is not declared dead by the first tick after
// it; one that stays silent past a timeout after the stall is.
func TestMembershipPauseForgivesTheObserversStall(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := NewMembership(100 * time.Millisecond)
	ms.Registered("a", t0)
	ms.Registered("b", t0)
	ms.Pause(0) // no-op
	// The observer stalls 500 ms; its first tick after the stall:
	ms.Pause(500 * time.Millisecond)
	if acts := ms.Tick(t0.Add(510 * time.Millisecond)); len(acts) != 0 {
		t.Fatalf("members declared dead by the observer's own stall: %v", acts)
	}
	// The queued heartbeat of a arrives; b stays silent.
	ms.Heartbeat("a", Progress{}, t0.Add(520*time.Millisecond))
	acts := ms.Tick(t0.Add(601 * time.Millisecond))
	if len(acts) != 1 || acts[0].ID != "b" || acts[0].Alive {
		t.Fatalf("after a timeout past the stall: %v, want b dead", acts)
	}
	// A dead member stays dead through a pause.
	ms.Pause(time.Second)
	if alive, _ := ms.Alive("b"); alive {
		t.Fatal("pause revived a dead member")
	}
}
