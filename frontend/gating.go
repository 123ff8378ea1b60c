package frontend

import (
	"container/heap"
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/protocol"
	"github.com/hams-go/hams/protocol/nspb"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// gatingModes are the modes whose primaries release outputs before their
// state is durable (early release), so the frontend must hold replies until
// the states they depend on are durable (protocol step 5). In remus and
// nspb-s1 the primaries hold outputs themselves; bare and replay promise no
// such consistency.
var gatingModes = map[config.Mode]bool{config.ModeNSPB: true, config.ModeNSPBS2: true}

// replyDeps are the dependencies of a reply: for every lineage entry of a
// replicated stateful model (in stateful), the highest seq the lineage
// names for that model. Nil when the reply depends on no such model.
func replyDeps(lineage []*hamsv1.LineageEntry, stateful map[string]bool) map[string]uint64 {
	var deps map[string]uint64
	for _, l := range lineage {
		if !stateful[l.GetModel()] {
			continue
		}
		if deps == nil {
			deps = map[string]uint64{}
		}
		if l.GetSeq() > deps[l.GetModel()] {
			deps[l.GetModel()] = l.GetSeq()
		}
	}
	return deps
}

// holds is the frontend's pure hold area: replies whose sinks all arrived
// but that wait for the durability of the stateful states they depend on.
// It wraps an nspb.ReplyGate (the release rule) and adds the replies
// themselves and their deadlines. No goroutines, no locks, no clock (the
// caller passes now).
//
// Invariants: byID and the gate's held set hold the same req_ids; the
// deadline heap holds exactly the entries of byID; a reply leaves through
// exactly one of release (durable), expire or drop, at most once.
//
// Epochs: the gate also tracks, per model, the epoch of the last
// durability notice. A notice at a higher epoch (a new primary took over)
// rolls back: every held reply depending on the model beyond the notice's
// durable_seq came from speculative state that the failover lost, so it
// leaves the hold area (rollback returns it, and the caller puts its
// request back to await the re-executed items), and the gate restarts from
// the notice's durable_seq for that model (it may be lower than before).
type holds struct {
	gate      *nspb.ReplyGate
	byID      map[uint64]*heldReply
	byDue     heldHeap
	epochs    map[string]uint64
	durableAt map[string]uint64
	// failovers lists, per model, the failovers seen (the new epoch and
	// the durable seq it took over from), oldest first, at most
	// maxFailovers: an item that names an execution one of them lost
	// must not be used, whenever it arrives (lostLater).
	failovers map[string][]failover
}

// failover is one new epoch of a model and the seq it took over from.
type failover struct{ epoch, seq uint64 }

// maxFailovers bounds the failovers remembered per model.
const maxFailovers = 16

// heldReply is one reply waiting for durability.
type heldReply struct {
	reqID    uint64
	resp     *hamsv1.PredictResponse
	deps     map[string]uint64
	since    time.Time // when the last sink item arrived
	deadline time.Time
	heapIdx  int
	// comp is the table's completion (the request's parts), kept so the
	// request can go back into the table after a rollback.
	comp *completion
}

func newHolds() *holds {
	return &holds{gate: nspb.NewReplyGate(), byID: map[uint64]*heldReply{}, epochs: map[string]uint64{}, durableAt: map[string]uint64{},
		failovers: map[string][]failover{}}
}

// notice applies a durability notice of model at epoch: it returns the
// replies it releases (in req_id order) and, when the epoch is higher than
// the last one seen for model, the replies it rolls back (see holds). A
// notice of an older epoch is ignored.
func (h *holds) notice(model string, epoch, seq uint64) (released, rolled []*heldReply, newEpoch bool) {
	last, known := h.epochs[model]
	switch {
	case known && epoch < last:
		return nil, nil, false
	case known && epoch > last:
		h.epochs[model] = epoch
		fo := append(h.failovers[model], failover{epoch: epoch, seq: seq})
		if len(fo) > maxFailovers {
			fo = fo[len(fo)-maxFailovers:]
		}
		h.failovers[model] = fo
		rolled, released = h.rollback(model, seq)
		return released, rolled, true
	}
	h.epochs[model] = epoch
	return h.durable(model, seq), nil, false
}

// rollback removes the held replies depending on model beyond seq and
// rebuilds the gate with model durable up to seq; it returns the removed
// replies and the ones the rebuilt gate releases.
func (h *holds) rollback(model string, seq uint64) (rolled, released []*heldReply) {
	h.durableAt[model] = seq
	for _, r := range h.byID {
		if r.deps[model] > seq {
			rolled = append(rolled, r)
		}
	}
	sort.Slice(rolled, func(i, j int) bool { return rolled[i].reqID < rolled[j].reqID })
	for _, r := range rolled {
		h.remove(r)
	}
	h.gate = nspb.NewReplyGate()
	for m, s := range h.durableAt {
		h.step(nspb.Durable{Model: m, Seq: s}) // a new gate holds nothing to release
	}
	var ids []uint64
	for id := range h.byID {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		r := h.byID[id]
		if len(h.step(nspb.ReplyArrived{ReqID: id, Deps: r.deps})) > 0 {
			h.remove(r)
			released = append(released, r)
		}
	}
	return rolled, released
}

// hold registers a complete reply with its dependencies. It reports true
// when every dependency is durable already: the reply is not kept and may
// leave at once.
func (h *holds) hold(reqID uint64, resp *hamsv1.PredictResponse, deps map[string]uint64, since, deadline time.Time) bool {
	return h.holdComp(&completion{reqID: reqID, resp: resp, deadline: deadline}, deps, since)
}

// holdComp is hold with the table's completion kept for a rollback.
func (h *holds) holdComp(c *completion, deps map[string]uint64, since time.Time) bool {
	reqID, resp, deadline := c.reqID, c.resp, c.deadline
	if len(h.step(nspb.ReplyArrived{ReqID: reqID, Deps: deps})) > 0 {
		return true
	}
	r := &heldReply{reqID: reqID, resp: resp, deps: deps, since: since, deadline: deadline, comp: c}
	h.byID[reqID] = r
	heap.Push(&h.byDue, r)
	return false
}

// lostLater reports whether lineage names an execution that a failover
// seen before lost: an entry of the model stamped with an older epoch than
// the failover's and a seq beyond the seq it took over from. Such an item
// is the deposed primary's speculative output (or one computed from it
// downstream) still on its way when the failover's notice came, or kept
// aside for a request injected since (a takeover): its seq is re-executed
// by the new primary, with another output, and the gate, which compares
// seqs, would release it once the new history is durable that far.
// Unstamped entries (epoch 0) are not judged here (they are at the
// failover itself, dropParts).
func (h *holds) lostLater(lineage []*hamsv1.LineageEntry) bool {
	for _, l := range lineage {
		if l.GetEpoch() == 0 {
			continue
		}
		for _, fo := range h.failovers[l.GetModel()] {
			if l.GetEpoch() < fo.epoch && l.GetSeq() > fo.seq {
				return true
			}
		}
	}
	return false
}

// durable records that model is durable up to seq and returns the replies
// this releases, in req_id order.
func (h *holds) durable(model string, seq uint64) []*heldReply {
	if seq > h.durableAt[model] {
		h.durableAt[model] = seq
	}
	ids := h.step(nspb.Durable{Model: model, Seq: seq})
	if len(ids) == 0 {
		return nil
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	out := make([]*heldReply, 0, len(ids))
	for _, id := range ids {
		r := h.byID[id]
		if r == nil {
			continue // cannot happen: the gate and byID hold the same ids
		}
		h.remove(r)
		out = append(out, r)
	}
	return out
}

// drop forgets a held reply (its caller gave up, shutdown); it reports
// whether the reply was held.
func (h *holds) drop(reqID uint64) bool {
	r := h.byID[reqID]
	if r == nil {
		return false
	}
	h.step(nspb.ReplyDropped{ReqID: reqID})
	h.remove(r)
	return true
}

// expire drops every held reply whose deadline is at or before now and
// returns them with the DeadlineExceeded status their callers get.
func (h *holds) expire(now time.Time) []expiredHold {
	var out []expiredHold
	for len(h.byDue) > 0 && !h.byDue[0].deadline.After(now) {
		r := h.byDue[0]
		err := status.Errorf(codes.DeadlineExceeded, "request %d of service %q: deadline exceeded waiting for durability of %s",
			r.reqID, r.resp.GetService(), h.missing(r))
		h.step(nspb.ReplyDropped{ReqID: r.reqID})
		h.remove(r)
		out = append(out, expiredHold{reqID: r.reqID, err: err})
	}
	return out
}

// step feeds one event to the reply gate (the gate's one entry for events,
// as protocol.Machine) and returns the ids of the replies it releases, in
// the order it releases them.
func (h *holds) step(ev protocol.Event) []uint64 {
	acts, err := h.gate.Step(ev)
	if err != nil {
		// The gate refuses only an event kind it does not know: a
		// programming error in this file, never a runtime condition.
		panic(fmt.Sprintf("frontend: reply gate: %v", err))
	}
	rel := protocol.Select[nspb.ReleaseReply](acts)
	ids := make([]uint64, len(rel))
	for i, a := range rel {
		ids[i] = a.ReqID
	}
	return ids
}

// expiredHold is a held reply that passed its deadline.
type expiredHold struct {
	reqID uint64
	err   error
}

// missing describes the dependencies of r that are not durable yet, e.g.
// "m (seq 5, durable 3)", sorted by model.
func (h *holds) missing(r *heldReply) string {
	var parts []string
	for m, s := range r.deps {
		if d := h.gate.DurableSeq(m); d < s {
			parts = append(parts, fmt.Sprintf("%s (seq %d, durable %d)", m, s, d))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// nextDeadline is the earliest deadline of a held reply.
func (h *holds) nextDeadline() (time.Time, bool) {
	if len(h.byDue) == 0 {
		return time.Time{}, false
	}
	return h.byDue[0].deadline, true
}

// len is the number of held replies.
func (h *holds) len() int { return len(h.byID) }

func (h *holds) remove(r *heldReply) {
	delete(h.byID, r.reqID)
	heap.Remove(&h.byDue, r.heapIdx)
}

// heldHeap orders held replies by deadline (then req_id).
type heldHeap []*heldReply

func (q heldHeap) Len() int { return len(q) }
func (q heldHeap) Less(i, j int) bool {
	if q[i].deadline.Equal(q[j].deadline) {
		return q[i].reqID < q[j].reqID
	}
	return q[i].deadline.Before(q[j].deadline)
}
func (q heldHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].heapIdx = i
	q[j].heapIdx = j
}
func (q *heldHeap) Push(x any) {
	r := x.(*heldReply)
	r.heapIdx = len(*q)
	*q = append(*q, r)
}
func (q *heldHeap) Pop() any {
	old := *q
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	r.heapIdx = -1
	return r
}
