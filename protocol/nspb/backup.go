package nspb

import (
	"fmt"
	"sort"
	"strings"

	"github.com/hams-go/hams/protocol"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// SnapshotMeta is what the apply rule needs to know of one snapshot.
type SnapshotMeta struct {
	// BatchID numbers the primary's batches densely from 1; the backup
	// applies snapshots strictly in this order, since each one holds the full
	// state after its batch.
	BatchID uint64
	// MaxSeq is the highest request seq (at this model) the snapshot covers:
	// once applied, every request up to MaxSeq is durable.
	MaxSeq uint64
	// Deps maps each previous stateful model to the highest seq of that
	// model named in the lineage of the snapshot's requests.
	Deps map[string]uint64
}

// DepsOf computes SnapshotMeta.Deps from the lineage of a snapshot's
// requests: for every entry whose model is a PFM, the highest seq.
func DepsOf(pfm []string, lineages ...[]*hamsv1.LineageEntry) map[string]uint64 {
	deps := map[string]uint64{}
	if len(pfm) == 0 {
		return deps
	}
	is := make(map[string]bool, len(pfm))
	for _, m := range pfm {
		is[m] = true
	}
	for _, l := range lineages {
		for _, e := range l {
			if is[e.Model] && e.Seq > deps[e.Model] {
				deps[e.Model] = e.Seq
			}
		}
	}
	return deps
}

// Action is something a driver must do, in the order returned: the
// shared vocabulary of every machine under protocol/ (an alias, so the
// machines of this package and their drivers speak protocol.Action).
type Action = protocol.Action

// Apply tells the backup's driver to install snapshot BatchID.
type Apply struct {
	BatchID uint64
	MaxSeq  uint64
}

// Announce tells the driver to publish that Model is durable up to
// DurableSeq (on JetStream, to the next stateful models and the frontend).
// It always follows the Apply it results from.
type Announce struct {
	Model      string
	DurableSeq uint64
	BatchID    uint64
	To         []string
}

// ProtocolAction marks Apply as a protocol.Action.
func (Apply) ProtocolAction() {}

// ProtocolAction marks Announce as a protocol.Action.
func (Announce) ProtocolAction() {}

func (a Apply) String() string { return fmt.Sprintf("apply batch=%d maxseq=%d", a.BatchID, a.MaxSeq) }

func (a Announce) String() string {
	return fmt.Sprintf("announce %s durable=%d batch=%d to=%s", a.Model, a.DurableSeq, a.BatchID, strings.Join(a.To, ","))
}

// Backup is Algorithm 2 of the HAMS paper for one stateful model's backup.
//
// Invariants: snapshots are applied in BatchID order without gaps; snapshot
// k is applied only when, for every PFM m, the durable seq announced by m is
// at least Deps[m] of snapshot k (so a state never becomes durable before a
// state it depends on); every Apply is followed by one Announce of the
// snapshot's MaxSeq.
type Backup struct {
	model    string
	pfm      map[string]bool
	nfm      []string
	durable  map[string]uint64
	pending  map[uint64]SnapshotMeta
	applied  uint64 // last applied batch id
	appliedS uint64 // durable seq of this model
}

// NewBackup starts a backup whose state already includes batches up to
// appliedBatch (0 for a fresh model).
func NewBackup(model string, pfm, nfm []string, appliedBatch, appliedSeq uint64) *Backup {
	b := &Backup{
		model:    model,
		pfm:      map[string]bool{},
		nfm:      append([]string(nil), nfm...),
		durable:  map[string]uint64{},
		pending:  map[uint64]SnapshotMeta{},
		applied:  appliedBatch,
		appliedS: appliedSeq,
	}
	for _, m := range pfm {
		b.pfm[m] = true
	}
	return b
}

// Snapshot is the event "a snapshot arrived from the primary". A snapshot
// already applied or already pending is ignored (a resend after a broken
// stream). Deps on models that are not PFMs are an error: the lineage and
// the graph disagree.
func (b *Backup) Snapshot(s SnapshotMeta) ([]Action, error) {
	for m := range s.Deps {
		if !b.pfm[m] {
			return nil, fmt.Errorf("nspb: snapshot %d of %s depends on %s, which is not a previous stateful model: %w", s.BatchID, b.model, m, protocol.ErrInvalidEvent)
		}
	}
	if s.BatchID == 0 {
		return nil, fmt.Errorf("nspb: snapshot of %s has batch id 0: %w", b.model, protocol.ErrInvalidEvent)
	}
	if s.BatchID <= b.applied {
		return nil, nil
	}
	if _, dup := b.pending[s.BatchID]; dup {
		return nil, nil
	}
	b.pending[s.BatchID] = s
	return b.drain(), nil
}

// Durable is the event "PFM model announced durability up to seq".
// Announcements never move backwards; an older one is ignored, and so is one
// from a model that is not a PFM.
func (b *Backup) Durable(model string, seq uint64) []Action {
	if !b.pfm[model] || seq <= b.durable[model] {
		return nil
	}
	b.durable[model] = seq
	return b.drain()
}

func (b *Backup) ready(s SnapshotMeta) bool {
	for m, need := range s.Deps {
		if b.durable[m] < need {
			return false
		}
	}
	return true
}

func (b *Backup) drain() []Action {
	var out []Action
	for {
		s, ok := b.pending[b.applied+1]
		if !ok || !b.ready(s) {
			return out
		}
		delete(b.pending, s.BatchID)
		b.applied = s.BatchID
		if s.MaxSeq > b.appliedS {
			b.appliedS = s.MaxSeq
		}
		out = append(out,
			Apply{BatchID: s.BatchID, MaxSeq: s.MaxSeq},
			Announce{Model: b.model, DurableSeq: b.appliedS, BatchID: s.BatchID, To: b.nfm},
		)
	}
}

// Applied returns the last applied batch id and the durable seq.
func (b *Backup) Applied() (batchID, seq uint64) { return b.applied, b.appliedS }

// Pending returns the batch ids held, sorted.
func (b *Backup) Pending() []uint64 {
	ids := make([]uint64, 0, len(b.pending))
	for id := range b.pending {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// Blocker explains why the next snapshot is not applied: a missing batch
// (model == "") or a PFM whose durability lags (need > have).
func (b *Backup) Blocker() (batchID uint64, model string, need, have uint64, blocked bool) {
	s, ok := b.pending[b.applied+1]
	if !ok {
		return b.applied + 1, "", 0, 0, len(b.pending) > 0
	}
	ms := make([]string, 0, len(s.Deps))
	for m := range s.Deps {
		ms = append(ms, m)
	}
	sort.Strings(ms)
	for _, m := range ms {
		if b.durable[m] < s.Deps[m] {
			return s.BatchID, m, s.Deps[m], b.durable[m], true
		}
	}
	return 0, "", 0, 0, false
}
