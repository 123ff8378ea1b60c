package manager_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/manager"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

const testYAML = `
name: test
models:
  - name: a
    kind: prep
  - name: b
    kind: lstm
    stateful: true
    placement: {primary: h1, backup: h2}
services:
  - name: s
    edges: [[frontend, a], [a, b], [b, frontend]]
`

func testDeployment(t *testing.T) *config.Deployment {
	t.Helper()
	d, err := config.Parse([]byte(testYAML))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type running struct {
	m    *manager.Manager
	addr string
	reg  *prometheus.Registry
	stop func() error // cancels Run and returns its error
}

// startManager runs a manager with an embedded NATS (random ports) on lis
// (a fresh loopback listener when nil) and waits until it is ready.
func startManager(t *testing.T, mod func(*manager.Config), lis net.Listener) *running {
	t.Helper()
	if lis == nil {
		var err error
		lis, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	cfg := manager.Config{
		Deployment:   testDeployment(t),
		GRPCListener: lis,
		StoreDir:     t.TempDir(),
		NATSListen:   "127.0.0.1:-1",
		Registry:     reg,
		// Generous for -race on two cores; TestKilledClientMarkedDead
		// uses the defaults.
		HeartbeatInterval: 20 * time.Millisecond,
		SuspicionTimeout:  500 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := manager.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(cfg.ID, "crash:") {
		m.KeepLeaseOnStop() // stopping it is a crash for the lease
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var stopped bool
	var runErr error
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("manager Run did not return within 10s of cancel")
			}
		}
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("manager Run: %v", err)
		}
	})
	select {
	case <-m.Ready():
	case err := <-done:
		t.Fatalf("manager Run returned before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("manager not ready after 10s")
	}
	return &running{m: m, addr: lis.Addr().String(), reg: reg, stop: stop}
}

type runningClient struct {
	c    *client.Client
	stop func()
	// quiet: Run's error is expected (a retired component's refusal).
	quiet *bool
}

// stopQuiet stops a client whose Run may have ended with a refusal.
func (rc *runningClient) stopQuiet() {
	*rc.quiet = true
	rc.stop()
}

func startClient(t *testing.T, addr string, reg *hamsv1.RegisterRequest) *runningClient {
	t.Helper()
	c, err := client.New(client.Config{ManagerAddr: addr, Registration: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var stopped, quiet bool
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil && !quiet {
				t.Errorf("client Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("client Run did not return within 10s of cancel")
		}
	}
	t.Cleanup(stop)
	return &runningClient{c: c, stop: stop, quiet: &quiet}
}

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func placement(t *hamsv1.Topology, id string) *hamsv1.Placement {
	for _, p := range t.GetPlacements() {
		if p.GetComponentId() == id {
			return p
		}
	}
	return nil
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var v float64
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		return v
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

func sidecarReg(id, model, addr string) *hamsv1.RegisterRequest {
	return &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR, Id: id, Model: model, Address: addr, BackendAddress: "127.0.0.1:9", Pid: 42}
}

func frontendReg(id, addr string) *hamsv1.RegisterRequest {
	return &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND, Id: id, Address: addr}
}

// Two clients register, heartbeat and watch over loopback gRPC; a third,
// raw watcher sees the same topology; the KV bucket holds it for other
// processes.
func TestRegisterHeartbeatWatchEndToEnd(t *testing.T) {
	r := startManager(t, nil, nil)
	if u := r.m.NATSClientURL(); !strings.HasPrefix(u, "nats://127.0.0.1:") {
		t.Fatalf("NATSClientURL = %q", u)
	}
	sc := startClient(t, r.addr, sidecarReg("sidecar/a", "a", "127.0.0.1:7001"))
	fe := startClient(t, r.addr, frontendReg("frontend/0", "127.0.0.1:7000"))
	ctx := waitCtx(t)

	// Both clients converge on a topology with both components.
	both := func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/a")
		return p != nil && p.GetAlive() && len(tp.GetFrontends()) == 1
	}
	for _, c := range []*client.Client{sc.c, fe.c} {
		if err := c.WaitReady(ctx, both); err != nil {
			t.Fatalf("clients never saw both registrations: %v (topology %v)", err, c.Topology())
		}
	}
	tp := sc.c.Topology()
	p := placement(tp, "sidecar/a")
	if p.GetModel() != "a" || p.GetRole() != hamsv1.Role_ROLE_ACTIVE || p.GetSidecarAddress() != "127.0.0.1:7001" ||
		p.GetBackendAddress() != "127.0.0.1:9" || p.GetEpoch() != 1 {
		t.Fatalf("placement = %v, want model a, ACTIVE (stateless default), addresses, epoch 1", p)
	}
	if tp.GetDeployment() != "test" || tp.GetMode() != "nspb" || tp.GetRevision() == 0 {
		t.Fatalf("topology header = %q %q rev %d", tp.GetDeployment(), tp.GetMode(), tp.GetRevision())
	}
	for _, c := range []*client.Client{sc.c, fe.c} {
		if addr, epoch, ok := c.Resolve("a"); !ok || addr != "127.0.0.1:7001" || epoch != 1 {
			t.Fatalf("Resolve(a) = %q, %d, %v", addr, epoch, ok)
		}
		if addr, _, ok := c.Resolve(config.Frontend); !ok || addr != "127.0.0.1:7000" {
			t.Fatalf("Resolve(frontend) = %q, %v", addr, ok)
		}
		if _, _, ok := c.Resolve("b"); ok {
			t.Fatal("Resolve(b) succeeded with no b sidecar")
		}
	}

	// Heartbeats arrive.
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, r.reg, "hams_manager_heartbeats_received_total") < 4 {
		if time.Now().After(deadline) {
			t.Fatal("no heartbeats received")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := metricValue(t, r.reg, "hams_manager_registered_components"); got != 2 {
		t.Fatalf("registered components = %v, want 2", got)
	}
	if got := metricValue(t, r.reg, "hams_manager_alive_components"); got != 2 {
		t.Fatalf("alive components = %v, want 2", got)
	}

	// A raw watcher gets the current topology first, then a change.
	cc, err := grpcx.Dial(r.addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	api := hamsv1.NewManagerClient(cc)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	stream, err := api.WatchTopology(wctx, &hamsv1.GetTopologyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if placement(first, "sidecar/a") == nil {
		t.Fatalf("first watched topology lacks sidecar/a: %v", first)
	}
	changed := sc.c.Changed()
	sb := startClient(t, r.addr, sidecarReg("sidecar/b", "b", "127.0.0.1:7002"))
	for {
		next, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if next.GetRevision() <= first.GetRevision() {
			t.Fatalf("watch went from revision %d to %d", first.GetRevision(), next.GetRevision())
		}
		if p := placement(next, "sidecar/b"); p != nil {
			if p.GetRole() != hamsv1.Role_ROLE_PRIMARY {
				t.Fatalf("stateful model's sidecar got role %v, want PRIMARY by default", p.GetRole())
			}
			break
		}
	}
	select {
	case <-changed:
	case <-ctx.Done():
		t.Fatal("Changed not closed after a registration")
	}
	for _, c := range []*client.Client{sc.c, sb.c} {
		if err := c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { _, _, ok := client.Resolve(tp, "b"); return ok }); err != nil {
			t.Fatal(err)
		}
		if addr, _, _ := c.Resolve("b"); addr != "127.0.0.1:7002" {
			t.Fatalf("Resolve(b) = %q", addr)
		}
	}

	// GetTopology agrees with what another process reads from the KV
	// bucket over the NATS client port.
	got, err := api.GetTopology(ctx, &hamsv1.GetTopologyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(r.m.NATSClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, manager.BucketName("test"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, manager.TopologyKey)
	if err != nil {
		t.Fatal(err)
	}
	fromKV, err := manager.DecodeTopology(e)
	if err != nil {
		t.Fatal(err)
	}
	if fromKV.GetRevision() < got.GetRevision() || placement(fromKV, "sidecar/b") == nil {
		t.Fatalf("KV topology rev %d %v; GetTopology rev %d", fromKV.GetRevision(), fromKV, got.GetRevision())
	}
	if fromKV.GetRevision() == got.GetRevision() && !proto.Equal(fromKV, got) {
		t.Fatalf("same revision, different content:\nKV   %v\ngRPC %v", fromKV, got)
	}
}

// A client whose Run ctx is cancelled stops heartbeating and is marked
// dead within the suspicion timeout (defaults); the other stays alive.
func TestKilledClientMarkedDead(t *testing.T) {
	r := startManager(t, func(c *manager.Config) {
		c.HeartbeatInterval = 0 // defaults
		c.SuspicionTimeout = 0
	}, nil)
	victim := startClient(t, r.addr, sidecarReg("sidecar/a", "a", "127.0.0.1:7001"))
	fe := startClient(t, r.addr, frontendReg("frontend/0", "127.0.0.1:7000"))
	ctx := waitCtx(t)
	if err := fe.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/a")
		return p != nil && p.GetAlive()
	}); err != nil {
		t.Fatal(err)
	}
	victim.stop()
	killed := time.Now()
	if err := fe.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/a")
		return p != nil && !p.GetAlive()
	}); err != nil {
		t.Fatalf("victim never marked dead: %v", err)
	}
	took := time.Since(killed)
	t.Logf("dead after %v (timeout %v)", took, manager.DefaultSuspicionTimeout)
	// The victim's last heartbeat was at most one interval before the kill;
	// allow generous scheduling slack for -race on two cores.
	if limit := manager.DefaultSuspicionTimeout + time.Second; took > limit {
		t.Fatalf("marked dead after %v, want within %v", took, limit)
	}
	if took < manager.DefaultSuspicionTimeout-manager.DefaultHeartbeatInterval {
		t.Fatalf("marked dead after only %v, before the timeout", took)
	}
	if _, _, ok := fe.c.Resolve("a"); ok {
		t.Fatal("Resolve(a) still answers a dead placement")
	}
	if got := metricValue(t, r.reg, "hams_manager_components_declared_dead_total"); got < 1 {
		t.Fatalf("deaths = %v", got)
	}

	// The victim comes back (same id): alive again.
	startClient(t, r.addr, sidecarReg("sidecar/a", "a", "127.0.0.1:7001"))
	if err := fe.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/a")
		return p != nil && p.GetAlive()
	}); err != nil {
		t.Fatalf("victim never came back: %v", err)
	}
}

// A dead frontend leaves the frontend list and returns when it heartbeats.
func TestDeadFrontendRemoved(t *testing.T) {
	r := startManager(t, func(c *manager.Config) { c.SuspicionTimeout = 100 * time.Millisecond }, nil)
	fe := startClient(t, r.addr, frontendReg("frontend/0", "127.0.0.1:7000"))
	sc := startClient(t, r.addr, sidecarReg("sidecar/a", "a", "127.0.0.1:7001"))
	ctx := waitCtx(t)
	if err := sc.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return len(tp.GetFrontends()) == 1 }); err != nil {
		t.Fatal(err)
	}
	fe.stop()
	if err := sc.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return len(tp.GetFrontends()) == 0 }); err != nil {
		t.Fatalf("dead frontend still listed: %v", err)
	}
	startClient(t, r.addr, frontendReg("frontend/0", "127.0.0.1:7000"))
	if err := sc.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return len(tp.GetFrontends()) == 1 }); err != nil {
		t.Fatalf("frontend not back: %v", err)
	}
}

// A manager restarted with a fresh store answers heartbeats NotFound; the
// client registers again and watches the new manager.
func TestClientReRegistersAfterManagerRestart(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	r1 := startManager(t, nil, lis)
	sc := startClient(t, addr, sidecarReg("sidecar/a", "a", "127.0.0.1:7001"))
	ctx := waitCtx(t)
	if err := sc.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, "sidecar/a") != nil }); err != nil {
		t.Fatal(err)
	}
	if err := r1.stop(); err != nil {
		t.Fatalf("first manager: %v", err)
	}
	lis2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("re-listen on %s: %v", addr, err)
	}
	// The new manager starts empty and is given a frontend first so its
	// topology differs from the old one; the client must pick it up.
	r2 := startManager(t, nil, lis2)
	fe := startClient(t, addr, frontendReg("frontend/0", "127.0.0.1:7000"))
	_ = fe
	if err := sc.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		p := placement(tp, "sidecar/a")
		return p != nil && p.GetAlive() && len(tp.GetFrontends()) == 1
	}); err != nil {
		t.Fatalf("client did not re-register with the new manager: %v (topology %v)", err, sc.c.Topology())
	}
	if p := placement(r2.m.Topology(), "sidecar/a"); p == nil {
		t.Fatal("new manager does not know sidecar/a")
	}
}

// A manager restarted on the same store keeps the deployment state and its
// revisions, and the components known from it stay alive by heartbeating.
func TestManagerRestartKeepsState(t *testing.T) {
	dir := t.TempDir()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	r1 := startManager(t, func(c *manager.Config) { c.StoreDir = dir }, lis)
	sc := startClient(t, addr, sidecarReg("sidecar/a", "a", "127.0.0.1:7001"))
	startClient(t, addr, frontendReg("frontend/0", "127.0.0.1:7000"))
	ctx := waitCtx(t)
	if err := sc.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool {
		return placement(tp, "sidecar/a") != nil && len(tp.GetFrontends()) == 1
	}); err != nil {
		t.Fatal(err)
	}
	before := r1.m.Topology()
	if err := r1.stop(); err != nil {
		t.Fatal(err)
	}
	lis2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r2 := startManager(t, func(c *manager.Config) { c.StoreDir = dir }, lis2)
	after := r2.m.Topology()
	if after.GetRevision() < before.GetRevision() || placement(after, "sidecar/a") == nil {
		t.Fatalf("restarted manager lost state: before rev %d %v, after rev %d %v",
			before.GetRevision(), before, after.GetRevision(), after)
	}
	// Heartbeats from the known component are accepted (no re-register
	// needed) and it stays alive past the suspicion timeout.
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, r2.reg, "hams_manager_heartbeats_received_total") < 30 {
		if time.Now().After(deadline) {
			t.Fatal("no heartbeats at the restarted manager")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tp := r2.m.Topology()
	if p := placement(tp, "sidecar/a"); p == nil || !p.GetAlive() {
		t.Fatalf("sidecar/a after restart: %v", p)
	}
	// The frontend, known only by address in the stored state, registered
	// again under its id: listed once, tracked once.
	if got := tp.GetFrontends(); len(got) != 1 || got[0] != "127.0.0.1:7000" {
		t.Fatalf("frontends after restart = %v", got)
	}
	if got := metricValue(t, r2.reg, "hams_manager_registered_components"); got != 2 {
		t.Fatalf("registered components after restart = %v, want 2", got)
	}
}

// A client whose registration the manager refuses ends Run with the error.
func TestClientRunReturnsRefusal(t *testing.T) {
	r := startManager(t, nil, nil)
	c, err := client.New(client.Config{ManagerAddr: r.addr, Registration: sidecarReg("sidecar/z", "zebra", "127.0.0.1:7009")})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(waitCtx(t))
	if status.Code(errors.Unwrap(err)) != codes.NotFound || !strings.Contains(err.Error(), `model "zebra"`) {
		t.Fatalf("Run = %v, want the NotFound refusal naming the model", err)
	}
}

func TestBadInput(t *testing.T) {
	r := startManager(t, nil, nil)
	cc, err := grpcx.Dial(r.addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	api := hamsv1.NewManagerClient(cc)
	ctx := waitCtx(t)
	sc := hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR
	cases := []struct {
		name string
		req  *hamsv1.RegisterRequest
		code codes.Code
		msg  string
	}{
		{"missing kind", &hamsv1.RegisterRequest{Id: "x", Model: "a", Address: "127.0.0.1:1"}, codes.InvalidArgument, "kind"},
		{"manager kind", &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_MANAGER, Id: "x", Address: "127.0.0.1:1"}, codes.InvalidArgument, "kind"},
		{"unknown kind", &hamsv1.RegisterRequest{Kind: 99, Id: "x", Model: "a", Address: "127.0.0.1:1"}, codes.InvalidArgument, "kind"},
		{"missing id", &hamsv1.RegisterRequest{Kind: sc, Model: "a", Address: "127.0.0.1:1"}, codes.InvalidArgument, "id"},
		{"missing address", &hamsv1.RegisterRequest{Kind: sc, Id: "x", Model: "a"}, codes.InvalidArgument, "address"},
		{"address without port", &hamsv1.RegisterRequest{Kind: sc, Id: "x", Model: "a", Address: "localhost"}, codes.InvalidArgument, `address "localhost"`},
		{"address without host", &hamsv1.RegisterRequest{Kind: sc, Id: "x", Model: "a", Address: ":80"}, codes.InvalidArgument, "address"},
		{"address bad port", &hamsv1.RegisterRequest{Kind: sc, Id: "x", Model: "a", Address: "h:http"}, codes.InvalidArgument, "address"},
		{"address port 0", &hamsv1.RegisterRequest{Kind: sc, Id: "x", Model: "a", Address: "h:0"}, codes.InvalidArgument, "address"},
		{"bad backend address", &hamsv1.RegisterRequest{Kind: sc, Id: "x", Model: "a", Address: "h:1", BackendAddress: "nope"}, codes.InvalidArgument, "backend_address"},
		{"unknown role", &hamsv1.RegisterRequest{Kind: sc, Id: "x", Model: "a", Address: "h:1", Role: 42}, codes.InvalidArgument, "role"},
		{"missing model", &hamsv1.RegisterRequest{Kind: sc, Id: "x", Address: "h:1"}, codes.InvalidArgument, "model"},
		{"model server missing model", &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER, Id: "x", Address: "h:1"}, codes.InvalidArgument, "model"},
		{"unknown model", &hamsv1.RegisterRequest{Kind: sc, Id: "x", Model: "zebra", Address: "h:1"}, codes.NotFound, `model "zebra"`},
		{"model server unknown model", &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER, Id: "x", Model: "zebra", Address: "h:1"}, codes.NotFound, `model "zebra"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := api.Register(ctx, tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("Register = %v; want %v naming %q", err, tc.code, tc.msg)
			}
		})
	}
	if tp := r.m.Topology(); len(tp.GetPlacements()) != 0 || len(tp.GetFrontends()) != 0 {
		t.Fatalf("a refused registration changed the topology: %v", tp)
	}

	_, err = api.Heartbeat(ctx, &hamsv1.HeartbeatRequest{})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "id") {
		t.Fatalf("Heartbeat without id = %v", err)
	}
	_, err = api.Heartbeat(ctx, &hamsv1.HeartbeatRequest{Id: "ghost"})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `"ghost"`) {
		t.Fatalf("Heartbeat from unknown id = %v", err)
	}
	_, err = api.ReportFailure(ctx, &hamsv1.FailureReport{Reporter: "x"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "suspect") {
		t.Fatalf("ReportFailure without suspect = %v", err)
	}
}

func TestReportFailureAndModelServer(t *testing.T) {
	r := startManager(t, nil, nil)
	cc, err := grpcx.Dial(r.addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	api := hamsv1.NewManagerClient(cc)
	ctx := waitCtx(t)
	resp, err := api.ReportFailure(ctx, &hamsv1.FailureReport{Reporter: "sidecar/a", Suspect: "sidecar/b", Model: "b", Reason: "rpc timeout"})
	if err != nil || !resp.GetAccepted() {
		t.Fatalf("ReportFailure = %v, %v", resp, err)
	}
	if f := r.m.Failures(); len(f) != 1 || f[0].Suspect != "sidecar/b" || f[0].Why != "rpc timeout" {
		t.Fatalf("Failures = %+v", f)
	}
	if got := metricValue(t, r.reg, "hams_manager_failure_reports_total"); got != 1 {
		t.Fatalf("failure reports = %v", got)
	}

	// A model server is tracked with its address as backend_address and
	// never resolved as a data-path target.
	reg, err := api.Register(ctx, &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER,
		Id: "modelserver/0", Model: "a", Role: hamsv1.Role_ROLE_ACTIVE, Address: "127.0.0.1:8001"})
	if err != nil {
		t.Fatal(err)
	}
	if reg.GetHeartbeatIntervalMs() != 20 {
		t.Fatalf("heartbeat interval %d ms, want 20", reg.GetHeartbeatIntervalMs())
	}
	p := placement(reg.GetTopology(), "modelserver/0")
	if p == nil || p.GetSidecarAddress() != "" || p.GetBackendAddress() != "127.0.0.1:8001" || !p.GetAlive() {
		t.Fatalf("model server placement = %v", p)
	}
	if _, _, ok := client.Resolve(reg.GetTopology(), "a"); ok {
		t.Fatal("a model server was resolved as the model's sidecar")
	}
	// Explicit heartbeats keep it alive.
	if _, err := api.Heartbeat(ctx, &hamsv1.HeartbeatRequest{Id: "modelserver/0", MaxSeq: 3}); err != nil {
		t.Fatal(err)
	}
	// Re-registering keeps its epoch and writes nothing new.
	again, err := api.Register(ctx, &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER,
		Id: "modelserver/0", Model: "a", Role: hamsv1.Role_ROLE_ACTIVE, Address: "127.0.0.1:8001"})
	if err != nil {
		t.Fatal(err)
	}
	if again.GetTopology().GetRevision() != reg.GetTopology().GetRevision() {
		t.Fatalf("identical re-registration wrote a new revision %d (was %d)", again.GetTopology().GetRevision(), reg.GetTopology().GetRevision())
	}
	// A supervisor that saw the process end: dead in the topology at once,
	// long before the suspicion timeout.
	if _, err := api.ReportFailure(ctx, &hamsv1.FailureReport{Reporter: "supervisor", Suspect: "modelserver/0", Model: "a", Reason: "process exited", Exited: true}); err != nil {
		t.Fatal(err)
	}
	top, err := api.GetTopology(ctx, &hamsv1.GetTopologyRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if p := placement(top, "modelserver/0"); p == nil || p.GetAlive() {
		t.Fatalf("reported exit: placement %v", p)
	}
}

func TestManagerConfigAndRunOnce(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	d := testDeployment(t)
	bad := []struct {
		name string
		cfg  manager.Config
		msg  string
	}{
		{"no deployment", manager.Config{GRPCListener: lis}, "Deployment"},
		{"no listener", manager.Config{Deployment: d}, "GRPCListener"},
		{"bad NATS listen", manager.Config{Deployment: d, GRPCListener: lis, NATSListen: "nope"}, "NATSListen"},
		{"timeout below interval", manager.Config{Deployment: d, GRPCListener: lis, HeartbeatInterval: time.Second, SuspicionTimeout: time.Millisecond * 500}, "SuspicionTimeout"},
		{"interval too small", manager.Config{Deployment: d, GRPCListener: lis, HeartbeatInterval: time.Microsecond}, "HeartbeatInterval"},
		{"replicas", manager.Config{Deployment: d, GRPCListener: lis, KVReplicas: 7}, "KVReplicas"},
	}
	for _, tc := range bad {
		if _, err := manager.New(tc.cfg); !errors.Is(err, manager.ErrConfig) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: New = %v; want ErrConfig naming %s", tc.name, err, tc.msg)
		}
	}

	r := startManager(t, nil, nil)
	if err := r.m.Run(context.Background()); !errors.Is(err, manager.ErrAlreadyRun) {
		t.Fatalf("second Run = %v, want ErrAlreadyRun", err)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run = %v after cancel, want nil", err)
	}
}

// An external NATS URL that cannot be reached makes Run fail (and return).
func TestManagerExternalNATSUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := manager.New(manager.Config{Deployment: testDeployment(t), GRPCListener: lis, NATSURL: "nats://" + dead})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(waitCtx(t)); err == nil || !strings.Contains(err.Error(), "connect to NATS") {
		t.Fatalf("Run = %v, want a connect error", err)
	}
	if m.NATSClientURL() != "" {
		t.Fatal("NATSClientURL set although never ready")
	}
}

// A second manager process (same NATS) sees the first one's state through
// the bucket, and stays a standby: it answers but does not write.
func TestExternalNATSSharedState(t *testing.T) {
	r1 := startManager(t, nil, nil)
	sc := startClient(t, r1.addr, sidecarReg("sidecar/a", "a", "127.0.0.1:7001"))
	ctx := waitCtx(t)
	if err := sc.c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return placement(tp, "sidecar/a") != nil }); err != nil {
		t.Fatal(err)
	}
	r2 := startManager(t, func(c *manager.Config) { c.NATSURL = r1.m.NATSClientURL() }, nil)
	if r2.m.NATSClientURL() != r1.m.NATSClientURL() {
		t.Fatalf("external NATSClientURL = %q, want %q", r2.m.NATSClientURL(), r1.m.NATSClientURL())
	}
	if p := placement(r2.m.Topology(), "sidecar/a"); p == nil {
		t.Fatalf("second manager does not see sidecar/a: %v", r2.m.Topology())
	}
	if metricValue(t, r1.reg, "hams_manager_active") != 1 || metricValue(t, r2.reg, "hams_manager_active") != 0 {
		t.Fatal("want the first manager active and the second standby")
	}
	// A registration at the standby is answered but not written.
	cc, err := grpcx.Dial(r2.addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := hamsv1.NewManagerClient(cc).Register(ctx, frontendReg("frontend/0", "127.0.0.1:7000"))
	if err != nil || placement(resp.GetTopology(), "sidecar/a") == nil {
		t.Fatalf("Register at standby = %v, %v", resp, err)
	}
	if len(r1.m.Topology().GetFrontends()) != 0 {
		t.Fatal("standby manager wrote the deployment state")
	}
}
