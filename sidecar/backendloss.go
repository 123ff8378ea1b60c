package sidecar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/protocol/nspb"
)

// A model server and its sidecar are one failure unit (a "host"). When the
// backend becomes unreachable in a protected mode, the batch in hand is not
// failed: failing it would answer the client with an error although the
// replacement instance (the promoted backup, or the standby) re-executes
// the request after the predecessors' resend. The sidecar retries the batch
// every backendRetry; when the backend stays unreachable for
// Config.BackendLostAfter it stops (fail-stop), so the manager fails the
// instance over. In bare mode nothing takes over: the requests fail with
// Unavailable at once.
const (
	backendRetry            = 20 * time.Millisecond
	DefaultBackendLostAfter = time.Second
)

// errBackendLost wraps the last backend error when the backend stayed
// unreachable for BackendLostAfter; the sidecar stops on it.
var errBackendLost = errors.New("sidecar: backend unreachable")

// errNotRepeated marks callOnce's errBackendLost: the call may have taken
// effect, and the backend was not given BackendLostAfter to come back.
var errNotRepeated = errors.New("not repeated")

// backendDown reports whether err from the backend means the model server
// is unreachable and a replacement will re-execute the requests.
func (s *Sidecar) backendDown(err error) bool {
	return (s.mode != nspb.Bare || s.cfg.Deployment.RunMode().Replays()) && status.Code(err) == codes.Unavailable
}

// retryBackend runs call until it succeeds, fails for another reason than
// an unreachable backend (see backendDown), ctx ends, or the backend has
// been unreachable for BackendLostAfter (the error then wraps
// errBackendLost).
func (s *Sidecar) retryBackend(ctx context.Context, what string, call func() error) error {
	var since time.Time
	for attempt := 1; ; attempt++ {
		err := call()
		if err == nil || ctx.Err() != nil || !s.backendDown(err) {
			return err
		}
		if since.IsZero() {
			since = time.Now()
			s.log.Warn("backend unreachable, holding the batch", "op", what, "err", err)
		}
		s.metrics.backendDown.Inc()
		if time.Since(since) >= s.backendLostAfter {
			return fmt.Errorf("%w: %s for %v (%d attempts): %w", errBackendLost, what, time.Since(since).Round(time.Millisecond), attempt, err)
		}
		t := time.NewTimer(backendRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// callOnce is retryBackend for a call that changes the model's state
// inside the model server: Infer of a stateful model whose server holds
// the state (the reference model server's ModelRuntime), in any mode that
// runs it (the replay baseline, a stateful model served ha: stateless or
// off), live or re-executed. An Unavailable answer does not say whether
// the server applied the batch before the answer was lost (a connection
// reset after processing), and a repeat would apply it twice. So the call
// is not repeated: the backend is lost at once (fail-stop). A replay
// re-execution starts again from the checkpoint instead
// (replayState.recover's caller).
func (s *Sidecar) callOnce(ctx context.Context, what string, call func() error) error {
	err := call()
	if err == nil || ctx.Err() != nil || !s.backendDown(err) {
		return err
	}
	s.metrics.backendDown.Inc()
	s.log.Warn("backend unreachable during a call that changes the model's state in the server: not repeated", "op", what, "err", err)
	return fmt.Errorf("%w: %s of stateful model %q %w (the server may have applied it before its answer was lost): %w",
		errBackendLost, what, s.cfg.Model, errNotRepeated, err)
}

// RepeatableInfer is implemented by a backend whose Infer of a stateful
// model may be repeated after a lost answer because the adapter, not the
// model server, owns the state (explicit state tensors: adapters/tfserving,
// adapters/triton): a call that failed changed nothing but the server's
// scratch output.
type RepeatableInfer interface {
	InferRepeatable() bool
}

// backendCall is how a batch's Infer meets an unreachable backend: held
// and retried (retryBackend) for a stateless model or a backend whose
// Infer is repeatable, not repeated (callOnce) when the server holds the
// state.
func (s *Sidecar) backendCall() func(context.Context, string, func() error) error {
	if r, ok := s.cfg.Backend.(RepeatableInfer); s.host.IsStateful(s.cfg.Model) && !(ok && r.InferRepeatable()) {
		return s.callOnce
	}
	return s.retryBackend
}
