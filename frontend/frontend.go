package frontend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hams-go/hams/protocol/lineage"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/audit"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/edge"
	"github.com/hams-go/hams/internal/grpcx"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// Resolver finds the live instance of a model (same shape as
// sidecar.Resolver; implemented by manager/client.Client).
type Resolver interface {
	// Resolve returns the dataplane gRPC address of the live instance that
	// receives traffic for model, and its epoch.
	Resolve(model string) (addr string, epoch uint64, ok bool)
	// Changed is closed (and replaced) whenever the topology changes.
	Changed() <-chan struct{}
}

// Defaults of the optional Config fields.
const (
	DefaultReplyCacheSize = 16384
	DefaultReplyCacheTTL  = 5 * time.Minute
	// shutdownGrace bounds the graceful stop of the servers.
	shutdownGrace = 2 * time.Second
)

// Sentinel errors.
var (
	// ErrConfig is wrapped by every error New returns for a bad Config.
	ErrConfig = errors.New("frontend: invalid config")
	// ErrShutdown answers requests still pending when Run ends.
	ErrShutdown = errors.New("frontend: shutting down")
)

// Config configures a Frontend. Deployment, Resolver, GRPCListener and
// InternalListener are required; HTTPListener is optional (no HTTP API
// without it).
type Config struct {
	Deployment *config.Deployment
	Resolver   Resolver
	// GRPCListener serves the client APIs only: hamsv1.Frontend, the TF
	// Serving and KServe v2 compatibility APIs (compat.go) and the raw
	// pass-through (passraw.go). No internal service is served on it.
	GRPCListener net.Listener
	// InternalListener serves the internal services only: hamsv1.Dataplane
	// (the sink edges: the last models' sidecars Forward to the frontend)
	// and hamsv1.Replication (the manager's Resend, lineage summaries).
	// Its address is the one registered in the topology (Address).
	InternalListener net.Listener
	HTTPListener     net.Listener // HTTP/JSON client API, /metrics, /healthz
	Logger           *slog.Logger
	Registry         *prometheus.Registry

	// InternalServerOptions are appended to the internal server's options
	// (transport credentials, an authorization interceptor).
	InternalServerOptions []grpc.ServerOption
	// DialOptions are appended to every internal dial of the frontend:
	// the entry edges to the sidecars, the pass-through models' backends
	// and the sink models' Resend (request log).
	DialOptions []grpc.DialOption
	// ClientAuth authenticates and authorizes the clients of the client
	// APIs (clientauth.go; NewClientAuth builds it from the deployment's
	// client_auth block). Nil: the client ports are open (New refuses nil
	// when the deployment configures client_auth).
	ClientAuth *ClientAuth

	// ReplyCacheSize bounds the answers kept for idempotent retries
	// (default DefaultReplyCacheSize; negative disables the cache of
	// answered requests, in-flight retries still join).
	ReplyCacheSize int
	// ReplyCacheTTL is how long an answer is kept (default
	// DefaultReplyCacheTTL).
	ReplyCacheTTL time.Duration

	// Coord is the coordination engine (*coord.Coord): durability notices
	// gate replies in the early-release modes (nspb, nspb-s2), and the
	// req_ids of answered requests are published in completion notices so
	// primaries garbage-collect saved outputs. Nil means no coordination
	// (bare deployments); New refuses nil in an early-release mode whose
	// deployment replicates a stateful model.
	Coord Coord
	// Name identifies this frontend in completion notices and names its
	// audit subdirectory (default config.Frontend).
	Name string
	// AuditDir, when set, receives AuditDir/<Name>/replies.jsonl: one
	// record per reply released to a client.
	AuditDir string

	// Log is the request log (*coord.Coord): with it, every accepted
	// request is logged before it enters the graph, every answer is
	// recorded before it is released, and several frontends share one
	// deployment (requestlog.go). Nil: a lone frontend without a log.
	Log RequestLog
	// Address is the gRPC address this frontend is registered under in the
	// topology (default InternalListener's address): the frontend whose address
	// the Resolver returns for config.Frontend receives the sink edges and
	// is the one that injects requests into the graph.
	Address string
}

// sender is what the frontend needs of an outbound edge (edge.Sender).
type sender interface {
	Run(ctx context.Context) error
	Send(items ...*hamsv1.Item)
	Full() bool
	Resend(spec edge.ResendSpec) int
	Complete(reqIDs ...uint64)
}

// Frontend serves the client APIs and collects replies from the sink edges.
type Frontend struct {
	cfg      Config
	traced   traceReqs      // trace contexts of requests being admitted (tracing.go)
	hw       *healthTracker // backend health (health.go)
	log      *slog.Logger
	maxBytes int
	timeout  time.Duration
	now      func() time.Time
	m        *metrics
	// maxDecoded bounds the tensor bytes decoded from one request on any
	// API (config.Limits.MaxDecodedBytes); maxRows is
	// limits.max_rows_per_request; admit bounds the work in flight
	// (admission.go).
	maxDecoded int
	maxRows    int
	admit      *admission

	services map[string]*serviceInfo
	svcOrder []string
	// pass holds the pass-through models (passthrough.go) by model and
	// by service name; they are not among services. passIDs numbers
	// their calls.
	pass    map[string]*passThrough
	passIDs atomic.Uint64
	// senders holds one outbound edge per entry model (a model serves one
	// service, so entry models are distinct across services).
	senders  map[string]sender
	receiver *edge.Receiver
	// grpc serves the client APIs on GRPCListener, internal the internal
	// services on InternalListener.
	grpc     *grpc.Server
	internal *grpc.Server
	// http is the HTTP API (httpapi.go) served on HTTPListener.
	http http.Handler
	// auth is the client authentication (nil: open client ports).
	auth clientGate

	// kick wakes the expiry loop when an earlier deadline was added.
	kick chan struct{}

	name string
	// stateful holds the replicated stateful models (stateful with ha:
	// stateful) and watchModels the same names, sorted; a reply depends on
	// the durability of those in its lineage.
	stateful    map[string]bool
	watchModels []string
	// complKick wakes the completion loop when the first id is queued,
	// complFull when a whole batch is.
	complKick chan struct{}
	complFull chan struct{}

	// mu guards the request table, the hold area, the calls, the in-flight
	// index, the reply cache and the completion and audit queues.
	// Invariant: calls holds exactly the req_ids of table.pending, those of
	// holds, and (with a request log) those of calls being logged, waiting
	// for another frontend's answer or being recorded (recording set), all
	// disjoint; table.pending and holds hold only injected calls; inflight
	// holds exactly the calls with a request_id that are not done (or the
	// call a joined attempt was merged into); every done call's req_id was
	// queued in doneIDs once (with a Coord) by the frontend that injected
	// it.
	mu sync.Mutex
	// holds is nil when replies are not gated.
	holds    *holds
	doneIDs  []uint64
	auditQ   []*hamsv1.PredictResponse
	table    *table
	calls    map[uint64]*call
	inflight map[idemKey]*call
	cache    *replyCache
	closed   bool
	// active counts client calls inside predict; drained is closed when
	// it is zero after closed was set.
	active  int
	drained chan struct{}

	// orphans keeps sink items of requests not pending (guarded by mu).
	orphans *orphans
	// Request-log state (requestlog.go), guarded by mu: leader says this
	// frontend currently injects requests; leadTerm counts the changes of
	// leader (so a decision taken in one term is not applied in another);
	// leadFence is the stream sequence of a record this frontend began to
	// log while leading in leadTerm (0: none yet; every record at or above
	// it was logged after the takeover); mir is the log mirror (nil
	// without a log); recQ holds answers waiting to be recorded.
	leader    bool
	leadTerm  uint64
	leadFence uint64
	mir       *logMirror
	recQ      []recording
	recKick   chan struct{}
	// expired logs the requests whose deadline passed unanswered, with
	// where each was then (expirylog.go; guarded by mu).
	expired *expiryLog

	// auditLog is the replies.jsonl writer (nil without AuditDir), set by
	// Run before anything is answered.
	auditLog *audit.Log

	// flowMu guards flow, the lineage index of received sink items.
	flowMu sync.Mutex
	flow   *lineage.Flow
}

// call is one execution of a client request, shared by every client call
// that carries its request_id while it runs.
type call struct {
	reqID   uint64
	service string
	key     idemKey
	hasKey  bool
	waiters int
	done    chan struct{} // closed once resp/err are set
	resp    *hamsv1.PredictResponse
	err     error
	// With a request log: injected says this frontend sent the request
	// into the graph (so it records the answer); recording that the answer
	// is being recorded.
	injected  bool
	recording bool
	// loggedIn is the leader term (Frontend.leadTerm) in which this
	// frontend began to log the request while leading; 0 when it
	// followed. predictLogged injects such a call on the log's
	// acknowledgement, so the log consumer leaves it alone.
	loggedIn uint64
	// logDelivered: the log consumer delivered the request's record (so
	// it is stored) and left it to this call (loggedIn); logSeq is its
	// stream sequence. When the log write's acknowledgement is lost
	// after that, predictLogged goes on as if it had come.
	logDelivered bool
	logSeq       uint64
	// sinks, requestID, streamID, inputs and deadline let a logged request
	// be injected later (it was logged while another frontend led).
	req      *hamsv1.PredictRequest
	deadline time.Time
	// items are the items sent on the entry edges, in entry order (their
	// EdgeSeq is the position the Sender assigned): what Resend resends
	// while the request is unanswered. The Sender owns them; read-only.
	items []*hamsv1.Item
	// linked are calls merged into this one (joined attempts of a logged
	// request); they get the same answer.
	linked []*call
	// audited: the reply's audit record is written already (recorded
	// answers are audited before they are released, requestlog.go).
	audited bool
	// gate: the frontend.gate span while the reply waits (tracing.go).
	gate trace.Span
}

// New validates cfg and builds the frontend (no I/O).
func New(cfg Config) (*Frontend, error) {
	if cfg.Deployment == nil {
		return nil, fmt.Errorf("%w: no deployment", ErrConfig)
	}
	if cfg.Resolver == nil {
		return nil, fmt.Errorf("%w: no resolver", ErrConfig)
	}
	if cfg.GRPCListener == nil {
		return nil, fmt.Errorf("%w: no gRPC listener", ErrConfig)
	}
	if cfg.InternalListener == nil {
		return nil, fmt.Errorf("%w: no internal listener (Dataplane, Replication)", ErrConfig)
	}
	if cfg.Deployment.ClientAuth != nil && cfg.ClientAuth == nil {
		return nil, fmt.Errorf("%w: deployment %q configures client_auth but Config.ClientAuth is nil (NewClientAuth)", ErrConfig, cfg.Deployment.Name)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.ReplyCacheSize == 0 {
		cfg.ReplyCacheSize = DefaultReplyCacheSize
	}
	if cfg.ReplyCacheTTL <= 0 {
		cfg.ReplyCacheTTL = DefaultReplyCacheTTL
	}
	if cfg.Name == "" {
		cfg.Name = config.Frontend
	}
	if cfg.AuditDir != "" && (cfg.Name == "." || cfg.Name == ".." || strings.ContainsAny(cfg.Name, `/\`)) {
		return nil, fmt.Errorf("%w: name %q cannot name an audit subdirectory", ErrConfig, cfg.Name)
	}
	d := cfg.Deployment
	f := &Frontend{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "frontend"),
		maxBytes:  d.Limits.MaxMessageBytes,
		timeout:   d.Limits.RequestTimeout.D(),
		now:       time.Now,
		services:  map[string]*serviceInfo{},
		pass:      map[string]*passThrough{},
		senders:   map[string]sender{},
		kick:      make(chan struct{}, 1),
		drained:   make(chan struct{}),
		table:     newTable(),
		calls:     map[uint64]*call{},
		inflight:  map[idemKey]*call{},
		cache:     newReplyCache(cfg.ReplyCacheSize, cfg.ReplyCacheTTL),
		name:      cfg.Name,
		stateful:  map[string]bool{},
		complKick: make(chan struct{}, 1),
		complFull: make(chan struct{}, 1),
		orphans:   newOrphans(),
		recKick:   make(chan struct{}, 1),
		flow:      lineage.NewFlow(),
		leader:    cfg.Log == nil,
	}
	f.expired = newExpiryLog(f.log)
	if f.cfg.Address == "" {
		f.cfg.Address = cfg.InternalListener.Addr().String()
	}
	if cfg.Log != nil {
		f.mir = newLogMirror(f.timeout + takeoverSlack)
	}
	for _, m := range d.StatefulModels() {
		f.stateful[m] = true
		f.watchModels = append(f.watchModels, m)
	}
	sort.Strings(f.watchModels)
	if gatingModes[d.RunMode()] && len(f.watchModels) > 0 {
		if cfg.Coord == nil {
			return nil, fmt.Errorf("%w: mode %q releases replies only once the states they depend on are durable, which needs a Coord (stateful models %v)",
				ErrConfig, d.Mode, f.watchModels)
		}
		f.holds = newHolds()
	}
	if f.maxBytes <= 0 {
		f.maxBytes = grpcx.DefaultMaxMessageBytes
	}
	if f.maxDecoded = d.Limits.MaxDecodedBytes(); f.maxDecoded <= 0 {
		f.maxDecoded = f.maxBytes
	}
	f.maxRows = d.Limits.MaxRowsPerRequest
	if f.maxRows == 0 {
		f.maxRows = config.DefaultMaxRowsPerRequest
	}
	maxReqs, maxInflight := d.Limits.MaxInflightRequests, d.Limits.MaxInflightBytes
	if maxReqs == 0 {
		maxReqs = config.DefaultMaxInflightRequests
	}
	if maxInflight == 0 {
		maxInflight = config.DefaultInflightMessages * int64(f.maxBytes)
	}
	f.admit = newAdmission(maxReqs, max(maxInflight, int64(f.maxBytes)))
	if f.timeout <= 0 {
		f.timeout = 10 * time.Second
	}
	if len(d.Services) == 0 {
		return nil, fmt.Errorf("%w: deployment has no services", ErrConfig)
	}
	for i := range d.Services {
		if ms := d.Services[i].Graph().Models(); len(ms) == 1 && d.PassThrough(ms[0]) {
			// A pass-through backend is the operator's own model server
			// (TF Serving, Triton), dialled as it is: not with the
			// internal identities of DialOptions.
			p, err := newPassThrough(d.Model(ms[0]), d.Services[i].Name, f.maxBytes, nil)
			if err != nil {
				f.closePass()
				return nil, err
			}
			p.rejectNonFinite = d.RejectNonFinite(d.Services[i].Name)
			f.pass[p.model], f.pass[p.service] = p, p
			continue
		}
		s := newServiceInfo(d, &d.Services[i])
		if len(s.entries) == 0 || len(s.sinks) == 0 {
			f.closePass()
			return nil, fmt.Errorf("%w: service %q has no entry or no sink model", ErrConfig, s.name)
		}
		f.services[s.name] = s
		f.svcOrder = append(f.svcOrder, s.name)
		for _, e := range s.entries {
			if _, dup := f.senders[e]; dup {
				f.closePass()
				return nil, fmt.Errorf("%w: model %q is an entry of two services", ErrConfig, e)
			}
			snd, err := edge.NewSender(edge.SenderConfig{
				From: config.Frontend, To: e, Resolver: cfg.Resolver,
				MaxMessageBytes: f.maxBytes, Logger: cfg.Logger,
				DialOptions: cfg.DialOptions,
				Epoch:       f.epoch,
				// The frontend's position on an entry edge is the req_id
				// (sidecar.PredSeq): unlike edge_seq, which a Resend
				// renumbers from 1, it stays the same for a request and
				// grows with every new one, so a resend position learnt
				// from the successors' lineage never skips a request.
				Position: func(it *hamsv1.Item) uint64 { return it.GetReqId() },
				// Another frontend that believed it led (a stale topology)
				// sent on this edge: the entry model now refuses this
				// sender; a leader takes the edge back (requestlog.go).
				OnStaleIncarnation: func() { f.retakeEntry(e) },
			})
			if err != nil {
				f.closePass()
				return nil, fmt.Errorf("frontend: edge to entry model %q: %w", e, err)
			}
			f.senders[e] = f.traceSender(snd) // snd itself when tracing is off
		}
	}
	m, err := newMetrics(cfg.Registry, f.pendingCount, f.cacheCount, f.heldCount)
	if err != nil {
		f.closePass()
		return nil, fmt.Errorf("frontend: register metrics: %w", err)
	}
	f.m = m
	f.receiver = edge.NewReceiver(config.Frontend, f.deliver, cfg.Logger)
	srvMetrics := grpcx.NewServerMetrics(nil)
	if err := cfg.Registry.Register(srvMetrics); err != nil {
		f.closePass()
		return nil, fmt.Errorf("frontend: register gRPC metrics: %w", err)
	}
	// The client server: the client APIs only. passraw.go: the
	// unknown-method handler, behind a gate that runs before grpcx's
	// interceptors (options chain in order); client authentication
	// (clientauth.go) comes after them, so its refusals are counted and
	// logged like any other answer.
	clientOpts := append([]grpc.ServerOption{grpc.ChainStreamInterceptor(unknownGate)}, grpcx.ServerOptions(f.log, srvMetrics, f.maxBytes)...)
	clientOpts = append(clientOpts, grpc.UnknownServiceHandler(f.proxyUnknown))
	if cfg.ClientAuth != nil {
		f.auth = cfg.ClientAuth
		clientOpts = append(clientOpts, f.clientAuthOptions()...)
	}
	f.grpc = grpc.NewServer(clientOpts...)
	hamsv1.RegisterFrontendServer(f.grpc, &frontendServer{f: f})
	// Compatibility APIs (compat.go) on the same port.
	tfapis.RegisterPredictionServiceServer(f.grpc, &tfPredictServer{f: f})
	tfapis.RegisterModelServiceServer(f.grpc, &tfModelServer{f: f})
	inference.RegisterGRPCInferenceServiceServer(f.grpc, &kserveServer{f: f})
	srvMetrics.InitializeMetrics(f.grpc)
	// The internal server: the sink edges and the manager's RPCs, on a
	// port clients never reach.
	f.internal = grpc.NewServer(append(grpcx.ServerOptions(f.log, srvMetrics, f.maxBytes), cfg.InternalServerOptions...)...)
	hamsv1.RegisterDataplaneServer(f.internal, f.receiver)
	hamsv1.RegisterReplicationServer(f.internal, &replicationServer{f: f})
	f.registerHealth()
	srvMetrics.InitializeMetrics(f.internal)
	f.http = newHTTPAPI(f).httpHandler()
	return f, nil
}

// closePass closes the connections of the pass-through models.
func (f *Frontend) closePass() {
	for name, p := range f.pass {
		if name == p.model {
			p.cc.Close()
		}
	}
}

// Handler is the HTTP handler served on HTTPListener (for embedding).
func (f *Frontend) Handler() http.Handler { return f.http }

// Run serves until ctx ends: the gRPC server, the HTTP server (if a
// listener was given), one sender per entry edge and the expiry loop. When
// ctx ends, pending requests are answered Unavailable and Run returns after
// every goroutine it started has ended.
func (f *Frontend) Run(ctx context.Context) error {
	var auditLog *audit.Log
	if f.cfg.AuditDir != "" {
		l, err := audit.Open(f.cfg.AuditDir, f.name, audit.RepliesFile)
		if err != nil {
			return fmt.Errorf("frontend: %w", err)
		}
		auditLog = l
		f.auditLog = l
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(what string, err error) {
		if err == nil || errors.Is(err, context.Canceled) {
			return
		}
		errOnce.Do(func() { firstErr = fmt.Errorf("frontend: %s: %w", what, err) })
		cancel()
	}
	start := func(what string, fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail(what, fn())
		}()
	}
	if f.cfg.Log != nil {
		if err := f.startLog(ctx); err != nil {
			return fmt.Errorf("frontend: request log: %w", err)
		}
		start("request log", func() error { return f.runLog(ctx) })
	}
	f.log.Info("frontend serving", "grpc", f.cfg.GRPCListener.Addr().String(), "internal", f.cfg.InternalListener.Addr().String(),
		"http", addrOf(f.cfg.HTTPListener), "address", f.cfg.Address, "client_auth", f.auth != nil, "services", f.svcOrder)
	for name, s := range f.senders {
		start("edge to "+name, func() error { return s.Run(ctx) })
	}
	start("expiry loop", func() error { f.expiryLoop(ctx); return nil })
	start("backend health", func() error { f.hw.run(ctx); return nil })
	if f.holds != nil {
		start("durability watch", func() error { f.watchDurability(ctx); return nil })
	}
	if f.cfg.Coord != nil {
		start("completion notices", func() error { f.completionLoop(ctx); return nil })
	}
	if auditLog != nil {
		start("audit log", func() error { f.auditLoop(ctx, auditLog); return nil })
	}
	start("gRPC server", func() error { return f.serveGRPC(ctx) })
	if f.cfg.HTTPListener != nil {
		start("HTTP server", func() error { return grpcx.ServeHTTP(ctx, f.http, f.httpListener()) })
	}
	<-ctx.Done()
	f.shutdown()
	wg.Wait()
	f.closePass()
	if f.cfg.Coord != nil {
		f.finalCompletions()
	}
	if auditLog != nil {
		f.writeAudit(auditLog)
		if err := auditLog.Close(); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("frontend: close audit log: %w", err)
		}
	}
	f.log.Info("frontend stopped")
	return firstErr
}

func addrOf(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// serveGRPC serves the client and the internal server until ctx ends.
// Client calls end promptly once shutdown answered what was pending, but
// the inbound Forward streams of the sink edges never end on their own,
// so the servers are stopped hard once the client calls drained (after a
// short flush) or shutdownGrace ran out.
func (f *Frontend) serveGRPC(ctx context.Context) error {
	servers := []struct {
		srv *grpc.Server
		lis net.Listener
	}{{f.grpc, f.cfg.GRPCListener}, {f.internal, f.cfg.InternalListener}}
	errc := make(chan error, len(servers))
	for _, s := range servers {
		go func() { errc <- s.srv.Serve(s.lis) }()
	}
	var err error
	pending := len(servers)
	select {
	case err = <-errc:
		pending--
		// One server failed: stop the other too.
	case <-ctx.Done():
		f.shutdown()
		grace := time.NewTimer(shutdownGrace)
		defer grace.Stop()
		select {
		case <-f.drained:
		case <-grace.C:
		}
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for _, s := range servers {
			s.srv.GracefulStop()
		}
	}()
	flush := time.NewTimer(100 * time.Millisecond)
	defer flush.Stop()
	select {
	case <-stopped:
	case <-flush.C:
		for _, s := range servers {
			s.srv.Stop()
		}
		<-stopped
	}
	for range pending {
		<-errc
	}
	return err
}

// shutdown answers every pending call with Unavailable and refuses new ones.
func (f *Frontend) shutdown() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.closed = true
	if n := len(f.calls); n > 0 {
		f.log.Info("frontend stopping: answering pending requests Unavailable", "pending", n)
	}
	for id, c := range f.calls {
		f.table.remove(id)
		if f.holds != nil {
			f.holds.drop(id)
		}
		f.finishLocked(c, nil, status.Error(codes.Unavailable, ErrShutdown.Error()), false)
	}
	if f.active == 0 {
		close(f.drained)
	}
}

// enter counts a client call in; it fails once the frontend shuts down.
func (f *Frontend) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.active++
	return true
}

// leave counts a client call out; the last one after shutdown closes
// drained.
func (f *Frontend) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active--
	if f.closed && f.active == 0 {
		close(f.drained)
	}
}

// expiryLoop expires pending requests at their deadlines (a backstop: a
// waiting client also gives up on its own context).
func (f *Frontend) expiryLoop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		f.mu.Lock()
		now := f.now()
		for _, c := range f.table.expire(now) {
			if cl := f.calls[c.reqID]; cl != nil {
				if !cl.answered() {
					f.expired.expired(cl, now, expiredWhere(c.err))
				}
				f.finishLocked(cl, nil, c.err, false)
			}
		}
		next, ok := f.table.nextDeadline()
		if f.holds != nil {
			for _, h := range f.holds.expire(now) {
				if cl := f.calls[h.reqID]; cl != nil {
					if !cl.answered() {
						f.expired.expired(cl, now, expiredWhere(h.err))
					}
					f.finishLocked(cl, nil, h.err, false)
				}
			}
			if hn, hok := f.holds.nextDeadline(); hok && (!ok || hn.Before(next)) {
				next, ok = hn, true
			}
		}
		f.mu.Unlock()
		wait := time.Hour
		if ok {
			wait = max(next.Sub(f.now()), time.Millisecond)
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
		case <-t.C:
		}
	}
}

// deliver receives in-order items of a sink edge (from the Receiver).
func (f *Frontend) deliver(from string, items []*hamsv1.Item) {
	f.flowMu.Lock()
	for _, it := range items {
		f.flow.Add(it.GetLineage())
		addSink(f.flow, from, it.GetLineage())
	}
	f.flowMu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, it := range items {
		f.deliverLocked(from, it)
	}
}

// deliverLocked hands one sink item to the table; an item of a request
// that is not pending is kept among the orphans (a request this frontend
// is about to take over, or a re-executed item that overtook a rollback).
func (f *Frontend) deliverLocked(from string, it *hamsv1.Item) {
	if f.holds != nil && f.holds.lostLater(it.GetLineage()) {
		// Computed from state a failover lost (see holds.lostLater): the
		// re-execution will come.
		f.m.lateItems.Inc()
		f.log.Debug("sink item from lost state dropped", "req_id", it.GetReqId(), "from", from)
		return
	}
	{
		res, comp := f.table.deliver(from, it)
		switch res {
		case completed:
			f.traceGate(comp.reqID, it)
			f.completeLocked(comp)
		case partStored:
			f.log.Debug("sink part arrived", "req_id", it.GetReqId(), "from", from)
		case unknownReq:
			f.orphans.add(from, it)
			f.m.lateItems.Inc()
			f.log.Debug("sink item kept aside", "req_id", it.GetReqId(), "from", from, "reason", res.String())
		default:
			f.m.lateItems.Inc()
			f.log.Debug("sink item dropped", "req_id", it.GetReqId(), "from", from, "reason", res.String())
		}
	}
}

func (r deliverResult) String() string {
	switch r {
	case partStored:
		return "stored"
	case completed:
		return "completed"
	case unknownReq:
		return "request not pending"
	case unexpectedSink:
		return "not a sink of the service"
	case duplicatePart:
		return "duplicate part"
	}
	return "unknown"
}

// completeLocked handles a request that left the table: an error is
// answered at once; a reply is answered once every stateful state it
// depends on is durable (at once when replies are not gated), else it
// waits in the hold area.
func (f *Frontend) completeLocked(comp *completion) {
	c := f.calls[comp.reqID]
	if c == nil {
		return
	}
	if comp.err != nil || f.holds == nil {
		f.finishLocked(c, comp.resp, comp.err, true)
		return
	}
	now := f.now()
	deps := replyDeps(comp.resp.GetLineage(), f.stateful)
	if f.holds.holdComp(comp, deps, now) {
		f.m.gatingWait.Observe(0)
		f.finishLocked(c, comp.resp, nil, true)
		return
	}
	f.log.Debug("reply held for durability", "req_id", comp.reqID, "deps", deps)
	if next, _ := f.holds.nextDeadline(); next.Equal(comp.deadline) {
		signal(f.kick)
	}
}

// finishLocked answers a call once; remember says whether the answer is
// kept for idempotent retries (replies and model errors are; deadline,
// cancellation and shutdown are not, so a retry executes again).
func (f *Frontend) finishLocked(c *call, resp *hamsv1.PredictResponse, err error, remember bool) {
	if f.cfg.Log != nil && remember && c.injected {
		// The answer leaves only once it is recorded (requestlog.go).
		f.recordLocked(c, resp, err)
		return
	}
	// With a log, only the frontend that injected a request publishes its
	// completion and audits it (a follower's answer is the leader's).
	f.answerLocked(c, resp, err, remember, f.cfg.Log == nil || c.injected)
}

// answerLocked answers a call once. own says this frontend produced the
// answer (it publishes the completion and audits the reply); an answer
// another frontend recorded is neither.
func (f *Frontend) answerLocked(c *call, resp *hamsv1.PredictResponse, err error, remember, own bool) {
	select {
	case <-c.done:
		return
	default:
	}
	endGate(c, err)
	c.resp, c.err = resp, err
	close(c.done)
	for _, l := range c.linked {
		select {
		case <-l.done:
		default:
			l.resp, l.err = resp, err
			close(l.done)
		}
	}
	if f.calls[c.reqID] == c {
		delete(f.calls, c.reqID)
	}
	// The request left the graph: the entry edges need not keep its items
	// for a Resend.
	if svc := f.services[c.service]; svc != nil {
		for _, e := range svc.entries {
			f.senders[e].Complete(c.reqID)
		}
	}
	if remember {
		// Recorded (or, without a log, released): a log record of it
		// delivered later is not open (logMirror).
		f.mir.answer(c.reqID, f.now())
	}
	if c.hasKey {
		if f.inflight[c.key] == c {
			delete(f.inflight, c.key)
		}
		if remember {
			f.cache.put(c.key, resp, err, f.now())
		}
	}
	if own {
		f.noteAnsweredLocked(c.reqID, resp, err, c.audited)
	}
}

// epoch is the frontend's own epoch as the topology knows it (0 when it is
// not registered), stamped on the batches of the entry edges.
func (f *Frontend) epoch() uint64 {
	_, ep, _ := f.cfg.Resolver.Resolve(config.Frontend)
	return ep
}

func (f *Frontend) pendingCount() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return float64(f.table.len())
}

func (f *Frontend) heldCount() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holds == nil {
		return 0
	}
	return float64(f.holds.len())
}

func (f *Frontend) cacheCount() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return float64(f.cache.len())
}

// predict is the request path shared by the gRPC and HTTP APIs: validate,
// join an identical in-flight or answered request, else admit it into the
// table, send one item per entry model and wait for the sinks.
func (f *Frontend) predict(ctx context.Context, req *hamsv1.PredictRequest) (resp *hamsv1.PredictResponse, err error) {
	return f.predictAdmitted(ctx, req, false)
}

// predictAdmitted is predict; admitted says the caller holds the
// request's admission already (the HTTP API admits a body before reading
// it).
func (f *Frontend) predictAdmitted(ctx context.Context, req *hamsv1.PredictRequest, admitted bool) (resp *hamsv1.PredictResponse, err error) {
	start := time.Now()
	svcLabel := unknownService
	if !f.enter() {
		f.m.requests.WithLabelValues(svcLabel, codes.Unavailable.String()).Inc()
		return nil, status.Error(codes.Unavailable, ErrShutdown.Error())
	}
	defer f.leave()
	f.m.inFlight.Inc()
	defer func() {
		f.m.inFlight.Dec()
		code := status.Code(err)
		f.m.requests.WithLabelValues(svcLabel, code.String()).Inc()
		if err == nil && resp.GetApproximate() {
			f.m.approximate.WithLabelValues(svcLabel).Inc()
		}
		f.m.latency.WithLabelValues(svcLabel).Observe(time.Since(start).Seconds())
		f.log.Debug("predict", "service", req.GetService(), "request_id", req.GetRequestId(),
			"req_id", resp.GetReqId(), "code", code.String(), "approximate", resp.GetApproximate(), "err", err, "elapsed", time.Since(start))
	}()
	if req.GetService() == "" {
		return nil, status.Error(codes.InvalidArgument, "missing service name")
	}
	svc := f.services[req.GetService()]
	if svc == nil {
		if p := f.pass[req.GetService()]; p != nil && p.service == req.GetService() {
			return nil, p.hamsAPI()
		}
		return nil, status.Errorf(codes.NotFound, "unknown service %q", req.GetService())
	}
	svcLabel = svc.name
	ctx, span, traceCtx := f.tracePredict(ctx, svc.name, req) // nil when tracing is off (tracing.go)
	defer func() { f.endPredict(span, req, resp, err) }()
	if err := svc.validateInputs(req.GetInputs(), f.maxDecoded); err != nil {
		return nil, err
	}
	if err := svc.checkRows(req.GetInputs(), f.maxRows); err != nil {
		return nil, err
	}
	if !admitted {
		release, err := f.admit.acquire(svc.name, requestBytes(req))
		if err != nil {
			f.m.refused.Inc()
			return nil, err
		}
		defer release()
	}
	if err := svc.checkFinite(req.GetInputs()); err != nil {
		return nil, err
	}
	if err := f.checkItemSize(svc, req); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()

	key := idemKey{service: svc.name, requestID: req.GetRequestId()}
	hasKey := key.requestID != ""
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, status.Error(codes.Unavailable, ErrShutdown.Error())
	}
	if hasKey {
		if c := f.inflight[key]; c != nil {
			c.waiters++
			f.mu.Unlock()
			f.m.cacheHits.WithLabelValues(svc.name, "inflight").Inc()
			return f.wait(ctx, c)
		}
		if a, ok := f.cache.get(key, f.now()); ok {
			f.mu.Unlock()
			f.m.cacheHits.WithLabelValues(svc.name, "answered").Inc()
			return a.resp, a.err
		}
	}
	for _, e := range svc.entries {
		if _, _, ok := f.cfg.Resolver.Resolve(e); !ok {
			f.mu.Unlock()
			return nil, status.Errorf(codes.Unavailable, "service %q: entry model %q has no live instance", svc.name, e)
		}
		if f.senders[e].Full() {
			f.mu.Unlock()
			return nil, status.Errorf(codes.Unavailable, "service %q: entry model %q is backlogged", svc.name, e)
		}
	}
	if err := f.backendsDown(svc); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	if f.cfg.Log != nil {
		f.mu.Unlock()
		return f.predictLogged(ctx, svc, req, key, deadline)
	}
	c := &call{service: svc.name, key: key, hasKey: hasKey, waiters: 1, done: make(chan struct{})}
	c.reqID = f.table.add(svc.name, req.GetRequestId(), svc.sinks, deadline)
	f.calls[c.reqID] = c
	if hasKey {
		f.inflight[key] = c
	}
	if next, _ := f.table.nextDeadline(); next.Equal(deadline) {
		signal(f.kick)
	}
	streamID := req.GetStreamId()
	if streamID == "" {
		streamID = req.GetRequestId()
	}
	if streamID == "" {
		streamID = fmt.Sprint(c.reqID)
	}
	// Items are sent under mu so that edge_seq order equals req_id order on
	// every entry edge.
	for _, e := range svc.entries {
		it := &hamsv1.Item{
			ReqId:            c.reqID,
			Service:          svc.name,
			StreamId:         streamID,
			Tensors:          req.GetInputs(),
			DeadlineUnixNano: deadline.UnixNano(),
			TraceContext:     traceCtx,
		}
		c.items = append(c.items, it)
		f.senders[e].Send(it)
	}
	f.mu.Unlock()
	f.log.Debug("request admitted", "service", svc.name, "req_id", c.reqID, "request_id", req.GetRequestId(), "stream_id", streamID)
	return f.wait(ctx, c)
}

// itemHeadroom is room kept under the message limit for what an item
// gathers on its way through the graph (lineage entries, batch framing).
const itemHeadroom = 4096

// checkItemSize refuses a request whose item could not travel an edge: an
// item over the message limit would be rejected by every receiver and
// resent forever.
func (f *Frontend) checkItemSize(svc *serviceInfo, req *hamsv1.PredictRequest) error {
	it := &hamsv1.Item{ReqId: ^uint64(0), Service: svc.name, StreamId: req.GetStreamId() + req.GetRequestId() + "-",
		Tensors: req.GetInputs(), EdgeSeq: ^uint64(0), DeadlineRemainingNano: -1, FromModel: config.Frontend}
	size := proto.Size(it)
	if size+itemHeadroom <= f.maxBytes {
		return nil
	}
	largest := req.GetInputs()[0]
	for _, t := range req.GetInputs() {
		if len(t.GetData()) > len(largest.GetData()) {
			largest = t
		}
	}
	return status.Errorf(codes.ResourceExhausted, "service %q: input %q: request of %d bytes leaves less than %d bytes of room under the %d-byte message limit",
		svc.name, largest.GetName(), size, itemHeadroom, f.maxBytes)
}

// wait blocks until the call is answered or this caller's ctx ends. The
// last caller to give up takes the request out of the table.
func (f *Frontend) wait(ctx context.Context, c *call) (*hamsv1.PredictResponse, error) {
	select {
	case <-c.done:
		return c.resp, c.err
	case <-ctx.Done():
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-c.done:
		return c.resp, c.err
	default:
	}
	err := status.FromContextError(ctx.Err()).Err()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = status.Errorf(codes.DeadlineExceeded, "service %q: request %d: deadline exceeded", c.service, c.reqID)
	}
	c.waiters--
	if c.waiters == 0 {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			f.expired.expired(c, f.now(), f.whereLocked(c))
		}
		if f.calls[c.reqID] == c {
			f.table.remove(c.reqID)
			if f.holds != nil {
				f.holds.drop(c.reqID)
			}
		}
		f.finishLocked(c, nil, err, false)
	}
	return nil, err
}

// listServices describes every service in deployment order.
func (f *Frontend) listServices() *hamsv1.ListServicesResponse {
	out := &hamsv1.ListServicesResponse{}
	for _, n := range f.svcOrder {
		out.Services = append(out.Services, f.services[n].proto())
	}
	return out
}

// unresolved lists the entry models without a live instance, sorted.
func (f *Frontend) unresolved() []string {
	var out []string
	for e := range f.senders {
		if _, _, ok := f.cfg.Resolver.Resolve(e); !ok {
			out = append(out, e)
		}
	}
	out = append(out, f.notReady()...) // backends known down (health.go)
	sort.Strings(out)
	return slices.Compact(out)
}

// frontendServer adapts the Frontend to hamsv1.FrontendServer.
type frontendServer struct {
	hamsv1.UnimplementedFrontendServer
	f *Frontend
}

func (s *frontendServer) Predict(ctx context.Context, req *hamsv1.PredictRequest) (*hamsv1.PredictResponse, error) {
	return s.f.predict(ctx, req)
}

func (s *frontendServer) ListServices(context.Context, *hamsv1.ListServicesRequest) (*hamsv1.ListServicesResponse, error) {
	return s.f.listServices(), nil
}
