package manager_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hams-go/hams/manager"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A component given both managers' addresses follows the active one; when
// it crashes, the component heartbeats every manager until the standby
// takes the lease over, so the new active manager never declares it dead
// (no failover of a live component) while a component that heartbeats
// nobody is declared dead.
func TestClientFollowsActiveManagerAcrossTakeover(t *testing.T) {
	url := startNATS(t)
	const ttl = 400 * time.Millisecond
	// 100 ms suspicion: a hunting client that reached the standby only
	// after its takeover would be declared dead.
	mod := func(id string) func(*manager.Config) {
		return func(c *manager.Config) {
			c.NATSURL, c.LeaseTTL, c.ID = url, ttl, id
			c.SuspicionTimeout = 100 * time.Millisecond
		}
	}
	r1 := startManager(t, mod("crash:m1"), nil)
	waitFor(t, "first manager active", 4*time.Second, func() bool { return metricValue(t, r1.reg, "hams_manager_active") == 1 })
	r2 := startManager(t, mod("m2"), nil)

	c, err := client.New(client.Config{ManagerAddrs: []string{r2.addr, r1.addr}, Registration: sidecarReg("sidecar/a", "a", "127.0.0.1:7001")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("client Run: %v", err)
		}
	})
	// A second component that talks only to the crashing manager.
	lone := startClient(t, r1.addr, sidecarReg("sidecar/b", "b", "127.0.0.1:7002"))
	wctx := waitCtx(t)
	if err := c.WaitReady(wctx, func(tp *hamsv1.Topology) bool {
		a, b := placement(tp, "sidecar/a"), placement(tp, "sidecar/b")
		return a != nil && a.GetAlive() && b != nil && b.GetAlive()
	}); err != nil {
		t.Fatal(err)
	}
	// Record every topology the client sees from now on.
	var (
		mu      sync.Mutex
		aDied   bool
		watchWG sync.WaitGroup
	)
	wctx2, stopWatch := context.WithCancel(context.Background())
	watchWG.Add(1)
	go func() {
		defer watchWG.Done()
		for {
			ch := c.Changed()
			if p := placement(c.Topology(), "sidecar/a"); p != nil && !p.GetAlive() {
				mu.Lock()
				aDied = true
				mu.Unlock()
			}
			select {
			case <-ch:
			case <-wctx2.Done():
				return
			}
		}
	}()
	defer func() { stopWatch(); watchWG.Wait() }()

	lone.stop()
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "standby to take over", 10*ttl, func() bool { return metricValue(t, r2.reg, "hams_manager_active") == 1 })
	if err := c.WaitReady(wctx, func(tp *hamsv1.Topology) bool {
		b := placement(tp, "sidecar/b")
		return b != nil && !b.GetAlive()
	}); err != nil {
		t.Fatalf("the component nobody heartbeats was not declared dead: %v (topology %v)", err, c.Topology())
	}
	// Several suspicion timeouts after the takeover (15 heartbeats at 20 ms
	// received by the new active manager), sidecar/a is still alive.
	hb2 := metricValue(t, r2.reg, "hams_manager_heartbeats_received_total")
	waitFor(t, "heartbeats at the new active manager", 5*time.Second, func() bool {
		return metricValue(t, r2.reg, "hams_manager_heartbeats_received_total") > hb2+15
	})
	mu.Lock()
	died := aDied
	mu.Unlock()
	if died {
		t.Fatal("the new active manager declared a live, following component dead")
	}
	if p := placement(c.Topology(), "sidecar/a"); p == nil || !p.GetAlive() {
		t.Fatalf("sidecar/a after takeover: %v", p)
	}
}
