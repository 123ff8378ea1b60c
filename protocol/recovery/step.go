package recovery

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hams-go/hams/protocol"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Events of the recovery Machine. Every query the machine issues
// (GetMaxSeq, GetLineageSummary) is answered by exactly one of
// MaxSeqAnswered, SummaryAnswered or QueryFailed with the action's ID;
// every other action that is not a notice (Kind.Notice) by ActionDone.
type (
	// TopologyChanged: the newest deployment state.
	TopologyChanged struct{ Topology *hamsv1.Topology }
	// Suspected: Component, an instance of Model in Role, is suspected to
	// have failed (an RPC timeout, a missed heartbeat).
	Suspected struct {
		Model     string
		Role      hamsv1.Role
		Component string
	}
	// MaxSeqAnswered: the backup asked by GetMaxSeq ID answered MaxSeq.
	MaxSeqAnswered struct {
		ID     ActionID
		MaxSeq uint64
	}
	// SummaryAnswered: the instance asked by GetLineageSummary ID
	// answered Summary.
	SummaryAnswered struct {
		ID      ActionID
		Summary Summary
	}
	// QueryFailed: query ID got no answer (timeout, refused); Err says
	// why.
	QueryFailed struct {
		ID  ActionID
		Err error
	}
	// ActionDone: the non-query action ID was performed; Err is its
	// failure (nil: done).
	ActionDone struct {
		ID  ActionID
		Err error
	}
	// AliveAgain: Component, declared dead by membership, was heard from
	// again (answered by one Readmit or Retire; alive.go).
	AliveAgain struct{ Component string }
	// SpareJoined: Component joined as a live spare (STANDBY) of a
	// stateful model (backupreplace.go).
	SpareJoined struct{ Component string }
)

// ProtocolEvent marks the type as a protocol.Event.
func (TopologyChanged) ProtocolEvent() {}
func (Suspected) ProtocolEvent()       {}
func (MaxSeqAnswered) ProtocolEvent()  {}
func (SummaryAnswered) ProtocolEvent() {}
func (QueryFailed) ProtocolEvent()     {}
func (ActionDone) ProtocolEvent()      {}
func (AliveAgain) ProtocolEvent()      {}
func (SpareJoined) ProtocolEvent()     {}

// ProtocolAction marks Action as a protocol.Action (its String is the
// one-line rendering).
func (Action) ProtocolAction() {}

func (e TopologyChanged) String() string {
	var ps []string
	for _, p := range e.Topology.GetPlacements() {
		alive := "dead"
		if p.GetAlive() {
			alive = "alive"
		}
		ps = append(ps, fmt.Sprintf("%s@%s %s epoch=%d %s", p.GetComponentId(), p.GetModel(), p.GetRole(), p.GetEpoch(), alive))
	}
	return "topology [" + strings.Join(ps, "; ") + "]"
}

func (e Suspected) String() string {
	return fmt.Sprintf("suspect %s@%s %s", e.Component, e.Model, e.Role)
}

func (e MaxSeqAnswered) String() string { return fmt.Sprintf("maxseq #%d seq=%d", e.ID, e.MaxSeq) }

func (e SummaryAnswered) String() string {
	s := e.Summary
	return fmt.Sprintf("summary #%d maxout=%d maxin=%v consumed-beyond=%v", e.ID, s.MaxOut, s.MaxIn, s.ConsumedBeyond)
}

func (e QueryFailed) String() string { return fmt.Sprintf("query-failed #%d: %v", e.ID, e.Err) }

func (e ActionDone) String() string {
	if e.Err != nil {
		return fmt.Sprintf("done #%d: %v", e.ID, e.Err)
	}
	return fmt.Sprintf("done #%d", e.ID)
}

func (e AliveAgain) String() string  { return "alive-again " + e.Component }
func (e SpareJoined) String() string { return "spare-joined " + e.Component }

var _ protocol.Machine = (*Machine)(nil)

// errNoAnswer stands in for a QueryFailed event without a cause.
var errNoAnswer = errors.New("recovery: no answer")

// Step feeds one event to the machine and returns the actions (each a
// recovery.Action) to perform in order; it is the machine's only entry
// point (each event has its handler, on plus the event's name). An answer
// to an action the machine does not wait for is an error wrapping
// ErrUnknownAction and protocol.ErrOutOfOrder; an event of another
// machine one wrapping protocol.ErrUnknownEvent. Either leaves the
// machine unchanged.
func (m *Machine) Step(ev protocol.Event) ([]protocol.Action, error) {
	var acts []Action
	var err error
	switch e := ev.(type) {
	case TopologyChanged:
		acts = m.onTopologyChanged(e.Topology)
	case Suspected:
		acts = m.onSuspected(e.Model, e.Role, e.Component)
	case MaxSeqAnswered:
		acts, err = m.onMaxSeqAnswered(e.ID, e.MaxSeq)
	case SummaryAnswered:
		acts, err = m.onSummaryAnswered(e.ID, e.Summary)
	case QueryFailed:
		cause := e.Err
		if cause == nil {
			cause = errNoAnswer
		}
		acts, err = m.onQueryFailed(e.ID, cause)
	case ActionDone:
		acts, err = m.onActionDone(e.ID, e.Err)
	case AliveAgain:
		acts = m.onAliveAgain(e.Component)
	case SpareJoined:
		acts = m.onSpareJoined(e.Component)
	default:
		return nil, protocol.UnknownEvent("recovery.Machine", ev)
	}
	if err != nil {
		return nil, fmt.Errorf("%w (%w)", err, protocol.ErrOutOfOrder)
	}
	return protocol.Actions(acts), nil
}
