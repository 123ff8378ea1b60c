package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"gopkg.in/yaml.v3"

	"github.com/hams-go/hams/internal/agent"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/launch"
	"github.com/hams-go/hams/internal/natsd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager/client"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// ImplementedModes are the fault-tolerance modes this build runs.
var ImplementedModes = []string{"bare", "nspb", "remus", "nspb-s1", "nspb-s2", "replay"}

// DefaultMode is the mode of demo and up without --mode (docs/design.md).
const DefaultMode = "nspb"

// deployOptions configures startDeployment.
type Options struct {
	RunDir   string
	LogLevel string
	// Direct starts only the model servers (bench's direct mode).
	Direct bool
	Logger *slog.Logger
	// ReadyTimeout bounds the whole start (default 60s).
	ReadyTimeout time.Duration
	// SuspicionTimeout, if set, is passed to the manager (with a heartbeat
	// interval of a quarter of it).
	SuspicionTimeout time.Duration
	// Audit, if set, is the --audit directory of the frontend and the
	// sidecars (each writes under its own subdirectory).
	Audit string
	// NoSpares: no spare backups for replicated models (bench: the data
	// path does not use them).
	NoSpares bool
	// Frontends is the number of frontends (0: 2 in the protected modes,
	// 1 in bare). Several frontends share the JetStream request log.
	Frontends int
	// Managers is the number of managers, an active one and standbys
	// (0: 2 in the protected modes, 1 in bare).
	Managers int
	// RequestLog gives a lone frontend the request log too (several
	// frontends always have it): a frontend restarted in place then
	// completes what it accepted before it died.
	RequestLog bool
	// FrontendListen and FrontendHTTP, if set, are the gRPC and HTTP
	// listen addresses of the first frontend (a container publishes
	// them); the others, and every other component, take free loopback
	// ports.
	FrontendListen, FrontendHTTP string
	// Insecure runs every child with --insecure: internal RPCs in
	// plaintext without identities. Otherwise a CA and a certificate
	// per child are created under RunDir/certs.
	Insecure bool
	// NATS, if set, is the comma-separated client URLs of an external
	// NATS (cluster) every component uses; no `hams nats` is started.
	NATS string
	// NATSCluster, when more than 1, starts that many `hams nats` as one
	// JetStream cluster on loopback instead of a single one.
	NATSCluster int
	// NATSReplicas of the coordination streams and buckets (0: 3 with
	// several NATS URLs, else 1; NATSReplicas).
	NATSReplicas int
	// Dashboard, if set, is the first manager's --dashboard address; the
	// others serve theirs on a free port of the same host.
	Dashboard string
	// TraceArgs are the tracing flags every child gets (--otlp, --trace-ratio;
	// empty: tracing off).
	TraceArgs []string
}

// Counts returns the number of frontends and managers opt asks for in a
// deployment of mode.
func (opt Options) Counts(mode string) (frontends, managers int) {
	protected := config.Mode(mode).Protected()
	frontends, managers = opt.Frontends, opt.Managers
	if frontends <= 0 {
		frontends = 1
		if protected {
			frontends = 2
		}
	}
	if managers <= 0 {
		managers = 1
		if protected {
			managers = 2
		}
	}
	return frontends, managers
}

// autoSuspicion is the manager's failure-suspicion timeout for the
// deployments started here. This process supervises every instance and
// reports a process that exits to the managers at once (reportExit), so
// heartbeats only have to catch what a supervisor cannot see (a hung
// process, a lost host): they can wait long enough that scheduling delays
// of a loaded small machine (a 64 MiB learner, 20 processes on 2 cores)
// are not taken for failures, which the manager's 70 ms default is not.
const autoSuspicion = time.Second

// Deployment is a running set of child processes.
type Deployment struct {
	Config     *config.Deployment
	cfgPath    string
	Supervisor *launch.Supervisor
	Log        *slog.Logger

	// Manager is the first manager's gRPC address (the active one at
	// start), Managers all of them.
	Manager  string
	Managers []string
	// Dashboards are the managers' dashboard addresses (opt.Dashboard).
	Dashboards []string
	NATS       string
	// FrontendGRPC and FrontendHTTP are the first frontend's addresses;
	// Frontends and FrontendHTTPs list every frontend's, in start order
	// (child frontend:i is Frontends[i]).
	FrontendGRPC  string
	FrontendHTTP  string
	Frontends     []string
	FrontendHTTPs []string
	// FrontendInternals are the frontends' internal addresses (Dataplane,
	// Replication), in the same order: the topology names the frontends
	// by these, never by their client addresses.
	FrontendInternals []string
	// pki issues the children's certificates (nil: --insecure).
	pki *deployPKI
	// natsAuth is the NATS credentials directory (nkey seeds per role,
	// users.json; empty: --insecure).
	natsAuth string
	// startedPools are the pooled models whose instances this process
	// started (with certificates).
	startedPools map[string]bool
	// ModelServers maps each model to its (primary) model server address.
	ModelServers map[string]string
	// BackupServers maps each replicated model to its backup's model server.
	BackupServers map[string]string

	opt        Options
	common     []string
	agent      *agent.Server
	ManagerSet *managerSet
	closing    atomic.Bool

	mu    sync.Mutex
	insts []*instance
	byID  map[string]*instance // by sidecar component id
	next  int                  // instances started for recovery so far
}

// ChildRole is the role of a supervised child process, the ROLE of a
// --kill ROLE[:MODEL] target and the first part of a child's name.
type ChildRole string

// Roles of supervised children: the control plane (NATS, managers,
// frontends), a model's primary (or only) sidecar and model server, a
// replicated model's backup pair, and a standby pair.
const (
	RoleNATS              ChildRole = "nats"
	RoleManager           ChildRole = "manager"
	RoleFrontend          ChildRole = "frontend"
	RoleSidecar           ChildRole = "sidecar"
	RoleModelServer       ChildRole = "modelserver"
	RoleBackupSidecar     ChildRole = "backup-sidecar"
	RoleBackupModelServer ChildRole = "backup-modelserver"
	RoleStandbySidecar    ChildRole = "standby-sidecar"
	RoleStandbyModelSrv   ChildRole = "standby-modelserver"
)

// ControlPlane reports whether r is a process of the control plane (NATS,
// a manager, a frontend): it belongs to no model.
func (r ChildRole) ControlPlane() bool {
	return r == RoleNATS || r == RoleManager || r == RoleFrontend
}

// Numbered reports whether r's children are numbered (manager:0,
// frontend:1) rather than named by model.
func (r ChildRole) Numbered() bool { return r == RoleManager || r == RoleFrontend }

// Names of the supervised children.
func ChildName(role ChildRole, model string) string {
	if model == "" {
		return string(role)
	}
	return string(role) + ":" + model
}

// WriteDeployment writes the effective deployment for the children.
func WriteDeployment(dep *config.Deployment, path string) error {
	b, err := yaml.Marshal(dep)
	if err != nil {
		return fmt.Errorf("encode deployment: %w", err)
	}
	if _, err := config.Parse(b); err != nil {
		return fmt.Errorf("effective deployment does not validate: %w", err)
	}
	return os.WriteFile(path, b, 0o644)
}

// startDeployment starts the manager (embedded NATS), one instance (a
// sidecar, and a reference model server unless the model has a backend
// address) per model, a second one (the backup) per replicated stateful
// model and, in the fault-tolerant modes, a hot standby per stateless
// model, then a frontend, and waits until the manager's topology lists
// them all. On error everything started is stopped.
//
// Who restarts what (see instances.go): in bare mode no protocol recovers
// anything, so every child is restarted in place. In the other modes a
// model's instances are never restarted in place: the manager fails over
// to the backup or standby and asks this process's instance agent (the
// manager's --starter) for a new backup or standby; a model server and
// its sidecar fail together (one instance). The manager and the frontend
// are restarted in place in every mode.
func Start(ctx context.Context, dep *config.Deployment, opt Options) (_ *Deployment, err error) {
	if opt.ReadyTimeout <= 0 {
		opt.ReadyTimeout = 60 * time.Second
	}
	if opt.LogLevel == "" {
		opt.LogLevel = "info"
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(opt.RunDir, 0o755); err != nil {
		return nil, fmt.Errorf("create run dir: %w", err)
	}
	d := &Deployment{Config: dep, cfgPath: filepath.Join(opt.RunDir, "deployment.yaml"), Log: opt.Logger, ModelServers: map[string]string{},
		BackupServers: map[string]string{}, opt: opt, byID: map[string]*instance{}}
	if err := WriteDeployment(dep, d.cfgPath); err != nil {
		return nil, err
	}
	d.Supervisor, err = launch.New(launch.Config{RunDir: filepath.Join(opt.RunDir, "logs"), Logger: opt.Logger, ReadyTimeout: 30 * time.Second, Grace: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, opt.ReadyTimeout)
	defer cancel()
	d.common = []string{"--config", d.cfgPath, "--log-level", opt.LogLevel, "--metrics", "127.0.0.1:0"} // free metrics ports: many of one role per host (the roles' defaults are fixed)
	// --otlp, --trace-ratio when set (cmd/hams tracing.go sets them).
	d.common = append(d.common, opt.TraceArgs...)
	d.startedPools = map[string]bool{}
	if opt.Insecure {
		d.Log.Warn("INSECURE: internal RPCs run in plaintext without identities or authorization (--insecure)")
	} else if d.pki, err = newDeployPKI(filepath.Join(opt.RunDir, "certs"), dep.Name); err != nil {
		return nil, fmt.Errorf("deployment certificates: %w", err)
	}

	for i := range dep.Models {
		m := &dep.Models[i]
		switch ext := ExternalAddr(m); {
		case ext != "" && dep.HasBackup(m) && !opt.Direct:
			// TODO(config): a backend.backup_address field would let an
			// external stateful backend have its backup instance.
			return nil, fmt.Errorf("model %q: a replicated stateful model (mode %s) needs a second backend instance for its backup, and backend.address names only one; run it with --mode bare or leave the address out (the deployment then starts a backend per instance)", m.Name, dep.Mode)
		case ext != "":
			d.ModelServers[m.Name] = ext
		}
	}
	if opt.Direct {
		// Backends only (bench's direct chain).
		var mu sync.Mutex
		err = Parallel(SortedModels(dep), func(m string) error {
			if d.ModelServers[m] != "" {
				return nil
			}
			name := ChildName(RoleModelServer, m)
			args, key, err := d.backendArgsFor(dep.Model(m), name, false)
			if err != nil {
				return err
			}
			r, err := d.Supervisor.Start(ctx, launch.Spec{Name: name, Args: args, Restart: backendRestart(args, key)})
			if err != nil {
				return fmt.Errorf("start %s: %w", name, err)
			}
			mu.Lock()
			d.ModelServers[m] = r.String(key)
			mu.Unlock()
			return nil
		})
		return d, err
	}
	if err := d.startPassThrough(ctx); err != nil {
		return nil, err
	}
	if err := d.startPools(ctx); err != nil {
		return nil, err
	}
	if d.Protected() {
		if d.agent, err = newAgent(d); err != nil {
			return nil, err
		}
	}
	nFrontends, nManagers := opt.Counts(dep.Mode)
	// The coordination engine first, as a process of its own: it outlives
	// the managers (a manager kill loses no durability or completion
	// notice, and the standby finds the deployment state where it was).
	if err := d.startNATS(ctx); err != nil {
		return nil, err
	}
	mgrCommon := append(slices.Clone(d.common), append([]string{"--nats", d.NATS, "--nats-replicas", strconv.Itoa(NATSReplicas(d.NATS, opt.NATSReplicas))}, d.natsAuthArgs()...)...)
	if opt.SuspicionTimeout > 0 {
		mgrCommon = append(mgrCommon, "--suspicion-timeout", opt.SuspicionTimeout.String(), "--heartbeat-interval", (opt.SuspicionTimeout / 4).String())
	}
	if d.agent != nil {
		mgrCommon = append(mgrCommon, "--starter", d.agent.URL())
	}
	// Managers one after the other: the first takes the lease and is the
	// active one; the others stand by.
	for i := range nManagers {
		name := ChildName("manager", strconv.Itoa(i))
		ta, err := d.tlsArgs(name, pki.Identity{Role: pki.RoleManager, Instance: strconv.Itoa(i)})
		if err != nil {
			return nil, err
		}
		common := append(append(slices.Clone(mgrCommon), ta...), dashboardArgs(opt.Dashboard, i)...)
		r, err := d.Supervisor.Start(ctx, launch.Spec{
			Name:    name,
			Args:    append([]string{"manager", "--id", ManagerID(i, 1, nManagers)}, common...),
			Restart: restartManager(i, nManagers, common),
		})
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		d.Managers = append(d.Managers, r.String("grpc"))
		if a := r.String("dashboard"); a != "" {
			d.Dashboards = append(d.Dashboards, a)
		}
	}
	d.Manager = d.Managers[0]
	if d.ManagerSet, err = dialManagers(d.Managers, d.pki.supervisorSource()); err != nil {
		return nil, err
	}
	var insts []instSpec
	for i, m := range dep.Models {
		if !hasSidecar(dep, &dep.Models[i]) {
			continue
		}
		insts = append(insts, instSpec{model: m.Name, role: config.RolePrimary})
		if dep.HasBackup(&dep.Models[i]) {
			insts = append(insts, instSpec{model: m.Name, role: config.RoleBackup})
			if dep.Replicated(&dep.Models[i]) && !opt.NoSpares {
				// A spare backup: a lost backup (or one promoted) is
				// replaced at once, without starting processes.
				insts = append(insts, instSpec{model: m.Name, role: config.RoleStandby})
			}
		} else if d.Protected() && dep.HasStandby(m.Name) {
			insts = append(insts, instSpec{model: m.Name, role: config.RoleStandby})
		}
	}
	// Spares start after the serving instances: a sender's incarnation is
	// taken from the clock when its sidecar starts, and a receiver refuses
	// an incarnation older than the one it has seen on the edge, so a
	// standby promoted without new senders must be the younger one.
	var mu sync.Mutex
	for _, phase := range []func(instSpec) bool{
		func(is instSpec) bool { return is.role == config.RolePrimary },
		func(is instSpec) bool { return is.role != config.RolePrimary },
	} {
		errs := make([]error, len(insts))
		var wg sync.WaitGroup
		for i, is := range insts {
			if !phase(is) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				in, err := d.startInstance(ctx, is.model, is.role, 0, 1)
				if err != nil {
					errs[i] = err
					return
				}
				mu.Lock()
				switch is.role {
				case config.RolePrimary:
					d.ModelServers[is.model] = in.BackendAddr
				case config.RoleBackup:
					d.BackupServers[is.model] = in.BackendAddr
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	}
	if err := d.startFrontends(ctx, nFrontends, opt.RequestLog || nFrontends > 1); err != nil {
		return nil, err
	}
	// A frontend's exit goes to the managers at once (managers.go).
	d.ManagerSet.watchExits(d.Supervisor, d.frontendIDOf, d.Log)
	if err := d.waitTopology(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

type instSpec struct {
	model string
	role  config.Role
}

// relisten restarts a child on the addresses it had (so clients configured
// with them find it again); extra names an additional address flag.
func relisten(args []string, extra string) func(launch.Ready) []string {
	return func(last launch.Ready) []string {
		out := append([]string(nil), args...)
		if a := last.String("grpc"); a != "" {
			out = append(out, "--listen", a)
		}
		if a := last.String("metrics"); a != "" {
			out = append(out, "--metrics", a)
		}
		if extra != "" {
			if a := last.String(extra); a != "" {
				out = append(out, "--"+extra, a)
			}
		}
		return out
	}
}

// ManagerID names manager i's process of generation gen in the lease. A
// lone manager keeps one id, so restarted in place it takes its lease
// back at once; with standbys every process gets its own, so a restarted
// manager stands by and a standby takes over (the lease moves once).
func ManagerID(i, gen, n int) string {
	if n == 1 {
		return "manager-0"
	}
	return fmt.Sprintf("manager-%d.%d", i, gen)
}

// restartManager restarts manager i on its gRPC address.
func restartManager(i, n int, common []string) func(launch.Ready) []string {
	return func(last launch.Ready) []string {
		args := append([]string{"manager", "--id", ManagerID(i, last.Generation+1, n)}, common...)
		return relisten(args, "dashboard")(last)
	}
}

// managerList is the --manager value of the components: every manager,
// the components follow the active one.
func (d *Deployment) managerList() string { return strings.Join(d.Managers, ",") }

// startFrontends starts n frontends (children frontend:0..n-1, restarted
// in place on their addresses), with the request log when withLog.
func (d *Deployment) startFrontends(ctx context.Context, n int, withLog bool) error {
	d.Frontends = make([]string, n)
	d.FrontendHTTPs = make([]string, n)
	d.FrontendInternals = make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append([]string{"frontend", "--manager", d.managerList(), "--name", fmt.Sprintf("frontend-%d", i)}, d.common...)
			ta, err := d.tlsArgs(ChildName("frontend", strconv.Itoa(i)), pki.Identity{Role: pki.RoleFrontend, Instance: strconv.Itoa(i)})
			if err != nil {
				errs[i] = err
				return
			}
			args = append(args, ta...)
			if withLog {
				args = append(args, "--request-log")
				if !d.Config.Coordinated() {
					args = append(append(args, "--nats", d.NATS), d.natsAuthArgs()...)
				}
			}
			args = append(args, d.coordArgs("", d.opt.Audit)...)
			if i == 0 && d.opt.FrontendListen != "" {
				args = append(args, "--listen", d.opt.FrontendListen)
			}
			if i == 0 && d.opt.FrontendHTTP != "" {
				args = append(args, "--http", d.opt.FrontendHTTP)
			}
			name := ChildName("frontend", strconv.Itoa(i))
			restart := relisten(args, "http")
			r, err := d.Supervisor.Start(ctx, launch.Spec{Name: name, Args: args, Restart: func(last launch.Ready) []string {
				out := restart(last)
				if a := last.String("internal"); a != "" {
					out = append(out, "--internal-listen", a)
				}
				return out
			}})
			if err != nil {
				errs[i] = fmt.Errorf("start %s: %w", name, err)
				return
			}
			d.Frontends[i], d.FrontendHTTPs[i], d.FrontendInternals[i] = r.String("grpc"), r.String("http"), r.String("internal")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	d.FrontendGRPC, d.FrontendHTTP = d.Frontends[0], d.FrontendHTTPs[0]
	return nil
}

// Parallel runs f for every item concurrently and joins the errors.
func Parallel(items []string, f func(string) error) error {
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	for i, it := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(it)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitTopology polls the manager until every model resolves to a live
// sidecar, has its backup or standby, and the frontend is registered.
func (d *Deployment) waitTopology(ctx context.Context) error {
	var missing []string
	for {
		t, err := d.ManagerSet.topology(ctx)
		if err == nil {
			missing = d.Missing(t)
			for _, f := range d.FrontendInternals {
				if !slices.Contains(t.GetFrontends(), f) {
					missing = append(missing, "frontend "+f)
				}
			}
			if len(missing) == 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("deployment not ready (topology lacks %s; last error %v): %w", strings.Join(missing, ", "), err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Missing lists what t lacks for full redundancy: a live serving instance
// per model, a live backup per replicated model and (fault-tolerant
// modes) a live standby per stateless model.
func (d *Deployment) Missing(t *hamsv1.Topology) []string {
	var out []string
	for i, m := range d.Config.Models {
		if !hasSidecar(d.Config, &d.Config.Models[i]) {
			continue
		}
		if _, _, ok := client.Resolve(t, m.Name); !ok {
			out = append(out, m.Name)
		}
		switch {
		case d.Config.HasBackup(&d.Config.Models[i]):
			if !hasRole(t, m.Name, hamsv1.Role_ROLE_BACKUP) {
				out = append(out, m.Name+" (backup)")
			}
			if d.Config.Replicated(&d.Config.Models[i]) && !d.opt.NoSpares && !hasRole(t, m.Name, hamsv1.Role_ROLE_STANDBY) {
				out = append(out, m.Name+" (spare backup)")
			}
		case d.Protected() && d.Config.HasStandby(m.Name):
			if !hasRole(t, m.Name, hamsv1.Role_ROLE_STANDBY) {
				out = append(out, m.Name+" (standby)")
			}
		}
	}
	return out
}

// hasRole reports whether t has a live sidecar of model in role.
func hasRole(t *hamsv1.Topology, model string, role hamsv1.Role) bool {
	for _, p := range t.GetPlacements() {
		if p.GetModel() == model && p.GetRole() == role && p.GetAlive() && p.GetSidecarAddress() != "" {
			return true
		}
	}
	return false
}

// SidecarMetrics returns model -> metrics address of the running primary
// (or only) sidecars.
func (d *Deployment) SidecarMetrics() map[string]string {
	return d.metricsOf(RoleSidecar)
}

// metricsOf returns model -> metrics address of the running children of
// role (roleSidecar, roleBackupSidecar, ...).
func (d *Deployment) metricsOf(role ChildRole) map[string]string {
	out := map[string]string{}
	for _, m := range d.Config.Models {
		if r, ok := d.Supervisor.Ready(ChildName(role, m.Name)); ok && r.String("metrics") != "" {
			out[m.Name] = r.String("metrics")
		}
	}
	return out
}

// Close stops every child and waits for them.
func (d *Deployment) Close() error {
	d.closing.Store(true)
	if d.agent != nil {
		d.agent.Close()
	}
	var err error
	if d.Supervisor != nil {
		err = d.Supervisor.Close()
	}
	if d.ManagerSet != nil {
		d.ManagerSet.close()
	}
	return err
}

// CompatEndpoints probes the frontend for the TF Serving and KServe v2
// services: an address is returned only for a service the frontend serves
// (an unregistered service answers Unimplemented).
func CompatEndpoints(ctx context.Context, addr string) (tfserving, kserve string) {
	cc, err := grpcx.Dial(addr, 0)
	if err != nil {
		return "", ""
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	served := func(err error) bool {
		return status.Code(err) != codes.Unimplemented && status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded
	}
	_, err = tfapis.NewPredictionServiceClient(cc).GetModelMetadata(ctx, &tfapis.GetModelMetadataRequest{})
	if served(err) {
		tfserving = addr
	}
	_, err = inference.NewGRPCInferenceServiceClient(cc).ServerLive(ctx, &inference.ServerLiveRequest{})
	if served(err) {
		kserve = addr
	}
	return tfserving, kserve
}

// hostPort reports whether s is a host:port.
func hostPort(s string) bool {
	_, _, err := net.SplitHostPort(s)
	return err == nil
}

// SortedModels returns the model names of dep, sorted.
func SortedModels(dep *config.Deployment) []string {
	var out []string
	for _, m := range dep.Models {
		out = append(out, m.Name)
	}
	sort.Strings(out)
	return out
}

func SuspicionFor(flag time.Duration) time.Duration {
	if flag > 0 {
		return flag
	}
	return autoSuspicion
}

// startNATS starts the coordination engine and sets d.NATS: nothing with
// opt.NATS (an external cluster: its URLs), opt.NATSCluster nodes of a
// JetStream cluster on loopback, or one `hams nats`. Each node is
// restarted in place (its client and route ports, its store) when it
// dies. Secured (not --insecure): nkey users per role with subject
// permissions (natsd.Permissions), mutual TLS on the client port and on
// the routes (natsd.RouteTLS: a route's peer must hold a NATS server
// certificate of the deployment). An external cluster must admit the
// users of RunDir/nats-auth and trust RunDir/certs' CA
// (docs/coordination.md).
func (d *Deployment) startNATS(ctx context.Context) error {
	opt := d.opt
	if d.pki != nil {
		d.natsAuth = filepath.Join(opt.RunDir, "nats-auth")
		if _, err := natsd.EnsureCredentials(d.natsAuth, d.Config.Name, SortedModels(d.Config)); err != nil {
			return fmt.Errorf("NATS credentials: %w", err)
		}
	}
	if opt.NATS != "" {
		d.NATS = opt.NATS
		d.Log.Info("external NATS", "nats", d.NATS, "replicas", NATSReplicas(d.NATS, opt.NATSReplicas))
		return nil
	}
	nodes := max(opt.NATSCluster, 1)
	var routes []string
	var routePorts []string
	if nodes > 1 {
		// Route ports first: every node is given every route.
		ports, err := freeLoopbackPorts(nodes)
		if err != nil {
			return fmt.Errorf("NATS cluster route ports: %w", err)
		}
		for _, p := range ports {
			routePorts = append(routePorts, "127.0.0.1:"+strconv.Itoa(p))
			routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(p))
		}
	}
	urls := make([]string, nodes)
	errs := make([]error, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		name, store := ChildName("nats", ""), filepath.Join(opt.RunDir, "jetstream")
		var cluster []string
		if nodes > 1 {
			name, store = ChildName("nats", strconv.Itoa(i)), filepath.Join(opt.RunDir, "jetstream-"+strconv.Itoa(i))
			cluster = []string{"--name", "hams-nats-" + strconv.Itoa(i), "--cluster", routePorts[i], "--routes", strings.Join(routes, ",")}
		}
		sec := []string{"--insecure"}
		if d.pki != nil {
			ta, err := d.tlsArgs(name, pki.Identity{Role: pki.RoleNATS, Instance: strconv.Itoa(i)})
			if err != nil {
				return err
			}
			sec = append([]string{"--nats-auth", d.natsAuth}, ta...)
		}
		args := func(listen string) []string {
			a := append([]string{"nats", "--listen", listen, "--store", store, "--log-level", opt.LogLevel}, cluster...)
			return append(a, sec...)
		}
		wg.Go(func() {
			r, err := d.Supervisor.Start(ctx, launch.Spec{Name: name, Args: args("127.0.0.1:-1"), Restart: func(last launch.Ready) []string {
				listen := "127.0.0.1:-1"
				if u, err := url.Parse(last.String("nats")); err == nil && u.Host != "" {
					listen = u.Host
				}
				return args(listen)
			}})
			if err != nil {
				errs[i] = fmt.Errorf("start %s: %w", name, err)
				return
			}
			urls[i] = r.String("nats")
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	d.NATS = strings.Join(urls, ",")
	return nil
}

// freeLoopbackPorts reserves n loopback TCP ports (listen, note, close).
func freeLoopbackPorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
