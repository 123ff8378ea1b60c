package manager_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/manager"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// restartSuspicion is far longer than any of these tests wait for a
// recovery: what they show happens on the re-registration, not on a
// missed heartbeat.
const restartSuspicion = 20 * time.Second

func (f *fakeRepl) count(call string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == call {
			n++
		}
	}
	return n
}

func managerAPI(t *testing.T, addr string) hamsv1.ManagerClient {
	t.Helper()
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return hamsv1.NewManagerClient(cc)
}

// statefulB registers a frontend, a's active, and b's primary, backup and
// (when spare) a spare, each by a running client, and returns the
// registrations by id.
func statefulB(t *testing.T, r *running, spare bool) (map[string]*hamsv1.RegisterRequest, map[string]*fakeRepl, map[string]*runningClient) {
	t.Helper()
	regs := map[string]*hamsv1.RegisterRequest{}
	fakes := map[string]*fakeRepl{}
	clients := map[string]*runningClient{}
	fe := startFake(t, &fakeRepl{})
	startClient(t, r.addr, frontendReg("frontend/0", fe.addr))
	add := func(id, model string, role hamsv1.Role, f *fakeRepl) {
		f = startFake(t, f)
		rq := sidecarReg(id, model, f.addr)
		rq.Role = role
		rq.Incarnation = id + "#1"
		regs[id], fakes[id] = rq, f
		clients[id] = startClient(t, r.addr, rq)
	}
	add("sidecar/a", "a", hamsv1.Role_ROLE_ACTIVE, &fakeRepl{})
	add("sidecar/b-p", "b", hamsv1.Role_ROLE_PRIMARY, &fakeRepl{})
	add("sidecar/b-b", "b", hamsv1.Role_ROLE_BACKUP, &fakeRepl{maxSeq: 7, summary: &hamsv1.LineageSummary{Model: "b", MaxOutSeq: 7,
		MaxInByPred: map[string]uint64{"a": 7, "frontend": 7}}})
	if spare {
		add("sidecar/b-s", "b", hamsv1.Role_ROLE_STANDBY, &fakeRepl{})
	}
	waitFor(t, "every instance alive in the topology", 10*time.Second, func() bool {
		for id := range regs {
			if p := placement(r.m.Topology(), id); p == nil || !p.GetAlive() {
				return false
			}
		}
		return true
	})
	return regs, fakes, clients
}

// restart is a new process under reg's id: a new incarnation at a new
// address, registered by a running client (it heartbeats).
func restart(t *testing.T, r *running, reg *hamsv1.RegisterRequest, inc string) (*hamsv1.RegisterRequest, *fakeRepl, *runningClient) {
	t.Helper()
	f := startFake(t, &fakeRepl{})
	rq := proto.Clone(reg).(*hamsv1.RegisterRequest)
	rq.Address, rq.Incarnation, rq.Pid = f.addr, inc, reg.GetPid()+1
	return rq, f, startClient(t, r.addr, rq)
}

// Issue 20: b's primary sidecar is restarted in its pod (SIGKILL and a
// restart policy) and registers again under its id, long before the
// suspicion timeout: its old incarnation is declared dead and failed over
// at once (the backup promoted at epoch 2, the spare made the backup and
// synced), and the new process is admitted as a fresh standby, never as
// the primary. The old incarnation is refused for good.
func TestRestartedPrimaryIsFailedOver(t *testing.T) {
	st := &fakeStarter{}
	r := startManager(t, func(c *manager.Config) { c.Starter = st; c.SuspicionTimeout = restartSuspicion }, nil)
	regs, fakes, clients := statefulB(t, r, true)
	clients["sidecar/b-p"].stop() // SIGKILL: no more heartbeats (the timeout is far away)

	t0 := time.Now()
	_, fnew, _ := restart(t, r, regs["sidecar/b-p"], "sidecar/b-p#2")
	waitFor(t, "b failed over to its backup, the spare made backup, the restarted primary a standby", 10*time.Second, func() bool {
		tp := r.m.Topology()
		p, b, s := placement(tp, "sidecar/b-p"), placement(tp, "sidecar/b-b"), placement(tp, "sidecar/b-s")
		return b.GetRole() == hamsv1.Role_ROLE_PRIMARY && b.GetEpoch() == 2 && b.GetAlive() &&
			s.GetRole() == hamsv1.Role_ROLE_BACKUP && s.GetAlive() &&
			p.GetRole() == hamsv1.Role_ROLE_STANDBY && p.GetAlive() && p.GetSidecarAddress() == fnew.addr
	})
	el := time.Since(t0)
	t.Logf("failover and re-admission %v after the re-registration (suspicion timeout %v)", el, restartSuspicion)
	if el >= restartSuspicion/2 {
		t.Fatalf("recovered after %v: the suspicion timeout, not the re-registration, drove it", el)
	}
	if n := fakes["sidecar/b-b"].count("Promote"); n != 1 {
		t.Fatalf("backup promoted %d times, want 1", n)
	}
	waitFor(t, "the spare synced", 5*time.Second, func() bool { return fakes["sidecar/b-s"].count("Demote") == 1 })
	if n := fnew.count("Promote") + fnew.count("Demote"); n != 0 {
		t.Fatalf("the restarted process was sent %d recovery orders, want none", n)
	}
	if addr, ep, ok := client.Resolve(r.m.Topology(), "b"); !ok || addr != fakes["sidecar/b-b"].addr || ep != 2 {
		t.Fatalf("Resolve(b) = %s, %d, %v", addr, ep, ok)
	}
	if v := metricValue(t, r.reg, "hams_manager_restarted_components_total"); v != 1 {
		t.Fatalf("restarted components = %v, want 1", v)
	}
	if _, ok := r.m.Retired()["sidecar/b-p"]; ok {
		t.Fatal("the restarted primary's id is retired: its new process could not serve")
	}

	// The old incarnation (a process that was only stopped) is refused:
	// heartbeats and registrations, NotFound.
	api := managerAPI(t, r.addr)
	ctx := waitCtx(t)
	_, err := api.Heartbeat(ctx, &hamsv1.HeartbeatRequest{Id: "sidecar/b-p", Incarnation: "sidecar/b-p#1"})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "superseded") {
		t.Fatalf("heartbeat of the old incarnation = %v, want NotFound (superseded)", err)
	}
	if _, err := api.Register(ctx, regs["sidecar/b-p"]); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "superseded") {
		t.Fatalf("registration of the old incarnation = %v, want NotFound (superseded)", err)
	}
	// The new one stays alive as a standby.
	if _, err := api.Heartbeat(ctx, &hamsv1.HeartbeatRequest{Id: "sidecar/b-p", Incarnation: "sidecar/b-p#2"}); err != nil {
		t.Fatalf("heartbeat of the new incarnation: %v", err)
	}
}

// A backup restarted under its id: it is replaced by the spare at once
// (synced from the primary, no promotion, no epoch change) and the new
// process is a fresh standby.
func TestRestartedBackupIsReplaced(t *testing.T) {
	r := startManager(t, func(c *manager.Config) { c.SuspicionTimeout = restartSuspicion }, nil)
	regs, fakes, clients := statefulB(t, r, true)
	clients["sidecar/b-b"].stop()
	restart(t, r, regs["sidecar/b-b"], "sidecar/b-b#2")
	waitFor(t, "the spare made backup, the restarted backup a standby", 10*time.Second, func() bool {
		tp := r.m.Topology()
		p, b, s := placement(tp, "sidecar/b-p"), placement(tp, "sidecar/b-b"), placement(tp, "sidecar/b-s")
		return p.GetRole() == hamsv1.Role_ROLE_PRIMARY && p.GetEpoch() == 1 && p.GetAlive() &&
			s.GetRole() == hamsv1.Role_ROLE_BACKUP && s.GetAlive() &&
			b.GetRole() == hamsv1.Role_ROLE_STANDBY && b.GetAlive()
	})
	waitFor(t, "the spare synced", 5*time.Second, func() bool { return fakes["sidecar/b-s"].count("Demote") == 1 })
	if n := fakes["sidecar/b-p"].count("Promote"); n != 0 {
		t.Fatalf("primary promoted %d times", n)
	}
}

// Without a spare and without an instance starter (Kubernetes: restart
// policies bring processes back), a restarted backup is admitted as a
// fresh standby and, its model having no backup, made the backup and
// synced from the primary at once.
func TestRestartedBackupWithoutSpareBecomesBackupAgain(t *testing.T) {
	r := startManager(t, func(c *manager.Config) { c.SuspicionTimeout = restartSuspicion }, nil)
	regs, _, clients := statefulB(t, r, false)
	clients["sidecar/b-b"].stop()
	_, fnew, _ := restart(t, r, regs["sidecar/b-b"], "sidecar/b-b#2")
	waitFor(t, "the restarted backup synced and made backup again", 10*time.Second, func() bool {
		b := placement(r.m.Topology(), "sidecar/b-b")
		return b.GetRole() == hamsv1.Role_ROLE_BACKUP && b.GetAlive() && b.GetSidecarAddress() == fnew.addr && fnew.count("Demote") == 1
	})
}

// A model server restarted under its id is not a sidecar: its
// registration is taken as before (its sidecar notices a lost backend
// state, sidecar/backendloss.go).
func TestRestartedModelServerRegistersAsBefore(t *testing.T) {
	r := startManager(t, func(c *manager.Config) { c.SuspicionTimeout = restartSuspicion }, nil)
	api := managerAPI(t, r.addr)
	ctx := waitCtx(t)
	ms := &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER, Id: "ms/b", Model: "b", Address: "127.0.0.1:7001", Incarnation: "1"}
	if _, err := api.Register(ctx, ms); err != nil {
		t.Fatal(err)
	}
	ms.Incarnation = "2"
	if _, err := api.Register(ctx, ms); err != nil {
		t.Fatalf("re-registration of a restarted model server: %v", err)
	}
	if v := metricValue(t, r.reg, "hams_manager_restarted_components_total"); v != 0 {
		t.Fatalf("restarted components = %v, want 0", v)
	}
}

// Issue 18: b's primary reports that it cannot ship to its backup (both
// heartbeat fine: a partition between them). The backup is retired and
// replaced by the spare at the primary's epoch; the primary keeps its
// role and epoch. Reports not made by the model's primary against its
// live backup are refused and change nothing.
func TestPrimaryReportsUnreachableBackup(t *testing.T) {
	r := startManager(t, func(c *manager.Config) { c.SuspicionTimeout = restartSuspicion }, nil)
	regs, fakes, clients := statefulB(t, r, true)
	api := managerAPI(t, r.addr)
	ctx := waitCtx(t)
	report := func(reporter, suspect, model string) error {
		_, err := api.ReportFailure(ctx, &hamsv1.FailureReport{Reporter: reporter, Suspect: suspect, Model: model, Reason: "ship to backup failing for 3s"})
		return err
	}
	for _, c := range []struct{ name, reporter, suspect, model string }{
		{"the backup reports its primary", "sidecar/b-b", "sidecar/b-p", "b"},
		{"another model's instance reports the backup", "sidecar/a", "sidecar/b-b", "b"},
		{"another model's instance reports it under its own model", "sidecar/a", "sidecar/b-b", "a"},
		{"the primary reports the spare", "sidecar/b-p", "sidecar/b-s", "b"},
		{"the primary reports itself", "sidecar/b-p", "sidecar/b-p", "b"},
		{"the spare reports the backup", "sidecar/b-s", "sidecar/b-b", "b"},
	} {
		if err := report(c.reporter, c.suspect, c.model); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s: %v, want FailedPrecondition", c.name, err)
		}
	}
	tp := r.m.Topology()
	if b, p := placement(tp, "sidecar/b-b"), placement(tp, "sidecar/b-p"); b.GetRole() != hamsv1.Role_ROLE_BACKUP || !b.GetAlive() ||
		p.GetRole() != hamsv1.Role_ROLE_PRIMARY || !p.GetAlive() || p.GetEpoch() != 1 {
		t.Fatalf("a refused report changed the topology: %v", tp)
	}
	if v := metricValue(t, r.reg, "hams_manager_backup_reports_total"); v != 6 {
		t.Fatalf("backup reports = %v, want 6 (refused)", v)
	}

	// The primary's sidecar reports through its manager client (reporter:
	// its own id; suspect: the id the topology gives the backup's
	// address).
	pc := clients["sidecar/b-p"].c
	if err := pc.ReportBackup(ctx, "b", "127.0.0.1:1", "no such backup"); !errors.Is(err, client.ErrNoSuchBackup) {
		t.Fatalf("report of an address that is no backup: %v, want ErrNoSuchBackup", err)
	}
	t0 := time.Now()
	if err := pc.ReportBackup(ctx, "b", fakes["sidecar/b-b"].addr, "ship to backup failing for 3s"); err != nil {
		t.Fatalf("the primary's report of its backup: %v", err)
	}
	waitFor(t, "the spare made backup at the primary's epoch, the old backup dead", 10*time.Second, func() bool {
		tp := r.m.Topology()
		p, b, s := placement(tp, "sidecar/b-p"), placement(tp, "sidecar/b-b"), placement(tp, "sidecar/b-s")
		return p.GetRole() == hamsv1.Role_ROLE_PRIMARY && p.GetEpoch() == 1 && p.GetAlive() &&
			s.GetRole() == hamsv1.Role_ROLE_BACKUP && s.GetAlive() && s.GetEpoch() == 1 && !b.GetAlive()
	})
	waitFor(t, "the spare synced", 5*time.Second, func() bool { return fakes["sidecar/b-s"].count("Demote") == 1 })
	t.Logf("backup replaced %v after the report", time.Since(t0))
	if addr, _, ok := client.ResolveBackupOf(r.m.Topology(), "b"); !ok || addr != fakes["sidecar/b-s"].addr {
		t.Fatalf("backup of b resolves to %s, %v; want the spare %s", addr, ok, fakes["sidecar/b-s"].addr)
	}
	if why := r.m.Retired()["sidecar/b-b"]; !strings.Contains(why, "could not ship") {
		t.Fatalf("retired = %v", r.m.Retired())
	}
	if n := fakes["sidecar/b-b"].count("Promote"); n != 0 {
		t.Fatalf("the replaced backup was promoted %d times", n)
	}
	// The replaced backup's process is told to exit (it still heartbeats).
	waitFor(t, "the replaced backup's client refused", 5*time.Second, func() bool {
		_, err := api.Heartbeat(ctx, &hamsv1.HeartbeatRequest{Id: "sidecar/b-b", Incarnation: "sidecar/b-b#1"})
		return status.Code(err) == codes.NotFound
	})
	clients["sidecar/b-b"].stopQuiet()
	// A report against the replaced backup now is refused: it is not the
	// live backup.
	if err := report("sidecar/b-p", "sidecar/b-b", "b"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second report: %v, want FailedPrecondition", err)
	}
	// Its process restarted in place is a new incarnation: a fresh spare.
	restart(t, r, regs["sidecar/b-b"], "sidecar/b-b#2")
	waitFor(t, "the restarted old backup a fresh standby", 10*time.Second, func() bool {
		b := placement(r.m.Topology(), "sidecar/b-b")
		return b.GetRole() == hamsv1.Role_ROLE_STANDBY && b.GetAlive()
	})
}

// Without a spare (and without a starter) a reported backup is retired
// and the model has no backup: its primary is not promoted, nothing else
// serves as backup, until a spare appears (the retired process restarted
// as a new incarnation), which is made the backup and synced.
func TestReportedBackupWithoutSpare(t *testing.T) {
	r := startManager(t, func(c *manager.Config) { c.SuspicionTimeout = restartSuspicion }, nil)
	regs, _, clients := statefulB(t, r, false)
	api := managerAPI(t, r.addr)
	ctx := waitCtx(t)
	if _, err := api.ReportFailure(ctx, &hamsv1.FailureReport{Reporter: "sidecar/b-p", Suspect: "sidecar/b-b", Model: "b", Reason: "ship failing"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the backup dead", 10*time.Second, func() bool { return !placement(r.m.Topology(), "sidecar/b-b").GetAlive() })
	if _, _, ok := client.ResolveBackupOf(r.m.Topology(), "b"); ok {
		t.Fatal("b still resolves a backup")
	}
	clients["sidecar/b-b"].stopQuiet()
	_, fnew, _ := restart(t, r, regs["sidecar/b-b"], "sidecar/b-b#2")
	waitFor(t, "the new incarnation made backup and synced", 10*time.Second, func() bool {
		b := placement(r.m.Topology(), "sidecar/b-b")
		return b.GetRole() == hamsv1.Role_ROLE_BACKUP && b.GetAlive() && fnew.count("Demote") == 1
	})
	if p := placement(r.m.Topology(), "sidecar/b-p"); p.GetRole() != hamsv1.Role_ROLE_PRIMARY || p.GetEpoch() != 1 {
		t.Fatalf("primary changed: %v", p)
	}
}

// A primary restarted while its model has no backup cannot be replaced:
// the new process is readmitted in the primary's role (what the old one
// held is lost; the model is reported unrecoverable) rather than leaving
// the model without a primary.
func TestRestartedPrimaryWithoutBackupReadmitted(t *testing.T) {
	r := startManager(t, func(c *manager.Config) { c.SuspicionTimeout = restartSuspicion }, nil)
	fp := startFake(t, &fakeRepl{})
	rp := sidecarReg("sidecar/b-p", "b", fp.addr)
	rp.Role, rp.Incarnation = hamsv1.Role_ROLE_PRIMARY, "p#1"
	c := startClient(t, r.addr, rp)
	waitFor(t, "the primary alive", 10*time.Second, func() bool { return placement(r.m.Topology(), "sidecar/b-p").GetAlive() })
	c.stop()
	_, fnew, _ := restart(t, r, rp, "p#2")
	waitFor(t, "the new process readmitted as the primary", 10*time.Second, func() bool {
		p := placement(r.m.Topology(), "sidecar/b-p")
		return p.GetRole() == hamsv1.Role_ROLE_PRIMARY && p.GetAlive() && p.GetEpoch() == 1 && p.GetSidecarAddress() == fnew.addr
	})
	waitFor(t, "b reported unrecoverable", 5*time.Second, func() bool {
		return metricValue(t, r.reg, "hams_manager_unrecoverable_total") >= 1
	})
}
