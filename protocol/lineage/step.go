package lineage

import (
	"fmt"
	"strings"

	"github.com/hams-go/hams/protocol"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Events of a Flow. A Flow is the degenerate machine of the vocabulary:
// it only records, so Step never returns an action; what it knows is read
// with Prefixes, Contig and MaxSeq (reads are methods, as in every
// machine here, never events).
type (
	// Observed: a request with lineage Lineage was seen (received,
	// executed, or covered by an applied snapshot; Flow.Add).
	Observed struct{ Lineage []*hamsv1.LineageEntry }
	// PairObserved: seq Seq of model From reached model To (Flow.AddPair).
	PairObserved struct {
		From, To string
		Seq      uint64
	}
)

// ProtocolEvent marks the type as a protocol.Event.
func (Observed) ProtocolEvent()     {}
func (PairObserved) ProtocolEvent() {}

func (e Observed) String() string {
	parts := make([]string, len(e.Lineage))
	for i, x := range e.Lineage {
		parts[i] = fmt.Sprintf("%s:%d>%s:%d", x.GetPredModel(), x.GetPredSeq(), x.GetModel(), x.GetSeq())
	}
	return "observed " + strings.Join(parts, ",")
}

func (e PairObserved) String() string { return fmt.Sprintf("pair %s:%d>%s", e.From, e.Seq, e.To) }

var _ protocol.Machine = (*Flow)(nil)

// Step records one event (Observed, PairObserved); it never returns an
// action. Observed keeps no reference to the lineage's entries.
func (f *Flow) Step(ev protocol.Event) ([]protocol.Action, error) {
	switch e := ev.(type) {
	case Observed:
		f.Add(e.Lineage)
	case PairObserved:
		f.AddPair(e.From, e.To, e.Seq)
	default:
		return nil, protocol.UnknownEvent("lineage.Flow", ev)
	}
	return nil, nil
}
