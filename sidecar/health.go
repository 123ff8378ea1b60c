package sidecar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/hamsmd"
)

// Backend health. A model server can stay reachable and still be unable
// to serve (TF Serving's version UNLOADING or failed to load, Triton's
// model not ready, a Clipper application answering only its default), and
// a sidecar whose batches are rare would learn it only from a client's
// failed request. So the sidecar asks Backend.Health every HealthInterval,
// in every role (a backup's model server must be able to serve when it is
// promoted). In a protected mode, a backend unhealthy (unhealthy) for
// BackendLostAfter and at least healthFailures checks in a row is a failed
// host, as one that stays unreachable for a batch is (backendloss.go): the
// sidecar stops (fail-stop) and the manager fails the instance over. In
// bare mode nothing takes over, so the sidecar only logs and counts. The
// loop is armed by the first check that passes: a model server still
// loading when its sidecar starts is not a failure.
const (
	DefaultHealthInterval = time.Second
	healthFailures        = 3
)

// unhealthy says whether a failed check means the backend cannot serve:
// Unavailable (down, not ready, a version not AVAILABLE) or NotFound (the
// model gone from its server), or a check that got no answer within
// 2×BackendLostAfter (hung: a hung server). Other errors, and a check
// merely slower than the interval on a loaded machine, are logged but not
// counted: a busy server that still serves must not be failed over.
func unhealthy(err error, hung bool) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.NotFound:
		return true
	}
	return hung
}

// grpc.health.v1 on the sidecar's port: the service "" is the sidecar
// itself (SERVING while it runs, NOT_SERVING once it stops), and the
// service named by the model is its backend as the health loop last saw
// it. Before the first check the model's status is SERVICE_UNKNOWN (a
// frontend treats that as no news). A check that fails as unhealthy
// makes it NOT_SERVING when nothing will replace the instance for it: the
// loop is not armed (the backend never answered, so it never fails
// stop), or the mode is bare (no failover). An armed sidecar of a
// protected mode stays SERVING until it fails stop (watchHealth) and the
// manager fails it over: clients then wait for the failover rather than
// fail fast in its window. Frontends watch the model's status
// (frontend/health.go): a model whose backend is NOT_SERVING answers
// Unavailable at once and is not ready.
func (s *Sidecar) registerHealth(srv *grpc.Server) {
	s.health = health.NewServer()
	s.health.SetServingStatus(s.cfg.Model, healthpb.HealthCheckResponse_SERVICE_UNKNOWN)
	healthpb.RegisterHealthServer(srv, s.health)
}

// setBackendServing publishes the backend's health (nil health server:
// Run has not registered it, e.g. in tests that drive the loop alone).
func (s *Sidecar) setBackendServing(ok bool) {
	if s.health == nil {
		return
	}
	st := healthpb.HealthCheckResponse_SERVING
	if !ok {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	s.health.SetServingStatus(s.cfg.Model, st)
}

// watchHealth is the health loop (Run owns it). Checks run without the
// Run context's batch identity (hamsmd.Source): a probe is no request.
func (s *Sidecar) watchHealth(ctx context.Context) error {
	ctx = hamsmd.WithSource(ctx, nil)
	t := time.NewTicker(s.healthInterval)
	defer t.Stop()
	var since time.Time
	fails, armed := 0, false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		hctx, cancel := context.WithTimeout(ctx, 2*s.backend.lostAfter)
		err := s.cfg.Backend.Health(hctx)
		hung := errors.Is(hctx.Err(), context.DeadlineExceeded)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !unhealthy(err, hung) {
			s.log.Debug("backend health check failed; not counted", "err", err)
			continue
		}
		if err == nil {
			armed = true
			if fails > 0 {
				s.log.Info("backend healthy again", "after", time.Since(since).Round(time.Millisecond), "failed_checks", fails)
			}
			since, fails = time.Time{}, 0
			s.metrics.backendHealthy.Set(1)
			s.setBackendServing(true)
			continue
		}
		s.metrics.backendHealthy.Set(0)
		if fails == 0 {
			since = time.Now()
			s.log.Warn("backend unhealthy", "err", err)
		}
		fails++
		protected := s.backend.protected
		if !armed || !protected {
			s.setBackendServing(false)
		}
		if armed && protected && fails >= healthFailures && time.Since(since) >= s.backend.lostAfter {
			return fmt.Errorf("%w: unhealthy for %v (%d checks in a row): %w", errBackendLost, time.Since(since).Round(time.Millisecond), fails, err)
		}
	}
}
