package manager_test

import (
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
func TestRecoveryDriverReplay(t *testing.T) {
	fe := startFake(t, &fakeRepl{summary: &hamsv1.LineageSummary{Model: "frontend", MaxOutSeq: 11}})
	fa := startFake(t, &fakeRepl{})
	fbp := startFake(t, &fakeRepl{})
	fbs := startFake(t, &fakeRepl{summary: &hamsv1.LineageSummary{Model: "b", MaxOutSeq: 15,
		MaxInByPred: map[string]uint64{"a": 15, "frontend": 15}}})
	st := &fakeStarter{}
	r := startManager(t, func(c *manager.Config) {
		c.Starter = st
		c.SuspicionTimeout = 300 * time.Millisecond
		c.Deployment.Mode = "replay"
	}, nil)
	ctx := waitCtx(t)
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
	waitFor(t, "resend from the frontend and a new spare", 5*time.Second, func() bool {
		_, _, rs := fe.snapshot()
		return len(rs) == 1 && len(st.list()) == 1
	})
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
