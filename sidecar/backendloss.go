package sidecar

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// errNotRepeated marks backendPolicy.once's errBackendLost: the call may have taken
// effect, and the backend was not given BackendLostAfter to come back.
var errNotRepeated = errors.New("not repeated")

// backendPolicy is how a sidecar meets an unreachable backend (see
// above): the executors, the primary's state operations and replay's
// recovery all call the backend through it. It is fixed when the sidecar
// is built.
type backendPolicy struct {
	h Host
	// protected: a replacement re-executes the requests (the mode is not
	// bare, or the deployment runs replay), so an unreachable backend
	// holds them rather than failing them.
	protected bool
	// lostAfter: Config.BackendLostAfter or its default.
	lostAfter time.Duration
}

// down reports whether err from the backend means the model server is
// unreachable and a replacement will re-execute the requests.
func (bp *backendPolicy) down(err error) bool {
	return bp.protected && status.Code(err) == codes.Unavailable
}

// retry runs call until it succeeds, fails for another reason than an
// unreachable backend (see down), ctx ends, or the backend has been
// unreachable for lostAfter (the error then wraps errBackendLost).
func (bp *backendPolicy) retry(ctx context.Context, what string, call func() error) error {
	var since time.Time
	for attempt := 1; ; attempt++ {
		err := call()
		if err == nil || ctx.Err() != nil || !bp.down(err) {
			return err
		}
		if since.IsZero() {
			since = time.Now()
			bp.h.Logger().Warn("backend unreachable, holding the batch", "op", what, "err", err)
		}
		bp.h.Metrics().backendDown.Inc()
		if time.Since(since) >= bp.lostAfter {
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

// once is retry for a call that changes the model's state inside the
// model server: Infer of a stateful model whose server holds the state
// (the reference model server's ModelRuntime), in any mode that runs it
// (the replay baseline, a stateful model served ha: stateless or off),
// live or re-executed. An Unavailable answer does not say whether the
// server applied the batch before the answer was lost (a connection reset
// after processing), and a repeat would apply it twice. So the call is not
// repeated: the backend is lost at once (fail-stop). A replay
// re-execution starts again from the checkpoint instead
// (replayState.recover's caller).
func (bp *backendPolicy) once(ctx context.Context, what string, call func() error) error {
	err := call()
	if err == nil || ctx.Err() != nil || !bp.down(err) {
		return err
	}
	bp.h.Metrics().backendDown.Inc()
	bp.h.Logger().Warn("backend unreachable during a call that changes the model's state in the server: not repeated", "op", what, "err", err)
	return fmt.Errorf("%w: %s of stateful model %q %w (the server may have applied it before its answer was lost): %w",
		errBackendLost, what, bp.h.Model(), errNotRepeated, err)
}

// RepeatableInfer is implemented by a backend whose Infer of a stateful
// model may be repeated after a lost answer because the adapter, not the
// model server, owns the state (explicit state tensors: adapters/tfserving,
// adapters/triton): a call that failed changed nothing but the server's
// scratch output.
type RepeatableInfer interface {
	InferRepeatable() bool
}

// call is how a batch's Infer meets an unreachable backend: held and
// retried (retry) for a stateless model or a backend whose Infer is
// repeatable, not repeated (once) when the server holds the state.
func (bp *backendPolicy) call() func(context.Context, string, func() error) error {
	if r, ok := bp.h.Backend().(RepeatableInfer); bp.h.IsStateful(bp.h.Model()) && !(ok && r.InferRepeatable()) {
		return bp.once
	}
	return bp.retry
}
