package datapath

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Joiner errors.
var (
	ErrUnknownPred = errors.New("datapath: item from a model that is not a predecessor")
	ErrLatePart    = errors.New("datapath: part of a join that was already given up")
	ErrDupPart     = errors.New("datapath: second part from one predecessor for one request")
)

// Joined is a request formed by the Joiner: Parts holds one item per
// predecessor in Graph.Pred order (join) or the one item (interleave, or a
// single predecessor). Complete is false for a join given up (evicted or
// expired); its missing parts are nil.
type Joined struct {
	ReqID    uint64
	Parts    []*hamsv1.Item
	Complete bool
	// Deadline of the request (unix nanoseconds, 0 none).
	Deadline int64
}

// Joiner combines items at a fan-in point. It is a pure state machine (no
// goroutines, time passed in).
//
// Invariants: waiting holds at most maxWaiting incomplete joins, each with
// at least one part; order lists their req_ids oldest first (with stale
// entries of completed joins, skipped lazily); a req_id given up is
// remembered in gone (bounded) so its late parts are dropped.
type Joiner struct {
	preds      []string
	index      map[string]int
	join       bool
	maxWaiting int

	waiting map[uint64]*Joined
	order   []uint64
	gone    map[uint64]struct{}
	goneQ   []uint64
	// nextExpiry is a lower bound of the earliest deadline in waiting.
	nextExpiry int64
	// joined remembers the parts of the last maxJoined completed joins
	// (joinedQ oldest first; 0: off), so a superseding part re-forms the
	// join (RememberJoined).
	joined    map[uint64][]*hamsv1.Item
	joinedQ   []uint64
	maxJoined int
}

// RememberJoined makes the Joiner keep the parts of its last n completed
// joins. A part that arrives later for one of them from a predecessor
// supersedes that predecessor's part: the request is formed again at once
// with the other parts remembered. Such a part has passed the receiver's
// duplicate filter, so it is a stateful model's re-execution upstream
// after a failover (whose first output was lost or rolled back), or an
// explicit resend through this model to a replacement downstream; either
// way the other branches' parts will not come again (their copies are
// duplicates), and without them the request could never be formed. Only
// for models that may run a request twice (stateless ones).
func (j *Joiner) RememberJoined(n int) {
	j.maxJoined = n
	if n > 0 && j.joined == nil {
		j.joined = map[uint64][]*hamsv1.Item{}
	}
}

// remember records a completed join's parts (bounded, oldest dropped).
func (j *Joiner) remember(id uint64, parts []*hamsv1.Item) {
	if j.maxJoined <= 0 {
		return
	}
	if _, ok := j.joined[id]; !ok {
		j.joinedQ = append(j.joinedQ, id)
	}
	j.joined[id] = parts
	for len(j.joinedQ) > j.maxJoined {
		delete(j.joined, j.joinedQ[0])
		j.joinedQ = j.joinedQ[1:]
	}
}

// NewJoiner creates a Joiner for a model with predecessors preds (in
// Graph.Pred order) and fan-in mode (config.FanInJoin or FanInInterleave).
func NewJoiner(preds []string, mode string, maxWaiting int) (*Joiner, error) {
	if len(preds) == 0 {
		return nil, fmt.Errorf("datapath: joiner without predecessors")
	}
	if mode != config.FanInJoin && mode != config.FanInInterleave {
		return nil, fmt.Errorf("datapath: fan_in %q is not join or interleave", mode)
	}
	if maxWaiting <= 0 {
		maxWaiting = 4096
	}
	j := &Joiner{
		preds: preds, index: map[string]int{}, join: mode == config.FanInJoin && len(preds) > 1,
		maxWaiting: maxWaiting, waiting: map[uint64]*Joined{}, gone: map[uint64]struct{}{},
	}
	for i, p := range preds {
		j.index[p] = i
	}
	return j, nil
}

// Waiting is the number of incomplete joins.
func (j *Joiner) Waiting() int { return len(j.waiting) }

// Add takes one item. It returns the request it completes (or nil while
// the join waits) and the joins given up to stay within the bound.
func (j *Joiner) Add(it *hamsv1.Item) (done *Joined, evicted []*Joined, err error) {
	k, ok := j.index[it.GetFromModel()]
	if !ok {
		return nil, nil, fmt.Errorf("%w: %q (predecessors %v)", ErrUnknownPred, it.GetFromModel(), j.preds)
	}
	if !j.join {
		return &Joined{ReqID: it.GetReqId(), Parts: []*hamsv1.Item{it}, Complete: true, Deadline: it.GetDeadlineUnixNano()}, nil, nil
	}
	id := it.GetReqId()
	w := j.waiting[id]
	if w == nil {
		if prev, ok := j.joined[id]; ok {
			parts := slices.Clone(prev)
			parts[k] = it
			j.joined[id] = parts
			return &Joined{ReqID: id, Parts: parts, Complete: true, Deadline: it.GetDeadlineUnixNano()}, nil, nil
		}
		if _, g := j.gone[id]; g {
			return nil, nil, fmt.Errorf("%w: req %d from %s", ErrLatePart, id, it.GetFromModel())
		}
		for len(j.waiting) >= j.maxWaiting {
			if old := j.popOldest(); old != nil {
				evicted = append(evicted, old)
			}
		}
		w = &Joined{ReqID: id, Parts: make([]*hamsv1.Item, len(j.preds)), Deadline: it.GetDeadlineUnixNano()}
		j.waiting[id] = w
		j.order = append(j.order, id)
		if d := w.Deadline; d != 0 && (j.nextExpiry == 0 || d < j.nextExpiry) {
			j.nextExpiry = d
		}
	}
	if w.Parts[k] != nil {
		return nil, evicted, fmt.Errorf("%w: req %d from %s", ErrDupPart, id, it.GetFromModel())
	}
	w.Parts[k] = it
	for _, p := range w.Parts {
		if p == nil {
			return nil, evicted, nil
		}
	}
	delete(j.waiting, id)
	w.Complete = true
	j.remember(id, w.Parts)
	j.compact()
	return w, evicted, nil
}

// popOldest gives up the oldest waiting join.
func (j *Joiner) popOldest() *Joined {
	for len(j.order) > 0 {
		id := j.order[0]
		j.order = j.order[1:]
		if w, ok := j.waiting[id]; ok {
			j.giveUp(id)
			return w
		}
	}
	return nil
}

func (j *Joiner) giveUp(id uint64) {
	delete(j.waiting, id)
	j.gone[id] = struct{}{}
	j.goneQ = append(j.goneQ, id)
	for len(j.goneQ) > j.maxWaiting {
		delete(j.gone, j.goneQ[0])
		j.goneQ = j.goneQ[1:]
	}
}

// compact drops order entries of completed joins once they dominate.
func (j *Joiner) compact() {
	if len(j.order) < 64 || len(j.order) < 2*len(j.waiting) {
		return
	}
	kept := j.order[:0]
	for _, id := range j.order {
		if _, ok := j.waiting[id]; ok {
			kept = append(kept, id)
		}
	}
	clear(j.order[len(kept):])
	j.order = kept
}

// NextDeadline is the earliest deadline among waiting joins (zero time if
// none); Expire must be called at or after it.
func (j *Joiner) NextDeadline() time.Time {
	if j.nextExpiry == 0 || len(j.waiting) == 0 {
		return time.Time{}
	}
	return time.Unix(0, j.nextExpiry)
}

// Expire gives up every waiting join whose deadline is at or before now.
func (j *Joiner) Expire(now time.Time) []*Joined {
	if j.nextExpiry == 0 || now.UnixNano() < j.nextExpiry {
		return nil
	}
	var out []*Joined
	j.nextExpiry = 0
	for _, id := range j.order {
		w, ok := j.waiting[id]
		if !ok || w.Deadline == 0 {
			continue
		}
		if w.Deadline <= now.UnixNano() {
			j.giveUp(id)
			out = append(out, w)
		} else if j.nextExpiry == 0 || w.Deadline < j.nextExpiry {
			j.nextExpiry = w.Deadline
		}
	}
	j.compact()
	return out
}
