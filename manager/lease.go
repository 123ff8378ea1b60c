package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LeaseKey is the key of the active-manager lease in the deployment's KV
// bucket. Its value is the holder's id.
const LeaseKey = "manager_lease"

// DefaultLeaseTTL is how long a lease lives without renewal.
const DefaultLeaseTTL = 2 * time.Second

// lease elects one active manager per deployment without trusting clocks
// across processes: the holder renews with a revision-checked Update every
// ttl/3; a contender that sees the key's revision unchanged for a whole ttl
// (measured on its own clock) takes it over with an Update at the revision
// it saw. Invariant: at most one holder's renewal succeeds per revision, so
// two managers never both believe they renewed the same lease; a holder
// that could not renew for 2/3 ttl steps down before a contender can take
// over (which needs a full ttl of silence).
//
// A manager that just started watches a whole ttl before its observation
// counts (the silence it needs is measured from started+ttl at the
// earliest): a manager restarted after a crash then never takes over a
// lease that a standby, watching since before the crash, is about to
// take; the standby is the one that moves first, every time.
type lease struct {
	kv  jetstream.KeyValue
	id  string
	ttl time.Duration
	log *slog.Logger
	// onChange is called from the lease loop when the role changes.
	onChange func(active bool)
	// keep: do not release on stop (tests simulate a crash).
	keep bool

	active    bool
	rev       uint64    // our revision while active
	renewedAt time.Time // last successful create/renew
	seenRev   uint64    // other holder's revision
	seenAt    time.Time // when seenRev was first seen
	started   time.Time // first step
}

// run ticks until ctx ends. On a clean stop the lease is released
// (deleted at our revision) so a successor takes over at once.
func (l *lease) run(ctx context.Context) error {
	tk := time.NewTicker(max(l.ttl/3, time.Millisecond))
	defer tk.Stop()
	l.step(ctx, time.Now())
	for {
		select {
		case <-ctx.Done():
			if l.active && !l.keep {
				rctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if err := l.release(rctx); err != nil {
					l.log.Warn("release manager lease; a successor waits for it to expire", "err", err)
				}
				cancel()
				l.set(false)
			}
			return nil
		case now := <-tk.C:
			l.step(ctx, now)
		}
	}
}

// release deletes the lease so a successor takes it at once. A renewal
// whose answer was lost (stop cancelled it in flight, or it timed out)
// may have landed all the same: the key then sits at a later revision
// than rev, still holding our id. Only this manager writes its id, so
// that revision is ours too and is released; a lease another manager
// took meanwhile (another id) is left alone.
func (l *lease) release(ctx context.Context) error {
	err := l.kv.Delete(ctx, LeaseKey, jetstream.LastRevision(l.rev))
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return err
	}
	e, gerr := l.kv.Get(ctx, LeaseKey)
	if gerr != nil {
		if errors.Is(gerr, jetstream.ErrKeyNotFound) {
			return nil // released or expired and deleted: nothing to do
		}
		return fmt.Errorf("release at revision %d: %w; read it back: %w", l.rev, err, gerr)
	}
	if string(e.Value()) != l.id {
		return nil // taken over by another manager
	}
	if err := l.kv.Delete(ctx, LeaseKey, jetstream.LastRevision(e.Revision())); err != nil {
		return fmt.Errorf("release at revision %d (ours after a renewal whose answer was lost): %w", e.Revision(), err)
	}
	return nil
}

func (l *lease) set(active bool) {
	if l.active == active {
		return
	}
	l.active = active
	if active {
		l.log.Info("became active manager", "lease_revision", l.rev)
	} else {
		l.log.Info("no longer the active manager")
	}
	if l.onChange != nil {
		l.onChange(active)
	}
}

// step is one lease round at now.
func (l *lease) step(ctx context.Context, now time.Time) {
	if l.started.IsZero() {
		l.started = now
	}
	opCtx, cancel := context.WithTimeout(ctx, max(l.ttl/3, 10*time.Millisecond))
	defer cancel()
	if l.active {
		rev, err := l.kv.Update(opCtx, LeaseKey, []byte(l.id), l.rev)
		if err == nil {
			l.rev, l.renewedAt = rev, now
			return
		}
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound) ||
			now.Sub(l.renewedAt) > 2*l.ttl/3 {
			l.log.Warn("manager lease lost", "err", err)
			l.set(false)
			l.seenRev, l.seenAt = 0, now
		}
		return
	}
	e, err := l.kv.Get(opCtx, LeaseKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || (err == nil && e.Operation() != jetstream.KeyValuePut):
		var rev uint64
		if err == nil {
			// Deleted (released): take it at the delete marker's revision.
			rev, err = l.kv.Update(opCtx, LeaseKey, []byte(l.id), e.Revision())
		} else {
			rev, err = l.kv.Create(opCtx, LeaseKey, []byte(l.id))
		}
		if err == nil {
			l.rev, l.renewedAt = rev, now
			l.set(true)
		}
	case err != nil:
		l.log.Debug("read manager lease", "err", err)
	case string(e.Value()) == l.id && l.seenRev == 0:
		// Our own lease from before a restart: take it back at once.
		if rev, err := l.kv.Update(opCtx, LeaseKey, []byte(l.id), e.Revision()); err == nil {
			l.rev, l.renewedAt = rev, now
			l.set(true)
		}
	case e.Revision() != l.seenRev:
		l.seenRev, l.seenAt = e.Revision(), now
	case now.Sub(later(l.seenAt, l.started.Add(l.ttl))) > l.ttl:
		if rev, err := l.kv.Update(opCtx, LeaseKey, []byte(l.id), e.Revision()); err == nil {
			l.log.Info("manager lease expired; taking over", "previous_holder", string(e.Value()))
			l.rev, l.renewedAt = rev, now
			l.set(true)
		}
	}
}

func (l *lease) String() string { return fmt.Sprintf("lease(%s)", l.id) }
