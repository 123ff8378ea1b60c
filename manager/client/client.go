package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hams-go/hams/internal/run"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// Errors.
var (
	// ErrConfig is wrapped by every Config validation error.
	ErrConfig = errors.New("client: invalid config")
	// ErrAlreadyRun is returned by a second call of Run.
	ErrAlreadyRun = errors.New("client: Run called more than once")
)

// Backoff bounds for reconnecting to the manager: short enough that a
// restarted manager is found again well within a second.
const (
	minBackoff = 10 * time.Millisecond
	maxBackoff = 500 * time.Millisecond
	// defaultInterval is used until the manager answers one.
	defaultInterval = 20 * time.Millisecond
)

// Manager role header (set by package manager on its answers).
const (
	// RoleMetadata is the gRPC response header naming the answering
	// manager's role: RoleActive (it holds the active-manager lease) or
	// RoleStandby. An answer without it counts as active (one manager).
	RoleMetadata = "hams-manager-role"
	RoleActive   = "active"
	RoleStandby  = "standby"
)

// Config of a Client.
type Config struct {
	// ManagerAddr is host:port of the manager's gRPC server.
	ManagerAddr string
	// ManagerAddrs are more managers of the same deployment (an active
	// one and standbys): the client heartbeats the active one and hunts
	// for the new one when it fails (follow.go). ManagerAddr, when set,
	// is the first of the list; at least one address is required.
	ManagerAddrs []string
	// Registration is what Run registers (Kind, Id and Address required).
	Registration *hamsv1.RegisterRequest
	Logger       *slog.Logger
	// DialOptions are added to the gRPC client's (tests, TLS).
	DialOptions []grpc.DialOption
}

// Client keeps a component registered with the manager, heartbeats, and
// mirrors the topology (see doc.go). Resolve, Changed, Topology and
// WaitReady are safe for concurrent use and may be called before Run.
type Client struct {
	cfg Config
	log *slog.Logger
	ran atomic.Bool

	addrs []string // ManagerAddr and ManagerAddrs, deduplicated

	mu       sync.Mutex
	topo     *hamsv1.Topology // read-only once stored
	changed  chan struct{}
	interval time.Duration
	// suspicion is the manager's suspicion timeout (0 until a Register
	// answer tells it).
	suspicion time.Duration
	progress  func() (maxSeq, durableSeq uint64)
	// sess is the running session (nil outside Run): ReportBackup calls
	// the manager it follows.
	sess *session
}

// New validates cfg; it does no I/O.
func New(cfg Config) (*Client, error) {
	var errs []error
	var addrs []string
	for _, a := range append([]string{cfg.ManagerAddr}, cfg.ManagerAddrs...) {
		if (a == "" && len(cfg.ManagerAddrs) > 0) || slices.Contains(addrs, a) {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("%w: ManagerAddr %q: %v", ErrConfig, a, err))
			continue
		}
		addrs = append(addrs, a)
	}
	r := cfg.Registration
	switch {
	case r == nil:
		errs = append(errs, fmt.Errorf("%w: Registration is required", ErrConfig))
	default:
		if r.GetKind() == hamsv1.ComponentKind_COMPONENT_KIND_UNSPECIFIED {
			errs = append(errs, fmt.Errorf("%w: Registration.Kind is required", ErrConfig))
		}
		if r.GetId() == "" {
			errs = append(errs, fmt.Errorf("%w: Registration.Id is required", ErrConfig))
		}
		if _, _, err := net.SplitHostPort(r.GetAddress()); err != nil {
			errs = append(errs, fmt.Errorf("%w: Registration.Address %q: %v", ErrConfig, r.GetAddress(), err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Registration = proto.Clone(cfg.Registration).(*hamsv1.RegisterRequest)
	if cfg.Registration.GetIncarnation() == "" {
		// One per Client, and a process runs one Client per registered
		// id: the manager tells a restarted process from the one it knew.
		cfg.Registration.Incarnation = NewIncarnation()
	}
	return &Client{
		cfg:      cfg,
		addrs:    addrs,
		log:      cfg.Logger.With("component", "manager-client", "id", cfg.Registration.GetId()),
		changed:  make(chan struct{}),
		interval: defaultInterval,
	}, nil
}

// SetProgress installs a function whose values are sent with every
// heartbeat (max_seq, durable_seq). Call it before Run.
func (c *Client) SetProgress(f func() (maxSeq, durableSeq uint64)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.progress = f
}

// Topology returns the newest topology received (nil before the first).
// The result must not be modified.
func (c *Client) Topology() *hamsv1.Topology {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.topo
}

// Changed returns a channel closed at the next topology change.
func (c *Client) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// Resolve returns the sidecar address and epoch of the live placement with
// role PRIMARY or ACTIVE for model (the highest epoch wins; ties go to the
// first in topology order), or, for config.Frontend, the first frontend
// address (epoch 0).
func (c *Client) Resolve(model string) (addr string, epoch uint64, ok bool) {
	return Resolve(c.Topology(), model)
}

// ResolveBackup returns the sidecar address and epoch of the live backup
// of a stateful model.
func (c *Client) ResolveBackup(model string) (addr string, epoch uint64, ok bool) {
	return resolveRole(c.Topology(), model, hamsv1.Role_ROLE_BACKUP)
}

// ResolveBackupOf is Client.ResolveBackup on a given topology.
func ResolveBackupOf(t *hamsv1.Topology, model string) (addr string, epoch uint64, ok bool) {
	return resolveRole(t, model, hamsv1.Role_ROLE_BACKUP)
}

// Resolve is Client.Resolve on a given topology.
func Resolve(t *hamsv1.Topology, model string) (addr string, epoch uint64, ok bool) {
	if t == nil {
		return "", 0, false
	}
	if model == config.Frontend {
		if len(t.GetFrontends()) == 0 {
			return "", 0, false
		}
		return t.GetFrontends()[0], 0, true
	}
	return resolveRole(t, model, hamsv1.Role_ROLE_PRIMARY, hamsv1.Role_ROLE_ACTIVE)
}

func resolveRole(t *hamsv1.Topology, model string, roles ...hamsv1.Role) (addr string, epoch uint64, ok bool) {
	var best *hamsv1.Placement
	for _, p := range t.GetPlacements() {
		if p.GetModel() != model || !p.GetAlive() || p.GetSidecarAddress() == "" {
			continue
		}
		if !slices.Contains(roles, p.GetRole()) {
			continue
		}
		if best == nil || p.GetEpoch() > best.GetEpoch() {
			best = p
		}
	}
	if best == nil {
		return "", 0, false
	}
	return best.GetSidecarAddress(), best.GetEpoch(), true
}

// WaitReady blocks until ready(topology) holds for the newest topology or
// ctx ends (then it returns ctx's error).
func (c *Client) WaitReady(ctx context.Context, ready func(*hamsv1.Topology) bool) error {
	for {
		c.mu.Lock()
		t, ch := c.topo, c.changed
		c.mu.Unlock()
		if t != nil && ready(t) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("client: wait for topology: %w", ctx.Err())
		}
	}
}

// install stores t and wakes Changed waiters if it differs from the
// current one. fromStream says t came from the watch stream, which is
// ordered and authoritative (a manager with a fresh store restarts
// revisions); a register answer only replaces an older topology.
func (c *Client) install(t *hamsv1.Topology, fromStream bool) {
	if t == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.topo != nil {
		if !fromStream && t.GetRevision() <= c.topo.GetRevision() {
			return
		}
		if proto.Equal(c.topo, t) {
			return
		}
	}
	c.topo = t
	close(c.changed)
	c.changed = make(chan struct{})
	c.log.Debug("topology changed", "revision", t.GetRevision())
}

// Run registers, heartbeats at the interval the manager answered and
// watches the topology until ctx ends; it reconnects with backoff and
// re-registers when a manager no longer knows the component. With several
// manager addresses it follows the active manager (follow.go). Every
// goroutine it starts has returned when it returns: nil once ctx ends, or
// the error when a manager refuses the registration (InvalidArgument or
// NotFound: nothing a retry can fix).
func (c *Client) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return ErrAlreadyRun
	}
	apis := make([]hamsv1.ManagerClient, len(c.addrs))
	for i, a := range c.addrs {
		cc, err := grpcx.Dial(a, 0, c.cfg.DialOptions...)
		if err != nil {
			return fmt.Errorf("client: %w", err)
		}
		defer cc.Close()
		apis[i] = hamsv1.NewManagerClient(cc)
	}
	s := &session{c: c, apis: apis, fol: newFollower(len(apis))}
	c.mu.Lock()
	c.sess = s
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.sess = nil
		c.mu.Unlock()
	}()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.watchLoop(ctx)
	}()
	err := s.heartbeatLoop(ctx)
	cancel()
	wg.Wait()
	if errors.Is(err, errStopped) {
		return nil
	}
	return err
}

// session is one Run: the connections to the managers and the follower
// state (guarded by mu: the heartbeat loop writes it, the watch loop reads
// it).
type session struct {
	c    *Client
	apis []hamsv1.ManagerClient

	mu  sync.Mutex
	fol *follower
}

// target is the manager the watch loop should use: the followed one, or
// (hunting) the next in turn.
func (s *session) target(turn int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur := s.fol.current(); cur >= 0 {
		return cur
	}
	return turn % len(s.apis)
}

// answered feeds one manager's answer to the follower.
func (s *session) answered(i int, err error, hdr metadata.MD) {
	a := answerFailed
	switch {
	case err == nil && isActive(hdr):
		a = answerActive
	case err == nil:
		a = answerStandby
	case status.Code(err) == codes.DeadlineExceeded:
		a = answerSlow
	}
	s.mu.Lock()
	changed := s.fol.answered(i, a)
	cur := s.fol.current()
	s.mu.Unlock()
	if changed {
		if cur >= 0 {
			s.c.log.Info("following the active manager", "manager", s.c.addrs[cur])
		} else {
			s.c.log.Info("manager not active or unreachable; looking for the active one", "manager", s.c.addrs[i], "err", err)
		}
	}
}

func isActive(hdr metadata.MD) bool {
	v := hdr.Get(RoleMetadata)
	return len(v) == 0 || v[0] != RoleStandby
}

// targets are the managers to heartbeat this round.
func (s *session) targets() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fol.targets()
}

// each calls fn for every index of targets, concurrently when there are
// several, and waits for all.
func each(targets []int, fn func(i int)) {
	if len(targets) == 1 {
		fn(targets[0])
		return
	}
	var wg sync.WaitGroup
	for _, i := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(i)
		}()
	}
	wg.Wait()
}

// errRefused wraps a permanent refusal of the registration.
type errRefused struct{ err error }

func (e errRefused) Error() string { return e.err.Error() }
func (e errRefused) Unwrap() error { return e.err }

// registerOnce registers with manager i once (bounded by timeout). A
// refusal (InvalidArgument, NotFound: a bad registration or a model the
// deployment does not have) is returned as errRefused.
func (s *session) registerOnce(ctx context.Context, i int, timeout time.Duration) error {
	c := s.c
	rctx, cancel := context.WithTimeout(ctx, timeout)
	var hdr metadata.MD
	resp, err := s.apis[i].Register(rctx, c.cfg.Registration, grpc.Header(&hdr))
	cancel()
	if err == nil {
		s.answered(i, nil, hdr)
		if isActive(hdr) {
			// A standby's topology comes from its own watch of the
			// deployment state and may lag behind the active manager's
			// (a restarted frontend that installed one led on it for 36
			// ms and pulled the sink edges to itself); the registration
			// goes to every manager while hunting, and the topology
			// watch delivers the rest.
			c.install(resp.GetTopology(), false)
		}
		iv := time.Duration(resp.GetHeartbeatIntervalMs()) * time.Millisecond
		if iv <= 0 {
			iv = defaultInterval
		}
		c.mu.Lock()
		c.interval = iv
		if st := time.Duration(resp.GetSuspicionTimeoutMs()) * time.Millisecond; st > 0 {
			c.suspicion = st
		}
		c.mu.Unlock()
		c.log.Info("registered with manager", "manager", c.addrs[i], "manager_role", hdr.Get(RoleMetadata),
			"revision", resp.GetTopology().GetRevision(), "heartbeat_interval", iv)
		return nil
	}
	if code := status.Code(err); code == codes.InvalidArgument || code == codes.NotFound {
		return errRefused{fmt.Errorf("client: manager %s refused registration of %s: %w", c.addrs[i], c.cfg.Registration.GetId(), err)}
	}
	s.answered(i, err, nil)
	return err
}

// register retries until a manager accepts the registration (nil) or ctx
// ends (errStopped); a refusal is permanent and returned. While hunting
// it registers with every manager at once.
func (s *session) register(ctx context.Context) error {
	b := newBackoff()
	for {
		var (
			mu      sync.Mutex
			ok      bool
			refused error
			last    error
		)
		each(s.targets(), func(i int) {
			err := s.registerOnce(ctx, i, 2*time.Second)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok = true
			case errors.As(err, new(errRefused)):
				refused = err
			default:
				last = err
			}
		})
		switch {
		case ok:
			return nil
		case ctx.Err() != nil:
			return errStopped
		case refused != nil:
			return refused
		}
		d := b.next()
		s.c.log.Debug("register with manager", "err", last, "retry_in", d)
		if !run.Sleep(ctx, d) {
			return errStopped
		}
	}
}

// errStopped ends the loops when ctx ends; Run then returns nil.
var errStopped = errors.New("client: stopped")

// heartbeatLoop registers, then heartbeats every interval (the followed
// manager, or every manager while hunting). A manager that does not know
// the component (NotFound) gets the registration again. When the followed
// manager's answers stay ahead of the local topology for two heartbeats in
// a row (a stalled watch stream), it fetches the topology directly.
func (s *session) heartbeatLoop(ctx context.Context) error {
	c := s.c
	if err := s.register(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	iv := c.interval
	c.mu.Unlock()
	tk := time.NewTicker(iv)
	defer tk.Stop()
	var (
		behind  = make([]int, len(s.apis))
		fatalMu sync.Mutex
		fatal   error
		// Heartbeats go out on every tick whatever became of the last
		// one: a slow answer must not delay the next heartbeat, or a
		// busy machine turns one late round trip into missed beats. A
		// target whose previous heartbeat is still in flight is skipped
		// (that one is late already; behind[i] has one user at a time).
		inflight = make([]atomic.Bool, len(s.apis))
		beats    sync.WaitGroup
	)
	defer beats.Wait()
	for {
		select {
		case <-ctx.Done():
			return errStopped
		case <-tk.C:
		}
		c.mu.Lock()
		local := c.topo.GetRevision()
		req := &hamsv1.HeartbeatRequest{Id: c.cfg.Registration.GetId(), TopologyRevision: local, Incarnation: c.cfg.Registration.GetIncarnation()}
		if c.progress != nil {
			req.MaxSeq, req.DurableSeq = c.progress()
		}
		c.mu.Unlock()
		// A heartbeat older than a few intervals is worthless: give up on it
		// and send the next one.
		timeout := max(4*iv, 100*time.Millisecond)
		for _, i := range s.targets() {
			if !inflight[i].CompareAndSwap(false, true) {
				continue
			}
			beats.Add(1)
			go func() {
				defer beats.Done()
				defer inflight[i].Store(false)
				s.beat(ctx, i, req, iv, timeout, behind, &fatalMu, &fatal, local)
			}()
		}
		fatalMu.Lock()
		f := fatal
		fatalMu.Unlock()
		if f != nil {
			return f
		}
		if ctx.Err() != nil {
			return errStopped
		}
		c.mu.Lock()
		if c.interval != iv {
			iv = c.interval
			tk.Reset(iv)
		}
		c.mu.Unlock()
	}
}

// beat sends one heartbeat to manager i and acts on the answer (one beat
// per manager at a time: behind[i] is this call's).
func (s *session) beat(ctx context.Context, i int, req *hamsv1.HeartbeatRequest, iv, timeout time.Duration, behind []int,
	fatalMu *sync.Mutex, fatal *error, local uint64) {
	c := s.c
	api := s.apis[i]
	hctx, cancel := context.WithTimeout(ctx, timeout)
	var hdr metadata.MD
	t0 := time.Now()
	resp, err := api.Heartbeat(hctx, req, grpc.Header(&hdr))
	cancel()
	if el := time.Since(t0); el > iv {
		c.log.Info("slow heartbeat", "manager", c.addrs[i], "elapsed", el, "err", err)
	}
	switch {
	case err == nil:
		s.answered(i, nil, hdr)
		if resp.GetTopologyRevision() > local {
			behind[i]++
		} else {
			behind[i] = 0
		}
		if behind[i] >= 2 {
			behind[i] = 0
			gctx, cancel := context.WithTimeout(ctx, timeout)
			t, err := api.GetTopology(gctx, &hamsv1.GetTopologyRequest{})
			cancel()
			if err == nil {
				c.install(t, false)
			}
		}
	case ctx.Err() != nil:
	case status.Code(err) == codes.NotFound:
		c.log.Info("manager does not know this component; registering again", "manager", c.addrs[i])
		if err := s.registerOnce(ctx, i, max(timeout, time.Second)); errors.As(err, new(errRefused)) {
			fatalMu.Lock()
			*fatal = err
			fatalMu.Unlock()
		}
	default:
		s.answered(i, err, nil)
		c.log.Debug("heartbeat", "manager", c.addrs[i], "err", err)
	}
}

// watchLoop keeps a WatchTopology stream open to the followed manager
// (any manager's stream is right: they all follow the same stored
// topology), reconnecting with backoff, to the next manager in turn while
// none is followed.
func (s *session) watchLoop(ctx context.Context) {
	c := s.c
	b := newBackoff()
	last := -1
	for turn := 0; ; turn++ {
		i := s.target(turn)
		stream, err := s.apis[i].WatchTopology(ctx, &hamsv1.GetTopologyRequest{})
		if err == nil {
			// A stream from another manager than the last one may start
			// behind what the last one sent: its first topology only
			// replaces an older one.
			first := i != last
			last = i
			for {
				t, rerr := stream.Recv()
				if rerr != nil {
					err = rerr
					break
				}
				b.reset()
				c.install(t, !first)
				first = false
			}
		}
		if ctx.Err() != nil {
			return
		}
		d := b.next()
		c.log.Debug("topology watch ended", "manager", c.addrs[i], "err", err, "retry_in", d)
		if !run.Sleep(ctx, d) {
			return
		}
	}
}

type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{} }

func (b *backoff) reset() { b.d = 0 }

// next returns the next delay: doubling from minBackoff to maxBackoff, with
// up to 25% jitter so restarted components do not reconnect in lockstep.
func (b *backoff) next() time.Duration {
	if b.d == 0 {
		b.d = minBackoff
	} else {
		b.d = min(2*b.d, maxBackoff)
	}
	return b.d - time.Duration(rand.Int64N(int64(b.d)/4+1))
}
