package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
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
}

// Sender is one long-lived outbound Forward stream of an edge.
//
// Invariants (under mu): buf holds exactly the items with edge_seq in
// (acked, nextSeq), in order; items with edge_seq <= sent were written to
// the current stream; acked <= sent < nextSeq.
type Sender struct {
	cfg SenderConfig
	log *slog.Logger
	// incarnation names this sender's edge_seq numbering space.
	incarnation uint64

	mu           sync.Mutex
	buf          []*hamsv1.Item
	nextSeq      uint64
	acked        uint64
	sent         uint64
	closed       bool
	wake         chan struct{} // cap 1: items were added
	space        chan struct{} // closed and replaced when the backlog shrinks and spaceWaiters > 0
	spaceWaiters int
	stats        SenderStats
}

// SenderStats counts a Sender's activity.
type SenderStats struct {
	Sent, Resent, Acked, Reconnects uint64
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
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sender{
		cfg: cfg, log: log.With("edge", cfg.From+"->"+cfg.To),
		nextSeq: 1, wake: make(chan struct{}, 1), space: make(chan struct{}),
		incarnation: newIncarnation(),
	}, nil
}

var lastIncarnation atomic.Uint64

// newIncarnation returns a number larger than any earlier one of this
// process and, through the wall clock, of earlier processes on this host.
func newIncarnation() uint64 {
	for {
		last := lastIncarnation.Load()
		n := max(uint64(time.Now().UnixNano()), last+1)
		if lastIncarnation.CompareAndSwap(last, n) {
			return n
		}
	}
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
		addr, epoch, ok := s.cfg.Resolver.Resolve(s.cfg.To)
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
	s.mu.Unlock()

	ackErr := make(chan error, 1)
	var acks sync.WaitGroup
	acks.Add(1)
	go func() {
		defer acks.Done()
		ackErr <- s.readAcks(st)
	}()
	defer acks.Wait()
	defer cancel()

	var epoch uint64
	if s.cfg.Epoch != nil {
		epoch = s.cfg.Epoch()
	}
	for {
		batch := s.nextBatch(epoch)
		if batch != nil {
			if err := st.Send(batch); err != nil {
				return s.gotAck(), fmt.Errorf("send: %w", err)
			}
			continue
		}
		select {
		case <-ctx.Done():
			_ = st.CloseSend()
			return s.gotAck(), ctx.Err()
		case err := <-ackErr:
			return s.gotAck(), err
		case <-changed:
			changed = s.cfg.Resolver.Changed()
			addr, ep, ok := s.cfg.Resolver.Resolve(s.cfg.To)
			if !ok || addr != cc.Target() {
				return s.gotAck(), fmt.Errorf("%w: %s now at %q (epoch %d, ok %v)", errTopologyChanged, s.cfg.To, addr, ep, ok)
			}
			if s.cfg.Epoch != nil {
				epoch = s.cfg.Epoch()
			}
		case <-s.wake:
		}
	}
}

func (s *Sender) gotAck() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.Acked > 0
}

// nextBatch takes the next unsent items (bounded by count and bytes) or nil.
func (s *Sender) nextBatch(epoch uint64) *hamsv1.ForwardBatch {
	s.mu.Lock()
	defer s.mu.Unlock()
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
	copy(items, s.buf[start:end])
	s.sent += uint64(end - start)
	s.stats.Sent += uint64(end - start)
	return &hamsv1.ForwardBatch{FromModel: s.cfg.From, ToModel: s.cfg.To, Epoch: epoch, Incarnation: s.incarnation, Items: items}
}

// readAcks trims the buffer on every ack until the stream ends.
func (s *Sender) readAcks(st hamsv1.Dataplane_ForwardClient) error {
	for {
		ack, err := st.Recv()
		if err != nil {
			return fmt.Errorf("recv ack: %w", err)
		}
		s.ack(ack.GetMaxInOrder())
		if ack.GetError() != "" {
			return fmt.Errorf("receiver rejected batch: %s", ack.GetError())
		}
	}
}

func (s *Sender) ack(m uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m <= s.acked {
		return
	}
	if m >= s.nextSeq {
		// The receiver acknowledges more than this sender ever assigned
		// (a previous incarnation of the sender): nothing to trim beyond
		// what we hold.
		m = s.nextSeq - 1
	}
	n := int(m - s.acked)
	clear(s.buf[:n])
	s.buf = s.buf[n:]
	if len(s.buf) == 0 {
		s.buf = s.buf[:0]
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
