package wire

import (
	"fmt"
	"strconv"

	"github.com/hams-go/hams/protos/inference"
)

// KServe v2 / Triton parameter names and the project's conventions on top.
const (
	// Per-tensor parameters of system (and CUDA) shared memory: the tensor's
	// data is in the registered region, at offset, byte_size bytes; its
	// contents are unset and it takes no raw_input_contents entry
	// (RawInputs). Triton answers such an output with no parameters and an
	// empty raw_output_contents entry.
	ParamShmRegion   = "shared_memory_region"
	ParamShmByteSize = "shared_memory_byte_size"
	ParamShmOffset   = "shared_memory_offset"
	// ParamClassification is the per-output parameter of Triton's
	// classification extension (top-k labels as BYTES instead of the
	// tensor).
	ParamClassification = "classification"
	// Request parameters of Triton's sequence batcher.
	ParamSequenceID    = "sequence_id"
	ParamSequenceStart = "sequence_start"
	ParamSequenceEnd   = "sequence_end"
	// StreamIDsInput is the project's optional BYTES input [N] carrying
	// one stream id per row, so one request can hold rows of several
	// streams (a sidecar batch); "sequence_id" names one stream for the
	// whole request. A model that keys state by stream declares it.
	StreamIDsInput = "hams_stream_ids"
	// StateInSuffix / StateOutSuffix name the tensors of a model serving
	// its state explicitly: state tensor s is input s+"_in" (the state the
	// batch starts from) and output s+"_out" (the state after the batch).
	StateInSuffix  = "_in"
	StateOutSuffix = "_out"
)

// Int64Param reads an integer parameter (int64 or uint64); ok is false
// when it is absent.
func Int64Param(params map[string]*inference.InferParameter, key string) (v int64, ok bool, err error) {
	p, has := params[key]
	if !has || p == nil {
		return 0, false, nil
	}
	switch x := p.ParameterChoice.(type) {
	case *inference.InferParameter_Int64Param:
		return x.Int64Param, true, nil
	case *inference.InferParameter_Uint64Param:
		if x.Uint64Param > 1<<62 {
			return 0, true, fmt.Errorf("%w: parameter %s=%d is too large", ErrInvalid, key, x.Uint64Param)
		}
		return int64(x.Uint64Param), true, nil
	}
	return 0, true, fmt.Errorf("%w: parameter %s must be an int64", ErrInvalid, key)
}

// StringParam reads a string parameter; ok is false when it is absent.
func StringParam(params map[string]*inference.InferParameter, key string) (v string, ok bool, err error) {
	p, has := params[key]
	if !has || p == nil {
		return "", false, nil
	}
	if x, isStr := p.ParameterChoice.(*inference.InferParameter_StringParam); isStr {
		return x.StringParam, true, nil
	}
	return "", true, fmt.Errorf("%w: parameter %s must be a string", ErrInvalid, key)
}

// SequenceID reads "sequence_id" (int64, uint64 or string) as a string;
// "" when absent.
func SequenceID(params map[string]*inference.InferParameter) (string, error) {
	p, ok := params[ParamSequenceID]
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
	return "", fmt.Errorf("%w: parameter sequence_id must be an int64 or a string", ErrInvalid)
}

// StrParam, I64Param build parameters.
func StrParam(s string) *inference.InferParameter {
	return &inference.InferParameter{ParameterChoice: &inference.InferParameter_StringParam{StringParam: s}}
}

// I64Param builds an int64 parameter.
func I64Param(v int64) *inference.InferParameter {
	return &inference.InferParameter{ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: v}}
}

// ShmParams are the parameters placing a tensor in a registered region.
func ShmParams(region string, offset, byteSize int64) map[string]*inference.InferParameter {
	return map[string]*inference.InferParameter{
		ParamShmRegion: StrParam(region), ParamShmOffset: I64Param(offset), ParamShmByteSize: I64Param(byteSize),
	}
}

// BytesElems splits valid BYTES data into its elements.
func BytesElems(data []byte) [][]byte { return splitBytes(data) }

// JoinBytes encodes elements as BYTES data.
func JoinBytes(elems [][]byte) []byte { return joinBytes(elems) }
