package client

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/config"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

func goodReg() *hamsv1.RegisterRequest {
	return &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR, Id: "sidecar/a", Model: "a", Address: "127.0.0.1:7001"}
}

func TestNewValidates(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		msg  string
	}{
		{"no manager addr", Config{Registration: goodReg()}, "ManagerAddr"},
		{"bad manager addr", Config{ManagerAddr: "manager", Registration: goodReg()}, "ManagerAddr"},
		{"no registration", Config{ManagerAddr: "127.0.0.1:1"}, "Registration is required"},
		{"no kind", Config{ManagerAddr: "127.0.0.1:1", Registration: &hamsv1.RegisterRequest{Id: "x", Address: "h:1"}}, "Kind"},
		{"no id", Config{ManagerAddr: "127.0.0.1:1", Registration: &hamsv1.RegisterRequest{Kind: 1, Address: "h:1"}}, "Id"},
		{"bad address", Config{ManagerAddr: "127.0.0.1:1", Registration: &hamsv1.RegisterRequest{Kind: 1, Id: "x", Address: "h"}}, "Address"},
	}
	for _, tc := range cases {
		if _, err := New(tc.cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: New = %v; want ErrConfig naming %s", tc.name, err, tc.msg)
		}
	}
	reg := goodReg()
	c, err := New(Config{ManagerAddr: "127.0.0.1:1", Registration: reg})
	if err != nil {
		t.Fatal(err)
	}
	reg.Id = "changed"
	if c.cfg.Registration.GetId() != "sidecar/a" {
		t.Fatal("New kept the caller's registration instead of a copy")
	}
}

func TestResolve(t *testing.T) {
	tp := &hamsv1.Topology{
		Revision:  3,
		Frontends: []string{"f1:1", "f2:1"},
		Placements: []*hamsv1.Placement{
			{Model: "m", Role: hamsv1.Role_ROLE_BACKUP, ComponentId: "bk", SidecarAddress: "bk:1", Epoch: 9, Alive: true},
			{Model: "m", Role: hamsv1.Role_ROLE_PRIMARY, ComponentId: "old", SidecarAddress: "old:1", Epoch: 1, Alive: true},
			{Model: "m", Role: hamsv1.Role_ROLE_PRIMARY, ComponentId: "new", SidecarAddress: "new:1", Epoch: 2, Alive: true},
			{Model: "m", Role: hamsv1.Role_ROLE_PRIMARY, ComponentId: "dead", SidecarAddress: "dead:1", Epoch: 5, Alive: false},
			{Model: "s", Role: hamsv1.Role_ROLE_STANDBY, ComponentId: "sb", SidecarAddress: "sb:1", Epoch: 1, Alive: true},
			{Model: "s", Role: hamsv1.Role_ROLE_ACTIVE, ComponentId: "ms", BackendAddress: "ms:1", Epoch: 1, Alive: true},
			{Model: "s", Role: hamsv1.Role_ROLE_ACTIVE, ComponentId: "s1", SidecarAddress: "s1:1", Epoch: 1, Alive: true},
			{Model: "s", Role: hamsv1.Role_ROLE_ACTIVE, ComponentId: "s2", SidecarAddress: "s2:1", Epoch: 1, Alive: true},
			{Model: "only-standby", Role: hamsv1.Role_ROLE_STANDBY, ComponentId: "x", SidecarAddress: "x:1", Epoch: 1, Alive: true},
		},
	}
	cases := []struct {
		model string
		addr  string
		epoch uint64
		ok    bool
	}{
		{"m", "new:1", 2, true}, // highest live epoch; dead and backup skipped
		{"s", "s1:1", 1, true},  // first in order; standby and model server skipped
		{config.Frontend, "f1:1", 0, true},
		{"only-standby", "", 0, false},
		{"absent", "", 0, false},
	}
	for _, tc := range cases {
		addr, epoch, ok := Resolve(tp, tc.model)
		if addr != tc.addr || epoch != tc.epoch || ok != tc.ok {
			t.Errorf("Resolve(%q) = %q, %d, %v; want %q, %d, %v", tc.model, addr, epoch, ok, tc.addr, tc.epoch, tc.ok)
		}
	}
	if addr, ep, ok := resolveRole(tp, "m", hamsv1.Role_ROLE_BACKUP); addr != "bk:1" || ep != 9 || !ok {
		t.Errorf("backup of m = %q, %d, %v", addr, ep, ok)
	}
	if _, _, ok := resolveRole(tp, "s", hamsv1.Role_ROLE_BACKUP); ok {
		t.Error("a stateless model resolved a backup")
	}
	if _, _, ok := Resolve(nil, "m"); ok {
		t.Error("Resolve(nil topology) succeeded")
	}
	if _, _, ok := Resolve(&hamsv1.Topology{}, config.Frontend); ok {
		t.Error("Resolve(frontend) with no frontends succeeded")
	}
}

func TestInstallChangedAndWaitReady(t *testing.T) {
	c, err := New(Config{ManagerAddr: "127.0.0.1:1", Registration: goodReg()})
	if err != nil {
		t.Fatal(err)
	}
	if c.Topology() != nil {
		t.Fatal("topology before any install")
	}
	if _, _, ok := c.Resolve("a"); ok {
		t.Fatal("Resolve before any topology succeeded")
	}
	ch := c.Changed()
	c.install(&hamsv1.Topology{Revision: 5, Frontends: []string{"f:1"}}, false)
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed on the first topology")
	}
	// A register answer with an older revision is ignored; an identical
	// one from the stream changes nothing.
	ch = c.Changed()
	c.install(&hamsv1.Topology{Revision: 4}, false)
	c.install(&hamsv1.Topology{Revision: 5, Frontends: []string{"f:1"}}, true)
	select {
	case <-ch:
		t.Fatal("Changed closed without a change")
	default:
	}
	if c.Topology().GetRevision() != 5 {
		t.Fatalf("revision %d, want 5", c.Topology().GetRevision())
	}
	// The stream is authoritative even when revisions restart (a manager
	// with a fresh store).
	c.install(&hamsv1.Topology{Revision: 2}, true)
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed by the stream's topology")
	}
	if c.Topology().GetRevision() != 2 {
		t.Fatalf("revision %d, want 2 from the stream", c.Topology().GetRevision())
	}

	// WaitReady returns once the predicate holds, and gives up with ctx.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- c.WaitReady(ctx, func(tp *hamsv1.Topology) bool { return tp.GetRevision() == 7 })
	}()
	c.install(&hamsv1.Topology{Revision: 6}, true)
	c.install(&hamsv1.Topology{Revision: 7}, true)
	if err := <-done; err != nil {
		t.Fatalf("WaitReady = %v", err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if err := c.WaitReady(cctx, func(*hamsv1.Topology) bool { return false }); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReady with a cancelled ctx = %v", err)
	}
}

// Run against an address where nothing listens keeps retrying, returns nil
// once ctx ends, and refuses a second call.
func TestRunWithoutManagerAndRunOnce(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c, err := New(Config{ManagerAddr: addr, Registration: goodReg()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil after ctx ends", err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrAlreadyRun) {
		t.Fatalf("second Run = %v, want ErrAlreadyRun", err)
	}
}

func TestBackoff(t *testing.T) {
	b := newBackoff()
	prev := time.Duration(0)
	for i := range 10 {
		d := b.next()
		if d <= 0 || d > maxBackoff {
			t.Fatalf("step %d: %v out of (0, %v]", i, d, maxBackoff)
		}
		if i < 5 && d < prev/2 {
			t.Fatalf("step %d: %v shrank from %v", i, d, prev)
		}
		prev = d
	}
	b.reset()
	if d := b.next(); d > minBackoff {
		t.Fatalf("after reset: %v, want <= %v", d, minBackoff)
	}
}
