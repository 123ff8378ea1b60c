package authz

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/pki"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

const dep = "ap"

func id(r pki.Role, model, inst string) pki.Identity {
	return pki.Identity{Deployment: dep, Role: r, Model: model, Instance: inst}
}

var (
	manager     = id(pki.RoleManager, "", "0")
	frontend    = id(pki.RoleFrontend, "", "0")
	sidecarM    = id(pki.RoleSidecar, "m", "a")    // the server's model
	sidecarPred = id(pki.RoleSidecar, "pred", "a") // a predecessor of m
	sidecarX    = id(pki.RoleSidecar, "x", "a")    // unrelated model
	sidecarMb   = id(pki.RoleSidecar, "m", "b")    // another instance of m
	serverM     = id(pki.RoleModelServer, "m", "a")
	supervisor  = id(pki.RoleSupervisor, "", "")
	admin       = id(pki.RoleAdmin, "", "")
	otherDepMgr = pki.Identity{Deployment: "other", Role: pki.RoleManager}
)

// facts: "pred" feeds m (and the frontend feeds it: m is an entry
// model); a component id is registered by the identity it names.
type facts struct{}

func (facts) Feeds(c pki.Identity) bool {
	return (c.Role == pki.RoleSidecar && c.Model == "pred") || c.Role == pki.RoleFrontend
}
func (facts) RegisteredBy(cid string, c pki.Identity) bool { return cid == c.String() }
func (facts) Sink() bool                                   { return true }

// rowCase is the test of one Table row: who must be let through (the
// handler then answers Unimplemented) and who must be refused.
type rowCase struct {
	method  string
	self    pki.Identity // the server
	req     func(caller pki.Identity) any
	allowed []pki.Identity
	refused []pki.Identity
}

func register(kind hamsv1.ComponentKind, model string) func(pki.Identity) any {
	return func(pki.Identity) any { return &hamsv1.RegisterRequest{Kind: kind, Model: model, Id: "x"} }
}

func resendTo(model string) func(pki.Identity) any {
	return func(pki.Identity) any { return &hamsv1.ResendRequest{ToModel: model, ToAddress: "10.0.0.66:1"} }
}

// reportAs is a ReportFailure about model whose reporter is as (nil: the
// caller itself) and whose suspect is another instance of model.
func reportAs(as *pki.Identity, model string) func(pki.Identity) any {
	return func(caller pki.Identity) any {
		rep := caller.String()
		if as != nil {
			rep = as.String()
		}
		return &hamsv1.FailureReport{Reporter: rep, Suspect: id(pki.RoleSidecar, model, "b").String(), Model: model, Reason: "ship failed"}
	}
}

func heartbeatAs(who pki.Identity) func(pki.Identity) any {
	return func(pki.Identity) any { return &hamsv1.HeartbeatRequest{Id: who.String()} }
}

var rowCases = []rowCase{
	{method: hamsv1.Replication_ShipSnapshot_FullMethodName, self: id(pki.RoleSidecar, "m", "b"), allowed: []pki.Identity{sidecarM}, refused: []pki.Identity{sidecarX, manager, frontend, serverM, admin, otherDepMgr}},
	{method: BulkShip, self: id(pki.RoleSidecar, "m", "b"), allowed: []pki.Identity{sidecarM}, refused: []pki.Identity{sidecarX, manager, frontend}},
	{method: hamsv1.Replication_GetMaxSeq_FullMethodName, self: sidecarM, allowed: []pki.Identity{manager}, refused: []pki.Identity{sidecarX, frontend, admin, otherDepMgr}},
	{method: hamsv1.Replication_GetLineageSummary_FullMethodName, self: sidecarM, allowed: []pki.Identity{manager}, refused: []pki.Identity{sidecarPred, frontend, admin}},
	{method: hamsv1.Replication_Resend_FullMethodName, self: sidecarM, req: resendTo("ap-inception"), allowed: []pki.Identity{manager}, refused: []pki.Identity{sidecarM, frontend, admin, supervisor, otherDepMgr}},
	{method: hamsv1.Replication_Resend_FullMethodName, self: sidecarM, req: resendTo(config.Frontend), allowed: []pki.Identity{manager, frontend}, refused: []pki.Identity{sidecarM, sidecarPred, admin, supervisor}},
	{method: hamsv1.Replication_Promote_FullMethodName, self: sidecarM, allowed: []pki.Identity{manager}, refused: []pki.Identity{sidecarM, frontend, admin, supervisor, otherDepMgr}},
	{method: hamsv1.Replication_Demote_FullMethodName, self: sidecarM, allowed: []pki.Identity{manager}, refused: []pki.Identity{sidecarM, sidecarX, frontend, admin, otherDepMgr}},
	{method: hamsv1.Replication_Rollback_FullMethodName, self: sidecarM, allowed: []pki.Identity{manager}, refused: []pki.Identity{sidecarM, frontend, admin}},
	{method: hamsv1.Dataplane_Forward_FullMethodName, self: sidecarM, allowed: []pki.Identity{sidecarPred, frontend}, refused: []pki.Identity{sidecarX, manager, admin, serverM, otherDepMgr}},
	{method: hamsv1.Manager_Register_FullMethodName, self: manager, req: register(hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR, "m"), allowed: []pki.Identity{sidecarM}, refused: []pki.Identity{sidecarX, frontend, serverM, admin, supervisor}},
	{method: hamsv1.Manager_Heartbeat_FullMethodName, self: manager, req: heartbeatAs(sidecarM), allowed: []pki.Identity{sidecarM}, refused: []pki.Identity{id(pki.RoleSidecar, "m", "b"), sidecarX, frontend, admin}},
	{method: hamsv1.Manager_ReportFailure_FullMethodName, self: manager, req: reportAs(nil, "m"), allowed: []pki.Identity{supervisor, manager, sidecarM}, refused: []pki.Identity{sidecarX, sidecarPred, frontend, admin, serverM}},
	// A sidecar reports only as itself: not under another instance's id.
	{method: hamsv1.Manager_ReportFailure_FullMethodName, self: manager, req: reportAs(&sidecarMb, "m"), allowed: []pki.Identity{supervisor, manager, sidecarMb}, refused: []pki.Identity{sidecarM, sidecarX}},
	// A sidecar reports only about its own model.
	{method: hamsv1.Manager_ReportFailure_FullMethodName, self: manager, req: reportAs(nil, "x"), allowed: []pki.Identity{supervisor, manager, sidecarX}, refused: []pki.Identity{sidecarM, sidecarPred}},
	// A report that names no model is a supervisor's or a manager's.
	{method: hamsv1.Manager_ReportFailure_FullMethodName, self: manager, req: reportAs(nil, ""), allowed: []pki.Identity{supervisor, manager}, refused: []pki.Identity{sidecarM, sidecarX}},
	{method: hamsv1.Manager_GetTopology_FullMethodName, self: manager, allowed: []pki.Identity{sidecarM, frontend, admin, supervisor}, refused: []pki.Identity{otherDepMgr, id(pki.RoleNATS, "", "")}},
	{method: hamsv1.Manager_WatchTopology_FullMethodName, self: manager, allowed: []pki.Identity{sidecarM, frontend}, refused: []pki.Identity{otherDepMgr, id(pki.RoleNATS, "", "")}},
	{method: hamsv1.ModelRuntime_Health_FullMethodName, self: serverM, allowed: []pki.Identity{sidecarM, admin, supervisor}, refused: []pki.Identity{sidecarX, manager, frontend}},
	{method: hamsv1.ModelRuntime_Describe_FullMethodName, self: serverM, allowed: []pki.Identity{sidecarM, admin}, refused: []pki.Identity{sidecarX, manager}},
	{method: hamsv1.ModelRuntime_Infer_FullMethodName, self: serverM, allowed: []pki.Identity{sidecarM, admin}, refused: []pki.Identity{sidecarX, frontend}},
	{method: hamsv1.ModelRuntime_Compute_FullMethodName, self: serverM, allowed: []pki.Identity{sidecarM}, refused: []pki.Identity{sidecarX, admin, manager}},
	{method: hamsv1.ModelRuntime_Update_FullMethodName, self: serverM, allowed: []pki.Identity{sidecarM}, refused: []pki.Identity{sidecarX, admin}},
	{method: hamsv1.ModelRuntime_ReadState_FullMethodName, self: serverM, allowed: []pki.Identity{sidecarM}, refused: []pki.Identity{sidecarX, admin, frontend}},
	{method: hamsv1.ModelRuntime_WriteState_FullMethodName, self: serverM, allowed: []pki.Identity{sidecarM}, refused: []pki.Identity{sidecarX, admin, manager}},
	{method: hamsv1.ModelRuntime_StateHandles_FullMethodName, self: serverM, allowed: []pki.Identity{sidecarM}, refused: []pki.Identity{sidecarX, admin}},
	{method: hamsv1.ModelRuntime_LoadWeights_FullMethodName, self: serverM, allowed: []pki.Identity{sidecarM}, refused: []pki.Identity{sidecarX, admin, manager}},
	{method: "/tensorflow.serving.PredictionService/*", self: serverM, allowed: []pki.Identity{sidecarM, frontend, admin}, refused: []pki.Identity{sidecarX, manager}},
	{method: "/tensorflow.serving.ModelService/*", self: serverM, allowed: []pki.Identity{sidecarM, frontend}, refused: []pki.Identity{sidecarX, supervisor}},
	{method: "/inference.GRPCInferenceService/*", self: serverM, allowed: []pki.Identity{sidecarM, admin}, refused: []pki.Identity{sidecarX, manager}},
	{method: "/grpc.health.v1.Health/*", self: sidecarM, allowed: []pki.Identity{manager, admin}, refused: []pki.Identity{otherDepMgr, id(pki.RoleNATS, "", "")}},
	{method: StartInstance, self: supervisor, allowed: []pki.Identity{manager}, refused: []pki.Identity{sidecarM, frontend, admin, supervisor, otherDepMgr}},
}

func concrete(method string) string {
	if len(method) > 0 && method[len(method)-1] == '*' {
		return method[:len(method)-1] + "Anything"
	}
	return method
}

// TestTableRows: every row has a case, and each case's identities are let
// through or refused as it says (Allow, the decision itself).
func TestTableRows(t *testing.T) {
	covered := map[string]bool{}
	for _, c := range rowCases {
		covered[c.method] = true
	}
	for _, r := range Table {
		if !covered[r.Method] {
			t.Errorf("Table row %s has no test case", r.Method)
		}
	}
	for _, c := range rowCases {
		a, err := New(Config{Self: c.self, Facts: facts{}})
		if err != nil {
			t.Fatal(err)
		}
		for _, who := range c.allowed {
			var req any
			if c.req != nil {
				req = c.req(who)
			}
			if err := a.Allow(concrete(c.method), who, req); err != nil {
				t.Errorf("%s by %v: refused: %v", c.method, who, err)
			}
		}
		for _, who := range c.refused {
			var req any
			if c.req != nil {
				req = c.req(who)
			}
			if err := a.Allow(concrete(c.method), who, req); err == nil {
				t.Errorf("%s by %v: allowed, want refused", c.method, who)
			}
		}
	}
	// Default deny.
	a, _ := New(Config{Self: sidecarM})
	if err := a.Allow("/hams.v1.Unknown/Do", manager, nil); err == nil {
		t.Error("a method without a rule was allowed")
	}
}

// TestEveryInternalMethodHasARule: a new RPC of an internal service must
// get a row (otherwise every call of it is refused in secure mode).
func TestEveryInternalMethodHasARule(t *testing.T) {
	a, _ := New(Config{Self: sidecarM})
	for _, sd := range []grpc.ServiceDesc{hamsv1.Replication_ServiceDesc, hamsv1.Dataplane_ServiceDesc, hamsv1.Manager_ServiceDesc, hamsv1.ModelRuntime_ServiceDesc} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, n := range names {
			if a.rule("/"+sd.ServiceName+"/"+n) == nil {
				t.Errorf("/%s/%s has no rule", sd.ServiceName, n)
			}
		}
	}
}

// mtls serves the four internal services (unimplemented handlers: an
// authorized call answers Unimplemented) as self, behind the
// authorizer, over mutual TLS; it returns a dialer per caller identity.
func mtls(t *testing.T, ca *pki.CA, dir string, self pki.Identity) (dial func(caller pki.Identity) *grpc.ClientConn) {
	t.Helper()
	src := source(t, ca, dir, self)
	a, err := New(Config{Self: self, Facts: facts{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(credentials.NewTLS(src.ServerConfig()))}, a.ServerOptions()...)...)
	hamsv1.RegisterReplicationServer(srv, hamsv1.UnimplementedReplicationServer{})
	hamsv1.RegisterDataplaneServer(srv, hamsv1.UnimplementedDataplaneServer{})
	hamsv1.RegisterManagerServer(srv, hamsv1.UnimplementedManagerServer{})
	hamsv1.RegisterModelRuntimeServer(srv, hamsv1.UnimplementedModelRuntimeServer{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return func(caller pki.Identity) *grpc.ClientConn {
		cs := source(t, ca, dir, caller)
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cs.ClientConfig())))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
}

var issued = map[string]*pki.Source{}

func source(t *testing.T, ca *pki.CA, dir string, who pki.Identity) *pki.Source {
	t.Helper()
	if s := issued[dir+who.String()]; s != nil {
		return s
	}
	name := who.Deployment + "-" + who.Role.String() + "-" + who.Model + "-" + who.Instance
	f, err := ca.IssueFiles(dir, name, who, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s, err := pki.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	issued[dir+who.String()] = s
	return s
}

// TestWrongIdentityRefusedOverMTLS: per row of the four internal gRPC
// services, over real mutual TLS: every refused identity gets
// PermissionDenied, every allowed one reaches the handler.
func TestWrongIdentityRefusedOverMTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(dir, dep, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	servers := map[string]func(pki.Identity) *grpc.ClientConn{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	streams := map[string]bool{}
	for _, sd := range []grpc.ServiceDesc{hamsv1.Replication_ServiceDesc, hamsv1.Dataplane_ServiceDesc, hamsv1.Manager_ServiceDesc, hamsv1.ModelRuntime_ServiceDesc} {
		for _, s := range sd.Streams {
			streams["/"+sd.ServiceName+"/"+s.StreamName] = true
		}
	}
	n := 0
	for _, c := range rowCases {
		if c.method[0] != '/' || c.method[len(c.method)-1] == '*' {
			continue // bulk and HTTP surfaces: their servers' tests; other services: not served here
		}
		dial := servers[c.self.String()]
		if dial == nil {
			dial = mtls(t, ca, dir, c.self)
			servers[c.self.String()] = dial
		}
		call := func(who pki.Identity) error {
			cc := dial(who)
			if streams[c.method] {
				st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, c.method)
				if err != nil {
					return err
				}
				if err := st.SendMsg(&emptypb.Empty{}); err != nil {
					return st.RecvMsg(&emptypb.Empty{})
				}
				_ = st.CloseSend()
				return st.RecvMsg(&emptypb.Empty{})
			}
			var req any = &emptypb.Empty{}
			if c.req != nil {
				req = c.req(who)
			}
			return cc.Invoke(ctx, c.method, req, &emptypb.Empty{})
		}
		for _, who := range c.allowed {
			if who.Deployment != dep {
				continue
			}
			if err := call(who); status.Code(err) != codes.Unimplemented {
				t.Errorf("%s by %v: got %v, want the handler (Unimplemented)", c.method, who, err)
			}
		}
		for _, who := range c.refused {
			err := call(who)
			want := codes.PermissionDenied
			if who.Deployment != dep {
				want = codes.Unavailable // the TLS handshake already refuses another deployment's certificate
			}
			if status.Code(err) != want {
				t.Errorf("%s by %v: got %v, want %v", c.method, who, err, want)
			}
			n++
		}
	}
	if n < 50 {
		t.Fatalf("only %d refusals exercised", n)
	}
}

// TestPlaintextHasNoIdentity: a call without mutual TLS is
// Unauthenticated (the interceptor never trusts a missing identity).
func TestPlaintextHasNoIdentity(t *testing.T) {
	a, _ := New(Config{Self: manager})
	srv := grpc.NewServer(a.ServerOptions()...)
	hamsv1.RegisterManagerServer(srv, hamsv1.UnimplementedManagerServer{})
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	cc, _ := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	err := cc.Invoke(context.Background(), hamsv1.Manager_GetTopology_FullMethodName, &emptypb.Empty{}, &emptypb.Empty{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("plaintext call: %v, want Unauthenticated", err)
	}
}
