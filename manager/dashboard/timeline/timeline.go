// Package timeline keeps the recent recovery events of a manager
// (suspicions, failovers, promotions, redundancy restored, ...) in a
// bounded ring buffer for the dashboard. The manager sees only the narrow
// Sink interface; the dashboard reads the Ring.
package timeline

import (
	"strings"
	"sync"
	"time"
)

// Kind of an event.
type Kind string

// Event kinds.
const (
	// Suspicion: a component was suspected (missed heartbeats, a failure
	// report, a process exit seen by its supervisor).
	Suspicion Kind = "suspicion"
	// Promotion: a backup or standby was promoted (Duration: the Promote
	// order, FromFailure: since the model's suspicion).
	Promotion Kind = "promotion"
	// Failover: a recovery round rewired the topology (Duration: from
	// the round's first suspicion to the rewire; Model: the models it
	// recovered, comma-separated).
	Failover Kind = "failover"
	// RedundancyRestored: a new backup was synced or a new standby
	// started (Duration: the order, FromFailure: since the model's
	// suspicion).
	RedundancyRestored Kind = "redundancy-restored"
	// Unrecoverable: recovery gave a model up.
	Unrecoverable Kind = "unrecoverable"
	// Retired and Readmitted: a component declared dead came back.
	Retired    Kind = "retired"
	Readmitted Kind = "readmitted"
	// Active and Standby: this manager took or lost the lease.
	Active  Kind = "active"
	Standby Kind = "standby"
)

// Event is one entry of the timeline.
type Event struct {
	// Seq numbers the events of one Ring from 1 (set by Emit).
	Seq       uint64    `json:"seq"`
	At        time.Time `json:"at"`
	Kind      Kind      `json:"kind"`
	Model     string    `json:"model,omitempty"`
	Component string    `json:"component,omitempty"`
	Role      string    `json:"role,omitempty"`
	Epoch     uint64    `json:"epoch,omitempty"`
	// Duration of what the event ends (see the kinds).
	Duration time.Duration `json:"duration_ns,omitempty"`
	// FromFailure is the time since the model's last suspicion (filled by
	// the Ring for promotions and restored redundancy when it saw one).
	FromFailure time.Duration `json:"from_failure_ns,omitempty"`
	Detail      string        `json:"detail,omitempty"`
	// Count of suspicions of the same component merged into this one
	// (several reporters of one failure).
	Count int `json:"count,omitempty"`
}

// Sink receives events; Emit must not block.
type Sink interface {
	Emit(Event)
}

// DefaultSize of a Ring.
const DefaultSize = 512

// mergeWindow: suspicions of one component closer than this are merged.
const mergeWindow = 2 * time.Second

// Ring is a bounded, concurrency-safe Sink keeping the newest events.
type Ring struct {
	mu      sync.Mutex
	buf     []Event
	start   int // index of the oldest
	n       int
	seq     uint64
	changed chan struct{}
	// incidents: model -> its newest failure (the first suspicion since
	// its last failover).
	incidents map[string]*incident
}

type incident struct {
	start time.Time
	open  bool // no failover of the model since start
}

// NewRing returns a ring keeping the newest size events (size <= 0:
// DefaultSize).
func NewRing(size int) *Ring {
	if size <= 0 {
		size = DefaultSize
	}
	return &Ring{buf: make([]Event, size), changed: make(chan struct{}), incidents: map[string]*incident{}}
}

// Emit records e (At defaults to now) and wakes the Changed waiters.
func (r *Ring) Emit(e Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Kind {
	case Suspicion:
		if in := r.incidents[e.Model]; e.Model != "" && (in == nil || !in.open) {
			r.incidents[e.Model] = &incident{start: e.At, open: true}
		}
		if last := r.lastLocked(); last != nil && last.Kind == Suspicion && last.Component == e.Component &&
			e.At.Sub(last.At) < mergeWindow {
			last.Count = max(last.Count, 1) + 1
			if last.Model == "" {
				last.Model = e.Model
			}
			if last.Role == "" {
				last.Role = e.Role
			}
			r.wakeLocked()
			return
		}
	case Failover:
		for _, m := range strings.Split(e.Model, ",") {
			if in := r.incidents[m]; in != nil {
				in.open = false
			}
		}
	case Promotion, RedundancyRestored:
		if in := r.incidents[e.Model]; in != nil && e.FromFailure == 0 && !e.At.Before(in.start) {
			e.FromFailure = e.At.Sub(in.start)
		}
	}
	r.seq++
	e.Seq = r.seq
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = e
		r.n++
	} else {
		r.buf[r.start] = e
		r.start = (r.start + 1) % len(r.buf)
	}
	r.wakeLocked()
}

func (r *Ring) lastLocked() *Event {
	if r.n == 0 {
		return nil
	}
	return &r.buf[(r.start+r.n-1)%len(r.buf)]
}

func (r *Ring) wakeLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Events returns the kept events, oldest first.
func (r *Ring) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Event, r.n)
	for i := range r.n {
		out[i] = r.buf[(r.start+i)%len(r.buf)]
	}
	return out
}

// Changed returns a channel closed at the next Emit.
func (r *Ring) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}
