package manager_test

import (
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/manager"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// startNATS runs a standalone JetStream server for the test.
func startNATS(t *testing.T) string {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv.ClientURL()
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rewriteTopology writes the deployment state as edit changes it (a
// compare-and-set on the topology key), as a manager would.
func rewriteTopology(t *testing.T, url string, edit func(*hamsv1.Topology)) {
	t.Helper()
	ctx := waitCtx(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, manager.BucketName(testDeployment(t).Name))
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, manager.TopologyKey)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := manager.DecodeTopology(e)
	if err != nil {
		t.Fatal(err)
	}
	edit(tp)
	tp.Revision = 0
	b, err := proto.Marshal(tp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, manager.TopologyKey, b, e.Revision()); err != nil {
		t.Fatal(err)
	}
}

// Two managers on one NATS: the active one crashes (Run cancelled without
// releasing the lease); the standby takes over within the lease time and
// serves Register, Heartbeat and the topology, writing what it learned as
// a standby.
func TestActiveManagerFailover(t *testing.T) {
	url := startNATS(t)
	const ttl = 400 * time.Millisecond
	r1 := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL, c.ID = url, ttl, "crash:m1" }, nil)
	r2 := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL, c.ID = url, ttl, "m2" }, nil)
	ctx := waitCtx(t)
	c1 := startClient(t, r1.addr, sidecarReg("sidecar/a", "a", "127.0.0.1:7001"))
	if err := c1.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, "sidecar/a") != nil }); err != nil {
		t.Fatal(err)
	}
	// A component of the standby: kept alive there, not written yet.
	c2 := startClient(t, r2.addr, frontendReg("frontend/0", "127.0.0.1:7000"))
	if metricValue(t, r2.reg, "hams_manager_active") != 0 {
		t.Fatal("second manager active while the first holds the lease")
	}
	if len(r1.m.Topology().GetFrontends()) != 0 {
		t.Fatal("standby wrote its registration")
	}

	// Crash the active manager.
	c1.stop()
	t0 := time.Now()
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "standby to become active", 3*ttl, func() bool { return metricValue(t, r2.reg, "hams_manager_active") == 1 })
	if el := time.Since(t0); el > 2*ttl+200*time.Millisecond {
		t.Fatalf("takeover took %v with a %v lease", el, ttl)
	}
	// The new active manager writes what it learned while standby and keeps
	// serving: its client sees itself; sidecar/a (heartbeating nowhere) dies.
	if err := c2.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/a")
		return len(tp.GetFrontends()) == 1 && p != nil && !p.GetAlive()
	}); err != nil {
		t.Fatalf("new active manager: %v (topology %v)", err, c2.c.Topology())
	}
	c3 := startClient(t, r2.addr, sidecarReg("sidecar/a2", "a", "127.0.0.1:7002"))
	if err := c3.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/a2")
		return p != nil && p.GetAlive()
	}); err != nil {
		t.Fatal(err)
	}
	hb := metricValue(t, r2.reg, "hams_manager_heartbeats_received_total")
	waitFor(t, "heartbeats at the new active manager", 5*time.Second, func() bool {
		return metricValue(t, r2.reg, "hams_manager_heartbeats_received_total") > hb+3
	})
}

// A manager stopped cleanly releases the lease: a successor becomes active
// at once.
func TestLeaseReleasedOnStop(t *testing.T) {
	url := startNATS(t)
	r1 := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL = url, 5*time.Second }, nil)
	// The first manager must hold the lease before the second starts, or
	// the test would stop a standby and wait for a lease that never moves.
	waitFor(t, "first manager active", 4*time.Second, func() bool { return metricValue(t, r1.reg, "hams_manager_active") == 1 })
	r2 := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL = url, 5*time.Second }, nil)
	if metricValue(t, r2.reg, "hams_manager_active") == 1 {
		t.Fatal("second manager active while the first holds the lease")
	}
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "successor active", 4*time.Second, func() bool { return metricValue(t, r2.reg, "hams_manager_active") == 1 })
}

// A spare that recovery made its model's backup keeps that role across a
// manager takeover although it re-registers with the role it started
// with (standby) and its model's epoch did not change: the persisted
// topology is recovery's decision. (Before, the spare fell back to
// standby at the new manager and the primary's replies were never
// durable again: a backup kill followed by a manager kill stalled the
// deployment for good.)
func TestTakeoverKeepsSpareMadeBackup(t *testing.T) {
	url := startNATS(t)
	const ttl = 400 * time.Millisecond
	r1 := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL, c.ID = url, ttl, "crash:m1" }, nil)
	r2 := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL, c.ID = url, ttl, "m2" }, nil)
	ctx := waitCtx(t)
	spare := sidecarReg("sidecar/a/standby", "a", "127.0.0.1:7003")
	spare.Role = hamsv1.Role_ROLE_STANDBY
	// Components register with every manager (the standby learns them
	// before any takeover).
	c := startClient(t, r1.addr, spare)
	if err := c.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, "sidecar/a/standby") != nil }); err != nil {
		t.Fatal(err)
	}
	c2 := startClient(t, r2.addr, spare)
	if err := c2.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, "sidecar/a/standby") != nil }); err != nil {
		t.Fatal(err)
	}
	// What recovery's spare promotion writes: the spare is the backup,
	// at the model's unchanged epoch 1.
	rewriteTopology(t, url, func(tp *hamsv1.Topology) {
		p := placement(tp, "sidecar/a/standby")
		p.Role, p.Epoch = hamsv1.Role_ROLE_BACKUP, 1
	})
	waitFor(t, "the standby manager to see the backup", 5*time.Second, func() bool {
		p := placement(r2.m.Topology(), "sidecar/a/standby")
		return p != nil && p.GetRole() == hamsv1.Role_ROLE_BACKUP
	})

	// The active manager crashes; the spare re-registers at the new one
	// with its initial role.
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	c.stop()
	waitFor(t, "standby to become active", 3*ttl, func() bool { return metricValue(t, r2.reg, "hams_manager_active") == 1 })
	// Another registration makes the new active manager write the
	// topology from its registrations.
	fe := startClient(t, r2.addr, frontendReg("frontend/0", "127.0.0.1:7000"))
	if err := fe.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return len(tp.GetFrontends()) == 1 }); err != nil {
		t.Fatal(err)
	}
	if got := placement(r2.m.Topology(), "sidecar/a/standby").GetRole(); got != hamsv1.Role_ROLE_BACKUP {
		t.Fatalf("after the takeover the spare made backup is %v (topology %v)", got, r2.m.Topology())
	}
}

// A NATS server restart (same port, same store) may leave a standby
// manager's watch of the topology silent for good; the standby still
// follows the deployment state (it reads the key besides its watch), so
// a later takeover starts from the newest topology, not from what it saw
// before the restart.
func TestStandbyFollowsStateAcrossNATSRestart(t *testing.T) {
	dir := t.TempDir()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	url := srv.ClientURL()
	port := srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	// A lease long enough that the restart does not move it: the
	// standby must stay the standby.
	const ttl = 10 * time.Second
	r1 := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL, c.ID = url, ttl, "crash:m1" }, nil)
	r2 := startManager(t, func(c *manager.Config) { c.NATSURL, c.LeaseTTL, c.ID = url, ttl, "m2" }, nil)
	ctx := waitCtx(t)
	c1 := startClient(t, r1.addr, sidecarReg("sidecar/a", "a", "127.0.0.1:7001"))
	if err := c1.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, "sidecar/a") != nil }); err != nil {
		t.Fatal(err)
	}

	// NATS restarts in place.
	srv.Shutdown()
	srv.WaitForShutdown()
	opts2 := *opts
	opts2.Port = port
	srv, err = server.NewServer(&opts2)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready after restart")
	}

	// The active manager writes a change after the restart.
	c3 := startClient(t, r1.addr, sidecarReg("sidecar/b", "a", "127.0.0.1:7002"))
	if err := c3.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, "sidecar/b") != nil }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the standby to see the change made after the NATS restart", 10*time.Second, func() bool {
		return placement(r2.m.Topology(), "sidecar/b") != nil
	})
}
