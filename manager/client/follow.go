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
// A followed manager that only answers late (a heartbeat timed out: the
// machine is overloaded, or the manager stalls) is given slowLimit
// timeouts in a row before the client hunts: hunting doubles the
// heartbeats, which an overloaded machine can least afford. A refused
// connection or a standby answer starts the hunt at once.
//
// Invariant: cur >= 0 only after the manager at cur answered as active,
// and no answer since said otherwise; slow counts the followed manager's
// timeouts since its last answer.
type follower struct {
	n    int
	cur  int // followed manager, -1 while hunting
	slow int
}

// answer is what one heartbeat or registration got from a manager.
type answer int

const (
	answerActive  answer = iota // answered, as the active manager
	answerStandby               // answered, as a standby
	answerSlow                  // timed out
	answerFailed                // any other error (refused, unavailable)
)

// slowLimit is how many timeouts in a row make the client hunt.
const slowLimit = 3

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

// answered records manager i's answer. It reports whether the followed
// manager changed.
func (f *follower) answered(i int, a answer) (changed bool) {
	if f.n == 1 {
		return false
	}
	if a == answerActive {
		if f.cur == i {
			f.slow = 0
			return false
		}
		f.cur, f.slow = i, 0
		return true
	}
	if i != f.cur {
		return false
	}
	if a == answerSlow {
		f.slow++
		if f.slow < slowLimit {
			return false
		}
	}
	f.cur, f.slow = -1, 0
	return true
}
