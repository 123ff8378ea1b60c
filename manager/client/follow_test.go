package client

import (
	"slices"
	"testing"
)

func TestFollowerSingleManagerAlwaysTargeted(t *testing.T) {
	f := newFollower(1)
	for _, ans := range []struct{ ok, active bool }{{false, false}, {true, false}, {true, true}} {
		if f.answered(0, ans.ok, ans.active) {
			t.Fatalf("answer %+v changed the one manager", ans)
		}
		if got := f.targets(); !slices.Equal(got, []int{0}) {
			t.Fatalf("targets %v; want [0]", got)
		}
	}
}

func TestFollowerHuntsAndFollowsTheActiveManager(t *testing.T) {
	f := newFollower(3)
	if got := f.targets(); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("start: targets %v; want all (hunting)", got)
	}
	// Standbys answering while hunting change nothing.
	f.answered(0, true, false)
	f.answered(2, false, false)
	if f.current() != -1 {
		t.Fatal("followed a standby or an unreachable manager")
	}
	if !f.answered(1, true, true) || f.current() != 1 || !slices.Equal(f.targets(), []int{1}) {
		t.Fatalf("active manager 1 not followed: cur %d targets %v", f.current(), f.targets())
	}
	// A late standby answer from another manager does not unfollow.
	if f.answered(0, true, false) || f.current() != 1 {
		t.Fatal("a standby's answer moved the client off the active manager")
	}
	// The followed manager dies: hunt again.
	if !f.answered(1, false, false) || f.current() != -1 || len(f.targets()) != 3 {
		t.Fatalf("dead manager still followed: cur %d targets %v", f.current(), f.targets())
	}
	// A standby takes over.
	f.answered(2, true, true)
	if f.current() != 2 {
		t.Fatalf("new active manager not followed: cur %d", f.current())
	}
	// The followed manager loses the lease (answers standby): hunt.
	if !f.answered(2, true, false) || f.current() != -1 {
		t.Fatal("a manager that stepped down is still followed")
	}
}
