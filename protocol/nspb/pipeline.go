package nspb

import (
	"fmt"

	"github.com/hams-go/hams/protocol"
)

// Mode is a fault-tolerance mode of a stateful primary (docs/design.md,
// "Baselines the project carries as modes").
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
	// buffer; the driver reports Copied when the state is captured (later
	// updates no longer change what the copy returns).
	Copy struct{ Batch uint64 }
	// Ship sends the snapshot of the state after batch Batch to the backup
	// (off the request path); it covers every batch after the previous
	// Ship. The driver reports Acked when the backup has received it.
	Ship struct{ Batch uint64 }
)

// ProtocolAction marks Release as a protocol.Action.
func (Release) ProtocolAction() {}

// ProtocolAction marks Update as a protocol.Action.
func (Update) ProtocolAction() {}

// ProtocolAction marks Copy as a protocol.Action.
func (Copy) ProtocolAction() {}

// ProtocolAction marks Ship as a protocol.Action.
func (Ship) ProtocolAction() {}

func (a Release) String() string { return fmt.Sprintf("release batch=%d", a.Batch) }
func (a Update) String() string  { return fmt.Sprintf("update batch=%d", a.Batch) }
func (a Copy) String() string    { return fmt.Sprintf("copy batch=%d", a.Batch) }
func (a Ship) String() string    { return fmt.Sprintf("ship batch=%d", a.Batch) }

// Pipeline orders compute, update, copy, ship and release for one stateful
// primary (paper IV-B, IV-C and the baselines).
//
// Invariants, for every mode:
//   - compute n+1 starts only after update n (it reads state n);
//   - no update is issued while a copy is running (a copy never sees a
//     half-updated state, without stopping the model); with eager copies
//     update n+1 is issued only after copy n is done;
//   - stop-to-copy modes also start compute n+1 only after copy n;
//   - release-on-ack modes release batch n only after the backup has a
//     snapshot covering batch n; the others release it as soon as compute
//     n ends;
//   - releases happen in batch order.
//
// Copies on demand (CopyOnDemand, non-stop modes only): the state after
// batch n is copied only when the driver asked for a copy (its shipper can
// take a snapshot) and state n is installed; otherwise update n+1 goes
// ahead and the next copy, of a later state, covers batch n too (each
// snapshot holds the full state, so the state after batch m covers every
// batch up to m). Copy{Batch: m} then covers the batches after the
// previous copy up to m. A batch becomes durable only when a snapshot
// covering it is applied, so durability is never claimed early; it only
// comes with a later, fuller state.
type Pipeline struct {
	mode      Mode
	onDemand  bool
	capture   bool
	wanted    bool // on demand: the driver asked for a copy
	computing bool
	computed  uint64
	updating  bool
	updated   uint64
	copying   bool
	copyOf    uint64
	copied    uint64
	shipped   uint64 // on demand: copied before the last Copied (CopyLost goes back to it)
	acked     uint64
	released  uint64
}

// NewPipeline starts after batch `start` (0 for a fresh primary; a promoted
// backup starts after the last batch it applied).
func NewPipeline(mode Mode, start uint64) *Pipeline {
	return &Pipeline{mode: mode, computed: start, updated: start, copied: start, shipped: start, acked: start, released: start}
}

// CopyOnDemand makes the pipeline copy only when RequestCopy asked for it
// (see Pipeline). It applies to the non-stop modes (nspb, nspb-s1) and
// reports whether it did; stop-to-copy modes copy after every batch.
func (p *Pipeline) CopyOnDemand() bool {
	if p.mode == Bare || p.mode.stopToCopy() || p.capture {
		return false
	}
	p.onDemand = true
	return true
}

// CaptureAtCompute makes compute capture the state: the backend returns
// the state batch n stages (the bytes its update will write) with the
// outputs, so the snapshot of state n exists when compute n returns and
// no Copy is ever issued: Computed(n) ships it at once, and update n
// needs no copy of state n-1 (that state was captured by compute n-1).
// It applies to the non-stop modes (nspb, nspb-s1; the stop-to-copy
// baselines copy the whole state with the model stopped) and reports
// whether it did.
func (p *Pipeline) CaptureAtCompute() bool {
	if p.mode == Bare || p.mode.stopToCopy() || p.onDemand {
		return false
	}
	p.capture = true
	return true
}

// RequestCopy is the event "the driver can take a new snapshot" (on
// demand only; ignored otherwise). The copy starts at once when a state
// newer than the last copy is installed and no update or copy runs, else
// as soon as one is.
func (p *Pipeline) RequestCopy() []Action {
	if !p.onDemand {
		return nil
	}
	p.wanted = true
	return p.maybeCopy()
}

// CopyRequested reports whether a requested copy has not started yet.
func (p *Pipeline) CopyRequested() bool { return p.wanted }

// Copying reports whether a copy runs.
func (p *Pipeline) Copying() bool { return p.copying }

func (p *Pipeline) maybeCopy() []Action {
	if !p.wanted || p.copying || p.updating || p.copied >= p.updated {
		return nil
	}
	p.wanted = false
	p.copying, p.copyOf = true, p.updated
	return []Action{Copy{Batch: p.updated}}
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
// caller checked CanCompute (it panics otherwise: a driver bug; Step with
// ComputeStarted returns the error instead).
func (p *Pipeline) StartCompute() uint64 {
	n := p.computed + 1
	if err := p.startCompute(n); err != nil {
		panic(err)
	}
	return n
}

func (p *Pipeline) startCompute(n uint64) error {
	if !p.CanCompute() || n != p.computed+1 {
		return fmt.Errorf("nspb: compute of batch %d started (computed %d, updated %d, copied %d, computing %v): %w",
			n, p.computed, p.updated, p.copied, p.computing, protocol.ErrOutOfOrder)
	}
	p.computing = true
	return nil
}

// Computed is the event "compute of batch n returned".
func (p *Pipeline) Computed(n uint64) []Action { return must(p.computedEv(n)) }

func (p *Pipeline) computedEv(n uint64) ([]Action, error) {
	if !p.computing || n != p.computed+1 {
		return nil, fmt.Errorf("nspb: Computed(%d) out of order (computed %d, computing %v): %w", n, p.computed, p.computing, protocol.ErrOutOfOrder)
	}
	p.computing = false
	p.computed = n
	var out []Action
	if p.mode == Bare || !p.mode.releaseOnAck() {
		out = append(out, p.releaseUpTo(n)...)
	}
	if p.capture {
		p.shipped, p.copied = p.copied, n
		out = append(out, Ship{Batch: n})
	}
	return append(out, p.maybeUpdate()...), nil
}

// Updated is the event "update of batch n returned".
func (p *Pipeline) Updated(n uint64) []Action { return must(p.updatedEv(n)) }

func (p *Pipeline) updatedEv(n uint64) ([]Action, error) {
	if !p.updating || n != p.updated+1 {
		return nil, fmt.Errorf("nspb: Updated(%d) out of order (updated %d): %w", n, p.updated, protocol.ErrOutOfOrder)
	}
	p.updating = false
	p.updated = n
	if p.mode == Bare {
		p.copied, p.acked = n, n
		return nil, nil
	}
	if p.capture {
		return p.maybeUpdate(), nil
	}
	if p.onDemand {
		// Without a request, state n is left uncopied: the next update
		// may go ahead and a later copy covers batch n.
		if acts := p.maybeCopy(); acts != nil {
			return acts, nil
		}
		return p.maybeUpdate(), nil
	}
	p.copying, p.copyOf = true, n
	return []Action{Copy{Batch: n}}, nil
}

// Copied is the event "the copy of the state after batch n is done".
func (p *Pipeline) Copied(n uint64) []Action { return must(p.copiedEv(n)) }

func (p *Pipeline) copiedEv(n uint64) ([]Action, error) {
	if !p.copying || n != p.copyOf {
		return nil, fmt.Errorf("nspb: Copied(%d) out of order (copied %d, copying %v of %d): %w", n, p.copied, p.copying, p.copyOf, protocol.ErrOutOfOrder)
	}
	p.copying = false
	p.shipped = p.copied
	p.copied = n
	return append([]Action{Ship{Batch: n}}, p.maybeUpdate()...), nil
}

// CopyLost is the event "the copy of the state after batch n, reported
// Copied, failed before its data arrived" (on demand only; the state it
// captured may be overwritten by now). The batches it covered wait for
// the next copy, which starts as soon as it may.
func (p *Pipeline) CopyLost(n uint64) []Action { return must(p.copyLostEv(n)) }

func (p *Pipeline) copyLostEv(n uint64) ([]Action, error) {
	if !p.onDemand || p.copying || n != p.copied {
		return nil, fmt.Errorf("nspb: CopyLost(%d) (copied %d, copying %v, on demand %v): %w", n, p.copied, p.copying, p.onDemand, protocol.ErrOutOfOrder)
	}
	p.copied = p.shipped
	p.wanted = true
	return p.maybeCopy(), nil
}

// Acked is the event "the backup has received snapshot n" (acks are
// cumulative; older ones are ignored).
func (p *Pipeline) Acked(n uint64) []Action { return must(p.ackedEv(n)) }

func (p *Pipeline) ackedEv(n uint64) ([]Action, error) {
	if n <= p.acked {
		return nil, nil
	}
	if n > p.copied {
		return nil, fmt.Errorf("nspb: Acked(%d) before it was copied (%d): %w", n, p.copied, protocol.ErrOutOfOrder)
	}
	p.acked = n
	if p.mode.releaseOnAck() {
		return p.releaseUpTo(min(n, p.computed)), nil
	}
	return nil, nil
}

// must keeps the panicking contract of the direct methods (a driver that
// reports events out of order has a bug); Step returns the error instead.
func must(acts []Action, err error) []Action {
	if err != nil {
		panic(err)
	}
	return acts
}

func (p *Pipeline) maybeUpdate() []Action {
	n := p.updated + 1
	if p.updating || p.computed < n {
		return nil
	}
	// Update n overwrites state n-1: a copy of it must be complete; on
	// demand, state n-1 may go uncopied, but never while being copied.
	if p.copying {
		return nil
	}
	if p.mode != Bare && !p.onDemand && p.copied < n-1 {
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
