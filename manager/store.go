package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/coord"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// TopologyKey is the key of the proto-encoded hamsv1.Topology in the
// deployment's KV bucket. The stored message has revision 0; a reader sets
// Topology.revision from the KV entry's revision.
const TopologyKey = "topology"

// maxCASAttempts bounds the compare-and-swap retry loop; hitting it means
// something rewrites the key continuously.
const maxCASAttempts = 64

// BucketName returns the KV bucket that holds the state of the deployment
// called name: "hams_" followed by name with every character outside
// [A-Za-z0-9_-] replaced by '_'.
func BucketName(name string) string { return coord.TopologyBucket(name) }

// MaxTopologyBytes bounds a stored topology: a larger value is not
// decoded (a deployment's topology is a few KiB).
const MaxTopologyBytes = 16 << 20

// ErrBadTopology is wrapped by the errors of a stored topology that
// cannot be read.
var ErrBadTopology = errors.New("manager: unreadable topology")

// DecodeTopology decodes a KV entry of TopologyKey and sets its revision.
// A value over MaxTopologyBytes is refused before it is decoded.
func DecodeTopology(e jetstream.KeyValueEntry) (*hamsv1.Topology, error) {
	return decodeTopology(e.Value(), e.Revision())
}

func decodeTopology(b []byte, rev uint64) (*hamsv1.Topology, error) {
	if len(b) > MaxTopologyBytes {
		return nil, fmt.Errorf("%w at revision %d: %d bytes (limit %d)", ErrBadTopology, rev, len(b), MaxTopologyBytes)
	}
	t := &hamsv1.Topology{}
	if err := proto.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("%w at revision %d: %v", ErrBadTopology, rev, err)
	}
	t.Revision = rev
	return t, nil
}

// store is the deployment state in a JetStream KV bucket. Every write is a
// revision-checked Update (compare-and-swap) retried on conflict, so
// concurrent writers (handlers of this manager, or another manager) never
// lose each other's changes.
//
// A stored value that cannot be read (anyone who can write the bucket
// can put garbage there) does not stop the manager from writing its
// state: mutate applies its change to the last topology this store read
// or wrote (the initial one if none) and writes the result over the
// unreadable value, with the same compare-and-swap.
type store struct {
	kv      jetstream.KeyValue
	metrics *metrics

	mu sync.Mutex
	// good is the last topology read or written (nil before any);
	// initial the one ensure was given.
	good, initial *hamsv1.Topology
}

// remember records t as the last readable topology.
func (s *store) remember(t *hamsv1.Topology) {
	s.mu.Lock()
	if s.good == nil || t.GetRevision() >= s.good.GetRevision() {
		s.good = t
	}
	s.mu.Unlock()
}

// fallback is the topology mutate starts from when the stored one is
// unreadable (at revision rev); nil when this store never had one.
func (s *store) fallback(rev uint64) *hamsv1.Topology {
	s.mu.Lock()
	base := s.good
	if base == nil {
		base = s.initial
	}
	s.mu.Unlock()
	if base == nil {
		return nil
	}
	t := proto.Clone(base).(*hamsv1.Topology)
	t.Revision = rev
	return t
}

// ensure creates the topology key if it does not exist yet and returns the
// stored topology.
func (s *store) ensure(ctx context.Context, initial *hamsv1.Topology) (*hamsv1.Topology, error) {
	s.mu.Lock()
	s.initial = proto.Clone(initial).(*hamsv1.Topology)
	s.mu.Unlock()
	for range maxCASAttempts {
		e, err := s.kv.Get(ctx, TopologyKey)
		if err == nil {
			t, derr := DecodeTopology(e)
			if derr != nil {
				// Rewritten by the first mutate; readers skip it.
				s.metrics.kvUnreadable.Inc()
				return s.fallback(e.Revision()), nil
			}
			s.remember(t)
			return t, nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("manager: get %s: %w", TopologyKey, err)
		}
		b, err := encodeTopology(initial)
		if err != nil {
			return nil, err
		}
		rev, err := s.kv.Create(ctx, TopologyKey, b)
		if errors.Is(err, jetstream.ErrKeyExists) {
			s.metrics.kvConflicts.Inc()
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("manager: create %s: %w", TopologyKey, err)
		}
		t := proto.Clone(initial).(*hamsv1.Topology)
		t.Revision = rev
		return t, nil
	}
	return nil, fmt.Errorf("manager: create %s: %w", TopologyKey, errTooManyConflicts)
}

var errTooManyConflicts = errors.New("manager: too many compare-and-swap conflicts")

// mutate applies fn to the latest stored topology and writes the result with
// Update(revision) (compare-and-swap); on a revision conflict it reloads and
// applies fn again, so fn must be a pure function of its argument and of
// state it reads under its own lock. It returns the topology as written (or
// as read when fn changed nothing, in which case nothing is written).
func (s *store) mutate(ctx context.Context, fn func(*hamsv1.Topology)) (*hamsv1.Topology, error) {
	for range maxCASAttempts {
		e, err := s.kv.Get(ctx, TopologyKey)
		if err != nil {
			return nil, fmt.Errorf("manager: get %s: %w", TopologyKey, err)
		}
		cur, err := DecodeTopology(e)
		bad := err != nil
		if bad {
			s.metrics.kvUnreadable.Inc()
			if cur = s.fallback(e.Revision()); cur == nil {
				return nil, fmt.Errorf("%w, and no readable one to rewrite it from", err)
			}
		} else {
			s.remember(cur)
		}
		next := proto.Clone(cur).(*hamsv1.Topology)
		fn(next)
		next.Revision = cur.Revision
		if !bad && proto.Equal(cur, next) {
			return cur, nil
		}
		b, err := encodeTopology(next)
		if err != nil {
			return nil, err
		}
		rev, err := s.kv.Update(ctx, TopologyKey, b, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			s.metrics.kvConflicts.Inc()
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("manager: update %s at revision %d: %w", TopologyKey, e.Revision(), err)
		}
		s.metrics.kvUpdates.Inc()
		next.Revision = rev
		s.remember(next)
		return next, nil
	}
	return nil, fmt.Errorf("manager: update %s: %w", TopologyKey, errTooManyConflicts)
}

func encodeTopology(t *hamsv1.Topology) ([]byte, error) {
	c := proto.Clone(t).(*hamsv1.Topology)
	c.Revision = 0
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("manager: encode topology: %w", err)
	}
	return b, nil
}

// hub holds the newest topology seen and wakes watchers when it changes.
// Invariant: cur only moves to a higher revision, except after reset (a
// store whose revisions restarted).
type hub struct {
	mu      sync.Mutex
	cur     *hamsv1.Topology
	changed chan struct{}
}

func newHub() *hub { return &hub{changed: make(chan struct{})} }

// get returns the current topology (read-only) and a channel closed at the
// next change.
func (h *hub) get() (*hamsv1.Topology, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur, h.changed
}

// offer installs t if it is newer than the current one.
func (h *hub) offer(t *hamsv1.Topology) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur != nil && t.GetRevision() <= h.cur.GetRevision() {
		return false
	}
	h.cur = t
	close(h.changed)
	h.changed = make(chan struct{})
	return true
}
