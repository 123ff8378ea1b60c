package coord

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/run"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// durabilityMsgID is the JetStream message id of notice n: a store
// retried after a lost acknowledgement is stored once.
func durabilityMsgID(n *hamsv1.DurabilityNotice) string {
	return fmt.Sprintf("d/%s/%d/%d", n.Model, n.Epoch, n.DurableSeq)
}

// AnnounceLive publishes notice n to its model's live subject as a plain
// NATS message and returns without waiting for JetStream. Subscribers
// (the reply gates' WatchDurable) get it as NATS routes it, whether or
// not the durability stream has a leader: after the loss of the node that
// led it, the stream's raft group elects a new one only after its
// election timeout (4-9 s in nats-server 2.15, not configurable), and a
// backup that waited for the acknowledgement held every reply gate for
// that long (docs/coordination.md, "Node failures").
//
// The live subject is outside the durability stream, so the stream does
// not store every notice: at batch 1 a backup announces one per request,
// and the stream's store and duplicate check of each, beside the
// persister's acknowledged store of the same notice, were most of what
// replication cost the NATS server (docs/measurements.md, "Issue 22,
// eighth session").
// Storing notices, for WatchDurable's catch-up reads and LastDurable, is
// NoticePersister's job, spaced.
func (c *Coord) AnnounceLive(n *hamsv1.DurabilityNotice) error {
	b, err := proto.Marshal(n)
	if err != nil {
		return fmt.Errorf("coord: encode durability notice: %w", err)
	}
	if err := c.js.Conn().Publish(LiveSubject(c.deployment, n.Model), b); err != nil {
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
// older one loses nothing. Stores are spaced: after one, the next waits
// spacing, and stores whatever is newest by then, so at batch 1 a
// backup's hundreds of notices a second cost a few stores. The stored
// notice then lags the live ones by at most spacing (and the store's
// round trip), which is what a catch-up read or LastDurable may miss; a
// pending notice is not stored once ctx ends (a promotion does not wait
// for NATS). New validates nothing and starts nothing; Run does the work
// and returns when ctx ends.
type NoticePersister struct {
	announce func(context.Context, *hamsv1.DurabilityNotice) error
	spacing  time.Duration
	wake     chan struct{}
	// sleep waits between stores (run.Sleep; a test's hook).
	sleep func(context.Context, time.Duration) bool

	mu      sync.Mutex
	pending *hamsv1.DurabilityNotice // newest offered and not yet stored
	stored  *hamsv1.DurabilityNotice // newest stored

	failures atomic.Uint64
	stores   atomic.Uint64

	// Observe, when set (before Run), is told the outcome of every store
	// attempt: stored, or failed (and retried). A sidecar counts them in
	// its metrics.
	Observe func(stored bool)
}

// NoticeStoreSpacing is the spacing of a backup's notice stores: well
// under WatchDurable's catch-up period, so a catch-up read is at most one
// period and one spacing behind.
const NoticeStoreSpacing = 50 * time.Millisecond

// NewNoticePersister returns a persister that stores notices with
// announce, at most one per spacing (0: one as soon as the last is
// stored).
func NewNoticePersister(announce func(context.Context, *hamsv1.DurabilityNotice) error, spacing time.Duration) *NoticePersister {
	return &NoticePersister{announce: announce, spacing: spacing, wake: make(chan struct{}, 1), sleep: run.Sleep}
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

// Stores counts the notices stored.
func (p *NoticePersister) Stores() uint64 { return p.stores.Load() }

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
			if p.Observe != nil {
				p.Observe(false)
			}
			if !p.sleep(ctx, backoff) {
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
		p.stores.Add(1)
		if p.Observe != nil {
			p.Observe(true)
		}
		if p.spacing > 0 && !p.sleep(ctx, p.spacing) {
			return nil
		}
	}
}
