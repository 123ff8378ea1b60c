package nspb

import "fmt"

// Mode is a fault-tolerance mode of a stateful primary (DESIGN.md).
type Mode int

// Modes. Bare never copies; the others copy the state after every batch and
// ship it to the backup, and differ in whether the model stops while the
// state is copied and in when outputs are released downstream.
const (
	Bare   Mode = iota // no fault tolerance
	NSPB               // copy while the next batch computes; release at once
	Remus              // stop to copy; release when the backup has the state
	NSPBS1             // NSPB without early release (release when the backup has it)
	NSPBS2             // NSPB with stop-to-copy (release at once)
)

// ParseMode maps a mode name of the config to a Mode.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "bare":
		return Bare, nil
	case "nspb":
		return NSPB, nil
	case "remus":
		return Remus, nil
	case "nspb-s1":
		return NSPBS1, nil
	case "nspb-s2":
		return NSPBS2, nil
	}
	return 0, fmt.Errorf("nspb: unknown mode %q", s)
}

func (m Mode) String() string {
	return [...]string{"bare", "nspb", "remus", "nspb-s1", "nspb-s2"}[m]
}

func (m Mode) stopToCopy() bool   { return m == Remus || m == NSPBS2 }
func (m Mode) releaseOnAck() bool { return m == Remus || m == NSPBS1 }

// Pipeline actions for a primary's driver.
type (
	// Release sends batch Batch's outputs downstream.
	Release struct{ Batch uint64 }
	// Update installs the state staged by batch Batch's compute.
	Update struct{ Batch uint64 }
	// Copy copies the installed state (after batch Batch) into a snapshot
	// buffer; the driver reports Copied when done.
	Copy struct{ Batch uint64 }
	// Ship sends snapshot Batch to the backup (off the request path); the
	// driver reports Acked when the backup has received it.
	Ship struct{ Batch uint64 }
)

func (Release) action() {}
func (Update) action()  {}
func (Copy) action()    {}
func (Ship) action()    {}

// Pipeline orders compute, update, copy, ship and release for one stateful
// primary (paper IV-B, IV-C and the baselines).
//
// Invariants, for every mode:
//   - compute n+1 starts only after update n (it reads state n);
//   - update n+1 is issued only after copy n is done (a copy never sees a
//     half-updated state, without stopping the model);
//   - stop-to-copy modes also start compute n+1 only after copy n;
//   - release-on-ack modes release batch n only after the backup has
//     snapshot n; the others release it as soon as compute n ends;
//   - releases happen in batch order.
type Pipeline struct {
	mode      Mode
	computing bool
	computed  uint64
	updating  bool
	updated   uint64
	copying   bool
	copied    uint64
	acked     uint64
	released  uint64
}

// NewPipeline starts after batch `start` (0 for a fresh primary; a promoted
// backup starts after the last batch it applied).
func NewPipeline(mode Mode, start uint64) *Pipeline {
	return &Pipeline{mode: mode, computed: start, updated: start, copied: start, acked: start, released: start}
}

// CanCompute reports whether the next batch may start computing.
func (p *Pipeline) CanCompute() bool {
	if p.computing || p.updated < p.computed {
		return false
	}
	if p.mode != Bare && p.mode.stopToCopy() && p.copied < p.updated {
		return false
	}
	return true
}

// StartCompute marks the next batch as computing and returns its id. The
// caller checked CanCompute.
func (p *Pipeline) StartCompute() uint64 {
	if !p.CanCompute() {
		panic("nspb: StartCompute while CanCompute is false")
	}
	p.computing = true
	return p.computed + 1
}

// Computed is the event "compute of batch n returned".
func (p *Pipeline) Computed(n uint64) []Action {
	if !p.computing || n != p.computed+1 {
		panic(fmt.Sprintf("nspb: Computed(%d) out of order (computed %d, computing %v)", n, p.computed, p.computing))
	}
	p.computing = false
	p.computed = n
	var out []Action
	if p.mode == Bare || !p.mode.releaseOnAck() {
		out = append(out, p.releaseUpTo(n)...)
	}
	return append(out, p.maybeUpdate()...)
}

// Updated is the event "update of batch n returned".
func (p *Pipeline) Updated(n uint64) []Action {
	if !p.updating || n != p.updated+1 {
		panic(fmt.Sprintf("nspb: Updated(%d) out of order (updated %d)", n, p.updated))
	}
	p.updating = false
	p.updated = n
	if p.mode == Bare {
		p.copied, p.acked = n, n
		return nil
	}
	p.copying = true
	return []Action{Copy{Batch: n}}
}

// Copied is the event "the copy of the state after batch n is done".
func (p *Pipeline) Copied(n uint64) []Action {
	if !p.copying || n != p.copied+1 {
		panic(fmt.Sprintf("nspb: Copied(%d) out of order (copied %d)", n, p.copied))
	}
	p.copying = false
	p.copied = n
	return append([]Action{Ship{Batch: n}}, p.maybeUpdate()...)
}

// Acked is the event "the backup has received snapshot n" (acks are
// cumulative; older ones are ignored).
func (p *Pipeline) Acked(n uint64) []Action {
	if n <= p.acked {
		return nil
	}
	if n > p.copied {
		panic(fmt.Sprintf("nspb: Acked(%d) before it was copied (%d)", n, p.copied))
	}
	p.acked = n
	if p.mode.releaseOnAck() {
		return p.releaseUpTo(min(n, p.computed))
	}
	return nil
}

func (p *Pipeline) maybeUpdate() []Action {
	n := p.updated + 1
	if p.updating || p.computed < n {
		return nil
	}
	// Update n overwrites state n-1: its copy must be complete.
	if p.mode != Bare && p.copied < n-1 {
		return nil
	}
	p.updating = true
	return []Action{Update{Batch: n}}
}

func (p *Pipeline) releaseUpTo(n uint64) []Action {
	var out []Action
	for p.released < n {
		p.released++
		out = append(out, Release{Batch: p.released})
	}
	return out
}

// Progress returns the pipeline's counters (for metrics and tests).
func (p *Pipeline) Progress() (computed, updated, copied, acked, released uint64) {
	return p.computed, p.updated, p.copied, p.acked, p.released
}
