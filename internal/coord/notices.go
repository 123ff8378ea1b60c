package coord

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/run"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// durabilityMsgID is the JetStream message id of notice n: Announce and
// AnnounceLive give one notice the same id, so the stream stores it once.
func durabilityMsgID(n *hamsv1.DurabilityNotice) string {
	return fmt.Sprintf("d/%s/%d/%d", n.Model, n.Epoch, n.DurableSeq)
}

// AnnounceLive publishes notice n to its model's subject as a plain NATS
// message and returns without waiting for JetStream. Subscribers (the
// reply gates' WatchDurable) get it as NATS routes it, whether or not the
// durability stream has a leader: after the loss of the node that led it,
// the stream's raft group elects a new one only after its election
// timeout (4-9 s in nats-server 2.15, not configurable), and a backup that
// waited for the acknowledgement held every reply gate for that long
// (docs/coordination.md, "Node failures"). The stream stores the message
// too when it has a leader (same message id as Announce); storing it
// for sure, for WatchDurable's catch-up reads, is NoticePersister's job.
func (c *Coord) AnnounceLive(n *hamsv1.DurabilityNotice) error {
	b, err := proto.Marshal(n)
	if err != nil {
		return fmt.Errorf("coord: encode durability notice: %w", err)
	}
	m := nats.NewMsg(DurableSubject(c.deployment, n.Model))
	m.Header.Set(jetstream.MsgIDHeader, durabilityMsgID(n))
	m.Data = b
	if err := c.js.Conn().PublishMsg(m); err != nil {
		return fmt.Errorf("coord: announce %s durable to %d: %w", n.Model, n.DurableSeq, err)
	}
	return nil
}

// noticeAdvances reports whether n reports more than prev: a newer epoch,
// or a higher durable seq in the same epoch (WatchDurable's rule).
func noticeAdvances(n, prev *hamsv1.DurabilityNotice) bool {
	return prev == nil || n.GetEpoch() > prev.GetEpoch() ||
		n.GetEpoch() == prev.GetEpoch() && n.GetDurableSeq() > prev.GetDurableSeq()
}

// NoticePersister stores a model's durability notices in the durability
// stream (announce: Coord.Announce, acknowledged) off the caller's path,
// retrying until one is stored. Only the newest notice offered is kept:
// a catch-up read uses the stream's last notice per model, and a notice
// reports a fact that stays true, so storing a newer one in place of an
// older one loses nothing. New validates nothing and starts nothing; Run
// does the work and returns when ctx ends.
type NoticePersister struct {
	announce func(context.Context, *hamsv1.DurabilityNotice) error
	wake     chan struct{}

	mu      sync.Mutex
	pending *hamsv1.DurabilityNotice // newest offered and not yet stored
	stored  *hamsv1.DurabilityNotice // newest stored

	failures atomic.Uint64
}

// NewNoticePersister returns a persister that stores notices with
// announce.
func NewNoticePersister(announce func(context.Context, *hamsv1.DurabilityNotice) error) *NoticePersister {
	return &NoticePersister{announce: announce, wake: make(chan struct{}, 1)}
}

// Offer hands n over to be stored; an n that does not advance on what
// was offered before is ignored. It never blocks.
func (p *NoticePersister) Offer(n *hamsv1.DurabilityNotice) {
	p.mu.Lock()
	if !noticeAdvances(n, p.pending) || !noticeAdvances(n, p.stored) {
		p.mu.Unlock()
		return
	}
	p.pending = n
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Stored returns the newest notice stored so far (nil: none).
func (p *NoticePersister) Stored() *hamsv1.DurabilityNotice {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stored
}

// Failures counts failed store attempts (each retried).
func (p *NoticePersister) Failures() uint64 { return p.failures.Load() }

// Run stores the newest offered notice until ctx ends, retrying a failed
// store with backoff (the newest notice offered by then is the one
// retried).
func (p *NoticePersister) Run(ctx context.Context) error {
	const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second
	backoff := minBackoff
	for {
		p.mu.Lock()
		n := p.pending
		p.mu.Unlock()
		if n == nil {
			select {
			case <-p.wake:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		if err := p.announce(ctx, n); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			p.failures.Add(1)
			if !run.Sleep(ctx, backoff) {
				return nil
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
		p.mu.Lock()
		if noticeAdvances(n, p.stored) {
			p.stored = n
		}
		if p.pending == n {
			p.pending = nil
		}
		p.mu.Unlock()
	}
}
