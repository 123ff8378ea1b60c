package manager_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/manager"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// fakeRepl is a Replication server that records the recovery calls.
type fakeRepl struct {
	hamsv1.UnimplementedReplicationServer
	addr    string
	mu      sync.Mutex
	calls   []string
	maxSeq  uint64
	summary *hamsv1.LineageSummary
	promote []*hamsv1.PromoteRequest
	startMD []string
	resend  []*hamsv1.ResendRequest
	// replayMD: ReplayAfterMetadata values of the promotions.
	replayMD []string
}

func (f *fakeRepl) rec(s string) { f.mu.Lock(); f.calls = append(f.calls, s); f.mu.Unlock() }

func (f *fakeRepl) GetMaxSeq(context.Context, *hamsv1.GetMaxSeqRequest) (*hamsv1.GetMaxSeqResponse, error) {
	f.rec("GetMaxSeq")
	return &hamsv1.GetMaxSeqResponse{MaxSeq: f.maxSeq}, nil
}
func (f *fakeRepl) GetLineageSummary(context.Context, *hamsv1.LineageSummaryRequest) (*hamsv1.LineageSummary, error) {
	f.rec("GetLineageSummary")
	return f.summary, nil
}
func (f *fakeRepl) Promote(ctx context.Context, r *hamsv1.PromoteRequest) (*hamsv1.PromoteResponse, error) {
	f.rec("Promote")
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	f.promote = append(f.promote, r)
	f.startMD = append(f.startMD, md.Get(manager.StartSeqMetadata)...)
	f.replayMD = append(f.replayMD, md.Get(manager.ReplayAfterMetadata)...)
	f.mu.Unlock()
	return &hamsv1.PromoteResponse{}, nil
}
func (f *fakeRepl) Resend(_ context.Context, r *hamsv1.ResendRequest) (*hamsv1.ResendResponse, error) {
	f.rec("Resend")
	f.mu.Lock()
	f.resend = append(f.resend, r)
	f.mu.Unlock()
	return &hamsv1.ResendResponse{}, nil
}
func (f *fakeRepl) Demote(context.Context, *hamsv1.DemoteRequest) (*hamsv1.DemoteResponse, error) {
	f.rec("Demote")
	return &hamsv1.DemoteResponse{}, nil
}

func (f *fakeRepl) snapshot() (promote []*hamsv1.PromoteRequest, md []string, resend []*hamsv1.ResendRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(promote, f.promote...), append(md, f.startMD...), append(resend, f.resend...)
}

// chainFakes starts the Replication fakes of the test deployment's
// frontend -> a -> b chain: the frontend, a's active, b's primary, and b's
// backup, which answers a failover's queries at seq 7.
func chainFakes(t *testing.T) (fe, fa, fbp, fbb *fakeRepl) {
	t.Helper()
	return startFake(t, &fakeRepl{}), startFake(t, &fakeRepl{}), startFake(t, &fakeRepl{}),
		startFake(t, &fakeRepl{maxSeq: 7, summary: &hamsv1.LineageSummary{Model: "b", MaxOutSeq: 7,
			MaxInByPred: map[string]uint64{"a": 7, "frontend": 7}}})
}

func startFake(t *testing.T, f *fakeRepl) *fakeRepl {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hamsv1.RegisterReplicationServer(srv, f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = grpcx.Serve(ctx, srv, lis, time.Second) }()
	t.Cleanup(func() { cancel(); <-done })
	f.addr = lis.Addr().String()
	return f
}

type fakeStarter struct {
	mu    sync.Mutex
	calls []string
}

func (s *fakeStarter) StartInstance(_ context.Context, model string, role hamsv1.Role) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, model+"/"+role.String())
	return nil
}

func (s *fakeStarter) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

func histCount(t *testing.T, r *running, name string) uint64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// The driver recovers a dead stateful primary (missed heartbeats) and then
// a stateless model reported failed, through the sidecars' Replication
// RPCs on loopback gRPC.
func TestRecoveryDriver(t *testing.T) {
	fe := startFake(t, &fakeRepl{})
	fa := startFake(t, &fakeRepl{})
	fas := startFake(t, &fakeRepl{})
	fbp := startFake(t, &fakeRepl{})
	fbb := startFake(t, &fakeRepl{maxSeq: 7, summary: &hamsv1.LineageSummary{Model: "b", MaxOutSeq: 7,
		MaxInByPred: map[string]uint64{"a": 7, "frontend": 7}}})
	st := &fakeStarter{}
	r := startManager(t, func(c *manager.Config) { c.Starter = st; c.SuspicionTimeout = 300 * time.Millisecond }, nil)
	ctx := waitCtx(t)
	reg := func(id, model string, role hamsv1.Role, addr string) *runningClient {
		rq := sidecarReg(id, model, addr)
		rq.Role = role
		return startClient(t, r.addr, rq)
	}
	startClient(t, r.addr, frontendReg("frontend/0", fe.addr))
	reg("sidecar/a", "a", hamsv1.Role_ROLE_ACTIVE, fa.addr)
	reg("sidecar/a-s", "a", hamsv1.Role_ROLE_STANDBY, fas.addr)
	bp := reg("sidecar/b-p", "b", hamsv1.Role_ROLE_PRIMARY, fbp.addr)
	bb := reg("sidecar/b-b", "b", hamsv1.Role_ROLE_BACKUP, fbb.addr)
	if err := bb.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return len(tp.GetPlacements()) == 4 && len(tp.GetFrontends()) == 1 }); err != nil {
		t.Fatal(err)
	}

	// 1. The stateful primary dies.
	bp.stop()
	if err := bb.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/b-b")
		return p.GetRole() == hamsv1.Role_ROLE_PRIMARY && p.GetEpoch() == 2 && placement(tp, "sidecar/b-p").GetRole() == hamsv1.Role_ROLE_BACKUP
	}); err != nil {
		t.Fatalf("b not failed over: %v (topology %v)", err, bb.c.Topology())
	}
	if addr, epoch, _ := bb.c.Resolve("b"); addr != fbb.addr || epoch != 2 {
		t.Fatalf("Resolve(b) = %s, %d", addr, epoch)
	}
	waitFor(t, "resend from the frontend and a new backup", 5*time.Second, func() bool {
		_, _, rs := fe.snapshot()
		return len(rs) == 1 && len(st.list()) == 1
	})
	if p, _, _ := fbb.snapshot(); len(p) != 1 || p[0].GetEpoch() != 2 || p[0].GetModel() != "b" {
		t.Fatalf("promotions at b's backup: %v", p)
	}
	if _, _, rs := fe.snapshot(); rs[0].GetToModel() != "a" || rs[0].GetAfterEdgeSeq() != 7 || rs[0].GetToAddress() != fa.addr {
		t.Fatalf("resend = %v", rs[0])
	}
	if got := st.list(); got[0] != "b/ROLE_BACKUP" {
		t.Fatalf("started %v", got)
	}
	waitFor(t, "recovery time observed", 5*time.Second, func() bool { return histCount(t, r, "hams_manager_recovery_seconds") == 1 })

	// 2. A stateless model reported failed (alive to membership).
	fbb.mu.Lock()
	fbb.summary = &hamsv1.LineageSummary{Model: "b", MaxOutSeq: 9, MaxInByPred: map[string]uint64{"frontend": 9}}
	fbb.mu.Unlock()
	cc, err := grpcx.Dial(r.addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := hamsv1.NewManagerClient(cc).ReportFailure(ctx, &hamsv1.FailureReport{Reporter: "frontend/0", Suspect: "sidecar/a", Model: "a", Reason: "timeout"}); err != nil {
		t.Fatal(err)
	}
	if err := bb.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/a-s")
		return p.GetRole() == hamsv1.Role_ROLE_ACTIVE && p.GetEpoch() == 2 && placement(tp, "sidecar/a").GetRole() == hamsv1.Role_ROLE_STANDBY
	}); err != nil {
		t.Fatalf("a not replaced by its standby: %v (topology %v)", err, bb.c.Topology())
	}
	waitFor(t, "second resend", 5*time.Second, func() bool { _, _, rs := fe.snapshot(); return len(rs) == 2 })
	p, md, _ := fas.snapshot()
	if len(p) != 1 || p[0].GetEpoch() != 2 || len(md) != 1 || md[0] != "9" {
		t.Fatalf("standby promotion %v, start seq metadata %v", p, md)
	}
	if _, _, rs := fe.snapshot(); rs[1].GetAfterEdgeSeq() != 9 || rs[1].GetToAddress() != fas.addr || rs[1].GetEpoch() != 2 {
		t.Fatalf("resend = %v", rs[1])
	}
	waitFor(t, "second recovery observed", 5*time.Second, func() bool { return histCount(t, r, "hams_manager_recovery_seconds") == 2 })
}
