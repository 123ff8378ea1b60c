package manager_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/manager"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// frozen is a component that heartbeats by hand and can be stopped and
// resumed (a SIGSTOP of its process, without the process).
type frozen struct {
	api    hamsv1.ManagerClient
	id     string
	paused atomic.Bool
	errs   chan error
	// beats counts heartbeats answered without an error.
	beats atomic.Int64
}

func freezable(t *testing.T, addr string, reg *hamsv1.RegisterRequest) *frozen {
	t.Helper()
	return heartbeating(t, addr, reg, true)
}

// heartbeating is freezable that registers first only when register is
// set (else it heartbeats a manager that knows reg's id from the
// persisted placements alone, as one that took over does). Heartbeats
// name reg's incarnation, as manager/client's do.
func heartbeating(t *testing.T, addr string, reg *hamsv1.RegisterRequest, register bool) *frozen {
	t.Helper()
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	f := &frozen{api: hamsv1.NewManagerClient(cc), id: reg.GetId(), errs: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	if register {
		if _, err := f.api.Register(ctx, reg); err != nil {
			cancel()
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			if f.paused.Load() {
				continue
			}
			hctx, hcancel := context.WithTimeout(ctx, time.Second)
			_, err := f.api.Heartbeat(hctx, &hamsv1.HeartbeatRequest{Id: f.id, Incarnation: reg.GetIncarnation()})
			hcancel()
			if err == nil {
				f.beats.Add(1)
			}
			if err != nil && ctx.Err() == nil {
				select {
				case f.errs <- err:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// A stateful primary stops heartbeating for longer than the suspicion
// timeout (SIGSTOP), is failed over, and resumes: the manager never makes
// it alive again (the topology keeps it dead, so no primary resolves it
// as its backup); its heartbeats are answered NotFound (retired) and its
// registration refused, so its manager client's Run ends with the refusal
// (its process exits). The backup restored from the starter is synced.
func TestFalselySuspectedPrimaryRetired(t *testing.T) {
	fe, fa, fbp, fbb := chainFakes(t)
	st := &fakeStarter{}
	r := startManager(t, func(c *manager.Config) { c.Starter = st; c.SuspicionTimeout = 300 * time.Millisecond }, nil)
	ctx := waitCtx(t)
	startClient(t, r.addr, frontendReg("frontend/0", fe.addr))
	ra := sidecarReg("sidecar/a", "a", fa.addr)
	ra.Role = hamsv1.Role_ROLE_ACTIVE
	startClient(t, r.addr, ra)
	rp := sidecarReg("sidecar/b-p", "b", fbp.addr)
	rp.Role = hamsv1.Role_ROLE_PRIMARY
	// The stopped process's incarnation: its client below is that same
	// process's (a new incarnation would be a new process, admitted as a
	// fresh standby: incarnation_test.go).
	rp.Incarnation = "b-p-1"
	bp := freezable(t, r.addr, rp)
	rb := sidecarReg("sidecar/b-b", "b", fbb.addr)
	rb.Role = hamsv1.Role_ROLE_BACKUP
	bb := startClient(t, r.addr, rb)

	bp.paused.Store(true) // SIGSTOP
	if err := bb.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/b-b")
		return p.GetRole() == hamsv1.Role_ROLE_PRIMARY && p.GetEpoch() == 2 && placement(tp, "sidecar/b-p").GetRole() == hamsv1.Role_ROLE_BACKUP
	}); err != nil {
		t.Fatalf("b not failed over: %v (topology %v)", err, bb.c.Topology())
	}
	waitFor(t, "a new backup asked for", 5*time.Second, func() bool { return len(st.list()) == 1 })
	bp.paused.Store(false) // SIGCONT

	var err error
	select {
	case err = <-bp.errs:
	case <-ctx.Done():
		t.Fatal("the resumed primary's heartbeats were never refused")
	}
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "retired") {
		t.Fatalf("heartbeat of the resumed primary = %v, want NotFound (retired)", err)
	}
	if _, err := bp.api.Register(ctx, rp); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "never reused") {
		t.Fatalf("registration of the resumed primary = %v, want NotFound (retired)", err)
	}
	if why, ok := r.m.Retired()["sidecar/b-p"]; !ok || !strings.Contains(why, "deposed primary") {
		t.Fatalf("retired = %v", r.m.Retired())
	}
	if p := placement(r.m.Topology(), "sidecar/b-p"); p.GetAlive() {
		t.Fatalf("the retired primary is alive in the topology: %v", p)
	}
	if addr, _, ok := client.Resolve(r.m.Topology(), "b"); !ok || addr != fbb.addr {
		t.Fatalf("Resolve(b) = %s, %v", addr, ok)
	}
	if v := metricValue(t, r.reg, "hams_manager_returned_components_total"); v != 1 {
		t.Fatalf("returned components = %v, want 1", v)
	}
	// Its manager client gives up: the process exits.
	c, err := client.New(client.Config{ManagerAddr: r.addr, Registration: rp})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(ctx)
	if status.Code(errors.Unwrap(err)) != codes.NotFound || !strings.Contains(err.Error(), "retired") {
		t.Fatalf("client Run of the retired primary = %v, want the refusal", err)
	}
}

// A stateful primary whose backup is dead too cannot be replaced: when it
// resumes it is readmitted (still b's primary at its epoch) and a new
// backup is asked for.
func TestFalselySuspectedUnreplacedPrimaryReadmitted(t *testing.T) {
	fbp := startFake(t, &fakeRepl{})
	st := &fakeStarter{}
	r := startManager(t, func(c *manager.Config) { c.Starter = st; c.SuspicionTimeout = 300 * time.Millisecond }, nil)
	rp := sidecarReg("sidecar/b-p", "b", fbp.addr)
	rp.Role = hamsv1.Role_ROLE_PRIMARY
	bp := freezable(t, r.addr, rp)
	bp.paused.Store(true)
	waitFor(t, "the primary declared dead", 5*time.Second, func() bool {
		p := placement(r.m.Topology(), "sidecar/b-p")
		return p != nil && !p.GetAlive()
	})
	bp.paused.Store(false)
	waitFor(t, "the primary readmitted", 5*time.Second, func() bool {
		p := placement(r.m.Topology(), "sidecar/b-p")
		return p.GetAlive() && p.GetRole() == hamsv1.Role_ROLE_PRIMARY && p.GetEpoch() == 1
	})
	waitFor(t, "a new backup asked for", 5*time.Second, func() bool { return len(st.list()) == 1 && st.list()[0] == "b/ROLE_BACKUP" })
	select {
	case err := <-bp.errs:
		t.Fatalf("heartbeat of the readmitted primary: %v", err)
	default:
	}
}

// The primary is killed (it never heartbeats again) while its backup is
// stopped longer than the suspicion timeout: b is given up (primary and
// backup both failed). The backup resumes: it holds b's state, so it is
// readmitted and promoted (epoch 2), not retired as a dead backup, which
// left b without a primary for good.
func TestReturnedBackupOfADeadPrimaryIsPromoted(t *testing.T) {
	fe, fa, fbp, fbb := chainFakes(t)
	st := &fakeStarter{}
	r := startManager(t, func(c *manager.Config) { c.Starter = st; c.SuspicionTimeout = 300 * time.Millisecond }, nil)
	startClient(t, r.addr, frontendReg("frontend/0", fe.addr))
	ra := sidecarReg("sidecar/a", "a", fa.addr)
	ra.Role = hamsv1.Role_ROLE_ACTIVE
	startClient(t, r.addr, ra)
	rp := sidecarReg("sidecar/b-p", "b", fbp.addr)
	rp.Role = hamsv1.Role_ROLE_PRIMARY
	bp := freezable(t, r.addr, rp)
	rb := sidecarReg("sidecar/b-b", "b", fbb.addr)
	rb.Role = hamsv1.Role_ROLE_BACKUP
	rb.Incarnation = "b-b-1"
	bb := freezable(t, r.addr, rb)

	bb.paused.Store(true) // SIGSTOP of the backup
	bp.paused.Store(true) // the primary is killed: never heard again
	waitFor(t, "b given up", 5*time.Second, func() bool {
		return metricValue(t, r.reg, "hams_manager_unrecoverable_total") >= 1
	})
	bb.paused.Store(false) // SIGCONT
	waitFor(t, "the returned backup promoted", 5*time.Second, func() bool {
		p := placement(r.m.Topology(), "sidecar/b-b")
		return p.GetAlive() && p.GetRole() == hamsv1.Role_ROLE_PRIMARY && p.GetEpoch() == 2
	})
	if _, retired := r.m.Retired()["sidecar/b-b"]; retired {
		t.Fatalf("the backup that held b's state was retired: %v", r.m.Retired())
	}
	fbb.mu.Lock()
	promoted := len(fbb.promote)
	fbb.mu.Unlock()
	if promoted != 1 {
		t.Fatalf("Promote calls on the returned backup = %d, want 1", promoted)
	}
	if addr, _, ok := client.Resolve(r.m.Topology(), "b"); !ok || addr != fbb.addr {
		t.Fatalf("Resolve(b) = %s, %v; want the returned backup %s", addr, ok, fbb.addr)
	}
}
