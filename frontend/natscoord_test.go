package frontend

import (
	"context"
	"fmt"
	"github.com/hams-go/hams/internal/testing/natstest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hams-go/hams/internal/coord"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// embeddedNATS starts a JetStream-enabled nats-server on loopback.
func embeddedNATS(t *testing.T) *nats.Conn { return natstest.Connect(t) }

// TestGatingWithJetStreamCoord runs the gate against the real coordination
// engine: a notice announced before the frontend started is seen (last per
// model), a later one releases a held reply, and the completion notice
// reaches a watcher.
func TestGatingWithJetStreamCoord(t *testing.T) {
	nc := embeddedNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	co, err := coord.Open(ctx, nc, "gt", 1)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu        sync.Mutex
		completed = map[uint64]int{}
		from      = map[string]bool{}
	)
	wctx, wcancel := context.WithCancel(ctx)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- co.WatchCompleted(wctx, func(n *hamsv1.CompletionNotice) {
			mu.Lock()
			defer mu.Unlock()
			from[n.Frontend] = true
			for _, id := range n.ReqIds {
				completed[id]++
			}
		})
	}()
	defer func() {
		wcancel()
		if err := <-watchDone; err != nil {
			t.Errorf("WatchCompleted: %v", err)
		}
	}()
	// The watcher sees only notices published after it subscribed: probe
	// until it sees one (fresh ids, as the stream dedups by batch).
	probe := uint64(1 << 40)
	eventually(t, "completion watcher ready", func() bool {
		probe++
		if err := co.Complete(ctx, &hamsv1.CompletionNotice{Frontend: "probe", ReqIds: []uint64{probe}}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return from["probe"]
	})
	// t1 is durable far ahead before the frontend exists.
	if err := co.Announce(ctx, &hamsv1.DurabilityNotice{Model: "t1", Epoch: 1, DurableSeq: 50}); err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, envOpts{
		yaml:   fmt.Sprintf(gateYAML, "nspb", "5s"),
		config: func(c *Config) { c.Coord = co; c.Name = "fe-js" },
	})
	c := e.predictAsync(ctxT(t, 10*time.Second), &hamsv1.PredictRequest{Service: "two", Inputs: vec(1)})
	eventually(t, "reply held", func() bool { return e.held() == 1 })
	eventually(t, "t1's earlier notice applied", func() bool {
		e.fe.mu.Lock()
		defer e.fe.mu.Unlock()
		return e.fe.holds.gate.DurableSeq("t1") == 50
	})
	notDone(t, "a reply waiting for t2", c)
	if err := co.Announce(ctx, &hamsv1.DurabilityNotice{Model: "t2", Epoch: 1, DurableSeq: 1}); err != nil {
		t.Fatal(err)
	}
	r := await(t, "release", c)
	if r.err != nil || lineageSeq(r.resp, "t2") != 1 {
		t.Fatalf("reply %v %v", r.resp, r.err)
	}
	eventually(t, "completion notice", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return completed[r.resp.ReqId] == 1 && from["fe-js"]
	})
}
