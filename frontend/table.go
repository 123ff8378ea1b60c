package frontend

import (
	"container/heap"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// table is the frontend's pure request table: pending requests keyed by
// req_id, the sink models each one waits for, the parts that arrived, and
// their deadlines. It has no goroutines, no locks and no clock of its own
// (callers pass now), so every transition is unit-testable.
//
// Invariants: req_ids are handed out densely from 1; an entry is in pending
// from add until exactly one of deliver (completion or error item), expire
// or remove takes it out, and each of those reports it at most once; the
// deadline heap holds exactly the pending entries.
type table struct {
	next    uint64
	pending map[uint64]*entry
	byDue   dueHeap
}

// entry is one pending request.
type entry struct {
	reqID     uint64
	service   string
	requestID string
	deadline  time.Time
	// sinks are the models that must each deliver one item, sorted by name.
	sinks []string
	// parts holds the arrived item per sink model.
	parts map[string]*hamsv1.Item
	// heapIdx is the entry's index in table.byDue.
	heapIdx int
}

// completion is what the table reports when a request leaves it: either a
// reply (all sinks arrived) or an error status.
type completion struct {
	reqID uint64
	resp  *hamsv1.PredictResponse
	err   error
	// deadline is the request's deadline (a reply held for durability
	// keeps it).
	deadline time.Time
	// service, requestID, sinks and parts describe a reply's request, so a
	// held reply whose dependency was rolled back can go back into the
	// table with the parts that survive.
	service   string
	requestID string
	sinks     []string
	parts     map[string]*hamsv1.Item
}

func newTable() *table {
	return &table{pending: map[uint64]*entry{}}
}

// add registers a request waiting for one item from each of sinks and
// returns its req_id.
func (t *table) add(service, requestID string, sinks []string, deadline time.Time) uint64 {
	return t.addID(t.newID(), service, requestID, sinks, deadline)
}

// newID hands out the next req_id without registering a request (a
// request that is logged first and registered once it enters the graph).
func (t *table) newID() uint64 {
	t.next++
	return t.next
}

// addID registers a request under a req_id handed out earlier (by newID,
// or by another frontend whose request this one completes). An id that is
// pending already is left as it is.
func (t *table) addID(id uint64, service, requestID string, sinks []string, deadline time.Time) uint64 {
	if t.pending[id] != nil {
		return id
	}
	e := &entry{
		reqID:     id,
		service:   service,
		requestID: requestID,
		deadline:  deadline,
		sinks:     sinks,
		parts:     make(map[string]*hamsv1.Item, len(sinks)),
	}
	t.pending[e.reqID] = e
	heap.Push(&t.byDue, e)
	return e.reqID
}

// deliverResult says what deliver did with an item.
type deliverResult int

const (
	// partStored: the item was one of the expected parts; more are missing.
	partStored deliverResult = iota
	// completed: the request left the table (reply or error item).
	completed
	// unknownReq: no pending request has that req_id (late, expired or
	// already answered); the item is dropped.
	unknownReq
	// unexpectedSink: the sender is not a sink of the request's service;
	// the item is dropped.
	unexpectedSink
	// duplicatePart: that sink already delivered for this request; the
	// item is dropped.
	duplicatePart
)

// deliver records the item that sink model `from` produced. A request
// completes when every sink delivered, or at once when an item carries an
// error (the first error wins; later parts of that request are unknownReq).
func (t *table) deliver(from string, it *hamsv1.Item) (deliverResult, *completion) {
	e := t.pending[it.GetReqId()]
	if e == nil {
		return unknownReq, nil
	}
	if !contains(e.sinks, from) {
		return unexpectedSink, nil
	}
	if _, dup := e.parts[from]; dup {
		return duplicatePart, nil
	}
	if it.GetError() != "" {
		t.drop(e)
		return completed, &completion{reqID: e.reqID, err: itemError(it), deadline: e.deadline}
	}
	e.parts[from] = it
	if len(e.parts) < len(e.sinks) {
		return partStored, nil
	}
	return completed, t.complete(e)
}

// complete takes e, whose every sink part arrived, out of the table as a
// reply.
func (t *table) complete(e *entry) *completion {
	t.drop(e)
	return &completion{reqID: e.reqID, resp: e.reply(), deadline: e.deadline,
		service: e.service, requestID: e.requestID, sinks: e.sinks, parts: e.parts}
}

// readd puts a request back that left the table as a reply (its reply was
// held and a dependency was rolled back), with the parts that survive. When
// every part survives (they all came from the new epoch, ahead of its
// notice) the request completes again at once: the completion is returned.
func (t *table) readd(c *completion, keep map[string]*hamsv1.Item) *completion {
	t.addID(c.reqID, c.service, c.requestID, c.sinks, c.deadline)
	e := t.pending[c.reqID]
	for s, it := range keep {
		e.parts[s] = it
	}
	if len(e.parts) < len(e.sinks) {
		return nil
	}
	return t.complete(e)
}

// dropParts forgets every arrived part that names an execution of model
// lost in the failover to epoch (see namesLost).
func (t *table) dropParts(model string, seq, epoch uint64) int {
	n := 0
	for _, e := range t.pending {
		for s, it := range e.parts {
			if namesLost(it.GetLineage(), model, seq, epoch) {
				delete(e.parts, s)
				n++
			}
		}
	}
	return n
}

// namesLost reports whether lineage names an execution of model that the
// failover to epoch (durable up to seq) lost: a seq above seq, executed
// before epoch. An entry of epoch or later is a re-execution that overtook
// the failover's notice; an unstamped entry (epoch 0) counts as lost.
func namesLost(lineage []*hamsv1.LineageEntry, model string, seq, epoch uint64) bool {
	for _, l := range lineage {
		if lostEntry(l, model, seq, epoch) {
			return true
		}
	}
	return false
}

// lostEntry is namesLost for one entry.
func lostEntry(l *hamsv1.LineageEntry, model string, seq, epoch uint64) bool {
	return l.GetModel() == model && l.GetSeq() > seq && (l.GetEpoch() == 0 || l.GetEpoch() < epoch)
}

// has reports whether reqID is pending.
func (t *table) has(reqID uint64) bool { return t.pending[reqID] != nil }

// expire removes every request whose deadline is at or before now and
// reports each with DeadlineExceeded.
func (t *table) expire(now time.Time) []completion {
	var out []completion
	for len(t.byDue) > 0 && !t.byDue[0].deadline.After(now) {
		e := t.byDue[0]
		t.drop(e)
		out = append(out, completion{reqID: e.reqID, err: status.Errorf(codes.DeadlineExceeded,
			"request %d of service %q: deadline exceeded waiting for %v", e.reqID, e.service, e.missing())})
	}
	return out
}

// remove takes a request out without a completion (its caller gave up);
// it reports whether the request was pending.
func (t *table) remove(reqID uint64) bool {
	e := t.pending[reqID]
	if e == nil {
		return false
	}
	t.drop(e)
	return true
}

// nextDeadline is the earliest deadline of a pending request.
func (t *table) nextDeadline() (time.Time, bool) {
	if len(t.byDue) == 0 {
		return time.Time{}, false
	}
	return t.byDue[0].deadline, true
}

// len is the number of pending requests.
func (t *table) len() int { return len(t.pending) }

func (t *table) drop(e *entry) {
	delete(t.pending, e.reqID)
	heap.Remove(&t.byDue, e.heapIdx)
}

// missing lists the sinks that have not delivered yet.
func (e *entry) missing() []string {
	var m []string
	for _, s := range e.sinks {
		if _, ok := e.parts[s]; !ok {
			m = append(m, s)
		}
	}
	return m
}

// reply builds the response: outputs in sink order (sorted by model name)
// and the union of the parts' lineage, in first-seen order, without
// duplicates. The reply is approximate when any part is (a sink item is
// approximate when its tensors, or those of any item it was computed
// from, are a parity reconstruction): one reconstructed part makes the
// whole reply an approximation, and every client-facing surface marks it.
func (e *entry) reply() *hamsv1.PredictResponse {
	resp := &hamsv1.PredictResponse{Service: e.service, RequestId: e.requestID, ReqId: e.reqID}
	type key struct {
		pred, model, digest string
		predSeq, seq        uint64
	}
	seen := map[key]bool{}
	for _, s := range e.sinks {
		it := e.parts[s]
		resp.Outputs = append(resp.Outputs, &hamsv1.ModelOutput{Model: s, Tensors: it.GetTensors()})
		resp.Approximate = resp.Approximate || it.GetApproximate()
		for _, l := range it.GetLineage() {
			k := key{l.GetPredModel(), l.GetModel(), l.GetOutputDigest(), l.GetPredSeq(), l.GetSeq()}
			if seen[k] {
				continue
			}
			seen[k] = true
			resp.Lineage = append(resp.Lineage, l)
		}
	}
	return resp
}

// itemError turns an item's error into the status the client gets. An
// error without a valid non-OK code is Unknown.
func itemError(it *hamsv1.Item) error {
	c := codes.Code(it.GetErrorCode())
	if c == codes.OK || c > codes.Unauthenticated {
		c = codes.Unknown
	}
	return status.Error(c, it.GetError())
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// dueHeap orders pending entries by deadline (then req_id).
type dueHeap []*entry

func (h dueHeap) Len() int { return len(h) }
func (h dueHeap) Less(i, j int) bool {
	if h[i].deadline.Equal(h[j].deadline) {
		return h[i].reqID < h[j].reqID
	}
	return h[i].deadline.Before(h[j].deadline)
}
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = i
	h[j].heapIdx = j
}
func (h *dueHeap) Push(x any) {
	e := x.(*entry)
	e.heapIdx = len(*h)
	*h = append(*h, e)
}
func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.heapIdx = -1
	return e
}
