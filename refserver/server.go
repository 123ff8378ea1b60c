package refserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/authz"
	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/pki"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
	"github.com/hams-go/hams/refserver/models"
)

// ErrConfig is wrapped by every Config validation error.
var ErrConfig = errors.New("refserver: invalid config")

// Config of a reference model server.
type Config struct {
	Deployment *config.Deployment
	// Models names the models of Deployment to host (kind and params from
	// the deployment).
	Models       []string
	GRPCListener net.Listener
	Logger       *slog.Logger
	Registry     *prometheus.Registry
	// Straggle, when set, makes the server a seeded straggler: during
	// the slow windows of the schedule (counted from New) every Infer
	// and Compute call, on every API and hosted model, is delayed or
	// frozen before it computes (see StraggleConfig).
	Straggle *StraggleConfig
	// TLS, when set, serves over mutual TLS: only the sidecars of the
	// hosted models (and operators, for reads) may call, by their
	// certificates' identities (internal/authz). Its identity must be a
	// model server of the deployment. Nil: plaintext.
	TLS *pki.Source
}

// Server hosts models on one gRPC port.
type Server struct {
	cfg     Config
	log     *slog.Logger
	models  map[string]*hosted
	names   []string
	metrics *metrics
	srv     *grpc.Server
	// health is grpc.health.v1: "" SERVING while the server serves, each
	// hosted model SERVING while ready (SetReady); NOT_SERVING once Run's
	// context ends. readyMu orders SetReady's flag and health updates.
	health  *health.Server
	readyMu sync.Mutex
	shm     *shmManager
	cuda    *cudaManager
	// maxBytes is the gRPC message limit, also the byte budget of a
	// request's decoded tensors.
	maxBytes int
	// straggler delays Infer and Compute calls (nil: none).
	straggler *Straggler
}

type hosted struct {
	name string
	m    models.Model
	// nextID numbers the batches of the client APIs (KServe, TF Serving),
	// which carry no batch id of their own.
	nextID atomic.Uint64
	// notReady is set by SetReady(false): health says not ready and the
	// client APIs answer Unavailable.
	notReady atomic.Bool
}

func (h *hosted) ready() bool { return !h.notReady.Load() }

// New validates cfg and builds the models; it does no I/O.
func New(cfg Config) (*Server, error) {
	if cfg.Deployment == nil {
		return nil, fmt.Errorf("%w: no deployment", ErrConfig)
	}
	if len(cfg.Models) == 0 {
		return nil, fmt.Errorf("%w: no models to host", ErrConfig)
	}
	if cfg.GRPCListener == nil {
		return nil, fmt.Errorf("%w: no gRPC listener", ErrConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	var straggler *Straggler
	if cfg.Straggle != nil {
		var err error
		if straggler, err = NewStraggler(*cfg.Straggle, time.Now(), nil); err != nil {
			return nil, fmt.Errorf("%w: straggle: %w", ErrConfig, err)
		}
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "refserver"), models: map[string]*hosted{}, shm: newShmManager(), cuda: newCudaManager(), straggler: straggler}
	built := map[string]models.Model{}
	var errs []error
	for _, name := range cfg.Models {
		mc := cfg.Deployment.Model(name)
		if mc == nil {
			errs = append(errs, fmt.Errorf("%w: model %q is not in the deployment", ErrConfig, name))
			continue
		}
		if s.models[name] != nil {
			errs = append(errs, fmt.Errorf("%w: model %q listed twice", ErrConfig, name))
			continue
		}
		m, err := models.New(mc)
		if err != nil {
			errs = append(errs, fmt.Errorf("build model %q: %w", name, err))
			continue
		}
		s.models[name] = &hosted{name: name, m: m}
		s.names = append(s.names, name)
		built[name] = m
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	sort.Strings(s.names)
	s.metrics = newMetrics(cfg.Registry, built)
	gm := register(cfg.Registry, grpcx.NewServerMetrics(nil))
	s.maxBytes = cfg.Deployment.Limits.MaxMessageBytes
	if s.maxBytes <= 0 {
		s.maxBytes = grpcx.DefaultMaxMessageBytes
	}
	opts := grpcx.ServerOptions(s.log, gm, s.maxBytes)
	if cfg.TLS != nil {
		self := cfg.TLS.Identity()
		if self.Role != pki.RoleModelServer || self.Deployment != cfg.Deployment.Name {
			return nil, fmt.Errorf("%w: certificate %v is not a model server of deployment %q", ErrConfig, self, cfg.Deployment.Name)
		}
		az, err := authz.New(authz.Config{Self: self, Logger: s.log})
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		opts = append(append(opts, grpcx.ServerTLS(cfg.TLS)), az.ServerOptions()...)
	}
	s.srv = grpc.NewServer(opts...)
	hamsv1.RegisterModelRuntimeServer(s.srv, &runtimeAPI{s: s})
	inference.RegisterGRPCInferenceServiceServer(s.srv, &kserveAPI{s: s})
	tfapis.RegisterPredictionServiceServer(s.srv, &predictAPI{s: s})
	tfapis.RegisterModelServiceServer(s.srv, &modelStatusAPI{s: s})
	s.health = health.NewServer()
	for _, n := range s.names {
		s.health.SetServingStatus(n, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(s.srv, s.health)
	gm.InitializeMetrics(s.srv)
	return s, nil
}

// Models lists the hosted model names, sorted.
func (s *Server) Models() []string { return append([]string(nil), s.names...) }

// Model returns a hosted model (nil if not hosted); tests and in-process
// wiring use it.
func (s *Server) Model(name string) models.Model {
	if h := s.models[name]; h != nil {
		return h.m
	}
	return nil
}

// Straggler is the server's straggler (nil when Config.Straggle is
// unset): its schedule, counted from New, and what it delayed.
func (s *Server) Straggler() *Straggler { return s.straggler }

// straggle delays a call of method on model h as the straggler says;
// an ended context is the call's answer (Canceled or DeadlineExceeded).
func (s *Server) straggle(ctx context.Context, h *hosted, method string) error {
	if s.straggler == nil {
		return nil
	}
	waited, slow, err := s.straggler.Wait(ctx)
	if slow {
		s.metrics.straggled.WithLabelValues(h.name, method).Inc()
		s.metrics.straggleSeconds.WithLabelValues(h.name, method).Add(waited.Seconds())
	}
	if err != nil {
		return status.FromContextError(err).Err()
	}
	return nil
}

// Run serves until ctx ends, then stops gracefully.
func (s *Server) Run(ctx context.Context) error {
	s.log.Info("reference model server serving", "addr", s.cfg.GRPCListener.Addr().String(), "models", s.names)
	stopHealth := context.AfterFunc(ctx, s.health.Shutdown)
	defer stopHealth()
	err := grpcx.Serve(ctx, s.srv, s.cfg.GRPCListener, 5*time.Second)
	s.shm.close()
	s.cuda.close()
	s.log.Info("reference model server stopped")
	if err != nil {
		return fmt.Errorf("refserver: serve: %w", err)
	}
	return nil
}

func (s *Server) lookup(name string) (*hosted, error) {
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "no model named in the request")
	}
	h := s.models[name]
	if h == nil {
		return nil, status.Errorf(codes.NotFound, "model %q is not hosted here (hosted: %v)", name, s.names)
	}
	return h, nil
}

// SetReady marks a hosted model ready or not (drain, warm-up, tests):
// while not ready, KServe ModelReady, ModelRuntime Health and grpc.health.v1
// (service = the model's name) say so and the inference APIs answer
// Unavailable.
func (s *Server) SetReady(model string, ready bool) error {
	h := s.models[model]
	if h == nil {
		return fmt.Errorf("%w: model %q is not hosted here", ErrConfig, model)
	}
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if h.notReady.Swap(!ready) == ready {
		s.log.Info("model readiness changed", "model", model, "ready", ready)
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(model, st)
	return nil
}

// SharedMemoryRegions lists the registered system shared-memory regions.
func (s *Server) SharedMemoryRegions() []string { return s.shm.names() }

// lookupReady is lookup for inference calls: a model that is not ready is
// Unavailable.
func (s *Server) lookupReady(name string) (*hosted, error) {
	h, err := s.lookup(name)
	if err == nil && !h.ready() {
		err = status.Errorf(codes.Unavailable, "model %q is not ready", name)
	}
	return h, err
}

// toStatus maps model errors to gRPC status codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, models.ErrInvalidInput), errors.Is(err, models.ErrInvalidState):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, models.ErrNotStaged), errors.Is(err, models.ErrStaleBase):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, models.ErrNoDelta):
		return status.Error(codes.Unimplemented, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// run executes fn as one batch of model h for method, with metrics.
func (s *Server) run(h *hosted, method string, fn func() error) error {
	start := time.Now()
	err := toStatus(fn())
	s.metrics.latency.WithLabelValues(h.name, method).Observe(time.Since(start).Seconds())
	code := codes.OK.String()
	if err != nil {
		code = status.Code(err).String()
	}
	s.metrics.requests.WithLabelValues(h.name, method, code).Inc()
	return err
}

// infer runs a client-API request (KServe, TF Serving) as one batch,
// compute and update in one step: one item of stream streams[0], or, with
// one stream id per row, one item per row.
func (s *Server) infer(ctx context.Context, h *hosted, method string, ins []*hamsv1.Tensor, streams []string) ([]*hamsv1.Tensor, error) {
	var res *models.Result
	err := s.run(h, method, func() error {
		if err := s.straggle(ctx, h, method); err != nil {
			return err
		}
		var err error
		b := &models.Batch{Inputs: ins, BatchID: h.nextID.Add(1)}
		if len(ins) > 0 && len(ins[0].Shape) > 0 {
			rows := ins[0].Shape[0]
			switch {
			case len(streams) <= 1:
				b.Rows = []uint32{uint32(rows)}
				b.StreamIDs = []string{""}
				if len(streams) == 1 {
					b.StreamIDs[0] = streams[0]
				}
			case int64(len(streams)) == rows:
				b.Rows = make([]uint32, rows)
				for i := range b.Rows {
					b.Rows[i] = 1
				}
				b.StreamIDs = streams
			default:
				return status.Errorf(codes.InvalidArgument, "model %q: %d stream ids for %d rows", h.name, len(streams), rows)
			}
		}
		res, err = h.m.Infer(b)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res.Outputs, nil
}
