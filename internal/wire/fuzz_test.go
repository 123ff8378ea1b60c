package wire

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
)

// fuzzLimit is the byte budget the fuzz targets decode under.
const fuzzLimit = 1 << 20

func seedTensors() []*hamsv1.Tensor {
	return []*hamsv1.Tensor{
		tensor.FromFloat32("f", []int64{2, 2}, []float32{1, -2, 3.5, 0}),
		tensor.FromInt64("i", []int64{3}, []int64{-1, 0, 1 << 40}),
		{Name: "b", Datatype: tensor.Bytes, Shape: []int64{2}, Data: joinBytes([][]byte{[]byte("ab"), nil})},
		{Name: "u8", Datatype: tensor.Uint8, Shape: []int64{3}, Data: []byte{0, 7, 255}},
		{Name: "q", Datatype: tensor.Bool, Shape: []int64{}, Data: []byte{1}},
		{Name: "h", Datatype: tensor.FP16, Shape: []int64{1}, Data: []byte{0, 0x3c}},
		{Name: "d", Datatype: tensor.FP64, Shape: []int64{1}, Data: make([]byte, 8)},
	}
}

// checkDecoded is what every successful decode must satisfy: a valid
// tensor within the budget.
func checkDecoded(t *testing.T, what string, got *hamsv1.Tensor, limit int) {
	t.Helper()
	if err := tensor.Validate(got); err != nil {
		t.Fatalf("%s: decoded an invalid tensor: %v", what, err)
	}
	if len(got.GetData()) > limit {
		t.Fatalf("%s: decoded %d bytes over the %d-byte limit", what, len(got.GetData()), limit)
	}
}

// cleanErr: every error wraps ErrInvalid or ErrTooLarge.
func cleanErr(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
		t.Fatalf("%s: error %v wraps neither ErrInvalid nor ErrTooLarge", what, err)
	}
}

// FuzzTensorProto decodes a TF Serving TensorProto from arbitrary bytes
// (what a client's PredictRequest holds): no panic; an error is
// ErrInvalid or ErrTooLarge; a decoded tensor is valid and within the
// budget; and it round-trips through both encodings
// (decode(encode(x)) == x, tensor_content and the typed fields).
func FuzzTensorProto(f *testing.F) {
	for _, t := range seedTensors() {
		for _, enc := range []func(*hamsv1.Tensor) (*tfpb.TensorProto, error){ToTensorProto, ToTensorProtoTyped} {
			tp, err := enc(t)
			if err != nil {
				f.Fatal(err)
			}
			b, _ := proto.Marshal(tp)
			f.Add(b)
		}
	}
	// A broadcast of one value to a large shape, and a shape that
	// overflows.
	b, _ := proto.Marshal(&tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: TFShape([]int64{1 << 30}), FloatVal: []float32{1}})
	f.Add(b)
	b, _ = proto.Marshal(&tfpb.TensorProto{Dtype: tfpb.DataType_DT_STRING, TensorShape: TFShape([]int64{1 << 40}), StringVal: [][]byte{[]byte("x")}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		tp := &tfpb.TensorProto{}
		if err := proto.Unmarshal(b, tp); err != nil {
			return
		}
		got, err := FromTensorProtoLimit("x", tp, fuzzLimit)
		if err != nil {
			cleanErr(t, "FromTensorProtoLimit", err)
			return
		}
		checkDecoded(t, "FromTensorProtoLimit", got, fuzzLimit)
		for name, enc := range map[string]func(*hamsv1.Tensor) (*tfpb.TensorProto, error){"content": ToTensorProto, "typed": ToTensorProtoTyped} {
			tp2, err := enc(got)
			if err != nil {
				if got.GetDatatype() == tensor.Bytes || tensor.ElemSize(got.GetDatatype()) > 0 {
					t.Fatalf("%s: re-encode of a decoded %s tensor: %v", name, got.GetDatatype(), err)
				}
				continue
			}
			// Through the wire: what a client sends is bytes.
			wb, err := proto.Marshal(tp2)
			if err != nil {
				t.Fatal(err)
			}
			tp3 := &tfpb.TensorProto{}
			if err := proto.Unmarshal(wb, tp3); err != nil {
				t.Fatalf("%s: the encoding does not decode: %v", name, err)
			}
			back, err := FromTensorProtoLimit("x", tp3, fuzzLimit)
			if err != nil {
				t.Fatalf("%s: decode(encode(x)): %v", name, err)
			}
			if back.GetDatatype() != got.GetDatatype() || !bytes.Equal(back.GetData(), got.GetData()) || !sameShape(back.GetShape(), got.GetShape()) {
				t.Fatalf("%s: decode(encode(x)) = %v, want %v", name, back, got)
			}
		}
	})
}

func sameShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzKServeInfer decodes the inputs of a KServe v2 ModelInferRequest from
// arbitrary bytes as the frontend does (RawInputs, then each input within
// what the earlier ones left of the budget): no panic, clean errors,
// valid tensors within the budget in all, and decode(encode(x)) == x
// through raw contents and through typed contents.
func FuzzKServeInfer(f *testing.F) {
	for _, t := range seedTensors() {
		b, _ := proto.Marshal(&inference.ModelInferRequest{ModelName: "m", Inputs: []*inference.ModelInferRequest_InferInputTensor{InferInput(t)}, RawInputContents: [][]byte{t.Data}})
		f.Add(b)
		if c, err := Contents(t); err == nil {
			in := InferInput(t)
			in.Contents = c
			b, _ := proto.Marshal(&inference.ModelInferRequest{ModelName: "m", Inputs: []*inference.ModelInferRequest_InferInputTensor{in}})
			f.Add(b)
		}
	}
	b, _ := proto.Marshal(&inference.ModelInferRequest{Inputs: []*inference.ModelInferRequest_InferInputTensor{
		{Name: "z", Datatype: "INT64", Shape: []int64{4}, Contents: &inference.InferTensorContents{Int64Contents: []int64{0, 0, 0, 0}}},
		{Name: "s", Datatype: "FP32", Shape: []int64{1}, Parameters: ShmParams("r", 0, 4)}}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &inference.ModelInferRequest{}
		if err := proto.Unmarshal(b, req); err != nil {
			return
		}
		raws, takes, err := RawInputs(req.GetInputs(), req.GetRawInputContents())
		if err != nil {
			cleanErr(t, "RawInputs", err)
			return
		}
		left := int64(fuzzLimit)
		for i, in := range req.GetInputs() {
			got, err := FromInferInputLimit(in, raws[i], takes[i], left)
			if err != nil {
				cleanErr(t, "FromInferInputLimit", err)
				return
			}
			checkDecoded(t, "FromInferInputLimit", got, int(left))
			left -= int64(len(got.GetData()))
			// Raw: decode(encode(x)).
			back, err := FromInferInput(InferInput(got), got.GetData(), true)
			if err != nil || !bytes.Equal(back.GetData(), got.GetData()) || back.GetDatatype() != got.GetDatatype() {
				t.Fatalf("raw decode(encode(x)): %v %v, want %v", back, err, got)
			}
			// Typed contents, where the datatype has a field.
			c, err := Contents(got)
			if err != nil {
				if got.GetDatatype() != tensor.FP16 && got.GetDatatype() != BF16 {
					t.Fatalf("typed encode of a decoded %s tensor: %v", got.GetDatatype(), err)
				}
				continue
			}
			ti := InferInput(got)
			ti.Contents = c
			back, err = FromInferInputLimit(ti, nil, false, fuzzLimit)
			if err != nil || !bytes.Equal(back.GetData(), got.GetData()) {
				t.Fatalf("typed decode(encode(x)): %v %v, want %v", back, err, got)
			}
		}
	})
}

// TestKServeTypedContentsWithinBudget: INT64 contents decode to 8 bytes
// per one-byte varint; the budget is checked on the decoded size before
// the data is allocated.
func TestKServeTypedContentsWithinBudget(t *testing.T) {
	in := &inference.ModelInferRequest_InferInputTensor{Name: "z", Datatype: "INT64", Shape: []int64{1000},
		Contents: &inference.InferTensorContents{Int64Contents: make([]int64, 1000)}}
	if _, err := FromInferInputLimit(in, nil, false, 7999); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("8000 bytes under a 7999-byte budget: %v", err)
	}
	if got, err := FromInferInputLimit(in, nil, false, 8000); err != nil || len(got.GetData()) != 8000 {
		t.Fatalf("8000 bytes under an 8000-byte budget: %v", err)
	}
}
