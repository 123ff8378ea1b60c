package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/soheilhy/cmux"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/authz"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/hamsmd"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protocol/nspb"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Backend is the model server a sidecar drives; adapters implement it.
type Backend interface {
	Describe(ctx context.Context) (*hamsv1.ModelDescription, error)
	Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error)
	Health(ctx context.Context) error
	Close() error
}

// ConcurrentBackend is a Backend that runs several batches at once and
// may answer them out of order (a replica pool, sidecar/pool). A stateless
// model's sidecar then runs Concurrency() executors; seqs follow the order
// in which batches finish. Stateful and replay models ignore it.
type ConcurrentBackend interface {
	Backend
	Concurrency() int
}

// Resolver finds live instances (implemented by manager/client.Client).
type Resolver interface {
	// Resolve returns the dataplane gRPC address of the live instance that
	// receives traffic for model (or for config.Frontend), and its epoch.
	Resolve(model string) (addr string, epoch uint64, ok bool)
	// Changed is closed (and replaced) whenever the topology changes.
	Changed() <-chan struct{}
}

// ErrConfig is wrapped by every configuration error of New.
var ErrConfig = errors.New("sidecar: invalid config")

// Config of a sidecar.
type Config struct {
	Deployment   *config.Deployment
	Model        string
	Backend      Backend
	Resolver     Resolver
	GRPCListener net.Listener // serves hamsv1.Dataplane (primary) and hamsv1.Replication
	Logger       *slog.Logger
	Registry     *prometheus.Registry

	// Role is config.RolePrimary (default) or config.RoleBackup. A
	// backup sidecar sits next to its own model server instance, serves
	// only Replication (snapshots from the primary) and applies them
	// (Algorithm 2).
	Role config.Role
	// Coord carries durability and completion notices; required for a
	// replicated stateful model (stateful, ha stateful, mode not bare).
	Coord Coord
	// BackupResolver finds the backup of this model; required for the
	// primary of a replicated stateful model.
	BackupResolver BackupResolver
	// AuditDir, when set, receives AuditDir/<model>-backup-<instance>/durable.jsonl
	// from a backup, <instance> being ID (made file-name safe) or, without
	// one, the process id: every instance writes a file of its own.
	AuditDir string
	// ID names this instance (the component id registered with the
	// manager); optional. Each instance of a model needs its own.
	ID string
	// Epoch of this instance, stamped on snapshots and durability notices.
	Epoch uint64
	// Standby: a stateless model's hot standby (role primary, not
	// serving yet). It holds nothing for resends until it is promoted,
	// so it watches completion notices only from its promotion on.
	Standby bool
	// OutputLogBytes bounds the outputs a replicated primary keeps until
	// their requests complete (default DefaultOutputLogBytes); when full,
	// no new batch starts until completion notices free space.
	OutputLogBytes int64
	// ShipHook, when set, runs on a primary's shipper before each snapshot
	// is sent (batch is the snapshot's id, which the backup's durability
	// notices name); it may block until ctx ends. Fault injection (a
	// delayed state delivery) and tests.
	ShipHook func(ctx context.Context, batch uint64)
	// Replay is the input log and checkpoint store of a stateful model in
	// mode replay (replay.go); required there.
	Replay ReplayStore
	// BackendLostAfter: in a protected mode, how long the backend may stay
	// unreachable (gRPC Unavailable) while a batch is held and retried
	// before the sidecar stops so the manager fails the instance over
	// (default DefaultBackendLostAfter).
	BackendLostAfter time.Duration
	// HealthInterval: how often the backend's Health is checked
	// (health.go; default DefaultHealthInterval, negative: never). In a
	// protected mode a backend unhealthy for BackendLostAfter and
	// healthFailures checks in a row stops the sidecar (fail-stop).
	HealthInterval time.Duration
	// TLS, when set, secures every internal hop of this sidecar with
	// mutual TLS under its certificate: the gRPC port (callers verified
	// and authorized by identity, internal/authz), out-edges, snapshot
	// shipments and the bulk stream. Its identity must be a sidecar of
	// Model. Nil: plaintext (--insecure).
	TLS *pki.Source
	// Now is the clock request deadlines are checked on (default
	// time.Now). Deadlines arrive as the time left and become deadlines on
	// this clock; no other host's clock is ever compared with it.
	Now func() time.Time
}

// AnyInput is the declared input name that accepts every tensor of a request.
const AnyInput = tensor.AnyInput

const (
	inboxSize      = 4096
	maxWaitingJoin = 4096
	describeRetry  = 50 * time.Millisecond
	stopGrace      = 50 * time.Millisecond
	// muxSniffTimeout bounds the wait for a new connection's first bytes.
	muxSniffTimeout = 10 * time.Second
)

// Sidecar is one model's proxy.
type Sidecar struct {
	cfg Config
	// host is what the role stages get of the sidecar (host.go): the
	// sidecar's own code reads those shared parts through it too.
	host       *sidecarHost
	log        *slog.Logger
	model      *config.Model
	service    string
	succs      []string
	maxMsg     int
	metrics    *metrics
	serverOpts []grpc.ServerOption
	// authz decides who may call this sidecar (nil: plaintext, no
	// identities).
	authz *authz.Authorizer

	receiver *edge.Receiver
	// out is the sending end of the request path (outedges.go): the
	// out-edges, failing a request, fan-out.
	out *outEdges

	// intake is the inbox and the loop that joins and batches what
	// arrives (intake.go); nil without a Resolver (no data path).
	intake *intake

	// exec runs the serving stages' batches on the backend (executor.go);
	// backend is how they meet an unreachable one (backendloss.go).
	exec    *executor
	backend *backendPolicy

	done chan struct{} // closed when Run's context ends
	// collecting is closed once this instance may hold items for resends
	// (at once, or at a standby's promotion): the completion watch starts.
	collecting chan struct{}
	collectMu  sync.Once
	started    atomic.Bool

	graph *config.Graph
	idx   *lineageIndex
	// epochV is the epoch recovery assigned to this instance.
	epochV atomic.Uint64

	// roleMu serialises role transitions; mu guards role and the Run
	// context fields.
	roleMu  sync.Mutex
	mu      sync.Mutex
	stage   Stage
	stopped bool
	fatal   func(error)
	// healthInterval: Config.HealthInterval or its default (<0: off).
	healthInterval time.Duration
	// health is the grpc.health.v1 server of the sidecar's port (health.go).
	health *health.Server

	// State manager (replicated stateful models only).
	role       config.Role // guarded by mu once Run started
	mode       nspb.Mode
	replicated bool          // stateful, ha stateful, mode not bare
	outlog     *OutputLog    // primary: released outputs; backup: applied outputs
	prim       *primaryState // a replicated primary's role (primary.go)
	bk         *backupState
	rp         *replayState // mode replay (stateful, ha stateful)
}

// New validates cfg and builds the sidecar (no I/O).
func New(cfg Config) (*Sidecar, error) {
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf("%w: "+f, append([]any{ErrConfig}, a...)...)) }
	if cfg.Deployment == nil {
		bad("no deployment")
	}
	if cfg.Backend == nil {
		bad("no backend")
	}
	role := cfg.Role
	if role == "" {
		role = config.RolePrimary
	}
	if role != config.RolePrimary && role != config.RoleBackup {
		bad("role %q is neither %s nor %s", cfg.Role, config.RolePrimary, config.RoleBackup)
	}
	if cfg.Resolver == nil && role == config.RolePrimary {
		bad("no resolver")
	}
	if cfg.OutputLogBytes < 0 {
		bad("negative output log bound %d", cfg.OutputLogBytes)
	}
	if cfg.BackendLostAfter < 0 {
		bad("negative backend loss timeout %v", cfg.BackendLostAfter)
	}
	if cfg.GRPCListener == nil {
		bad("no gRPC listener")
	}
	if cfg.Deployment != nil {
		switch m := cfg.Deployment.Model(cfg.Model); {
		case cfg.Model == "":
			bad("no model")
		case m == nil:
			bad("model %q is not in deployment %q", cfg.Model, cfg.Deployment.Name)
		case cfg.Deployment.ServiceOf(cfg.Model) == nil:
			bad("model %q belongs to no service", cfg.Model)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	mode, replicated, sbe, err := replicationOf(cfg, role)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("model", cfg.Model)
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := cfg.Deployment.Model(cfg.Model)
	svc := cfg.Deployment.ServiceOf(cfg.Model)
	g := svc.Graph()
	s := &Sidecar{
		cfg: cfg, log: log, model: m, service: svc.Name, succs: g.Succ(cfg.Model),
		maxMsg:  cfg.Deployment.Limits.MaxMessageBytes,
		metrics: newMetrics(reg, cfg.Model),
		done:    make(chan struct{}), collecting: make(chan struct{}),
		role: role, mode: mode, replicated: replicated,
		healthInterval: cfg.HealthInterval,
	}
	s.host = &sidecarHost{cfg: &s.cfg, log: log, metrics: s.metrics, maxMsg: s.maxMsg, epochV: &s.epochV, sbe: sbe}
	s.out = &outEdges{model: cfg.Model, log: log, metrics: s.metrics, clock: cfg.Now}
	s.backend = &backendPolicy{h: s.host, protected: mode != nspb.Bare || cfg.Deployment.RunMode().Replays(), lostAfter: cfg.BackendLostAfter}
	if s.backend.lostAfter == 0 {
		s.backend.lostAfter = DefaultBackendLostAfter
	}
	executors := 1
	if cb, ok := cfg.Backend.(ConcurrentBackend); ok && !m.Stateful {
		executors = max(cb.Concurrency(), 1)
	}
	if s.healthInterval == 0 {
		s.healthInterval = DefaultHealthInterval
	}
	if !cfg.Standby || replicated {
		s.startCollecting()
	}
	if replicated {
		stateful := func(name string) bool {
			mm := cfg.Deployment.Model(name)
			return mm != nil && mm.Stateful && mm.HA == "stateful"
		}
		pfm, nfm := nspb.StatefulNeighbours(g, stateful)
		s.host.pfm, s.host.nfm = pfm[cfg.Model], nfm[cfg.Model]
		limit := cfg.OutputLogBytes
		if limit == 0 {
			limit = DefaultOutputLogBytes
		}
		s.outlog = NewOutputLog(limit)
		s.host.outlog = s.outlog
	}
	grpcM := grpcx.NewServerMetrics(reg)
	s.serverOpts = grpcx.ServerOptions(log, grpcM, s.maxMsg)
	if cfg.TLS != nil {
		self := cfg.TLS.Identity()
		if self.Role != pki.RoleSidecar || !self.ServesModel(cfg.Model) || self.Deployment != cfg.Deployment.Name {
			return nil, fmt.Errorf("%w: certificate %v is not a sidecar of model %q of deployment %q", ErrConfig, self, cfg.Model, cfg.Deployment.Name)
		}
		az, err := authz.New(authz.Config{Self: self, Facts: authz.NewGraphFacts(cfg.Deployment, cfg.Model), Logger: log})
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		s.authz = az
		s.serverOpts = append(append(s.serverOpts, grpcx.ServerTLS(cfg.TLS)), az.ServerOptions()...)
		s.host.dialOpts = []grpc.DialOption{grpcx.DialTLS(cfg.TLS)}
	}
	s.graph = g
	s.idx = newLineageIndex()
	s.host.idx = s.idx
	s.epochV.Store(cfg.Epoch)
	if rp, err := replaySetup(cfg, s.host, s.backend, s.idx, role); err != nil {
		return nil, err
	} else {
		s.rp = rp
	}
	s.exec = newExecutor(s.host, s.out, s.backend, m.Backend.Model, executors, NewLineage(cfg.Model, 0, s.stampEpoch(cfg.Epoch)))
	if s.rp != nil {
		s.exec.log = s.rp
		s.rp.x = s.exec
	}
	if role == config.RoleBackup && s.rp == nil {
		s.bk = newBackupState(s.host, s.epochV.Load())
	}
	if replicated {
		s.prim = newPrimaryState(s.host, s.exec, s.out, s.backend, mode)
	}
	s.metrics.watch(reg, s) // role, output log bound, durability lag (metrics.go)
	if cfg.Resolver == nil {
		// A backup without a Resolver cannot be promoted (no data path).
		return s, nil
	}
	if s.intake, err = newIntake(m, g.Pred(cfg.Model), s.out, s.metrics, log); err != nil {
		return nil, fmt.Errorf("%w: model %q: %v", ErrConfig, cfg.Model, err)
	}
	opts := []edge.ReceiverOption{edge.WithDedup(0, s.host.IsStateful), edge.WithEpochs(s.senderEpoch), edge.WithAdmit(s.admit), edge.WithClock(s.out.now)}
	if !m.Stateful {
		// A resend through this model toward a replacement further down
		// must run here again.
		opts = append(opts, edge.WithResendPassThrough())
	}
	s.receiver = edge.NewReceiver(cfg.Model, s.deliver, log, opts...)
	if err := s.newSenders(); err != nil {
		return nil, err
	}
	return s, nil
}

// newSenders creates the out-edges afresh (a new incarnation each).
func (s *Sidecar) newSenders() error {
	var out []*edge.Sender
	for _, to := range s.succs {
		snd, err := edge.NewSender(edge.SenderConfig{
			From: s.cfg.Model, To: to, Resolver: s.cfg.Resolver, MaxMessageBytes: s.maxMsg, Logger: s.log,
			Epoch: s.host.Epoch, Position: s.out.position, DialOptions: s.host.dialOpts, Now: s.out.now,
		})
		if err != nil {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		out = append(out, snd)
	}
	s.out.set(out)
	return nil
}

// senderEpoch is the epoch the topology knows for a sending model; the
// frontend (possibly several replicas) is not fenced.
func (s *Sidecar) senderEpoch(from string) (uint64, bool) {
	if from == config.Frontend || s.cfg.Resolver == nil {
		return 0, false
	}
	_, ep, ok := s.cfg.Resolver.Resolve(from)
	return ep, ok
}

// admit refuses inbound traffic unless this sidecar serves the model.
func (s *Sidecar) admit(string) error {
	if r := s.Role(); r != config.RolePrimary {
		return status.Errorf(codes.FailedPrecondition, "sidecar of %q is a %s, it takes no traffic", s.cfg.Model, r)
	}
	return nil
}

// Role is the sidecar's current role.
func (s *Sidecar) Role() config.Role {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.role
}

// Receiver exposes the inbound edges (max_in_order per predecessor).
func (s *Sidecar) Receiver() *edge.Receiver { return s.receiver }

// deliver is the Receiver's callback: it blocks while the inbox is full,
// which stops the stream and pushes back on the sender.
func (s *Sidecar) deliver(_ string, items []*hamsv1.Item) {
	s.idx.received(items)
	for _, it := range items {
		select {
		case s.intake.inbox <- it:
		case <-s.done:
			return
		}
	}
}

// Run serves the dataplane and drives the backend until ctx ends.
func (s *Sidecar) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("sidecar: Run called twice")
	}
	// Backend calls made under this context carry the identity of the
	// batch they run (hamsmd.UnaryClientInterceptor asks s).
	ctx = hamsmd.WithSource(ctx, s.exec)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv := grpc.NewServer(s.serverOpts...)
	hamsv1.RegisterReplicationServer(srv, &replicationServer{s: s})
	if s.receiver != nil {
		hamsv1.RegisterDataplaneServer(srv, s.receiver)
	}
	s.registerHealth(srv)

	errc := make(chan error, 64)
	s.mu.Lock()
	s.host.runCtx, s.fatal = ctx, func(err error) {
		select {
		case errc <- err:
		default:
		}
		cancel()
	}
	s.mu.Unlock()
	// The sidecar's own goroutines (the role's are its stage's).
	own := namedGroup{model: s.cfg.Model}
	own.begin(ctx, s.fatal)
	goRun := own.goRun
	goRun("done", func(ctx context.Context) error {
		<-ctx.Done()
		close(s.done)
		return nil
	})
	goRun("health shutdown", func(ctx context.Context) error {
		<-ctx.Done()
		s.health.Shutdown()
		return nil
	})
	// One port: gRPC, and the bulk snapshot stream (bulk.go), told apart
	// by a connection's first bytes. Closing the port (the gRPC server's
	// stop) ends the mux.
	mux := cmux.New(s.cfg.GRPCListener)
	mux.SetReadTimeout(muxSniffTimeout)
	bulkLis := mux.Match(cmux.PrefixMatcher(bulkMagic))
	grpcLis := mux.Match(cmux.Any())
	goRun("listener mux", func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() { _ = s.cfg.GRPCListener.Close() })
		defer stop()
		err := mux.Serve()
		if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
			return nil
		}
		return err
	})
	goRun("grpc server", func(ctx context.Context) error {
		return grpcx.Serve(ctx, srv, grpcLis, stopGrace)
	})
	goRun("bulk snapshot stream", func(ctx context.Context) error {
		return s.serveBulk(ctx, bulkLis)
	})
	if s.healthInterval > 0 {
		goRun("backend health", s.watchHealth)
	}
	if s.cfg.Coord != nil {
		goRun("completion watch", func(ctx context.Context) error {
			select {
			case <-s.collecting:
			case <-ctx.Done():
				return nil
			}
			return s.cfg.Coord.WatchCompleted(ctx, s.completed)
		})
	}
	s.roleMu.Lock()
	s.startStage()
	s.roleMu.Unlock()
	if s.replicated && s.cfg.Resolver != nil {
		// After the first stage: a transition must find it started.
		goRun("deposed watch", s.watchDeposed)
	}
	if s.Role() == config.RoleBackup {
		s.log.Info("backup sidecar serving", "addr", s.cfg.GRPCListener.Addr().String(), "mode", s.mode,
			"pfm", s.host.pfm, "nfm", s.host.nfm, "epoch", s.cfg.Epoch)
	} else {
		s.log.Info("sidecar serving", "addr", s.cfg.GRPCListener.Addr().String(), "service", s.service,
			"successors", s.succs, "batch", s.model.Batch.Size, "fan_in", s.model.FanIn,
			"mode", s.mode, "replicated", s.replicated)
	}
	<-ctx.Done()
	s.roleMu.Lock()
	s.stopStage()
	s.stopped = true
	s.roleMu.Unlock()
	own.Wait()
	if s.rp != nil {
		s.rp.close()
	}
	close(errc)
	var err error
	for e := range errc {
		err = errors.Join(err, e)
	}
	s.log.Info("sidecar stopped", "err", err)
	return err
}

// startStage starts the stage of the current role (caller holds roleMu).
func (s *Sidecar) startStage() {
	var st Stage
	switch role := s.Role(); {
	case role == RoleDeposed, role == config.RoleBackup && s.rp != nil:
		// Fenced: nothing runs until a Demote (deposed.go); or a replay
		// spare, idle until promoted.
		st = &idleStage{}
	case role == config.RoleBackup:
		st = newBackupStage(s.bk)
	default:
		sv := &servingStage{namedGroup: namedGroup{model: s.cfg.Model}, senders: s.out.current(), loop: s.intake.loop, executors: 1}
		switch {
		case s.replicated:
			sv.workers, sv.executor = s.prim.workers(), s.prim.executor
		case s.rp != nil:
			sv.workers = []namedRun{{"replay logger", s.rp.logger}, {"replay checkpointer", s.rp.checkpointer}}
			sv.executor = s.rp.executor
		default:
			sv.executor, sv.executors = s.exec.serve, s.exec.n
		}
		st = sv
	}
	s.stage = st
	st.Start(s.host.runCtx, s.fatal)
}

// stopStage stops the current role's goroutines and waits for them
// (caller holds roleMu).
func (s *Sidecar) stopStage() {
	if s.stage == nil {
		return
	}
	s.stage.Cancel()
	if hook := testHookStageCanceled.Load(); hook != nil {
		(*hook)(s)
	}
	s.stage.Wait()
	s.stage = nil
}

// testHookStageCanceled, set by tests only, is called when a role's stage
// is canceled, before its goroutines are waited for.
var testHookStageCanceled atomic.Pointer[func(*Sidecar)]

// completed garbage-collects the output log and the senders' retained
// items on a completion notice.
func (s *Sidecar) completed(n *hamsv1.CompletionNotice) {
	for _, snd := range s.out.current() {
		snd.Complete(n.GetReqIds()...)
	}
	if s.outlog == nil || s.outlog.Complete(n.GetReqIds()) == 0 {
		return
	}
	_, items, bytes := s.outlog.Stats()
	s.metrics.outlogItems.Set(float64(items))
	s.metrics.outlogBytes.Set(float64(bytes))
}
