package coord

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Names of a deployment's coordination streams and buckets, for the NATS
// permission table (internal/natsd), which grants each role exactly the
// streams it uses.

// DurableStream is the stream of the durability notices of dep.
func DurableStream(dep string) string { return streamName(dep, "DURABLE") }

// CompletedStream is the stream of the completion notices of dep.
func CompletedStream(dep string) string { return streamName(dep, "COMPLETED") }

// RequestsStream is the request log of dep.
func RequestsStream(dep string) string { return streamName(dep, "REQUESTS") }

// RepliesStream is the reply records of dep.
func RepliesStream(dep string) string { return streamName(dep, "REPLIES") }

// FrontendsBucket is the KV bucket of frontend incarnations of dep (its
// stream is "KV_" + the bucket, its subjects "$KV.<bucket>.>").
func FrontendsBucket(dep string) string { return streamName(dep, "FRONTENDS") }

// ReplayStream is the input log of mode replay of dep.
func ReplayStream(dep string) string { return streamName(dep, "REPLAY") }

// CheckpointBucket is the object store of mode replay's checkpoints of
// dep (its stream is "OBJ_" + the bucket, its subjects "$O.<bucket>.>").
func CheckpointBucket(dep string) string { return streamName(dep, "CKPT") }

// Bind is Open for a component whose NATS user may not create or change
// streams (internal/natsd's permissions: only the manager does): it looks
// up the deployment's streams and frontends bucket, which must exist
// already (the manager creates them with Open), and changes nothing. A
// missing stream is an error wrapping jetstream.ErrStreamNotFound (or
// jetstream.ErrBucketNotFound); the caller retries.
func Bind(ctx context.Context, nc *nats.Conn, deployment string) (*Coord, error) {
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(OpTimeout))
	if err != nil {
		return nil, fmt.Errorf("coord: jetstream context: %w", err)
	}
	for _, name := range []string{DurableStream(deployment), CompletedStream(deployment), RequestsStream(deployment), RepliesStream(deployment)} {
		if _, err := js.Stream(ctx, name); err != nil {
			return nil, fmt.Errorf("coord: look up stream %s: %w", name, err)
		}
	}
	kv, err := js.KeyValue(ctx, FrontendsBucket(deployment))
	if err != nil {
		return nil, fmt.Errorf("coord: look up frontends bucket: %w", err)
	}
	return &Coord{js: js, deployment: deployment, incarnation: time.Now().UnixNano(), frontends: kv}, nil
}

// BindReplay is OpenReplay for a reader whose NATS user may not create or
// change streams (an operator tool): the input log stream and checkpoint
// bucket must exist.
func (c *Coord) BindReplay(ctx context.Context) (*Replay, error) {
	st, err := c.js.Stream(ctx, ReplayStream(c.deployment))
	if err != nil {
		return nil, fmt.Errorf("coord: look up stream %s: %w", ReplayStream(c.deployment), err)
	}
	obs, err := c.js.ObjectStore(ctx, CheckpointBucket(c.deployment))
	if err != nil {
		return nil, fmt.Errorf("coord: look up object store %s: %w", CheckpointBucket(c.deployment), err)
	}
	return &Replay{c: c, st: st, obs: obs}, nil
}
