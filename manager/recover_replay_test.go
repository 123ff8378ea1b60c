package manager_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/hams-go/hams/manager"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// In replay mode the driver promotes the dead primary's spare with the
// successors' positions as metadata (ReplayAfterMetadata), asks the new
// primary for its own positions, rewires, has the frontend resend after
// them, and starts a new spare without syncing it.
//
// Nothing here depends on how fast the machine is: every wait polls the
// state it needs until one deadline for the whole test (replayDeadline),
// and the manager's timeouts are far above any scheduling delay (it failed
// once under a load average of 20-50 with a 300 ms suspicion timeout, a
// 500 ms RPC timeout, a 2 s lease and 5 s waits): a live component is
// never suspected for a stall, the manager never loses its lease, and a
// recovery RPC to a live fake never times out, so the recovery is the one
// the test asserts, only later.
func TestRecoveryDriverReplay(t *testing.T) {
	const replayDeadline = 2 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), replayDeadline)
	defer cancel()
	deadline, _ := ctx.Deadline()
	// poll waits for ok until the test's deadline.
	poll := func(what string, ok func() bool) {
		t.Helper()
		waitFor(t, what, time.Until(deadline), ok)
	}

	fe := startFake(t, &fakeRepl{summary: &hamsv1.LineageSummary{Model: "frontend", MaxOutSeq: 11}})
	fa := startFake(t, &fakeRepl{})
	fbp := startFake(t, &fakeRepl{})
	fbs := startFake(t, &fakeRepl{summary: &hamsv1.LineageSummary{Model: "b", MaxOutSeq: 15,
		MaxInByPred: map[string]uint64{"a": 15, "frontend": 15}}})
	st := &fakeStarter{}
	r := startManager(t, func(c *manager.Config) {
		c.Starter = st
		// Only the stopped primary's silence lasts this long.
		c.SuspicionTimeout = 2 * time.Second
		// The fakes answer at once; no query may be given up on.
		c.RPCTimeout = 10 * time.Second
		// The only manager never steps down for a slow renewal (a
		// suspicion made while it is not active is dropped).
		c.LeaseTTL = 30 * time.Second
		c.Deployment.Mode = "replay"
	}, nil)
	reg := func(id, model string, role hamsv1.Role, addr string) *runningClient {
		rq := sidecarReg(id, model, addr)
		rq.Role = role
		return startClient(t, r.addr, rq)
	}
	startClient(t, r.addr, frontendReg("frontend/0", fe.addr))
	reg("sidecar/a", "a", hamsv1.Role_ROLE_ACTIVE, fa.addr)
	bp := reg("sidecar/b-p", "b", hamsv1.Role_ROLE_PRIMARY, fbp.addr)
	bs := reg("sidecar/b-s", "b", hamsv1.Role_ROLE_BACKUP, fbs.addr)
	if err := bs.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return len(tp.GetPlacements()) == 3 && len(tp.GetFrontends()) == 1 }); err != nil {
		t.Fatal(err)
	}
	bp.stop()
	if err := bs.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/b-s")
		return p.GetRole() == hamsv1.Role_ROLE_PRIMARY && p.GetEpoch() == 2
	}); err != nil {
		t.Fatalf("b not replayed on its spare: %v (topology %v)", err, bs.c.Topology())
	}
	// The resend and the new spare's start are the round's last actions,
	// performed concurrently after the rewire: wait for both, then check
	// that there is exactly one of each.
	poll("resend from the frontend and a new spare", func() bool {
		_, _, rs := fe.snapshot()
		return len(rs) >= 1 && len(st.list()) >= 1
	})
	if _, _, rs := fe.snapshot(); len(rs) != 1 || len(st.list()) != 1 {
		t.Fatalf("resends %v, instances started %v; want one of each", rs, st.list())
	}
	p, _, _ := fbs.snapshot()
	fbs.mu.Lock()
	md := slices.Clone(fbs.replayMD)
	calls := slices.Clone(fbs.calls)
	fbs.mu.Unlock()
	if len(p) != 1 || p[0].GetEpoch() != 2 || !slices.Equal(md, []string{"frontend=11"}) {
		t.Fatalf("spare promotion %v, replay metadata %v", p, md)
	}
	if slices.Contains(calls, "GetMaxSeq") || slices.Contains(calls, "Demote") {
		t.Fatalf("replay recovery asked the spare %v", calls)
	}
	if _, _, rs := fe.snapshot(); rs[0].GetToModel() != "a" || rs[0].GetAfterEdgeSeq() != 15 || rs[0].GetToAddress() != fa.addr {
		t.Fatalf("resend = %v", rs[0])
	}
	if got := st.list(); got[0] != "b/ROLE_BACKUP" {
		t.Fatalf("started %v", got)
	}
}
