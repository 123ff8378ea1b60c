package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/hams-go/hams/adapters/reference"
	"github.com/hams-go/hams/adapters/refserver"
	"github.com/hams-go/hams/frontend"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/manager"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/sidecar"
)

func runManager(args []string) error {
	rf := newRoleFlags("manager")
	natsURL := rf.fs.String("nats", "", "external NATS URL (JetStream enabled); empty starts an embedded nats-server")
	natsListen := rf.fs.String("nats-listen", manager.DefaultNATSListen, "client address of the embedded nats-server (port -1: random)")
	store := rf.fs.String("store", "", "JetStream store directory of the embedded server (empty: a temporary one)")
	hb := rf.fs.Duration("heartbeat-interval", manager.DefaultHeartbeatInterval, "heartbeat interval components are asked to keep")
	suspicion := rf.fs.Duration("suspicion-timeout", manager.DefaultSuspicionTimeout, "silence after which a component is declared dead")
	if err := rf.parse(args); err != nil {
		return err
	}
	r, err := setupRole("manager", rf)
	if err != nil {
		return err
	}
	m, err := manager.New(manager.Config{
		Deployment:        r.dep,
		GRPCListener:      r.grpc,
		NATSURL:           *natsURL,
		StoreDir:          *store,
		NATSListen:        *natsListen,
		HeartbeatInterval: *hb,
		SuspicionTimeout:  *suspicion,
		Logger:            r.log,
		Registry:          r.reg,
	})
	if err != nil {
		r.close()
		return &exitError{code: 2, err: err}
	}
	return r.serve(m.Run, m.Ready(), func() map[string]any {
		return map[string]any{"nats": m.NATSClientURL(), "deployment": r.dep.Name}
	})
}

func runModelServer(args []string) error {
	rf := newRoleFlags("modelserver")
	models := rf.fs.String("models", "", "comma-separated models of the deployment to host (required)")
	mgr := rf.fs.String("manager", "", "manager gRPC address to register with (optional)")
	if err := rf.parse(args); err != nil {
		return err
	}
	names := splitList(*models)
	if len(names) == 0 {
		return usageErr("modelserver: --models is required")
	}
	r, err := setupRole("modelserver", rf)
	if err != nil {
		return err
	}
	for _, n := range names {
		if r.dep.Model(n) == nil {
			r.close()
			return usageErr("modelserver: model %q is not in deployment %q", n, r.dep.Name)
		}
	}
	srv, err := refserver.New(refserver.Config{
		Deployment:   r.dep,
		Models:       names,
		GRPCListener: r.grpc,
		Logger:       r.log,
		Registry:     r.reg,
	})
	if err != nil {
		r.close()
		return &exitError{code: 2, err: err}
	}
	addr := r.grpc.Addr().String()
	var clients []*client.Client
	if *mgr != "" {
		for _, n := range names {
			c, err := client.New(client.Config{ManagerAddr: *mgr, Logger: r.log, Registration: &hamsv1.RegisterRequest{
				Kind: hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER, Id: "modelserver/" + n, Model: n,
				Address: addr, Pid: int32(os.Getpid()),
			}})
			if err != nil {
				r.close()
				return &exitError{code: 2, err: err}
			}
			clients = append(clients, c)
		}
	}
	r.fields["models"] = names
	return r.serve(func(ctx context.Context) error {
		g := newGroup(ctx)
		g.Go("refserver", srv.Run)
		for _, c := range clients {
			g.Go("manager client", c.Run)
		}
		return g.Wait()
	}, nil, nil)
}

func runSidecar(args []string) error {
	rf := newRoleFlags("sidecar")
	model := rf.fs.String("model", "", "model this sidecar fronts (required)")
	backend := rf.fs.String("backend", "", "backend gRPC address (default: the model's backend.address)")
	mgr := rf.fs.String("manager", "", "manager gRPC address (required)")
	if err := rf.parse(args); err != nil {
		return err
	}
	if *model == "" || *mgr == "" {
		return usageErr("sidecar: --model and --manager are required")
	}
	r, err := setupRole("sidecar", rf)
	if err != nil {
		return err
	}
	m := r.dep.Model(*model)
	if m == nil {
		r.close()
		return usageErr("sidecar: model %q is not in deployment %q", *model, r.dep.Name)
	}
	if *backend == "" {
		*backend = m.Backend.Address
	}
	if *backend == "" {
		r.close()
		return usageErr("sidecar: model %q has no backend.address; pass --backend", *model)
	}
	if m.Backend.Type != "reference" {
		r.close()
		return usageErr("sidecar: backend type %q is not implemented yet (only reference)", m.Backend.Type)
	}
	if r.dep.Mode != "bare" {
		r.log.Warn("replication is not implemented yet: this sidecar runs without fault tolerance (bare)", "mode", r.dep.Mode)
	}
	cc, err := grpcx.Dial(*backend, r.dep.Limits.MaxMessageBytes, fastReconnect)
	if err != nil {
		r.close()
		return err
	}
	defer cc.Close()
	be := reference.New(cc, m.Backend.Model, m.Backend.Timeout.D())
	roleV := hamsv1.Role_ROLE_ACTIVE
	if m.Stateful {
		roleV = hamsv1.Role_ROLE_PRIMARY
	}
	addr := r.grpc.Addr().String()
	mc, err := client.New(client.Config{ManagerAddr: *mgr, Logger: r.log, Registration: &hamsv1.RegisterRequest{
		Kind: hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR, Id: fmt.Sprintf("sidecar/%s/%s", *model, roleName(roleV)),
		Model: *model, Role: roleV, Address: addr, BackendAddress: *backend, Pid: int32(os.Getpid()),
	}})
	if err != nil {
		r.close()
		return &exitError{code: 2, err: err}
	}
	sc, err := sidecar.New(sidecar.Config{
		Deployment:   r.dep,
		Model:        *model,
		Backend:      be,
		Resolver:     mc,
		GRPCListener: r.grpc,
		Logger:       r.log,
		Registry:     r.reg,
	})
	if err != nil {
		r.close()
		return &exitError{code: 2, err: err}
	}
	r.fields["model"] = *model
	r.fields["backend"] = *backend
	return r.serve(func(ctx context.Context) error {
		g := newGroup(ctx)
		g.Go("sidecar", sc.Run)
		g.Go("manager client", mc.Run)
		return g.Wait()
	}, nil, nil)
}

// fastReconnect replaces grpc-go's reconnect backoff (1s base, up to 120s)
// so a sidecar finds its restarted model server within tens of ms.
var fastReconnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
	MinConnectTimeout: time.Second,
})

func roleName(r hamsv1.Role) string {
	switch r {
	case hamsv1.Role_ROLE_PRIMARY:
		return "primary"
	case hamsv1.Role_ROLE_BACKUP:
		return "backup"
	case hamsv1.Role_ROLE_STANDBY:
		return "standby"
	}
	return "active"
}

func runFrontend(args []string) error {
	rf := newRoleFlags("frontend")
	mgr := rf.fs.String("manager", "", "manager gRPC address (required)")
	httpAddr := rf.fs.String("http", "127.0.0.1:0", "HTTP/JSON API listen address")
	if err := rf.parse(args); err != nil {
		return err
	}
	if *mgr == "" {
		return usageErr("frontend: --manager is required")
	}
	r, err := setupRole("frontend", rf)
	if err != nil {
		return err
	}
	hl, err := r.listen(*httpAddr, "HTTP")
	if err != nil {
		return err
	}
	addr := r.grpc.Addr().String()
	mc, err := client.New(client.Config{ManagerAddr: *mgr, Logger: r.log, Registration: &hamsv1.RegisterRequest{
		Kind: hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND, Id: "frontend/" + addr, Address: addr, Pid: int32(os.Getpid()),
	}})
	if err != nil {
		r.close()
		hl.Close()
		return &exitError{code: 2, err: err}
	}
	fe, err := frontend.New(frontend.Config{
		Deployment:   r.dep,
		Resolver:     mc,
		GRPCListener: r.grpc,
		HTTPListener: hl,
		Logger:       r.log,
		Registry:     r.reg,
	})
	if err != nil {
		r.close()
		hl.Close()
		return &exitError{code: 2, err: err}
	}
	r.fields["http"] = hl.Addr().String()
	return r.serve(func(ctx context.Context) error {
		g := newGroup(ctx)
		g.Go("frontend", fe.Run)
		g.Go("manager client", mc.Run)
		return g.Wait()
	}, nil, nil)
}
