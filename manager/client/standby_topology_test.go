package client

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// fakeManager answers Register with its topology under its role header;
// nothing else is implemented (the client's other loops back off).
type fakeManager struct {
	hamsv1.UnimplementedManagerServer
	role       string
	topo       *hamsv1.Topology
	registered atomic.Int32
}

func (f *fakeManager) Register(ctx context.Context, _ *hamsv1.RegisterRequest) (*hamsv1.RegisterResponse, error) {
	_ = grpc.SetHeader(ctx, metadata.Pairs(RoleMetadata, f.role))
	f.registered.Add(1)
	return &hamsv1.RegisterResponse{Topology: f.topo, HeartbeatIntervalMs: 50}, nil
}

func serveFake(t *testing.T, f *fakeManager) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hamsv1.RegisterManagerServer(srv, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return l.Addr().String()
}

// A standby manager's answer to a registration carries the topology of
// its own watch of the deployment state, which may lag behind the active
// manager's (it fell behind after a NATS kill in a soak). A frontend that
// had just restarted installed it, found itself listed first, led for 36
// ms and asked the sink models to resend to it. Only the active manager's
// answer installs a topology; a standby's is left to the topology watch.
func TestRegistrationAnswerOfAStandbyIsNotInstalled(t *testing.T) {
	stale := &fakeManager{role: RoleStandby, topo: &hamsv1.Topology{Revision: 9, Frontends: []string{"stale:1"}}}
	active := &fakeManager{role: RoleActive, topo: &hamsv1.Topology{Revision: 8, Frontends: []string{"leader:1"}}}
	for _, tc := range []struct {
		name string
		mgrs []*fakeManager
		want string
	}{
		{"standby only", []*fakeManager{stale}, ""},
		{"standby and active", []*fakeManager{stale, active}, "leader:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var addrs []string
			for _, m := range tc.mgrs {
				m.registered.Store(0)
				addrs = append(addrs, serveFake(t, m))
			}
			c, err := New(Config{ManagerAddrs: addrs, Registration: goodReg()})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			defer func() { cancel(); <-done }()
			deadline := time.Now().Add(5 * time.Second)
			for stale.registered.Load() == 0 || (tc.want != "" && c.Topology() == nil) {
				if time.Now().After(deadline) {
					t.Fatalf("no registration answered (topology %v)", c.Topology())
				}
				time.Sleep(5 * time.Millisecond)
			}
			got := ""
			if tp := c.Topology(); tp != nil {
				got = tp.GetFrontends()[0]
			}
			if got != tc.want {
				t.Fatalf("leading frontend %q after registering, want %q", got, tc.want)
			}
		})
	}
}
