package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hams-go/hams/internal/run"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/hams-go/hams/internal/authz"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/pki"
	"github.com/hams-go/hams/manager/dashboard/timeline"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Defaults aimed at detecting a dead component in under 100 ms on one
// machine: a heartbeat every 20 ms, dead after 70 ms of silence (three
// heartbeats missed plus half an interval of scheduling jitter), checked
// every SuspicionTimeout/8 (about 9 ms). Worst case: 70 + 9 ms plus one
// KV update (tens of microseconds on the embedded server).
const (
	DefaultHeartbeatInterval = 20 * time.Millisecond
	DefaultSuspicionTimeout  = 70 * time.Millisecond
	// DefaultNATSListen picks a random loopback port; NATSClientURL says
	// which.
	DefaultNATSListen = "127.0.0.1:-1"
)

// Errors.
var (
	// ErrConfig is wrapped by every Config validation error.
	ErrConfig = errors.New("manager: invalid config")
	// ErrAlreadyRun is returned by a second call of Run.
	ErrAlreadyRun = errors.New("manager: Run called more than once")
)

// Config of a Manager.
type Config struct {
	Deployment *config.Deployment
	// GRPCListener serves hamsv1.Manager. Run closes it.
	GRPCListener net.Listener
	// NATSURL of an external NATS (JetStream enabled); empty starts an
	// embedded nats-server with JetStream.
	NATSURL string
	// StoreDir is the JetStream store directory of the embedded server;
	// empty means a temporary directory removed when Run returns (the
	// deployment state then does not survive a manager restart).
	StoreDir string
	// NATSListen is host:port of the embedded server's client port
	// (default DefaultNATSListen; port -1 means random).
	NATSListen string
	// SyncAlways makes the embedded server fsync every JetStream write
	// before acking it (see doc.go).
	SyncAlways bool
	// KVReplicas is the replication factor of the deployment state bucket
	// and of the coordination streams the manager creates (with NATSAuth)
	// (default 1; use 3 on an external three-server cluster).
	KVReplicas int
	// HeartbeatInterval the manager asks components to heartbeat at
	// (default DefaultHeartbeatInterval).
	HeartbeatInterval time.Duration
	// SuspicionTimeout of silence after which a component is declared dead
	// (default DefaultSuspicionTimeout); must exceed HeartbeatInterval.
	SuspicionTimeout time.Duration
	// Starter starts new instances for recovery (new backups, standbys);
	// optional: without it those actions fail and are logged.
	Starter InstanceStarter
	// RPCTimeout bounds each recovery RPC to a sidecar (default
	// DefaultRPCTimeout).
	RPCTimeout time.Duration
	// LeaseTTL of the active-manager lease (default DefaultLeaseTTL).
	LeaseTTL time.Duration
	// ID names this manager in the lease (default hostname/pid/random).
	ID       string
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// TLS, when set, serves the manager API over mutual TLS (callers
	// verified and authorized by identity, internal/authz) and secures
	// the manager's recovery calls to sidecars. Its identity must be a
	// manager of Deployment. Nil: plaintext (--insecure).
	TLS *pki.Source
	// NATSAuth, when set, authenticates the manager to NATS with its nkey
	// and makes the embedded server admit only the deployment's users,
	// each with its role's subject permissions, over mutual TLS when TLS
	// is set (natsserver.go). Nil: NATS without authentication.
	NATSAuth *NATSAuth
	// Events, when set, receives recovery and membership events (the
	// dashboard's timeline); Emit must not block.
	Events timeline.Sink
}

// Manager holds the deployment state of one deployment in a JetStream KV
// bucket, serves hamsv1.Manager and tracks membership (see doc.go).
type Manager struct {
	cfg         Config
	log         *slog.Logger
	metrics     *metrics
	grpcMetrics *grpcprom.ServerMetrics
	hub         *hub
	ready       chan struct{}
	ran         atomic.Bool
	natsURL     string // written before ready is closed

	// stopping is closed when Run starts shutting down; streaming handlers
	// end on it so the gRPC server can stop gracefully.
	stopping chan struct{}
	// isolatedSince: when every live member went silent at once (zero:
	// not so; guarded by mu; holdIfIsolatedLocked).
	isolatedSince time.Time

	st *store // set before ready is closed

	// active: this manager holds the lease; only then does it write the
	// deployment state and run recovery.
	active    atomic.Bool
	lease     *lease
	recCh     chan recEvent
	keepLease bool // tests: do not release the lease on stop
	// authz decides who may call the manager API (nil: plaintext).
	authz *authz.Authorizer

	mu       sync.Mutex // guards the fields below
	members  *Membership
	regs     map[string]*hamsv1.RegisterRequest // by component id
	dirty    bool                               // a liveness change is not yet written
	failures []FailureRecord
	assigned map[string]assignment // roles and epochs set by recovery
	// retired: components declared dead that came back and must never
	// serve again (id -> why); their heartbeats and registrations are
	// refused, so their process exits (alive.go). returning: components
	// declared dead that were heard from again, held dead until recovery
	// decides (Retire or Readmit).
	retired   map[string]string
	returning map[string]bool
	// retiredInc: the incarnation a retired id was retired with (a new
	// incarnation under it is a new process: incarnation.go).
	// superseded: per id, incarnations a new process replaced (refused
	// for good). reincarnated: ids whose held registration is a new
	// incarnation (recovery's Retire admits it as a fresh standby).
	retiredInc   map[string]string
	superseded   map[string]map[string]bool
	reincarnated map[string]bool
}

// FailureRecord is one failure report as received.
type FailureRecord struct {
	At                            time.Time
	Reporter, Suspect, Model, Why string
}

// maxFailureRecords bounds the kept failure reports (oldest dropped).
const maxFailureRecords = 256

// New validates cfg and applies defaults; it does no I/O.
func New(cfg Config) (*Manager, error) {
	var errs []error
	if cfg.Deployment == nil {
		errs = append(errs, fmt.Errorf("%w: Deployment is required", ErrConfig))
	}
	if cfg.GRPCListener == nil {
		errs = append(errs, fmt.Errorf("%w: GRPCListener is required", ErrConfig))
	}
	if cfg.NATSListen == "" {
		cfg.NATSListen = DefaultNATSListen
	}
	if cfg.NATSURL == "" {
		if _, _, err := net.SplitHostPort(cfg.NATSListen); err != nil {
			errs = append(errs, fmt.Errorf("%w: NATSListen %q: %v", ErrConfig, cfg.NATSListen, err))
		}
	}
	if cfg.KVReplicas == 0 {
		cfg.KVReplicas = 1
	}
	if cfg.KVReplicas < 0 || cfg.KVReplicas > 5 {
		errs = append(errs, fmt.Errorf("%w: KVReplicas %d out of range 1..5", ErrConfig, cfg.KVReplicas))
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.SuspicionTimeout == 0 {
		cfg.SuspicionTimeout = DefaultSuspicionTimeout
	}
	if cfg.HeartbeatInterval < time.Millisecond {
		errs = append(errs, fmt.Errorf("%w: HeartbeatInterval %v is below 1ms", ErrConfig, cfg.HeartbeatInterval))
	}
	if cfg.SuspicionTimeout <= cfg.HeartbeatInterval {
		errs = append(errs, fmt.Errorf("%w: SuspicionTimeout %v must exceed HeartbeatInterval %v", ErrConfig, cfg.SuspicionTimeout, cfg.HeartbeatInterval))
	}
	if cfg.RPCTimeout == 0 {
		cfg.RPCTimeout = DefaultRPCTimeout
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.RPCTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: RPCTimeout %v is negative", ErrConfig, cfg.RPCTimeout))
	}
	if cfg.LeaseTTL < 3*time.Millisecond {
		errs = append(errs, fmt.Errorf("%w: LeaseTTL %v is below 3ms", ErrConfig, cfg.LeaseTTL))
	}
	if cfg.ID == "" {
		host, _ := os.Hostname()
		cfg.ID = fmt.Sprintf("%s/%d/%08x", host, os.Getpid(), rand.Uint32())
	}
	if cfg.TLS != nil && cfg.Deployment != nil {
		if self := cfg.TLS.Identity(); self.Role != pki.RoleManager || self.Deployment != cfg.Deployment.Name {
			errs = append(errs, fmt.Errorf("%w: certificate %v is not a manager of deployment %q", ErrConfig, self, cfg.Deployment.Name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		cfg:          cfg,
		log:          cfg.Logger.With("component", "manager", "deployment", cfg.Deployment.Name),
		metrics:      newMetrics(cfg.Registry),
		hub:          newHub(),
		ready:        make(chan struct{}),
		stopping:     make(chan struct{}),
		members:      NewMembership(cfg.SuspicionTimeout),
		regs:         map[string]*hamsv1.RegisterRequest{},
		assigned:     map[string]assignment{},
		retired:      map[string]string{},
		returning:    map[string]bool{},
		retiredInc:   map[string]string{},
		superseded:   map[string]map[string]bool{},
		reincarnated: map[string]bool{},
		recCh:        make(chan recEvent, 256),
	}
	if cfg.Registry != nil {
		m.grpcMetrics = grpcx.NewServerMetrics(cfg.Registry)
	}
	if cfg.TLS != nil {
		az, err := authz.New(authz.Config{Self: cfg.TLS.Identity(), Facts: registrations{m}, Logger: m.log})
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		m.authz = az
	}
	return m, nil
}

// registrations answer the authorizer's question of who registered a
// component id: a registration the caller's identity could have made (its kind
// is the caller's role, its model one the caller serves). Only the
// registration is kept, not the certificate that made it, so a manager
// that took over answers as its predecessor did.
type registrations struct{ m *Manager }

func (r registrations) Feeds(pki.Identity) bool { return false }

func (r registrations) Sink() bool { return false }

func (r registrations) RegisteredBy(id string, caller pki.Identity) bool {
	r.m.mu.Lock()
	reg := r.m.regs[id]
	r.m.mu.Unlock()
	// An id nobody registered (this manager restarted, or took over
	// before it loaded it) passes: the handler answers NotFound and the
	// component registers again, which is authorized on its own.
	return reg == nil || authz.RegistrationMatches(reg.GetKind(), reg.GetModel(), caller)
}

// Ready is closed once NATS is up, the deployment state is loaded and the
// gRPC server accepts calls. It is never closed if Run fails before that.
func (m *Manager) Ready() <-chan struct{} { return m.ready }

// NATSClientURL is the nats:// URL other processes connect to (the embedded
// server's client port, or Config.NATSURL). Valid once Ready is closed.
func (m *Manager) NATSClientURL() string {
	select {
	case <-m.ready:
		return m.natsURL
	default:
		return ""
	}
}

// Topology returns the newest deployment state the manager has seen
// (read-only; nil before Ready).
func (m *Manager) Topology() *hamsv1.Topology {
	t, _ := m.hub.get()
	return t
}

// Failures returns the failure reports received so far (newest last).
func (m *Manager) Failures() []FailureRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]FailureRecord(nil), m.failures...)
}

// Run connects to (or starts) NATS, loads or creates the deployment state,
// serves gRPC and runs membership until ctx ends. Every goroutine it starts
// has returned, and NATS is shut down, when it returns. It may be called
// once; a second call returns ErrAlreadyRun.
func (m *Manager) Run(ctx context.Context) error {
	if !m.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRun
	}
	defer m.stopOnce()
	nc, err := connectNATS(&m.cfg, m.log)
	if err != nil {
		_ = m.cfg.GRPCListener.Close()
		return err
	}
	defer nc.close()
	if err := m.open(ctx, nc); err != nil {
		_ = m.cfg.GRPCListener.Close()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	opts := grpcx.ServerOptions(m.log, m.grpcMetrics, m.cfg.Deployment.Limits.MaxMessageBytes)
	if m.authz != nil {
		opts = append(append(opts, grpcx.ServerTLS(m.cfg.TLS)), m.authz.ServerOptions()...)
	}
	srv := grpc.NewServer(opts...)
	hamsv1.RegisterManagerServer(srv, &service{m: m})
	// grpc.health.v1 (issue 19, item 2: on every gRPC server): the server
	// ("") and hams.v1.Manager are SERVING while Run runs, standby or
	// active (a standby takes registrations and heartbeats too), and
	// NOT_SERVING once its context ends.
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	hs.SetServingStatus(hamsv1.Manager_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 5)
	start := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil {
				errc <- fmt.Errorf("manager: %s: %w", name, err)
				cancel()
			}
		}()
	}
	start("watch deployment state", m.watchKV)
	start("membership", m.membershipLoop)
	start("recovery", m.recoveryLoop)
	start("lease", m.lease.run)
	start("serve gRPC", func(ctx context.Context) error {
		// Streaming handlers end when stopping is closed; close it as
		// soon as ctx ends so GracefulStop does not wait for them.
		go func() { <-ctx.Done(); hs.Shutdown(); m.stopOnce() }()
		return grpcx.Serve(ctx, srv, m.cfg.GRPCListener, 2*time.Second)
	})
	m.natsURL = nc.url
	close(m.ready)
	m.log.Info("manager ready", "grpc", m.cfg.GRPCListener.Addr().String(), "nats", nc.url,
		"bucket", BucketName(m.cfg.Deployment.Name), "heartbeat_interval", m.cfg.HeartbeatInterval,
		"suspicion_timeout", m.cfg.SuspicionTimeout)
	<-ctx.Done()
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	m.log.Info("manager stopped")
	return errors.Join(errs...)
}

// holdIfIsolatedLocked forgives this tick's silence when every live
// member (two or more) went silent at once: the manager is the one cut
// off (a partition of its host, a NIC, a firewall), not all of them. A
// partitioned active manager declared every component dead, and on
// healing retired every standby and backup it could not hear (a
// 10-minute soak, 2026-11-26). The hold lasts at most one lease ttl: a
// manager cut off that long has lost its lease and stepped down, so one
// that still leads reaches the deployment state and the silence is real
// (every instance lost at once). Exits the supervisor reports are
// declared at once regardless (service.go). Caller holds mu.
func (m *Manager) holdIfIsolatedLocked(now time.Time, since time.Duration) {
	// Silent for half a timeout: members heartbeat several times per
	// timeout at different phases, so when the manager is cut off they
	// cross the timeout one by one; by then none was heard for half.
	//
	// The hold ends only when a member is heard again (or fewer than two
	// are left), not when nobody is due any more: the hold's own Pause
	// keeps everyone just short of the timeout, and taking that for a
	// return ended the hold a tick after it began and declared everyone
	// dead one timeout later, while the manager was still cut off.
	_, alive := m.members.Counts()
	heard := m.members.Silent(now, m.cfg.SuspicionTimeout/2) < alive
	holding := !m.isolatedSince.IsZero()
	if alive < 2 || heard || (!holding && m.members.Silent(now, m.cfg.SuspicionTimeout) == 0) {
		if holding {
			// The first heard again ends the hold; the others' heartbeats
			// follow over reconnecting connections. Without a fresh
			// timeout they were declared dead in this very tick (a
			// 30-minute soak, 2026-11-27: a manager partitioned for 1 s
			// declared the primary and backup of ap-motion dead at once).
			m.members.HeardAt(now)
			m.log.Info("components heard again; failure suspicion resumes", "isolated_for", now.Sub(m.isolatedSince))
		}
		m.isolatedSince = time.Time{}
		return
	}
	if !holding {
		m.isolatedSince = now
		m.log.Warn("every live component went silent at once: this manager takes itself to be cut off and declares nobody dead", "components", alive, "hold_at_most", m.cfg.LeaseTTL)
	}
	if now.Sub(m.isolatedSince) >= m.cfg.LeaseTTL {
		return
	}
	m.members.Pause(since)
	m.metrics.isolated.Inc()
}

// stopOnce closes stopping (idempotent).
func (m *Manager) stopOnce() {
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-m.stopping:
	default:
		close(m.stopping)
	}
}

// open creates the bucket, loads or creates the topology and seeds
// membership from it.
func (m *Manager) open(ctx context.Context, nc *natsConn) error {
	js, err := jetstream.New(nc.nc)
	if err != nil {
		return fmt.Errorf("manager: JetStream context: %w", err)
	}
	bucket := BucketName(m.cfg.Deployment.Name)
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "HAMS-Go deployment state of " + m.cfg.Deployment.Name,
		History:     16,
		Storage:     jetstream.FileStorage,
		Replicas:    m.cfg.KVReplicas,
	})
	if err != nil {
		return fmt.Errorf("manager: create KV bucket %s: %w", bucket, err)
	}
	m.st = &store{kv: kv, metrics: m.metrics}
	t, err := m.st.ensure(ctx, &hamsv1.Topology{Deployment: m.cfg.Deployment.Name, Mode: m.cfg.Deployment.Mode})
	if err != nil {
		return err
	}
	m.seed(t, time.Now())
	m.lease = &lease{kv: kv, id: m.cfg.ID, ttl: m.cfg.LeaseTTL, log: m.log, onChange: m.setActive, keep: m.keepLease}
	m.lease.step(ctx, time.Now())
	if m.active.Load() {
		if t, err = m.st.mutate(ctx, m.applyState); err != nil {
			return err
		}
	}
	m.hub.offer(t)
	m.log.Info("deployment state loaded", "bucket", bucket, "revision", t.GetRevision(),
		"placements", len(t.GetPlacements()), "frontends", len(t.GetFrontends()))
	return nil
}

// seed rebuilds registrations and membership from a persisted topology (a
// restarted manager): every component is given one suspicion timeout from
// now to heartbeat before it is declared dead. Frontends are known only by
// address; they get a placeholder id that their re-registration replaces.
func (m *Manager) seed(t *hamsv1.Topology, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range t.GetPlacements() {
		m.seedPlacementLocked(p, now)
	}
	for _, a := range t.GetFrontends() {
		id := frontendPlaceholder(a)
		m.regs[id] = &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND, Id: id, Address: a}
		m.members.Seed(id, true, now)
	}
	m.updateGaugesLocked()
}

func frontendPlaceholder(addr string) string { return "frontend@" + addr }

// setActive is called by the lease when this manager becomes (or stops
// being) the active one. A manager that takes over adopts the components
// the deployment state lists that it has not heard from itself, and gives
// every component one suspicion timeout from now to heartbeat here.
func (m *Manager) setActive(active bool) {
	if active {
		// The newest persisted state, read now: the KV watch of a
		// standby can lag or have stalled (a NATS restart), and a
		// takeover from a stale topology brings back components the
		// previous active manager had failed over.
		//
		// A takeover from what the watch last delivered writes back the
		// roles and liveness it shows: a backup that recovery had
		// replaced (and retired) alive again, its replacement a standby
		// again (a 30-minute soak, 2026-11-27: a primary killed 1.5 s
		// after a takeover was failed over to the retired backup). A
		// failed read is retried for up to half a lease ttl.
		deadline := time.Now().Add(m.cfg.LeaseTTL / 2)
		for {
			_, err := m.readTopology(context.Background())
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t, _ := m.hub.get()
				m.log.Warn("taking over from the deployment state the watch last delivered: the newest could not be read",
					"revision", t.GetRevision(), "err", err)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		t, _ := m.hub.get()
		m.log.Info("taking over the deployment state", "revision", t.GetRevision())
		now := time.Now()
		m.mu.Lock()
		persisted := map[string]assignment{}
		for _, p := range t.GetPlacements() {
			if _, ok := m.regs[p.GetComponentId()]; !ok {
				m.seedPlacementLocked(p, now)
			}
			// The persisted roles are recovery's decisions (a promoted
			// backup at a new epoch, but also a spare made the backup
			// at the same epoch): keep them even when a component
			// re-registers here with the role it started with. A spare
			// made backup that re-registered as a standby left its
			// model without a backup, and its primary's replies were
			// never durable again.
			//
			// They also replace what this manager decided itself in an
			// earlier term as the active one: another manager was active
			// since, and what it wrote is newer, even at the same epoch
			// (a backup it retired and admitted again as a standby).
			// Before, an own BACKUP decision of the earlier term won over
			// the persisted STANDBY, the model had two live backups, and
			// the next failover promoted the stale one (a 30-minute soak,
			// 2026-11-27).
			if p.GetRole() != hamsv1.Role_ROLE_UNSPECIFIED {
				persisted[p.GetComponentId()] = assignment{role: p.GetRole(), epoch: p.GetEpoch()}
			}
		}
		m.assigned = persisted
		// Frontends are listed by address only: adopt those no frontend
		// registration here names, under the placeholder id their
		// re-registration replaces, so a frontend that died while no
		// manager was active is still declared dead.
		for _, a := range t.GetFrontends() {
			if !m.frontendKnownLocked(a) {
				id := frontendPlaceholder(a)
				m.regs[id] = &hamsv1.RegisterRequest{Kind: hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND, Id: id, Address: a}
				m.members.Seed(id, true, now)
			}
		}
		// Liveness at takeover: what the previous active manager last
		// wrote, or a heartbeat received here within a suspicion timeout
		// (components heartbeat every manager while none is active). A
		// standby's own membership is not ticked, so its alive flags alone
		// are stale: a component that died and was failed over while this
		// manager stood by must not come back alive (and be recovered
		// again).
		written := map[string]bool{}
		for _, p := range t.GetPlacements() {
			written[p.GetComponentId()] = p.GetAlive()
		}
		listed := map[string]bool{}
		for _, a := range t.GetFrontends() {
			listed[a] = true
		}
		for id, r := range m.regs {
			alive := m.members.HeardWithin(id, m.cfg.SuspicionTimeout, now)
			switch w, ok := written[id]; {
			case ok && !w && m.holdsReturnLocked(r):
				// A model instance the previous active manager wrote dead
				// stays dead whatever this standby heard: its return is
				// recovery's decision (alive.go), as on that manager.
				alive = false
			case alive:
			case r.GetKind() == hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND:
				alive = listed[r.GetAddress()]
			case ok:
				alive = w
			}
			m.members.Seed(id, alive, now.Add(m.takeoverGrace()))
		}
		m.dirty = true
		m.updateGaugesLocked()
		m.mu.Unlock()
		m.metrics.active.Set(1)
	} else {
		m.metrics.active.Set(0)
	}
	m.active.Store(active)
	m.emit(timeline.Event{Kind: map[bool]timeline.Kind{true: timeline.Active, false: timeline.Standby}[active], Component: m.cfg.ID})
	if active {
		m.resumeRecovery()
	}
}

// takeoverGrace is how much longer than a suspicion timeout a manager
// that takes over waits for components to heartbeat it: a component that
// followed the previous active manager moves on only after three of its
// heartbeats to it timed out in a row (manager/client's follower; each
// times out after max(4 intervals, 100 ms)). A manager that was killed
// refuses connections and is left at once, but one that is stopped (a
// SIGSTOP, a stalled host) accepts them and never answers: without the
// grace the new active manager declared every component dead one
// suspicion timeout after its takeover (docs/recovery.md, "False
// suspicion").
func (m *Manager) takeoverGrace() time.Duration {
	return 3 * max(4*m.cfg.HeartbeatInterval, 100*time.Millisecond)
}

// frontendKnownLocked reports whether a frontend registration names addr.
func (m *Manager) frontendKnownLocked(addr string) bool {
	for _, r := range m.regs {
		if r.GetKind() == hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND && r.GetAddress() == addr {
			return true
		}
	}
	return false
}

func (m *Manager) seedPlacementLocked(p *hamsv1.Placement, now time.Time) {
	r := &hamsv1.RegisterRequest{
		Kind:           hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR,
		Id:             p.GetComponentId(),
		Model:          p.GetModel(),
		Role:           p.GetRole(),
		Address:        p.GetSidecarAddress(),
		BackendAddress: p.GetBackendAddress(),
	}
	if p.GetSidecarAddress() == "" {
		r.Kind = hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER
		r.Address = p.GetBackendAddress()
	}
	m.regs[r.Id] = r
	m.members.Seed(r.Id, p.GetAlive(), now)
}

// applyState rewrites t so it reflects the registrations and membership:
// one placement per registered sidecar or model server (keyed by component
// id, alive from membership, epoch kept), the addresses of alive frontends,
// and the deployment's name and mode. It is pure in t given the guarded
// fields, so the CAS loop can re-run it.
func (m *Manager) applyState(t *hamsv1.Topology) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t.Deployment = m.cfg.Deployment.Name
	t.Mode = m.cfg.Deployment.Mode
	byID := map[string]*hamsv1.Placement{}
	maxEpoch := map[string]uint64{}
	for _, p := range t.Placements {
		byID[p.GetComponentId()] = p
		maxEpoch[p.GetModel()] = max(maxEpoch[p.GetModel()], p.GetEpoch())
	}
	frontends := map[string]bool{}
	var order []string
	for _, a := range t.Frontends {
		if !frontends[a] {
			order = append(order, a)
		}
		frontends[a] = true
	}
	ids := make([]string, 0, len(m.regs))
	for id := range m.regs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r := m.regs[id]
		alive, _ := m.members.Alive(id)
		if r.GetKind() == hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND {
			delete(byID, id)
			switch {
			case alive && !frontends[r.GetAddress()]:
				frontends[r.GetAddress()] = true
				order = append(order, r.GetAddress())
			case !alive && frontends[r.GetAddress()] && !m.otherAliveFrontendLocked(id, r.GetAddress()):
				frontends[r.GetAddress()] = false
			}
			continue
		}
		p := byID[id]
		if p == nil {
			p = &hamsv1.Placement{ComponentId: id, Epoch: max(maxEpoch[r.GetModel()], 1)}
			byID[id] = p
		}
		p.Model = r.GetModel()
		p.Role = r.GetRole()
		if a, ok := m.assigned[id]; ok {
			// Recovery's decision outlives a re-registration with the
			// role the component started with.
			p.Role, p.Epoch = a.role, a.epoch
		}
		p.Alive = alive
		if r.GetKind() == hamsv1.ComponentKind_COMPONENT_KIND_MODEL_SERVER {
			p.SidecarAddress = ""
			p.BackendAddress = r.GetAddress()
		} else {
			p.SidecarAddress = r.GetAddress()
			p.BackendAddress = r.GetBackendAddress()
		}
	}
	t.Placements = t.Placements[:0]
	for _, p := range byID {
		t.Placements = append(t.Placements, p)
	}
	sort.Slice(t.Placements, func(i, j int) bool {
		a, b := t.Placements[i], t.Placements[j]
		if a.GetModel() != b.GetModel() {
			return a.GetModel() < b.GetModel()
		}
		if a.GetRole() != b.GetRole() {
			return a.GetRole() < b.GetRole()
		}
		return a.GetComponentId() < b.GetComponentId()
	})
	t.Frontends = t.Frontends[:0]
	for _, a := range order {
		if frontends[a] {
			t.Frontends = append(t.Frontends, a)
		}
	}
}

// otherAliveFrontendLocked reports whether another registered, alive
// frontend has addr (a restarted frontend re-registering under a new id).
func (m *Manager) otherAliveFrontendLocked(id, addr string) bool {
	for oid, r := range m.regs {
		if oid == id || r.GetKind() != hamsv1.ComponentKind_COMPONENT_KIND_FRONTEND || r.GetAddress() != addr {
			continue
		}
		if alive, _ := m.members.Alive(oid); alive {
			return true
		}
	}
	return false
}

// reconcile writes the registrations and membership into the deployment
// state. On failure the state stays dirty and the membership loop retries.
func (m *Manager) reconcile(ctx context.Context) (*hamsv1.Topology, error) {
	if !m.active.Load() {
		// A standby manager never writes; it answers from what it sees.
		m.mu.Lock()
		m.dirty = true
		m.mu.Unlock()
		t, _ := m.hub.get()
		return t, nil
	}
	m.mu.Lock()
	m.dirty = false
	m.mu.Unlock()
	t, err := m.st.mutate(ctx, m.applyState)
	if err != nil {
		m.mu.Lock()
		m.dirty = true
		m.mu.Unlock()
		return nil, err
	}
	m.hub.offer(t)
	return t, nil
}

// membershipLoop ticks the membership state machine and writes liveness
// changes. A recovery state machine (later issue) hooks in where dead
// components are reported.
func (m *Manager) membershipLoop(ctx context.Context) error {
	period := max(m.cfg.SuspicionTimeout/8, time.Millisecond)
	tk := time.NewTicker(period)
	defer tk.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
			now := time.Now()
			// A tick far later than the period means this process was not
			// running (a stall of the manager or of the whole machine):
			// heartbeats sent meanwhile are queued, unread. Silence over
			// the stall proves nothing, so it is forgiven before the tick
			// (docs/recovery.md, blocker 3).
			stall := now.Sub(last) - period
			last = now
			if !m.active.Load() {
				continue
			}
			m.mu.Lock()
			// since is the time this tick covers that no stall pause
			// forgave: an isolation hold forgives all of it (a tick is
			// often a little later than the period; forgiving only the
			// period let members cross the timeout one by one during
			// the hold).
			since := stall + period
			if stall > m.cfg.SuspicionTimeout/4 {
				m.members.Pause(stall)
				m.metrics.stalls.Inc()
				m.log.Info("manager stalled; silence forgiven", "stall", stall)
				since = period
			}
			m.holdIfIsolatedLocked(now, since)
			acts := m.members.Tick(now)
			dirty := m.dirty
			type dead struct {
				id, model string
				role      hamsv1.Role
			}
			var deaths []dead
			for _, a := range acts {
				m.log.Info("component declared dead", "id", a.ID, "timeout", m.cfg.SuspicionTimeout)
				m.metrics.deaths.Inc()
				if r := m.regs[a.ID]; r != nil && r.GetKind() == hamsv1.ComponentKind_COMPONENT_KIND_SIDECAR {
					deaths = append(deaths, dead{a.ID, r.GetModel(), r.GetRole()})
				}
			}
			m.updateGaugesLocked()
			m.mu.Unlock()
			if len(acts) == 0 && !dirty {
				continue
			}
			if _, err := m.reconcile(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("write liveness to deployment state", "err", err)
			}
			// After the write, so recovery sees the death in the topology.
			for _, d := range deaths {
				m.suspect(d.id, d.model, d.role, "missed heartbeats")
			}
		}
	}
}

func (m *Manager) updateGaugesLocked() {
	total, alive := m.members.Counts()
	m.metrics.registered.Set(float64(total))
	m.metrics.alive.Set(float64(alive))
}

// watchKV follows the topology key (also written by other managers or
// tools) and publishes every revision to the hub, re-creating the watcher
// if it ends.
func (m *Manager) watchKV(ctx context.Context) error {
	backoff := 10 * time.Millisecond
	for {
		w, err := m.st.kv.Watch(ctx, TopologyKey)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			m.log.Warn("watch deployment state", "err", err, "retry_in", backoff)
			if !run.Sleep(ctx, backoff) {
				return nil
			}
			backoff = min(backoff*2, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		m.followWatcher(ctx, w)
		if ctx.Err() != nil {
			return nil
		}
	}
}

// refreshInterval is how often a manager reads the topology key besides
// its watch (a stalled watch is caught and re-created).
const refreshInterval = time.Second

// refreshTopology reads the topology key and offers it to the hub; it
// reports whether that was newer than what the hub held (the watch
// missed it).
func (m *Manager) refreshTopology(ctx context.Context) bool {
	newer, _ := m.readTopology(ctx)
	return newer
}

// readTopology reads the persisted topology into the hub: newer reports
// whether it was newer than the hub's, err a failed read.
func (m *Manager) readTopology(ctx context.Context) (newer bool, err error) {
	if m.st == nil {
		return false, errors.New("manager: no deployment state store")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	e, err := m.st.kv.Get(ctx, TopologyKey)
	if err != nil {
		return false, fmt.Errorf("read the deployment state: %w", err)
	}
	t, err := DecodeTopology(e)
	if err != nil {
		return false, err
	}
	m.st.remember(t)
	return m.hub.offer(t), nil
}

func (m *Manager) followWatcher(ctx context.Context, w jetstream.KeyWatcher) {
	defer func() {
		_ = w.Stop()
		// The watcher's callback blocks on a full channel; drain until it
		// closes (or give up: the connection closes right after).
		timeout := time.NewTimer(time.Second)
		defer timeout.Stop()
		for {
			select {
			case _, ok := <-w.Updates():
				if !ok {
					return
				}
			case <-timeout.C:
				return
			}
		}
	}()
	refresh := time.NewTicker(refreshInterval)
	defer refresh.Stop()
	behind := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-refresh.C:
			// A watch that stopped delivering (its consumer lost with a
			// restarted NATS server) does not close: reads that find a
			// newer revision than the watch delivered, twice in a row
			// (once may be a write the watch is about to deliver),
			// re-create it. The hub has the newer revision either way.
			if !m.refreshTopology(ctx) {
				behind = 0
				continue
			}
			if behind++; behind >= 2 {
				m.log.Warn("deployment state watch fell behind; re-creating it")
				return
			}
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			t, err := DecodeTopology(e)
			if err != nil {
				m.log.Error("bad deployment state in KV (the next write replaces it with the last readable one)", "err", err)
				continue
			}
			if m.st != nil {
				m.st.remember(t)
			}
			if m.hub.offer(t) {
				m.log.Debug("topology changed", "revision", t.GetRevision())
			}
		}
	}
}
