package client

import (
	"slices"
	"testing"
)

func TestFollowerSingleManagerAlwaysTargeted(t *testing.T) {
	f := newFollower(1)
	for _, ans := range []answer{answerFailed, answerSlow, answerStandby, answerActive} {
		if f.answered(0, ans) {
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
	f.answered(0, answerStandby)
	f.answered(2, answerFailed)
	if f.current() != -1 {
		t.Fatal("followed a standby or an unreachable manager")
	}
	if !f.answered(1, answerActive) || f.current() != 1 || !slices.Equal(f.targets(), []int{1}) {
		t.Fatalf("active manager 1 not followed: cur %d targets %v", f.current(), f.targets())
	}
	// A late standby answer from another manager does not unfollow.
	if f.answered(0, answerStandby) || f.current() != 1 {
		t.Fatal("a standby's answer moved the client off the active manager")
	}
	// Timeouts (an overloaded machine) are tolerated slowLimit-1 times in
	// a row; an answer in between resets the count.
	f.answered(1, answerSlow)
	f.answered(1, answerActive)
	for range slowLimit - 1 {
		if f.answered(1, answerSlow) || f.current() != 1 {
			t.Fatal("a few slow heartbeats started a hunt")
		}
	}
	if !f.answered(1, answerSlow) || f.current() != -1 {
		t.Fatalf("%d timeouts in a row: still following", slowLimit)
	}
	f.answered(1, answerActive)
	// The followed manager dies (connection refused): hunt at once.
	if !f.answered(1, answerFailed) || f.current() != -1 || len(f.targets()) != 3 {
		t.Fatalf("dead manager still followed: cur %d targets %v", f.current(), f.targets())
	}
	// A standby takes over.
	f.answered(2, answerActive)
	if f.current() != 2 {
		t.Fatalf("new active manager not followed: cur %d", f.current())
	}
	// The followed manager loses the lease (answers standby): hunt.
	if !f.answered(2, answerStandby) || f.current() != -1 {
		t.Fatal("a manager that stepped down is still followed")
	}
}
