package refserver

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/hams-go/hams/protos/inference"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// TestHostileShapes: requests of a few dozen bytes whose declared shape
// once made the server allocate from it ([1<<40] with one value: fatal
// error: out of memory) or panic ([1<<61]) are InvalidArgument naming the
// tensor, and the server keeps serving.
func TestHostileShapes(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	for _, shape := range [][]int64{{1 << 40}, {1 << 61}, {1 << 32, 1 << 32}, {1, -784}} {
		x := tp(tfpb.DataType_DT_FLOAT, shape)
		x.FloatVal = []float32{0.5}
		_, err := e.tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion"}, Inputs: map[string]*tfpb.TensorProto{"images": x}})
		code := codes.InvalidArgument
		if shape[0] == 1<<40 {
			code = codes.ResourceExhausted // 4 TiB: over the message limit
		}
		wantCode(t, "Predict", err, code, `"images"`)
		_, err = e.ks.ModelInfer(ctx, &inference.ModelInferRequest{ModelName: "fashion", Inputs: []*inference.ModelInferRequest_InferInputTensor{
			{Name: "images", Datatype: "FP32", Shape: shape, Contents: &inference.InferTensorContents{Fp32Contents: []float32{0.5}}}}})
		wantCode(t, "ModelInfer", err, codes.InvalidArgument, `"images"`)
	}
	x := tp(tfpb.DataType_DT_FLOAT, []int64{1, 784})
	x.FloatVal = []float32{0.5}
	if _, err := e.tf.Predict(ctx, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion"}, Inputs: map[string]*tfpb.TensorProto{"images": x}}); err != nil {
		t.Fatal(err)
	}
}
