package manager

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

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
func BucketName(name string) string {
	var b strings.Builder
	b.WriteString("hams_")
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// DecodeTopology decodes a KV entry of TopologyKey and sets its revision.
func DecodeTopology(e jetstream.KeyValueEntry) (*hamsv1.Topology, error) {
	t := &hamsv1.Topology{}
	if err := proto.Unmarshal(e.Value(), t); err != nil {
		return nil, fmt.Errorf("manager: decode topology at revision %d: %w", e.Revision(), err)
	}
	t.Revision = e.Revision()
	return t, nil
}

// store is the deployment state in a JetStream KV bucket. Every write is a
// revision-checked Update (compare-and-swap) retried on conflict, so
// concurrent writers (handlers of this manager, or another manager) never
// lose each other's changes.
type store struct {
	kv      jetstream.KeyValue
	metrics *metrics
}

// ensure creates the topology key if it does not exist yet and returns the
// stored topology.
func (s *store) ensure(ctx context.Context, initial *hamsv1.Topology) (*hamsv1.Topology, error) {
	for range maxCASAttempts {
		e, err := s.kv.Get(ctx, TopologyKey)
		if err == nil {
			return DecodeTopology(e)
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
		if err != nil {
			return nil, err
		}
		next := proto.Clone(cur).(*hamsv1.Topology)
		fn(next)
		next.Revision = cur.Revision
		if proto.Equal(cur, next) {
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
