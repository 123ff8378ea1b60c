package edge

import (
	"encoding/binary"
	"hash/fnv"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// DedupKey identifies one execution path of a request for duplicate drop:
// a hash of reqID and the set of its lineage entries, each reduced to
// <pred_model, model> and, for models stateful reports, also <seq,
// output_digest, epoch> (epoch when stamped). So:
//   - a resent copy (same lineage) has the key of the original;
//   - a stateless model re-running a request (a promoted standby numbers
//     it anew) yields the same key, and is dropped like a resend;
//   - a stateful model re-executing a request after failover (superseding
//     the lost, speculative execution) yields a new key, even when its seq
//     and output repeat the lost ones: the promoted instance stamps its
//     new epoch. Without the epoch, a stateless model between it and the
//     frontend dropped such a re-execution as a stateless re-run of the
//     lost one, whose reply the frontend had rolled back: the request was
//     never answered (olv chaos runs, about 1 kill in 15);
//   - interleaved fan-in executes one request once per branch: the
//     branches differ in their <pred_model, model> entries.
//
// The set is order-independent, so the key of an item equals the key
// computed from the ancestor closure of its sender's entry in a merged
// lineage (see Closure).
func DedupKey(reqID uint64, lineage []*hamsv1.LineageEntry, stateful func(string) bool) uint64 {
	var sum uint64
	h := fnv.New64a()
	var b [8]byte
	for _, e := range lineage {
		h.Reset()
		h.Write([]byte(e.GetPredModel()))
		h.Write([]byte{0})
		h.Write([]byte(e.GetModel()))
		if stateful != nil && stateful(e.GetModel()) {
			binary.LittleEndian.PutUint64(b[:], e.GetSeq())
			h.Write(b[:])
			h.Write([]byte(e.GetOutputDigest()))
			if ep := e.GetEpoch(); ep != 0 {
				binary.LittleEndian.PutUint64(b[:], ep)
				h.Write(b[:])
			}
		}
		sum += mix(h.Sum64())
	}
	binary.LittleEndian.PutUint64(b[:], reqID)
	h.Reset()
	h.Write(b[:])
	return mix(h.Sum64() ^ sum)
}

// mix is splitmix64's finaliser (sums of well-mixed hashes stay well
// distributed).
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Closure returns the entries of lineage that are ancestors of <model,
// seq> (the entries of model at seq, and recursively those of their
// predecessors at their pred_seq): the lineage the item model sent for
// that request carried. Entries of the frontend end the walk.
func Closure(lineage []*hamsv1.LineageEntry, model string, seq uint64) []*hamsv1.LineageEntry {
	type node struct {
		m string
		s uint64
	}
	seen := map[node]bool{}
	todo := []node{{model, seq}}
	var out []*hamsv1.LineageEntry
	for len(todo) > 0 {
		n := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if seen[n] {
			continue
		}
		seen[n] = true
		for _, e := range lineage {
			if e.GetModel() == n.m && e.GetSeq() == n.s {
				out = append(out, e)
				todo = append(todo, node{e.GetPredModel(), e.GetPredSeq()})
			}
		}
	}
	return out
}
