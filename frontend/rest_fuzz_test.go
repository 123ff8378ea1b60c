package frontend

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// fuzzRESTRoom is the decoded-bytes budget of the REST fuzz target.
const fuzzRESTRoom = 1 << 16

// fuzzTFInfos are the signatures the fuzz target decodes TF Serving
// bodies against: one input, and three of different dtypes.
var fuzzTFInfos = []map[string]*tfapis.TensorInfo{
	{"x": {Dtype: tfpb.DataType_DT_FLOAT}},
	{"i": {Dtype: tfpb.DataType_DT_INT64}, "s": {Dtype: tfpb.DataType_DT_STRING}, "b": {Dtype: tfpb.DataType_DT_BOOL}},
}

// FuzzRESTJSON decodes a body as both REST dialects do (TF Serving's
// predict body against two signatures; KServe's infer body, all JSON and
// split at jsonLen for the binary extension): no panic; every error is a
// gRPC status (InvalidArgument, Unimplemented or ResourceExhausted) or
// the budget's ErrTooLarge; what decodes stays within the budget, and the
// TensorProtos and KServe inputs decode to valid tensors of the shape
// they declare.
func FuzzRESTJSON(f *testing.F) {
	for _, s := range []string{
		`{"instances": [1.0, 2.0, 5.0]}`,
		`{"signature_name": "serving_default", "instances": [[1.0, 2.0], [3.0, 4.0]]}`,
		`{"inputs": {"i": [[1], [2]], "s": [{"b64": "aGk="}, "x"], "b": [true, false]}}`,
		`{"instances": [{"i": 1, "s": {"b64": "YQ=="}, "b": true}, {"i": 2, "s": "b", "b": false}]}`,
		`{"instances": [[1, 2], [3]]}`,
		`{"inputs": "NaN"}`,
		`{"id": "42", "inputs": [{"name": "input0", "shape": [2, 2], "datatype": "UINT32", "data": [1, 2, 3, 4]}, {"name": "input1", "shape": [3], "datatype": "BOOL", "data": [true, false, true]}], "outputs": [{"name": "output0", "parameters": {"binary_data": true}}]}`,
		`{"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "data": [["a"], ["bc"]]}], "parameters": {"binary_data_output": true, "sequence_id": 7}}`,
		`{"inputs": [{"name": "input0", "shape": [2, 2], "datatype": "UINT32", "parameters": {"binary_data_size": 16}}]}` + "\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\x04\x00\x00\x00",
		`{"inputs": [{"name": "f", "shape": [1099511627776], "datatype": "FP32", "data": [1]}]}`,
	} {
		f.Add([]byte(s), int64(-1))
	}
	f.Add([]byte(`{"inputs":[{"name":"a","shape":[1],"datatype":"INT8","parameters":{"binary_data_size":1}}]}`+"\x05"), int64(86))
	f.Fuzz(func(t *testing.T, body []byte, jsonLen int64) {
		checkErr := func(what string, err error) {
			if errors.Is(err, wire.ErrTooLarge) {
				return
			}
			st, ok := status.FromError(err)
			if !ok {
				t.Fatalf("%s: %v is not a status", what, err)
			}
			switch st.Code() {
			case codes.InvalidArgument, codes.Unimplemented, codes.ResourceExhausted:
			default:
				t.Fatalf("%s: code %v: %v", what, st.Code(), err)
			}
		}
		var pb tfPredictBody
		if _, err := parseTFBody(body, &pb); err != nil {
			checkErr("parse TF body", err)
		} else {
			for _, infos := range fuzzTFInfos {
				ins, _, err := decodeTFInputs(&pb, infos, fuzzRESTRoom)
				if err != nil {
					checkErr("TF inputs", err)
					continue
				}
				total := 0
				for name, tp := range ins {
					if infos[name] == nil {
						t.Fatalf("decoded input %q outside the signature", name)
					}
					x, err := wire.FromTensorProto(name, tp)
					if err != nil {
						continue // a value the gRPC method refuses in turn (out of range, count)
					}
					total += len(x.GetData())
				}
				if total > 2*fuzzRESTRoom {
					t.Fatalf("TF inputs decode to %d bytes, budget %d", total, fuzzRESTRoom)
				}
			}
		}
		for _, split := range []int64{-1, jsonLen} {
			if split < -1 {
				continue
			}
			d, err := decodeKServeInfer(body, split, fuzzRESTRoom)
			if err != nil {
				checkErr("KServe infer", err)
				continue
			}
			total := 0
			raws, takes, err := wire.RawInputs(d.req.GetInputs(), d.req.GetRawInputContents())
			if err != nil {
				t.Fatalf("raw contents do not pair with the inputs: %v", err)
			}
			for i, in := range d.req.GetInputs() {
				total += len(raws[i])
				if _, shm := in.GetParameters()[wire.ParamShmRegion]; shm {
					continue
				}
				x, err := wire.FromInferInput(in, raws[i], takes[i])
				if err == nil {
					if err := tensor.Validate(x); err != nil {
						t.Fatalf("input %q: %v", in.GetName(), err)
					}
				} else if split < 0 {
					// All-JSON data is decoded to the declared element
					// count and datatype: it must form a valid tensor.
					t.Fatalf("JSON input %q does not form its tensor: %v", in.GetName(), err)
				}
			}
			if total > fuzzRESTRoom {
				t.Fatalf("KServe inputs take %d bytes, budget %d", total, fuzzRESTRoom)
			}
		}
	})
}
