package sidecar

import (
	"context"
	"testing"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A stateless standby made before its active instance started a newer
// sender incarnation (the active resent to a new leading frontend, which
// asks every sink when it takes over) is still heard after its promotion:
// the promotion starts new sender incarnations, or the frontend's receiver
// would refuse the standby as stale for good (blocker 4).
func TestStatelessPromotionStartsNewSenderIncarnations(t *testing.T) {
	r := newRig(t, statelessSink)
	c1 := r.start("c", &fakeBackend{bias: 1}, config.RolePrimary, 1, true, nil)
	c2 := r.start("c", &fakeBackend{bias: 1}, config.RolePrimary, 1, false, nil) // hot standby, made first
	// Requests that reached the sink (a resend may deliver one twice).
	distinct := func() int {
		r.sink.mu.Lock()
		defer r.sink.mu.Unlock()
		return len(r.sink.items)
	}
	r.send(1, 4)
	waitFor(t, "replies through the active", func() bool { return distinct() == 4 })
	// A new leading frontend (the same receiver here) asks the active sink
	// to resend: its sender starts a newer incarnation than the standby's.
	ctx := context.Background()
	if _, err := r.client(c1.addr).Resend(ctx, &hamsv1.ResendRequest{ToModel: config.Frontend, AfterEdgeSeq: ^uint64(0), Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	r.send(5, 6)
	waitFor(t, "replies on the active's new incarnation", func() bool { return distinct() == 6 })
	c1.kill()
	if _, err := r.client(c2.addr).Promote(ctx, &hamsv1.PromoteRequest{Model: "c", Epoch: 2, StartSeq: 6}); err != nil {
		t.Fatal(err)
	}
	r.res.Set("c", c2.addr, 2)
	r.send(7, 10)
	waitFor(t, "replies through the promoted standby", func() bool { return distinct() == 10 })
}
