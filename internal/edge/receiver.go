package edge

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// ReceiverOption configures a Receiver.
type ReceiverOption func(*Receiver)

// WithMaxPending sets the Reorder bound of every edge.
func WithMaxPending(n int) ReceiverOption { return func(r *Receiver) { r.maxPending = n } }

// DefaultDedupWindow is the number of recent request keys per edge a
// deduplicating Receiver remembers.
const DefaultDedupWindow = 1 << 16

// WithDedup makes the Receiver drop an in-order item whose DedupKey (with
// stateful) was delivered on the same edge among the last window items
// (window <= 0: DefaultDedupWindow). Resends after recovery are
// conservative and renumbered, so edge_seq alone cannot tell them apart.
func WithDedup(window int, stateful func(model string) bool) ReceiverOption {
	return func(r *Receiver) {
		if window <= 0 {
			window = DefaultDedupWindow
		}
		r.dedupWindow, r.stateful = window, stateful
	}
}

// WithResendPassThrough makes a deduplicating Receiver (WithDedup) deliver
// an item whose exact lineage (every seq and output) it delivered before:
// an explicit Resend through this receiver to a replacement further down,
// which a stateless model must run again. It still drops an item whose
// request key it has seen with another lineage (a stateless model upstream
// running the request again). Stateful models do not use it: they must
// never run a request twice.
func WithResendPassThrough() ReceiverOption { return func(r *Receiver) { r.passResends = true } }

// WithEpochs refuses (FailedPrecondition) batches whose epoch is below the
// epoch epochOf reports for the sending model: a deposed instance's
// traffic.
func WithEpochs(epochOf func(from string) (uint64, bool)) ReceiverOption {
	return func(r *Receiver) { r.epochOf = epochOf }
}

// WithClock sets the clock on which the Receiver turns an item's
// deadline_remaining_nano into its deadline_unix_nano (default time.Now):
// the clock the consumer checks deadlines on.
func WithClock(now func() time.Time) ReceiverOption {
	return func(r *Receiver) {
		if now != nil {
			r.now = now
		}
	}
}

// WithAdmit refuses every batch while admit returns an error (a backup
// that does not take traffic); the error is returned to the sender.
func WithAdmit(admit func(from string) error) ReceiverOption {
	return func(r *Receiver) { r.admit = admit }
}

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

	dedupWindow int
	stateful    func(string) bool
	passResends bool
	epochOf     func(string) (uint64, bool)
	admit       func(string) error
	now         func() time.Time
	ackDelay    time.Duration
	ackEvery    int
	dups        atomic.Uint64

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
	// inc: the incarnation of the sender whose sequence space reorder
	// tracks, and the replaced senders' nonces (incarnation.go).
	inc   incarnationState
	buf   []*hamsv1.Item
	seen  *window // nil without WithDedup
	exact *window // exact lineage keys, with WithResendPassThrough
}

// window is a bounded FIFO set of request keys.
type window struct {
	max  int
	set  map[uint64]struct{}
	fifo []uint64
	head int
}

func newWindow(max int) *window { return &window{max: max, set: map[uint64]struct{}{}} }

// add reports false when k is already present.
func (w *window) add(k uint64) bool {
	if _, ok := w.set[k]; ok {
		return false
	}
	w.set[k] = struct{}{}
	if len(w.fifo) < w.max {
		w.fifo = append(w.fifo, k)
		return true
	}
	delete(w.set, w.fifo[w.head])
	w.fifo[w.head] = k
	w.head = (w.head + 1) % w.max
	return true
}

// NewReceiver creates a Receiver for model `to` (config.Frontend for the
// frontend's sink edges). deliver gets the in-order items of one edge; it is
// called from the stream's goroutine, never concurrently for one edge, and
// must not keep the slice (the items are its own). It may block to push back.
func NewReceiver(to string, deliver func(from string, items []*hamsv1.Item), log *slog.Logger, opts ...ReceiverOption) *Receiver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Receiver{to: to, deliver: deliver, log: log, maxPending: DefaultMaxPending, edges: map[string]*inEdge{}, now: time.Now, ackDelay: AckDelay, ackEvery: AckEvery}
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
		r.initDedup(e)
		r.edges[from] = e
	}
	return e
}

func (r *Receiver) initDedup(e *inEdge) {
	if r.dedupWindow > 0 {
		e.seen = newWindow(r.dedupWindow)
		if r.passResends {
			e.exact = newWindow(r.dedupWindow)
		}
	}
}

func allStateful(string) bool { return true }

// fresh reports whether it must be delivered, and remembers its keys.
func (r *Receiver) fresh(e *inEdge, it *hamsv1.Item) bool {
	newPath := e.seen.add(DedupKey(it.GetReqId(), it.GetLineage(), r.stateful))
	if e.exact == nil {
		return newPath
	}
	newExact := e.exact.add(DedupKey(it.GetReqId(), it.GetLineage(), allStateful))
	return newPath || !newExact
}

// Duplicates is the number of items dropped by request key.
func (r *Receiver) Duplicates() uint64 { return r.dups.Load() }

// SeedDedup replaces the request keys of every edge: keys[from] become the
// only ones remembered (a promoted backup or a rolled-back primary knows
// exactly the requests its state covers). No-op without WithDedup.
func (r *Receiver) SeedDedup(keys map[string][]uint64) {
	if r.dedupWindow <= 0 {
		return
	}
	r.mu.Lock()
	for from := range keys {
		if r.edges[from] == nil {
			r.edges[from] = &inEdge{reorder: NewReorder(r.maxPending)}
		}
	}
	edges := make(map[string]*inEdge, len(r.edges))
	for n, e := range r.edges {
		edges[n] = e
	}
	r.mu.Unlock()
	for from, e := range edges {
		e.mu.Lock()
		r.initDedup(e)
		for _, k := range keys[from] {
			e.seen.add(k)
		}
		e.mu.Unlock()
	}
}

// Forget drops every edge's sequence state and request keys: the model's
// instance stopped receiving (a primary demoted to a backup). While it
// was not receiving, its senders went on numbering their edges at another
// instance (with the same incarnation: a sender starts a new one only when
// told to resend), so if it receives again (promoted back), the edge
// sequence it remembers lies behind what each sender offers, and its
// reorder buffer would wait for items the other instance acknowledged,
// for good. A forgotten edge starts at the first item its sender offers,
// as with a fresh process; a promotion seeds the request keys its state
// covers (SeedDedup).
func (r *Receiver) Forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.edges)
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

// Acknowledgement pacing defaults (WithAckPacing). Acks only trim the
// sender's buffer (delivery never waits for them), so holding them back a
// little costs nothing on the request path, while one ack per batch puts
// a write, and the sender's read, next to every request's processing
// (at batch 1, a third of the writes of a hop). A held ack goes out after
// AckDelay, or at once when AckEvery items are unacknowledged.
const (
	AckDelay = 2 * time.Millisecond
	AckEvery = 64
)

// WithAckPacing sets how long acks may be held and after how many
// unacknowledged items one goes out at once (delay 0: every batch is
// acknowledged at once, from the stream's goroutine).
func WithAckPacing(delay time.Duration, every int) ReceiverOption {
	return func(r *Receiver) { r.ackDelay, r.ackEvery = delay, every }
}

// Forward serves one inbound stream until the sender closes it or it breaks.
// Every batch is acknowledged with the edge's max_in_order after its
// in-order items were delivered (acks coalesce: see AckDelay); a refused
// batch is answered at once with the error, after any held ack, and a
// held ack is sent before the stream ends.
func (r *Receiver) Forward(stream hamsv1.Dataplane_ForwardServer) error {
	var (
		from string
		e    *inEdge
		// opened: no batch with items was accepted on this stream yet
		// (its first one starts at the sender's first unacknowledged
		// item: accept).
		opened = true
	)
	acks := newAckPacer(stream, r.to, r.ackDelay, r.ackEvery)
	defer acks.stop()
	for {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return acks.stop()
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
		ack, err := r.accept(e, from, b, opened)
		if len(b.GetItems()) > 0 {
			opened = false
		}
		if err != nil {
			if serr := acks.stop(); serr == nil {
				_ = stream.Send(&hamsv1.ForwardAck{ToModel: r.to, MaxInOrder: ack, Error: err.Error()})
			}
			return err
		}
		if err := acks.note(ack, len(b.GetItems())); err != nil {
			return err
		}
	}
}

// ackPacer sends a stream's acks (the latest max_in_order) from its own
// goroutine, delay after the first held one or at once when every items
// are held; with delay 0 it sends every ack at once from the caller's.
type ackPacer struct {
	stream hamsv1.Dataplane_ForwardServer
	to     string
	delay  time.Duration
	every  int
	kick   chan struct{}
	done   chan struct{}
	exited chan struct{}

	mu      sync.Mutex
	pending uint64 // latest max_in_order noted
	held    int    // items acknowledged by pending, not sent yet
	now     bool   // held reached every: send without waiting
	err     error  // the stream's send failed
	stopped bool
}

func newAckPacer(stream hamsv1.Dataplane_ForwardServer, to string, delay time.Duration, every int) *ackPacer {
	p := &ackPacer{stream: stream, to: to, delay: delay, every: max(every, 1), kick: make(chan struct{}, 1), done: make(chan struct{}), exited: make(chan struct{})}
	if delay > 0 {
		go p.run()
	} else {
		close(p.exited)
	}
	return p
}

// note holds max_in_order m, which acknowledges n more items; it reports
// an earlier send failure.
func (p *ackPacer) note(m uint64, n int) error {
	if p.delay <= 0 {
		return p.stream.Send(&hamsv1.ForwardAck{ToModel: p.to, MaxInOrder: m})
	}
	p.mu.Lock()
	p.pending = m
	p.held += max(n, 1)
	if p.held >= p.every {
		p.now = true
	}
	err := p.err
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	return err
}

func (p *ackPacer) run() {
	defer close(p.exited)
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-p.kick:
		case <-p.done:
			return
		}
		p.mu.Lock()
		now := p.now
		p.mu.Unlock()
		if !now {
			t.Reset(p.delay)
		wait:
			for {
				select {
				case <-t.C:
					break wait
				case <-p.kick:
					p.mu.Lock()
					now = p.now
					p.mu.Unlock()
					if now {
						t.Stop()
						break wait
					}
				case <-p.done:
					t.Stop()
					return
				}
			}
		}
		if p.flush() != nil {
			return
		}
	}
}

// flush sends the held ack, if any.
func (p *ackPacer) flush() error {
	p.mu.Lock()
	m, held, err := p.pending, p.held, p.err
	p.held, p.now = 0, false
	p.mu.Unlock()
	if held == 0 || err != nil {
		return err
	}
	if err := p.stream.Send(&hamsv1.ForwardAck{ToModel: p.to, MaxInOrder: m}); err != nil {
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		return err
	}
	return nil
}

// stop ends the pacer's goroutine and sends the held ack (the stream then
// belongs to the caller again); it reports a send failure. Later calls
// return the same result without sending.
func (p *ackPacer) stop() error {
	p.mu.Lock()
	if p.stopped {
		err := p.err
		p.mu.Unlock()
		return err
	}
	p.stopped = true
	p.mu.Unlock()
	close(p.done)
	<-p.exited
	return p.flush()
}

// staleIncarnation names, in a refusal, a sender whose incarnation the
// receiver has seen replaced on the edge (incarnation.go).
const staleIncarnation = "stale sender incarnation"

// accept runs one batch through the edge's Reorder and delivers what is
// released. It returns max_in_order afterwards; a refusal that fences the
// sender (not admitted, stale epoch or incarnation) returns 0 instead: the
// edge's sequence space is then another sender's (the instance that
// deposed this one numbers the edge on from where it stood), and a
// sender that trimmed its buffer by it would drop items it still holds.
func (r *Receiver) accept(e *inEdge, from string, b *hamsv1.ForwardBatch, opened bool) (uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.admit != nil {
		if err := r.admit(from); err != nil {
			return 0, err
		}
	}
	if r.epochOf != nil {
		if known, ok := r.epochOf(from); ok && b.GetEpoch() < known {
			return 0, status.Errorf(codes.FailedPrecondition, "edge %s->%s: stale epoch %d < %d (the topology's)", from, r.to, b.GetEpoch(), known)
		}
	}
	if b.GetEpoch() < e.epoch {
		return 0, status.Errorf(codes.FailedPrecondition, "edge %s->%s: stale epoch %d < %d", from, r.to, b.GetEpoch(), e.epoch)
	}
	if b.GetEpoch() > e.epoch {
		if e.epoch != 0 || e.reorder.MaxInOrder() != 0 {
			r.log.Info("edge epoch advanced", "from", from, "to", r.to, "epoch", b.GetEpoch(), "max_in_order", e.reorder.MaxInOrder())
		}
		e.epoch = b.GetEpoch()
	}
	inc := b.GetIncarnation()
	fresh := e.inc.cur == 0
	verdict := e.inc.judge(inc)
	switch verdict {
	case incStale:
		return 0, status.Errorf(codes.FailedPrecondition, "edge %s->%s: %s %x (replaced by %x)", from, r.to, staleIncarnation, inc, e.inc.cur)
	case incNew:
		// A new sender (a restarted process, a Resend) numbers the edge
		// afresh from 1: forget the old sequence space, or its items
		// would all be dropped as duplicates.
		if !fresh {
			r.log.Info("edge sender incarnation replaced; sequence reset", "from", from, "to", r.to, "incarnation", fmt.Sprintf("%x", inc), "max_in_order", e.reorder.MaxInOrder())
			e.reorder = NewReorder(r.maxPending)
		}
	}
	// The first batch of a stream, and of an incarnation this receiver has
	// not seen, starts at the sender's first unacknowledged item: a sender
	// sends from there and drops what any receiver acknowledged. Past
	// max_in_order+1, the items between were acknowledged by another
	// receiver while the sender sent there (this process restarted; a
	// frontend that led, lost the lead and leads again; a sidecar demoted
	// and promoted back) and never come again: start after them (what this
	// receiver holds of them, out of order, was delivered there). Waiting
	// would hold the edge for good, or refuse it as too far ahead (a
	// 30-minute soak, 2026-11-27: 456 requests lost after a frontend took
	// the lead back). Only a jump within a stream is refused.
	if its := b.GetItems(); (opened || verdict == incNew) && len(its) > 0 && its[0].GetEdgeSeq() > e.reorder.MaxInOrder()+1 {
		r.log.Info("edge joined mid-sequence; starting at the sender's first unacked item", "from", from, "to", r.to,
			"edge_seq", its[0].GetEdgeSeq(), "max_in_order", e.reorder.MaxInOrder(), "new_incarnation", verdict == incNew, "restarted", fresh)
		e.reorder.Restore(its[0].GetEdgeSeq() - 1)
	}
	// Deadlines travel as the time left when the sender put the item on
	// the wire; the edge's consumer checks them on this process's clock.
	// A deadline_unix_nano that came over the wire (another process's
	// clock) is never trusted.
	now := r.now().UnixNano()
	for _, it := range b.GetItems() {
		if it != nil {
			it.DeadlineUnixNano = localDeadline(now, it.GetDeadlineRemainingNano())
			it.DeadlineRemainingNano = 0
		}
	}
	ready := e.buf[:0]
	var ferr error
	for _, it := range b.GetItems() {
		if it == nil {
			continue
		}
		it.FromModel = from
		if s := it.GetEdgeSeq(); s != 0 && s <= e.reorder.MaxInOrder() {
			r.log.Debug("edge item dropped: edge_seq already received", "from", from, "to", r.to, "req_id", it.GetReqId(), "edge_seq", s)
		}
		var err error
		ready, err = e.reorder.Append(ready, it)
		if err != nil {
			ferr = err
			break
		}
	}
	if e.seen != nil && len(ready) > 0 {
		kept := ready[:0]
		for _, it := range ready {
			if r.fresh(e, it) {
				kept = append(kept, it)
			} else {
				r.dups.Add(1)
				r.log.Debug("edge item dropped: request key seen", "from", from, "to", r.to, "req_id", it.GetReqId(), "edge_seq", it.GetEdgeSeq())
			}
		}
		clear(ready[len(kept):])
		ready = kept
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

// localDeadline is the deadline (unix nanoseconds on the clock that read
// now) of an item that had remaining nanoseconds left; 0: none.
func localDeadline(now, remaining int64) int64 {
	switch {
	case remaining == 0:
		return 0
	case remaining > 0 && now > math.MaxInt64-remaining:
		return math.MaxInt64
	default:
		return max(now+remaining, 1) // an expired deadline stays one (0 is none)
	}
}

// remainingNano is the time left before deadline (unix nanoseconds of the
// clock that read now) as deadline_remaining_nano: 0 for none, negative
// (at least -1) once expired.
func remainingNano(now, deadline int64) int64 {
	if deadline == 0 {
		return 0
	}
	d := deadline - now
	switch {
	case (deadline > 0 && now < 0 && d < 0) || (deadline < 0 && now > 0 && d > 0):
		// Overflowed: the signs of the operands tell the direction.
		if deadline > 0 {
			return math.MaxInt64
		}
		return -1
	case d == 0:
		return -1
	}
	return d
}
