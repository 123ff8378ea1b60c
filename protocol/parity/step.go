package parity

import (
	"fmt"
	"time"

	"github.com/hams-go/hams/protocol"
)

// Events of the pool Machine. Time is data: every event carries Now, the
// driver's monotonic clock as an offset, and the machine reads no clock of
// its own; TimePassed is the event a driver delivers at NextDeadline.
// Outcomes of actions: ActRunData -> DataDone or DataFailed, ActEncode ->
// ParityEncoded, ActRunParity -> ParityDone or ParityFailed, ActDecode ->
// GroupDecoded; the other actions expect no answer.
type (
	// Submitted: data batch Batch enters the pool (ids are new).
	Submitted struct {
		Batch BatchID
		Now   time.Duration
	}
	// ParityEncoded: parity batch Parity of Group was built (OK) or could
	// not be (the group gets no parity Parity).
	ParityEncoded struct {
		Group  GroupID
		Parity int
		OK     bool
		Now    time.Duration
	}
	// DataDone: data instance Instance answered Batch with its original
	// output.
	DataDone struct {
		Batch    BatchID
		Instance Instance
		Now      time.Duration
	}
	// DataFailed: data instance Instance failed Batch; Retryable: the
	// instance, not the request, is at fault.
	DataFailed struct {
		Batch     BatchID
		Instance  Instance
		Retryable bool
		Now       time.Duration
	}
	// ParityDone: parity instance Instance answered parity Parity of
	// Group.
	ParityDone struct {
		Group    GroupID
		Parity   int
		Instance Instance
		Now      time.Duration
	}
	// ParityFailed: parity Parity of Group failed or answered garbage.
	ParityFailed struct {
		Group     GroupID
		Parity    int
		Instance  Instance
		Retryable bool
		Now       time.Duration
	}
	// GroupDecoded: the driver ran Group's ActDecode with parities
	// Parities; OK false: a parity output did not fit.
	GroupDecoded struct {
		Group    GroupID
		Parities []int
		OK       bool
		Now      time.Duration
	}
	// Cancelled: the caller of Batch is gone.
	Cancelled struct {
		Batch BatchID
		Now   time.Duration
	}
	// TimePassed: the driver's clock reached Now (decode_after, hedging,
	// backoffs, settling; Machine.Tick).
	TimePassed struct{ Now time.Duration }
)

// ProtocolEvent marks the type as a protocol.Event.
func (Submitted) ProtocolEvent()     {}
func (ParityEncoded) ProtocolEvent() {}
func (DataDone) ProtocolEvent()      {}
func (DataFailed) ProtocolEvent()    {}
func (ParityDone) ProtocolEvent()    {}
func (ParityFailed) ProtocolEvent()  {}
func (GroupDecoded) ProtocolEvent()  {}
func (Cancelled) ProtocolEvent()     {}
func (TimePassed) ProtocolEvent()    {}

func (e Submitted) String() string { return fmt.Sprintf("submit b%d at %v", e.Batch, e.Now) }
func (e ParityEncoded) String() string {
	return fmt.Sprintf("encoded g%d p%d ok=%v at %v", e.Group, e.Parity, e.OK, e.Now)
}
func (e DataDone) String() string {
	return fmt.Sprintf("done b%d d%d at %v", e.Batch, e.Instance, e.Now)
}
func (e DataFailed) String() string {
	return fmt.Sprintf("fail b%d d%d retry=%v at %v", e.Batch, e.Instance, e.Retryable, e.Now)
}
func (e ParityDone) String() string {
	return fmt.Sprintf("pdone g%d p%d on p%d at %v", e.Group, e.Parity, e.Instance, e.Now)
}
func (e ParityFailed) String() string {
	return fmt.Sprintf("pfail g%d p%d on p%d retry=%v at %v", e.Group, e.Parity, e.Instance, e.Retryable, e.Now)
}
func (e GroupDecoded) String() string {
	return fmt.Sprintf("decoded g%d parities %v ok=%v at %v", e.Group, e.Parities, e.OK, e.Now)
}
func (e Cancelled) String() string  { return fmt.Sprintf("cancel b%d at %v", e.Batch, e.Now) }
func (e TimePassed) String() string { return fmt.Sprintf("tick at %v", e.Now) }

// ProtocolAction marks Action as a protocol.Action.
func (Action) ProtocolAction() {}

var _ protocol.Machine = (*Machine)(nil)

// Step feeds one event to the pool machine and returns the actions (each
// a parity.Action) to perform in order: the same as the direct method the
// event names. A batch submitted twice is an error wrapping
// protocol.ErrOutOfOrder and changes nothing (Submit panics instead).
func (m *Machine) Step(ev protocol.Event) ([]protocol.Action, error) {
	var acts []Action
	switch e := ev.(type) {
	case Submitted:
		if _, dup := m.batches[e.Batch]; dup {
			return nil, fmt.Errorf("parity: batch %d submitted twice: %w", e.Batch, protocol.ErrOutOfOrder)
		}
		acts = m.Submit(e.Batch, e.Now)
	case ParityEncoded:
		acts = m.Encoded(e.Group, e.Parity, e.OK, e.Now)
	case DataDone:
		acts = m.DataDone(e.Batch, e.Instance, e.Now)
	case DataFailed:
		acts = m.DataFailed(e.Batch, e.Instance, e.Retryable, e.Now)
	case ParityDone:
		acts = m.ParityDone(e.Group, e.Parity, e.Instance, e.Now)
	case ParityFailed:
		acts = m.ParityFailed(e.Group, e.Parity, e.Instance, e.Retryable, e.Now)
	case GroupDecoded:
		acts = m.Decoded(e.Group, e.Parities, e.OK, e.Now)
	case Cancelled:
		acts = m.Cancel(e.Batch, e.Now)
	case TimePassed:
		acts = m.Tick(e.Now)
	default:
		return nil, protocol.UnknownEvent("parity.Machine", ev)
	}
	return protocol.Actions(acts), nil
}
