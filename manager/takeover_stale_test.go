package manager_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/manager"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// leaseKV is the deployment's KV bucket, where the manager lease lives.
func leaseKV(t *testing.T, url string) jetstream.KeyValue {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(waitCtx(t), manager.BucketName(testDeployment(t).Name))
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// A manager that takes over again takes the persisted roles, not what it
// decided itself in its earlier term as the active manager: another
// manager was active in between and wrote newer decisions at the same
// epoch. In a 30-minute soak (2026-11-27) a manager had made a spare its
// model's backup; the manager active after it retired that backup (a
// false suspicion) and admitted it again as a standby; when the first
// one took over again, its own BACKUP decision won, the model had two
// live backups, and the next failover promoted the stale one, which
// refused (it had no base) and left the model unrecoverable.
func TestTakeoverTakesPersistedRolesOverOwnEarlierDecisions(t *testing.T) {
	url := startNATS(t)
	const ttl = 400 * time.Millisecond
	r := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL, c.ID = url, ttl, "m1" }, nil)
	ctx := waitCtx(t)
	kv := leaseKV(t, url)
	spare := sidecarReg("sidecar/a/standby", "a", "127.0.0.1:7003")
	spare.Role = hamsv1.Role_ROLE_STANDBY
	c := startClient(t, r.addr, spare)
	if err := c.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, spare.Id) != nil }); err != nil {
		t.Fatal(err)
	}
	// term ends this manager's term (another holder takes the lease),
	// lets edit write the deployment state as that holder would, and
	// ends that term (the lease released): this manager takes over.
	term := func(edit func(*hamsv1.Topology)) {
		t.Helper()
		if _, err := kv.Put(ctx, manager.LeaseKey, []byte("other-manager")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the manager to lose its lease", 5*time.Second, func() bool { return metricValue(t, r.reg, "hams_manager_active") == 0 })
		rewriteTopology(t, url, edit)
		if err := kv.Delete(ctx, manager.LeaseKey); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the manager to take over again", 5*time.Second, func() bool { return metricValue(t, r.reg, "hams_manager_active") == 1 })
	}
	// The other manager made the spare the backup; this one takes that
	// over (its own decision from now on).
	term(func(tp *hamsv1.Topology) {
		p := placement(tp, spare.Id)
		p.Role, p.Epoch = hamsv1.Role_ROLE_BACKUP, 1
	})
	// Then another term: the backup retired and admitted again as a
	// standby, at the same epoch.
	term(func(tp *hamsv1.Topology) {
		p := placement(tp, spare.Id)
		p.Role, p.Epoch = hamsv1.Role_ROLE_STANDBY, 1
	})
	// A registration makes the manager write the state from what it
	// holds.
	other := startClient(t, r.addr, sidecarReg("sidecar/b", "b", "127.0.0.1:7004"))
	if err := other.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, "sidecar/b") != nil }); err != nil {
		t.Fatal(err)
	}
	if got := placement(r.m.Topology(), spare.Id).GetRole(); got != hamsv1.Role_ROLE_STANDBY {
		t.Fatalf("after the takeover the spare is %v, want the persisted standby (topology %v)", got, r.m.Topology())
	}
}

// A falsely suspected primary that a manager knows only from the persisted
// placements (it took over; the primary never registered with it) is
// retired with the incarnation its heartbeats name, so the same
// process's registration is refused for good. Before, the retire recorded
// no incarnation, and the retired process's registration passed for a
// new process under the id: it was admitted as a fresh standby (a
// 30-minute soak, 2026-11-27; with the stale role of the test above it
// was then promoted).
func TestRetiredAfterTakeoverStaysRetired(t *testing.T) {
	url := startNATS(t)
	const ttl = 400 * time.Millisecond
	fe, fa, fbp, fbb := chainFakes(t)
	st := &fakeStarter{}
	mod := func(id string) func(*manager.Config) {
		return func(c *manager.Config) {
			c.NATSURL, c.LeaseTTL, c.ID, c.Starter, c.SuspicionTimeout = url, ttl, id, st, 300*time.Millisecond
		}
	}
	r1 := startManager(t, mod("crash:m1"), nil)
	r2 := startManager(t, mod("m2"), nil)
	ctx := waitCtx(t)
	ra := sidecarReg("sidecar/a", "a", fa.addr)
	ra.Role = hamsv1.Role_ROLE_ACTIVE
	rb := sidecarReg("sidecar/b-b", "b", fbb.addr)
	rb.Role = hamsv1.Role_ROLE_BACKUP
	var bb *runningClient
	for _, reg := range []*hamsv1.RegisterRequest{frontendReg("frontend/0", fe.addr), ra, rb} {
		for _, r := range []*running{r1, r2} {
			c := startClient(t, r.addr, reg)
			if err := c.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return len(tp.GetPlacements()) > 0 || len(tp.GetFrontends()) > 0 }); err != nil {
				t.Fatal(err)
			}
			if reg == rb && r == r2 {
				bb = c
			}
		}
	}
	// The primary registers with the first manager only.
	rp := sidecarReg("sidecar/b-p", "b", fbp.addr)
	rp.Role = hamsv1.Role_ROLE_PRIMARY
	rp.Incarnation = "b-p-1"
	bp1 := freezable(t, r1.addr, rp)
	waitFor(t, "the primary in the deployment state", 5*time.Second, func() bool {
		p := placement(r2.m.Topology(), rp.Id)
		return p != nil && p.GetAlive()
	})
	bp1.paused.Store(true)
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second manager to take over", 5*time.Second, func() bool { return metricValue(t, r2.reg, "hams_manager_active") == 1 })
	// The primary follows the new active manager: heartbeats, no
	// registration (it knows the id from the placements).
	bp := heartbeating(t, r2.addr, rp, false)
	waitFor(t, "a heartbeat of the primary at the new manager", 5*time.Second, func() bool {
		return bp.beats.Load() > 0
	})
	bp.paused.Store(true)
	if err := bb.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, rb.Id)
		return p.GetRole() == hamsv1.Role_ROLE_PRIMARY && p.GetEpoch() == 2
	}); err != nil {
		t.Fatalf("b not failed over: %v (topology %v)", err, bb.c.Topology())
	}
	bp.paused.Store(false) // SIGCONT
	select {
	case err := <-bp.errs:
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "retired") {
			t.Fatalf("heartbeat of the resumed primary = %v, want NotFound (retired)", err)
		}
	case <-ctx.Done():
		t.Fatal("the resumed primary's heartbeats were never refused")
	}
	if _, err := bp.api.Register(ctx, rp); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "never reused") {
		t.Fatalf("registration of the retired primary's own process = %v, want NotFound (retired); topology %v", err, r2.m.Topology())
	}
	if p := placement(r2.m.Topology(), rp.Id); p.GetAlive() {
		t.Fatalf("the retired primary is alive again: %v", p)
	}
}
