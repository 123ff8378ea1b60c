package refserver

import (
	"context"
	"encoding/binary"
	"math"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// DefaultSignature is the only signature the reference models have.
const DefaultSignature = "serving_default"

var tfToKS = map[tfpb.DataType]string{
	tfpb.DataType_DT_FLOAT: tensor.FP32, tfpb.DataType_DT_DOUBLE: tensor.FP64,
	tfpb.DataType_DT_INT32: tensor.Int32, tfpb.DataType_DT_INT16: tensor.Int16, tfpb.DataType_DT_INT8: tensor.Int8,
	tfpb.DataType_DT_UINT8: tensor.Uint8, tfpb.DataType_DT_INT64: tensor.Int64, tfpb.DataType_DT_BOOL: tensor.Bool,
	tfpb.DataType_DT_UINT32: "UINT32", tfpb.DataType_DT_UINT64: "UINT64", tfpb.DataType_DT_HALF: tensor.FP16,
	tfpb.DataType_DT_STRING: tensor.Bytes, tfpb.DataType_DT_UINT16: "UINT16",
}

func ksToTF(dt string) tfpb.DataType {
	for k, v := range tfToKS {
		if v == dt {
			return k
		}
	}
	return tfpb.DataType_DT_INVALID
}

// FromTensorProto converts a TF TensorProto (tensor_content or typed
// values, with the single-value broadcast rule) into a raw tensor.
func FromTensorProto(name string, tp *tfpb.TensorProto) (*hamsv1.Tensor, error) {
	if tp == nil {
		return nil, status.Errorf(codes.InvalidArgument, "tensor %q: empty TensorProto", name)
	}
	dt, ok := tfToKS[tp.Dtype]
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "tensor %q: unsupported dtype %v", name, tp.Dtype)
	}
	if tp.TensorShape == nil || tp.TensorShape.UnknownRank {
		return nil, status.Errorf(codes.InvalidArgument, "tensor %q: shape unknown", name)
	}
	shape := make([]int64, len(tp.TensorShape.Dim))
	for i, d := range tp.TensorShape.Dim {
		if d.Size < 0 {
			return nil, status.Errorf(codes.InvalidArgument, "tensor %q: dimension %d is %d", name, i, d.Size)
		}
		shape[i] = d.Size
	}
	n, err := tensor.NumElements(shape)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "tensor %q: %v", name, err)
	}
	t := &hamsv1.Tensor{Name: name, Datatype: dt, Shape: shape}
	if len(tp.TensorContent) > 0 {
		if dt == tensor.Bytes {
			return nil, status.Errorf(codes.InvalidArgument, "tensor %q: DT_STRING in tensor_content", name)
		}
		t.Data = tp.TensorContent
	} else {
		if t.Data, err = typedTF(name, dt, tp, n); err != nil {
			return nil, err
		}
	}
	if err := tensor.Validate(t); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return t, nil
}

// typedTF encodes the typed field of dt; one value with n > 1 broadcasts.
func typedTF(name, dt string, tp *tfpb.TensorProto, n int64) ([]byte, error) {
	es := tensor.ElemSize(dt)
	var count int
	var enc func(b []byte, i int) []byte
	switch dt {
	case tensor.FP32:
		count, enc = len(tp.FloatVal), func(b []byte, i int) []byte {
			return binary.LittleEndian.AppendUint32(b, math.Float32bits(tp.FloatVal[i]))
		}
	case tensor.FP64:
		count, enc = len(tp.DoubleVal), func(b []byte, i int) []byte {
			return binary.LittleEndian.AppendUint64(b, math.Float64bits(tp.DoubleVal[i]))
		}
	case tensor.Int32, tensor.Int16, tensor.Int8, tensor.Uint8, "UINT16":
		count, enc = len(tp.IntVal), func(b []byte, i int) []byte { return appendInt(b, uint64(tp.IntVal[i]), es) }
	case tensor.Int64:
		count, enc = len(tp.Int64Val), func(b []byte, i int) []byte { return binary.LittleEndian.AppendUint64(b, uint64(tp.Int64Val[i])) }
	case "UINT32":
		count, enc = len(tp.Uint32Val), func(b []byte, i int) []byte { return binary.LittleEndian.AppendUint32(b, tp.Uint32Val[i]) }
	case "UINT64":
		count, enc = len(tp.Uint64Val), func(b []byte, i int) []byte { return binary.LittleEndian.AppendUint64(b, tp.Uint64Val[i]) }
	case tensor.FP16:
		count, enc = len(tp.HalfVal), func(b []byte, i int) []byte { return binary.LittleEndian.AppendUint16(b, uint16(tp.HalfVal[i])) }
	case tensor.Bool:
		count, enc = len(tp.BoolVal), func(b []byte, i int) []byte {
			if tp.BoolVal[i] {
				return append(b, 1)
			}
			return append(b, 0)
		}
	case tensor.Bytes:
		count, enc = len(tp.StringVal), func(b []byte, i int) []byte {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(tp.StringVal[i])))
			return append(b, tp.StringVal[i]...)
		}
	}
	switch {
	case int64(count) == n:
	case count == 1 && n > 1:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "tensor %q: shape wants %d values, the typed field holds %d", name, n, count)
	}
	b := make([]byte, 0, int(n)*max(es, 1))
	for i := int64(0); i < n; i++ {
		j := int(i)
		if count == 1 {
			j = 0
		}
		b = enc(b, j)
	}
	return b, nil
}

// ToTensorProto encodes a raw tensor as a TensorProto with tensor_content.
func ToTensorProto(t *hamsv1.Tensor) *tfpb.TensorProto {
	tp := &tfpb.TensorProto{Dtype: ksToTF(t.Datatype), TensorShape: tfShape(t.Shape), TensorContent: t.Data}
	return tp
}

func tfShape(shape []int64) *tfpb.TensorShapeProto {
	s := &tfpb.TensorShapeProto{}
	for _, d := range shape {
		s.Dim = append(s.Dim, &tfpb.TensorShapeProto_Dim{Size: d})
	}
	return s
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
		if ins[i], err = FromTensorProto(k, req.Inputs[k]); err != nil {
			return nil, err
		}
	}
	outs, err := a.s.infer(h, "Predict", ins, "")
	if err != nil {
		return nil, err
	}
	if outs, err = filterOutputs(outs, req.OutputFilter); err != nil {
		return nil, err
	}
	resp := &tfapis.PredictResponse{ModelSpec: respSpec(h.name), Outputs: map[string]*tfpb.TensorProto{}}
	for _, o := range outs {
		resp.Outputs[o.Name] = ToTensorProto(o)
	}
	return resp, nil
}

func tensorInfos(specs []*hamsv1.TensorSpec) map[string]*tfapis.TensorInfo {
	m := map[string]*tfapis.TensorInfo{}
	for _, s := range specs {
		m[s.Name] = &tfapis.TensorInfo{Name: s.Name + ":0", Dtype: ksToTF(s.Datatype), TensorShape: tfShape(s.Shape)}
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
	_ = h
	return &tfapis.GetModelStatusResponse{ModelVersionStatus: []*tfapis.ModelVersionStatus{{
		Version: 1, State: tfapis.ModelVersionStatus_AVAILABLE, Status: &tfapis.StatusProto{},
	}}}, nil
}
