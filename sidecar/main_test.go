package sidecar

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when goroutines outlive them: every
// goroutine a Sidecar starts (stages, executors, the shipper, watches)
// must end when Run returns, and every test must stop what it started.
//
// One goroutine is nats.go's, not ours: jetstream's ObjectStore.Put
// (the replay checkpoints) publishes through a JetStream context of its
// own and cleans it up on return (object.go: defer cleanupReplySub); the
// reconnect watcher that the first async publish started
// (resetPendingAcksOnReconnect) reads the status channel only when it
// runs, and when the cleanup set it to nil first, it waits on a nil
// channel for good (nats.go v1.55.0, publish.go newAsyncReply). It holds
// no connection and no state of ours.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
}
