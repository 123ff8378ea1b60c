package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/hams-go/hams/adapters"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/internal/natsd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/sidecar"
)

// runSidecar is `hams sidecar`: its flags, then the library call that does the work.
func runSidecar(args []string) error {
	rf := newRoleFlags("sidecar")
	model := rf.fs.String("model", "", "model this sidecar fronts (required)")
	backend := rf.fs.String("backend", "", "backend address (default: the model's backend.address)")
	mgr := rf.fs.String("manager", "", "manager gRPC address (required; comma-separated for an active manager and standbys: the sidecar follows the active one)")
	roleF := rf.fs.String("role", config.RolePrimary.String(), "instance role: primary (the serving instance; ACTIVE for a stateless model), backup (a replicated stateful model's backup: serves Replication, applies snapshots; in mode replay the model's idle spare, which replays the input log when promoted) or standby (a stateless model's hot standby: registered STANDBY, promoted by the manager)")
	idF := rf.fs.String("id", "", "component id registered with the manager (default sidecar/<model>/<role>); every instance of a model needs its own")
	natsURL := rf.fs.String("nats", "", "NATS URL of the coordination engine (the manager's ready line has it); required for a replicated stateful model and for a stateful model in mode replay (input log, checkpoints)")
	var na natsAuthFlags
	na.register(rf.fs)
	audit := rf.fs.String("audit", "", "directory for JSONL audit logs (a backup writes <dir>/<model>-backup-<instance id>/durable.jsonl)")
	epoch := rf.fs.Uint64("epoch", 0, "epoch of this instance, stamped on snapshots and durability notices")
	outLog := rf.fs.Int64("output-log-bytes", 0, "bound of a replicated primary's output log (0: the sidecar's default)")
	backendTLS := rf.fs.Bool("backend-tls", false, "dial the backend (a `hams modelserver` with certificates, or a replica pool's instances) with this sidecar's internal mutual TLS")
	healthEvery := rf.fs.Duration("health-interval", sidecar.DefaultHealthInterval, "how often the backend's health is checked; in a protected mode a backend unhealthy for 3 checks in a row (and at least 1 s) after it was once healthy stops the sidecar so the manager fails it over (negative: no checks)")
	if err := rf.parse(args); err != nil {
		return err
	}
	if *model == "" || *mgr == "" {
		return harness.Usagef("sidecar: --model and --manager are required")
	}
	role, err := config.ParseRole(*roleF)
	if err != nil || role == config.RoleActive {
		return harness.Usagef("sidecar: --role %q: want %s, %s or %s", *roleF, config.RolePrimary, config.RoleBackup, config.RoleStandby)
	}
	standby := role == config.RoleStandby
	if *outLog < 0 {
		return harness.Usagef("sidecar: --output-log-bytes must not be negative")
	}
	r, err := setupRole("sidecar", rf)
	if err != nil {
		return err
	}
	m := r.dep.Model(*model)
	if m == nil {
		r.close()
		return harness.Usagef("sidecar: model %q is not in deployment %q", *model, r.dep.Name)
	}
	repl := r.dep.Replicated(m)
	spare := r.dep.Replays(m)
	if standby && m.Stateful && !repl {
		r.close()
		return harness.Usagef("sidecar: --role standby: stateful model %q is not replicated in mode %s: it has no spare backup", *model, r.dep.Mode)
	}
	if role == config.RoleBackup && !repl && !spare {
		r.close()
		return harness.Usagef("sidecar: --role backup: model %q is not replicated in mode %s (stateful %v, ha %s)", *model, r.dep.Mode, m.Stateful, m.HA)
	}
	if (repl || spare) && *natsURL == "" {
		r.close()
		return harness.Usagef("sidecar: model %q is replicated (mode %s): --nats is required", *model, r.dep.Mode)
	}
	if *backend == "" {
		*backend = m.Backend.Address
	}
	if m.Pooled() && len(m.Replicas.Addresses) > 0 {
		// Registered as the backend address: the pool's first replica
		// (the manager wants one host:port; the log names them all).
		*backend = m.Replicas.Addresses[0]
		r.fields["pool"] = cluster.PoolSummary(m)
	}
	if *backend == "" {
		r.close()
		return harness.Usagef("sidecar: model %q has no backend.address; pass --backend", *model)
	}
	r.log = r.log.With("instance", *roleF)
	var beTLS *pki.Source
	if *backendTLS {
		if r.tls == nil {
			r.close()
			return harness.Usagef("sidecar: --backend-tls needs this sidecar's certificate (--tls-cert ...), not --insecure")
		}
		beTLS = r.tls
	}
	var be sidecar.Backend
	var closeBE func()
	var runPool func(context.Context) error
	if m.Pooled() {
		be, runPool, closeBE, err = adapters.NewPool(r.dep, m, *roleF, r.log.With("model", *model), r.reg, beTLS)
	} else {
		be, closeBE, err = adapters.New(r.dep, m, *backend, *roleF, r.log.With("model", *model), beTLS)
	}
	if err != nil {
		r.close()
		return &harness.ExitError{Code: 2, Err: err}
	}
	defer closeBE()
	roleV := hamsv1.Role_ROLE_ACTIVE
	scRole := role // the sidecar's: primary or backup
	switch {
	case standby && m.Stateful:
		// A spare backup: a backup that follows no primary until the
		// manager makes it one (after a failover or a lost backup),
		// registered STANDBY so no primary ships to it before.
		roleV = hamsv1.Role_ROLE_STANDBY
		scRole = config.RoleBackup
		standby = false
	case standby:
		// A hot standby runs the primary request path; it takes traffic
		// once the manager promotes it (the topology then resolves the
		// model to it).
		roleV = hamsv1.Role_ROLE_STANDBY
		scRole = config.RolePrimary
	case role == config.RoleBackup:
		roleV = hamsv1.Role_ROLE_BACKUP
	case m.Stateful:
		roleV = hamsv1.Role_ROLE_PRIMARY
	}
	addr := r.grpc.Addr().String()
	if *idF == "" {
		*idF = fmt.Sprintf("sidecar/%s/%s", *model, roleName(roleV))
	}
	mc, err := client.New(client.Config{ManagerAddrs: cluster.SplitList(*mgr), Logger: r.log, DialOptions: r.dialOpts(), Registration: &hamsv1.RegisterRequest{
		Kind: hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR, Id: *idF,
		Model: *model, Role: roleV, Address: addr, BackendAddress: *backend, Pid: int32(os.Getpid()), MetricsAddress: r.metricsAddr(),
	}})
	if err != nil {
		r.close()
		return &harness.ExitError{Code: 2, Err: err}
	}
	cfg := sidecar.Config{
		Deployment:     r.dep,
		Model:          *model,
		Backend:        be,
		Resolver:       mc,
		GRPCListener:   r.grpc,
		Logger:         r.log,
		Registry:       r.reg,
		Role:           scRole,
		AuditDir:       *audit,
		ID:             *idF,
		Epoch:          *epoch,
		OutputLogBytes: *outLog,
		Standby:        standby,
		HealthInterval: *healthEvery,
		TLS:            r.tls,
	}
	// Every sidecar given --nats watches completion notices (so what its
	// senders keep for resends is trimmed); replicated ones also announce
	// and watch durability.
	if *natsURL != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cl, err := na.client(natsd.Identity{Role: natsd.RoleSidecar, Deployment: r.dep.Name, Model: *model}, r.tls)
		if err != nil {
			cancel()
			r.close()
			return err
		}
		co, nc, err := cluster.OpenCoordReplicas(ctx, *natsURL, na.replicasFor(*natsURL), r.dep.Name, "sidecar "+*model+" "+scRole.String(), cl, r.log)
		cancel()
		if err != nil {
			r.close()
			return err
		}
		defer nc.Close()
		cfg.Coord = co
		if spare {
			// Replay mode: the input log and checkpoints (JetStream).
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			store, err := co.OpenReplay(ctx, na.replicasFor(*natsURL))
			cancel()
			if err != nil {
				r.close()
				return err
			}
			cfg.Replay = store
		}
	}
	if repl {
		cfg.BackupResolver = mc
	}
	sc, err := sidecar.New(cfg)
	if err != nil {
		r.close()
		return &harness.ExitError{Code: 2, Err: err}
	}
	r.fields["model"] = *model
	r.fields["backend"] = *backend
	r.fields["instance"] = roleName(roleV)
	r.fields["id"] = *idF
	return r.serve(func(ctx context.Context) error {
		g := newGroup(ctx)
		if runPool != nil {
			g.Go("replica pool", runPool)
		}
		g.Go("sidecar", sc.Run)
		g.Go("manager client", mc.Run)
		return g.Wait()
	}, nil, nil)
}

// roleName names the role registered (never unspecified: an instance
// that is none of the others is active).
func roleName(r hamsv1.Role) string {
	if r == hamsv1.Role_ROLE_UNSPECIFIED {
		return config.RoleActive.String()
	}
	return config.RoleFromProto(r).String()
}
