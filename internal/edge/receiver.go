package edge

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// ReceiverOption configures a Receiver.
type ReceiverOption func(*Receiver)

// WithMaxPending sets the Reorder bound of every edge.
func WithMaxPending(n int) ReceiverOption { return func(r *Receiver) { r.maxPending = n } }

// Receiver implements the server side of hamsv1.Dataplane.Forward for the
// model `to`. It keeps one Reorder per inbound edge (keyed by the batch's
// from_model), so a sender's old and new streams (after a reconnect) share
// one dedup state.
type Receiver struct {
	hamsv1.UnimplementedDataplaneServer

	to         string
	deliver    func(from string, items []*hamsv1.Item)
	log        *slog.Logger
	maxPending int

	mu    sync.Mutex
	edges map[string]*inEdge
}

// inEdge is one inbound edge. Its mutex is held across Offer and deliver so
// items of one edge are delivered in edge_seq order even when two streams of
// that edge overlap.
type inEdge struct {
	mu      sync.Mutex
	reorder *Reorder
	epoch   uint64
	// incarnation of the sender whose sequence space reorder tracks.
	incarnation uint64
	buf         []*hamsv1.Item
}

// NewReceiver creates a Receiver for model `to` (config.Frontend for the
// frontend's sink edges). deliver gets the in-order items of one edge; it is
// called from the stream's goroutine, never concurrently for one edge, and
// must not keep the slice (the items are its own). It may block to push back.
func NewReceiver(to string, deliver func(from string, items []*hamsv1.Item), log *slog.Logger, opts ...ReceiverOption) *Receiver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Receiver{to: to, deliver: deliver, log: log, maxPending: DefaultMaxPending, edges: map[string]*inEdge{}}
	for _, o := range opts {
		o(r)
	}
	return r
}

func (r *Receiver) edge(from string) *inEdge {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.edges[from]
	if e == nil {
		e = &inEdge{reorder: NewReorder(r.maxPending)}
		r.edges[from] = e
	}
	return e
}

// MaxInOrder reports max_in_order of the edge from `from` (0 if unseen).
func (r *Receiver) MaxInOrder(from string) uint64 {
	r.mu.Lock()
	e := r.edges[from]
	r.mu.Unlock()
	if e == nil {
		return 0
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reorder.MaxInOrder()
}

// MaxInByPred reports max_in_order of every edge seen (LineageSummary).
func (r *Receiver) MaxInByPred() map[string]uint64 {
	r.mu.Lock()
	names := make([]string, 0, len(r.edges))
	for n := range r.edges {
		names = append(names, n)
	}
	r.mu.Unlock()
	out := make(map[string]uint64, len(names))
	for _, n := range names {
		out[n] = r.MaxInOrder(n)
	}
	return out
}

// Restore sets max_in_order of the edge from `from` (recovery).
func (r *Receiver) Restore(from string, maxInOrder uint64) {
	e := r.edge(from)
	e.mu.Lock()
	e.reorder.Restore(maxInOrder)
	e.mu.Unlock()
}

// Forward serves one inbound stream until the sender closes it or it breaks.
// Every batch is acknowledged with the edge's max_in_order after its
// in-order items were delivered.
func (r *Receiver) Forward(stream hamsv1.Dataplane_ForwardServer) error {
	var (
		from string
		e    *inEdge
	)
	for {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if b.GetToModel() != r.to {
			return status.Errorf(codes.NotFound, "edge: batch for model %q reached %q", b.GetToModel(), r.to)
		}
		if b.GetFromModel() == "" {
			return status.Error(codes.InvalidArgument, "edge: batch without from_model")
		}
		if e == nil || b.GetFromModel() != from {
			from = b.GetFromModel()
			e = r.edge(from)
		}
		ack, err := r.accept(e, from, b)
		if err != nil {
			_ = stream.Send(&hamsv1.ForwardAck{ToModel: r.to, MaxInOrder: ack, Error: err.Error()})
			return err
		}
		if err := stream.Send(&hamsv1.ForwardAck{ToModel: r.to, MaxInOrder: ack}); err != nil {
			return err
		}
	}
}

// accept runs one batch through the edge's Reorder and delivers what is
// released. It returns max_in_order afterwards.
func (r *Receiver) accept(e *inEdge, from string, b *hamsv1.ForwardBatch) (uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if b.GetEpoch() < e.epoch {
		return e.reorder.MaxInOrder(), status.Errorf(codes.FailedPrecondition, "edge %s->%s: stale epoch %d < %d", from, r.to, b.GetEpoch(), e.epoch)
	}
	if b.GetEpoch() > e.epoch {
		if e.epoch != 0 || e.reorder.MaxInOrder() != 0 {
			r.log.Info("edge epoch advanced", "from", from, "to", r.to, "epoch", b.GetEpoch(), "max_in_order", e.reorder.MaxInOrder())
		}
		e.epoch = b.GetEpoch()
	}
	switch inc := b.GetIncarnation(); {
	case inc < e.incarnation:
		return e.reorder.MaxInOrder(), status.Errorf(codes.FailedPrecondition, "edge %s->%s: stale sender incarnation %d < %d", from, r.to, inc, e.incarnation)
	case inc > e.incarnation:
		// A new sender (a restarted process) numbers the edge afresh from
		// 1: forget the old sequence space, or its items would all be
		// dropped as duplicates.
		if e.incarnation != 0 {
			r.log.Info("edge sender restarted; sequence reset", "from", from, "to", r.to, "max_in_order", e.reorder.MaxInOrder())
			e.reorder = NewReorder(r.maxPending)
		}
		if e.incarnation == 0 && e.reorder.MaxInOrder() == 0 {
			// A fresh receiver (this process restarted) meets a sender
			// that kept its sequence space: start after the first item
			// offered, since what came before died with the old process.
			if its := b.GetItems(); len(its) > 0 && its[0].GetEdgeSeq() > 1 {
				r.log.Info("edge joined mid-sequence; starting at the sender's first unacked item", "from", from, "to", r.to, "edge_seq", its[0].GetEdgeSeq())
				e.reorder.Restore(its[0].GetEdgeSeq() - 1)
			}
		}
		e.incarnation = inc
	}
	ready := e.buf[:0]
	var ferr error
	for _, it := range b.GetItems() {
		if it == nil {
			continue
		}
		it.FromModel = from
		var err error
		ready, err = e.reorder.Append(ready, it)
		if err != nil {
			ferr = err
			break
		}
	}
	if len(ready) > 0 {
		r.deliver(from, ready)
	}
	clear(ready)
	e.buf = ready[:0]
	if ferr != nil {
		code := codes.InvalidArgument
		if errors.Is(ferr, ErrTooFarAhead) {
			code = codes.ResourceExhausted
		}
		return e.reorder.MaxInOrder(), status.Error(code, fmt.Sprintf("edge %s->%s: %v", from, r.to, ferr))
	}
	return e.reorder.MaxInOrder(), nil
}
