package tfserving

import (
	"context"
	"testing"
	"time"

	"github.com/hams-go/hams/internal/wire"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	tfpb "github.com/hams-go/hams/protos/tensorflow/core/framework"
	tfapis "github.com/hams-go/hams/protos/tensorflow_serving/apis"
)

// The two benchmarks run the same batch-1 Fashion-MNIST request against a
// reference model server on loopback: directly with a TF Serving client,
// and through the adapter (conversion in and out, model spec, row
// bookkeeping). The difference is the adapter's own cost per call.

func BenchmarkDirectPredict(b *testing.B) {
	e := startRef(b)
	c := tfapis.NewPredictionServiceClient(e.cc)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		tp, err := wire.ToTensorProto(images(1, 0.5))
		if err != nil {
			b.Fatal(err)
		}
		resp, err := c.Predict(ctx, &tfapis.PredictRequest{ModelSpec: &tfapis.ModelSpec{Name: "fashion", SignatureName: DefaultSignature},
			Inputs: map[string]*tfpb.TensorProto{"images": tp}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := wire.FromTensorProto("scores", resp.Outputs["scores"]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAdapterInfer(b *testing.B) {
	e := startRef(b)
	be, err := New(e.cc, Config{Model: "fashion", Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := be.Describe(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := be.Infer(ctx, &hamsv1.BatchRequest{Inputs: []*hamsv1.Tensor{images(1, 0.5)}, Rows: []uint32{1}, StreamIds: []string{"s"}}); err != nil {
			b.Fatal(err)
		}
	}
}
