package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/launch"
	"github.com/hams-go/hams/internal/shm"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// instance is one model instance: a sidecar and, for reference models
// without a backend address, its own model server. The two fail together
// (in the protected modes, the survivor of a pair is killed): they stand
// for one host of the paper's deployment.
type instance struct {
	Model string
	Role  config.Role // as started
	N     int         // 0 for the initial instances, then 1, 2, ... per deployment
	// ID is the sidecar's component id at the manager.
	ID          string
	Sidecar     string // child names
	ModelServer string // "" when the backend is external
	// ModelServerID is the model server's component id ("" when it does
	// not register).
	ModelServerID string
	SidecarAddr   string
	BackendAddr   string
	Epoch         uint64
	StartedAt     time.Time
}

// Protected reports whether the deployment's mode recovers failed model
// instances (every mode but bare): then instances are not restarted in
// place and stateless models get a hot standby.
func (d *Deployment) Protected() bool { return d.Config.RunMode().Protected() }

// instanceNames returns the child names of the sidecar and model server
// of an instance.
func instanceNames(model string, role config.Role, n int) (sc, ms string) {
	var scRole, msRole ChildRole
	switch role {
	case config.RoleBackup:
		scRole, msRole = RoleBackupSidecar, RoleBackupModelServer
	case config.RoleStandby:
		scRole, msRole = RoleStandbySidecar, RoleStandbyModelSrv
	default:
		scRole, msRole = RoleSidecar, RoleModelServer
	}
	sc, ms = ChildName(scRole, model), ChildName(msRole, model)
	if n > 0 {
		suf := "." + strconv.Itoa(n)
		sc, ms = sc+suf, ms+suf
	}
	return sc, ms
}

// coordArgs are the --nats and --audit flags of a sidecar of model (or of
// the frontend when model is ""); audit is the directory to use. In a
// coordinated deployment every sidecar gets --nats: replicated ones
// announce and watch durability, all of them watch completion notices to
// trim what their senders keep for resends.
func (d *Deployment) coordArgs(model, audit string) []string {
	var out []string
	if d.NATS != "" && d.Config.Coordinated() {
		out = append(append(out, "--nats", d.NATS), d.natsAuthArgs()...)
	}
	if audit != "" {
		out = append(out, "--audit", audit)
	}
	return out
}

// startInstance starts one instance of model in role (n > 0: an instance
// asked for by recovery) registered at epoch, and returns once its sidecar
// printed its ready line.
func (d *Deployment) startInstance(ctx context.Context, model string, role config.Role, n int, epoch uint64) (*instance, error) {
	m := d.Config.Model(model)
	if m == nil {
		return nil, fmt.Errorf("start instance: model %q is not in the deployment", model)
	}
	switch role {
	case config.RoleBackup:
		if !d.Config.HasBackup(m) {
			return nil, fmt.Errorf("start instance: model %q has no backup in mode %s", model, d.Config.Mode)
		}
	case config.RoleStandby:
		if m.Stateful && !d.Config.Replicated(m) {
			return nil, fmt.Errorf("start instance: stateful model %q is not replicated in mode %s: it has no spare backup", model, d.Config.Mode)
		}
	case config.RolePrimary:
	default:
		return nil, fmt.Errorf("start instance: role %q is not primary, backup or standby", role)
	}
	in := &instance{Model: model, Role: role, N: n, Epoch: epoch, BackendAddr: ExternalAddr(m)}
	in.Sidecar, in.ModelServer = instanceNames(model, role, n)
	inPlace := !d.Protected()
	if in.BackendAddr == "" {
		args, key, err := d.backendArgsFor(m, in.ModelServer, false)
		if err != nil {
			return nil, err
		}
		if m.Backend.Type != "clipper" {
			in.ModelServerID = "modelserver/" + model + "/" + role.String() + suffix(n)
			args = append(args, "--role", role.String(), "--manager", d.managerList(), "--id", in.ModelServerID)
		}
		spec := launch.Spec{Name: in.ModelServer, Args: args, NoRestart: !inPlace}
		if inPlace {
			spec.Restart = backendRestart(args, key)
		}
		r, err := d.Supervisor.Start(ctx, spec)
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", in.ModelServer, err)
		}
		in.BackendAddr = r.String(key)
	} else {
		in.ModelServer = ""
	}
	in.ID = "sidecar/" + model + "/" + role.String() + suffix(n)
	audit := d.opt.Audit
	if audit != "" {
		// One directory per instance: two instances of a model never
		// append to one file.
		audit = filepath.Join(audit, shm.KeyPart(in.Sidecar))
	}
	args := append([]string{"sidecar", "--model", model, "--role", role.String(), "--id", in.ID, "--epoch", strconv.FormatUint(epoch, 10),
		"--backend", in.BackendAddr, "--manager", d.managerList()}, d.common...)
	args = append(args, d.coordArgs(model, audit)...)
	ta, err := d.tlsArgs(in.Sidecar, SidecarIdentity(model, in.Sidecar))
	if err != nil {
		return nil, err
	}
	args = append(append(args, ta...), d.backendTLSArgs(m)...)
	r, err := d.Supervisor.Start(ctx, launch.Spec{Name: in.Sidecar, Args: args, NoRestart: !inPlace})
	if err != nil {
		if in.ModelServer != "" {
			_, _ = d.Supervisor.Kill(in.ModelServer, syscall.SIGKILL)
		}
		return nil, fmt.Errorf("start %s: %w", in.Sidecar, err)
	}
	in.SidecarAddr = r.String("grpc")
	in.StartedAt = time.Now()
	d.mu.Lock()
	d.insts = append(d.insts, in)
	d.byID[in.ID] = in
	d.mu.Unlock()
	if !inPlace {
		// Ends when either process of the instance exits (at the latest
		// when the supervisor stops them all).
		go d.pair(in)
	}
	return in, nil
}

func suffix(n int) string {
	if n == 0 {
		return ""
	}
	return "/" + strconv.Itoa(n)
}

// pair makes an instance's sidecar and model server fail together: when
// one exits, the other is killed (the model server loses no state the
// protocol needs: the instance is replaced as a whole).
//
// An instance without a model server of its own (a backend at an address,
// a replica pool) is watched too: its sidecar's exit is reported at once
// instead of after the heartbeat suspicion timeout.
func (d *Deployment) pair(in *instance) {
	sc := d.Supervisor.Done(in.Sidecar)
	if sc == nil {
		return
	}
	var ms <-chan struct{} // nil (never ready) without a model server
	if in.ModelServer != "" {
		if ms = d.Supervisor.Done(in.ModelServer); ms == nil {
			return
		}
	}
	select {
	case <-sc:
		if !d.closing.Load() {
			if in.ModelServer != "" {
				_, _ = d.Supervisor.Kill(in.ModelServer, syscall.SIGKILL)
			}
			d.reportExit(in, "sidecar process exited")
		}
	case <-ms:
		if !d.closing.Load() {
			_, _ = d.Supervisor.Kill(in.Sidecar, syscall.SIGKILL)
			d.reportExit(in, "model server process exited")
		}
	}
}

// reportExit tells the managers that an instance's process ended: the
// supervisor sees a crash at once, where heartbeats need the suspicion
// timeout (the role a kubelet's pod watch plays under Kubernetes). Only
// the active manager acts on it.
func (d *Deployment) reportExit(in *instance, why string) {
	if d.ManagerSet == nil || in.ID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	d.ManagerSet.reportFailure(ctx, &hamsv1.FailureReport{Reporter: "supervisor", Suspect: in.ID, Model: in.Model, Reason: why, Exited: true})
	if in.ModelServer != "" && in.ModelServerID != "" {
		d.ManagerSet.reportFailure(ctx, &hamsv1.FailureReport{Reporter: "supervisor", Suspect: in.ModelServerID, Model: in.Model, Reason: why, Exited: true})
	}
}

// startForRecovery is the instance agent's action: a new instance of model
// in role (backup or standby), registered at the model's current epoch.
func (d *Deployment) startForRecovery(ctx context.Context, model string, role config.Role) (*instance, error) {
	if d.closing.Load() {
		return nil, errors.New("deployment is stopping")
	}
	if !role.Spare() {
		return nil, fmt.Errorf("role %q: recovery starts only backups and standbys", role)
	}
	t, err := d.ManagerSet.topology(ctx)
	if err != nil {
		return nil, fmt.Errorf("read topology: %w", err)
	}
	epoch := uint64(1)
	for _, p := range t.GetPlacements() {
		if p.GetModel() == model {
			epoch = max(epoch, p.GetEpoch())
		}
	}
	d.mu.Lock()
	d.next++
	n := d.next
	d.mu.Unlock()
	in, err := d.startInstance(ctx, model, role, n, epoch)
	if err != nil {
		return nil, err
	}
	d.Log.Info("instance started for recovery", "model", model, "role", role, "sidecar", in.Sidecar, "epoch", epoch)
	return in, nil
}

// Topology asks the managers for the current topology.
func (d *Deployment) Topology(ctx context.Context) (*hamsv1.Topology, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return d.ManagerSet.topology(ctx)
}

// resolvedTarget is a kill target resolved against the current topology.
type resolvedTarget struct {
	Child string // supervised child to signal
	Kind  string // primary, backup, stateless, standby, manager, frontend
	Inst  *instance
	// Index is the manager's or frontend's number (child manager:i,
	// frontend:i), -1 for model instances.
	Index int
	// Note says what the process was doing (the active manager, the
	// leading frontend).
	Note string
}

// resolveControl resolves a manager or frontend kill: index "" means the
// active manager or the leading frontend (the one the topology names
// first: it receives the sink edges and injects every request), a number
// that process.
func (d *Deployment) resolveControl(ctx context.Context, role ChildRole, index string) (resolvedTarget, error) {
	n := len(d.Managers)
	if role == RoleFrontend {
		n = len(d.Frontends)
	}
	i := -1
	if index != "" {
		v, err := strconv.Atoi(index)
		if err != nil || v < 0 || v >= n {
			return resolvedTarget{}, fmt.Errorf("%s:%s: no such %s (0..%d)", role, index, role, n-1)
		}
		i = v
	}
	lead := -1
	switch role {
	case "manager":
		lead = d.ManagerSet.ActiveIndex(ctx)
	case "frontend":
		if t, err := d.Topology(ctx); err == nil && len(t.GetFrontends()) > 0 {
			lead = slices.Index(d.FrontendInternals, t.GetFrontends()[0])
		}
	}
	if i < 0 {
		if lead < 0 {
			what := map[ChildRole]string{RoleManager: "no manager is active", RoleFrontend: "no frontend leads"}[role]
			return resolvedTarget{}, fmt.Errorf("%s: %s now", role, what)
		}
		i = lead
	}
	rt := resolvedTarget{Child: ChildName(role, strconv.Itoa(i)), Kind: string(role), Index: i}
	switch {
	case i == lead && role == RoleManager:
		rt.Note = "active"
	case i == lead:
		rt.Note = "leading"
	case role == RoleManager:
		rt.Note = "standby"
	default:
		rt.Note = "follower"
	}
	return rt, nil
}

// ResolveTarget maps a --kill role and model to the child that plays it
// now: sidecar/modelserver name the model's serving instance (primary or
// active), backup-* its live backup, standby-* its live standby.
func (d *Deployment) ResolveTarget(ctx context.Context, role ChildRole, model string) (resolvedTarget, error) {
	switch role {
	case RoleManager, RoleFrontend:
		return d.resolveControl(ctx, role, model)
	case "nats":
		return resolvedTarget{Child: ChildName("nats", ""), Kind: "nats", Index: -1}, nil
	}
	t, err := d.Topology(ctx)
	if err != nil {
		return resolvedTarget{}, fmt.Errorf("resolve %s:%s: %w", role, model, err)
	}
	var want []hamsv1.Role
	switch role {
	case RoleSidecar, RoleModelServer:
		want = []hamsv1.Role{hamsv1.Role_ROLE_PRIMARY, hamsv1.Role_ROLE_ACTIVE}
	case RoleBackupSidecar, RoleBackupModelServer:
		want = []hamsv1.Role{hamsv1.Role_ROLE_BACKUP}
	case RoleStandbySidecar, RoleStandbyModelSrv:
		want = []hamsv1.Role{hamsv1.Role_ROLE_STANDBY}
	default:
		return resolvedTarget{}, fmt.Errorf("unknown kill role %q", role)
	}
	var best *hamsv1.Placement
	for _, p := range t.GetPlacements() {
		if p.GetModel() != model || !p.GetAlive() || p.GetSidecarAddress() == "" {
			continue
		}
		for _, w := range want {
			if p.GetRole() == w && (best == nil || p.GetEpoch() > best.GetEpoch() ||
				(p.GetEpoch() == best.GetEpoch() && p.GetComponentId() < best.GetComponentId())) {
				best = p
			}
		}
	}
	if best == nil {
		return resolvedTarget{}, fmt.Errorf("%s:%s: no live instance in that role now", role, model)
	}
	d.mu.Lock()
	in := d.byID[best.GetComponentId()]
	d.mu.Unlock()
	if in == nil {
		return resolvedTarget{}, fmt.Errorf("%s:%s: instance %s was not started by this process", role, model, best.GetComponentId())
	}
	rt := resolvedTarget{Child: in.Sidecar, Inst: in, Index: -1}
	switch role {
	case RoleModelServer, RoleBackupModelServer, RoleStandbyModelSrv:
		if in.ModelServer == "" {
			return resolvedTarget{}, fmt.Errorf("%s:%s: the model's backend is external (no model server of ours)", role, model)
		}
		rt.Child = in.ModelServer
	}
	switch best.GetRole() {
	case hamsv1.Role_ROLE_PRIMARY:
		rt.Kind = "primary"
	case hamsv1.Role_ROLE_ACTIVE:
		rt.Kind = "stateless"
	case hamsv1.Role_ROLE_BACKUP:
		rt.Kind = "backup"
	case hamsv1.Role_ROLE_STANDBY:
		rt.Kind = "standby"
	}
	return rt, nil
}

// instancesNow returns the instances started so far.
func (d *Deployment) instancesNow() []*instance {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*instance(nil), d.insts...)
}

// AliveID reports whether component id is alive in t.
func AliveID(t *hamsv1.Topology, id string) bool {
	for _, p := range t.GetPlacements() {
		if p.GetComponentId() == id {
			return p.GetAlive()
		}
	}
	return false
}
