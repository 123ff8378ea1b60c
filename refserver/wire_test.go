package refserver

import (
	"encoding/binary"
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/wire"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// The field numbers below are the upstream ones (TF Serving predict.proto,
// model.proto, TF tensor.proto / tensor_shape.proto, KServe v2
// grpc_predict_v2.proto), written out by hand so a renumbering in our
// .proto files fails here.

func msg(b []byte, num protowire.Number, inner []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, inner)
}

func str(b []byte, num protowire.Number, s string) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func varint(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func packedFloats(b []byte, num protowire.Number, vs []float32) []byte {
	var p []byte
	for _, v := range vs {
		p = protowire.AppendFixed32(p, math.Float32bits(v))
	}
	return msg(b, num, p)
}

func packedVarints(b []byte, num protowire.Number, vs []int64) []byte {
	var p []byte
	for _, v := range vs {
		p = protowire.AppendVarint(p, uint64(v))
	}
	return msg(b, num, p)
}

func TestWirePredictRequest(t *testing.T) {
	// ModelSpec{name 1, version 2 (Int64Value{value 1}), signature_name 3}
	var spec []byte
	spec = str(spec, 1, "fashion")
	spec = msg(spec, 2, varint(nil, 1, 3))
	spec = str(spec, 3, "serving_default")
	// TensorShapeProto{dim 2: Dim{size 1}}
	var shape []byte
	shape = msg(shape, 2, varint(nil, 1, 2))
	shape = msg(shape, 2, varint(nil, 1, 2))
	// TensorProto{dtype 1 = DT_FLOAT(1), tensor_shape 2, float_val 5 packed, tensor_content 4}
	var tpb []byte
	tpb = varint(tpb, 1, 1)
	tpb = msg(tpb, 2, shape)
	tpb = packedFloats(tpb, 5, []float32{1, 2, 3, 4})
	var tpb2 []byte
	tpb2 = varint(tpb2, 1, 9) // DT_INT64
	tpb2 = msg(tpb2, 2, msg(nil, 2, varint(nil, 1, 3)))
	tpb2 = packedVarints(tpb2, 10, []int64{7, -1, 9})
	tpb2 = msg(tpb2, 4, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	// PredictRequest{model_spec 1, inputs 2 (map entry {key 1, value 2}), output_filter 3}
	var req []byte
	req = msg(req, 1, spec)
	req = msg(req, 2, msg(str(nil, 1, "images"), 2, tpb))
	req = msg(req, 2, msg(str(nil, 1, "labels"), 2, tpb2))
	req = str(req, 3, "scores")
	var got tfapis.PredictRequest
	if err := proto.Unmarshal(req, &got); err != nil {
		t.Fatal(err)
	}
	if got.ModelSpec.GetName() != "fashion" || got.ModelSpec.GetVersion().GetValue() != 3 || got.ModelSpec.GetSignatureName() != "serving_default" {
		t.Fatalf("model spec %v", got.ModelSpec)
	}
	im := got.Inputs["images"]
	if im.GetDtype() != tfpb.DataType_DT_FLOAT || len(im.GetTensorShape().GetDim()) != 2 || im.TensorShape.Dim[1].Size != 2 || len(im.FloatVal) != 4 || im.FloatVal[3] != 4 {
		t.Fatalf("images %v", im)
	}
	lb := got.Inputs["labels"]
	if lb.GetDtype() != tfpb.DataType_DT_INT64 || len(lb.Int64Val) != 3 || lb.Int64Val[1] != -1 || len(lb.TensorContent) != 8 {
		t.Fatalf("labels %v", lb)
	}
	if len(got.OutputFilter) != 1 || got.OutputFilter[0] != "scores" || len(got.ProtoReflect().GetUnknown()) != 0 {
		t.Fatalf("output filter %v / unknown fields", got.OutputFilter)
	}
	// and it converts through the server's decoder
	if tt, err := wire.FromTensorProto("images", im); err != nil || len(tt.Data) != 16 {
		t.Fatal(tt, err)
	}
}

// fields parses one message level into number -> raw values.
func fields(t *testing.T, b []byte) map[protowire.Number][][]byte {
	t.Helper()
	out := map[protowire.Number][][]byte{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("bad tag: %v", protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		switch typ {
		case protowire.BytesType:
			var m int
			v, m = protowire.ConsumeBytes(b)
			n = m
		case protowire.VarintType:
			x, m := protowire.ConsumeVarint(b)
			v, n = binary.AppendUvarint(nil, x), m
		case protowire.Fixed32Type:
			_, n = protowire.ConsumeFixed32(b)
			v = b[:4]
		case protowire.Fixed64Type:
			_, n = protowire.ConsumeFixed64(b)
			v = b[:8]
		default:
			t.Fatalf("unexpected wire type %v", typ)
		}
		if n < 0 {
			t.Fatalf("bad field %d: %v", num, protowire.ParseError(n))
		}
		out[num] = append(out[num], v)
		b = b[n:]
	}
	return out
}

func TestWirePredictResponse(t *testing.T) {
	resp := &tfapis.PredictResponse{
		ModelSpec: &tfapis.ModelSpec{Name: "fashion", VersionChoice: &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(1)}},
		Outputs:   map[string]*tfpb.TensorProto{"scores": {Dtype: tfpb.DataType_DT_FLOAT, TensorShape: wire.TFShape([]int64{1, 2}), TensorContent: []byte{0, 0, 128, 63, 0, 0, 0, 64}}},
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	top := fields(t, b)
	if len(top[1]) != 1 || len(top[2]) != 1 {
		t.Fatalf("PredictResponse: outputs must be field 1, model_spec field 2: %v", top)
	}
	entry := fields(t, top[1][0])
	if string(entry[1][0]) != "scores" {
		t.Fatalf("map key %q", entry[1][0])
	}
	tpf := fields(t, entry[2][0])
	if x, _ := binary.Uvarint(tpf[1][0]); x != 1 {
		t.Fatalf("dtype %d", x)
	}
	if len(tpf[4]) != 1 || len(tpf[4][0]) != 8 {
		t.Fatal("tensor_content must be field 4")
	}
	dims := fields(t, tpf[2][0])[2]
	if len(dims) != 2 {
		t.Fatal("TensorShapeProto.dim must be field 2")
	}
	if string(fields(t, top[2][0])[1][0]) != "fashion" {
		t.Fatal("ModelSpec.name must be field 1")
	}
}

func TestWireModelInfer(t *testing.T) {
	// InferInputTensor{name 1, datatype 2, shape 3 packed, contents 5 {fp32_contents 6 packed}}
	var in []byte
	in = str(in, 1, "images")
	in = str(in, 2, "FP32")
	in = packedVarints(in, 3, []int64{1, 2})
	in = msg(in, 5, packedFloats(nil, 6, []float32{0.5, 0.25}))
	var in2 []byte
	in2 = str(in2, 1, "labels")
	in2 = str(in2, 2, "INT64")
	in2 = packedVarints(in2, 3, []int64{1})
	in2 = msg(in2, 5, packedVarints(nil, 3, []int64{4}))
	// parameters 4: map entry {key 1, value 2: InferParameter{int64_param 2}}
	var req []byte
	req = str(req, 1, "seq")
	req = str(req, 2, "1")
	req = str(req, 3, "req-9")
	req = msg(req, 4, msg(str(nil, 1, "sequence_id"), 2, varint(nil, 2, 42)))
	req = msg(req, 5, in)
	req = msg(req, 5, in2)
	req = msg(req, 6, str(nil, 1, "y"))
	req = msg(req, 7, []byte{1, 2, 3, 4})
	var got inference.ModelInferRequest
	if err := proto.Unmarshal(req, &got); err != nil {
		t.Fatal(err)
	}
	if got.ModelName != "seq" || got.ModelVersion != "1" || got.Id != "req-9" || len(got.ProtoReflect().GetUnknown()) != 0 {
		t.Fatalf("header %v", &got)
	}
	if id, err := sequenceID(got.Parameters); err != nil || id != "42" {
		t.Fatalf("sequence_id %q %v", id, err)
	}
	if len(got.Inputs) != 2 || got.Inputs[0].Name != "images" || got.Inputs[0].Datatype != "FP32" || got.Inputs[0].Shape[1] != 2 ||
		got.Inputs[0].Contents.GetFp32Contents()[1] != 0.25 || got.Inputs[1].Contents.GetInt64Contents()[0] != 4 {
		t.Fatalf("inputs %v", got.Inputs)
	}
	if len(got.Outputs) != 1 || got.Outputs[0].Name != "y" || len(got.RawInputContents) != 1 || len(got.RawInputContents[0]) != 4 {
		t.Fatalf("outputs / raw %v", &got)
	}
	// reverse: our response encodes with the upstream numbers
	resp := &inference.ModelInferResponse{ModelName: "seq", ModelVersion: "1", Id: "req-9",
		Outputs:           []*inference.ModelInferResponse_InferOutputTensor{{Name: "y", Datatype: "FP32", Shape: []int64{1, 2}}},
		RawOutputContents: [][]byte{{1, 2, 3, 4, 5, 6, 7, 8}}}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	top := fields(t, b)
	if string(top[1][0]) != "seq" || string(top[2][0]) != "1" || string(top[3][0]) != "req-9" || len(top[5]) != 1 || len(top[6]) != 1 || len(top[6][0]) != 8 {
		t.Fatalf("ModelInferResponse fields %v", top)
	}
	out := fields(t, top[5][0])
	if string(out[1][0]) != "y" || string(out[2][0]) != "FP32" || len(out[3]) != 1 {
		t.Fatalf("InferOutputTensor fields %v", out)
	}
	// shape is packed int64 (field 3)
	p := out[3][0]
	var dims []uint64
	for len(p) > 0 {
		v, n := protowire.ConsumeVarint(p)
		dims = append(dims, v)
		p = p[n:]
	}
	if len(dims) != 2 || dims[1] != 2 {
		t.Fatalf("shape %v", dims)
	}
}

// A TF Serving answer built byte by byte from the upstream field numbers
// decodes in our types, as the TF Serving adapter reads what TF Serving
// sends: PredictResponse (outputs in typed fields, in tensor_content and
// DT_STRING in string_val), GetModelMetadataResponse (an Any holding
// tensorflow.serving.SignatureDefMap{signature_def 1: SignatureDef{inputs 1,
// outputs 2, method_name 3}}, TensorInfo{name 1, dtype 2, tensor_shape 3})
// and GetModelStatusResponse (ModelVersionStatus{version 1, state 2,
// status 3: StatusProto{error_code 1, error_message 2}}).
func TestWireTFServingAnswersDecode(t *testing.T) {
	dims := func(ds ...uint64) []byte {
		var b []byte
		for _, d := range ds {
			b = msg(b, 2, varint(nil, 1, d))
		}
		return b
	}
	spec := msg(str(nil, 1, "fashion"), 2, varint(nil, 1, 7))
	spec = str(spec, 3, "serving_default")
	var scores []byte // DT_FLOAT [1,2] float_val 5
	scores = varint(scores, 1, 1)
	scores = msg(scores, 2, dims(1, 2))
	scores = packedFloats(scores, 5, []float32{0.25, 0.75})
	var ids []byte // DT_INT64 [1] tensor_content 4
	ids = varint(ids, 1, 9)
	ids = msg(ids, 2, dims(1))
	ids = msg(ids, 4, []byte{42, 0, 0, 0, 0, 0, 0, 0})
	var label []byte // DT_STRING [1] string_val 8
	label = varint(label, 1, 7)
	label = msg(label, 2, dims(1))
	label = str(label, 8, "sneaker")
	var resp []byte // PredictResponse{outputs 1 (map), model_spec 2}
	resp = msg(resp, 1, msg(str(nil, 1, "scores"), 2, scores))
	resp = msg(resp, 1, msg(str(nil, 1, "ids"), 2, ids))
	resp = msg(resp, 1, msg(str(nil, 1, "label"), 2, label))
	resp = msg(resp, 2, spec)
	var pr tfapis.PredictResponse
	if err := proto.Unmarshal(resp, &pr); err != nil {
		t.Fatal(err)
	}
	noUnknown(t, "PredictResponse", pr.ProtoReflect())
	if pr.GetModelSpec().GetVersion().GetValue() != 7 || pr.GetModelSpec().GetSignatureName() != "serving_default" {
		t.Fatalf("model_spec %v", pr.GetModelSpec())
	}
	s, err := wire.FromTensorProto("scores", pr.Outputs["scores"])
	if err != nil || math.Float32frombits(binary.LittleEndian.Uint32(s.Data[4:])) != 0.75 || len(s.Shape) != 2 {
		t.Fatalf("scores %v %v", s, err)
	}
	i, err := wire.FromTensorProto("ids", pr.Outputs["ids"])
	if err != nil || i.Datatype != "INT64" || binary.LittleEndian.Uint64(i.Data) != 42 {
		t.Fatalf("ids %v %v", i, err)
	}
	l, err := wire.FromTensorProto("label", pr.Outputs["label"])
	if err != nil || l.Datatype != "BYTES" || string(wire.BytesElems(l.Data)[0]) != "sneaker" {
		t.Fatalf("label %v %v", l, err)
	}

	var info []byte // TensorInfo{name 1, dtype 2, tensor_shape 3}
	info = str(info, 1, "images:0")
	info = varint(info, 2, 1)
	info = msg(info, 3, msg(dims(), 2, varint(nil, 1, uint64(1<<64-1)))) // dim size -1
	var def []byte                                                       // SignatureDef{inputs 1, outputs 2, method_name 3}
	def = msg(def, 1, msg(str(nil, 1, "images"), 2, info))
	def = msg(def, 2, msg(str(nil, 1, "scores"), 2, str(nil, 1, "scores:0")))
	def = str(def, 3, "tensorflow/serving/predict")
	sigMap := msg(nil, 1, msg(str(nil, 1, "serving_default"), 2, def))
	anyv := str(nil, 1, "type.googleapis.com/tensorflow.serving.SignatureDefMap")
	anyv = msg(anyv, 2, sigMap)
	var mdr []byte // GetModelMetadataResponse{model_spec 1, metadata 2 (map<string, Any>)}
	mdr = msg(mdr, 1, spec)
	mdr = msg(mdr, 2, msg(str(nil, 1, "signature_def"), 2, anyv))
	var md tfapis.GetModelMetadataResponse
	if err := proto.Unmarshal(mdr, &md); err != nil {
		t.Fatal(err)
	}
	noUnknown(t, "GetModelMetadataResponse", md.ProtoReflect())
	var sigs tfapis.SignatureDefMap
	if err := md.GetMetadata()["signature_def"].UnmarshalTo(&sigs); err != nil {
		t.Fatalf("Any of tensorflow.serving.SignatureDefMap: %v", err)
	}
	noUnknown(t, "SignatureDefMap", sigs.ProtoReflect())
	sd := sigs.GetSignatureDef()["serving_default"]
	in := sd.GetInputs()["images"]
	if sd.GetMethodName() != "tensorflow/serving/predict" || in.GetName() != "images:0" || in.GetDtype() != tfpb.DataType_DT_FLOAT ||
		in.GetTensorShape().GetDim()[0].GetSize() != -1 || sd.GetOutputs()["scores"].GetName() != "scores:0" {
		t.Fatalf("signature %v", sd)
	}

	st := varint(nil, 1, 7)                                           // version 1
	st = varint(st, 2, 20)                                            // state 2: LOADING
	st = msg(st, 3, msg(varint(nil, 1, 14), 2, []byte("warming up"))) // status 3: {error_code 1 UNAVAILABLE, error_message 2}
	var sr tfapis.GetModelStatusResponse
	if err := proto.Unmarshal(msg(nil, 1, st), &sr); err != nil {
		t.Fatal(err)
	}
	noUnknown(t, "GetModelStatusResponse", sr.ProtoReflect())
	mvs := sr.GetModelVersionStatus()
	if len(mvs) != 1 || mvs[0].GetVersion() != 7 || mvs[0].GetState() != tfapis.ModelVersionStatus_LOADING ||
		mvs[0].GetStatus().GetErrorCode() != 14 || mvs[0].GetStatus().GetErrorMessage() != "warming up" {
		t.Fatalf("status %v", &sr)
	}
}
