package manager_test

import (
	"slices"
	"testing"
	"time"

	"github.com/hams-go/hams/manager"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// The active manager wrote a standby dead and was killed before its
// recovery round started the replacement. The manager that takes over
// must finish it: the standby is suspected again and a new one started.
// Recovery is edge-triggered, and the new manager, which takes the dead
// placement as written, saw no death of its own: the model stayed without
// a standby for good (a 10-minute soak, 2026-11-26).
func TestTakeoverFinishesUnfinishedRecovery(t *testing.T) {
	url := startNATS(t)
	const ttl = 400 * time.Millisecond
	starter := &fakeStarter{}
	r1 := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL, c.ID = url, ttl, "crash:m1" }, nil)
	r2 := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL, c.ID, c.Starter = url, ttl, "m2", starter }, nil)
	ctx := waitCtx(t)
	active := sidecarReg("sidecar/a/active", "a", "127.0.0.1:7001")
	active.Role = hamsv1.Role_ROLE_ACTIVE
	standby := sidecarReg("sidecar/a/standby", "a", "127.0.0.1:7002")
	standby.Role = hamsv1.Role_ROLE_STANDBY
	var clients []*runningClient
	for _, reg := range []*hamsv1.RegisterRequest{active, standby} {
		for _, r := range []*running{r1, r2} {
			c := startClient(t, r.addr, reg)
			if err := c.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, reg.Id) != nil }); err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
		}
	}
	// The standby dies; the active manager writes it dead and is killed
	// before its round ends (here: before it acts at all).
	clients[2].stop()
	clients[3].stop()
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	rewriteTopology(t, url, func(tp *hamsv1.Topology) {
		p := placement(tp, standby.Id)
		if p == nil || p.GetRole() != hamsv1.Role_ROLE_STANDBY {
			t.Fatalf("the standby's placement before the takeover: %v", p)
		}
		p.Alive = false
	})
	waitFor(t, "the standby manager to become active", 5*time.Second, func() bool { return metricValue(t, r2.reg, "hams_manager_active") == 1 })
	waitFor(t, "a new standby of a", 5*time.Second, func() bool {
		return slices.Contains(starter.list(), "a/"+hamsv1.Role_ROLE_STANDBY.String())
	})
}
