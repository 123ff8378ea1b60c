package refserver

import (
	"context"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// DefaultSignature is the only signature the reference models have.
const DefaultSignature = "serving_default"

// wireStatus maps a wire conversion error to InvalidArgument.
func wireStatus(err error) error {
	if err == nil {
		return nil
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
	if v, ok := spec.VersionChoice.(*tfapis.ModelSpec_Version); ok && v.Version != nil && v.Version.Value != 1 {
		return nil, status.Errorf(codes.NotFound, "model %q has no version %d (only 1)", h.name, v.Version.Value)
	}
	if sig := spec.SignatureName; sig != "" && sig != DefaultSignature {
		return nil, status.Errorf(codes.InvalidArgument, "model %q: serving signature %q not found (only %q)", h.name, sig, DefaultSignature)
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
	keys := make([]string, 0, len(req.Inputs))
	for k := range req.Inputs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ins := make([]*hamsv1.Tensor, len(keys))
	for i, k := range keys {
		if ins[i], err = wire.FromTensorProto(k, req.Inputs[k]); err != nil {
			return nil, wireStatus(err)
		}
	}
	outs, err := a.s.infer(h, "Predict", ins, nil)
	if err != nil {
		return nil, err
	}
	if outs, err = filterOutputs(outs, req.OutputFilter); err != nil {
		return nil, err
	}
	resp := &tfapis.PredictResponse{ModelSpec: respSpec(h.name), Outputs: map[string]*tfpb.TensorProto{}}
	for _, o := range outs {
		if resp.Outputs[o.Name], err = wire.ToTensorProto(o); err != nil {
			return nil, status.Errorf(codes.Internal, "model %q: output: %v", h.name, err)
		}
	}
	return resp, nil
}

func tensorInfos(specs []*hamsv1.TensorSpec) map[string]*tfapis.TensorInfo {
	m := map[string]*tfapis.TensorInfo{}
	for _, s := range specs {
		m[s.Name] = &tfapis.TensorInfo{Name: s.Name + ":0", Dtype: ksToTF(s.Datatype), TensorShape: wire.TFShape(s.Shape)}
	}
	return m
}

func (a *predictAPI) GetModelMetadata(ctx context.Context, req *tfapis.GetModelMetadataRequest) (*tfapis.GetModelMetadataResponse, error) {
	h, err := a.hostedOf(req.ModelSpec)
	if err != nil {
		return nil, err
	}
	for _, f := range req.MetadataField {
		if f != "signature_def" {
			return nil, status.Errorf(codes.InvalidArgument, "metadata field %q is not supported (only signature_def)", f)
		}
	}
	d := h.m.Describe()
	sigs := &tfapis.SignatureDefMap{SignatureDef: map[string]*tfapis.SignatureDef{
		DefaultSignature: {Inputs: tensorInfos(d.Inputs), Outputs: tensorInfos(d.Outputs), MethodName: "tensorflow/serving/predict"},
	}}
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
