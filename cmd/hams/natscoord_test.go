package main

import (
	"context"
	"flag"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/natsd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// The wiring of NATS credentials: a sidecar that starts before the
// manager waits for it to create the coordination streams, then binds and
// announces; both authenticate with the seeds of --nats-auth over mutual
// TLS to a server of `hams nats`'s kind.
func TestOpenCoordAuthWaitsForManager(t *testing.T) {
	dep, err := config.Parse([]byte("name: wired\nmodels:\n  - name: m\n    kind: prep\n"))
	if err != nil {
		t.Fatal(err)
	}
	credDir := filepath.Join(t.TempDir(), "nats-auth")
	users, err := natsdEnsure(credDir, dep)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA(dep.Name, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	source := func(name string, id pki.Identity) *pki.Source {
		id.Deployment = dep.Name
		f, err := ca.IssueFiles(certDir, name, id, []string{"127.0.0.1"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s, err := pki.Load(f)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	srv, url, err := natsd.Start(natsd.Config{Listen: "127.0.0.1:-1", StoreDir: t.TempDir(), Auth: users,
		TLS: source("nats", pki.Identity{Role: pki.RoleNATS}).ServerConfig()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()

	var f natsAuthFlags
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse([]string{"--nats-auth", credDir}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)

	sc, err := f.client(natsd.Identity{Role: natsd.RoleSidecar, Deployment: dep.Name, Model: "m"}, source("sidecar", pki.Identity{Role: pki.RoleSidecar, Model: "m"}))
	if err != nil {
		t.Fatal(err)
	}
	type opened struct {
		announce func() error
		err      error
	}
	done := make(chan opened, 1)
	go func() {
		co, nc, err := cluster.OpenCoordAuth(ctx, url, dep.Name, "sidecar m", sc, log)
		if err != nil {
			done <- opened{err: err}
			return
		}
		done <- opened{announce: func() error {
			defer nc.Close()
			return co.Announce(ctx, &hamsv1.DurabilityNotice{Model: "m", Epoch: 1, DurableSeq: 1})
		}}
	}()
	select {
	case o := <-done:
		t.Fatalf("sidecar opened the streams before the manager created them: %v", o.err)
	case <-time.After(300 * time.Millisecond): // still waiting, as it should
	}

	msrc := source("manager", pki.Identity{Role: pki.RoleManager})
	ma, err := f.managerAuth(dep.Name, msrc, true)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := manager.New(manager.Config{Deployment: dep, GRPCListener: lis, NATSURL: url, NATSAuth: ma, TLS: msrc, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(ctx)
	mdone := make(chan error, 1)
	go func() { mdone <- m.Run(mctx) }()
	defer func() {
		mcancel()
		if err := <-mdone; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatal(o.err)
		}
		if err := o.announce(); err != nil {
			t.Fatalf("announce: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("sidecar never bound the streams")
	}
	// Credentials of another deployment are refused before connecting.
	if _, _, err := cluster.OpenCoordAuth(ctx, url, "other", "x", sc, log); err == nil {
		t.Fatal("credentials of another deployment accepted")
	}
}

func natsdEnsure(dir string, dep *config.Deployment) (*natsd.Auth, error) {
	var models []string
	for _, m := range dep.Models {
		models = append(models, m.Name)
	}
	return natsd.EnsureCredentials(dir, dep.Name, models)
}
