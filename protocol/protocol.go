package protocol

import (
	"errors"
	"fmt"
	"strings"
)

// Event is one input to a Machine: something that happened that the
// machine must know of (a message arrived, an operation the driver
// performed for an earlier Action returned, the driver's clock passed a
// deadline). Events are plain values; a machine never keeps a reference
// to the maps or slices in an event after Step returns unless its doc
// says so.
type Event interface {
	// String renders the event on one line, for transcripts and logs.
	String() string
	// ProtocolEvent marks the type as an event of a machine under
	// protocol/ (as ProtoMessage marks a protobuf message); it does
	// nothing.
	ProtocolEvent()
}

// Action is one thing a Machine asks its driver to do. The driver
// performs the actions of one Step in the order returned: the machines
// rely on it (an Apply before the Announce it justifies, a Promote before
// the Rewire that publishes it).
type Action interface {
	// String renders the action on one line, for transcripts and logs.
	String() string
	// ProtocolAction marks the type as an action of a machine under
	// protocol/; it does nothing.
	ProtocolAction()
}

// Machine is the one shape of every pure state machine under protocol/:
// events in, a list of actions out.
//
// Obligations of a Machine: Step is deterministic (the same events in the
// same order give the same actions); it does no I/O, starts no goroutine,
// reads no clock and never blocks; it returns an error wrapping
// ErrUnknownEvent for an event of another machine, and an error wrapping
// ErrOutOfOrder for an event the protocol forbids in the machine's state
// (a driver bug), and an error wrapping ErrInvalidEvent for an event that
// contradicts its configuration, leaving the machine unchanged in all
// three cases.
//
// Obligations of a driver: it serialises Steps (machines are not safe for
// concurrent use); it performs the returned actions in order; it reports
// the outcome of an action that expects one as a later event (the pairs
// are listed in each package's doc).
type Machine interface {
	Step(Event) ([]Action, error)
}

// ErrUnknownEvent is wrapped by Step when a machine is given an event it
// does not handle (another machine's).
var ErrUnknownEvent = errors.New("protocol: event not handled by this machine")

// ErrOutOfOrder is wrapped by Step when an event contradicts the
// machine's state (the driver reported something the protocol does not
// allow now, e.g. the end of a compute that never started).
var ErrOutOfOrder = errors.New("protocol: event out of order")

// ErrInvalidEvent is wrapped by Step when an event contradicts the
// machine's configuration whatever its state (a snapshot that depends on
// a model the service graph does not make a previous stateful model).
var ErrInvalidEvent = errors.New("protocol: event contradicts the machine's configuration")

// UnknownEvent returns the error a machine's Step gives for an event it
// does not handle; machine names the machine ("nspb.Pipeline").
func UnknownEvent(machine string, ev Event) error {
	return fmt.Errorf("%s: %w: %v", machine, ErrUnknownEvent, ev)
}

// StepAll feeds evs to m in order and collects every action. It stops at
// the first error and returns the actions collected before it.
func StepAll(m Machine, evs ...Event) ([]Action, error) {
	var out []Action
	for _, ev := range evs {
		acts, err := m.Step(ev)
		if err != nil {
			return out, fmt.Errorf("step %v: %w", ev, err)
		}
		out = append(out, acts...)
	}
	return out, nil
}

// Select returns the actions of type A, in order (a driver that wants its
// machine's concrete action type, e.g. Select[recovery.Action]).
func Select[A Action](acts []Action) []A {
	out := make([]A, 0, len(acts))
	for _, a := range acts {
		if x, ok := a.(A); ok {
			out = append(out, x)
		}
	}
	return out
}

// Actions converts a machine's typed action list to the shared one (for
// machines whose existing methods return a concrete action type).
func Actions[A Action](acts []A) []Action {
	if acts == nil {
		return nil
	}
	out := make([]Action, len(acts))
	for i, a := range acts {
		out[i] = a
	}
	return out
}

// Render writes actions one per line, each prefixed by prefix (a
// transcript's rendering; "" for none).
func Render(prefix string, acts []Action) string {
	var b strings.Builder
	for _, a := range acts {
		b.WriteString(prefix)
		b.WriteString(a.String())
		b.WriteByte('\n')
	}
	return b.String()
}
