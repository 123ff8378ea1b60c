package frontend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// Compatibility APIs (retrofit mode): the frontend's gRPC port also serves
// TF Serving's PredictionService (Predict, GetModelMetadata) and
// ModelService (GetModelStatus), and KServe v2's GRPCInferenceService
// (ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
// ModelInfer), so existing clients only change the address.
//
// A client's model name names a service: a service's own name, or the one
// model of a one-model service. A Predict / ModelInfer becomes a frontend
// predict of that service (same validation, idempotency, deadlines and
// reply gating); its reply's outputs are the sink's tensors by name, or,
// for a service with several sinks, "<sink model>/<tensor>". KServe's
// "sequence_id" parameter becomes the stream id (TF Serving has none: the
// frontend's default applies), and a string parameter "request_id" the
// idempotency key. A service has one version: backend.version of a
// one-model service's model when it is a number, else 1; a backend.version
// that is not a number is the service's version label (TF Serving's
// version_label; KServe's model_version accepts the number or the label).
// A request naming another version or label is NotFound, as it is from the
// servers themselves. Calls for a pass-through model (ha: off, no sidecar)
// are forwarded to its backend instead (passthrough.go).

// Approximate replies (a parity model's reconstruction, docs/design.md "Parity
// models") are marked on both APIs, and only those: KServe v2 with the
// response parameter ParamApproximate = bool true, TF Serving (whose
// PredictResponse has no room for it) with the response header metadata
// HeaderApproximate: "true". An exact reply carries neither. The raw
// pass-through (ha: off) never reconstructs and is never marked.

// Compatibility names.
const (
	// ParamApproximate is the KServe v2 response parameter (bool true) of
	// an approximate reply.
	ParamApproximate = "hams_approximate"
	// HeaderApproximate is the TF Serving response header (value "true")
	// of an approximate reply.
	HeaderApproximate = "hams-approximate"
	// CompatSignature is the TF Serving signature every service answers to
	// (a one-model service also answers to its model's backend.signature).
	CompatSignature = "serving_default"
	// ParamRequestID is the KServe request parameter carrying the
	// idempotency key (request_id of the HAMS API).
	ParamRequestID = "request_id"
	// compatVersion is the version the compatibility APIs report.
	compatVersion = 1
)

// modelService maps a client's model name to a service.
func (f *Frontend) modelService(name string) (*serviceInfo, error) {
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "no model named in the request")
	}
	if s := f.services[name]; s != nil {
		return s, nil
	}
	for _, n := range f.svcOrder {
		s := f.services[n]
		if len(s.models) == 1 && s.models[0] == name {
			return s, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "model %q not found: it is neither a service (%s) nor the model of a one-model service",
		name, strings.Join(f.svcOrder, ", "))
}

// serviceReady lists the entry models of s without a live instance.
func (f *Frontend) serviceUnresolved(s *serviceInfo) []string {
	var out []string
	for _, e := range s.entries {
		if _, _, ok := f.cfg.Resolver.Resolve(e); !ok {
			out = append(out, e)
		}
	}
	down, _ := f.hw.down(s.models) // backends known down (health.go)
	return append(out, down...)
}

// flatOutputs names a reply's tensors as the compatibility APIs answer
// them: by tensor name for one sink, "<model>/<tensor>" for several.
func flatOutputs(resp *hamsv1.PredictResponse) []*hamsv1.Tensor {
	var out []*hamsv1.Tensor
	multi := len(resp.GetOutputs()) > 1
	for _, o := range resp.GetOutputs() {
		for _, t := range o.GetTensors() {
			if multi {
				t = &hamsv1.Tensor{Name: o.GetModel() + "/" + t.GetName(), Datatype: t.GetDatatype(), Shape: t.GetShape(), Data: t.GetData()}
			}
			out = append(out, t)
		}
	}
	return out
}

// filterNamed keeps the named outputs in the order asked (all when none
// are named); an unknown name is InvalidArgument.
func filterNamed(outs []*hamsv1.Tensor, names []string) ([]*hamsv1.Tensor, error) {
	if len(names) == 0 {
		return outs, nil
	}
	kept := make([]*hamsv1.Tensor, 0, len(names))
	for i, n := range names {
		if slices.Contains(names[:i], n) {
			return nil, status.Errorf(codes.InvalidArgument, "duplicate output tensor alias %q in output_filter", n)
		}
		var found *hamsv1.Tensor
		for _, o := range outs {
			if o.GetName() == n {
				found = o
				break
			}
		}
		if found == nil {
			have := make([]string, len(outs))
			for i, o := range outs {
				have[i] = o.GetName()
			}
			return nil, status.Errorf(codes.InvalidArgument, "requested output %q is not an output of the model (outputs: %s)", n, strings.Join(have, ", "))
		}
		kept = append(kept, found)
	}
	return kept, nil
}

// wireErr turns a conversion error into InvalidArgument, or
// ResourceExhausted for a tensor over the request's byte budget (the
// message names the tensor).
func wireErr(service string, err error) error {
	if errors.Is(err, wire.ErrTooLarge) {
		return status.Errorf(codes.ResourceExhausted, "service %q: %v", service, err)
	}
	if _, ok := status.FromError(err); ok && !errors.Is(err, wire.ErrInvalid) {
		return err
	}
	return status.Errorf(codes.InvalidArgument, "service %q: %v", service, err)
}

// ---- TF Serving ----

type tfPredictServer struct {
	tfapis.UnimplementedPredictionServiceServer
	f *Frontend
}

type tfModelServer struct {
	tfapis.UnimplementedModelServiceServer
	f *Frontend
}

func (f *Frontend) tfService(spec *tfapis.ModelSpec, checkSig bool) (*serviceInfo, error) {
	if spec == nil {
		return nil, status.Error(codes.InvalidArgument, "missing model_spec")
	}
	s, err := f.modelService(spec.GetName())
	if err != nil {
		return nil, err
	}
	switch v := spec.GetVersionChoice().(type) {
	case *tfapis.ModelSpec_Version:
		if v.Version != nil && v.Version.GetValue() != s.version {
			return nil, status.Errorf(codes.NotFound, "model %q: version %d not found (serves version %d)", spec.GetName(), v.Version.GetValue(), s.version)
		}
	case *tfapis.ModelSpec_VersionLabel:
		// TF Serving: INVALID_ARGUMENT "Unrecognized servable version label".
		if v.VersionLabel != "" && v.VersionLabel != s.label {
			return nil, status.Errorf(codes.InvalidArgument, "model %q: unrecognized servable version label %q (%s)", spec.GetName(), v.VersionLabel, s.labels())
		}
	}
	if sig := spec.GetSignatureName(); checkSig && !s.hasSignature(sig) {
		// TF Serving: FAILED_PRECONDITION `Serving signature key "x" not found.`
		return nil, status.Errorf(codes.FailedPrecondition, "model %q: serving signature key %q not found (signatures: %s)", spec.GetName(), sig, strings.Join(s.signatures(), ", "))
	}
	return s, nil
}

// signatures are the TF Serving signature keys the service answers to:
// serving_default, and backend.signature of a one-model service's model
// (the key its clients name when they call TF Serving itself).
func (s *serviceInfo) signatures() []string {
	if s.signature == "" || s.signature == CompatSignature {
		return []string{CompatSignature}
	}
	return []string{CompatSignature, s.signature}
}

// hasSignature says whether a request's signature_name names the service
// (empty means serving_default).
func (s *serviceInfo) hasSignature(sig string) bool {
	return sig == "" || slices.Contains(s.signatures(), sig)
}

// labels describes the service's version labels for an error message.
func (s *serviceInfo) labels() string {
	if s.label == "" {
		return "it has no version labels"
	}
	return fmt.Sprintf("its label is %q", s.label)
}

// kserveVersion checks a KServe model_version: empty, the service's
// version number, or its label.
func (s *serviceInfo) kserveVersion(model, v string) error {
	if v == "" || v == strconv.FormatInt(s.version, 10) || (s.label != "" && v == s.label) {
		return nil
	}
	return status.Errorf(codes.NotFound, "model %q: version %q not found (serves version %d; %s)", model, v, s.version, s.labels())
}

// tfRespSpec is a response's model_spec: the version served and the
// signature used (the request's, else serving_default).
func tfRespSpec(req *tfapis.ModelSpec, s *serviceInfo) *tfapis.ModelSpec {
	sig := req.GetSignatureName()
	if sig == "" {
		sig = CompatSignature
	}
	return &tfapis.ModelSpec{Name: req.GetName(), VersionChoice: &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(s.version)}, SignatureName: sig}
}

func (s *tfPredictServer) Predict(ctx context.Context, req *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
	if p := s.f.passFor(req.GetModelSpec().GetName()); p != nil && req.GetModelSpec() != nil {
		return s.f.passPredict(ctx, p, req)
	}
	svc, err := s.f.tfService(req.GetModelSpec(), true)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(req.GetInputs()))
	for k := range req.GetInputs() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Names first, then decodes within what is left of the request's byte
	// budget: a one-value broadcast makes a tensor much larger than its
	// message, and a small request naming many inputs must not expand to
	// many times the limit before predict's own checks see it.
	for _, k := range keys {
		if err := svc.declared(k); err != nil {
			return nil, err
		}
	}
	ins := make([]*hamsv1.Tensor, len(keys))
	left := int64(s.f.maxDecoded)
	for i, k := range keys {
		if ins[i], err = wire.FromTensorProtoLimit(k, req.GetInputs()[k], left); err != nil {
			return nil, wireErr(svc.name, err)
		}
		left -= int64(len(ins[i].GetData()))
	}
	resp, err := s.f.predict(ctx, &hamsv1.PredictRequest{Service: svc.name, Inputs: ins})
	if err != nil {
		return nil, err
	}
	outs, err := filterNamed(flatOutputs(resp), req.GetOutputFilter())
	if err != nil {
		return nil, err
	}
	out := &tfapis.PredictResponse{ModelSpec: tfRespSpec(req.GetModelSpec(), svc), Outputs: make(map[string]*tfpb.TensorProto, len(outs))}
	for _, o := range outs {
		tp, err := wire.ToTensorProtoTyped(o)
		if err != nil {
			// A model answered a tensor TF Serving cannot express.
			return nil, status.Errorf(codes.Internal, "service %q: output: %v", svc.name, err)
		}
		out.Outputs[o.GetName()] = tp
	}
	if resp.GetApproximate() {
		// Headers leave with the response, so they are set before the
		// handler returns it. An approximate reply never leaves unmarked:
		// when the header cannot be set, the call fails instead.
		if err := grpc.SetHeader(ctx, metadata.Pairs(HeaderApproximate, "true")); err != nil {
			return nil, status.Errorf(codes.Internal, "service %q: mark the reply approximate: set header %s: %v", svc.name, HeaderApproximate, err)
		}
	}
	return out, nil
}

func (s *tfPredictServer) GetModelMetadata(ctx context.Context, req *tfapis.GetModelMetadataRequest) (*tfapis.GetModelMetadataResponse, error) {
	if p := s.f.passFor(req.GetModelSpec().GetName()); p != nil && req.GetModelSpec() != nil {
		return s.f.passMetadata(ctx, p, req)
	}
	svc, err := s.f.tfService(req.GetModelSpec(), false)
	if err != nil {
		return nil, err
	}
	if err := checkMetadataFields(req.GetMetadataField()); err != nil {
		return nil, err
	}
	def := &tfapis.SignatureDef{Inputs: map[string]*tfapis.TensorInfo{}, Outputs: map[string]*tfapis.TensorInfo{}, MethodName: "tensorflow/serving/predict"}
	for _, in := range svc.inputs {
		def.Inputs[in.Name] = tfTensorInfo(in)
	}
	for _, out := range svc.outputs {
		def.Outputs[out.Name] = tfTensorInfo(out)
	}
	defs := map[string]*tfapis.SignatureDef{}
	for _, sig := range svc.signatures() {
		defs[sig] = def
	}
	anyv, err := anypb.New(&tfapis.SignatureDefMap{SignatureDef: defs})
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode signature_def: %v", err)
	}
	return &tfapis.GetModelMetadataResponse{ModelSpec: tfRespSpec(req.GetModelSpec(), svc), Metadata: map[string]*anypb.Any{"signature_def": anyv}}, nil
}

// checkMetadataFields answers a GetModelMetadata's metadata_field as TF
// Serving does: at least one, and only signature_def.
func checkMetadataFields(fields []string) error {
	if len(fields) == 0 {
		return status.Error(codes.InvalidArgument, "GetModelMetadataRequest must specify at least one metadata_field (signature_def)")
	}
	for _, fld := range fields {
		if fld != "signature_def" {
			return status.Errorf(codes.InvalidArgument, "metadata field %q is not supported (only signature_def)", fld)
		}
	}
	return nil
}

// tfTensorInfo is a declared tensor as a signature_def lists it.
func tfTensorInfo(spec config.TensorSpec) *tfapis.TensorInfo {
	dt, _ := wire.TFDataType(spec.Datatype)
	ti := &tfapis.TensorInfo{Name: spec.Name + ":0", Dtype: dt}
	if spec.Shape != nil {
		ti.TensorShape = wire.TFShape(spec.Shape)
	} else {
		ti.TensorShape = &tfpb.TensorShapeProto{UnknownRank: true}
	}
	return ti
}

func (s *tfModelServer) GetModelStatus(ctx context.Context, req *tfapis.GetModelStatusRequest) (*tfapis.GetModelStatusResponse, error) {
	if p := s.f.passFor(req.GetModelSpec().GetName()); p != nil && req.GetModelSpec() != nil {
		return s.f.passStatus(ctx, p, req)
	}
	// TF Serving's GetModelStatus ignores version_label: it answers the
	// one version asked for, or every version.
	spec := req.GetModelSpec()
	if _, ok := spec.GetVersionChoice().(*tfapis.ModelSpec_VersionLabel); ok {
		spec = &tfapis.ModelSpec{Name: spec.GetName()}
	}
	svc, err := s.f.tfService(spec, false)
	if err != nil {
		return nil, err
	}
	st := &tfapis.ModelVersionStatus{Version: svc.version, State: tfapis.ModelVersionStatus_AVAILABLE, Status: &tfapis.StatusProto{}}
	if err := s.f.backendsDown(svc); err != nil {
		// As TF Serving reports a version that cannot serve (its load
		// failed): END, with the error.
		st.State = tfapis.ModelVersionStatus_END
		st.Status = &tfapis.StatusProto{ErrorCode: int32(codes.Unavailable), ErrorMessage: status.Convert(err).Message()}
	} else if missing := s.f.serviceUnresolved(svc); len(missing) > 0 {
		st.State = tfapis.ModelVersionStatus_LOADING
		st.Status = &tfapis.StatusProto{ErrorCode: int32(codes.Unavailable),
			ErrorMessage: fmt.Sprintf("service %q: entry models without a live instance: %s", svc.name, strings.Join(missing, ", "))}
	}
	return &tfapis.GetModelStatusResponse{ModelVersionStatus: []*tfapis.ModelVersionStatus{st}}, nil
}

// ---- KServe v2 ----

type kserveServer struct {
	inference.UnimplementedGRPCInferenceServiceServer
	f *Frontend
}

func (s *kserveServer) ServerLive(context.Context, *inference.ServerLiveRequest) (*inference.ServerLiveResponse, error) {
	s.f.mu.Lock()
	closed := s.f.closed
	s.f.mu.Unlock()
	return &inference.ServerLiveResponse{Live: !closed}, nil
}

func (s *kserveServer) ServerReady(context.Context, *inference.ServerReadyRequest) (*inference.ServerReadyResponse, error) {
	s.f.mu.Lock()
	closed := s.f.closed
	s.f.mu.Unlock()
	return &inference.ServerReadyResponse{Ready: !closed && len(s.f.unresolved()) == 0}, nil
}

func (s *kserveServer) ModelReady(ctx context.Context, req *inference.ModelReadyRequest) (*inference.ModelReadyResponse, error) {
	if p := s.f.passFor(req.GetName()); p != nil {
		return s.f.passReady(ctx, p, req)
	}
	// As Triton answers (InferenceServer::ModelIsReady): an unknown model
	// or version is not ready, not an error, so is_model_ready() is False.
	svc, err := s.f.modelService(req.GetName())
	if err != nil || svc.kserveVersion(req.GetName(), req.GetVersion()) != nil {
		return &inference.ModelReadyResponse{Ready: false}, nil
	}
	return &inference.ModelReadyResponse{Ready: len(s.f.serviceUnresolved(svc)) == 0}, nil
}

func (s *kserveServer) ServerMetadata(context.Context, *inference.ServerMetadataRequest) (*inference.ServerMetadataResponse, error) {
	return &inference.ServerMetadataResponse{Name: "hams-go", Version: "1", Extensions: []string{"sequence"}}, nil
}

func (s *kserveServer) ModelMetadata(ctx context.Context, req *inference.ModelMetadataRequest) (*inference.ModelMetadataResponse, error) {
	if p := s.f.passFor(req.GetName()); p != nil {
		return s.f.passModelMetadata(ctx, p, req)
	}
	svc, err := s.f.modelService(req.GetName())
	if err != nil {
		return nil, err
	}
	if err := svc.kserveVersion(req.GetName(), req.GetVersion()); err != nil {
		return nil, err
	}
	out := &inference.ModelMetadataResponse{Name: req.GetName(), Versions: []string{strconv.FormatInt(svc.version, 10)}, Platform: "hams-go"}
	for _, in := range svc.inputs {
		out.Inputs = append(out.Inputs, kserveTensorMetadata(in))
	}
	for _, o := range svc.outputs {
		out.Outputs = append(out.Outputs, kserveTensorMetadata(o))
	}
	return out, nil
}

// kserveTensorMetadata is a declared tensor as ModelMetadata lists it (an
// undeclared shape is [-1]).
func kserveTensorMetadata(spec config.TensorSpec) *inference.ModelMetadataResponse_TensorMetadata {
	shape := spec.Shape
	if shape == nil {
		shape = []int64{-1}
	}
	return &inference.ModelMetadataResponse_TensorMetadata{Name: spec.Name, Datatype: spec.Datatype, Shape: shape}
}

func (s *kserveServer) ModelInfer(ctx context.Context, req *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	if p := s.f.passFor(req.GetModelName()); p != nil {
		return s.f.passInfer(ctx, p, req)
	}
	svc, err := s.f.modelService(req.GetModelName())
	if err != nil {
		return nil, err
	}
	if err := svc.kserveVersion(req.GetModelName(), req.GetModelVersion()); err != nil {
		return nil, err
	}
	for _, in := range req.GetInputs() {
		if _, shm := in.GetParameters()[wire.ParamShmRegion]; shm {
			return nil, status.Errorf(codes.InvalidArgument, "service %q: input %q: shared-memory inputs are not supported by the HAMS frontend (send the data in the request)", svc.name, in.GetName())
		}
	}
	raws, takes, err := wire.RawInputs(req.GetInputs(), req.GetRawInputContents())
	if err != nil {
		return nil, wireErr(svc.name, err)
	}
	// Within the request's byte budget, checked before each decode (typed
	// contents expand up to 8 times), as for TF Serving.
	ins := make([]*hamsv1.Tensor, len(req.GetInputs()))
	left := int64(s.f.maxDecoded)
	for i, in := range req.GetInputs() {
		if ins[i], err = wire.FromInferInputLimit(in, raws[i], takes[i], left); err != nil {
			return nil, wireErr(svc.name, err)
		}
		left -= int64(len(ins[i].GetData()))
	}
	for _, o := range req.GetOutputs() {
		if _, shm := o.GetParameters()[wire.ParamShmRegion]; shm {
			return nil, status.Errorf(codes.InvalidArgument, "service %q: output %q: shared-memory outputs are not supported by the HAMS frontend", svc.name, o.GetName())
		}
		// Triton's classification extension answers top-k labels as
		// BYTES; answering the raw tensor instead would be silently
		// wrong.
		if _, cls := o.GetParameters()[wire.ParamClassification]; cls {
			return nil, status.Errorf(codes.InvalidArgument, "service %q: output %q: the classification extension (parameter %q) is not supported by the HAMS frontend; ask for the tensor and take the top k", svc.name, o.GetName(), wire.ParamClassification)
		}
	}
	stream, err := wire.SequenceID(req.GetParameters())
	if err != nil {
		return nil, wireErr(svc.name, err)
	}
	reqID, _, err := wire.StringParam(req.GetParameters(), ParamRequestID)
	if err != nil {
		return nil, wireErr(svc.name, err)
	}
	resp, err := s.f.predict(ctx, &hamsv1.PredictRequest{Service: svc.name, Inputs: ins, StreamId: stream, RequestId: reqID})
	if err != nil {
		return nil, err
	}
	names := make([]string, len(req.GetOutputs()))
	for i, o := range req.GetOutputs() {
		names[i] = o.GetName()
	}
	outs, err := filterNamed(flatOutputs(resp), names)
	if err != nil {
		return nil, err
	}
	out := &inference.ModelInferResponse{ModelName: req.GetModelName(), ModelVersion: strconv.FormatInt(svc.version, 10), Id: req.GetId()}
	for _, o := range outs {
		out.Outputs = append(out.Outputs, wire.InferOutput(o))
		out.RawOutputContents = append(out.RawOutputContents, o.GetData())
	}
	if resp.GetApproximate() {
		out.Parameters = map[string]*inference.InferParameter{
			ParamApproximate: {ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: true}},
		}
	}
	return out, nil
}
