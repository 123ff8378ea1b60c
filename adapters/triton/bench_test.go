package triton

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"
	"testing"

	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
	"github.com/hams-go/hams/protos/inference"
)

// BenchmarkConvert is the adapter's own work per batch-1 call, without
// the network: the ModelInferRequest built from the batch and the
// response's outputs converted back.
func BenchmarkConvert(b *testing.B) {
	be, err := New(Config{Conn: &nopConn{}, Model: "fashion", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	be.meta = &inference.ModelMetadataResponse{Name: "fashion",
		Inputs:  []*inference.ModelMetadataResponse_TensorMetadata{{Name: "images", Datatype: "FP32", Shape: []int64{-1, 784}}},
		Outputs: []*inference.ModelMetadataResponse_TensorMetadata{{Name: "scores", Datatype: "FP32", Shape: []int64{-1, 10}}}}
	req := &hamsv1.BatchRequest{Model: "fashion", BatchId: 12345, Rows: []uint32{1}, StreamIds: []string{""},
		Inputs: []*hamsv1.Tensor{tensor.FromFloat32("images", []int64{1, 784}, make([]float32, 784))}}
	resp := &inference.ModelInferResponse{ModelName: "fashion", Id: "12345",
		Outputs:           []*inference.ModelInferResponse_InferOutputTensor{{Name: "scores", Datatype: "FP32", Shape: []int64{1, 10}}},
		RawOutputContents: [][]byte{make([]byte, 40)}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		r, err := be.request(ctx, req)
		if err != nil || len(r.Inputs) != 1 {
			b.Fatal(err)
		}
		out, err := be.response(req, r, resp)
		if err != nil || len(out.Outputs) != 1 {
			b.Fatal(err)
		}
	}
}

// nopConn is a connection that is never called.
type nopConn struct{}

func (*nopConn) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	panic("no calls")
}
func (*nopConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	panic("no calls")
}
