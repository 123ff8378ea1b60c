package frontend

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/hamsmd"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// Pass-through (retrofit mode, ha: off). A model for which
// config.Deployment.PassThrough holds (ha: off, stateless, the only model
// of its service, a backend speaking TF Serving's or KServe v2's gRPC API)
// has no sidecar: the compatibility APIs forward a call for it, under its
// model or service name, to its backend.address unchanged: the same
// request message (unknown fields included), the client's metadata (but
// gRPC's reserved headers and hams- keys), and back the backend's answer,
// header and trailer metadata and gRPC status (code, message, details).
// Nothing is recorded (no lineage, request log, reply gating or
// replication). The changes: model_spec.name / model_name is the
// backend's name (backend.model) on the way in and the client's on the
// way out; empty version and signature fields get backend.version and
// backend.signature; a call without a deadline gets
// limits.request_timeout; and the call carries hamsmd's identity: a
// req_id numbering this frontend's pass-through calls (a sequence of its
// own: taking ids from the HAMS path's would leave gaps in its entry
// edges' positions) and the lineage entry <frontend, req_id, model, n>, n
// counting this frontend's pass-through calls of the model.
//
// Forwarded: TF Serving Predict, GetModelMetadata and GetModelStatus for a
// backend that speaks TF Serving (tfserving, reference); KServe v2
// ModelInfer, ModelReady and ModelMetadata for one that speaks KServe v2
// (triton, reference); and, as raw bytes, the model-scoped methods outside
// the proto subset (passraw.go). A call through the other API is Unimplemented (the
// backend does not speak it), as is the HAMS API (Frontend.Predict and
// HTTP) for a pass-through service. Server-wide KServe calls (ServerLive,
// ServerReady, ServerMetadata) stay the frontend's own.

// passThrough is one pass-through model.
type passThrough struct {
	model   string
	service string
	backend config.Backend
	tf, ks  bool // the backend speaks TF Serving / KServe v2
	cc      *grpc.ClientConn
	pred    tfapis.PredictionServiceClient
	stat    tfapis.ModelServiceClient
	infer   inference.GRPCInferenceServiceClient
	calls   atomic.Uint64
	// rejectNonFinite: limits.reject_non_finite (or the model's own) is
	// on for this service; its Predict and ModelInfer inputs are checked.
	rejectNonFinite bool
}

// newPassThrough builds the pass-through of model m of service svc (the
// connection does no I/O until the first call); dialOpts are appended to
// grpcx's (Config.DialOptions).
func newPassThrough(m *config.Model, svc string, maxBytes int, dialOpts []grpc.DialOption) (*passThrough, error) {
	if m.Backend.Address == "" {
		return nil, fmt.Errorf("%w: model %q is served pass-through (ha: off) but its backend has no address", ErrConfig, m.Name)
	}
	cc, err := grpcx.Dial(m.Backend.Address, maxBytes, dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("frontend: pass-through model %q: %w", m.Name, err)
	}
	apis := config.PassThroughAPIs[m.Backend.Type]
	return &passThrough{
		model: m.Name, service: svc, backend: m.Backend, cc: cc,
		tf: slices.Contains(apis, "tfserving"), ks: slices.Contains(apis, "kserve"),
		pred: tfapis.NewPredictionServiceClient(cc), stat: tfapis.NewModelServiceClient(cc),
		infer: inference.NewGRPCInferenceServiceClient(cc),
	}, nil
}

// passFor returns the pass-through model a client names (by model or
// service name), or nil. A service of the HAMS path of that name wins (as
// service names win over model names in modelService).
func (f *Frontend) passFor(name string) *passThrough {
	if f.services[name] != nil {
		return nil
	}
	return f.pass[name]
}

// checkFinite refuses NaN and ±Inf in an input of a pass-through call
// (limits.reject_non_finite), as validate.go does on the HAMS path.
func (p *passThrough) checkFinite(t *hamsv1.Tensor) error {
	if i, what, bad := tensor.FirstNonFinite(t); bad {
		return status.Errorf(codes.InvalidArgument, "model %q: input %q: element %d is %s; non-finite values are refused (limits.reject_non_finite)",
			p.model, t.GetName(), i, what)
	}
	return nil
}

func (p *passThrough) needTF() error {
	if p.tf {
		return nil
	}
	return status.Errorf(codes.Unimplemented, "model %q is served pass-through (ha: off) to a %s backend, which does not speak TF Serving's API: call it through KServe v2 (inference.GRPCInferenceService)", p.model, p.backend.Type)
}

func (p *passThrough) needKS() error {
	if p.ks {
		return nil
	}
	return status.Errorf(codes.Unimplemented, "model %q is served pass-through (ha: off) to a %s backend, which does not speak KServe v2: call it through TF Serving's API (tensorflow.serving.PredictionService)", p.model, p.backend.Type)
}

// forward runs call on the backend with the client's metadata, the
// deadline and HAMS's identity, and hands the backend's header and
// trailer metadata to the client. The backend's error is returned as it
// is (its status reaches the client unchanged).
func (f *Frontend) forward(ctx context.Context, p *passThrough, call func(ctx context.Context, opts ...grpc.CallOption) error) error {
	return f.forwardWith(ctx, p, true, call)
}

// forwardWith is forward; a call without a deadline gets
// limits.request_timeout only when defaultDeadline is set (a stream that
// lives as long as its client keeps it open gets none).
func (f *Frontend) forwardWith(ctx context.Context, p *passThrough, defaultDeadline bool, call func(ctx context.Context, opts ...grpc.CallOption) error) error {
	if !f.enter() {
		return status.Error(codes.Unavailable, ErrShutdown.Error())
	}
	defer f.leave()
	start := time.Now()
	out := metadata.MD{}
	if in, ok := metadata.FromIncomingContext(ctx); ok {
		out = hamsmd.Forwardable(in)
		if f.auth != nil && f.auth.bearer() {
			// The client's credential is the frontend's (clientauth.go):
			// it does not travel on to the backend.
			delete(out, authHeader)
		}
	}
	if _, ok := ctx.Deadline(); !ok && defaultDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	reqID := f.passIDs.Add(1)
	n := p.calls.Add(1)
	octx := metadata.NewOutgoingContext(ctx, out)
	octx = hamsmd.AppendOutgoing(octx, []*hamsv1.CallLineage{{
		ReqId: reqID, Service: p.service, StreamId: strconv.FormatUint(reqID, 10), Model: p.model,
		Lineage: []*hamsv1.LineageEntry{{PredModel: config.Frontend, PredSeq: reqID, Model: p.model, Seq: n}},
	}}, hamsmd.DefaultBudget)
	var header, trailer metadata.MD
	err := call(octx, grpc.Header(&header), grpc.Trailer(&trailer))
	if h := hamsmd.Forwardable(header); len(h) > 0 {
		_ = grpc.SetHeader(ctx, h)
	}
	if t := hamsmd.Forwardable(trailer); len(t) > 0 {
		grpc.SetTrailer(ctx, t)
	}
	code := status.Code(err)
	f.m.passThrough.WithLabelValues(p.model, code.String()).Inc()
	f.log.Debug("pass-through call", "model", p.model, "req_id", reqID, "code", code.String(), "err", err, "elapsed", time.Since(start))
	return err
}

// tfSpec names the backend's model in a client's spec (and fills the
// deployment's version and signature where the client left them empty);
// it returns the client's name.
func (p *passThrough) tfSpec(spec *tfapis.ModelSpec, withSig bool) string {
	name := spec.GetName()
	spec.Name = p.backend.Model
	if spec.VersionChoice == nil && p.backend.Version != "" {
		if v, err := strconv.ParseInt(p.backend.Version, 10, 64); err == nil {
			spec.VersionChoice = &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(v)}
		} else {
			spec.VersionChoice = &tfapis.ModelSpec_VersionLabel{VersionLabel: p.backend.Version}
		}
	}
	if withSig && spec.SignatureName == "" && p.backend.Signature != "" {
		spec.SignatureName = p.backend.Signature
	}
	return name
}

// clientName puts the client's model name back into an answer's spec.
func (p *passThrough) clientName(spec *tfapis.ModelSpec, name string) {
	if spec != nil && spec.Name == p.backend.Model {
		spec.Name = name
	}
}

func (f *Frontend) passPredict(ctx context.Context, p *passThrough, req *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
	if err := p.needTF(); err != nil {
		return nil, err
	}
	release, err := f.admit.acquire(p.service, int64(proto.Size(req)))
	if err != nil {
		f.m.refused.Inc()
		return nil, err
	}
	defer release()
	if p.rejectNonFinite {
		for name, tp := range req.GetInputs() {
			// What the backend would decode; a tensor it cannot is its
			// own to refuse.
			if t, err := wire.FromTensorProtoLimit(name, tp, int64(f.maxDecoded)); err == nil {
				if err := p.checkFinite(t); err != nil {
					return nil, err
				}
			}
		}
	}
	name := p.tfSpec(req.GetModelSpec(), true)
	var resp *tfapis.PredictResponse
	err = f.forward(ctx, p, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = p.pred.Predict(ctx, req, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	p.clientName(resp.GetModelSpec(), name)
	return resp, nil
}

func (f *Frontend) passMetadata(ctx context.Context, p *passThrough, req *tfapis.GetModelMetadataRequest) (*tfapis.GetModelMetadataResponse, error) {
	if err := p.needTF(); err != nil {
		return nil, err
	}
	name := p.tfSpec(req.GetModelSpec(), false)
	var resp *tfapis.GetModelMetadataResponse
	err := f.forward(ctx, p, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = p.pred.GetModelMetadata(ctx, req, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	p.clientName(resp.GetModelSpec(), name)
	return resp, nil
}

func (f *Frontend) passStatus(ctx context.Context, p *passThrough, req *tfapis.GetModelStatusRequest) (*tfapis.GetModelStatusResponse, error) {
	if err := p.needTF(); err != nil {
		return nil, err
	}
	p.tfSpec(req.GetModelSpec(), false)
	var resp *tfapis.GetModelStatusResponse
	err := f.forward(ctx, p, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = p.stat.GetModelStatus(ctx, req, opts...)
		return err
	})
	return resp, err
}

// ksName names the backend's model (and fills the deployment's version
// when the client gave none); it returns the client's name.
func (p *passThrough) ksName(name *string, version *string) string {
	client := *name
	*name = p.backend.Model
	if version != nil && *version == "" {
		*version = p.backend.Version
	}
	return client
}

func (f *Frontend) passInfer(ctx context.Context, p *passThrough, req *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	if err := p.needKS(); err != nil {
		return nil, err
	}
	release, err := f.admit.acquire(p.service, int64(proto.Size(req)))
	if err != nil {
		f.m.refused.Inc()
		return nil, err
	}
	defer release()
	if p.rejectNonFinite {
		if raws, takes, err := wire.RawInputs(req.GetInputs(), req.GetRawInputContents()); err == nil {
			for i, in := range req.GetInputs() {
				if _, shm := in.GetParameters()[wire.ParamShmRegion]; shm {
					continue // in the backend's shared memory: not seen here
				}
				if t, err := wire.FromInferInput(in, raws[i], takes[i]); err == nil {
					if err := p.checkFinite(t); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	name := p.ksName(&req.ModelName, &req.ModelVersion)
	var resp *inference.ModelInferResponse
	err = f.forward(ctx, p, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = p.infer.ModelInfer(ctx, req, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.ModelName == p.backend.Model {
		resp.ModelName = name
	}
	return resp, nil
}

func (f *Frontend) passReady(ctx context.Context, p *passThrough, req *inference.ModelReadyRequest) (*inference.ModelReadyResponse, error) {
	if err := p.needKS(); err != nil {
		return nil, err
	}
	p.ksName(&req.Name, &req.Version)
	var resp *inference.ModelReadyResponse
	err := f.forward(ctx, p, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = p.infer.ModelReady(ctx, req, opts...)
		return err
	})
	return resp, err
}

func (f *Frontend) passModelMetadata(ctx context.Context, p *passThrough, req *inference.ModelMetadataRequest) (*inference.ModelMetadataResponse, error) {
	if err := p.needKS(); err != nil {
		return nil, err
	}
	name := p.ksName(&req.Name, &req.Version)
	var resp *inference.ModelMetadataResponse
	err := f.forward(ctx, p, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = p.infer.ModelMetadata(ctx, req, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	if resp.Name == p.backend.Model {
		resp.Name = name
	}
	return resp, nil
}

// hamsAPI answers a HAMS API call (gRPC or HTTP) for a
// pass-through service.
func (p *passThrough) hamsAPI() error {
	apis := "KServe v2 (inference.GRPCInferenceService)"
	switch {
	case p.tf && p.ks:
		apis = "TF Serving (tensorflow.serving.PredictionService) or KServe v2 (inference.GRPCInferenceService)"
	case p.tf:
		apis = "TF Serving (tensorflow.serving.PredictionService)"
	}
	return status.Errorf(codes.Unimplemented, "service %q is served pass-through (model %q, ha: off): no sidecar runs it, call it through %s on this port",
		p.service, p.model, apis)
}
