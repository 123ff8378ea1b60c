package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/hams-go/hams/adapters"
	"github.com/hams-go/hams/frontend"
	"github.com/hams-go/hams/internal/agent"
	"github.com/hams-go/hams/internal/authz"
	"github.com/hams-go/hams/internal/cluster"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/harness"
	"github.com/hams-go/hams/internal/natsd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/refserver"
	"github.com/hams-go/hams/sidecar"
)

func runManager(args []string) error {
	rf := newRoleFlags("manager")
	natsURL := rf.fs.String("nats", "", "external NATS URL (JetStream enabled); empty starts an embedded nats-server")
	natsListen := rf.fs.String("nats-listen", manager.DefaultNATSListen, "client address of the embedded nats-server (port -1: random)")
	store := rf.fs.String("store", "", "JetStream store directory of the embedded server (empty: a temporary one)")
	hb := rf.fs.Duration("heartbeat-interval", manager.DefaultHeartbeatInterval, "heartbeat interval components are asked to keep")
	suspicion := rf.fs.Duration("suspicion-timeout", manager.DefaultSuspicionTimeout, "silence after which a component is declared dead")
	starter := rf.fs.String("starter", "", "URL of the instance agent that starts new backups and standbys for recovery (POST, see starter.go); empty: recovery cannot restore redundancy")
	id := rf.fs.String("id", "", "name of this manager in the active-manager lease (default <hostname>@<gRPC address>, so a manager restarted on its address takes its lease back at once)")
	var na natsAuthFlags
	na.register(rf.fs)
	leaseTTL := rf.fs.Duration("lease-ttl", manager.DefaultLeaseTTL, "active-manager lease lifetime (a standby manager takes over after this much silence)")
	dashAddr := rf.fs.String("dashboard", "", "serve the live, read-only dashboard (plain HTTP) on this address, e.g. 127.0.0.1:8080 (empty: none; docs/dashboard.md)")
	if err := rf.parse(args); err != nil {
		return err
	}
	r, err := setupRole("manager", rf)
	if err != nil {
		return err
	}
	nauth, err := na.managerAuth(r.dep.Name, r.tls, *natsURL != "")
	if err != nil {
		r.close()
		return err
	}
	var st manager.InstanceStarter
	if *starter != "" {
		hs, err := agent.NewClient(*starter, r.tls)
		if err != nil {
			r.close()
			return harness.Usagef("manager: --starter: %v", err)
		}
		st = hs
	}
	if *id == "" {
		host, _ := os.Hostname()
		*id = host + "@" + r.grpc.Addr().String()
	}
	dash, err := newManagerDashboard(*dashAddr, r.log)
	if err != nil {
		r.close()
		return err
	}
	m, err := manager.New(manager.Config{
		Events:            dash.sink(),
		Starter:           st,
		ID:                *id,
		LeaseTTL:          *leaseTTL,
		Deployment:        r.dep,
		GRPCListener:      r.grpc,
		NATSURL:           *natsURL,
		KVReplicas:        na.replicasFor(*natsURL),
		StoreDir:          *store,
		NATSListen:        *natsListen,
		HeartbeatInterval: *hb,
		SuspicionTimeout:  *suspicion,
		Logger:            r.log,
		Registry:          r.reg,
		TLS:               r.tls,
		NATSAuth:          nauth,
	})
	var run func(context.Context) error
	if err == nil {
		run, err = dash.run(m, r.dep, *id, r.log)
	}
	if err != nil {
		dash.close()
		r.close()
		return &harness.ExitError{Code: 2, Err: err}
	}
	return r.serve(run, m.Ready(), func() map[string]any {
		f := map[string]any{"nats": m.NATSClientURL(), "deployment": r.dep.Name}
		if a := dash.addr(); a != "" {
			f["dashboard"] = a
		}
		return f
	})
}

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
	if *instance != "primary" && *instance != "backup" && *instance != "standby" {
		return harness.Usagef("modelserver: --role %q: want primary, backup or standby", *instance)
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
			if *instance != "primary" {
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

func runSidecar(args []string) error {
	rf := newRoleFlags("sidecar")
	model := rf.fs.String("model", "", "model this sidecar fronts (required)")
	backend := rf.fs.String("backend", "", "backend address (default: the model's backend.address)")
	mgr := rf.fs.String("manager", "", "manager gRPC address (required; comma-separated for an active manager and standbys: the sidecar follows the active one)")
	roleF := rf.fs.String("role", sidecar.RolePrimary, "instance role: primary (the serving instance; ACTIVE for a stateless model), backup (a replicated stateful model's backup: serves Replication, applies snapshots; in mode replay the model's idle spare, which replays the input log when promoted) or standby (a stateless model's hot standby: registered STANDBY, promoted by the manager)")
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
	standby := *roleF == "standby"
	if *roleF != sidecar.RolePrimary && *roleF != sidecar.RoleBackup && !standby {
		return harness.Usagef("sidecar: --role %q: want %s, %s or standby", *roleF, sidecar.RolePrimary, sidecar.RoleBackup)
	}
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
	if *roleF == sidecar.RoleBackup && !repl && !spare {
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
	switch {
	case standby && m.Stateful:
		// A spare backup: a backup that follows no primary until the
		// manager makes it one (after a failover or a lost backup),
		// registered STANDBY so no primary ships to it before.
		roleV = hamsv1.Role_ROLE_STANDBY
		*roleF = sidecar.RoleBackup
		standby = false
	case standby:
		// A hot standby runs the primary request path; it takes traffic
		// once the manager promotes it (the topology then resolves the
		// model to it).
		roleV = hamsv1.Role_ROLE_STANDBY
		*roleF = sidecar.RolePrimary
	case *roleF == sidecar.RoleBackup:
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
		Role:           *roleF,
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
		co, nc, err := cluster.OpenCoordReplicas(ctx, *natsURL, na.replicasFor(*natsURL), r.dep.Name, "sidecar "+*model+" "+*roleF, cl, r.log)
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
	mgr := rf.fs.String("manager", "", "manager gRPC address (required; comma-separated for an active manager and standbys: the frontend follows the active one)")
	httpAddr := rf.fs.String("http", "127.0.0.1:0", "HTTP/JSON API listen address")
	internalAddr := rf.fs.String("internal-listen", "", "internal gRPC listen address (Dataplane, Replication: the sidecars and the manager call it; it is the address registered in the topology); default: the host of --listen (loopback when that is a wildcard), a free port")
	natsURL := rf.fs.String("nats", "", "NATS URL of the coordination engine; required when the deployment replicates a stateful model, and with --request-log")
	var na natsAuthFlags
	na.register(rf.fs)
	audit := rf.fs.String("audit", "", "directory for JSONL audit logs (<dir>/<name>/replies.jsonl)")
	name := rf.fs.String("name", "", "name of this frontend in completion notices and its audit subdirectory (default frontend)")
	requestLog := rf.fs.Bool("request-log", false, "log every accepted request and record every answer in JetStream before it is released (needs --nats): several frontends then share the deployment, a surviving one completes what a dead one accepted, and a retried request_id gets the same reply on any frontend")
	if err := rf.parse(args); err != nil {
		return err
	}
	if *mgr == "" {
		return harness.Usagef("frontend: --manager is required")
	}
	if *requestLog && *natsURL == "" {
		return harness.Usagef("frontend: --request-log needs --nats (the log lives in JetStream)")
	}
	r, err := setupRole("frontend", rf)
	if err != nil {
		return err
	}
	hl, err := r.listen(*httpAddr, "HTTP")
	if err != nil {
		return err
	}
	if *internalAddr == "" {
		*internalAddr = internalListenDefault(r.grpc.Addr())
	}
	il, err := r.listen(*internalAddr, "internal gRPC")
	if err != nil {
		hl.Close()
		return err
	}
	closeAll := func() {
		r.close()
		hl.Close()
		il.Close()
	}
	// The topology names the frontend by its internal address: the sink
	// models' sidecars Forward to it, the manager calls Resend there.
	addr := il.Addr().String()
	mc, err := client.New(client.Config{ManagerAddrs: cluster.SplitList(*mgr), Logger: r.log, DialOptions: r.dialOpts(), Registration: &hamsv1.RegisterRequest{
		Kind: hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND, Id: "frontend/" + addr, Address: addr, Pid: int32(os.Getpid()), MetricsAddress: r.metricsAddr(),
	}})
	if err != nil {
		closeAll()
		return &harness.ExitError{Code: 2, Err: err}
	}
	fcfg := frontend.Config{
		Deployment:       r.dep,
		Resolver:         mc,
		GRPCListener:     r.grpc,
		InternalListener: il,
		HTTPListener:     hl,
		Logger:           r.log,
		Registry:         r.reg,
		Name:             *name,
		AuditDir:         *audit,
		Address:          addr,
		DialOptions:      r.dialOpts(),
	}
	if r.tls != nil {
		// The internal port: mutual TLS, and only the sink models'
		// sidecars may Forward, only managers Resend (internal/authz).
		self := r.tls.Identity()
		if self.Role != pki.RoleFrontend {
			closeAll()
			return harness.Usagef("frontend: certificate %v is not a frontend's", self)
		}
		az, err := authz.New(authz.Config{Self: self, Facts: authz.NewGraphFacts(r.dep, config.Frontend), Logger: r.log})
		if err != nil {
			closeAll()
			return &harness.ExitError{Code: 2, Err: err}
		}
		fcfg.InternalServerOptions = append([]grpc.ServerOption{grpcx.ServerTLS(r.tls)}, az.ServerOptions()...)
	}
	if r.dep.ClientAuth != nil {
		if fcfg.ClientAuth, err = frontend.NewClientAuth(r.dep.ClientAuth, r.log); err != nil {
			closeAll()
			return &harness.ExitError{Code: 2, Err: err}
		}
	}
	if r.dep.Coordinated() || *requestLog {
		if *natsURL == "" {
			closeAll()
			return harness.Usagef("frontend: deployment %q replicates stateful models (mode %s): --nats is required", r.dep.Name, r.dep.Mode)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cl, err := na.client(natsd.Identity{Role: natsd.RoleFrontend, Deployment: r.dep.Name}, r.tls)
		if err != nil {
			cancel()
			closeAll()
			return err
		}
		co, nc, err := cluster.OpenCoordReplicas(ctx, *natsURL, na.replicasFor(*natsURL), r.dep.Name, "frontend", cl, r.log)
		cancel()
		if err != nil {
			closeAll()
			return err
		}
		defer nc.Close()
		fcfg.Coord = co
		if *requestLog {
			fcfg.Log = co
		}
	}
	fe, err := frontend.New(fcfg)
	if err != nil {
		closeAll()
		return &harness.ExitError{Code: 2, Err: err}
	}
	r.fields["http"] = hl.Addr().String()
	r.fields["internal"] = addr
	return r.serve(func(ctx context.Context) error {
		g := newGroup(ctx)
		g.Go("frontend", fe.Run)
		g.Go("manager client", mc.Run)
		return g.Wait()
	}, nil, nil)
}

// internalListenDefault is the frontend's default --internal-listen: the
// host of its client gRPC address (loopback when that is a wildcard: the
// address is registered in the topology, where a wildcard cannot be
// dialed, and it is never offered beyond the host by default), a free
// port.
func internalListenDefault(client net.Addr) string {
	host := "127.0.0.1"
	if ta, ok := client.(*net.TCPAddr); ok && ta.IP != nil && !ta.IP.IsUnspecified() {
		host = ta.IP.String()
	}
	return net.JoinHostPort(host, "0")
}
