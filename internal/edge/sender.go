package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Resolver finds the live receiver of an edge (same shape as
// sidecar.Resolver and frontend.Resolver).
type Resolver interface {
	// Resolve returns the dataplane address of the live instance of model
	// and its epoch.
	Resolve(model string) (addr string, epoch uint64, ok bool)
	// Changed is closed (and replaced) whenever the topology changes.
	Changed() <-chan struct{}
}

// ErrClosed is returned by WaitNotFull after the Sender's Run ended.
var ErrClosed = errors.New("edge: sender stopped")

// Defaults of SenderConfig.
const (
	DefaultMaxBacklog   = 8192
	DefaultMaxBatchItem = 256
)

// SenderConfig configures a Sender.
type SenderConfig struct {
	// From is the sending model (config.Frontend for source edges), To the
	// receiving model (config.Frontend for sink edges).
	From, To string
	Resolver Resolver
	// MaxMessageBytes bounds one ForwardBatch (default grpcx default).
	MaxMessageBytes int
	Logger          *slog.Logger
	// Epoch is the sender's epoch stamped on every batch (nil: 0).
	Epoch func() uint64
	// MaxBacklog is the backlog (unacknowledged items) at which Full
	// reports true (default DefaultMaxBacklog).
	MaxBacklog int
	// MaxBatchItems bounds the items of one ForwardBatch (default 256).
	MaxBatchItems int
	// MinBackoff and MaxBackoff bound the wait between reconnects
	// (defaults 5ms and 1s).
	MinBackoff, MaxBackoff time.Duration
	// DialOptions are appended to grpcx.DialOptions (tests).
	DialOptions []grpc.DialOption
	// Position is an item's position in the sender's own sequence space:
	// what a receiver records as pred_seq in lineage and what Resend's
	// "after" is compared with. Default: the item's first edge_seq.
	Position func(*hamsv1.Item) uint64
	// MaxRetained and MaxRetainedBytes bound the acknowledged items kept
	// until Complete names their request (defaults DefaultMaxRetained and
	// DefaultMaxRetainedBytes); the oldest are dropped beyond them.
	MaxRetained      int
	MaxRetainedBytes int64
	// OnStaleIncarnation, if set, is called (on Run's goroutine) when the
	// receiver refused this sender's incarnation because another sender
	// of the same edge (another frontend that believed it led) replaced
	// it since. The owner may take the edge back with Resend, which
	// starts a newer incarnation (incarnation.go).
	OnStaleIncarnation func()
	// Now is the clock the items' deadlines (deadline_unix_nano) are on:
	// each item goes on the wire with the time left until its deadline
	// by this clock (deadline_remaining_nano). Default time.Now.
	Now func() time.Time
	// OverrideGrace bounds how long an address Resend named is kept while
	// the Resolver names another receiver at the same epoch (default
	// DefaultOverrideGrace). A higher epoch confirms or replaces the
	// override at once and a lower one is stale, but frontends have no
	// epoch: a frontend that wrongly believed it led (a stale topology)
	// and asked the sink models for a resend would otherwise keep every
	// sink edge on itself for good, while the leader waited for outputs
	// (a 30-minute soak, 2026-11-27: 13 minutes without a reply).
	OverrideGrace time.Duration
	// Incarnations hands out this sender's incarnations (default: the
	// process's source; tests give each simulated process its own).
	Incarnations *IncarnationSource
}

// Retention defaults.
const (
	DefaultMaxRetained            = 1 << 16
	DefaultMaxRetainedBytes int64 = 256 << 20
)

// ResendSpec is a Resend request.
type ResendSpec struct {
	// After: items whose Position is above it are resent.
	After uint64
	// Addr and Epoch of the receiver: the sender streams to Addr until its
	// Resolver reports the receiver at Epoch or later (the topology may lag
	// behind the manager's order). Empty Addr: whatever the Resolver says.
	Addr  string
	Epoch uint64
	// Items, when not nil, are the candidates instead of the retained
	// items (a stateful primary's output log); their Position decides.
	Items []*hamsv1.Item
}

// Sender is one long-lived outbound Forward stream of an edge.
//
// Invariants (under mu): buf holds exactly the items with edge_seq in
// (acked, nextSeq), in order, and meta their positions; items with
// edge_seq <= sent were written to the current stream; acked <= sent <
// nextSeq. Acknowledged items move to ret (unless they are resent copies
// of retained ones) until Complete names their request or the retention
// bound evicts them; retLive counts the live ret entries per request.
// gen grows with every Resend: acks of an older stream generation are
// ignored, since they count in the old incarnation's numbering.
type Sender struct {
	cfg SenderConfig
	log *slog.Logger

	mu sync.Mutex
	// incarnation names this sender's current edge_seq numbering space.
	incarnation  uint64
	gen          uint64
	reset        chan struct{} // closed and replaced by Resend
	override     *ResendSpec   // receiver address set by Resend, until the Resolver catches up
	overrideAt   time.Time     // when override was set (cfg.Now)
	buf          []*hamsv1.Item
	meta         []itemMeta
	ret          []retained
	retLive      map[uint64]int
	retDead      map[uint64]bool
	retBytes     int64
	deadN        int
	nextSeq      uint64
	acked        uint64
	sent         uint64
	closed       bool
	wake         chan struct{} // cap 1: items were added
	space        chan struct{} // closed and replaced when the backlog shrinks and spaceWaiters > 0
	spaceWaiters int
	stats        SenderStats
}

type itemMeta struct {
	pos    uint64
	resent bool // a copy made by Resend: not retained again when acked
	// completed: Complete named the request before the ack; not retained.
	completed bool
	retSize   int64
}

type retained struct {
	it   *hamsv1.Item
	pos  uint64
	size int64
}

// SenderStats counts a Sender's activity. Resent counts items sent again
// after a broken stream; Resends the items queued again by Resend.
type SenderStats struct {
	Sent, Resent, Acked, Reconnects, Resends uint64
}

// NewSender validates cfg.
func NewSender(cfg SenderConfig) (*Sender, error) {
	if cfg.From == "" || cfg.To == "" {
		return nil, fmt.Errorf("edge: sender needs From and To (got %q -> %q)", cfg.From, cfg.To)
	}
	if cfg.Resolver == nil {
		return nil, fmt.Errorf("edge: sender %s->%s needs a Resolver", cfg.From, cfg.To)
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = grpcx.DefaultMaxMessageBytes
	}
	if cfg.MaxBacklog <= 0 {
		cfg.MaxBacklog = DefaultMaxBacklog
	}
	if cfg.MaxBatchItems <= 0 {
		cfg.MaxBatchItems = DefaultMaxBatchItem
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 5 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = time.Second
	}
	if cfg.MaxRetained <= 0 {
		cfg.MaxRetained = DefaultMaxRetained
	}
	if cfg.MaxRetainedBytes <= 0 {
		cfg.MaxRetainedBytes = DefaultMaxRetainedBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.OverrideGrace <= 0 {
		cfg.OverrideGrace = DefaultOverrideGrace
	}
	if cfg.Incarnations == nil {
		cfg.Incarnations = processIncarnations
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sender{
		cfg: cfg, log: log.With("edge", cfg.From+"->"+cfg.To),
		nextSeq: 1, wake: make(chan struct{}, 1), space: make(chan struct{}),
		incarnation: cfg.Incarnations.Next(), reset: make(chan struct{}), retLive: map[uint64]int{}, retDead: map[uint64]bool{},
	}, nil
}

// Send enqueues items in call order, assigning edge_seq and from_model. It
// never blocks. The Sender owns the items afterwards: the caller must not
// modify them (share tensors between fan-out copies, not Items).
func (s *Sender) Send(items ...*hamsv1.Item) {
	if len(items) == 0 {
		return
	}
	s.mu.Lock()
	for _, it := range items {
		it.EdgeSeq = s.nextSeq
		it.FromModel = s.cfg.From
		s.nextSeq++
		s.buf = append(s.buf, it)
		s.meta = append(s.meta, itemMeta{pos: s.position(it), retSize: itemBytes(it)})
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Backlog is the number of items not yet acknowledged.
func (s *Sender) Backlog() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.buf)
}

// Full reports whether the backlog reached MaxBacklog.
func (s *Sender) Full() bool { return s.Backlog() >= s.cfg.MaxBacklog }

// WaitNotFull blocks until the backlog is below MaxBacklog, ctx ends or
// Run has ended.
func (s *Sender) WaitNotFull(ctx context.Context) error {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return ErrClosed
		}
		if len(s.buf) < s.cfg.MaxBacklog {
			s.mu.Unlock()
			return nil
		}
		ch := s.space
		s.spaceWaiters++
		s.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.mu.Lock()
		s.spaceWaiters--
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// MaxAcked is the receiver's max_in_order as last acknowledged.
func (s *Sender) MaxAcked() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked
}

// LastSeq is the edge_seq of the last item enqueued.
func (s *Sender) LastSeq() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nextSeq - 1
}

// Stats returns counters.
func (s *Sender) Stats() SenderStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Run keeps the edge's stream up until ctx ends: resolve, dial, stream,
// resend unacked items, and again after every break. It returns nil when
// ctx ends.
func (s *Sender) Run(ctx context.Context) error {
	s.mu.Lock()
	s.closed = false // Run again after an earlier Run ended (a role change)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.closed = true
		close(s.space)
		s.space = make(chan struct{})
		s.mu.Unlock()
	}()
	var (
		cc      *grpc.ClientConn
		ccAddr  string
		backoff = s.cfg.MinBackoff
	)
	defer func() {
		if cc != nil {
			_ = cc.Close()
		}
	}()
	for ctx.Err() == nil {
		changed := s.cfg.Resolver.Changed()
		addr, epoch, ok := s.target()
		if !ok {
			s.log.Debug("edge receiver not resolvable, waiting", "to", s.cfg.To)
			select {
			case <-ctx.Done():
			case <-changed:
			case <-time.After(backoff):
				backoff = min(2*backoff, s.cfg.MaxBackoff)
			}
			continue
		}
		if cc == nil || addr != ccAddr {
			if cc != nil {
				_ = cc.Close()
			}
			var err error
			cc, err = grpcx.Dial(addr, s.cfg.MaxMessageBytes, s.cfg.DialOptions...)
			if err != nil {
				return fmt.Errorf("edge %s->%s: %w", s.cfg.From, s.cfg.To, err)
			}
			ccAddr = addr
		}
		progressed, err := s.stream(ctx, cc, changed)
		if ctx.Err() != nil {
			break
		}
		if err != nil && s.cfg.OnStaleIncarnation != nil && strings.Contains(err.Error(), staleIncarnation) {
			s.cfg.OnStaleIncarnation()
		}
		s.mu.Lock()
		s.stats.Reconnects++
		s.mu.Unlock()
		if progressed {
			backoff = s.cfg.MinBackoff
		}
		s.log.Info("edge stream broken, reconnecting", "addr", addr, "receiver_epoch", epoch, "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
	return nil
}

// errTopologyChanged ends a stream whose receiver may have moved.
var errTopologyChanged = errors.New("edge: topology changed")

// errResend ends a stream when Resend starts a new incarnation.
var errResend = errors.New("edge: resend requested; new incarnation")

// DefaultOverrideGrace is SenderConfig.OverrideGrace's default: well
// above how far a component's topology lags behind the manager's orders.
const DefaultOverrideGrace = 2 * time.Second

// target is the receiver's address: the one Resend named until the
// Resolver reports the receiver at that epoch or later (or names another
// receiver at the same epoch for OverrideGrace), else the Resolver's.
func (s *Sender) target() (string, uint64, bool) {
	addr, epoch, ok := s.cfg.Resolver.Resolve(s.cfg.To)
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := s.override; o != nil {
		switch {
		case ok && (epoch > o.Epoch || epoch == o.Epoch && addr == o.Addr):
			s.override = nil
		case s.disputedLocked(addr, epoch, ok) && s.cfg.Now().Sub(s.overrideAt) >= s.cfg.OverrideGrace:
			s.log.Warn("resend address dropped: the topology names another receiver at the same epoch",
				"resend_addr", o.Addr, "addr", addr, "epoch", epoch, "grace", s.cfg.OverrideGrace)
			s.override = nil
			// What the dropped receiver acknowledged never reached this
			// one, which is past its own resend request: everything
			// retained goes to it, in a new incarnation (its receiver
			// would otherwise wait for the sequence numbers the other
			// one took). Receivers drop what they had by request key.
			s.resendLocked(ResendSpec{})
		default:
			return o.Addr, o.Epoch, true
		}
	}
	return addr, epoch, ok
}

// overrideExpiry fires when the Resend address the sender streams to, which
// the Resolver disputes at the same epoch, reaches OverrideGrace (nil when
// there is none): target is asked again then.
func (s *Sender) overrideExpiry() <-chan time.Time {
	addr, epoch, ok := s.cfg.Resolver.Resolve(s.cfg.To)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.disputedLocked(addr, epoch, ok) {
		return nil
	}
	return time.After(max(0, s.cfg.OverrideGrace-s.cfg.Now().Sub(s.overrideAt)))
}

// disputedLocked reports whether the Resolver's answer (addr at epoch, ok)
// names another receiver than the Resend address at the same epoch
// (caller holds mu).
func (s *Sender) disputedLocked(addr string, epoch uint64, ok bool) bool {
	o := s.override
	return o != nil && ok && epoch == o.Epoch && addr != o.Addr
}

// stream runs one Forward stream until it breaks, ctx ends or the topology
// changes to another address. progressed reports whether an ack arrived.
func (s *Sender) stream(ctx context.Context, cc *grpc.ClientConn, changed <-chan struct{}) (progressed bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := hamsv1.NewDataplaneClient(cc).Forward(sctx)
	if err != nil {
		return false, fmt.Errorf("open stream: %w", err)
	}
	s.mu.Lock()
	if s.sent > s.acked {
		s.stats.Resent += s.sent - s.acked
	}
	s.sent = s.acked // everything unacked goes out again on this stream
	gen, reset := s.gen, s.reset
	s.mu.Unlock()

	ackErr := make(chan error, 1)
	var acks sync.WaitGroup
	acks.Add(1)
	go func() {
		defer acks.Done()
		ackErr <- s.readAcks(st, gen)
	}()
	defer acks.Wait()
	defer cancel()

	var epoch uint64
	if s.cfg.Epoch != nil {
		epoch = s.cfg.Epoch()
	}
	expiry := s.overrideExpiry()
	for {
		batch := s.nextBatch(epoch, gen)
		if batch != nil {
			if err := st.Send(batch); err != nil {
				return s.gotAck(), fmt.Errorf("send: %w", err)
			}
			continue
		}
		recheck := false
		select {
		case <-expiry:
			recheck = true
		case <-ctx.Done():
			_ = st.CloseSend()
			return s.gotAck(), ctx.Err()
		case err := <-ackErr:
			return s.gotAck(), err
		case <-reset:
			_ = st.CloseSend()
			return true, errResend
		case <-changed:
			changed = s.cfg.Resolver.Changed()
			recheck = true
		case <-s.wake:
		}
		if recheck {
			// The topology changed, or a disputed Resend address expired:
			// the receiver may have moved.
			expiry = s.overrideExpiry()
			addr, ep, ok := s.target()
			if !ok || addr != cc.Target() {
				return s.gotAck(), fmt.Errorf("%w: %s now at %q (epoch %d, ok %v)", errTopologyChanged, s.cfg.To, addr, ep, ok)
			}
			if s.cfg.Epoch != nil {
				epoch = s.cfg.Epoch()
			}
		}
	}
}

func (s *Sender) gotAck() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.Acked > 0
}

// nextBatch takes the next unsent items (bounded by count and bytes) or nil.
func (s *Sender) nextBatch(epoch, gen uint64) *hamsv1.ForwardBatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen {
		return nil
	}
	start := int(s.sent - s.acked)
	if start >= len(s.buf) {
		return nil
	}
	limit := s.cfg.MaxMessageBytes - 1024
	end := start
	size := 0
	for end < len(s.buf) && end-start < s.cfg.MaxBatchItems {
		n := proto.Size(s.buf[end]) + 8
		if end > start && size+n > limit {
			break
		}
		size += n
		end++
	}
	items := make([]*hamsv1.Item, end-start)
	now := s.cfg.Now().UnixNano()
	for i, it := range s.buf[start:end] {
		items[i] = wireItem(it, now)
	}
	s.sent += uint64(end - start)
	s.stats.Sent += uint64(end - start)
	return &hamsv1.ForwardBatch{FromModel: s.cfg.From, ToModel: s.cfg.To, Epoch: epoch, Incarnation: s.incarnation, Items: items}
}

// readAcks trims the buffer on every ack until the stream ends.
func (s *Sender) readAcks(st hamsv1.Dataplane_ForwardClient, gen uint64) error {
	for {
		ack, err := st.Recv()
		if err != nil {
			return fmt.Errorf("recv ack: %w", err)
		}
		s.ack(gen, ack.GetMaxInOrder())
		if ack.GetError() != "" {
			return fmt.Errorf("receiver rejected batch: %s", ack.GetError())
		}
	}
}

func (s *Sender) ack(gen, m uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen || m <= s.acked {
		return
	}
	if m >= s.nextSeq {
		// The receiver acknowledges more than this sender ever assigned
		// (a previous incarnation of the sender): nothing to trim beyond
		// what we hold.
		m = s.nextSeq - 1
	}
	n := int(m - s.acked)
	for i := 0; i < n; i++ {
		if md := s.meta[i]; !md.resent && !md.completed {
			s.retain(s.buf[i], md.pos, md.retSize)
		}
	}
	clear(s.buf[:n])
	s.buf = s.buf[n:]
	s.meta = s.meta[n:]
	if len(s.buf) == 0 {
		s.buf = s.buf[:0]
		s.meta = s.meta[:0]
	}
	s.acked = m
	if s.sent < s.acked {
		s.sent = s.acked
	}
	s.stats.Acked += uint64(n)
	if s.spaceWaiters > 0 {
		close(s.space)
		s.space = make(chan struct{})
	}
}

func (s *Sender) position(it *hamsv1.Item) uint64 {
	if s.cfg.Position != nil {
		return s.cfg.Position(it)
	}
	return it.GetEdgeSeq()
}

func itemBytes(it *hamsv1.Item) int64 {
	var n int64
	for _, t := range it.GetTensors() {
		n += int64(len(t.GetData()))
	}
	return n + 64
}

// retain keeps an acknowledged item (caller holds mu) and evicts the
// oldest beyond the bounds.
func (s *Sender) retain(it *hamsv1.Item, pos uint64, size int64) {
	s.ret = append(s.ret, retained{it: it, pos: pos, size: size})
	s.retLive[it.GetReqId()]++
	s.retBytes += size
	for len(s.ret) > 0 && (len(s.ret)-s.deadCount() > s.cfg.MaxRetained || s.retBytes > s.cfg.MaxRetainedBytes) {
		r := s.ret[0]
		s.ret[0] = retained{}
		s.ret = s.ret[1:]
		if s.retDead[r.it.GetReqId()] {
			s.retBytes -= r.size
			if s.deadN--; s.deadN <= 0 {
				s.deadN = 0
				clear(s.retDead)
			}
			continue
		}
		s.dropLive(r)
	}
}

func (s *Sender) dropLive(r retained) {
	id := r.it.GetReqId()
	s.retBytes -= r.size
	if s.retLive[id]--; s.retLive[id] <= 0 {
		delete(s.retLive, id)
	}
}

// deadCount is an upper bound of the completed entries still in ret.
func (s *Sender) deadCount() int { return s.deadN }

// Complete forgets the retained items of the requests reqIDs (they left
// the graph: no receiver will need them again). Items of theirs not
// acknowledged yet (the completion overtook the ack) are marked, so they
// are dropped instead of retained when the ack comes; they are still
// delivered (and resent after a broken stream) until then.
func (s *Sender) Complete(reqIDs ...uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buf) > 0 && len(reqIDs) > 0 {
		done := make(map[uint64]struct{}, len(reqIDs))
		for _, id := range reqIDs {
			done[id] = struct{}{}
		}
		for i, it := range s.buf {
			if _, ok := done[it.GetReqId()]; ok {
				s.meta[i].completed = true
			}
		}
	}
	for _, id := range reqIDs {
		n, ok := s.retLive[id]
		if !ok {
			continue
		}
		delete(s.retLive, id)
		s.retDead[id] = true
		s.deadN += n
	}
	if s.deadN == 0 || s.deadN < len(s.ret)/2 {
		return
	}
	kept := s.ret[:0]
	for _, r := range s.ret {
		if s.retDead[r.it.GetReqId()] {
			s.retBytes -= r.size
			continue
		}
		kept = append(kept, r)
	}
	clear(s.ret[len(kept):])
	s.ret = kept
	clear(s.retDead)
	s.deadN = 0
}

// Retained is the number of acknowledged items kept for Resend.
func (s *Sender) Retained() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ret) - s.deadN
}

// Retain adds items as if they had been sent and acknowledged already (a
// promoted backup's saved outputs): Resend may send them, nothing else
// does. Their FromModel is set; EdgeSeq is assigned when resent.
func (s *Sender) Retain(items ...*hamsv1.Item) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range items {
		it.FromModel = s.cfg.From
		s.retain(it, s.position(it), itemBytes(it))
	}
}

// cloneItem is a shallow copy (tensors and lineage shared): the original
// may still be marshalled by an older stream while the copy is renumbered.
func cloneItem(it *hamsv1.Item) *hamsv1.Item {
	return &hamsv1.Item{
		ReqId: it.ReqId, Service: it.Service, StreamId: it.StreamId, Tensors: it.Tensors, Lineage: it.Lineage,
		EdgeSeq: it.EdgeSeq, DeadlineUnixNano: it.DeadlineUnixNano, FromModel: it.FromModel, Error: it.Error, ErrorCode: it.ErrorCode,
		Approximate: it.Approximate, DeadlineRemainingNano: it.DeadlineRemainingNano, TraceContext: it.TraceContext,
	}
}

// wireItem is the item as it goes on the wire at now (unix nanoseconds of
// the sender's clock): its deadline as the time left (a shallow copy, since
// the caller may still read the original: a primary's output log), or the
// item itself when it has none.
func wireItem(it *hamsv1.Item, now int64) *hamsv1.Item {
	if it.GetDeadlineUnixNano() == 0 && it.GetDeadlineRemainingNano() == 0 {
		return it
	}
	c := cloneItem(it)
	c.DeadlineRemainingNano = remainingNano(now, it.GetDeadlineUnixNano())
	c.DeadlineUnixNano = 0
	return c
}

// Resend starts a new incarnation of the edge: the candidates (retained
// items, or spec.Items) whose position is above spec.After, in their
// original order, then every unacknowledged item, are renumbered from
// edge_seq 1 and streamed to spec.Addr (or the Resolver's address). The
// receiver resets its sequence space on the new incarnation and drops
// what it already had by request (positions are conservative). It returns
// the number of candidates queued again.
func (s *Sender) Resend(spec ResendSpec) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resendLocked(spec)
}

// resendLocked is Resend with mu held.
func (s *Sender) resendLocked(spec ResendSpec) int {
	var items []*hamsv1.Item
	var meta []itemMeta
	if spec.Items != nil {
		for _, it := range spec.Items {
			if p := s.position(it); p > spec.After {
				c := cloneItem(it)
				c.FromModel = s.cfg.From
				items = append(items, c)
				meta = append(meta, itemMeta{pos: p, resent: true})
			}
		}
	} else {
		for _, r := range s.ret {
			if r.pos > spec.After && !s.retDead[r.it.GetReqId()] {
				items = append(items, cloneItem(r.it))
				meta = append(meta, itemMeta{pos: r.pos, resent: true})
			}
		}
	}
	n := len(items)
	for i, it := range s.buf {
		items = append(items, cloneItem(it))
		meta = append(meta, s.meta[i])
	}
	for i, it := range items {
		it.EdgeSeq = uint64(i + 1)
	}
	clear(s.buf)
	s.buf, s.meta = items, meta
	s.acked, s.sent, s.nextSeq = 0, 0, uint64(len(items)+1)
	s.incarnation = s.cfg.Incarnations.Next()
	s.gen++
	s.stats.Resends += uint64(n)
	if spec.Addr != "" {
		o := spec
		o.Items = nil
		s.override, s.overrideAt = &o, s.cfg.Now()
	}
	close(s.reset)
	s.reset = make(chan struct{})
	if s.spaceWaiters > 0 {
		close(s.space)
		s.space = make(chan struct{})
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
	s.log.Info("edge resend: new incarnation", "after", spec.After, "resent", n, "unacked", len(items)-n,
		"addr", spec.Addr, "receiver_epoch", spec.Epoch, "incarnation", s.incarnation)
	return n
}
