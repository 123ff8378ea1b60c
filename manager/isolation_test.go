package manager_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/hams-go/hams/manager"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// A manager that hears from no live component at once is the one cut off:
// it declares nobody dead until it has held its lease for one ttl of the
// silence (a partitioned active manager declared every component dead and
// retired them all on healing). One silent component among heard ones
// is declared dead as before.
func TestIsolatedManagerDeclaresNobodyDead(t *testing.T) {
	const ttl = 3 * time.Second
	r := startManager(t, func(c *manager.Config) { c.LeaseTTL = ttl }, nil)
	ctx := waitCtx(t)
	var clients []*runningClient
	var ids []string
	for i := range 4 {
		reg := sidecarReg(fmt.Sprintf("sidecar/a/standby/%d", i), "a", fmt.Sprintf("127.0.0.1:%d", 7100+i))
		reg.Role = hamsv1.Role_ROLE_STANDBY
		c := startClient(t, r.addr, reg)
		if err := c.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, reg.Id).GetAlive() }); err != nil {
			t.Fatal(err)
		}
		clients, ids = append(clients, c), append(ids, reg.Id)
	}
	alive := func(id string) bool { return placement(r.m.Topology(), id).GetAlive() }

	// One silent among heard ones: dead after the suspicion timeout.
	clients[0].stop()
	waitFor(t, "the one silent component declared dead", 3*time.Second, func() bool { return !alive(ids[0]) })

	// Every live one silent at once: nobody dead for most of a ttl...
	start := time.Now()
	for _, c := range clients[1:] {
		c.stop()
	}
	for time.Since(start) < ttl/2 {
		for _, id := range ids[1:] {
			if !alive(id) {
				t.Fatalf("%s declared dead %v after every component went silent at once (hold: one lease ttl, %v)", id, time.Since(start), ttl)
			}
		}
		time.Sleep(20 * time.Millisecond) // polling the topology over the hold
	}
	if metricValue(t, r.reg, "hams_manager_isolated_ticks_total") == 0 {
		t.Fatal("no isolated tick counted")
	}
	// ...then, the manager still leading, the silence is real.
	waitFor(t, "the silent components declared dead after the hold", 3*ttl, func() bool {
		return !alive(ids[1]) && !alive(ids[2]) && !alive(ids[3])
	})
}

// When the manager's own partition heals, the first component heard
// again ends the hold; the others, heard a moment later, must not be
// declared dead in between (they were, in the same tick: a soak's 1 s
// partition of the active manager cost ap-motion its primary and backup).
func TestIsolationEndGivesEveryoneATimeout(t *testing.T) {
	const ttl = 3 * time.Second
	r := startManager(t, func(c *manager.Config) { c.LeaseTTL = ttl }, nil)
	ctx := waitCtx(t)
	var regs []*hamsv1.RegisterRequest
	var clients []*runningClient
	for i := range 3 {
		reg := sidecarReg(fmt.Sprintf("sidecar/a/standby/%d", i), "a", fmt.Sprintf("127.0.0.1:%d", 7200+i))
		reg.Role = hamsv1.Role_ROLE_STANDBY
		c := startClient(t, r.addr, reg)
		if err := c.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, reg.Id).GetAlive() }); err != nil {
			t.Fatal(err)
		}
		regs, clients = append(regs, reg), append(clients, c)
	}
	alive := func(id string) bool { return placement(r.m.Topology(), id).GetAlive() }
	for _, c := range clients {
		c.stop()
	}
	// Isolated (every one silent at once) for longer than a suspicion
	// timeout (500 ms here).
	waitFor(t, "the isolation hold", 3*time.Second, func() bool { return metricValue(t, r.reg, "hams_manager_isolated_ticks_total") > 0 })
	time.Sleep(700 * time.Millisecond) // the partition lasts past a suspicion timeout
	// The first one is heard again; the others 300 ms later. The window
	// counts from before the first is heard (the hold ends no earlier),
	// so a death inside it is always early, however slowly the
	// registration goes on a loaded machine (counted from its end, a
	// slow registration made the window reach past the timeout it gives).
	heard := time.Now()
	first := startClient(t, r.addr, regs[0])
	if err := first.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return true }); err != nil {
		t.Fatal(err)
	}
	deadline := heard.Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		for _, reg := range regs[1:] {
			if !alive(reg.Id) {
				t.Fatalf("%s declared dead within 300 ms of the first component heard again (its heartbeats had no time to arrive after the partition healed)", reg.Id)
			}
		}
		time.Sleep(10 * time.Millisecond) // polling the topology over the window
	}
	for _, reg := range regs[1:] {
		startClient(t, r.addr, reg)
	}
	for _, reg := range regs {
		if !alive(reg.Id) {
			t.Fatalf("%s dead after every component was heard again", reg.Id)
		}
	}
}
