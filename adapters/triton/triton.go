package triton

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/grpcretry"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// ErrConfig is wrapped by every Config validation error.
var ErrConfig = errors.New("triton: invalid config")

// DefaultRetries is the number of attempts of an idempotent call.
const DefaultRetries = grpcretry.DefaultAttempts

// idempotent are the calls retried on Unavailable: they read, or (health)
// change nothing. ModelInfer is not one (the sidecar owns its recovery; a
// Stateful compute retries only after registering lost regions), nor is
// a shared memory Register (a repeat of one that took effect is
// AlreadyExists).
var idempotent = []string{
	inference.GRPCInferenceService_ModelMetadata_FullMethodName,
	inference.GRPCInferenceService_ServerLive_FullMethodName,
	inference.GRPCInferenceService_ServerReady_FullMethodName,
	inference.GRPCInferenceService_ModelReady_FullMethodName,
	inference.GRPCInferenceService_SystemSharedMemoryStatus_FullMethodName,
	inference.GRPCInferenceService_CudaSharedMemoryStatus_FullMethodName,
}

// Config of a Backend or Stateful backend.
type Config struct {
	// Conn reaches the KServe v2 server (owned by the caller).
	Conn grpc.ClientConnInterface
	// Model is the model's name at the server; Version is optional.
	Model, Version string
	// Timeout bounds every call, retries included (0: only the caller's
	// context).
	Timeout time.Duration
	// Retries is the number of attempts of the idempotent calls
	// (ModelMetadata, ServerLive, ServerReady, ModelReady and the shared
	// memory Status calls) on Unavailable (default DefaultRetries; 1
	// disables retries). ModelInfer and the shared memory Register and
	// Unregister calls are attempted once.
	Retries int
	// StateTensors names the explicit state tensors of a Stateful model
	// (each s has input s+"_in" and output s+"_out"); empty means every
	// such pair in the model's metadata with a fixed shape.
	StateTensors []string
	// InitialState seeds the state of a Stateful model (the state
	// tensors, in state order); nil means zeros.
	InitialState []*hamsv1.Tensor
	// KeyPrefix starts the shared-memory keys and region names of a
	// Stateful backend (default "hams").
	KeyPrefix string
	// TypedInputs sends inputs in the typed InferTensorContents fields
	// (fp32_contents, ...; FP16/BF16 have none and stay raw: then every
	// input is raw, as KServe allows no mix) instead of
	// raw_input_contents; for servers or proxies that take only those.
	TypedInputs bool
	Logger      *slog.Logger
}

// Backend drives one stateless model over KServe v2.
type Backend struct {
	cfg Config
	cl  inference.GRPCInferenceServiceClient
	log *slog.Logger

	metaMu sync.Mutex
	meta   *inference.ModelMetadataResponse
}

// New validates cfg and returns a Backend; it does no I/O.
func New(cfg Config) (*Backend, error) {
	var errs []error
	if cfg.Conn == nil {
		errs = append(errs, fmt.Errorf("%w: no connection", ErrConfig))
	}
	if cfg.Model == "" {
		errs = append(errs, fmt.Errorf("%w: no model name", ErrConfig))
	}
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("%w: negative timeout %v", ErrConfig, cfg.Timeout))
	}
	if cfg.Retries < 0 {
		errs = append(errs, fmt.Errorf("%w: negative retries %d", ErrConfig, cfg.Retries))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = "hams"
	}
	if cfg.Retries == 0 {
		cfg.Retries = DefaultRetries
	}
	return &Backend{cfg: cfg, cl: inference.NewGRPCInferenceServiceClient(grpcretry.Idempotent(cfg.Conn, cfg.Retries, idempotent...)),
		log: cfg.Logger.With("component", "triton", "backend_model", cfg.Model)}, nil
}

func (b *Backend) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if b.cfg.Timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, b.cfg.Timeout)
}

// mapErr keeps a gRPC status code and message, prefixed with what was
// attempted; context errors become their status codes.
func (b *Backend) mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "triton %s %s: %v", b.cfg.Model, op, err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "triton %s %s: %v", b.cfg.Model, op, err)
	}
	st, ok := status.FromError(err)
	if !ok {
		return status.Errorf(codes.Unknown, "triton %s %s: %v", b.cfg.Model, op, err)
	}
	return status.Errorf(st.Code(), "triton %s %s: %s", b.cfg.Model, op, st.Message())
}

// metadata fetches the model's metadata once (retried after a failure).
func (b *Backend) metadata(ctx context.Context) (*inference.ModelMetadataResponse, error) {
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	if b.meta != nil {
		return b.meta, nil
	}
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	md, err := b.cl.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: b.cfg.Model, Version: b.cfg.Version})
	if err != nil {
		return nil, b.mapErr("metadata", err)
	}
	b.meta = md
	return md, nil
}

func specs(ms []*inference.ModelMetadataResponse_TensorMetadata, skip func(string) bool) []*hamsv1.TensorSpec {
	var out []*hamsv1.TensorSpec
	for _, m := range ms {
		if skip(m.GetName()) {
			continue
		}
		out = append(out, &hamsv1.TensorSpec{Name: m.GetName(), Datatype: m.GetDatatype(), Shape: m.GetShape()})
	}
	return out
}

// Describe maps ModelMetadata to the model's description (the platform,
// less the reference server's "hams-go_" prefix, is the kind).
func (b *Backend) Describe(ctx context.Context) (*hamsv1.ModelDescription, error) {
	md, err := b.metadata(ctx)
	if err != nil {
		return nil, err
	}
	return b.describe(md, func(n string) bool { return n == wire.StreamIDsInput }), nil
}

func (b *Backend) describe(md *inference.ModelMetadataResponse, skip func(string) bool) *hamsv1.ModelDescription {
	return &hamsv1.ModelDescription{Name: b.cfg.Model, Kind: strings.TrimPrefix(md.GetPlatform(), "hams-go_"),
		Inputs: specs(md.GetInputs(), skip), Outputs: specs(md.GetOutputs(), skip)}
}

func declares(md *inference.ModelMetadataResponse, input string) bool {
	for _, in := range md.GetInputs() {
		if in.GetName() == input {
			return true
		}
	}
	return false
}

// request builds a ModelInferRequest of the batch: tensors as raw
// contents; stream ids as the BYTES input hams_stream_ids (one per row)
// when the model declares it, else as the sequence_id parameter when the
// batch holds one stream, else not at all: a model that declares no
// hams_stream_ids never needs them.
func (b *Backend) request(ctx context.Context, req *hamsv1.BatchRequest) (*inference.ModelInferRequest, error) {
	md, err := b.metadata(ctx)
	if err != nil {
		return nil, err
	}
	ins := req.GetInputs()
	// One more slot for the stream ids input.
	r := &inference.ModelInferRequest{ModelName: b.cfg.Model, ModelVersion: b.cfg.Version, Id: strconv.FormatUint(req.GetBatchId(), 10),
		Inputs: make([]*inference.ModelInferRequest_InferInputTensor, 0, len(ins)+1), RawInputContents: make([][]byte, 0, len(ins)+1)}
	typed := b.cfg.TypedInputs
	var contents []*inference.InferTensorContents
	if typed {
		contents = make([]*inference.InferTensorContents, len(ins))
		for i, t := range ins {
			c, err := wire.Contents(t)
			if err != nil {
				// No typed field for this datatype: all raw.
				typed, contents = false, nil
				break
			}
			contents[i] = c
		}
	}
	for i, t := range ins {
		in := wire.InferInput(t)
		r.Inputs = append(r.Inputs, in)
		if typed {
			in.Contents = contents[i]
			continue
		}
		d := t.GetData()
		if d == nil {
			d = []byte{}
		}
		r.RawInputContents = append(r.RawInputContents, d)
	}
	if typed {
		r.RawInputContents = nil
	}
	ids := req.GetStreamIds()
	anyID := false
	for _, id := range ids {
		anyID = anyID || id != ""
	}
	if !anyID {
		return r, nil
	}
	if len(ids) != len(req.GetRows()) {
		return nil, status.Errorf(codes.InvalidArgument, "triton %s: %d stream ids for %d items", b.cfg.Model, len(ids), len(req.GetRows()))
	}
	if declares(md, wire.StreamIDsInput) {
		var perRow [][]byte
		for i, n := range req.GetRows() {
			for range n {
				perRow = append(perRow, []byte(ids[i]))
			}
		}
		in := &inference.ModelInferRequest_InferInputTensor{Name: wire.StreamIDsInput, Datatype: "BYTES", Shape: []int64{int64(len(perRow))}}
		r.Inputs = append(r.Inputs, in)
		if typed {
			in.Contents = &inference.InferTensorContents{BytesContents: perRow}
		} else {
			r.RawInputContents = append(r.RawInputContents, wire.JoinBytes(perRow))
		}
		return r, nil
	}
	for _, id := range ids {
		if id != ids[0] {
			// A model without a hams_stream_ids input keeps no per-stream
			// state the adapter could route to (a stateless model, or
			// explicit state that is one whole tensor): the rows of several
			// streams are one batch, with no stream identity. Every request
			// has a stream id (the frontend defaults it to the request's),
			// so failing here failed every batch of a concurrent load.
			return r, nil
		}
	}
	r.Parameters = map[string]*inference.InferParameter{wire.ParamSequenceID: wire.StrParam(ids[0])}
	return r, nil
}

// response converts the outputs (raw or typed). Outputs the request
// placed in shared memory are skipped (the caller reads them from its
// regions): known by name from the request, since Triton answers them
// with no parameters and an empty raw entry; an output carrying a
// shared_memory_region parameter is skipped too.
func (b *Backend) response(req *hamsv1.BatchRequest, r *inference.ModelInferRequest, resp *inference.ModelInferResponse) (*hamsv1.BatchResponse, error) {
	var shmOut map[string]bool
	for _, o := range r.GetOutputs() {
		if _, ok := o.GetParameters()[wire.ParamShmRegion]; ok {
			if shmOut == nil {
				shmOut = map[string]bool{}
			}
			shmOut[o.GetName()] = true
		}
	}
	raw := resp.GetRawOutputContents()
	hasRaw := len(raw) > 0
	if hasRaw && len(raw) != len(resp.GetOutputs()) {
		return nil, status.Errorf(codes.Internal, "triton %s infer: %d raw_output_contents for %d outputs", b.cfg.Model, len(raw), len(resp.GetOutputs()))
	}
	out := &hamsv1.BatchResponse{Rows: req.GetRows(), BatchId: req.GetBatchId()}
	for i, o := range resp.GetOutputs() {
		if _, inShm := o.GetParameters()[wire.ParamShmRegion]; inShm || shmOut[o.GetName()] {
			continue
		}
		var r []byte
		if hasRaw {
			r = raw[i]
		}
		t, err := wire.FromInferOutput(o, r, hasRaw)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "triton %s infer: output: %v", b.cfg.Model, err)
		}
		out.Outputs = append(out.Outputs, t)
	}
	return out, nil
}

// Infer runs one batch.
func (b *Backend) Infer(ctx context.Context, req *hamsv1.BatchRequest) (*hamsv1.BatchResponse, error) {
	r, err := b.request(ctx, req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	resp, err := b.cl.ModelInfer(ctx, r)
	if err != nil {
		return nil, b.mapErr("infer", err)
	}
	return b.response(req, r, resp)
}

// Health is nil when the server is live and ready and the model ready;
// otherwise Unavailable, NotFound for a model or version the server does
// not know, or the call's own error code.
func (b *Backend) Health(ctx context.Context) error {
	ctx, cancel := b.ctx(ctx)
	defer cancel()
	live, err := b.cl.ServerLive(ctx, &inference.ServerLiveRequest{})
	if err != nil {
		return b.mapErr("server live", err)
	}
	if !live.GetLive() {
		return status.Errorf(codes.Unavailable, "triton %s: server not live", b.cfg.Model)
	}
	ready, err := b.cl.ServerReady(ctx, &inference.ServerReadyRequest{})
	if err != nil {
		return b.mapErr("server ready", err)
	}
	if !ready.GetReady() {
		return status.Errorf(codes.Unavailable, "triton %s: server not ready", b.cfg.Model)
	}
	mr, err := b.cl.ModelReady(ctx, &inference.ModelReadyRequest{Name: b.cfg.Model, Version: b.cfg.Version})
	if err != nil {
		return b.mapErr("model ready", err)
	}
	if !mr.GetReady() {
		// Triton answers ModelReady false, not an error, for a model or
		// version it does not know: ModelMetadata tells a misconfigured
		// name (NotFound, which an operator must fix) from a model still
		// loading (Unavailable).
		if _, err := b.cl.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: b.cfg.Model, Version: b.cfg.Version}); status.Code(err) == codes.NotFound {
			return b.mapErr("model ready", err)
		}
		return status.Errorf(codes.Unavailable, "triton %s: model not ready", b.cfg.Model)
	}
	return nil
}

// Close releases nothing: the connection belongs to the caller.
func (b *Backend) Close() error { return nil }
