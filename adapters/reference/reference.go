// Package reference is the sidecar Backend over the hamsv1.ModelRuntime gRPC
// API, which the project's reference model server (refserver)
// implements for every model it hosts. gRPC status codes of the model
// server reach the sidecar unchanged (InvalidArgument stays
// InvalidArgument, so the sidecar can re-run a rejected batch per request).
// Describe and Health are idempotent and retried on Unavailable
// (internal/grpcretry); Infer, Compute, Update and the state streams are
// attempted once.
package reference

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcretry"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// Backend drives one model of a reference model server.
type Backend struct {
	rt      hamsv1.ModelRuntimeClient
	ks      inference.GRPCInferenceServiceClient
	model   string
	timeout time.Duration
	// stateBytes is the model's state size from its last Describe (the
	// size of a delta region).
	stateBytes atomic.Uint64
	// writeXXH3: the server's last Describe said its WriteState takes
	// chunkhash's XXH3 tree instead of the SHA-256.
	writeXXH3 atomic.Bool
	// writeRegions: the server's last Describe said its WriteState takes
	// data from a shared-memory region (writeregion.go).
	writeRegions atomic.Bool
	// delta: the region Compute's deltas come back in; write: the one
	// state writes go out in.
	delta, write deltaRegion
}

// New creates a Backend for model over cc (owned by the caller). timeout
// bounds every call, retries included (0: only the caller's context).
// Describe and Health are idempotent and attempted up to
// grpcretry.DefaultAttempts times on Unavailable; Infer, Compute, Update,
// the state streams and the delta region's Register and Unregister once.
func New(cc grpc.ClientConnInterface, model string, timeout time.Duration) *Backend {
	rc := grpcretry.Idempotent(cc, grpcretry.DefaultAttempts, hamsv1.ModelRuntime_Describe_FullMethodName, hamsv1.ModelRuntime_Health_FullMethodName)
	b := &Backend{rt: hamsv1.NewModelRuntimeClient(rc), ks: inference.NewGRPCInferenceServiceClient(cc), model: model, timeout: timeout}
	b.delta.retryEvery, b.delta.prefix = deltaRetry, "hams_delta_"
	b.write.retryEvery, b.write.prefix = deltaRetry, "hams_write_"
	return b
}

// WithoutDeltaRegion makes Compute take deltas and WriteState send state
// inline (over gRPC) only, never through a shared-memory region; for a
// model server that shares no /dev/shm with the sidecar. It returns b.
func (b *Backend) WithoutDeltaRegion() *Backend {
	for _, d := range []*deltaRegion{&b.delta, &b.write} {
		d.mu.Lock()
		d.disabled = true
		d.mu.Unlock()
	}
	return b
}

func (b *Backend) log() *slog.Logger {
	return slog.Default().With("component", "reference", "model", b.model)
}

func (b *Backend) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if b.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.timeout)
}

// mapErr keeps a gRPC status code and message, prefixed with what was
// attempted; context errors become their status codes.
func (b *Backend) mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "reference %s %s: %v", b.model, op, err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "reference %s %s: %v", b.model, op, err)
	}
	st, ok := status.FromError(err)
	if !ok {
		return status.Errorf(codes.Unknown, "reference %s %s: %v", b.model, op, err)
	}
	return status.Errorf(st.Code(), "reference %s %s: %s", b.model, op, st.Message())
}

// Describe asks the model server for the model's inputs, outputs and state.
func (b *Backend) Describe(ctx context.Context) (*hamsv1.ModelDescription, error) {
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	d, err := b.rt.Describe(ctx, &hamsv1.DescribeRequest{Model: b.model})
	if err == nil {
		b.stateBytes.Store(d.GetStateBytes())
		b.writeXXH3.Store(slices.Contains(d.GetWriteStateDigests(), writeDigestXXH3))
		b.writeRegions.Store(d.GetWriteStateRegions())
	}
	return d, b.mapErr("describe", err)
}

// Infer runs one batch (stateless, or compute+update in bare mode).
func (b *Backend) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	if req.GetModel() == "" {
		req.Model = b.model
	}
	resp, err := b.rt.Infer(ctx, req)
	return resp, b.mapErr("infer", err)
}

// Health is nil when the model is live and ready.
func (b *Backend) Health(ctx context.Context) error {
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	h, err := b.rt.Health(ctx, &hamsv1.HealthRequest{Model: b.model})
	if err != nil {
		return b.mapErr("health", err)
	}
	if !h.GetLive() || !h.GetReady() {
		return status.Errorf(codes.Unavailable, "reference %s: not ready (live %v, ready %v): %s", b.model, h.GetLive(), h.GetReady(), h.GetDetail())
	}
	return nil
}

// Close unregisters the delta region, if any (the connection belongs to
// the caller).
func (b *Backend) Close() error {
	b.closeRegion(&b.delta)
	b.closeRegion(&b.write)
	return nil
}

// LoadWeights replaces the weights of model at the reference model server
// while it serves (ModelRuntime.LoadWeights; a parity model trained
// online). The server refuses weights of another format or shape.
func (b *Backend) LoadWeights(ctx context.Context, model string, weights []byte, version uint64) error {
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	if model == "" {
		model = b.model
	}
	_, err := b.rt.LoadWeights(ctx, &hamsv1.LoadWeightsRequest{Model: model, Weights: weights, Version: version})
	return b.mapErr("load weights", err)
}
