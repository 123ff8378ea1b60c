package refserver

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// More wire-compatibility tests in both directions: messages built byte
// by byte from the upstream field numbers (../shared/WIRE-FACTS.md: TF
// Serving predict.proto / model.proto, TF tensor.proto / types.proto,
// KServe v2 grpc_predict_v2.proto) and decoded into our generated types,
// and our generated types marshalled and parsed field by field against
// those numbers. Every number is written out by hand; a renumbering in
// our .proto files makes a byte-built field unknown (forward) or puts a
// value under another number (reverse), and fails here.

// fv is one occurrence of a field: its wire type and its value (the
// payload of a length-delimited field, the bytes of a fixed one, the
// integer of a varint).
type fv struct {
	typ protowire.Type
	b   []byte
	x   uint64
}

// wireFields parses one message level into number -> occurrences.
func wireFields(t *testing.T, b []byte) map[protowire.Number][]fv {
	t.Helper()
	out := map[protowire.Number][]fv{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("bad tag: %v", protowire.ParseError(n))
		}
		b = b[n:]
		f := fv{typ: typ}
		switch typ {
		case protowire.BytesType:
			f.b, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			f.x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b)
			f.x = uint64(v)
		case protowire.Fixed64Type:
			f.x, n = protowire.ConsumeFixed64(b)
		default:
			t.Fatalf("field %d: unexpected wire type %v", num, typ)
		}
		if n < 0 {
			t.Fatalf("bad field %d: %v", num, protowire.ParseError(n))
		}
		out[num] = append(out[num], f)
		b = b[n:]
	}
	return out
}

// only checks that m holds exactly the field numbers nums.
func only(t *testing.T, what string, m map[protowire.Number][]fv, nums ...protowire.Number) {
	t.Helper()
	want := map[protowire.Number]bool{}
	for _, n := range nums {
		want[n] = true
		if len(m[n]) == 0 {
			t.Fatalf("%s: no field %d (fields %v)", what, n, numsOf(m))
		}
	}
	for n := range m {
		if !want[n] {
			t.Fatalf("%s: unexpected field %d (want only %v)", what, n, nums)
		}
	}
}

func numsOf(m map[protowire.Number][]fv) []protowire.Number {
	var out []protowire.Number
	for n := range m {
		out = append(out, n)
	}
	return out
}

// one returns the single occurrence of field num, which must have wire type typ.
func one(t *testing.T, what string, m map[protowire.Number][]fv, num protowire.Number, typ protowire.Type) fv {
	t.Helper()
	if len(m[num]) != 1 || m[num][0].typ != typ {
		t.Fatalf("%s: field %d: want one of wire type %v, got %v", what, num, typ, m[num])
	}
	return m[num][0]
}

func oneStr(t *testing.T, what string, m map[protowire.Number][]fv, num protowire.Number) string {
	t.Helper()
	return string(one(t, what, m, num, protowire.BytesType).b)
}

// unpack decodes a packed repeated field's payload of element wire type typ.
func unpack(t *testing.T, what string, p []byte, typ protowire.Type) []uint64 {
	t.Helper()
	var out []uint64
	for len(p) > 0 {
		var v uint64
		var n int
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(p)
		case protowire.Fixed32Type:
			var w uint32
			w, n = protowire.ConsumeFixed32(p)
			v = uint64(w)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(p)
		}
		if n < 0 {
			t.Fatalf("%s: bad packed payload: %v", what, protowire.ParseError(n))
		}
		out = append(out, v)
		p = p[n:]
	}
	return out
}

// mapEntries parses the occurrences of a map field (entry {key 1, value 2})
// into key -> value message bytes.
func mapEntries(t *testing.T, what string, occ []fv) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, e := range occ {
		if e.typ != protowire.BytesType {
			t.Fatalf("%s: map entry of wire type %v", what, e.typ)
		}
		f := wireFields(t, e.b)
		only(t, what+" map entry", f, 1, 2)
		out[oneStr(t, what+" key", f, 1)] = one(t, what+" value", f, 2, protowire.BytesType).b
	}
	return out
}

// noUnknown checks that no message in m's tree kept unknown fields (a
// byte-built field whose number our .proto does not have).
func noUnknown(t *testing.T, what string, m protoreflect.Message) {
	t.Helper()
	if len(m.GetUnknown()) > 0 {
		t.Fatalf("%s: %s has unknown fields %v", what, m.Descriptor().FullName(), m.GetUnknown())
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					noUnknown(t, what, mv.Message())
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				for i := 0; i < v.List().Len(); i++ {
					noUnknown(t, what, v.List().Get(i).Message())
				}
			}
		case fd.Message() != nil:
			noUnknown(t, what, v.Message())
		}
		return true
	})
}

// shapeDims reads a TensorShapeProto (dim 2: Dim{size 1}).
func shapeDims(t *testing.T, what string, b []byte) []int64 {
	t.Helper()
	f := wireFields(t, b)
	only(t, what+" TensorShapeProto", f, 2)
	var dims []int64
	for _, d := range f[2] {
		df := wireFields(t, d.b)
		only(t, what+" Dim", df, 1)
		dims = append(dims, int64(one(t, what+" Dim.size", df, 1, protowire.VarintType).x))
	}
	return dims
}

func equalDims(a, b []int64) bool {
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

// ---- TF Serving ----

func TestWirePredictRequestReverse(t *testing.T) {
	req := &tfapis.PredictRequest{
		ModelSpec: &tfapis.ModelSpec{Name: "fashion", SignatureName: "serving_default",
			VersionChoice: &tfapis.ModelSpec_Version{Version: wrapperspb.Int64(3)}},
		Inputs: map[string]*tfpb.TensorProto{
			"images": {Dtype: tfpb.DataType_DT_FLOAT, TensorShape: wire.TFShape([]int64{2, 2}), FloatVal: []float32{1, 2, 3, -4}},
			"labels": {Dtype: tfpb.DataType_DT_INT64, TensorShape: wire.TFShape([]int64{1}), TensorContent: []byte{7, 0, 0, 0, 0, 0, 0, 0}},
		},
		OutputFilter: []string{"scores", "probs"},
	}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	top := wireFields(t, b)
	only(t, "PredictRequest", top, 1, 2, 3) // model_spec 1, inputs 2, output_filter 3
	spec := wireFields(t, one(t, "model_spec", top, 1, protowire.BytesType).b)
	only(t, "ModelSpec", spec, 1, 2, 3) // name 1, version 2, signature_name 3
	if oneStr(t, "ModelSpec.name", spec, 1) != "fashion" || oneStr(t, "ModelSpec.signature_name", spec, 3) != "serving_default" {
		t.Fatalf("ModelSpec fields %v", spec)
	}
	ver := wireFields(t, one(t, "ModelSpec.version", spec, 2, protowire.BytesType).b)
	only(t, "Int64Value", ver, 1) // google.protobuf.Int64Value{value 1}
	if v := one(t, "Int64Value.value", ver, 1, protowire.VarintType).x; v != 3 {
		t.Fatalf("version %d", v)
	}
	if len(top[3]) != 2 || string(top[3][0].b) != "scores" || string(top[3][1].b) != "probs" {
		t.Fatalf("output_filter %v", top[3])
	}
	inputs := mapEntries(t, "inputs", top[2])
	if len(inputs) != 2 {
		t.Fatalf("inputs %v", inputs)
	}
	im := wireFields(t, inputs["images"])
	// dtype 1 (DT_FLOAT = 1), tensor_shape 2, float_val 5
	only(t, "images TensorProto", im, 1, 2, 5)
	if one(t, "images dtype", im, 1, protowire.VarintType).x != 1 {
		t.Fatal("images dtype")
	}
	if d := shapeDims(t, "images", one(t, "images shape", im, 2, protowire.BytesType).b); !equalDims(d, []int64{2, 2}) {
		t.Fatalf("images shape %v", d)
	}
	fl := unpack(t, "float_val", one(t, "float_val packed", im, 5, protowire.BytesType).b, protowire.Fixed32Type)
	if len(fl) != 4 || math.Float32frombits(uint32(fl[3])) != -4 {
		t.Fatalf("float_val %v", fl)
	}
	lb := wireFields(t, inputs["labels"])
	// dtype 1 (DT_INT64 = 9), tensor_shape 2, tensor_content 4
	only(t, "labels TensorProto", lb, 1, 2, 4)
	if one(t, "labels dtype", lb, 1, protowire.VarintType).x != 9 {
		t.Fatal("labels dtype")
	}
	if c := one(t, "tensor_content", lb, 4, protowire.BytesType).b; !bytes.Equal(c, []byte{7, 0, 0, 0, 0, 0, 0, 0}) {
		t.Fatalf("tensor_content %v", c)
	}

	// version_label 4 (the other member of the oneof)
	req.ModelSpec = &tfapis.ModelSpec{Name: "fashion", VersionChoice: &tfapis.ModelSpec_VersionLabel{VersionLabel: "stable"}}
	if b, err = proto.Marshal(req); err != nil {
		t.Fatal(err)
	}
	spec = wireFields(t, one(t, "model_spec", wireFields(t, b), 1, protowire.BytesType).b)
	only(t, "ModelSpec with label", spec, 1, 4)
	if oneStr(t, "ModelSpec.version_label", spec, 4) != "stable" {
		t.Fatalf("version_label %v", spec)
	}
}

func TestWireModelSpecVersionLabel(t *testing.T) {
	// ModelSpec{name 1, signature_name 3, version_label 4}
	var spec []byte
	spec = str(spec, 1, "fashion")
	spec = str(spec, 4, "canary")
	spec = str(spec, 3, "serving_default")
	var got tfapis.ModelSpec
	if err := proto.Unmarshal(spec, &got); err != nil {
		t.Fatal(err)
	}
	noUnknown(t, "ModelSpec", got.ProtoReflect())
	if got.GetName() != "fashion" || got.GetVersionLabel() != "canary" || got.GetVersion() != nil || got.GetSignatureName() != "serving_default" {
		t.Fatalf("ModelSpec %v", &got)
	}
	// in a PredictRequest (model_spec 1), with an Int64Value version 2
	// arriving later: the oneof keeps the last one, as upstream does
	var req []byte
	req = msg(req, 1, spec)
	var pr tfapis.PredictRequest
	if err := proto.Unmarshal(req, &pr); err != nil {
		t.Fatal(err)
	}
	if pr.GetModelSpec().GetVersionLabel() != "canary" {
		t.Fatalf("PredictRequest.model_spec %v", pr.GetModelSpec())
	}
	spec = msg(spec, 2, varint(nil, 1, 5))
	if err := proto.Unmarshal(spec, &got); err != nil {
		t.Fatal(err)
	}
	if got.GetVersion().GetValue() != 5 || got.GetVersionLabel() != "" {
		t.Fatalf("version after label: %v", &got)
	}
}

func TestWireTensorContentFloat(t *testing.T) {
	vals := []float32{0.5, -1, 3.25, float32(math.Inf(1)), 0, 1e-3}
	var content []byte
	for _, v := range vals {
		content = binary.LittleEndian.AppendUint32(content, math.Float32bits(v))
	}
	// TensorProto{dtype 1 = DT_FLOAT (1), tensor_shape 2 {dim 2 {size 1}} x2, tensor_content 4}
	var shape []byte
	shape = msg(shape, 2, varint(nil, 1, 2))
	shape = msg(shape, 2, varint(nil, 1, 3))
	var b []byte
	b = varint(b, 1, 1)
	b = msg(b, 2, shape)
	b = msg(b, 4, content)
	var tp tfpb.TensorProto
	if err := proto.Unmarshal(b, &tp); err != nil {
		t.Fatal(err)
	}
	noUnknown(t, "TensorProto", tp.ProtoReflect())
	if tp.GetDtype() != tfpb.DataType_DT_FLOAT || !bytes.Equal(tp.GetTensorContent(), content) || len(tp.GetFloatVal()) != 0 {
		t.Fatalf("TensorProto %v", &tp)
	}
	x, err := wire.FromTensorProto("images", &tp)
	if err != nil {
		t.Fatal(err)
	}
	if x.Name != "images" || x.Datatype != tensor.FP32 || !equalDims(x.Shape, []int64{2, 3}) || !bytes.Equal(x.Data, content) {
		t.Fatalf("tensor %v", x)
	}
	got, err := tensor.Float32(x)
	if err != nil || len(got) != len(vals) {
		t.Fatal(got, err)
	}
	for i := range vals {
		if got[i] != vals[i] {
			t.Fatalf("value %d: %v, want %v", i, got[i], vals[i])
		}
	}
}

// wcase is one typed-value encoding: the KServe datatype of the internal
// tensor, the upstream field holding its values, the element wire type
// (packed) or BytesType (one field per value), and the values as they are
// on the wire (varint integer, fixed bits) or the BYTES elements.
type wcase struct {
	dt   string
	tfDT uint64 // TF DataType number (TF cases)
	num  protowire.Number
	kind protowire.Type
	vals []uint64
	strs [][]byte
}

func (c wcase) n() int64 {
	if c.kind == protowire.BytesType {
		return int64(len(c.strs))
	}
	return int64(len(c.vals))
}

// data is the internal raw data: little-endian elements (the wire value
// truncated to the element size; two's complement for negative ints), or
// BYTES elements with their 4-byte length.
func (c wcase) data() []byte {
	var out []byte
	if c.kind == protowire.BytesType {
		for _, s := range c.strs {
			out = binary.LittleEndian.AppendUint32(out, uint32(len(s)))
			out = append(out, s...)
		}
		return out
	}
	es := tensor.ElemSize(c.dt)
	for _, v := range c.vals {
		out = append(out, binary.LittleEndian.AppendUint64(nil, v)[:es]...)
	}
	return out
}

// encode appends the values' field(s).
func (c wcase) encode(b []byte) []byte {
	if c.kind == protowire.BytesType {
		for _, s := range c.strs {
			b = protowire.AppendTag(b, c.num, protowire.BytesType)
			b = protowire.AppendBytes(b, s)
		}
		return b
	}
	var p []byte
	for _, v := range c.vals {
		switch c.kind {
		case protowire.VarintType:
			p = protowire.AppendVarint(p, v)
		case protowire.Fixed32Type:
			p = protowire.AppendFixed32(p, uint32(v))
		case protowire.Fixed64Type:
			p = protowire.AppendFixed64(p, v)
		}
	}
	return msg(b, c.num, p)
}

// check asserts that f holds the values in field num, packed.
func (c wcase) check(t *testing.T, what string, f map[protowire.Number][]fv) {
	t.Helper()
	if c.kind == protowire.BytesType {
		if len(f[c.num]) != len(c.strs) {
			t.Fatalf("%s: field %d: %d occurrences, want %d", what, c.num, len(f[c.num]), len(c.strs))
		}
		for i, s := range c.strs {
			if f[c.num][i].typ != protowire.BytesType || !bytes.Equal(f[c.num][i].b, s) {
				t.Fatalf("%s: field %d value %d: %v, want %q", what, c.num, i, f[c.num][i], s)
			}
		}
		return
	}
	got := unpack(t, what, one(t, what+" packed", f, c.num, protowire.BytesType).b, c.kind)
	if len(got) != len(c.vals) {
		t.Fatalf("%s: field %d holds %v, want %v", what, c.num, got, c.vals)
	}
	for i := range got {
		if got[i] != c.vals[i] {
			t.Fatalf("%s: field %d value %d: %#x, want %#x", what, c.num, i, got[i], c.vals[i])
		}
	}
}

func f32bits(vs ...float32) []uint64 {
	out := make([]uint64, len(vs))
	for i, v := range vs {
		out[i] = uint64(math.Float32bits(v))
	}
	return out
}

func f64bits(vs ...float64) []uint64 {
	out := make([]uint64, len(vs))
	for i, v := range vs {
		out[i] = math.Float64bits(v)
	}
	return out
}

// ints is signed values as varints (int32 and int64 are sign-extended to
// 64 bits on the wire).
func ints(vs ...int64) []uint64 {
	out := make([]uint64, len(vs))
	for i, v := range vs {
		out[i] = uint64(v)
	}
	return out
}

var (
	varintT = protowire.VarintType
	fixed32 = protowire.Fixed32Type
	fixed64 = protowire.Fixed64Type
	bytesT  = protowire.BytesType
)

// TensorProto: float_val 5, double_val 6, int_val 7 (int32, int16, int8,
// uint8, uint16), string_val 8, int64_val 10, bool_val 11, half_val 13
// (half, bfloat16), uint32_val 16, uint64_val 17; DataType numbers from
// types.proto.
var tfTyped = []wcase{
	{dt: tensor.FP32, tfDT: 1, num: 5, kind: fixed32, vals: f32bits(0.5, -2, float32(math.Inf(-1)))},
	{dt: tensor.FP64, tfDT: 2, num: 6, kind: fixed64, vals: f64bits(0.25, -1e300)},
	{dt: tensor.Int32, tfDT: 3, num: 7, kind: varintT, vals: ints(-7, math.MaxInt32, math.MinInt32)},
	{dt: tensor.Uint8, tfDT: 4, num: 7, kind: varintT, vals: ints(255, 0)},
	{dt: tensor.Int16, tfDT: 5, num: 7, kind: varintT, vals: ints(-32768, 5)},
	{dt: tensor.Int8, tfDT: 6, num: 7, kind: varintT, vals: ints(-128, 127)},
	{dt: tensor.Bytes, tfDT: 7, num: 8, kind: bytesT, strs: [][]byte{[]byte("a"), {}, []byte("héllo")}},
	{dt: tensor.Int64, tfDT: 9, num: 10, kind: varintT, vals: ints(-1, 1<<40, math.MinInt64)},
	{dt: tensor.Bool, tfDT: 10, num: 11, kind: varintT, vals: ints(1, 0, 1)},
	{dt: wire.BF16, tfDT: 14, num: 13, kind: varintT, vals: ints(0x3f80, 0xffff)},
	{dt: wire.Uint16, tfDT: 17, num: 7, kind: varintT, vals: ints(65535, 1)},
	{dt: tensor.FP16, tfDT: 19, num: 13, kind: varintT, vals: ints(0x3c00, 0x8001)},
	{dt: wire.Uint32, tfDT: 22, num: 16, kind: varintT, vals: ints(math.MaxUint32, 3)},
	{dt: wire.Uint64, tfDT: 23, num: 17, kind: varintT, vals: []uint64{math.MaxUint64, 2}},
}

func TestWireTensorProtoTyped(t *testing.T) {
	for _, c := range tfTyped {
		// reverse: our typed encoder, parsed against the upstream numbers
		x := &hamsv1.Tensor{Name: "x", Datatype: c.dt, Shape: []int64{c.n()}, Data: c.data()}
		tp, err := wire.ToTensorProtoTyped(x)
		if err != nil {
			t.Fatalf("%s: %v", c.dt, err)
		}
		b, err := proto.Marshal(tp)
		if err != nil {
			t.Fatal(err)
		}
		f := wireFields(t, b)
		only(t, c.dt+" TensorProto", f, 1, 2, c.num)
		if dt := one(t, c.dt+" dtype", f, 1, protowire.VarintType).x; dt != c.tfDT {
			t.Fatalf("%s: dtype %d, want %d", c.dt, dt, c.tfDT)
		}
		if d := shapeDims(t, c.dt, one(t, c.dt+" shape", f, 2, protowire.BytesType).b); !equalDims(d, x.Shape) {
			t.Fatalf("%s: shape %v", c.dt, d)
		}
		c.check(t, c.dt+" TensorProto", f)

		// forward: byte-built, decoded, converted
		var in []byte
		in = varint(in, 1, c.tfDT)
		in = msg(in, 2, msg(nil, 2, varint(nil, 1, uint64(c.n()))))
		in = c.encode(in)
		var got tfpb.TensorProto
		if err := proto.Unmarshal(in, &got); err != nil {
			t.Fatal(err)
		}
		noUnknown(t, c.dt+" TensorProto", got.ProtoReflect())
		y, err := wire.FromTensorProto("y", &got)
		if err != nil {
			t.Fatalf("%s: %v", c.dt, err)
		}
		if y.Datatype != c.dt || !equalDims(y.Shape, x.Shape) || !bytes.Equal(y.Data, x.Data) {
			t.Fatalf("%s: decoded %v, want %v", c.dt, y, x)
		}
	}
}

// ---- KServe v2 ----

func TestWireModelInferRequestReverse(t *testing.T) {
	req := &inference.ModelInferRequest{
		ModelName: "seq", ModelVersion: "2", Id: "req-9",
		Parameters: map[string]*inference.InferParameter{
			"b": {ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: true}},
			"i": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: -42}},
			"s": {ParameterChoice: &inference.InferParameter_StringParam{StringParam: "x"}},
			"d": {ParameterChoice: &inference.InferParameter_DoubleParam{DoubleParam: 0.5}},
			"u": {ParameterChoice: &inference.InferParameter_Uint64Param{Uint64Param: math.MaxUint64}},
		},
		Inputs: []*inference.ModelInferRequest_InferInputTensor{
			{Name: "images", Datatype: "FP32", Shape: []int64{1, 2},
				Parameters: map[string]*inference.InferParameter{"p": wire.StrParam("v")},
				Contents:   &inference.InferTensorContents{Fp32Contents: []float32{0.5, 0.25}}},
			{Name: "ids", Datatype: "INT64", Shape: []int64{1}},
		},
		Outputs: []*inference.ModelInferRequest_InferRequestedOutputTensor{
			{Name: "y", Parameters: map[string]*inference.InferParameter{"binary_data": {ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: true}}}},
			{Name: "z"},
		},
		RawInputContents: [][]byte{{1, 0, 0, 0, 0, 0, 0, 0}},
	}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	top := wireFields(t, b)
	// model_name 1, model_version 2, id 3, parameters 4, inputs 5, outputs 6, raw_input_contents 7
	only(t, "ModelInferRequest", top, 1, 2, 3, 4, 5, 6, 7)
	if oneStr(t, "model_name", top, 1) != "seq" || oneStr(t, "model_version", top, 2) != "2" || oneStr(t, "id", top, 3) != "req-9" {
		t.Fatalf("header %v", top)
	}
	// InferParameter: bool_param 1, int64_param 2, string_param 3, double_param 4, uint64_param 5
	params := mapEntries(t, "parameters", top[4])
	for key, want := range map[string]struct {
		num protowire.Number
		typ protowire.Type
		x   uint64
		s   string
	}{
		"b": {1, protowire.VarintType, 1, ""},
		"i": {2, protowire.VarintType, uint64(1<<64 - 42), ""},
		"s": {3, protowire.BytesType, 0, "x"},
		"d": {4, protowire.Fixed64Type, math.Float64bits(0.5), ""},
		"u": {5, protowire.VarintType, math.MaxUint64, ""},
	} {
		p := wireFields(t, params[key])
		only(t, "InferParameter "+key, p, want.num)
		got := one(t, "InferParameter "+key, p, want.num, want.typ)
		if got.x != want.x || string(got.b) != want.s {
			t.Fatalf("parameter %s: %v", key, got)
		}
	}
	if len(top[5]) != 2 {
		t.Fatalf("inputs %v", top[5])
	}
	// InferInputTensor: name 1, datatype 2, shape 3 (packed), parameters 4, contents 5
	in := wireFields(t, top[5][0].b)
	only(t, "InferInputTensor", in, 1, 2, 3, 4, 5)
	if oneStr(t, "input name", in, 1) != "images" || oneStr(t, "input datatype", in, 2) != "FP32" {
		t.Fatalf("input %v", in)
	}
	if s := unpack(t, "shape", one(t, "input shape", in, 3, protowire.BytesType).b, protowire.VarintType); len(s) != 2 || s[0] != 1 || s[1] != 2 {
		t.Fatalf("input shape %v", s)
	}
	if p := mapEntries(t, "input parameters", in[4]); oneStr(t, "input parameter", wireFields(t, p["p"]), 3) != "v" {
		t.Fatalf("input parameters %v", p)
	}
	contents := wireFields(t, one(t, "input contents", in, 5, protowire.BytesType).b)
	only(t, "InferTensorContents", contents, 6) // fp32_contents 6
	wcase{num: 6, kind: fixed32, vals: f32bits(0.5, 0.25)}.check(t, "fp32_contents", contents)
	in2 := wireFields(t, top[5][1].b)
	only(t, "second InferInputTensor", in2, 1, 2, 3)
	if oneStr(t, "input name", in2, 1) != "ids" || oneStr(t, "input datatype", in2, 2) != "INT64" {
		t.Fatalf("second input %v", in2)
	}
	// InferRequestedOutputTensor: name 1, parameters 2
	if len(top[6]) != 2 {
		t.Fatalf("outputs %v", top[6])
	}
	out := wireFields(t, top[6][0].b)
	only(t, "InferRequestedOutputTensor", out, 1, 2)
	if oneStr(t, "output name", out, 1) != "y" {
		t.Fatalf("output %v", out)
	}
	if p := mapEntries(t, "output parameters", out[2]); one(t, "binary_data", wireFields(t, p["binary_data"]), 1, protowire.VarintType).x != 1 {
		t.Fatalf("output parameters %v", p)
	}
	if out2 := wireFields(t, top[6][1].b); oneStr(t, "output name", out2, 1) != "z" {
		t.Fatalf("second output %v", out2)
	}
	if raw := one(t, "raw_input_contents", top, 7, protowire.BytesType).b; !bytes.Equal(raw, []byte{1, 0, 0, 0, 0, 0, 0, 0}) {
		t.Fatalf("raw_input_contents %v", raw)
	}
}

// InferTensorContents: bool_contents 1, int_contents 2 (INT8, INT16,
// INT32), int64_contents 3, uint_contents 4 (UINT8, UINT16, UINT32),
// uint64_contents 5, fp32_contents 6, fp64_contents 7, bytes_contents 8.
var ksTyped = []wcase{
	{dt: tensor.Bool, num: 1, kind: varintT, vals: ints(1, 0, 1)},
	{dt: tensor.Int8, num: 2, kind: varintT, vals: ints(-128, 127)},
	{dt: tensor.Int16, num: 2, kind: varintT, vals: ints(-32768, 9)},
	{dt: tensor.Int32, num: 2, kind: varintT, vals: ints(-7, math.MaxInt32)},
	{dt: tensor.Int64, num: 3, kind: varintT, vals: ints(-1, 1<<40)},
	{dt: tensor.Uint8, num: 4, kind: varintT, vals: ints(255, 0)},
	{dt: wire.Uint16, num: 4, kind: varintT, vals: ints(65535, 2)},
	{dt: wire.Uint32, num: 4, kind: varintT, vals: ints(math.MaxUint32, 3)},
	{dt: wire.Uint64, num: 5, kind: varintT, vals: []uint64{math.MaxUint64, 4}},
	{dt: tensor.FP32, num: 6, kind: fixed32, vals: f32bits(0.5, -2)},
	{dt: tensor.FP64, num: 7, kind: fixed64, vals: f64bits(0.25, -1e300)},
	{dt: tensor.Bytes, num: 8, kind: bytesT, strs: [][]byte{[]byte("a"), {}, []byte("héllo")}},
}

func TestWireModelInferResponseTyped(t *testing.T) {
	// reverse: a typed response from our encoder (wire.Contents)
	resp := &inference.ModelInferResponse{ModelName: "m", ModelVersion: "1", Id: "r1"}
	var want []*hamsv1.Tensor
	for _, c := range ksTyped {
		x := &hamsv1.Tensor{Name: "out_" + c.dt, Datatype: c.dt, Shape: []int64{1, c.n()}, Data: c.data()}
		want = append(want, x)
		ct, err := wire.Contents(x)
		if err != nil {
			t.Fatalf("%s: %v", c.dt, err)
		}
		o := wire.InferOutput(x)
		o.Contents = ct
		resp.Outputs = append(resp.Outputs, o)
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	top := wireFields(t, b)
	only(t, "ModelInferResponse", top, 1, 2, 3, 5) // model_name 1, model_version 2, id 3, outputs 5
	if oneStr(t, "model_name", top, 1) != "m" || oneStr(t, "model_version", top, 2) != "1" || oneStr(t, "id", top, 3) != "r1" {
		t.Fatalf("header %v", top)
	}
	if len(top[5]) != len(ksTyped) {
		t.Fatalf("%d outputs", len(top[5]))
	}
	for i, c := range ksTyped {
		// InferOutputTensor: name 1, datatype 2, shape 3, contents 5
		o := wireFields(t, top[5][i].b)
		only(t, c.dt+" InferOutputTensor", o, 1, 2, 3, 5)
		if oneStr(t, "name", o, 1) != "out_"+c.dt || oneStr(t, "datatype", o, 2) != c.dt {
			t.Fatalf("%s: output %v", c.dt, o)
		}
		if s := unpack(t, "shape", one(t, "shape", o, 3, protowire.BytesType).b, protowire.VarintType); len(s) != 2 || s[1] != uint64(c.n()) {
			t.Fatalf("%s: shape %v", c.dt, s)
		}
		ct := wireFields(t, one(t, c.dt+" contents", o, 5, protowire.BytesType).b)
		only(t, c.dt+" InferTensorContents", ct, c.num)
		c.check(t, c.dt+" InferTensorContents", ct)
	}

	// forward: the same response byte-built, decoded and converted
	var rb []byte
	rb = str(rb, 1, "m")
	rb = str(rb, 2, "1")
	rb = str(rb, 3, "r1")
	rb = msg(rb, 4, msg(str(nil, 1, "k"), 2, str(nil, 3, "v"))) // parameters 4
	for _, c := range ksTyped {
		var o []byte
		o = str(o, 1, "out_"+c.dt)
		o = str(o, 2, c.dt)
		o = packedVarints(o, 3, []int64{1, c.n()})
		o = msg(o, 4, msg(str(nil, 1, "p"), 2, varint(nil, 2, 7)))
		o = msg(o, 5, c.encode(nil))
		rb = msg(rb, 5, o)
	}
	var got inference.ModelInferResponse
	if err := proto.Unmarshal(rb, &got); err != nil {
		t.Fatal(err)
	}
	noUnknown(t, "ModelInferResponse", got.ProtoReflect())
	if got.ModelName != "m" || got.ModelVersion != "1" || got.Id != "r1" || got.Parameters["k"].GetStringParam() != "v" || len(got.Outputs) != len(ksTyped) {
		t.Fatalf("response %v", &got)
	}
	for i, o := range got.Outputs {
		if o.Parameters["p"].GetInt64Param() != 7 {
			t.Fatalf("%s: parameters %v", o.Name, o.Parameters)
		}
		x, err := wire.FromInferOutput(o, nil, false)
		if err != nil {
			t.Fatalf("%s: %v", ksTyped[i].dt, err)
		}
		if x.Name != want[i].Name || x.Datatype != want[i].Datatype || !equalDims(x.Shape, want[i].Shape) || !bytes.Equal(x.Data, want[i].Data) {
			t.Fatalf("%s: decoded %v, want %v", ksTyped[i].dt, x, want[i])
		}
	}
}
