package client

// follower decides which managers a client talks to (a pure state
// machine: answers in, targets out; no I/O, no clock).
//
// With one manager address it always targets that one. With several
// (an active manager and standbys sharing one deployment state), the
// client heartbeats only the manager it follows, which must be the active
// one: the active manager's membership is what declares components dead.
// When the followed manager fails to answer, or answers as a standby, the
// client hunts: it heartbeats every manager each round until one answers
// as active, and follows that one. While hunting, every manager that
// answers records the heartbeat, so whichever standby takes the lease over
// already has fresh membership for every component (a standby gives each
// component only one suspicion timeout after it takes over).
//
// Invariant: cur >= 0 only after the manager at cur answered as active,
// and no answer since said otherwise.
type follower struct {
	n   int
	cur int // followed manager, -1 while hunting
}

func newFollower(n int) *follower {
	f := &follower{n: n, cur: -1}
	if n == 1 {
		f.cur = 0
	}
	return f
}

// targets are the managers to heartbeat this round.
func (f *follower) targets() []int {
	if f.cur >= 0 {
		return []int{f.cur}
	}
	out := make([]int, f.n)
	for i := range out {
		out[i] = i
	}
	return out
}

// current is the followed manager, or -1 while hunting.
func (f *follower) current() int { return f.cur }

// answered records manager i's answer to a heartbeat or registration:
// ok=false for an error (unreachable, timed out), active from its role
// header. It reports whether the followed manager changed.
func (f *follower) answered(i int, ok, active bool) (changed bool) {
	if f.n == 1 {
		return false
	}
	switch {
	case ok && active && f.cur != i:
		f.cur = i
		return true
	case i == f.cur && (!ok || !active):
		f.cur = -1
		return true
	}
	return false
}
