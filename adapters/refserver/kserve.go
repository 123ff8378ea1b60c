package refserver

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

type kserveAPI struct {
	inference.UnimplementedGRPCInferenceServiceServer
	s *Server
}

func (a *kserveAPI) ServerLive(context.Context, *inference.ServerLiveRequest) (*inference.ServerLiveResponse, error) {
	return &inference.ServerLiveResponse{Live: true}, nil
}

func (a *kserveAPI) ServerReady(context.Context, *inference.ServerReadyRequest) (*inference.ServerReadyResponse, error) {
	return &inference.ServerReadyResponse{Ready: true}, nil
}

func (a *kserveAPI) ModelReady(ctx context.Context, req *inference.ModelReadyRequest) (*inference.ModelReadyResponse, error) {
	if _, err := a.s.lookup(req.GetName()); err != nil {
		return nil, err
	}
	return &inference.ModelReadyResponse{Ready: true}, nil
}

func (a *kserveAPI) ServerMetadata(context.Context, *inference.ServerMetadataRequest) (*inference.ServerMetadataResponse, error) {
	return &inference.ServerMetadataResponse{Name: "hams-refserver", Version: "1", Extensions: []string{"sequence"}}, nil
}

func specsMeta(specs []*hamsv1.TensorSpec) []*inference.ModelMetadataResponse_TensorMetadata {
	out := make([]*inference.ModelMetadataResponse_TensorMetadata, len(specs))
	for i, s := range specs {
		out[i] = &inference.ModelMetadataResponse_TensorMetadata{Name: s.Name, Datatype: s.Datatype, Shape: s.Shape}
	}
	return out
}

func (a *kserveAPI) ModelMetadata(ctx context.Context, req *inference.ModelMetadataRequest) (*inference.ModelMetadataResponse, error) {
	h, err := a.s.lookup(req.GetName())
	if err != nil {
		return nil, err
	}
	d := h.m.Describe()
	return &inference.ModelMetadataResponse{Name: h.name, Versions: []string{"1"}, Platform: "hams-go_" + d.Kind,
		Inputs: specsMeta(d.Inputs), Outputs: specsMeta(d.Outputs)}, nil
}

// kserveTensor converts one input (typed contents or raw bytes) to a raw
// hamsv1.Tensor.
func kserveTensor(in *inference.ModelInferRequest_InferInputTensor, raw []byte, hasRaw bool) (*hamsv1.Tensor, error) {
	t := &hamsv1.Tensor{Name: in.Name, Datatype: in.Datatype, Shape: in.Shape}
	if in.Name == "" {
		return nil, status.Error(codes.InvalidArgument, "input tensor without a name")
	}
	if tensor.ElemSize(in.Datatype) < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "tensor %q: unsupported datatype %q", in.Name, in.Datatype)
	}
	if _, ok := in.Parameters["shared_memory_region"]; ok {
		return nil, status.Errorf(codes.Unimplemented, "tensor %q: shared-memory inputs are not implemented yet", in.Name)
	}
	n, err := tensor.NumElements(in.Shape)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "tensor %q: %v", in.Name, err)
	}
	c := in.Contents
	if hasRaw {
		if c != nil && contentsCount(c) > 0 {
			return nil, status.Errorf(codes.InvalidArgument, "tensor %q: both typed contents and raw_input_contents", in.Name)
		}
		t.Data = raw
	} else {
		t.Data, err = typedToRaw(in.Name, in.Datatype, c, n)
		if err != nil {
			return nil, err
		}
	}
	if err := tensor.Validate(t); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return t, nil
}

func contentsCount(c *inference.InferTensorContents) int {
	return len(c.BoolContents) + len(c.IntContents) + len(c.Int64Contents) + len(c.UintContents) +
		len(c.Uint64Contents) + len(c.Fp32Contents) + len(c.Fp64Contents) + len(c.BytesContents)
}

func typedToRaw(name, dt string, c *inference.InferTensorContents, n int64) ([]byte, error) {
	if c == nil {
		c = &inference.InferTensorContents{}
	}
	count := func(got int, field string) error {
		if int64(got) != n || contentsCount(c) != got {
			return status.Errorf(codes.InvalidArgument, "tensor %q: %s shape wants %d elements in %s, contents hold %d (of %d typed values)", name, dt, n, field, got, contentsCount(c))
		}
		return nil
	}
	es := tensor.ElemSize(dt)
	var b []byte
	switch dt {
	case tensor.FP32:
		if err := count(len(c.Fp32Contents), "fp32_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.Fp32Contents {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	case tensor.FP64:
		if err := count(len(c.Fp64Contents), "fp64_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.Fp64Contents {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
	case tensor.Int64:
		if err := count(len(c.Int64Contents), "int64_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.Int64Contents {
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
	case tensor.Int32, tensor.Int16, tensor.Int8:
		if err := count(len(c.IntContents), "int_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.IntContents {
			b = appendInt(b, uint64(v), es)
		}
	case tensor.Uint8, "UINT16", "UINT32":
		if err := count(len(c.UintContents), "uint_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.UintContents {
			b = appendInt(b, uint64(v), es)
		}
	case "UINT64":
		if err := count(len(c.Uint64Contents), "uint64_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.Uint64Contents {
			b = binary.LittleEndian.AppendUint64(b, v)
		}
	case tensor.Bool:
		if err := count(len(c.BoolContents), "bool_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.BoolContents {
			if v {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
	case tensor.Bytes:
		if err := count(len(c.BytesContents), "bytes_contents"); err != nil {
			return nil, err
		}
		for _, v := range c.BytesContents {
			b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		}
	default:
		return nil, status.Errorf(codes.InvalidArgument, "tensor %q: datatype %s needs raw_input_contents", name, dt)
	}
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

func appendInt(b []byte, v uint64, size int) []byte {
	switch size {
	case 1:
		return append(b, byte(v))
	case 2:
		return binary.LittleEndian.AppendUint16(b, uint16(v))
	case 4:
		return binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	return binary.LittleEndian.AppendUint64(b, v)
}

// sequenceID reads the "sequence_id" request parameter (int64, uint64 or
// string).
func sequenceID(params map[string]*inference.InferParameter) (string, error) {
	p, ok := params["sequence_id"]
	if !ok || p == nil {
		return "", nil
	}
	switch v := p.ParameterChoice.(type) {
	case *inference.InferParameter_Int64Param:
		return strconv.FormatInt(v.Int64Param, 10), nil
	case *inference.InferParameter_Uint64Param:
		return strconv.FormatUint(v.Uint64Param, 10), nil
	case *inference.InferParameter_StringParam:
		return v.StringParam, nil
	}
	return "", status.Error(codes.InvalidArgument, "parameter sequence_id must be an int64 or a string")
}

func (a *kserveAPI) ModelInfer(ctx context.Context, req *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	h, err := a.s.lookup(req.GetModelName())
	if err != nil {
		return nil, err
	}
	if v := req.ModelVersion; v != "" && v != "1" {
		return nil, status.Errorf(codes.NotFound, "model %q has no version %q (only 1)", h.name, v)
	}
	if len(req.Inputs) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "model %q: request has no inputs", h.name)
	}
	hasRaw := len(req.RawInputContents) > 0
	if hasRaw && len(req.RawInputContents) != len(req.Inputs) {
		return nil, status.Errorf(codes.InvalidArgument, "%d raw_input_contents for %d inputs", len(req.RawInputContents), len(req.Inputs))
	}
	ins := make([]*hamsv1.Tensor, len(req.Inputs))
	for i, in := range req.Inputs {
		if in == nil {
			return nil, status.Errorf(codes.InvalidArgument, "input %d is empty", i)
		}
		var raw []byte
		if hasRaw {
			raw = req.RawInputContents[i]
		}
		if ins[i], err = kserveTensor(in, raw, hasRaw); err != nil {
			return nil, err
		}
	}
	seq, err := sequenceID(req.Parameters)
	if err != nil {
		return nil, err
	}
	outs, err := a.s.infer(h, "ModelInfer", ins, seq)
	if err != nil {
		return nil, err
	}
	outs, err = filterOutputs(outs, requestedNames(req.Outputs))
	if err != nil {
		return nil, err
	}
	resp := &inference.ModelInferResponse{ModelName: h.name, ModelVersion: "1", Id: req.Id}
	for _, o := range outs {
		resp.Outputs = append(resp.Outputs, &inference.ModelInferResponse_InferOutputTensor{Name: o.Name, Datatype: o.Datatype, Shape: o.Shape})
		resp.RawOutputContents = append(resp.RawOutputContents, o.Data)
	}
	return resp, nil
}

func requestedNames(outs []*inference.ModelInferRequest_InferRequestedOutputTensor) []string {
	var names []string
	for _, o := range outs {
		names = append(names, o.GetName())
	}
	return names
}

// filterOutputs keeps the named outputs in request order (all when none
// are named).
func filterOutputs(outs []*hamsv1.Tensor, names []string) ([]*hamsv1.Tensor, error) {
	if len(names) == 0 {
		return outs, nil
	}
	var kept []*hamsv1.Tensor
	for _, n := range names {
		var found *hamsv1.Tensor
		for _, o := range outs {
			if o.Name == n {
				found = o
			}
		}
		if found == nil {
			return nil, status.Errorf(codes.InvalidArgument, "requested output %q is not an output of the model", n)
		}
		kept = append(kept, found)
	}
	return kept, nil
}

const noShm = "reference model server: shared-memory regions are not implemented yet; send tensor contents in the request"

func (a *kserveAPI) SystemSharedMemoryStatus(context.Context, *inference.SystemSharedMemoryStatusRequest) (*inference.SystemSharedMemoryStatusResponse, error) {
	return nil, status.Error(codes.Unimplemented, noShm)
}
func (a *kserveAPI) SystemSharedMemoryRegister(context.Context, *inference.SystemSharedMemoryRegisterRequest) (*inference.SystemSharedMemoryRegisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, noShm)
}
func (a *kserveAPI) SystemSharedMemoryUnregister(context.Context, *inference.SystemSharedMemoryUnregisterRequest) (*inference.SystemSharedMemoryUnregisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, noShm)
}
func (a *kserveAPI) CudaSharedMemoryStatus(context.Context, *inference.CudaSharedMemoryStatusRequest) (*inference.CudaSharedMemoryStatusResponse, error) {
	return nil, status.Error(codes.Unimplemented, noShm)
}
func (a *kserveAPI) CudaSharedMemoryRegister(context.Context, *inference.CudaSharedMemoryRegisterRequest) (*inference.CudaSharedMemoryRegisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, noShm)
}
func (a *kserveAPI) CudaSharedMemoryUnregister(context.Context, *inference.CudaSharedMemoryUnregisterRequest) (*inference.CudaSharedMemoryUnregisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, noShm)
}
