package sidecar

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Lineage records requests' lineage (paper Algorithm 1). It is a pure state
// machine, used by one goroutine (the sidecar's executor).
//
// Invariants: seq is the number of requests the model executed; seqs are
// handed out dense from 1 in execution order; the lineage of an output is
// the merged lineage of its inputs plus one entry per input
// <input's sender, its seq there, model, seq, output digest>.
type Lineage struct {
	model string
	seq   uint64
	// epoch is stamped on every entry (0: none; see stampEpoch).
	epoch uint64
	h     hash.Hash
	sum   [sha256.Size]byte
	hex   [2 * sha256.Size]byte
}

// NewLineage starts numbering after lastSeq (0 for a fresh model; a
// promoted backup resumes after its max_seq) and stamps epoch on the
// entries it writes (0: none).
func NewLineage(model string, lastSeq, epoch uint64) *Lineage {
	return &Lineage{model: model, seq: lastSeq, epoch: epoch, h: sha256.New()}
}

// Seq is the last seq assigned.
func (l *Lineage) Seq() uint64 { return l.seq }

// PredSeq is the seq a predecessor gave the request of item it: the
// req_id for a source edge (the frontend's position: edge_seq would not
// do, a resend renumbers it from 1), else the seq of the last lineage
// entry written by the sending model (0 if none).
func PredSeq(it *hamsv1.Item) uint64 {
	if it.GetFromModel() == config.Frontend {
		return it.GetReqId()
	}
	lin := it.GetLineage()
	for i := len(lin) - 1; i >= 0; i-- {
		if lin[i].GetModel() == it.GetFromModel() {
			return lin[i].GetSeq()
		}
	}
	return 0
}

// MergeLineage is the union of the parts' lineages in traversal order
// (first part's entries, then every other part's entries not seen yet),
// appended to dst. Entries are shared, not copied.
func MergeLineage(dst []*hamsv1.LineageEntry, parts []*hamsv1.Item) []*hamsv1.LineageEntry {
	if len(parts) == 0 {
		return dst
	}
	base := len(dst)
	dst = append(dst, parts[0].GetLineage()...)
	for _, p := range parts[1:] {
	next:
		for _, e := range p.GetLineage() {
			for _, f := range dst[base:] {
				if sameEntry(e, f) {
					continue next
				}
			}
			dst = append(dst, e)
		}
	}
	return dst
}

func sameEntry(a, b *hamsv1.LineageEntry) bool {
	return a == b || (a.GetSeq() == b.GetSeq() && a.GetPredSeq() == b.GetPredSeq() &&
		a.GetModel() == b.GetModel() && a.GetPredModel() == b.GetPredModel())
}

// Digest is the hex SHA-256 of the tensors' data (tensor.Digest without
// the per-call hasher).
func (l *Lineage) Digest(ts []*hamsv1.Tensor) string {
	l.h.Reset()
	for _, t := range ts {
		l.h.Write(t.GetData())
	}
	hex.Encode(l.hex[:], l.h.Sum(l.sum[:0]))
	return string(l.hex[:])
}

// RecordBatch assigns seqs to the executed requests of one batch, in order,
// and returns each request's output lineage. parts[i] are the items that
// formed request i (one per predecessor for a join), outputs[i] its output
// tensors. Entries of a batch share one allocation.
func (l *Lineage) RecordBatch(parts [][]*hamsv1.Item, outputs [][]*hamsv1.Tensor) (seqs []uint64, lineages [][]*hamsv1.LineageEntry) {
	n := len(parts)
	seqs = make([]uint64, n)
	lineages = make([][]*hamsv1.LineageEntry, n)
	newEntries, total := 0, 0
	for _, ps := range parts {
		newEntries += len(ps)
		for _, p := range ps {
			total += len(p.GetLineage())
		}
		total += len(ps)
	}
	slab := make([]hamsv1.LineageEntry, newEntries)
	ptrs := make([]*hamsv1.LineageEntry, 0, total)
	for i, ps := range parts {
		l.seq++
		seqs[i] = l.seq
		digest := l.Digest(outputs[i])
		start := len(ptrs)
		ptrs = MergeLineage(ptrs, ps)
		for _, p := range ps {
			e := &slab[0]
			slab = slab[1:]
			e.PredModel = p.GetFromModel()
			e.PredSeq = PredSeq(p)
			e.Model = l.model
			e.Seq = l.seq
			e.OutputDigest = digest
			e.Epoch = l.epoch
			ptrs = append(ptrs, e)
		}
		lineages[i] = ptrs[start:len(ptrs):len(ptrs)]
	}
	return seqs, lineages
}

// stampEpoch is the epoch a new Lineage of this sidecar stamps: a
// replicated stateful model's, so that a re-execution after a failover
// that repeats the lost execution's seq and output is still a new item
// downstream (edge.DedupKey); 0 for stateless models and the replay
// baseline, whose re-executions must stay duplicates of the originals.
func (s *Sidecar) stampEpoch(epoch uint64) uint64 {
	if s.replicated && s.rp == nil {
		return epoch
	}
	return 0
}
