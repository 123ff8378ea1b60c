package main

import (
	"context"
	"os"

	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver"
)

// runModelServer is `hams modelserver`: its flags, then the library call that does the work.
func runModelServer(args []string) error {
	rf := newRoleFlags("modelserver")
	models := rf.fs.String("models", "", "comma-separated models of the deployment to host (required)")
	mgr := rf.fs.String("manager", "", "manager gRPC address to register with (optional; comma-separated for an active manager and standbys)")
	instance := rf.fs.String("role", "primary", "instance role registered with the manager: primary, backup (the backup replica of stateful models) or standby (a stateless model's hot standby)")
	idF := rf.fs.String("id", "", "component id registered with the manager (default modelserver/<model>[/<role>])")
	straggle := rf.fs.String("straggle", "", "make this server a seeded straggler (fault injection), e.g. seed=7,period=200ms,fraction=0.2,delay=40ms,jitter=5ms,freeze=false")
	parityOf := rf.fs.String("parity-of", "", "host the parity model of this replica-pool model (its parity.model, parity.kind and parity.params) instead of --models")
	if err := rf.parse(args); err != nil {
		return err
	}
	var straggleCfg *refserver.StraggleConfig
	if *straggle != "" {
		sc, err := refserver.ParseStraggle(*straggle)
		if err != nil {
			return harness.Usagef("modelserver: --straggle: %v", err)
		}
		straggleCfg = &sc
	}
	instRole, err := config.ParseRole(*instance)
	if err != nil || instRole == config.RoleActive {
		return harness.Usagef("modelserver: --role %q: want %s, %s or %s", *instance, config.RolePrimary, config.RoleBackup, config.RoleStandby)
	}
	names := cluster.SplitList(*models)
	if len(names) == 0 {
		return harness.Usagef("modelserver: --models is required")
	}
	r, err := setupRole("modelserver", rf)
	if err != nil {
		return err
	}
	for _, n := range names {
		if r.dep.Model(n) == nil {
			r.close()
			return harness.Usagef("modelserver: model %q is not in deployment %q", n, r.dep.Name)
		}
	}
	if *parityOf != "" {
		m := r.dep.Model(*parityOf)
		if m == nil || m.Parity == nil {
			r.close()
			return harness.Usagef("modelserver: --parity-of %q: no model of deployment %q with a parity block", *parityOf, r.dep.Name)
		}
		pms, err := cluster.ParityModelsOf(m)
		if err != nil {
			r.close()
			return harness.Usagef("modelserver: --parity-of: %v", err)
		}
		// The parity models live in this process's copy of the deployment
		// only (they are no node of any service graph).
		names = nil
		for _, pm := range pms {
			r.dep.Models = append(r.dep.Models, pm)
			names = append(names, pm.Name)
		}
	}
	srv, err := refserver.New(refserver.Config{
		Deployment:   r.dep,
		Models:       names,
		GRPCListener: r.grpc,
		Logger:       r.log,
		Registry:     r.reg,
		Straggle:     straggleCfg,
		TLS:          r.tls,
	})
	if err != nil {
		r.close()
		return &harness.ExitError{Code: 2, Err: err}
	}
	addr := r.grpc.Addr().String()
	var clients []*client.Client
	if *mgr != "" {
		for _, n := range names {
			// Model servers register without a role: recovery works on
			// sidecars, and the manager's recovery takes any live BACKUP
			// placement of a model for a new backup to sync (a model
			// server has no sidecar address to sync).
			id, role := "modelserver/"+n, hamsv1.Role_ROLE_UNSPECIFIED
			if instRole != config.RolePrimary {
				id += "/" + *instance
			}
			if *idF != "" {
				id = *idF
				if len(names) > 1 {
					id += "/" + n
				}
			}
			c, err := client.New(client.Config{ManagerAddrs: cluster.SplitList(*mgr), Logger: r.log, DialOptions: r.dialOpts(), Registration: &hamsv1.RegisterRequest{
				Kind: hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER, Id: id, Model: n, Role: role,
				Address: addr, Pid: int32(os.Getpid()), MetricsAddress: r.metricsAddr(),
			}})
			if err != nil {
				r.close()
				return &harness.ExitError{Code: 2, Err: err}
			}
			clients = append(clients, c)
		}
	}
	r.fields["models"] = names
	r.fields["instance"] = *instance
	return r.serve(func(ctx context.Context) error {
		g := newGroup(ctx)
		g.Go("refserver", srv.Run)
		for _, c := range clients {
			g.Go("manager client", c.Run)
		}
		return g.Wait()
	}, nil, nil)
}
