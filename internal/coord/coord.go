package coord

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// ErrClosed is returned by a watch whose consumer stopped unexpectedly.
var ErrClosed = errors.New("coord: watch closed")

// Coord publishes and watches the protocol's notices of one deployment.
type Coord struct {
	js         jetstream.JetStream
	deployment string
	// incarnation makes message ids of this process unique: a restarted
	// frontend numbers its requests from 1 again, and its completion
	// notices must not fall into the previous incarnation's duplicate
	// window.
	incarnation int64
	// frontends is the bucket of frontend incarnations (requestlog.go).
	frontends jetstream.KeyValue
	// badRecords counts records and notices skipped as unreadable.
	badRecords atomic.Uint64
	// clock is this process's clock and its offset to the server's
	// (serverclock.go): request-log deadlines are read through it.
	clock serverClock
}

// TopologyBucket is the KV bucket that holds the state of the deployment
// called dep (the manager's topology key and lease): "hams_" followed by
// dep with every character outside [A-Za-z0-9_-] replaced by '_'.
func TopologyBucket(dep string) string {
	var b strings.Builder
	b.WriteString("hams_")
	for _, r := range dep {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

func streamName(dep, what string) string {
	r := strings.NewReplacer(".", "_", "-", "_", " ", "_", "*", "_", ">", "_")
	return "HAMS_" + r.Replace(dep) + "_" + what
}

// DurableSubject is the subject of model's durability notices.
func DurableSubject(dep, model string) string { return "hams." + dep + ".durable." + model }

// LiveSubject is the subject model's durability notices are handed to
// the reply gates on (AnnounceLive): plain NATS, outside the durability
// stream.
func LiveSubject(dep, model string) string { return "hams." + dep + ".live." + model }

// CompletedSubject is the subject of the frontend's completion notices.
func CompletedSubject(dep string) string { return "hams." + dep + ".completed" }

// Open creates (or updates) the deployment's streams and buckets with
// replicas copies each: 1 on a single server (the embedded default), 3 on
// a cluster (docs/coordination.md). An existing stream with more replicas
// keeps them (replicasFor).
func Open(ctx context.Context, nc *nats.Conn, deployment string, replicas int) (*Coord, error) {
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(OpTimeout))
	if err != nil {
		return nil, fmt.Errorf("coord: jetstream context: %w", err)
	}
	cfgs := []jetstream.StreamConfig{
		{
			Name:              streamName(deployment, "DURABLE"),
			Subjects:          []string{DurableSubject(deployment, "*")},
			Storage:           jetstream.FileStorage,
			Replicas:          replicas,
			MaxMsgsPerSubject: 16,
			Duplicates:        2 * time.Minute,
			Discard:           jetstream.DiscardOld,
			AllowDirect:       true,
		},
		{
			Name:       streamName(deployment, "COMPLETED"),
			Subjects:   []string{CompletedSubject(deployment)},
			Storage:    jetstream.FileStorage,
			Replicas:   replicas,
			MaxMsgs:    4096,
			Duplicates: 2 * time.Minute,
			Discard:    jetstream.DiscardOld,
		},
	}
	for _, c := range cfgs {
		c.Replicas = replicasFor(ctx, js, c.Name, replicas)
		if _, err := js.CreateOrUpdateStream(ctx, c); err != nil {
			return nil, fmt.Errorf("coord: create stream %s: %w", c.Name, err)
		}
	}
	c := &Coord{js: js, deployment: deployment, incarnation: time.Now().UnixNano()}
	if err := c.openRequestLog(ctx, replicas); err != nil {
		return nil, err
	}
	return c, nil
}

// Announce publishes that n.Model is durable up to n.DurableSeq.
func (c *Coord) Announce(ctx context.Context, n *hamsv1.DurabilityNotice) error {
	b, err := proto.Marshal(n)
	if err != nil {
		return fmt.Errorf("coord: encode durability notice: %w", err)
	}
	if _, err := c.js.Publish(ctx, DurableSubject(c.deployment, n.Model), b, jetstream.WithMsgID(durabilityMsgID(n))); err != nil {
		return fmt.Errorf("coord: announce %s durable to %d: %w", n.Model, n.DurableSeq, err)
	}
	return nil
}

// LastDurable returns the newest durability notice of model the stream
// stores, nil when it stores none (the model never had a snapshot
// applied). A notice handed to the reply gates at once (AnnounceLive) and
// not yet stored is not seen: the answer is a lower bound of what the
// gates may have released.
func (c *Coord) LastDurable(ctx context.Context, model string) (*hamsv1.DurabilityNotice, error) {
	st, err := c.js.Stream(ctx, streamName(c.deployment, "DURABLE"))
	if err != nil {
		return nil, fmt.Errorf("coord: durability stream: %w", err)
	}
	m, err := st.GetLastMsgForSubject(ctx, DurableSubject(c.deployment, model))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("coord: read the last durability notice of %s: %w", model, err)
	}
	n := &hamsv1.DurabilityNotice{}
	if err := proto.Unmarshal(m.Data, n); err != nil {
		return nil, fmt.Errorf("coord: decode the last durability notice of %s: %w", model, err)
	}
	return n, nil
}

// Complete publishes that requests left the graph.
func (c *Coord) Complete(ctx context.Context, n *hamsv1.CompletionNotice) error {
	if len(n.ReqIds) == 0 {
		return nil
	}
	b, err := proto.Marshal(n)
	if err != nil {
		return fmt.Errorf("coord: encode completion notice: %w", err)
	}
	id := fmt.Sprintf("c/%s/%d/%d/%d", n.Frontend, c.incarnation, n.ReqIds[0], len(n.ReqIds))
	if _, err := c.js.Publish(ctx, CompletedSubject(c.deployment), b, jetstream.WithMsgID(id)); err != nil {
		return fmt.Errorf("coord: publish completion of %d requests: %w", len(n.ReqIds), err)
	}
	return nil
}

// durableCatchUp is how often a durability watch re-reads the last
// notice of each model from the stream, so a notice its live subscription
// missed (a reconnect, a slow consumer) is delivered anyway.
const durableCatchUp = 250 * time.Millisecond

// WatchDurable calls fn for the last notice of each of models and then for
// every new one until ctx ends. fn runs on one goroutine and must not
// block for long.
//
// Notices arrive on plain subscriptions to the models' live and stored
// subjects (NATS hands a published message to subscribers as it routes
// it, before any acknowledgement: the reply gate waits for no round trip
// of JetStream's), and the stream's last message per model is read at the
// start and every durableCatchUp after (a notice the subscriptions missed
// costs at most that delay and the persister's spacing). fn sees a notice
// only if it advances its model: a newer epoch, or a higher durable seq in
// the same epoch; older or repeated ones (a retried publish, a catch-up
// read) are dropped. A notice only ever reports a fact that stays true, so
// this loses nothing.
func (c *Coord) WatchDurable(ctx context.Context, models []string, fn func(*hamsv1.DurabilityNotice)) error {
	if len(models) == 0 {
		<-ctx.Done()
		return nil
	}
	st, err := c.js.Stream(ctx, streamName(c.deployment, "DURABLE"))
	if err != nil {
		return fmt.Errorf("coord: durability stream: %w", err)
	}
	ch := make(chan *nats.Msg, 4096)
	subjects := make([]string, len(models))
	for i, m := range models {
		subjects[i] = DurableSubject(c.deployment, m)
		// The live subject, and the stored one: a notice stored by the
		// persister (or published there by a sidecar of an earlier
		// release) reaches the watch as it is routed too.
		for _, subj := range []string{LiveSubject(c.deployment, m), subjects[i]} {
			sub, err := c.js.Conn().ChanSubscribe(subj, ch)
			if err != nil {
				return fmt.Errorf("coord: subscribe to %s: %w", subj, err)
			}
			defer sub.Unsubscribe()
		}
	}
	type mark struct{ epoch, seq uint64 }
	last := map[string]mark{}
	deliver := func(b []byte) error {
		n := &hamsv1.DurabilityNotice{}
		if err := proto.Unmarshal(b, n); err != nil {
			// Skipped: a notice nobody can read says nothing, and
			// ending the watch on it would stop the reply gate (the
			// catch-up read meets it again).
			c.badRecords.Add(1)
			return nil
		}
		l, ok := last[n.GetModel()]
		if ok && (n.GetEpoch() < l.epoch || n.GetEpoch() == l.epoch && n.GetDurableSeq() <= l.seq) {
			return nil
		}
		last[n.GetModel()] = mark{n.GetEpoch(), n.GetDurableSeq()}
		fn(n)
		return nil
	}
	catchUp := func() error {
		for _, subj := range subjects {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			m, err := st.GetLastMsgForSubject(rctx, subj)
			cancel()
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
				continue
			case err != nil:
				return err
			}
			if err := deliver(m.Data); err != nil {
				return err
			}
		}
		return nil
	}
	if err := catchUp(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("coord: read the last durability notices: %w", err)
	}
	t := time.NewTicker(durableCatchUp)
	defer t.Stop()
	for {
		select {
		case m := <-ch:
			if err := deliver(m.Data); err != nil {
				return err
			}
		case <-t.C:
			// A failed read is retried at the next tick (NATS may be
			// reconnecting; the subscription resumes by itself).
			_ = catchUp()
		case <-ctx.Done():
			return nil
		}
	}
}

// WatchCompleted calls fn for every completion notice the stream retains
// (its last 4096 notices) and every later one: a primary that subscribes
// late, or restarts, still learns which of its saved outputs may go; ids it
// does not hold are the caller's to ignore.
func (c *Coord) WatchCompleted(ctx context.Context, fn func(*hamsv1.CompletionNotice)) error {
	return c.watch(ctx, streamName(c.deployment, "COMPLETED"), jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}, func(b []byte) error {
		n := &hamsv1.CompletionNotice{}
		if err := proto.Unmarshal(b, n); err != nil {
			c.badRecords.Add(1) // skipped, as a durability notice is
			return nil
		}
		fn(n)
		return nil
	})
}

func (c *Coord) watch(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig, fn func([]byte) error) error {
	cons, err := c.js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("coord: consumer on %s: %w", stream, err)
	}
	errc := make(chan error, 1)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if err := fn(m.Data()); err != nil {
			select {
			case errc <- err:
			default:
			}
		}
	})
	if err != nil {
		return fmt.Errorf("coord: consume %s: %w", stream, err)
	}
	defer cc.Stop()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	case <-cc.Closed():
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("%w: %s", ErrClosed, stream)
	}
}
