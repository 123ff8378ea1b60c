package sidecar

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/internal/edge"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/sidecar/datapath"
)

// outEdges is the sending end of a sidecar's request path: one
// edge.Sender per successor, in Graph.Succ order, and what goes out on
// them (error items for failed requests, output items). It is the
// executors' requestPath (executor.go).
//
// Invariants: the senders are replaced as a whole (a role transition makes
// new incarnations, set) and never changed in place; every item goes to
// every current sender, in the order fanOut was called.
type outEdges struct {
	model   string
	log     *slog.Logger
	metrics *metrics
	// clock is Config.Now (nil: time.Now).
	clock func() time.Time

	mu      sync.Mutex
	senders []*edge.Sender
}

var _ requestPath = (*outEdges)(nil)

// now is the clock request deadlines are on (Config.Now).
func (o *outEdges) now() time.Time {
	if o.clock != nil {
		return o.clock()
	}
	return time.Now()
}

// set replaces the out-edges (a new incarnation each).
func (o *outEdges) set(senders []*edge.Sender) {
	o.mu.Lock()
	o.senders = senders
	o.mu.Unlock()
}

// current returns the current out-edges.
func (o *outEdges) current() []*edge.Sender {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.senders
}

// full reports whether some out-edge is over its backlog bound.
func (o *outEdges) full() bool {
	for _, snd := range o.current() {
		if snd.Full() {
			return true
		}
	}
	return false
}

// position is an output item's position on an out-edge: this model's seq
// of the request (error items, which carry none, are always resent).
func (o *outEdges) position(it *hamsv1.Item) uint64 {
	lin := it.GetLineage()
	for i := len(lin) - 1; i >= 0; i-- {
		if lin[i].GetModel() == o.model {
			return lin[i].GetSeq()
		}
	}
	return ^uint64(0)
}

// passError forwards the first upstream error of j unchanged.
func (o *outEdges) passError(j *datapath.Joined) {
	for _, p := range j.Parts {
		if p != nil && (p.GetError() != "" || p.GetErrorCode() != 0) {
			code := codes.Code(p.GetErrorCode())
			if code == codes.OK {
				code = codes.Unknown
			}
			o.sendError(j, code, p.GetError())
			return
		}
	}
}

// fail turns request j into an error item from this model.
func (o *outEdges) fail(j *datapath.Joined, code codes.Code, msg string) {
	if hasError(j) {
		o.passError(j)
		return
	}
	o.metrics.errors.WithLabelValues(code.String()).Inc()
	o.log.Debug("request failed", "req_id", j.ReqID, "code", code, "err", msg)
	o.sendError(j, code, fmt.Sprintf("model %s: %s", o.model, msg))
}

func (o *outEdges) sendError(j *datapath.Joined, code codes.Code, msg string) {
	var parts []*hamsv1.Item
	for _, p := range j.Parts {
		if p != nil {
			parts = append(parts, p)
		}
	}
	it := &hamsv1.Item{
		ReqId: j.ReqID, Lineage: MergeLineage(nil, parts), DeadlineUnixNano: j.Deadline,
		Error: msg, ErrorCode: int32(code),
	}
	if len(parts) > 0 {
		it.Service, it.StreamId = parts[0].GetService(), parts[0].GetStreamId()
	}
	o.fanOut(it)
}

// fanOut sends it to every successor (one copy per out-edge, sharing
// tensors and lineage: Send stamps edge_seq on its own copy).
func (o *outEdges) fanOut(it *hamsv1.Item) { o.fanOutTo(it, nil) }

// fanOutKeep is fanOut returning the items sent, in successor order.
func (o *outEdges) fanOutKeep(it *hamsv1.Item) []*hamsv1.Item {
	sent := make([]*hamsv1.Item, len(o.current()))
	o.fanOutTo(it, sent)
	return sent
}

// fanOutTo records the item sent on out-edge i in sent[i] when sent is not
// nil.
func (o *outEdges) fanOutTo(it *hamsv1.Item, sent []*hamsv1.Item) {
	senders := o.current()
	for i, snd := range senders {
		c := it
		if i < len(senders)-1 {
			c = &hamsv1.Item{
				ReqId: it.ReqId, Service: it.Service, StreamId: it.StreamId, Tensors: it.Tensors,
				Lineage: it.Lineage, DeadlineUnixNano: it.DeadlineUnixNano, Error: it.Error, ErrorCode: it.ErrorCode,
				Approximate: it.Approximate, TraceContext: it.TraceContext,
			}
		}
		if sent != nil {
			sent[i] = c
		}
		snd.Send(c)
	}
}
