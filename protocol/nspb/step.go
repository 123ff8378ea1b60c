package nspb

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hams-go/hams/protocol"
)

// Events of the primary's Pipeline. Each is the outcome of an action the
// pipeline asked for (Update -> Updated, Copy -> Copied or CopyLost, Ship
// -> Acked) or of the driver's own decision (ComputeStarted, once
// CanCompute; CopyWanted, on demand).
type (
	// ComputeStarted: the driver started computing batch Batch (the next
	// one; it checked CanCompute).
	ComputeStarted struct{ Batch uint64 }
	// Computed: the compute of batch Batch returned.
	Computed struct{ Batch uint64 }
	// Updated: the update of batch Batch returned.
	Updated struct{ Batch uint64 }
	// Copied: the copy of the state after batch Batch is captured.
	Copied struct{ Batch uint64 }
	// CopyLost: the copy of batch Batch, reported Copied, failed before
	// its data arrived (on demand only).
	CopyLost struct{ Batch uint64 }
	// Acked: the backup has received the snapshot of batch Batch
	// (cumulative).
	Acked struct{ Batch uint64 }
	// CopyWanted: the driver can take a new snapshot (on demand only;
	// RequestCopy).
	CopyWanted struct{}
)

// Events of the Backup (Algorithm 2) and of the ReplyGate. Durable is
// shared: the same announcement feeds a backup (the apply rule) and the
// frontend's gate (the release rule), which is the paper's point that the
// frontend is the special model whose "apply" is the reply.
type (
	// SnapshotReceived: a snapshot arrived from the primary.
	SnapshotReceived struct{ Snapshot SnapshotMeta }
	// Durable: Model (a previous stateful model of the receiver) announced
	// durability up to Seq.
	Durable struct {
		Model string
		Seq   uint64
	}
	// ReplyArrived: the reply to request ReqID arrived at the frontend;
	// Deps maps each stateful model of its lineage to the seq it names.
	ReplyArrived struct {
		ReqID uint64
		Deps  map[string]uint64
	}
	// ReplyDropped: the held reply of ReqID is no longer wanted (its
	// deadline expired, its client left).
	ReplyDropped struct{ ReqID uint64 }
)

// ReleaseReply is the ReplyGate's action: the reply to ReqID may leave
// for the client (every state it depends on is durable).
type ReleaseReply struct{ ReqID uint64 }

// ProtocolAction marks ReleaseReply as a protocol.Action.
func (ReleaseReply) ProtocolAction() {}

func (a ReleaseReply) String() string { return fmt.Sprintf("release-reply req=%d", a.ReqID) }

// ProtocolEvent marks the type as a protocol.Event.
func (ComputeStarted) ProtocolEvent()   {}
func (Computed) ProtocolEvent()         {}
func (Updated) ProtocolEvent()          {}
func (Copied) ProtocolEvent()           {}
func (CopyLost) ProtocolEvent()         {}
func (Acked) ProtocolEvent()            {}
func (CopyWanted) ProtocolEvent()       {}
func (SnapshotReceived) ProtocolEvent() {}
func (Durable) ProtocolEvent()          {}
func (ReplyArrived) ProtocolEvent()     {}
func (ReplyDropped) ProtocolEvent()     {}

func (e ComputeStarted) String() string { return fmt.Sprintf("compute-started batch=%d", e.Batch) }
func (e Computed) String() string       { return fmt.Sprintf("computed batch=%d", e.Batch) }
func (e Updated) String() string        { return fmt.Sprintf("updated batch=%d", e.Batch) }
func (e Copied) String() string         { return fmt.Sprintf("copied batch=%d", e.Batch) }
func (e CopyLost) String() string       { return fmt.Sprintf("copy-lost batch=%d", e.Batch) }
func (e Acked) String() string          { return fmt.Sprintf("acked batch=%d", e.Batch) }
func (CopyWanted) String() string       { return "copy-wanted" }
func (e Durable) String() string        { return fmt.Sprintf("durable %s seq=%d", e.Model, e.Seq) }
func (e ReplyDropped) String() string   { return fmt.Sprintf("reply-dropped req=%d", e.ReqID) }

func (e SnapshotReceived) String() string {
	s := e.Snapshot
	return fmt.Sprintf("snapshot batch=%d maxseq=%d deps=%s", s.BatchID, s.MaxSeq, formatSeqs(s.Deps))
}

func (e ReplyArrived) String() string {
	return fmt.Sprintf("reply-arrived req=%d deps=%s", e.ReqID, formatSeqs(e.Deps))
}

// formatSeqs renders a model -> seq map as "a:3,b:5" (sorted by model;
// "-" when empty), the form transcripts use.
func formatSeqs(m map[string]uint64) string {
	if len(m) == 0 {
		return "-"
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = fmt.Sprintf("%s:%d", k, m[k])
	}
	return strings.Join(parts, ",")
}

var (
	_ protocol.Machine = (*Pipeline)(nil)
	_ protocol.Machine = (*Backup)(nil)
	_ protocol.Machine = (*ReplyGate)(nil)
)

// Step feeds one event to the pipeline (ComputeStarted, Computed, Updated,
// Copied, CopyLost, Acked, CopyWanted) and returns the actions (Release,
// Update, Copy, Ship) to perform in order. An event out of order is an
// error wrapping protocol.ErrOutOfOrder and changes nothing (the direct
// methods panic instead).
func (p *Pipeline) Step(ev protocol.Event) ([]protocol.Action, error) {
	switch e := ev.(type) {
	case ComputeStarted:
		return nil, p.startCompute(e.Batch)
	case Computed:
		return p.computedEv(e.Batch)
	case Updated:
		return p.updatedEv(e.Batch)
	case Copied:
		return p.copiedEv(e.Batch)
	case CopyLost:
		return p.copyLostEv(e.Batch)
	case Acked:
		return p.ackedEv(e.Batch)
	case CopyWanted:
		return p.RequestCopy(), nil
	}
	return nil, protocol.UnknownEvent("nspb.Pipeline", ev)
}

// Step feeds one event to the backup (SnapshotReceived, Durable) and
// returns the Apply and Announce actions to perform in order (each Apply
// directly followed by its Announce).
func (b *Backup) Step(ev protocol.Event) ([]protocol.Action, error) {
	switch e := ev.(type) {
	case SnapshotReceived:
		return b.Snapshot(e.Snapshot)
	case Durable:
		return b.Durable(e.Model, e.Seq), nil
	}
	return nil, protocol.UnknownEvent("nspb.Backup", ev)
}

// Step feeds one event to the gate (ReplyArrived, Durable, ReplyDropped)
// and returns a ReleaseReply per reply that may leave now, in the order
// Hold and Durable release them.
func (g *ReplyGate) Step(ev protocol.Event) ([]protocol.Action, error) {
	switch e := ev.(type) {
	case ReplyArrived:
		if g.Hold(e.ReqID, e.Deps) {
			return []protocol.Action{ReleaseReply{ReqID: e.ReqID}}, nil
		}
		return nil, nil
	case Durable:
		var out []protocol.Action
		for _, id := range g.Durable(e.Model, e.Seq) {
			out = append(out, ReleaseReply{ReqID: id})
		}
		return out, nil
	case ReplyDropped:
		g.Drop(e.ReqID)
		return nil, nil
	}
	return nil, protocol.UnknownEvent("nspb.ReplyGate", ev)
}
