package wire

import (
	"strings"
	"testing"

	"github.com/hams-go/hams/internal/grpcx"
	"github.com/hams-go/hams/internal/tensor"
	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
)

// Requests of a few dozen bytes whose declared shape is huge, overflows
// int64 or does not match the values they carry must be rejected with an
// error naming the tensor, before anything is allocated from the shape.
// Before the bounds checks, [1<<40] with one value asked the runtime for
// 4 TiB (fatal error: out of memory) and [1<<61] panicked in make.

func TestMaxDecodedBytesIsTheGRPCLimit(t *testing.T) {
	if MaxDecodedBytes != grpcx.DefaultMaxMessageBytes {
		t.Fatalf("MaxDecodedBytes %d, gRPC message limit %d", MaxDecodedBytes, grpcx.DefaultMaxMessageBytes)
	}
}

func wantInvalidSays(t *testing.T, what string, err error, name, says string) {
	t.Helper()
	wantInvalid(t, what, err, name)
	if !strings.Contains(err.Error(), says) {
		t.Fatalf("%s: %q does not say %q", what, err, says)
	}
}

func TestTensorProtoHostileShapes(t *testing.T) {
	f32 := func(shape []int64, v ...float32) *tfpb.TensorProto {
		return &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: TFShape(shape), FloatVal: v}
	}
	cases := []struct {
		what string
		tp   *tfpb.TensorProto
		says string
	}{
		{"broadcast 4 TiB", f32([]int64{1 << 40}, 1), "limit"},
		{"broadcast one over the limit", f32([]int64{MaxDecodedBytes/4 + 1}, 1), "limit"},
		{"broadcast uint8", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_UINT8, TensorShape: TFShape([]int64{1 << 40}), IntVal: []int32{7}}, "limit"},
		{"broadcast int64", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_INT64, TensorShape: TFShape([]int64{1 << 20, 1 << 20}), Int64Val: []int64{7}}, "limit"},
		{"broadcast string", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_STRING, TensorShape: TFShape([]int64{1 << 40}), StringVal: [][]byte{[]byte("x")}}, "limit"},
		{"broadcast long string", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_STRING, TensorShape: TFShape([]int64{2}), StringVal: [][]byte{make([]byte, MaxDecodedBytes/2)}}, "limit"},
		{"byte size overflow", f32([]int64{1 << 61}, 1), "int64"},
		{"byte size overflow content", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_FLOAT, TensorShape: TFShape([]int64{1<<62 + 1}), TensorContent: make([]byte, 4)}, "int64"},
		{"element count overflow", f32([]int64{1 << 32, 1 << 32}, 1), "overflows"},
		{"element count overflow 3 dims", f32([]int64{1 << 21, 1 << 21, 1 << 22}, 1), "overflows"},
		{"negative dim", f32([]int64{4, -2}, 1), "dimension 1 is -2"},
		{"count mismatch", f32([]int64{4}, 1, 2), "float_val holds 2"},
		{"count mismatch huge", f32([]int64{1 << 40}, 1, 2), "float_val holds 2"},
	}
	for _, c := range cases {
		name := "in_" + strings.ReplaceAll(c.what, " ", "_")
		got, err := FromTensorProto(name, c.tp)
		if err == nil {
			t.Fatalf("%s: accepted, %d bytes", c.what, len(got.Data))
		}
		wantInvalidSays(t, c.what, err, name, c.says)
	}
	// The broadcast limit is inclusive, and a broadcast under it still works.
	got, err := FromTensorProto("at_limit", f32([]int64{MaxDecodedBytes / 4}, 1.5))
	if err != nil || len(got.Data) != MaxDecodedBytes {
		t.Fatalf("broadcast to the limit: %v", err)
	}
	v, _ := tensor.Float32(got)
	if v[0] != 1.5 || v[len(v)-1] != 1.5 {
		t.Fatalf("broadcast values %v .. %v", v[0], v[len(v)-1])
	}
	got, err = FromTensorProto("strings", &tfpb.TensorProto{Dtype: tfpb.DataType_DT_STRING, TensorShape: TFShape([]int64{3}), StringVal: [][]byte{[]byte("ab")}})
	if err != nil || len(BytesElems(got.Data)) != 3 || string(BytesElems(got.Data)[2]) != "ab" {
		t.Fatalf("string broadcast: %v %v", got, err)
	}
}

func TestKServeHostileShapes(t *testing.T) {
	fp := func(v ...float32) *inference.InferTensorContents {
		return &inference.InferTensorContents{Fp32Contents: v}
	}
	cases := []struct {
		what   string
		dt     string
		shape  []int64
		c      *inference.InferTensorContents
		raw    []byte
		hasRaw bool
		says   string
	}{
		{what: "one value for 4 TiB", dt: tensor.FP32, shape: []int64{1 << 40}, c: fp(1), says: "fp32_contents, contents hold 1"},
		{what: "one value for 64 GiB", dt: tensor.FP32, shape: []int64{1 << 34}, c: fp(1), says: "fp32_contents"},
		{what: "one bool for 1 TiB", dt: tensor.Bool, shape: []int64{1 << 40}, c: &inference.InferTensorContents{BoolContents: []bool{true}}, says: "bool_contents"},
		{what: "one string for 1T elements", dt: tensor.Bytes, shape: []int64{1 << 40}, c: &inference.InferTensorContents{BytesContents: [][]byte{[]byte("x")}}, says: "bytes_contents"},
		{what: "no values for 4 TiB", dt: tensor.FP32, shape: []int64{1 << 40}, says: "fp32_contents"},
		{what: "byte size overflow", dt: tensor.FP32, shape: []int64{1 << 61}, c: fp(1), says: "int64"},
		{what: "byte size overflow int64", dt: tensor.Int64, shape: []int64{1 << 3, 1 << 58}, c: &inference.InferTensorContents{Int64Contents: []int64{1}}, says: "int64"},
		{what: "byte size wraps raw", dt: tensor.FP32, shape: []int64{1<<62 + 1}, raw: make([]byte, 4), hasRaw: true, says: "int64"},
		{what: "element count overflow", dt: tensor.FP32, shape: []int64{1 << 32, 1 << 32}, c: fp(1), says: "overflows"},
		{what: "element count overflow 3 dims", dt: tensor.FP32, shape: []int64{1 << 21, 1 << 21, 1 << 22}, c: fp(1), says: "overflows"},
		{what: "negative dim", dt: tensor.FP32, shape: []int64{4, -2}, c: fp(1), says: "dimension 1 is -2"},
		{what: "count mismatch", dt: tensor.FP32, shape: []int64{4}, c: fp(1, 2, 3), says: "contents hold 3"},
	}
	for _, c := range cases {
		name := "in_" + strings.ReplaceAll(c.what, " ", "_")
		got, err := FromKServe(name, c.dt, c.shape, c.c, c.raw, c.hasRaw)
		if err == nil {
			t.Fatalf("%s: accepted, %d bytes", c.what, len(got.Data))
		}
		wantInvalidSays(t, c.what, err, name, c.says)
		if !c.hasRaw {
			// the same through the message types of both directions
			_, err = FromInferInput(&inference.ModelInferRequest_InferInputTensor{Name: name, Datatype: c.dt, Shape: c.shape, Contents: c.c}, nil, false)
			wantInvalidSays(t, c.what+" (input)", err, name, c.says)
			_, err = FromInferOutput(&inference.ModelInferResponse_InferOutputTensor{Name: name, Datatype: c.dt, Shape: c.shape, Contents: c.c}, nil, false)
			wantInvalidSays(t, c.what+" (output)", err, name, c.says)
		}
	}
	// ContentsToRaw is exported: its n is the caller's, never an allocation size.
	_, err := ContentsToRaw("direct", tensor.FP32, fp(1), 1<<40)
	wantInvalidSays(t, "ContentsToRaw", err, "direct", "contents hold 1")
	_, err = ContentsToRaw("direct64", tensor.FP64, &inference.InferTensorContents{Fp64Contents: []float64{1}}, 1<<61)
	wantInvalidSays(t, "ContentsToRaw overflow", err, "direct64", "contents hold 1")
}
