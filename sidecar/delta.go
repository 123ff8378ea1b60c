package sidecar

import (
	"fmt"

	"github.com/hams-go/hams/internal/bigmem"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Delta snapshots (capture at compute). A backend whose Describe has
// state_delta returns, with the outputs of batch n, the bytes its update
// will write (hamsv1.BatchResponse.state_delta); the primary ships them as
// snapshot n instead of copying the whole state after the update, and the
// backup patches them into the state of snapshot n-1. Full snapshots
// remain the base of a backup (at start, after a promotion, rollback or a
// backup move) and the only kind in the stop-to-copy modes.

// mergeRanges coalesces the deltas of consecutive snapshots, oldest
// first, into one that has the same effect: a range written again later
// with the same offset and length is dropped at its earlier position
// (the later write supersedes it whatever lies between); the others keep
// their order, which is the order they must be applied in.
func mergeRanges(lists ...[]*hamsv1.StateRange) []*hamsv1.StateRange {
	type key struct {
		off uint64
		n   int
	}
	last := map[key]int{}
	total := 0
	for _, l := range lists {
		total += len(l)
	}
	all := make([]*hamsv1.StateRange, 0, total)
	for _, l := range lists {
		for _, r := range l {
			last[key{r.GetOffset(), len(r.GetData())}] = len(all)
			all = append(all, r)
		}
	}
	out := all[:0:0]
	for i, r := range all {
		if last[key{r.GetOffset(), len(r.GetData())}] == i {
			out = append(out, r)
		}
	}
	return out
}

// rangeBytes is the data size of ranges.
func rangeBytes(rs []*hamsv1.StateRange) uint64 {
	var n uint64
	for _, r := range rs {
		n += uint64(len(r.GetData()))
	}
	return n
}

// checkRanges verifies that every range lies inside a state of total
// bytes.
func checkRanges(rs []*hamsv1.StateRange, total uint64) error {
	for _, r := range rs {
		if r.GetOffset() > total || uint64(len(r.GetData())) > total-r.GetOffset() {
			return fmt.Errorf("state range of %d bytes at %d outside the %d-byte state", len(r.GetData()), r.GetOffset(), total)
		}
	}
	return nil
}

// patchRanges writes rs into state (checked by checkRanges).
func patchRanges(state []byte, rs []*hamsv1.StateRange) {
	for _, r := range rs {
		bigmem.Copy(state[r.GetOffset():], r.GetData())
	}
}

// joinState is the concatenated bytes of state tensors, in a new buffer
// (not zeroed first: the tensors fill it, n bytes in all).
func joinState(ts []*hamsv1.Tensor) []byte {
	n := 0
	for _, t := range ts {
		n += len(t.GetData())
	}
	out := makeNoZero(n)
	off := 0
	for _, t := range ts {
		off += bigmem.Copy(out[off:], t.GetData())
	}
	return out
}

// specsOf is the tensor specs of state tensors.
func specsOf(ts []*hamsv1.Tensor) []*hamsv1.TensorSpec {
	specs := make([]*hamsv1.TensorSpec, len(ts))
	for i, t := range ts {
		specs[i] = &hamsv1.TensorSpec{Name: t.GetName(), Datatype: t.GetDatatype(), Shape: t.GetShape()}
	}
	return specs
}

// fold materializes a full snapshot: the state of full with the deltas
// of tail (applied after it, in order) patched into a new buffer (full
// itself is never written: a send or a rollback may be reading it). The
// result carries the header, ids and coverage of the last of tail.
func fold(full *snapshot, tail []*snapshot) (*snapshot, error) {
	m, _, err := foldBuf(full, tail)
	return m, err
}

// foldBuf is fold that also returns the new buffer its tensors are views
// of (nil when tail is empty: then it returns full itself).
func foldBuf(full *snapshot, tail []*snapshot) (*snapshot, []byte, error) {
	if len(tail) == 0 {
		return full, nil, nil
	}
	state := joinState(full.state)
	for _, d := range tail {
		if err := checkRanges(d.delta, uint64(len(state))); err != nil {
			return nil, nil, fmt.Errorf("fold delta snapshot %d: %w", d.batch, err)
		}
		patchRanges(state, d.delta)
	}
	specs := full.header.GetStateTensors()
	ts, err := tensor.SplitBySpecs(specs, state)
	if err != nil {
		return nil, nil, fmt.Errorf("fold delta snapshots into the state of %d: %w", full.batch, err)
	}
	top := tail[len(tail)-1]
	th := top.header
	h := &hamsv1.SnapshotHeader{Model: th.GetModel(), Epoch: th.GetEpoch(), BatchId: th.GetBatchId(), StateVersion: th.GetStateVersion(),
		Requests: th.GetRequests(), StateTensors: specs, StateBytes: uint64(len(state)), Outputs: th.GetOutputs(), OutputRows: th.GetOutputRows()}
	m := *top
	m.header, m.state, m.delta, m.digest = h, ts, nil, ""
	return &m, state, nil
}
