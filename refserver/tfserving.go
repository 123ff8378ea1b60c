package refserver

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
	"github.com/hams-go/hams/refserver/models"
)

// DefaultSignature is the only signature the reference models have.
const DefaultSignature = "serving_default"

// wireStatus maps a wire conversion error to InvalidArgument, or
// ResourceExhausted for a tensor over the message limit.
func wireStatus(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, wire.ErrTooLarge) {
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

func ksToTF(dt string) tfpb.DataType {
	v, _ := wire.TFDataType(dt)
	return v
}

type predictAPI struct {
	tfapis.UnimplementedPredictionServiceServer
	s *Server
}

func (a *predictAPI) hostedOf(spec *tfapis.ModelSpec) (*hosted, error) {
	if spec == nil {
		return nil, status.Error(codes.InvalidArgument, "missing model_spec")
	}
	h, err := a.s.lookup(spec.Name)
	if err != nil {
		return nil, err
	}
	switch v := spec.VersionChoice.(type) {
	case *tfapis.ModelSpec_Version:
		if v.Version != nil && v.Version.Value != 1 {
			return nil, status.Errorf(codes.NotFound, "model %q has no version %d (only 1)", h.name, v.Version.Value)
		}
	case *tfapis.ModelSpec_VersionLabel:
		// As TF Serving answers a label its model_config_list does not set.
		if v.VersionLabel != "" {
			return nil, status.Errorf(codes.InvalidArgument, "model %q: unrecognized servable version label %q (the model has no version labels)", h.name, v.VersionLabel)
		}
	}
	if sig := spec.SignatureName; sig != "" && sig != DefaultSignature {
		return nil, status.Errorf(codes.FailedPrecondition, "model %q: serving signature key %q not found (only %q)", h.name, sig, DefaultSignature)
	}
	return h, nil
}

func respSpec(name string) *tfapis.ModelSpec {
	return &tfapis.ModelSpec{Name: name, VersionChoice: &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(1)}, SignatureName: DefaultSignature}
}

func (a *predictAPI) Predict(ctx context.Context, req *tfapis.PredictRequest) (*tfapis.PredictResponse, error) {
	h, err := a.hostedOf(req.ModelSpec)
	if err != nil {
		return nil, err
	}
	if !h.ready() {
		return nil, status.Errorf(codes.Unavailable, "model %q is not ready", h.name)
	}
	if len(req.Inputs) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "model %q: request has no inputs", h.name)
	}
	names := tfNamesOf(h.m)
	keys := make([]string, 0, len(req.Inputs))
	for k := range req.Inputs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ins := make([]*hamsv1.Tensor, 0, len(keys))
	var streams []string
	var stateIn []*hamsv1.Tensor
	// Each decode within what the earlier inputs left of a budget of 8
	// times the message limit: typed values expand at most 8x (a 1-byte
	// int64_val varint), so no request that carries its values is
	// refused, while one-value broadcasts, which expand a small message
	// without bound, stay bounded per request, not per tensor.
	left := int64(a.s.maxBytes) * 8
	for _, k := range keys {
		t, err := wire.FromTensorProtoLimit(k, req.Inputs[k], left)
		if err != nil {
			return nil, wireStatus(err)
		}
		left -= int64(len(t.Data))
		switch {
		case k == wire.StreamIDsInput && names.perStream:
			if t.Datatype != "BYTES" || len(t.Shape) != 1 {
				return nil, status.Errorf(codes.InvalidArgument, "tensor %q: want DT_STRING [rows], got %s %v", k, t.Datatype, t.Shape)
			}
			for _, id := range wire.BytesElems(t.Data) {
				streams = append(streams, string(id))
			}
			continue
		case names.in[k] != "":
			t.Name = names.in[k]
			stateIn = append(stateIn, t)
		}
		ins = append(ins, t)
	}
	if len(ins) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "model %q: request has no inputs besides %q", h.name, wire.StreamIDsInput)
	}
	// The batch's rows are counted on the first input: batch inputs go
	// before the state inputs (which sort first by name).
	sort.SliceStable(ins, func(i, j int) bool { return !names.isState(ins[i].Name) && names.isState(ins[j].Name) })
	if streams != nil && (len(ins[0].Shape) == 0 || int64(len(streams)) != ins[0].Shape[0]) {
		return nil, status.Errorf(codes.InvalidArgument, "model %q: %d stream ids in %q for the %v rows of input %q", h.name, len(streams), wire.StreamIDsInput, ins[0].Shape, ins[0].Name)
	}
	outs, err := a.s.infer(ctx, h, "Predict", ins, streams)
	if err != nil {
		return nil, err
	}
	var stateOut []*hamsv1.Tensor
	for i, o := range outs {
		if n := names.out[o.Name]; n != "" {
			outs[i] = &hamsv1.Tensor{Name: n, Datatype: o.Datatype, Shape: o.Shape, Data: o.Data}
			stateOut = append(stateOut, outs[i])
		}
	}
	if len(names.in) > 0 && a.s.log.Enabled(ctx, slog.LevelDebug) {
		a.s.log.Debug("explicit state call", "model", h.name, "api", "Predict", "rows", rowsOf(ins), "streams", len(streams),
			"state_in", stateDigest(stateIn), "state_out", stateDigest(stateOut))
	}
	if outs, err = filterOutputs(outs, req.OutputFilter); err != nil {
		return nil, err
	}
	resp := &tfapis.PredictResponse{ModelSpec: respSpec(h.name), Outputs: map[string]*tfpb.TensorProto{}}
	for _, o := range outs {
		// TF Serving's default response encoding: the typed *_val fields.
		if resp.Outputs[o.Name], err = wire.ToTensorProtoTyped(o); err != nil {
			return nil, status.Errorf(codes.Internal, "model %q: output: %v", h.name, err)
		}
	}
	return resp, nil
}

// tfNames maps an explicit-state model's state tensors between the
// server's own names (s_in, s_out: models.StateIn/StateOut) and TF
// Serving's state signature convention (state/s, state_next/s:
// docs/retrofit-tfserving.md, adapters/tfserving).
type tfNames struct {
	in        map[string]string // "state/s" -> "s_in"
	out       map[string]string // "s_out" -> "state_next/s"
	toTF      map[string]string // "s_in" -> "state/s"
	perStream bool              // the model takes hams_stream_ids
}

func (n tfNames) isState(serverName string) bool { return n.toTF[serverName] != "" }

// State tensor prefixes of TF Serving's state signature convention.
const (
	tfStateIn  = "state/"
	tfStateOut = "state_next/"
)

func tfNamesOf(m models.Model) tfNames {
	n := tfNames{in: map[string]string{}, out: map[string]string{}, toTF: map[string]string{}, perStream: models.PerStream(m)}
	states, ok := models.Explicit(m)
	if !ok {
		return n
	}
	for _, s := range states {
		n.in[tfStateIn+s.Name] = s.Name + models.StateIn
		n.toTF[s.Name+models.StateIn] = tfStateIn + s.Name
		n.out[s.Name+models.StateOut] = tfStateOut + s.Name
		n.toTF[s.Name+models.StateOut] = tfStateOut + s.Name
	}
	return n
}

// stateDigest is the hex SHA-256 of the state tensors' bytes in the
// order of their TF names (sorted, as adapters/tfserving orders its
// state): the audit logs' state_digest of the same state.
func stateDigest(ts []*hamsv1.Tensor) string {
	if len(ts) == 0 {
		return ""
	}
	sorted := append([]*hamsv1.Tensor(nil), ts...)
	sort.Slice(sorted, func(i, j int) bool {
		return strings.TrimPrefix(strings.TrimPrefix(sorted[i].Name, tfStateIn), tfStateOut) <
			strings.TrimPrefix(strings.TrimPrefix(sorted[j].Name, tfStateIn), tfStateOut)
	})
	return tensor.Digest(sorted...)
}

func rowsOf(ins []*hamsv1.Tensor) int64 {
	if len(ins) == 0 || len(ins[0].Shape) == 0 {
		return 0
	}
	return ins[0].Shape[0]
}

// tensorInfos describes specs under their TF Serving names (toTF renames
// state tensors).
func tensorInfos(specs []*hamsv1.TensorSpec, toTF map[string]string) map[string]*tfapis.TensorInfo {
	m := map[string]*tfapis.TensorInfo{}
	for _, s := range specs {
		name := s.Name
		if n := toTF[name]; n != "" {
			name = n
		}
		m[name] = &tfapis.TensorInfo{Name: name + ":0", Dtype: ksToTF(s.Datatype), TensorShape: wire.TFShape(s.Shape)}
	}
	return m
}

func (a *predictAPI) GetModelMetadata(ctx context.Context, req *tfapis.GetModelMetadataRequest) (*tfapis.GetModelMetadataResponse, error) {
	h, err := a.hostedOf(req.ModelSpec)
	if err != nil {
		return nil, err
	}
	if len(req.MetadataField) == 0 {
		return nil, status.Error(codes.InvalidArgument, "GetModelMetadataRequest must specify at least one metadata_field (signature_def)")
	}
	for _, f := range req.MetadataField {
		if f != "signature_def" {
			return nil, status.Errorf(codes.InvalidArgument, "metadata field %q is not supported (only signature_def)", f)
		}
	}
	d := h.m.Describe()
	names := tfNamesOf(h.m)
	def := &tfapis.SignatureDef{Inputs: tensorInfos(d.Inputs, names.toTF), Outputs: tensorInfos(d.Outputs, names.toTF), MethodName: "tensorflow/serving/predict"}
	if names.perStream {
		def.Inputs[wire.StreamIDsInput] = &tfapis.TensorInfo{Name: wire.StreamIDsInput + ":0", Dtype: tfpb.DataType_DT_STRING, TensorShape: wire.TFShape([]int64{-1})}
	}
	sigs := &tfapis.SignatureDefMap{SignatureDef: map[string]*tfapis.SignatureDef{DefaultSignature: def}}
	anyv, err := anypb.New(sigs)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode signature_def: %v", err)
	}
	return &tfapis.GetModelMetadataResponse{ModelSpec: respSpec(h.name), Metadata: map[string]*anypb.Any{"signature_def": anyv}}, nil
}

type modelStatusAPI struct {
	tfapis.UnimplementedModelServiceServer
	s *Server
}

func (a *modelStatusAPI) GetModelStatus(ctx context.Context, req *tfapis.GetModelStatusRequest) (*tfapis.GetModelStatusResponse, error) {
	if req.ModelSpec == nil {
		return nil, status.Error(codes.InvalidArgument, "missing model_spec")
	}
	h, err := a.s.lookup(req.ModelSpec.Name)
	if err != nil {
		return nil, err
	}
	// A model taken out of service (SetReady(false)) reports UNLOADING, the
	// state TF Serving reports while a version is going away.
	state := tfapis.ModelVersionStatus_AVAILABLE
	if !h.ready() {
		state = tfapis.ModelVersionStatus_UNLOADING
	}
	return &tfapis.GetModelStatusResponse{ModelVersionStatus: []*tfapis.ModelVersionStatus{{
		Version: 1, State: state, Status: &tfapis.StatusProto{},
	}}}, nil
}
