package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
)

// sample builds a [2,3] tensor of dt with edge values (negative, extreme).
func sample(dt string) *hamsv1.Tensor {
	t := &hamsv1.Tensor{Name: "t_" + strings.ToLower(dt), Datatype: dt, Shape: []int64{2, 3}}
	var b []byte
	es := tensor.ElemSize(dt)
	switch dt {
	case tensor.FP32:
		for _, v := range []float32{0, -1.5, math.MaxFloat32, float32(math.Inf(-1)), 1e-40, 3.25} {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	case tensor.FP64:
		for _, v := range []float64{0, -1.5, math.MaxFloat64, math.Inf(1), 5e-324, 3.25} {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
	case tensor.Int8, tensor.Int16, tensor.Int32, tensor.Int64:
		bits := uint(es * 8)
		lo, hi := -(int64(1) << (bits - 1)), int64(1)<<(bits-1)-1
		for _, v := range []int64{0, -1, lo, hi, 7, -7} {
			b = appendUint(b, uint64(v), es)
		}
	case tensor.Uint8, Uint16, Uint32, Uint64:
		hi := uint64(math.MaxUint64)
		if es < 8 {
			hi = uint64(1)<<(uint(es)*8) - 1
		}
		for _, v := range []uint64{0, 1, hi, hi - 1, 200, 3} {
			b = appendUint(b, v, es)
		}
	case tensor.FP16, BF16:
		for _, v := range []uint16{0, 0x3c00, 0xfbff, 0x8001, 0x7c00, 1} {
			b = binary.LittleEndian.AppendUint16(b, v)
		}
	case tensor.Bool:
		b = []byte{1, 0, 0, 1, 1, 0}
	case tensor.Bytes:
		b = joinBytes([][]byte{[]byte("a"), {}, []byte("héllo"), {0, 1, 2}, []byte("x"), []byte("yz")})
	}
	t.Data = b
	return t
}

func same(t *testing.T, what string, got, want *hamsv1.Tensor) {
	t.Helper()
	if got.Name != want.Name || got.Datatype != want.Datatype || len(got.Shape) != len(want.Shape) || !bytes.Equal(got.Data, want.Data) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
	for i := range got.Shape {
		if got.Shape[i] != want.Shape[i] {
			t.Fatalf("%s: shape %v, want %v", what, got.Shape, want.Shape)
		}
	}
}

func TestDatatypeMapping(t *testing.T) {
	for _, dt := range Datatypes {
		tf, ok := TFDataType(dt)
		if !ok || tf == tfpb.DataType_DT_INVALID {
			t.Fatalf("%s has no TF type", dt)
		}
		if back, ok := KServeDatatype(tf); !ok || back != dt {
			t.Fatalf("%s -> %v -> %s", dt, tf, back)
		}
	}
	if _, ok := TFDataType("COMPLEX"); ok {
		t.Fatal("unknown KServe name mapped")
	}
	if _, ok := KServeDatatype(tfpb.DataType_DT_COMPLEX64); ok {
		t.Fatal("complex mapped")
	}
}

func TestTensorProtoRoundTripEveryDtype(t *testing.T) {
	for _, dt := range Datatypes {
		in := sample(dt)
		tp, err := ToTensorProto(in)
		if err != nil {
			t.Fatalf("%s: %v", dt, err)
		}
		if dt == tensor.Bytes && (len(tp.TensorContent) != 0 || len(tp.StringVal) != 6) {
			t.Fatalf("BYTES must travel in string_val: %v", tp)
		}
		if dt != tensor.Bytes && !bytes.Equal(tp.TensorContent, in.Data) {
			t.Fatalf("%s: tensor_content %v", dt, tp.TensorContent)
		}
		out, err := FromTensorProto(in.Name, tp)
		if err != nil {
			t.Fatalf("%s content: %v", dt, err)
		}
		same(t, dt+" tensor_content", out, in)
		typed, err := ToTensorProtoTyped(in)
		if err != nil {
			t.Fatalf("%s typed: %v", dt, err)
		}
		if len(typed.TensorContent) != 0 {
			t.Fatalf("%s typed has tensor_content", dt)
		}
		out, err = FromTensorProto(in.Name, typed)
		if err != nil {
			t.Fatalf("%s typed decode: %v", dt, err)
		}
		same(t, dt+" typed", out, in)
	}
}

func TestTensorProtoBroadcastEveryDtype(t *testing.T) {
	for _, dt := range Datatypes {
		one := sample(dt)
		one.Shape = []int64{1}
		es := tensor.ElemSize(dt)
		if es > 0 {
			one.Data = one.Data[es*2 : es*3] // an extreme value
		} else {
			one.Data = joinBytes([][]byte{[]byte("héllo")})
		}
		tp, err := ToTensorProtoTyped(one)
		if err != nil {
			t.Fatal(err)
		}
		tp.TensorShape = TFShape([]int64{2, 2})
		got, err := FromTensorProto("b", tp)
		if err != nil {
			t.Fatalf("%s broadcast: %v", dt, err)
		}
		want := bytes.Repeat(one.Data, 4)
		if !bytes.Equal(got.Data, want) || got.Shape[1] != 2 {
			t.Fatalf("%s broadcast: %v, want %v", dt, got.Data, want)
		}
	}
	// a scalar and an empty tensor
	got, err := FromTensorProto("s", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: TFShape(nil), FloatVal: []float32{2}})
	if err != nil || len(got.Data) != 4 {
		t.Fatalf("scalar: %v %v", got, err)
	}
	got, err = FromTensorProto("e", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: TFShape([]int64{0, 3})})
	if err != nil || len(got.Data) != 0 || got.Data == nil {
		t.Fatalf("empty: %v %v", got, err)
	}
}

func TestKServeRoundTripEveryDtype(t *testing.T) {
	for _, dt := range Datatypes {
		in := sample(dt)
		// raw
		got, err := FromInferInput(InferInput(in), in.Data, true)
		if err != nil {
			t.Fatalf("%s raw: %v", dt, err)
		}
		same(t, dt+" raw input", got, in)
		got, err = FromInferOutput(InferOutput(in), in.Data, true)
		if err != nil {
			t.Fatalf("%s raw output: %v", dt, err)
		}
		same(t, dt+" raw output", got, in)
		// typed
		c, err := Contents(in)
		if dt == tensor.FP16 || dt == BF16 {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), in.Name) || !strings.Contains(err.Error(), "raw") {
				t.Fatalf("%s typed contents: %v", dt, err)
			}
			_, err = FromKServe(in.Name, dt, in.Shape, &inference.InferTensorContents{}, nil, false)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), in.Name) {
				t.Fatalf("%s typed decode: %v", dt, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s contents: %v", dt, err)
		}
		if ContentsCount(c) != 6 {
			t.Fatalf("%s: %d typed values", dt, ContentsCount(c))
		}
		md := InferInput(in)
		md.Contents = c
		got, err = FromInferInput(md, nil, false)
		if err != nil {
			t.Fatalf("%s typed: %v", dt, err)
		}
		same(t, dt+" typed input", got, in)
		out := InferOutput(in)
		out.Contents = c
		got, err = FromInferOutput(out, nil, false)
		if err != nil {
			t.Fatalf("%s typed output: %v", dt, err)
		}
		same(t, dt+" typed output", got, in)
	}
}

func wantInvalid(t *testing.T, what string, err error, name string) {
	t.Helper()
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("%s: want ErrInvalid, got %v", what, err)
	}
	if !strings.Contains(err.Error(), name) {
		t.Fatalf("%s: message %q does not name %q", what, err, name)
	}
}

func TestTensorProtoBadInputs(t *testing.T) {
	shape := TFShape([]int64{2})
	cases := map[string]*tfpb.TensorProto{
		"nil":            nil,
		"dtype":          {Dtype: tfpb.DataType_DT_COMPLEX64, TensorShape: shape},
		"invalid dtype":  {Dtype: tfpb.DataType_DT_INVALID, TensorShape: shape},
		"no shape 2":     {Dtype: tfpb.DataType_DT_FLOAT, FloatVal: []float32{1, 2}},
		"unknown rank":   {Dtype: tfpb.DataType_DT_FLOAT, TensorShape: &tfpb.TensorShapeProto{UnknownRank: true}},
		"negative dim":   {Dtype: tfpb.DataType_DT_FLOAT, TensorShape: TFShape([]int64{-1, 2}), FloatVal: []float32{1}},
		"overflow":       {Dtype: tfpb.DataType_DT_FLOAT, TensorShape: TFShape([]int64{math.MaxInt64, 3}), FloatVal: []float32{1}},
		"too few":        {Dtype: tfpb.DataType_DT_FLOAT, TensorShape: TFShape([]int64{3}), FloatVal: []float32{1, 2}},
		"too many":       {Dtype: tfpb.DataType_DT_FLOAT, TensorShape: shape, FloatVal: []float32{1, 2, 3}},
		"empty typed":    {Dtype: tfpb.DataType_DT_INT64, TensorShape: shape},
		"wrong field":    {Dtype: tfpb.DataType_DT_INT64, TensorShape: shape, IntVal: []int32{1, 2}},
		"content length": {Dtype: tfpb.DataType_DT_FLOAT, TensorShape: shape, TensorContent: []byte{1, 2, 3}},
		"string content": {Dtype: tfpb.DataType_DT_STRING, TensorShape: shape, TensorContent: []byte{1, 0, 0, 0, 'a'}},
		"int8 range":     {Dtype: tfpb.DataType_DT_INT8, TensorShape: shape, IntVal: []int32{1, 128}},
		"int16 range":    {Dtype: tfpb.DataType_DT_INT16, TensorShape: shape, IntVal: []int32{-32769, 0}},
		"uint8 range":    {Dtype: tfpb.DataType_DT_UINT8, TensorShape: shape, IntVal: []int32{-1, 0}},
		"uint16 range":   {Dtype: tfpb.DataType_DT_UINT16, TensorShape: shape, IntVal: []int32{65536, 0}},
		"half range":     {Dtype: tfpb.DataType_DT_HALF, TensorShape: shape, HalfVal: []int32{70000, 0}},
		"half negative":  {Dtype: tfpb.DataType_DT_HALF, TensorShape: shape, HalfVal: []int32{-32769, 0}},
	}
	for what, tp := range cases {
		_, err := FromTensorProto("in_"+strings.ReplaceAll(what, " ", "_"), tp)
		wantInvalid(t, what, err, "in_"+strings.ReplaceAll(what, " ", "_"))
	}
	for _, bad := range []*hamsv1.Tensor{
		{Name: "short", Datatype: tensor.FP32, Shape: []int64{2}, Data: []byte{1}},
		{Name: "odd_type", Datatype: "COMPLEX", Shape: []int64{1}, Data: []byte{1}},
		{Name: "bad_bytes", Datatype: tensor.Bytes, Shape: []int64{1}, Data: []byte{9, 0, 0, 0}},
	} {
		_, err := ToTensorProto(bad)
		wantInvalid(t, "encode "+bad.Name, err, bad.Name)
		_, err = ToTensorProtoTyped(bad)
		wantInvalid(t, "encode typed "+bad.Name, err, bad.Name)
		_, err = Contents(bad)
		wantInvalid(t, "contents "+bad.Name, err, bad.Name)
	}
}

func TestKServeBadInputs(t *testing.T) {
	fp := func(v ...float32) *inference.InferTensorContents {
		return &inference.InferTensorContents{Fp32Contents: v}
	}
	type tc struct {
		dt     string
		shape  []int64
		c      *inference.InferTensorContents
		raw    []byte
		hasRaw bool
		want   string
	}
	cases := map[string]tc{
		"datatype":     {dt: "COMPLEX", shape: []int64{1}, c: fp(1), want: "datatype"},
		"negative dim": {dt: tensor.FP32, shape: []int64{-1}, c: fp(1), want: "dimension"},
		"too few":      {dt: tensor.FP32, shape: []int64{3}, c: fp(1, 2), want: "fp32_contents"},
		"broadcast":    {dt: tensor.FP32, shape: []int64{3}, c: fp(1), want: "fp32_contents"},
		"no contents":  {dt: tensor.FP32, shape: []int64{1}, want: "fp32_contents"},
		"wrong field":  {dt: tensor.Int64, shape: []int64{1}, c: &inference.InferTensorContents{IntContents: []int32{1}}, want: "int64_contents"},
		"extra field":  {dt: tensor.FP32, shape: []int64{1}, c: &inference.InferTensorContents{Fp32Contents: []float32{1}, IntContents: []int32{2}}, want: "2 typed"},
		"both":         {dt: tensor.FP32, shape: []int64{1}, c: fp(1), raw: []byte{0, 0, 0, 0}, hasRaw: true, want: "both"},
		"raw length":   {dt: tensor.FP32, shape: []int64{2}, raw: []byte{0, 0, 0, 0}, hasRaw: true, want: "8 bytes"},
		"raw nil":      {dt: tensor.FP32, shape: []int64{1}, hasRaw: true, want: "4 bytes"},
		"raw bytes":    {dt: tensor.Bytes, shape: []int64{1}, raw: []byte{5, 0, 0, 0, 'a'}, hasRaw: true, want: "overruns"},
		"raw bytes n":  {dt: tensor.Bytes, shape: []int64{2}, raw: []byte{1, 0, 0, 0, 'a'}, hasRaw: true, want: "BYTES elements"},
		"int8 range":   {dt: tensor.Int8, shape: []int64{1}, c: &inference.InferTensorContents{IntContents: []int32{-129}}, want: "out of range"},
		"int16 range":  {dt: tensor.Int16, shape: []int64{1}, c: &inference.InferTensorContents{IntContents: []int32{40000}}, want: "out of range"},
		"uint8 range":  {dt: tensor.Uint8, shape: []int64{1}, c: &inference.InferTensorContents{UintContents: []uint32{256}}, want: "out of range"},
		"uint16 range": {dt: Uint16, shape: []int64{1}, c: &inference.InferTensorContents{UintContents: []uint32{70000}}, want: "out of range"},
		"bf16 typed":   {dt: BF16, shape: []int64{1}, c: &inference.InferTensorContents{UintContents: []uint32{1}}, want: "raw"},
		"fp16 typed":   {dt: tensor.FP16, shape: []int64{1}, c: &inference.InferTensorContents{UintContents: []uint32{1}}, want: "raw"},
	}
	for what, c := range cases {
		name := "in_" + strings.ReplaceAll(what, " ", "_")
		_, err := FromKServe(name, c.dt, c.shape, c.c, c.raw, c.hasRaw)
		wantInvalid(t, what, err, name)
		if !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %q does not say %q", what, err, c.want)
		}
	}
	_, err := FromKServe("", tensor.FP32, []int64{1}, fp(1), nil, false)
	wantInvalid(t, "no name", err, "without a name")
	_, err = FromInferInput(nil, nil, false)
	wantInvalid(t, "nil input", err, "nil input")
	_, err = FromInferOutput(nil, nil, false)
	wantInvalid(t, "nil output", err, "nil output")
}

// A TensorProto without tensor_shape is a scalar (TF's reading), and a
// negative half_val is the 16-bit pattern (Java's floatToFloat16 answers
// a short): both as TF Serving accepts them.
func TestTensorProtoScalarAndSignedHalf(t *testing.T) {
	got, err := FromTensorProto("x", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, FloatVal: []float32{2.5}})
	if err != nil || len(got.Shape) != 0 || !bytes.Equal(got.Data, tensor.FromFloat32("x", nil, []float32{2.5}).Data) {
		t.Fatalf("scalar float: %v, %v", got, err)
	}
	got, err = FromTensorProto("s", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_STRING, StringVal: [][]byte{[]byte("ab")}})
	if err != nil || len(got.Shape) != 0 || !bytes.Equal(got.Data, []byte{2, 0, 0, 0, 'a', 'b'}) {
		t.Fatalf("scalar string: %v, %v", got, err)
	}
	// -0.5 as a half is 0xB800; Java sends it as the short -18432.
	got, err = FromTensorProto("h", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_HALF, TensorShape: TFShape([]int64{2}), HalfVal: []int32{-18432, 0xB800}})
	if err != nil || !bytes.Equal(got.Data, []byte{0x00, 0xB8, 0x00, 0xB8}) {
		t.Fatalf("signed half: %v, %v", got, err)
	}
}

// FromTensorProtoLimit refuses a tensor whose data would be over the
// budget, in every encoding, before expanding it; at the limit it decodes.
func TestTensorProtoLimit(t *testing.T) {
	shape := TFShape([]int64{4})
	cases := map[string]struct {
		tp   *tfpb.TensorProto
		size int64
	}{
		"broadcast":  {&tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: TFShape([]int64{1 << 20}), FloatVal: []float32{1}}, 4 << 20},
		"typed":      {&tfpb.TensorProto{Dtype: tfpb.DataType_DT_DOUBLE, TensorShape: shape, DoubleVal: []float64{1, 2, 3, 4}}, 32},
		"content":    {&tfpb.TensorProto{Dtype: tfpb.DataType_DT_INT32, TensorShape: shape, TensorContent: make([]byte, 16)}, 16},
		"strings":    {&tfpb.TensorProto{Dtype: tfpb.DataType_DT_STRING, TensorShape: TFShape([]int64{2}), StringVal: [][]byte{[]byte("abc"), nil}}, 11},
		"string bc":  {&tfpb.TensorProto{Dtype: tfpb.DataType_DT_STRING, TensorShape: TFShape([]int64{1000}), StringVal: [][]byte{[]byte("abcd")}}, 8000},
		"huge bytes": {&tfpb.TensorProto{Dtype: tfpb.DataType_DT_STRING, TensorShape: TFShape([]int64{math.MaxInt64 / 2}), StringVal: [][]byte{[]byte("abcd")}}, math.MaxInt64},
	}
	for what, c := range cases {
		_, err := FromTensorProtoLimit("in", c.tp, c.size-1)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), `"in"`) {
			t.Fatalf("%s: limit %d: want ErrTooLarge naming the tensor, got %v", what, c.size-1, err)
		}
		if c.size == math.MaxInt64 {
			continue
		}
		got, err := FromTensorProtoLimit("in", c.tp, c.size)
		if err != nil || int64(len(got.Data)) != c.size {
			t.Fatalf("%s: limit %d: %v, %d bytes", what, c.size, err, len(got.GetData()))
		}
	}
	if _, err := FromTensorProtoLimit("in", cases["typed"].tp, -5); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("negative limit: %v", err)
	}
}

// RawInputs pairs raw entries as Triton does: shared-memory inputs take
// none; trailing empty placeholders are tolerated, a missing or a leftover
// non-empty entry is an error, and so are typed contents beside raw ones
// (an empty contents message is none).
func TestRawInputs(t *testing.T) {
	shm := map[string]*inference.InferParameter{ParamShmRegion: StrParam("r")}
	ins := []*inference.ModelInferRequest_InferInputTensor{
		{Name: "state_in", Parameters: shm},
		{Name: "x"},
		{Name: "ids", Contents: &inference.InferTensorContents{}},
	}
	x, ids := []byte{1, 2, 3, 4}, []byte{5}
	for what, raw := range map[string][][]byte{"tritonclient": {x, ids}, "placeholders": {x, ids, {}, {}}} {
		raws, takes, err := RawInputs(ins, raw)
		if err != nil || takes[0] || !takes[1] || !takes[2] || !bytes.Equal(raws[1], x) || !bytes.Equal(raws[2], ids) {
			t.Fatalf("%s: %v %v %v", what, raws, takes, err)
		}
	}
	if raws, takes, err := RawInputs(ins, nil); err != nil || slices.Contains(takes, true) || len(raws) != 3 {
		t.Fatalf("no raw contents: %v %v %v", raws, takes, err)
	}
	_, _, err := RawInputs(ins, [][]byte{x})
	wantInvalid(t, "missing entry", err, `"ids"`)
	_, _, err = RawInputs(ins, [][]byte{x, ids, {9}})
	wantInvalid(t, "leftover entry", err, "entry 2")
	typed := append(ins[:2:2], &inference.ModelInferRequest_InferInputTensor{Name: "labels", Contents: &inference.InferTensorContents{Int64Contents: []int64{1}}})
	_, _, err = RawInputs(typed, [][]byte{x})
	wantInvalid(t, "typed beside raw", err, `"labels"`)
}
