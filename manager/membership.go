package manager

import (
	"sort"
	"time"
)

// Membership is the pure heartbeat state machine: it is fed events
// (Registered, Heartbeat, Tick) with the current time and answers with the
// liveness changes to apply to the deployment state. It owns no goroutine,
// no clock and no lock; the manager serialises calls.
//
// Invariants: a member is alive iff it registered or heartbeated within the
// last Timeout as of the latest event, not counting the observer's own
// stalls (Pause); every alive->dead and dead->alive
// transition is reported exactly once, by the event that caused it.
type Membership struct {
	timeout time.Duration
	members map[string]*member
}

type member struct {
	lastSeen time.Time
	alive    bool
	progress Progress
}

// Progress is what a component last reported in its heartbeat (kept for
// lineage-based recovery and monitoring).
type Progress struct {
	TopologyRevision uint64
	MaxSeq           uint64
	DurableSeq       uint64
}

// Action is a liveness change the manager must write to the deployment
// state. A recovery state machine (later issue) consumes the same actions:
// Alive=false is where failover starts.
type Action struct {
	ID    string
	Alive bool
}

// NewMembership returns an empty membership that declares a member dead
// when it has not been heard from for longer than timeout.
func NewMembership(timeout time.Duration) *Membership {
	return &Membership{timeout: timeout, members: map[string]*member{}}
}

// Registered records a (re-)registration at now. It reports Alive=true if
// the member is new or was dead.
func (ms *Membership) Registered(id string, now time.Time) []Action {
	m, ok := ms.members[id]
	if !ok {
		ms.members[id] = &member{lastSeen: now, alive: true}
		return []Action{{ID: id, Alive: true}}
	}
	m.lastSeen = later(m.lastSeen, now)
	if !m.alive {
		m.alive = true
		return []Action{{ID: id, Alive: true}}
	}
	return nil
}

// Seed adds a member known from persisted state (a manager restart) as if
// it had registered at now, without reporting an action: the persisted
// state already says what it says. alive=false seeds a dead member that
// comes back with its next heartbeat.
func (ms *Membership) Seed(id string, alive bool, now time.Time) {
	ms.members[id] = &member{lastSeen: now, alive: alive}
}

// Heartbeat records a heartbeat at now. known=false means the id never
// registered (the caller answers NotFound so the component re-registers).
func (ms *Membership) Heartbeat(id string, p Progress, now time.Time) (actions []Action, known bool) {
	m, ok := ms.members[id]
	if !ok {
		return nil, false
	}
	m.lastSeen = later(m.lastSeen, now)
	m.progress = p
	if !m.alive {
		m.alive = true
		return []Action{{ID: id, Alive: true}}, true
	}
	return nil, true
}

// Tick declares dead every alive member not heard from for longer than the
// timeout as of now. Actions are sorted by id.
func (ms *Membership) Tick(now time.Time) []Action {
	var out []Action
	for id, m := range ms.members {
		if m.alive && now.Sub(m.lastSeen) > ms.timeout {
			m.alive = false
			out = append(out, Action{ID: id, Alive: false})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Dead declares id dead now (its process was seen to end); it reports
// Alive=false if id was an alive member.
func (ms *Membership) Dead(id string) []Action {
	m, ok := ms.members[id]
	if !ok || !m.alive {
		return nil
	}
	m.alive = false
	return []Action{{ID: id, Alive: false}}
}

// Pause forgives d of silence of every member: the observer itself was not
// running for d (its process was descheduled), so heartbeats sent in that
// time are still queued in its sockets and silence over d proves nothing.
// Every lastSeen moves d later; a dead member stays dead.
func (ms *Membership) Pause(d time.Duration) {
	if d <= 0 {
		return
	}
	for _, m := range ms.members {
		m.lastSeen = m.lastSeen.Add(d)
	}
}

// HeardAt treats every alive member as heard at now at the latest: each
// gets one suspicion timeout from now (a manager's own partition healed:
// their heartbeats are on their way over reconnecting connections, and
// silence from before now proves nothing). A dead member stays dead.
func (ms *Membership) HeardAt(now time.Time) {
	for _, m := range ms.members {
		if m.alive && m.lastSeen.Before(now) {
			m.lastSeen = now
		}
	}
}

// Remove forgets a member (replaced by another registration).
func (ms *Membership) Remove(id string) { delete(ms.members, id) }

// Alive reports whether id is a member and alive.
func (ms *Membership) Alive(id string) (alive, known bool) {
	m, ok := ms.members[id]
	if !ok {
		return false, false
	}
	return m.alive, true
}

// HeardWithin reports whether id is alive and was last heard from (a
// registration or heartbeat, or a Seed) no longer than d before now.
func (ms *Membership) HeardWithin(id string, d time.Duration, now time.Time) bool {
	m, ok := ms.members[id]
	return ok && m.alive && now.Sub(m.lastSeen) <= d
}

// Progress returns what id last reported.
func (ms *Membership) Progress(id string) (Progress, bool) {
	m, ok := ms.members[id]
	if !ok {
		return Progress{}, false
	}
	return m.progress, true
}

// Silent returns how many alive members were not heard from for longer
// than d as of now (Silent(now, timeout) are the ones Tick declares dead).
func (ms *Membership) Silent(now time.Time, d time.Duration) int {
	n := 0
	for _, m := range ms.members {
		if m.alive && now.Sub(m.lastSeen) > d {
			n++
		}
	}
	return n
}

// Counts returns the number of members and of alive members.
func (ms *Membership) Counts() (total, alive int) {
	for _, m := range ms.members {
		total++
		if m.alive {
			alive++
		}
	}
	return total, alive
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
