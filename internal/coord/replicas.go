package coord

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// MaxReplicas is JetStream's limit on a stream's replicas.
const MaxReplicas = 5

// replicasFor is the replica count to create or update stream name with:
// want (at least 1, at most MaxReplicas), or the stream's own count when
// that is higher. Every component that may create the streams opens them
// (coord.Open), and one started without the deployment's replica count
// (an operator tool, a component whose flags default to 1) must not
// shrink a cluster's R3 streams to R1 by updating them; raising the count
// is an update like any other. A failed look-up (no such stream yet, or
// an error the create or update that follows reports) leaves want.
func replicasFor(ctx context.Context, js jetstream.JetStream, name string, want int) int {
	want = max(1, min(want, MaxReplicas))
	st, err := js.Stream(ctx, name)
	if err != nil {
		return want
	}
	if have := st.CachedInfo().Config.Replicas; have > want {
		return have
	}
	return want
}
